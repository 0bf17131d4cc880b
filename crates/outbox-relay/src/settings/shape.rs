//! The settings file's shape and its defaults, as written: every key, and the value it has
//! when neither the file nor the environment gives one. The defaults are written here only.

use super::config::LogFormat;
use super::field::{Field, Span};
use crate::secrets::{masked, redact_url};

/// Every URL of a comma-separated list redacted, the list kept.
fn redact_urls(value: &str) -> String {
    let urls: Vec<String> = broker_urls(value).into_iter().map(redact_url).collect();
    urls.join(",")
}
use outbox_core::{Ordering, PublishedRows, RetryStrategy};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// The settings file, as written.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// `[database]`
    pub database: DatabaseSettings,
    /// `[amqp]`
    pub amqp: AmqpSection,
    /// `[relay]`
    pub relay: RelaySettings,
    /// `[log]`
    pub log: LogSettings,
    /// `[metrics]`
    pub metrics: MetricsSettings,
    /// `[telemetry]`
    pub telemetry: TelemetrySettings,
    /// `[admin]`
    pub admin: AdminSettings,
    /// `[[outboxes]]`; empty: one outbox from `database.table`, `[database.columns]` and
    /// `[amqp]`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub outboxes: Vec<OutboxSettings>,
}

/// `[database]`
#[derive(Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseSettings {
    /// `sqlite://…`, `postgres://…` or `mysql://…`; TLS by `sslmode=` / `ssl-mode=`, else
    /// `PGSSLMODE`, else "prefer" (plain text to a loopback host).
    pub url: String,
    /// The password, when it is not in `url`: meant for `OUTBOX_RELAY__DATABASE__PASSWORD`
    /// rather than the file. Empty: none.
    pub password: String,
    /// A file holding the password (a trailing newline is ignored). Empty: none.
    pub password_file: String,
    /// The outbox table.
    pub table: String,
    /// Pool size; zero or less: the default.
    pub max_connections: i64,
    /// Create or upgrade the table when `run` or `demo` starts.
    pub migrate_on_start: bool,
    /// PostgreSQL: LISTEN for the insert trigger's NOTIFY and claim at once (polling stays
    /// as the fallback); `migrate` then enables the trigger, which costs every producer's
    /// insert. `false` (the default): probe like the other backends, and the producers pay
    /// nothing. Ignored on other backends, which probe.
    pub notify: bool,
    /// PostgreSQL: a session connection for LISTEN and the node lock when `url` goes
    /// through a pooler in transaction mode (PgBouncer), which keeps neither. Blank: `url`.
    pub listen_url: String,
    /// Where nothing announces inserts (SQLite, MySQL/MariaDB, PostgreSQL without
    /// `notify`): notice them with a cheap probe instead of waiting for `poll_interval`. On
    /// PostgreSQL with `notify`, a relay woken by an insert stays awake while rows keep
    /// coming, noticing them with the probe, so that under load the producers' commits
    /// NOTIFY nobody; `false`: it falls asleep whenever a claim finds nothing.
    pub probe: bool,
    /// How often the probe looks; zero: the default. On PostgreSQL with `notify`, how often
    /// a woken relay looks while it stays awake (an event then waits up to this long for
    /// its claim; one that wakes the relay, none), and how long at a time the LISTEN
    /// connection waits for the table's wake lock while another relay of the table sleeps.
    pub probe_interval: Field<Span>,
    /// `[database.columns]`: the producer's column names of the one-outbox case, and the
    /// default of every `[[outboxes]]` entry.
    pub columns: ColumnsSettings,
    /// A pooled connection is closed once this old: how long the relay may stay on a
    /// server after its name or address moved (a failover). Zero: the default.
    pub max_connection_lifetime: Field<Span>,
    /// A pooled connection idle this long is closed. Zero: the default.
    pub idle_timeout: Field<Span>,
}

