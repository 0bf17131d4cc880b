//! Settings (DESIGN §8): layered, then validated in one place before anything connects.
//!
//! Layers: built-in defaults ← TOML file ← `OUTBOX_RELAY__SECTION__KEY` variables.
//! [`Settings`] mirrors the file (strings for durations and choices); [`Settings::validate`]
//! turns it into a [`Config`] or into [`ConfigError`]s that each name the key, the bad value
//! and what is accepted.

use crate::secrets::{self, Secrets};
use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use outbox_amqp::{AmqpSettings, MessageSettings};
use outbox_core::{
    Ordering, RelayOptions, RetryPolicy, RetryStrategy, Route, Router, RoutingKeyTemplate,
};
use outbox_store::TableName;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use thiserror::Error;

/// Prefix of the environment overrides; sections and keys are separated by `__`.
pub const ENV_PREFIX: &str = "OUTBOX_RELAY__";

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
}

/// `[database]`
#[derive(Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseSettings {
    /// `sqlite://…`, `postgres://…` or `mysql://…`; TLS by `sslmode=` / `ssl-mode=`, plain
    /// text when absent.
    pub url: String,
    /// The password, when it is not in `url`: meant for `OUTBOX_RELAY__DATABASE__PASSWORD`
    /// rather than the file. Empty: none.
    pub password: String,
    /// A file holding the password (a trailing newline is ignored). Empty: none.
    pub password_file: String,
    /// The outbox table.
    pub table: String,
    /// Pool size.
    pub max_connections: i64,
    /// Create or upgrade the table when `run` or `demo` starts.
    pub migrate_on_start: bool,
    /// PostgreSQL: LISTEN for the insert trigger's NOTIFY and claim at once (polling stays
    /// as the fallback). Ignored on other backends, which poll.
    pub notify: bool,
}

/// `[amqp]`
#[derive(Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AmqpSection {
    /// `amqp://user:pass@host:port/vhost`, or `amqps://…` for TLS.
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
    /// `topic`, `direct`, `fanout` or `headers`.
    pub exchange_type: String,
    /// Declare the exchanges (durable) at start.
    pub declare_exchange: bool,
    /// Default routing key template.
    pub routing_key: String,
    /// `content_type` of every message.
    pub content_type: String,
    /// Per-event-type exchange and routing key; first match wins.
    pub routes: Vec<RouteSettings>,
}

/// One `[[amqp.routes]]` entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSettings {
    /// Topic-style pattern over `event_type`.
    pub event_type: String,
    /// Exchange for matching events.
    pub exchange: String,
    /// Routing key template for matching events; `amqp.routing_key` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_key: Option<String>,
}

/// `[relay]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RelaySettings {
    /// The `worker` field of every log line.
    pub name: String,
    /// Empty: `hostname-pid`.
    pub node_id: String,
    /// Publisher actors (confirm channels).
    pub publishers: i64,
    /// Claim cadence when nothing wakes the relay.
    pub poll_interval: String,
    /// Rows per claim.
    pub batch_size: i64,
    /// Confirm deadline per publish.
    pub publish_timeout: String,
    /// `fixed_interval` or `exponential`.
    pub retry_strategy: String,
    /// Empty: `poll_interval`.
    pub retry_interval: String,
    /// Cap of the exponential backoff.
    pub retry_max_interval: String,
    /// 0: retry forever.
    pub max_attempts: i64,
    /// Claim lease.
    pub lease: String,
    /// `per_room` or `none`.
    pub ordering: String,
    /// Hard bound on a graceful shutdown.
    pub shutdown_timeout: String,
    /// Published rows older than this are deleted; empty keeps them forever.
    pub retention: String,
}

/// `[log]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSettings {
    /// `pretty` or `json`.
    pub format: String,
    /// A tracing filter such as `info` or `outbox_relay=debug`; `RUST_LOG` wins.
    pub level: String,
}

/// `[metrics]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSettings {
    /// Address of the metrics and health endpoint; empty disables it.
    pub listen: String,
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
            notify: true,
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
            routes: Vec::new(),
        }
    }
}

