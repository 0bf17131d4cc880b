//! SIGINT and SIGTERM, as a stream of "stop" requests.

use tokio::signal::unix::{signal, Signal, SignalKind};

/// Both stop signals; the first asks for a graceful shutdown, the second forces it.
pub struct StopSignals {
    interrupt: Signal,
    terminate: Signal,
}

impl StopSignals {
    /// Starts listening (install before starting work, so no signal is missed).
    pub fn install() -> std::io::Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    /// Waits for the next SIGINT or SIGTERM; returns its name.
    pub async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
        }
    }
}