/// `[database.columns]`: which columns hold what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ColumnsSettings {
    /// An integer column that grows with each insert (migrate adds it when missing).
    pub position: String,
    /// The event id (AMQP `message_id`).
    pub event_id: String,
    /// The event type (AMQP `type`, routing).
    pub event_type: String,
    /// The ordering key (AMQP header `amqp.key_header`).
    pub key: String,
    /// The message body.
    pub payload: String,
    /// A JSON object of extra headers; blank: the table has no headers column.
    pub headers: String,
    /// When the producer wrote the row (migrate adds it when missing).
    pub created_at: String,
}

/// `[outboxes.columns]`: each key absent takes the `[database.columns]` value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutboxColumnsSettings {
    /// See [`ColumnsSettings::position`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<String>,
    /// See [`ColumnsSettings::event_id`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    /// See [`ColumnsSettings::event_type`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
    /// See [`ColumnsSettings::key`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// See [`ColumnsSettings::payload`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    /// See [`ColumnsSettings::headers`]; `""`: no headers column.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<String>,
    /// See [`ColumnsSettings::created_at`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
}

/// One `[[outboxes]]` entry. A blank (or zero, or absent) key takes the top-level value.
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutboxSettings {
    /// Label in metrics and logs, and the `--outbox` selector; blank: the table name.
    pub name: String,
    /// The outbox table (required).
    pub table: String,
    /// Blank: `database.url` (the same URL shares one pool). Its password: in the URL, or
    /// `database_password(_file)`; never `database.password`.
    pub database_url: String,
    /// The password of `database_url` (which must name the user): meant for
    /// `OUTBOX_RELAY__OUTBOXES__<position or name>__DATABASE_PASSWORD`. Empty: none.
    pub database_password: String,
    /// A file holding the password of `database_url` (a trailing newline is ignored).
    pub database_password_file: String,
    /// Blank: `amqp.exchange`.
    pub exchange: String,
    /// Blank: `amqp.exchange_type`.
    pub exchange_type: String,
    /// Blank: `amqp.routing_key`.
    pub routing_key: String,
    /// Blank: `amqp.key_header`.
    pub key_header: String,
    /// Blank: `amqp.content_type`.
    pub content_type: String,
    /// Blank: `amqp.content_type_column`; `"-"`: none for this outbox.
    pub content_type_column: String,
    /// Absent: `amqp.header_columns`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header_columns: Option<BTreeMap<String, HeaderColumnSettings>>,
    /// Blank: `relay.ordering`.
    pub ordering: String,
    /// 0: `relay.publishers`.
    pub publishers: i64,
    /// Absent: `amqp.routes`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub routes: Option<Vec<RouteSettings>>,
    /// Each key absent: the `[database.columns]` value.
    pub columns: OutboxColumnsSettings,
    /// Blank: `relay.published_rows`.
    pub published_rows: String,
}

/// `[amqp]`
#[derive(Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AmqpSection {
    /// `amqp://user:pass@host:port/vhost`, or `amqps://…` for TLS; or the nodes of a
    /// cluster: a TOML array, or comma-separated (as the environment gives it). Kept as
    /// written, comma-separated ([`broker_urls`]).
    #[serde(
        deserialize_with = "url_list::deserialize",
        serialize_with = "url_list::serialize"
    )]
    pub url: String,
    /// The password, when it is not in `url`: meant for `OUTBOX_RELAY__AMQP__PASSWORD`
    /// rather than the file. Empty: none.
    pub password: String,
    /// A file holding the password (a trailing newline is ignored). Empty: none.
    pub password_file: String,
    /// PEM file of CA certificates trusted for `amqps://` besides the bundled webpki roots
    /// (a private CA). Empty: the webpki roots only.
    pub tls_ca_file: String,
    /// Default exchange.
    pub exchange: String,
    /// `topic`, `direct`, `fanout`, `headers` or a plugin's `x-…`: text, since the plugin
    /// types are open-ended.
    pub exchange_type: String,
    /// Declare the exchanges (durable) at start.
    pub declare_exchange: bool,
    /// Default routing key template.
    pub routing_key: String,
    /// `content_type` of every message.
    pub content_type: String,
    /// The broker's `max_message_size` in bytes: a larger envelope is dead at once, never
    /// published. RabbitMQ 4's default (3.x: 134217728); zero or less: the default.
    pub max_message_size: i64,
    /// A column whose value, when not NULL, is the row's `content_type`. Blank: none.
    pub content_type_column: String,
    /// Per-event-type exchange and routing key; first match wins.
    pub routes: Vec<RouteSettings>,
    /// The AMQP header that carries the ordering key (`columns.key`).
    pub key_header: String,
    /// Columns copied into AMQP headers: header name = column name, or
    /// `{ column = "…", type = "integer" }` (Debezium's
    /// `table.fields.additional.placement = …:header:…`).
    pub header_columns: BTreeMap<String, HeaderColumnSettings>,
}