impl Default for RelaySettings {
    fn default() -> Self {
        Self {
            name: "room_outbox".into(),
            node_id: String::new(),
            publishers: 4,
            poll_interval: "1s".into(),
            batch_size: 100,
            publish_timeout: "3s".into(),
            retry_strategy: "fixed_interval".into(),
            retry_interval: String::new(),
            retry_max_interval: "5m".into(),
            max_attempts: 0,
            lease: "30s".into(),
            ordering: "per_room".into(),
            shutdown_timeout: "30s".into(),
            retention: String::new(),
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

// Debug by hand for the sections that hold secrets, so `{:?}` of the settings (or of a
// Config) can be logged: URLs redacted, passwords shown as set or not.
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
            .finish()
    }
}

impl std::fmt::Debug for AmqpSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpSection")
            .field("url", &redact_url(&self.url))
            .field("password", &masked(&self.password))
            .field("password_file", &self.password_file)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("exchange", &self.exchange)
            .field("exchange_type", &self.exchange_type)
            .field("declare_exchange", &self.declare_exchange)
            .field("routing_key", &self.routing_key)
            .field("content_type", &self.content_type)
            .field("routes", &self.routes)
            .finish()
    }
}

impl std::fmt::Debug for DatabaseConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseConfig")
            .field("url", &self.redacted_url)
            .field("table", &self.table)
            .field("max_connections", &self.max_connections)
            .field("migrate_on_start", &self.migrate_on_start)
            .field("notify", &self.notify)
            .finish()
    }
}

/// `"***"` for a set secret, `""` for an unset one.
fn masked(secret: &str) -> &'static str {
    if secret.is_empty() {
        ""
    } else {
        "***"
    }
}

/// A setting that cannot be used. Exit code 2.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// The file or an environment variable does not fit the settings' shape.
    #[error("{0}")]
    Load(String),
    /// A value is out of its accepted range.
    #[error("{key} = {value:?} is invalid: {accepted}")]
    Invalid {
        /// `section.key`.
        key: String,
        /// The value as given (secrets redacted).
        value: String,
        /// What would have been accepted.
        accepted: String,
    },
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Pretty,
    /// One JSON object per line.
    Json,
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
}

/// Validated logging settings.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// Pretty or JSON.
    pub format: LogFormat,
    /// Tracing filter directives.
    pub level: String,
}

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

impl Settings {
    /// Loads defaults ← `file` (when it exists, or always when `required`) ← environment.
    pub fn load(file: &Path, required: bool) -> Result<Self, ConfigError> {
        if required && !file.exists() {
            return Err(ConfigError::Load(format!(
                "config file {} does not exist",
                file.display()
            )));
        }
        Self::load_from(
            Figment::from(Serialized::defaults(Settings::default()))
                .merge(Toml::file(file))
                .merge(Env::prefixed(ENV_PREFIX).split("__")),
        )
    }

    fn load_from(figment: Figment) -> Result<Self, ConfigError> {
        figment
            .extract()
            .map_err(|error| ConfigError::Load(load_error(error)))
    }

