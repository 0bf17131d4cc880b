//! `outbox-relay run`: the service.

use crate::settings::Config;
use crate::signals::StopSignals;
use crate::startup::{open_broker, open_store, start_relay};
use anyhow::{bail, Context as _};
use tracing::{info, warn};

/// Runs until SIGINT or SIGTERM, then shuts down gracefully (DESIGN §7); a second signal
/// forces the stop.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let mut signals = StopSignals::install().context("cannot install signal handlers")?;
    let store = open_store(&config, config.database.migrate_on_start).await?;
    let broker = open_broker(&config).await?;
    let relay = start_relay(&config, &store, &broker).await?;
    let signal = signals.next().await;
    info!(signal, "shutdown requested; finishing in-flight publishes");
    tokio::select! {
        result = relay.shutdown() => result?,
        signal = signals.next() => {
            warn!(signal, "second signal: forcing the stop; leases will expire on their own");
            bail!("stopped by a second {signal} before the graceful shutdown finished");
        }
    }
    broker.close().await;
    Ok(())
}