/// One `header_columns` entry: a column name (sent as text), or a column and its type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum HeaderColumnSettings {
    /// `tenant = "tenant_id"`: the column, as text.
    Column(String),
    /// `attempt = { column = "attempt", type = "integer" }`.
    Typed {
        /// The column.
        column: String,
        /// `text`, `integer`, `boolean`, `uuid` or `timestamp`; blank: text.
        #[serde(default, rename = "type")]
        kind: String,
    },
}

/// The URLs of `amqp.url`, each trimmed (an empty one stays, for validation to reject).
pub fn broker_urls(value: &str) -> Vec<&str> {
    value.split(',').map(str::trim).collect()
}

/// `amqp.url`: one URL or a list, held as one comma-separated string.
mod url_list {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<String, D::Error> {
        match OneOrMany::deserialize(deserializer) {
            Ok(OneOrMany::One(url)) => Ok(url),
            Ok(OneOrMany::Many(urls)) => Ok(urls.join(",")),
            Err(_) => Err(serde::de::Error::custom(
                "expected a URL or a list of URLs (a TOML array, or comma-separated)",
            )),
        }
    }

    /// Several URLs as a list, one as a string: `check-config` prints what a file would say.
    pub(super) fn serialize<S: Serializer>(value: &str, serializer: S) -> Result<S::Ok, S::Error> {
        let urls = super::broker_urls(value);
        if urls.len() > 1 {
            urls.serialize(serializer)
        } else {
            value.serialize(serializer)
        }
    }
}

/// One `[[amqp.routes]]` entry.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSettings {
    /// Topic-style pattern over `event_type`; blank when `column` and `pattern` are set.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub event_type: String,
    /// A column whose value `pattern` is matched against (Debezium's `route.by.field`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub column: String,
    /// Topic-style pattern over `column`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pattern: String,
    /// Exchange for matching events.
    pub exchange: String,
    /// Routing key template for matching events; `amqp.routing_key` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_key: Option<String>,
}

/// `relay.max_inflight_bytes` by default: 64 MiB. Far above what small events reach
/// (4 × `batch_size` rows of 512 bytes are 200 KiB), so they flow as without a budget;
/// rows of a few MiB are claimed a few at a time instead of `batch_size` at a time.
pub const DEFAULT_MAX_INFLIGHT_BYTES: i64 = 64 * 1024 * 1024;

/// `[relay]`. A zero size or duration means its default, with a warning.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RelaySettings {
    /// The `worker` field of every log line; blank (the default): the outbox's name.
    pub name: String,
    /// Empty: `hostname-pid`.
    pub node_id: String,
    /// Publisher actors (confirm channels).
    pub publishers: i64,
    /// Claim cadence when nothing wakes the relay.
    pub poll_interval: Field<Span>,
    /// Rows per claim.
    pub batch_size: i64,
    /// Envelope bytes claimed and not yet marked, at most (plus one row).
    pub max_inflight_bytes: i64,
    /// Confirm deadline per publish.
    pub publish_timeout: Field<Span>,
    /// `fixed_interval` or `exponential`; blank: the default.
    pub retry_strategy: Field<RetryStrategy>,
    /// Blank or zero: `poll_interval`.
    pub retry_interval: Field<Span>,
    /// Cap of the exponential backoff.
    pub retry_max_interval: Field<Span>,
    /// 0: retry forever.
    pub max_attempts: i64,
    /// Claim lease.
    pub lease: Field<Span>,
    /// `per_room` or `none`.
    pub ordering: Field<Ordering>,
    /// Hard bound on a graceful shutdown.
    pub shutdown_timeout: Field<Span>,
    /// Published rows older than this are deleted; blank or zero keeps them forever.
    pub retention: Field<Span>,
    /// `keep` (marked `published`) or `delete` (deleted once confirmed).
    pub published_rows: Field<PublishedRows>,
    /// The delivery objective: the oldest pending row may be this old; blank or zero: off.
    pub max_pending_age: Field<Span>,
    /// Whether a breach of `max_pending_age` makes `/readyz` answer 503.
    pub max_pending_age_readiness: bool,
    /// Events failing and none published for this long: the outbox is stalled (`/readyz`
    /// 503, `outbox_stalled`, one log line); blank or zero: the default.
    pub stall_after: Field<Span>,
    /// How long `run` waits at start for the database and the broker while they are
    /// unreachable; blank or zero: as long as it takes.
    pub startup_timeout: Field<Span>,
}