    /// Checks every value and builds the [`Config`]; all problems are reported together.
    pub fn validate(self) -> Result<Config, Vec<ConfigError>> {
        let mut check = Check::default();
        let mut warnings = Vec::new();
        let database = &self.database;
        let relay = &self.relay;

        let database_url = check.take(
            url_setting(
                "database.url",
                &database.url,
                &["sqlite", "postgres", "postgresql", "mysql", "mariadb"],
            )
            .and_then(|url| {
                with_password("database", url, &database.password, &database.password_file)
            }),
        );
        let amqp = &self.amqp;
        let amqp_url = check.take(
            url_setting("amqp.url", &amqp.url, &["amqp", "amqps"])
                .and_then(|url| with_password("amqp", url, &amqp.password, &amqp.password_file)),
        );
        let tls_ca_pem = check.take(secrets::tls_ca_file(&amqp.url, &amqp.tls_ca_file));
        let table =
            check.take(
                TableName::parse(&database.table).map_err(|error| ConfigError::Invalid {
                    key: "database.table".into(),
                    value: database.table.clone(),
                    accepted: error.to_string(),
                }),
            );
        let max_connections = positive(
            "database.max_connections",
            database.max_connections,
            10,
            &mut warnings,
        );
        let publishers = positive("relay.publishers", relay.publishers, 4, &mut warnings);
        let batch_size = positive("relay.batch_size", relay.batch_size, 100, &mut warnings);
        // A MySQL claim binds one value per claimed row (its limit is 65,535), and the
        // relay holds 4 × batch_size records in memory.
        let batch_bound = check.take(if batch_size > MAX_BATCH_SIZE {
            Err(ConfigError::Invalid {
                key: "relay.batch_size".into(),
                value: batch_size.to_string(),
                accepted: format!("a whole number from 1 to {MAX_BATCH_SIZE}"),
            })
        } else {
            Ok(())
        });
        let max_attempts =
            check.take(
                u32::try_from(relay.max_attempts).map_err(|_| ConfigError::Invalid {
                    key: "relay.max_attempts".into(),
                    value: relay.max_attempts.to_string(),
                    accepted: "a whole number from 0 (retry forever) up".into(),
                }),
            );
        let poll_interval = check.take(duration("relay.poll_interval", &relay.poll_interval));
        let publish_timeout = check.take(duration("relay.publish_timeout", &relay.publish_timeout));
        let retry_interval = check.take(duration("relay.retry_interval", &relay.retry_interval));
        let retry_max_interval = check.take(duration(
            "relay.retry_max_interval",
            &relay.retry_max_interval,
        ));
        let lease = check.take(duration("relay.lease", &relay.lease));
        let shutdown_timeout =
            check.take(duration("relay.shutdown_timeout", &relay.shutdown_timeout));
        let retention = check.take(retention(&relay.retention, &mut warnings));
        // A blank strategy means the default, as in the original worker.
        let strategy = check.take(match relay.retry_strategy.trim() {
            "" => Ok(RetryStrategy::default()),
            other => other
                .parse::<RetryStrategy>()
                .map_err(|()| ConfigError::Invalid {
                    key: "relay.retry_strategy".into(),
                    value: other.into(),
                    accepted: format!("one of {}", RetryStrategy::ACCEPTED),
                }),
        });
        let ordering =
            check.take(
                relay
                    .ordering
                    .parse::<Ordering>()
                    .map_err(|()| ConfigError::Invalid {
                        key: "relay.ordering".into(),
                        value: relay.ordering.clone(),
                        accepted: format!("one of {}", Ordering::ACCEPTED),
                    }),
            );
        let exchange_type = check.take(match self.amqp.exchange_type.as_str() {
            "topic" | "direct" | "fanout" | "headers" => Ok(()),
            custom if custom.starts_with("x-") => Ok(()),
            other => Err(ConfigError::Invalid {
                key: "amqp.exchange_type".into(),
                value: other.into(),
                accepted:
                    "one of \"topic\", \"direct\", \"fanout\", \"headers\" or a plugin type \"x-…\""
                        .into(),
            }),
        });
        let router = check.take(router(&self.amqp));
        let log_format = check.take(match self.log.format.as_str() {
            "pretty" => Ok(LogFormat::Pretty),
            "json" => Ok(LogFormat::Json),
            other => Err(ConfigError::Invalid {
                key: "log.format".into(),
                value: other.into(),
                accepted: "\"pretty\" or \"json\"".into(),
            }),
        });
        let log_level = check.take(
            tracing_subscriber::EnvFilter::try_new(&self.log.level)
                .map(|_| ())
                .map_err(|error| ConfigError::Invalid {
                    key: "log.level".into(),
                    value: self.log.level.clone(),
                    accepted: format!(
                        "a tracing filter such as \"info\" or \"outbox_relay=debug,warn\" ({error})"
                    ),
                }),
        );
        let metrics_listen = check.take(match self.metrics.listen.trim() {
            "" => Ok(None),
            listen => listen
                .parse::<SocketAddr>()
                .map(Some)
                .map_err(|_| ConfigError::Invalid {
                    key: "metrics.listen".into(),
                    value: listen.into(),
                    accepted:
                        "an address such as \"127.0.0.1:9187\", or \"\" to disable the endpoint"
                            .into(),
                }),
        });

        let (
            Some((database_url, database_redacted)),
            Some((amqp_url, amqp_redacted)),
            Some(table),
            Some(max_attempts),
            Some(poll_interval),
            Some(publish_timeout),
            Some(retry_interval),
            Some(retry_max_interval),
            Some(lease),
            Some(shutdown_timeout),
            Some(strategy),
            Some(ordering),
            Some(()),
            Some(router),
            Some(log_format),
            Some(()),
            Some(metrics_listen),
            Some(tls_ca_pem),
            Some(()),
        ) = (
            database_url,
            amqp_url,
            table,
            max_attempts,
            poll_interval,
            publish_timeout,
            retry_interval,
            retry_max_interval,
            lease,
            shutdown_timeout,
            strategy,
            ordering,
            exchange_type,
            router,
            log_format,
            log_level,
            metrics_listen,
            tls_ca_pem,
            batch_bound,
        )
        else {
            return Err(check.errors);
        };
        let Some(retention) = retention else {
            return Err(check.errors);
        };

        let node_id = match relay.node_id.trim() {
            "" => default_node_id(),
            id => id.to_owned(),
        };
        let normalised = RelayOptions {
            name: relay.name.clone(),
            node_id: node_id.clone(),
            publishers,
            poll_interval,
            batch_size,
            publish_timeout,
            retry: RetryPolicy {
                strategy,
                interval: retry_interval,
                max_interval: retry_max_interval,
                max_attempts,
            },
            lease,
            ordering,
            shutdown_timeout,
            retention,
        }
        .normalise();
        warnings.extend(normalised.warnings);
        let options = normalised.value;

        let mut effective = self.clone();
        // As written (the password, if any, set apart), so the output reads like the file.
        effective.database.url = redact_url(&self.database.url);
        effective.amqp.url = redact_url(&self.amqp.url);
        effective.amqp.password = masked(&self.amqp.password).into();
        effective.database.password = masked(&self.database.password).into();
        effective.relay.node_id = node_id.clone();

        let secrets = Secrets::from_urls([database_url.as_str(), amqp_url.as_str()]);
        Ok(Config {
            database: DatabaseConfig {
                url: database_url,
                redacted_url: database_redacted,
                table,
                max_connections: u32::try_from(max_connections).unwrap_or(u32::MAX),
                migrate_on_start: self.database.migrate_on_start,
                notify: self.database.notify,
            },
            amqp: AmqpSettings {
                url: amqp_url,
                redacted_url: amqp_redacted,
                tls_ca_pem,
                exchange_type: self.amqp.exchange_type.clone(),
                declare_exchange: self.amqp.declare_exchange,
                router,
                message: MessageSettings {
                    content_type: self.amqp.content_type.clone(),
                    max_body_bytes: outbox_amqp::message::MAX_BODY_BYTES,
                    node_id,
                },
                publish_timeout: options.publish_timeout,
            },
            relay: options,
            log: LogConfig {
                format: log_format,
                level: self.log.level.clone(),
            },
            metrics_listen,
            warnings,
            effective,
            secrets,
        })
    }
}

