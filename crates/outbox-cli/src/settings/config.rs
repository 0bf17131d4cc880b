//! The settings after validation: typed, ready to connect with.

use super::shape::Settings;
use crate::secrets::{redact_url, Secrets};
use outbox_amqp::AmqpSettings;
use outbox_core::RelayOptions;
use outbox_store::TableName;
use serde::Deserialize;
use std::net::SocketAddr;

/// Everything validated, ready to connect with.
#[derive(Debug, Clone)]
pub struct Config {
    /// Database side.
    pub database: DatabaseConfig,
    /// Broker side.
    pub amqp: AmqpSettings,
    /// The actors' options.
    pub relay: RelayOptions,
    /// Logging.
    pub log: LogConfig,
    /// Metrics endpoint address; `None` when disabled.
    pub metrics_listen: Option<SocketAddr>,
    /// Settings replaced by defaults (zero values), to log once telemetry is up.
    pub warnings: Vec<String>,
    /// The settings as loaded (for `check-config`, after redaction).
    pub effective: Settings,
    /// The passwords in force, to scrub from log lines and error messages.
    pub secrets: Secrets,
}

/// Validated database settings.
#[derive(Clone)]
pub struct DatabaseConfig {
    /// Connection URL, with the password of `database.password(_file)` put in (never log
    /// it, use `redacted_url`).
    pub url: String,
    /// The URL with its password replaced.
    pub redacted_url: String,
    /// The outbox table.
    pub table: TableName,
    /// Pool size.
    pub max_connections: u32,
    /// Migrate when `run` or `demo` starts.
    pub migrate_on_start: bool,
    /// LISTEN for insert notifications (PostgreSQL).
    pub notify: bool,
    /// The URL LISTEN connects to, with the password put in, when it is not `url`.
    pub listen_url: Option<String>,
    /// How often to probe for inserts where nothing announces them; `None`: no probe.
    pub probe_interval: Option<std::time::Duration>,
}

// By hand: the URL in force may hold a password.
impl std::fmt::Debug for DatabaseConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseConfig")
            .field("url", &self.redacted_url)
            .field("table", &self.table)
            .field("max_connections", &self.max_connections)
            .field("migrate_on_start", &self.migrate_on_start)
            .field("notify", &self.notify)
            .field("listen_url", &self.listen_url.as_deref().map(redact_url))
            .field("probe_interval", &self.probe_interval)
            .finish()
    }
}

/// Validated logging settings.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// Pretty or JSON.
    pub format: LogFormat,
    /// Tracing filter directives.
    pub level: String,
}

/// `log.format`. Spelled as in the settings; serde's error for another spelling lists these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines.
    Pretty,
    /// One JSON object per line.
    Json,
}