/// `[log]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSettings {
    /// `pretty` or `json`.
    pub format: Field<LogFormat>,
    /// A tracing filter such as `info` or `outbox_pipeline=debug`; `RUST_LOG` wins.
    pub level: String,
}

/// `[metrics]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSettings {
    /// Address of the metrics and health endpoint; blank disables it.
    pub listen: Field<SocketAddr>,
}

/// `[admin]`: the admin HTTP API (dead and failing events, requeueing), a listener of its
/// own beside the metrics endpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminSettings {
    /// Serve the admin API on `listen`. `false` (the default): nothing listens.
    pub enabled: bool,
    /// Address of the admin API (plain HTTP: put a TLS-terminating proxy in front of it to
    /// reach it from another host).
    pub listen: Field<SocketAddr>,
    /// The tokens file, one `name:role:sha256:<64 hex>` line per token (role `viewer` or
    /// `operator`); required when `enabled`. `outbox-relay admin-token` makes a line.
    pub tokens_file: String,
}

/// `[telemetry]`
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetrySettings {
    /// The OpenTelemetry collector's OTLP/HTTP URL (`http://collector:4318`): a span per
    /// published event is sent there. Blank: no spans. Builds with the `otel` feature only.
    pub otlp_endpoint: String,
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            url: "sqlite://outbox-relay.db?mode=rwc".into(),
            password: String::new(),
            password_file: String::new(),
            table: "room_outbox".into(),
            max_connections: 10,
            migrate_on_start: true,
            notify: false,
            listen_url: String::new(),
            probe: true,
            probe_interval: "5ms".into(),
            columns: ColumnsSettings::default(),
            max_connection_lifetime: "5m".into(),
            idle_timeout: "1m".into(),
        }
    }
}

impl Default for AmqpSection {
    fn default() -> Self {
        Self {
            url: "amqp://guest:guest@127.0.0.1:5672/%2f".into(),
            password: String::new(),
            password_file: String::new(),
            tls_ca_file: String::new(),
            exchange: "room.events".into(),
            exchange_type: "topic".into(),
            declare_exchange: true,
            routing_key: "{event_type}".into(),
            content_type: "application/json".into(),
            max_message_size: outbox_amqp::message::DEFAULT_MAX_MESSAGE_SIZE as i64,
            content_type_column: String::new(),
            routes: Vec::new(),
            key_header: "room_id".into(),
            header_columns: BTreeMap::new(),
        }
    }
}

impl Default for ColumnsSettings {
    /// The relay's own table (`outbox_store::Columns::default()` names the same).
    fn default() -> Self {
        Self {
            position: "id".into(),
            event_id: "event_id".into(),
            event_type: "event_type".into(),
            key: "room_id".into(),
            payload: "envelope".into(),
            headers: "headers".into(),
            created_at: "created_at".into(),
        }
    }
}