/// Collects validation errors while keeping the values that passed.
#[derive(Default)]
struct Check {
    errors: Vec<ConfigError>,
}

impl Check {
    fn take<T>(&mut self, result: Result<T, ConfigError>) -> Option<T> {
        result.map_err(|error| self.errors.push(error)).ok()
    }
}

/// Figment's message names the key and where it came from; make the wording ours.
fn load_error(error: figment::Error) -> String {
    error
        .into_iter()
        .map(|error| {
            let key = error.path.join(".");
            let source = match error.metadata.as_ref() {
                // Figment names only the prefix; the variable follows from the key.
                Some(metadata) if metadata.name.contains("environment") => format!(
                    " (from environment variable {ENV_PREFIX}{})",
                    error.path.join("__").to_uppercase()
                ),
                Some(metadata) => match &metadata.source {
                    Some(source) => format!(" (from {source})"),
                    None => format!(" (from {})", metadata.name),
                },
                None => String::new(),
            };
            match &error.kind {
                figment::error::Kind::UnknownField(field, expected) => format!(
                    "unknown setting {key:?}{source}: {field:?} is not a key of [{}]; accepted keys: {}",
                    error.path[..error.path.len().saturating_sub(1)].join("."),
                    expected.join(", ")
                ),
                kind => format!("setting {key:?}{source}: {kind}"),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `hostname-pid`: unique per running process, readable in `status`.
pub fn default_node_id() -> String {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    format!("{host}-{}", std::process::id())
}

/// Parses a duration setting. Empty and "0" mean zero (normalised to the default later).
fn duration(key: &str, value: &str) -> Result<Duration, ConfigError> {
    let trimmed = value.trim();
    if trimmed.is_empty() || trimmed == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(trimmed).map_err(|error| ConfigError::Invalid {
        key: key.into(),
        value: value.into(),
        accepted: format!("a duration such as \"250ms\", \"3s\" or \"5m\" ({error})"),
    })
}

/// Parses `relay.retention`: empty keeps published rows forever. Zero means the default
/// as for every duration, which here is "forever" (never "delete at once"), with a warning.
fn retention(value: &str, warnings: &mut Vec<String>) -> Result<Option<Duration>, ConfigError> {
    let trimmed = value.trim();
    if trimmed.is_empty() {
        return Ok(None);
    }
    let parsed = match trimmed {
        "0" => Duration::ZERO,
        _ => humantime::parse_duration(trimmed).map_err(|error| ConfigError::Invalid {
            key: "relay.retention".into(),
            value: value.into(),
            accepted: format!(
                "a duration such as \"7d\", \"12h\" or \"30m\", or \"\" to keep published rows forever ({error})"
            ),
        })?,
    };
    if parsed.is_zero() {
        warnings.push(format!(
            "relay.retention is {value:?}; keeping published rows forever (the default)"
        ));
        return Ok(None);
    }
    Ok(Some(parsed))
}

/// A size that must be positive; zero or less means the default, with a warning.
/// The largest `relay.batch_size`.
const MAX_BATCH_SIZE: usize = 10_000;

fn positive(key: &str, value: i64, default: usize, warnings: &mut Vec<String>) -> usize {
    match usize::try_from(value) {
        Ok(value) if value > 0 => value,
        _ => {
            warnings.push(format!("{key} is {value}; using the default {default}"));
            default
        }
    }
}

/// Parses a URL setting with one of `schemes`; returns it and its redacted form.
fn url_setting(key: &str, value: &str, schemes: &[&str]) -> Result<(String, String), ConfigError> {
    let invalid = |why: String| ConfigError::Invalid {
        key: key.into(),
        value: redact_url(value),
        accepted: why,
    };
    let accepted = schemes
        .iter()
        .map(|s| format!("{s}://…"))
        .collect::<Vec<_>>()
        .join(", ");
    let parsed = url::Url::parse(value)
        .map_err(|error| invalid(format!("a URL ({error}); accepted: {accepted}")))?;
    if !schemes.contains(&parsed.scheme()) {
        return Err(invalid(format!(
            "scheme {:?} is not supported; accepted: {accepted}",
            parsed.scheme()
        )));
    }
    Ok((value.to_owned(), redact_url(value)))
}

/// `url` (validated) with the password of `<section>.password(_file)` put in, if one is
/// set; returns it and its redacted form.
fn with_password(
    section: &str,
    (url, redacted): (String, String),
    password: &str,
    password_file: &str,
) -> Result<(String, String), ConfigError> {
    match secrets::password_setting(section, password, password_file)? {
        None => Ok((url, redacted)),
        Some(password) => {
            let url = secrets::insert_password(section, &url, &password)?;
            let redacted = redact_url(&url);
            Ok((url, redacted))
        }
    }
}

/// The URL with any password replaced by `***`; unparsable text is not echoed at all.
pub fn redact_url(value: &str) -> String {
    match url::Url::parse(value) {
        Ok(mut parsed) => {
            if parsed.password().is_some() {
                let _ = parsed.set_password(Some("***"));
            }
            parsed.to_string()
        }
        Err(_) => "<unparsable URL>".into(),
    }
}

fn router(amqp: &AmqpSection) -> Result<Router, ConfigError> {
    let template = |key: String, value: &str| {
        RoutingKeyTemplate::parse(value).map_err(|error| ConfigError::Invalid {
            key,
            value: value.into(),
            accepted: error.to_string(),
        })
    };
    let routing_key = template("amqp.routing_key".into(), &amqp.routing_key)?;
    let mut routes = Vec::new();
    for (index, route) in amqp.routes.iter().enumerate() {
        let routing_key = match &route.routing_key {
            Some(key) => Some(template(format!("amqp.routes[{index}].routing_key"), key)?),
            None => None,
        };
        if route.event_type.is_empty() {
            return Err(ConfigError::Invalid {
                key: format!("amqp.routes[{index}].event_type"),
                value: String::new(),
                accepted: "a pattern such as \"room.member.*\" or \"room.#\"".into(),
            });
        }
        routes.push(Route {
            event_type: route.event_type.clone(),
            exchange: route.exchange.clone(),
            routing_key,
        });
    }
    Ok(Router {
        exchange: amqp.exchange.clone(),
        routing_key,
        routes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use figment::Jail;

    // figment's Jail closures return its (large) error type.
    #[allow(clippy::result_large_err)]
    fn load(toml: &str, env: &[(&str, &str)]) -> Result<Config, String> {
        let mut result = Err(String::new());
        Jail::expect_with(|jail| {
            jail.create_file("outbox.toml", toml)?;
            for (key, value) in env {
                jail.set_env(key, value);
            }
            result = Settings::load(Path::new("outbox.toml"), true)
                .map_err(|error| error.to_string())
                .and_then(|settings| {
                    settings.validate().map_err(|errors| {
                        errors
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join("\n")
                    })
                });
            Ok(())
        });
        result
    }

    #[test]
    fn defaults_are_valid() {
        let config = load("", &[]).unwrap();
        assert_eq!(config.relay.batch_size, 100);
        assert_eq!(config.relay.poll_interval, Duration::from_secs(1));
        assert_eq!(config.relay.publish_timeout, Duration::from_secs(3));
        assert_eq!(config.relay.retry.interval, Duration::from_secs(1));
        assert_eq!(config.relay.ordering, Ordering::PerRoom);
        assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    }

    #[test]
    fn the_shipped_default_file_is_valid() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/default.toml");
        let toml = std::fs::read_to_string(file).unwrap();
        let config = load(&toml, &[]).unwrap();
        assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    }

    #[test]
    fn unknown_retry_strategy_is_rejected_with_its_key() {
        let error = load("[relay]\nretry_strategy = \"linear\"", &[]).unwrap_err();
        assert!(error.contains("relay.retry_strategy"), "{error}");
        assert!(
            error.contains("linear") && error.contains("exponential"),
            "{error}"
        );
    }

    #[test]
    fn bad_duration_is_rejected_with_its_key() {
        let error = load("[relay]\npoll_interval = \"soon\"", &[]).unwrap_err();
        assert!(
            error.contains("relay.poll_interval") && error.contains("soon"),
            "{error}"
        );
        assert!(error.contains("250ms"), "says what is accepted: {error}");
    }

    #[test]
    fn retention_is_off_by_default_and_parses_days() {
        assert_eq!(load("", &[]).unwrap().relay.retention, None);
        let config = load("[relay]\nretention = \"7d\"", &[]).unwrap();
        assert_eq!(
            config.relay.retention,
            Some(Duration::from_secs(7 * 24 * 3600))
        );
    }

    #[test]
    fn bad_retention_is_rejected_with_its_key() {
        let error = load("[relay]\nretention = \"a week\"", &[]).unwrap_err();
        assert!(
            error.contains("relay.retention") && error.contains("a week"),
            "{error}"
        );
        assert!(
            error.contains("7d") && error.contains("forever"),
            "says what is accepted: {error}"
        );
    }

    #[test]
    fn zero_retention_keeps_rows_forever_with_a_warning() {
        let config = load("[relay]\nretention = \"0s\"", &[]).unwrap();
        assert_eq!(
            config.relay.retention, None,
            "zero never means delete at once"
        );
        let warnings = config.warnings.join("\n");
        assert!(warnings.contains("relay.retention"), "{warnings}");
    }

    #[test]
    fn a_batch_size_beyond_the_bound_is_rejected() {
        let error = load("[relay]\nbatch_size = 100000", &[]).unwrap_err();
        assert!(
            error.contains("relay.batch_size") && error.contains("1 to 10000"),
            "{error}"
        );
        assert!(load("[relay]\nbatch_size = 10000", &[]).is_ok());
    }

    #[test]
    fn unknown_key_in_the_file_is_rejected() {
        let error = load("[relay]\nbatchsize = 5", &[]).unwrap_err();
        assert!(error.contains("relay.batchsize"), "{error}");
        assert!(
            error.contains("batch_size"),
            "lists the accepted keys: {error}"
        );
    }

    #[test]
    fn unknown_key_in_the_environment_is_rejected() {
        let error = load("", &[("OUTBOX_RELAY__RELAY__POLL", "1s")]).unwrap_err();
        assert!(error.contains("relay.poll"), "{error}");
        assert!(
            error.contains("OUTBOX_RELAY__RELAY__POLL"),
            "names the variable: {error}"
        );
    }

    #[test]
    fn unknown_ordering_is_rejected() {
        let error = load("[relay]\nordering = \"global\"", &[]).unwrap_err();
        assert!(
            error.contains("relay.ordering") && error.contains("per_room"),
            "{error}"
        );
    }

    #[test]
    fn zero_values_fall_back_to_defaults_with_warnings() {
        let config = load(
            "[relay]\npoll_interval = \"0s\"\nbatch_size = 0\npublish_timeout = \"0ms\"",
            &[],
        )
        .unwrap();
        assert_eq!(config.relay.poll_interval, Duration::from_secs(1));
        assert_eq!(config.relay.batch_size, 100);
        assert_eq!(config.relay.publish_timeout, Duration::from_secs(3));
        let warnings = config.warnings.join("\n");
        for key in [
            "relay.poll_interval",
            "relay.batch_size",
            "relay.publish_timeout",
        ] {
            assert!(warnings.contains(key), "{warnings}");
        }
    }

    #[test]
    fn environment_overrides_the_file() {
        let config = load(
            "[relay]\nbatch_size = 50\n[amqp]\nexchange = \"from.file\"",
            &[
                ("OUTBOX_RELAY__RELAY__BATCH_SIZE", "250"),
                ("OUTBOX_RELAY__AMQP__EXCHANGE", "from.env"),
            ],
        )
        .unwrap();
        assert_eq!(config.relay.batch_size, 250);
        assert_eq!(config.amqp.router.exchange, "from.env");
    }

    #[test]
    fn passwords_never_reach_messages_or_effective_settings() {
        let config = load(
            "[database]\nurl = \"postgres://relay:s3cret@db:5432/app\"\n[amqp]\nurl = \"amqp://relay:hunter2@mq:5672/%2f\"",
            &[],
        )
        .unwrap();
        let effective = toml::to_string(&config.effective).unwrap();
        assert!(
            !effective.contains("s3cret") && !effective.contains("hunter2"),
            "{effective}"
        );
        assert!(effective.contains("relay:***@db"), "{effective}");
        let error = load("[database]\nurl = \"oracle://u:s3cret@db/x\"", &[]).unwrap_err();
        assert!(!error.contains("s3cret"), "{error}");
        assert!(error.contains("database.url"), "{error}");
    }

    /// A file in a fresh temporary directory (outside figment's jail, which owns the cwd).
    fn temp_file(name: &str, contents: &str) -> String {
        let dir =
            std::env::temp_dir().join(format!("outbox-settings-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, contents).unwrap();
        path.display().to_string()
    }

    #[test]
    fn password_from_a_file_goes_into_the_url_and_nowhere_else() {
        let file = temp_file("db-password", "fr0m-f1le\n");
        let config = load(
            &format!(
                "[database]\nurl = \"postgres://relay@db/app\"\npassword_file = \"{file}\"\n\
                 [amqp]\nurl = \"amqp://relay@mq/%2f\""
            ),
            &[("OUTBOX_RELAY__AMQP__PASSWORD", "fr0m-env")],
        )
        .unwrap();
        assert_eq!(config.database.url, "postgres://relay:fr0m-f1le@db/app");
        assert_eq!(config.database.redacted_url, "postgres://relay:***@db/app");
        assert_eq!(config.amqp.url, "amqp://relay:fr0m-env@mq/%2f");
        let shown = format!(
            "{}\n{config:?}",
            toml::to_string(&config.effective).unwrap()
        );
        assert!(
            !shown.contains("fr0m-f1le") && !shown.contains("fr0m-env"),
            "{shown}"
        );
        assert_eq!(config.secrets.scrub("x fr0m-f1le fr0m-env"), "x *** ***");
    }

    #[test]
    fn debug_output_of_the_settings_and_config_holds_no_password() {
        let config = load(
            "[database]\nurl = \"postgres://relay:s3cret@db/app\"\n[amqp]\nurl = \"amqp://relay:hunter2@mq/%2f\"",
            &[],
        )
        .unwrap();
        let debug = format!("{config:?}\n{:#?}", config.effective);
        assert!(
            !debug.contains("s3cret") && !debug.contains("hunter2"),
            "{debug}"
        );
        assert!(debug.contains("relay:***@db"), "{debug}");
        let mut settings = Settings::default();
        settings.database.password = "s3cret".into();
        assert!(!format!("{settings:?}").contains("s3cret"));
    }

    #[test]
    fn unreadable_password_file_is_rejected_naming_the_key_and_path() {
        let error = load(
            "[database]\nurl = \"postgres://relay@db/app\"\npassword_file = \"/nonexistent/db-password\"",
            &[],
        )
        .unwrap_err();
        assert!(
            error.contains("database.password_file") && error.contains("/nonexistent/db-password"),
            "{error}"
        );
    }

    #[test]
    fn empty_password_file_is_rejected() {
        let file = temp_file("empty-password", "\n");
        let error = load(
            &format!("[amqp]\nurl = \"amqp://relay@mq/%2f\"\npassword_file = \"{file}\""),
            &[],
        )
        .unwrap_err();
        assert!(
            error.contains("amqp.password_file") && error.contains("empty"),
            "{error}"
        );
    }

    #[test]
    fn password_and_password_file_together_are_rejected() {
        let file = temp_file("both-password", "from-file");
        let error = load(
            &format!("[amqp]\nurl = \"amqp://relay@mq/%2f\"\npassword_file = \"{file}\""),
            &[("OUTBOX_RELAY__AMQP__PASSWORD", "from-env")],
        )
        .unwrap_err();
        assert!(
            error.contains("amqp.password_file") && error.contains("not both"),
            "{error}"
        );
        assert!(
            !error.contains("from-env") && !error.contains("from-file"),
            "{error}"
        );
    }

    #[test]
    fn password_setting_next_to_a_password_in_the_url_is_rejected() {
        let error = load(
            "[database]\nurl = \"postgres://relay:in-url@db/app\"",
            &[("OUTBOX_RELAY__DATABASE__PASSWORD", "in-env")],
        )
        .unwrap_err();
        assert!(
            error.contains("database.url") && error.contains("one place"),
            "{error}"
        );
        assert!(
            !error.contains("in-url") && !error.contains("in-env"),
            "{error}"
        );
    }

    #[test]
    fn password_setting_without_a_user_in_the_url_is_rejected() {
        let error = load(
            "[database]\nurl = \"postgres://db/app\"\npassword = \"pw\"",
            &[],
        )
        .unwrap_err();
        assert!(
            error.contains("database.url") && error.contains("names the user"),
            "{error}"
        );
    }

    #[test]
    fn password_setting_for_sqlite_is_rejected() {
        let error = load("[database]\npassword = \"pw\"", &[]).unwrap_err();
        assert!(
            error.contains("database.password") && error.contains("sqlite"),
            "{error}"
        );
    }

    #[test]
    fn amqps_url_with_a_ca_file_is_accepted() {
        let file = temp_file(
            "ca.pem",
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        );
        let config = load(
            &format!("[amqp]\nurl = \"amqps://relay:pw@mq:5671/%2f\"\ntls_ca_file = \"{file}\""),
            &[],
        )
        .unwrap();
        assert!(config
            .amqp
            .tls_ca_pem
            .unwrap()
            .contains("BEGIN CERTIFICATE"));
        assert_eq!(config.amqp.redacted_url, "amqps://relay:***@mq:5671/%2f");
    }

    #[test]
    fn missing_tls_ca_file_is_rejected_naming_the_key_and_path() {
        let error = load(
            "[amqp]\nurl = \"amqps://mq/%2f\"\ntls_ca_file = \"/nonexistent/ca.pem\"",
            &[],
        )
        .unwrap_err();
        assert!(
            error.contains("amqp.tls_ca_file") && error.contains("/nonexistent/ca.pem"),
            "{error}"
        );
    }

    #[test]
    fn tls_ca_file_without_certificates_is_rejected() {
        let file = temp_file("not-a-ca.pem", "hello");
        let error = load(
            &format!("[amqp]\nurl = \"amqps://mq/%2f\"\ntls_ca_file = \"{file}\""),
            &[],
        )
        .unwrap_err();
        assert!(
            error.contains("amqp.tls_ca_file") && error.contains("holds none"),
            "{error}"
        );
    }

    #[test]
    fn tls_ca_file_with_a_plain_amqp_url_is_rejected() {
        let file = temp_file(
            "plain-ca.pem",
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        );
        let error = load(&format!("[amqp]\ntls_ca_file = \"{file}\""), &[]).unwrap_err();
        assert!(
            error.contains("amqp.tls_ca_file") && error.contains("amqps://"),
            "{error}"
        );
    }

    #[test]
    fn bad_routing_key_template_is_rejected() {
        let error = load("[amqp]\nrouting_key = \"{tenant}.x\"", &[]).unwrap_err();
        assert!(
            error.contains("amqp.routing_key") && error.contains("{tenant}"),
            "{error}"
        );
    }
}
