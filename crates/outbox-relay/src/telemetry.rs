//! The tracing subscriber: pretty or JSON lines, level from `log.level` unless `RUST_LOG`.

use crate::secrets::Secrets;
use crate::settings::{LogConfig, LogFormat};
use std::io::IsTerminal as _;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber (once per process; later calls are ignored). Every line
/// passes through [`Secrets::scrub`] on its way to stderr. The pretty format is coloured
/// only when stderr is a terminal (see [`colours`]).
pub fn init(log: &LogConfig, secrets: &Secrets) {
    let mut filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&log.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    // lapin warns about every returned (unroutable) message, body included; the relay
    // already logs that failure once, with the event's fields and without the body.
    if !log.level.contains("lapin") {
        if let Ok(quiet) = "lapin::returned_messages=error".parse() {
            filter = filter.add_directive(quiet);
        }
        // It logs every failed connect and closed channel at error (`Exponential backoff
        // attempts exhausted, aborting recovery`, `Connection closed … ACCESS_REFUSED`, a
        // passive check's NOT_FOUND); the relay reports each failure itself, naming the
        // entry of amqp.url or the exchange, at the level it deserves.
        for target in ["lapin::io_loop", "lapin::channel", "lapin::channels"] {
            if let Ok(quiet) = format!("{target}=off").parse() {
                filter = filter.add_directive(quiet);
            }
        }
    }
    // actix-server (under the metrics endpoint) announces its worker and accept threads at
    // info on every start and stop; the endpoint logs its own address once.
    if !log.level.contains("actix_server") {
        if let Ok(quiet) = "actix_server=warn".parse() {
            filter = filter.add_directive(quiet);
        }
    }
    // sqlx logs an error for every new connection the pool refuses (a read-only server
    // after a failover: outbox-store's `failover.rs`), each retry of its backoff; the store
    // logs the switch once and the start-up wait its reason.
    if !log.level.contains("sqlx") {
        if let Ok(quiet) = "sqlx_core::pool::inner=off".parse() {
            filter = filter.add_directive(quiet);
        }
    }
    // amq-protocol-tcp traces the parsed broker URL, password included, on every connect.
    if let Ok(quiet) = "amq_protocol_tcp=debug".parse() {
        filter = filter.add_directive(quiet);
    }
    let secrets = secrets.clone();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colours(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR").as_deref(),
        ))
        .with_writer(move || secrets.writer(std::io::stderr()));
    let _ = match log.format {
        LogFormat::Pretty => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Whether log lines get colour codes: only on a terminal, and not when `NO_COLOR` is set
/// to anything but the empty string (<https://no-color.org>). A file, a pipe or journald
/// gets plain text.
pub fn colours(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|value| value.is_empty())
}

#[cfg(test)]
mod tests {
    use super::colours;
    use std::ffi::OsStr;

    #[test]
    fn colours_only_on_a_terminal_without_no_color() {
        assert!(colours(true, None));
        assert!(
            colours(true, Some(OsStr::new(""))),
            "an empty NO_COLOR is unset"
        );
        assert!(!colours(true, Some(OsStr::new("1"))));
        assert!(!colours(false, None), "a file, a pipe, journald");
    }
}