impl Default for RelaySettings {
    fn default() -> Self {
        Self {
            name: String::new(),
            node_id: String::new(),
            publishers: 4,
            poll_interval: "1s".into(),
            batch_size: 100,
            max_inflight_bytes: DEFAULT_MAX_INFLIGHT_BYTES,
            publish_timeout: "3s".into(),
            retry_strategy: "fixed_interval".into(),
            retry_interval: "".into(),
            retry_max_interval: "5m".into(),
            max_attempts: 0,
            lease: "30s".into(),
            ordering: "per_room".into(),
            shutdown_timeout: "30s".into(),
            retention: "".into(),
            published_rows: "keep".into(),
            max_pending_age: "".into(),
            max_pending_age_readiness: true,
            stall_after: "1m".into(),
            startup_timeout: "".into(),
        }
    }
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            format: "pretty".into(),
            level: "info".into(),
        }
    }
}

impl Default for MetricsSettings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9187".into(),
        }
    }
}

impl Default for AdminSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            listen: "127.0.0.1:9188".into(),
            tokens_file: String::new(),
        }
    }
}

impl Settings {
    /// As written, for `check-config`: URLs redacted, passwords shown as set or not, and
    /// the node id in force.
    pub(super) fn redacted(&self, node_id: &str) -> Settings {
        let mut shown = self.clone();
        shown.database.url = redact_url(&self.database.url);
        shown.database.listen_url = redact_url(&self.database.listen_url);
        shown.database.password = masked(&self.database.password).into();
        shown.amqp.url = redact_urls(&self.amqp.url);
        shown.amqp.password = masked(&self.amqp.password).into();
        shown.relay.node_id = node_id.into();
        shown.telemetry.otlp_endpoint = redact_url(&self.telemetry.otlp_endpoint);
        for outbox in &mut shown.outboxes {
            outbox.database_url = redact_url(&outbox.database_url);
            outbox.database_password = masked(&outbox.database_password).into();
        }
        shown
    }
}

// Debug by hand for the sections that hold secrets, so `{:?}` of the settings (or of a
// Config) can be logged: URLs redacted, passwords shown as set or not.
impl std::fmt::Debug for TelemetrySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelemetrySettings")
            .field("otlp_endpoint", &redact_url(&self.otlp_endpoint))
            .finish()
    }
}

impl std::fmt::Debug for DatabaseSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseSettings")
            .field("url", &redact_url(&self.url))
            .field("password", &masked(&self.password))
            .field("password_file", &self.password_file)
            .field("table", &self.table)
            .field("max_connections", &self.max_connections)
            .field("migrate_on_start", &self.migrate_on_start)
            .field("notify", &self.notify)
            .field("listen_url", &redact_url(&self.listen_url))
            .field("probe", &self.probe)
            .field("probe_interval", &self.probe_interval)
            .field("columns", &self.columns)
            .field("max_connection_lifetime", &self.max_connection_lifetime)
            .field("idle_timeout", &self.idle_timeout)
            .finish()
    }
}

impl std::fmt::Debug for AmqpSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpSection")
            .field("url", &redact_urls(&self.url))
            .field("password", &masked(&self.password))
            .field("password_file", &self.password_file)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("exchange", &self.exchange)
            .field("exchange_type", &self.exchange_type)
            .field("declare_exchange", &self.declare_exchange)
            .field("routing_key", &self.routing_key)
            .field("content_type", &self.content_type)
            .field("max_message_size", &self.max_message_size)
            .field("content_type_column", &self.content_type_column)
            .field("routes", &self.routes)
            .field("key_header", &self.key_header)
            .field("header_columns", &self.header_columns)
            .finish()
    }
}

impl std::fmt::Debug for OutboxSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxSettings")
            .field("name", &self.name)
            .field("table", &self.table)
            .field("database_url", &redact_url(&self.database_url))
            .field("database_password", &masked(&self.database_password))
            .field("database_password_file", &self.database_password_file)
            .field("exchange", &self.exchange)
            .field("exchange_type", &self.exchange_type)
            .field("routing_key", &self.routing_key)
            .field("key_header", &self.key_header)
            .field("content_type", &self.content_type)
            .field("content_type_column", &self.content_type_column)
            .field("header_columns", &self.header_columns)
            .field("ordering", &self.ordering)
            .field("publishers", &self.publishers)
            .field("routes", &self.routes)
            .field("columns", &self.columns)
            .finish()
    }
}
