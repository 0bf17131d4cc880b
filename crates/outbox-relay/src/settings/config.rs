//! The settings after validation: typed, ready to connect with.

use super::shape::Settings;
use crate::secrets::{redact_url, Secrets};
use outbox_amqp::{AmqpSettings, Routing};
use outbox_core::{Ordering, PublishedRows, RelayOptions};
use outbox_store::{Columns, TableName};
use serde::Deserialize;
use std::net::SocketAddr;
use std::sync::Arc;

/// Everything validated, ready to connect with.
#[derive(Debug, Clone)]
pub struct Config {
    /// Database side.
    pub database: DatabaseConfig,
    /// Broker side (`router`, `exchange_type` and `key_header`: the top-level `[amqp]`
    /// values; `topology`: every outbox's routing).
    pub amqp: AmqpSettings,
    /// The actors' options (`outbox`, `ordering`, `publishers`: the first outbox's).
    pub relay: RelayOptions,
    /// Every outbox this process relays, in settings order; never empty. Without
    /// `[[outboxes]]`, one named after `database.table`.
    pub outboxes: Vec<OutboxConfig>,
    /// Logging.
    pub log: LogConfig,
    /// Metrics endpoint address; `None` when disabled.
    pub metrics_listen: Option<SocketAddr>,
    /// The admin API; `None` when `admin.enabled` is false.
    pub admin: Option<AdminConfig>,
    /// `relay.max_pending_age`, checked by the endpoint's probe; `None` when off.
    pub max_pending_age: Option<MaxPendingAge>,
    /// Where publish spans go (OTLP/HTTP, the full `…/v1/traces` URL); `None`: no spans.
    pub otlp_traces_url: Option<String>,
    /// `relay.startup_timeout`: how long `run` waits at start for an unreachable database
    /// or broker; `None`: as long as it takes.
    pub startup_timeout: Option<std::time::Duration>,
    /// Settings replaced by defaults (zero values), settings that defeat one another, and
    /// files holding a secret that others may read: to log once telemetry is up.
    pub warnings: Vec<String>,
    /// The settings as loaded (for `check-config`, after redaction).
    pub effective: Settings,
    /// The passwords in force, to scrub from log lines and error messages.
    pub secrets: Secrets,
}

/// The delivery objective (`relay.max_pending_age`): how old the oldest pending row of an
/// outbox may get before the relay says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxPendingAge {
    /// The bound; a row older than this is a breach.
    pub age: std::time::Duration,
    /// A breach makes `/readyz` answer 503 (`relay.max_pending_age_readiness`).
    pub readiness: bool,
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
    /// `[database.columns]`: the mapping of the one-outbox case, default of every outbox.
    pub columns: Columns,
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
    /// Pooled connections are closed once this old (every pool).
    pub max_connection_lifetime: std::time::Duration,
    /// Pooled connections idle this long are closed (every pool).
    pub idle_timeout: std::time::Duration,
}

impl DatabaseConfig {
    /// The pool settings of every database pool.
    pub fn pool(&self) -> outbox_store::PoolSettings {
        outbox_store::PoolSettings {
            max_connections: self.max_connections,
            max_lifetime: Some(self.max_connection_lifetime),
            idle_timeout: Some(self.idle_timeout),
        }
    }
}

// By hand: the URL in force may hold a password.
impl std::fmt::Debug for DatabaseConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseConfig")
            .field("url", &self.redacted_url)
            .field("table", &self.table)
            .field("columns", &self.columns)
            .field("max_connections", &self.max_connections)
            .field("migrate_on_start", &self.migrate_on_start)
            .field("notify", &self.notify)
            .field("listen_url", &self.listen_url.as_deref().map(redact_url))
            .field("probe_interval", &self.probe_interval)
            .field("max_connection_lifetime", &self.max_connection_lifetime)
            .field("idle_timeout", &self.idle_timeout)
            .finish()
    }
}

/// One validated outbox: a table, where its events go, and how it is relayed. Blank keys
/// of its `[[outboxes]]` entry are filled in from the top-level sections.
#[derive(Clone)]
pub struct OutboxConfig {
    /// Label of its metrics and log lines, and the `--outbox` selector.
    pub name: String,
    /// Its table.
    pub table: TableName,
    /// Its database, with the password put in (never log it, use `redacted_database_url`).
    /// Outboxes with the same URL share one pool.
    pub database_url: String,
    /// The same URL with the password replaced.
    pub redacted_database_url: String,
    /// The producer's columns.
    pub columns: Columns,
    /// Exchanges, routing keys, exchange type and key header of its messages.
    pub routing: Arc<Routing>,
    /// Per-room order or none.
    pub ordering: Ordering,
    /// Its own Publisher actors (confirm channels).
    pub publishers: usize,
    /// Published rows kept or deleted.
    pub published_rows: PublishedRows,
}

impl OutboxConfig {
    /// `relay` (the `[relay]` options) for this outbox: its name, ordering and publishers.
    pub fn relay_options(&self, relay: &RelayOptions) -> RelayOptions {
        // `relay.name` blank (the default): the `worker` field names the outbox.
        let name = if relay.name.is_empty() || relay.name == relay.outbox {
            self.name.clone()
        } else {
            relay.name.clone()
        };
        RelayOptions {
            name,
            outbox: self.name.clone(),
            ordering: self.ordering,
            publishers: self.publishers,
            published_rows: self.published_rows,
            ..relay.clone()
        }
    }
}

// By hand: the URL may hold a password.
impl std::fmt::Debug for OutboxConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxConfig")
            .field("name", &self.name)
            .field("table", &self.table)
            .field("database_url", &self.redacted_database_url)
            .field("columns", &self.columns)
            .field("routing", &self.routing)
            .field("ordering", &self.ordering)
            .field("publishers", &self.publishers)
            .field("published_rows", &self.published_rows)
            .finish()
    }
}

impl Config {
    /// The outboxes `selector` names (`--outbox`): every one when `None`. An unknown name
    /// is an error listing the names.
    pub fn select_outboxes(&self, selector: Option<&str>) -> Result<Vec<&OutboxConfig>, String> {
        match selector {
            None => Ok(self.outboxes.iter().collect()),
            Some(name) => match self.outboxes.iter().find(|outbox| outbox.name == name) {
                Some(outbox) => Ok(vec![outbox]),
                None => Err(format!(
                    "no outbox named {name:?}; the outboxes are: {}",
                    self.outbox_names().join(", ")
                )),
            },
        }
    }

    /// The database URLs of the outboxes `selector` names (every one when `None`, none
    /// when unknown), passwords masked, each once, joined by `, `: where the start waits.
    pub fn redacted_database_urls(&self, selector: Option<&str>) -> String {
        let mut urls: Vec<&str> = Vec::new();
        for outbox in self.select_outboxes(selector).iter().flatten() {
            if !urls.contains(&outbox.redacted_database_url.as_str()) {
                urls.push(&outbox.redacted_database_url);
            }
        }
        urls.join(", ")
    }

    /// The outboxes' names, in settings order.
    pub fn outbox_names(&self) -> Vec<&str> {
        self.outboxes
            .iter()
            .map(|outbox| outbox.name.as_str())
            .collect()
    }
}

/// The validated `[admin]` section: where the admin API listens and who may call it.
#[derive(Debug, Clone)]
pub struct AdminConfig {
    /// `admin.listen`.
    pub listen: SocketAddr,
    /// The tokens of `admin.tokens_file`, read at validation.
    pub tokens: Arc<crate::admin::Tokens>,
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
