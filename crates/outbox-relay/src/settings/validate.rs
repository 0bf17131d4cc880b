//! From the settings as written to the typed [`Config`]. Each section checks its own keys
//! and records every problem it finds, so that one run reports them all; a section yields
//! its part of the [`Config`] only when all of its keys are good.

use super::check::{builtin, Report, Section};
use super::config::{Config, DatabaseConfig, LogConfig, MaxPendingAge};
use super::outboxes::{self, database_columns, Inherited, DATABASE_SCHEMES};
use super::shape::broker_urls;
use super::shape::{
    AmqpSection, DatabaseSettings, LogSettings, MetricsSettings, RelaySettings, Settings,
    TelemetrySettings,
};
use super::ConfigError;
use crate::secrets::{self, redact_url, PasswordKeys, Secrets};
use outbox_amqp::message::LARGEST_MAX_MESSAGE_SIZE;
use outbox_amqp::{AmqpSettings, BrokerUrl, MessageSettings};
use outbox_core::{RelayOptions, RetryPolicy, Route, RouteField, Router, RoutingKeyTemplate};
use outbox_store::ColumnName;
use outbox_store::TableName;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// The largest `relay.batch_size`: a MySQL claim binds one value per claimed row, up to
/// 4 × `batch_size` while a backlog drains (its limit is 65,535), and the relay holds
/// 4 × `batch_size` records in memory.
const MAX_BATCH_SIZE: usize = 10_000;

impl Settings {
    /// Checks every value and builds the [`Config`]; all problems are reported together.
    pub fn validate(self) -> Result<Config, Vec<ConfigError>> {
        let mut report = Report::default();
        let database = self.database.validate(&mut report.section("database"));
        // Before [amqp], whose messages carry the node id and the publish timeout.
        let relay = self.relay.validate(&mut report.section("relay"));
        let max_pending_age = self.relay.max_pending_age(&mut report.section("relay"));
        let startup_timeout = self.relay.startup_timeout(&mut report.section("relay"));
        let amqp = self
            .amqp
            .validate(&mut report.section("amqp"), relay.as_ref());
        let database = match self.pg_ssl_mode_error(std::env::var("PGSSLMODE").ok()) {
            Some(error) => {
                report.errors.push(error);
                None
            }
            None => database,
        };
        let log = self.log.validate(&mut report.section("log"));
        let metrics_listen = self.metrics.validate(&mut report.section("metrics"));
        let otlp_traces_url = self.telemetry.validate(&mut report.section("telemetry"));
        let admin = self.admin.validate(&mut report.section("admin"));
        // The entries inherit from the sections above, so they are checked once those are
        // valid (an entry's problems would otherwise repeat theirs).
        let outboxes = match (&database, &amqp, &relay) {
            (Some(database), Some(amqp), Some(relay)) => {
                let inherited = Inherited {
                    database,
                    amqp,
                    relay,
                };
                outboxes::validate(&self, &inherited, &mut report)
            }
            _ => None,
        };
        let (
            Some(database),
            Some(mut amqp),
            Some(mut relay),
            Some(log),
            Some(metrics_listen),
            Some(outboxes),
            Some(max_pending_age),
            Some(otlp_traces_url),
            Some(startup_timeout),
            Some(admin),
        ) = (
            database,
            amqp,
            relay,
            log,
            metrics_listen,
            outboxes,
            max_pending_age,
            otlp_traces_url,
            startup_timeout,
            admin,
        )
        else {
            return Err(report.errors);
        };
        if max_pending_age.is_some() && metrics_listen.is_none() {
            report.warnings.push(
                "relay.max_pending_age is set but metrics.listen is \"\": the backlog is \
                 checked by the metrics and health endpoint, so nothing checks it"
                    .into(),
            );
        }
        report.warnings.extend(contradictions(&relay));
        amqp.topology = outboxes.iter().map(|o| Arc::clone(&o.routing)).collect();
        // The first outbox's, for the callers that relay one (`start_relay`).
        relay = outboxes[0].relay_options(&relay);
        Ok(Config {
            effective: self.redacted(&match self.relay.node_id.trim() {
                // Not this process's id: `run` is another process, with its own.
                "" => default_node_id_of("<pid of run>"),
                _ => relay.node_id.clone(),
            }),
            secrets: Secrets::new(
                [
                    Some(&database.url),
                    database.listen_url.as_ref(),
                    otlp_traces_url.as_ref(),
                ]
                .into_iter()
                .flatten()
                .chain(amqp.brokers.iter().map(|broker| &broker.url))
                .chain(outboxes.iter().map(|outbox| &outbox.database_url))
                .map(String::as_str),
                otlp_header_values(),
            ),
            database,
            amqp,
            relay,
            outboxes,
            log,
            metrics_listen,
            admin,
            max_pending_age,
            otlp_traces_url,
            startup_timeout,
            warnings: report.warnings,
        })
    }
}

impl Settings {
    /// `PGSSLMODE`, which the relay's PostgreSQL connections honour as libpq does, with a
    /// value libpq would refuse (sqlx would take it as "prefer"): an error naming it.
    pub(super) fn pg_ssl_mode_error(&self, mode: Option<String>) -> Option<ConfigError> {
        let mode = mode.filter(|mode| !mode.is_empty())?;
        let postgres = std::iter::once(self.database.url.as_str())
            .chain(
                self.outboxes
                    .iter()
                    .map(|outbox| outbox.database_url.as_str()),
            )
            .any(|url| url.starts_with("postgres"));
        (postgres && !outbox_store::PG_SSL_MODES.contains(&mode.as_str())).then(|| {
            ConfigError::Invalid {
                key: "PGSSLMODE (environment)".into(),
                value: mode,
                accepted: format!(
                    "one of {}, as libpq takes it",
                    outbox_store::PG_SSL_MODES.join(", ")
                ),
            }
        })
    }
}

impl DatabaseSettings {
    fn validate(&self, check: &mut Section<'_>) -> Option<DatabaseConfig> {
        let defaults = Self::default();
        let keys = PasswordKeys::section("database");
        let url = check.take(
            url_setting(&check.key("url"), &self.url, DATABASE_SCHEMES).and_then(|url| {
                secrets::with_password(&keys, url, &self.password, &self.password_file)
            }),
        );
        let table = match TableName::parse(&self.table) {
            Ok(table) => Some(table),
            Err(error) => check.reject("table", &self.table, error.to_string()),
        };
        let columns = database_columns(&self.columns, check);
        let max_connections = check.size(
            "max_connections",
            self.max_connections,
            defaults.max_connections,
        );
        // The pools take a u32: a larger size is refused, never cut down.
        let max_connections = match u32::try_from(max_connections) {
            Ok(size) => Some(size),
            Err(_) => check.reject(
                "max_connections",
                max_connections.to_string(),
                format!("a whole number from 1 to {}", u32::MAX),
            ),
        };
        let listen_url = if self.listen_url.trim().is_empty() {
            Some(None)
        } else {
            check
                .take(
                    url_setting(
                        &check.key("listen_url"),
                        &self.listen_url,
                        &["postgres", "postgresql"],
                    )
                    .and_then(|url| {
                        let keys = keys.clone().for_url("database.listen_url");
                        secrets::with_password(&keys, url, &self.password, &self.password_file)
                    }),
                )
                .map(|(url, _)| Some(url))
        };
        let probe_interval = check.duration_or_default(
            "probe_interval",
            &self.probe_interval,
            &defaults.probe_interval,
        );
        let max_connection_lifetime = check.duration_or_default(
            "max_connection_lifetime",
            &self.max_connection_lifetime,
            &defaults.max_connection_lifetime,
        );
        let idle_timeout =
            check.duration_or_default("idle_timeout", &self.idle_timeout, &defaults.idle_timeout);
        let (url, redacted_url) = url?;
        Some(DatabaseConfig {
            url,
            redacted_url,
            table: table?,
            columns: columns?,
            max_connections: max_connections?,
            migrate_on_start: self.migrate_on_start,
            notify: self.notify,
            listen_url: listen_url?,
            probe_interval: self.probe.then_some(probe_interval?),
            max_connection_lifetime: max_connection_lifetime?,
            idle_timeout: idle_timeout?,
        })
    }
}

impl RelaySettings {
    fn validate(&self, check: &mut Section<'_>) -> Option<RelayOptions> {
        let defaults = Self::default();
        let publishers = check.size("publishers", self.publishers, defaults.publishers);
        let batch_size = match check.size("batch_size", self.batch_size, defaults.batch_size) {
            size if size > MAX_BATCH_SIZE => check.reject(
                "batch_size",
                size.to_string(),
                format!("a whole number from 1 to {MAX_BATCH_SIZE}"),
            ),
            size => Some(size),
        };
        let max_inflight_bytes = check.size(
            "max_inflight_bytes",
            self.max_inflight_bytes,
            defaults.max_inflight_bytes,
        );
        let max_attempts = match u32::try_from(self.max_attempts) {
            Ok(attempts) => Some(attempts),
            Err(_) => check.reject(
                "max_attempts",
                self.max_attempts.to_string(),
                "a whole number from 0 (retry forever) up",
            ),
        };
        // Blank keeps published rows forever, and zero does too: never "delete at once".
        let retention = check.optional_duration(
            "retention",
            &self.retention,
            "a duration such as \"7d\", \"12h\" or \"30m\", or \"\" to keep published rows \
             forever",
            "published rows are kept forever",
        );
        let poll_interval = check.duration_or_default(
            "poll_interval",
            &self.poll_interval,
            &defaults.poll_interval,
        );
        let publish_timeout = check.duration_or_default(
            "publish_timeout",
            &self.publish_timeout,
            &defaults.publish_timeout,
        );
        let lease = check.duration_or_default("lease", &self.lease, &defaults.lease);
        let shutdown_timeout = check.duration_or_default(
            "shutdown_timeout",
            &self.shutdown_timeout,
            &defaults.shutdown_timeout,
        );
        let retry_max_interval = check.duration_or_default(
            "retry_max_interval",
            &self.retry_max_interval,
            &defaults.retry_max_interval,
        );
        let stall_after =
            check.duration_or_default("stall_after", &self.stall_after, &defaults.stall_after);
        let retry_interval = check.duration("retry_interval", &self.retry_interval);
        let retry_strategy = if self.retry_strategy.is_blank() {
            Some(builtin(&defaults.retry_strategy))
        } else {
            check.parse("retry_strategy", &self.retry_strategy, None)
        };
        let ordering = check.parse("ordering", &self.ordering, None);
        let published_rows = check.parse("published_rows", &self.published_rows, None);

        let (poll_interval, retry_interval) = (poll_interval?, retry_interval?);
        Some(RelayOptions {
            name: self.name.clone(),
            // The outbox's, filled in once the outboxes are known.
            outbox: String::new(),
            node_id: match self.node_id.trim() {
                "" => default_node_id(),
                id => id.to_owned(),
            },
            publishers,
            poll_interval,
            batch_size: batch_size?,
            max_inflight_bytes,
            publish_timeout: publish_timeout?,
            retry: RetryPolicy {
                strategy: retry_strategy?,
                // Zero means "the next round", as in the original worker.
                interval: match retry_interval {
                    Duration::ZERO => poll_interval,
                    interval => interval,
                },
                max_interval: retry_max_interval?,
                max_attempts: max_attempts?,
            },
            lease: lease?,
            ordering: ordering?,
            shutdown_timeout: shutdown_timeout?,
            retention: retention?,
            published_rows: published_rows?,
            stall_after: stall_after?,
        })
    }
}

impl RelaySettings {
    /// `max_pending_age` and `max_pending_age_readiness`: `Some(None)` when off (blank,
    /// or zero with a warning).
    fn max_pending_age(&self, check: &mut Section<'_>) -> Option<Option<MaxPendingAge>> {
        let age = check.optional_duration(
            "max_pending_age",
            &self.max_pending_age,
            "a duration such as \"30s\", \"5m\" or \"1h\", or \"\" for no delivery objective",
            "no delivery objective",
        )?;
        Some(age.map(|age| MaxPendingAge {
            age,
            readiness: self.max_pending_age_readiness,
        }))
    }
}

impl RelaySettings {
    /// `startup_timeout`: `Some(None)` (wait as long as it takes) when blank, or zero with
    /// a warning (the project's rule for zero durations; `"1s"` is the way to fail fast).
    fn startup_timeout(&self, check: &mut Section<'_>) -> Option<Option<Duration>> {
        check.optional_duration(
            "startup_timeout",
            &self.startup_timeout,
            "a duration such as \"30s\" or \"5m\", or \"\" to wait for the database and the \
             broker as long as it takes",
            "wait as long as it takes",
        )
    }
}

impl AmqpSection {
    /// `relay` is the validated `[relay]`, when it is valid.
    fn validate(
        &self,
        check: &mut Section<'_>,
        relay: Option<&RelayOptions>,
    ) -> Option<AmqpSettings> {
        let urls = broker_urls(&self.url);
        // Each URL checked, each getting the password of amqp.password(_file); in a list,
        // each is named by its position (`amqp.url[1]`).
        let brokers: Vec<Option<BrokerUrl>> = (urls.iter().enumerate())
            .map(|(index, url)| {
                let key = match urls.len() {
                    1 => check.key("url"),
                    _ => format!("{}[{index}]", check.key("url")),
                };
                let keys = PasswordKeys::section("amqp").for_url(key.as_str());
                check.take(
                    url_setting(&key, url, &["amqp", "amqps"])
                        .and_then(|url| {
                            secrets::with_password(&keys, url, &self.password, &self.password_file)
                        })
                        .map(|(url, redacted)| BrokerUrl { url, redacted }),
                )
            })
            .collect();
        let tls_ca_pem = check.take(secrets::tls_ca_file(&urls, &self.tls_ca_file));
        let defaults = Self::default();
        let max_message_size = match check.size(
            "max_message_size",
            self.max_message_size,
            defaults.max_message_size,
        ) {
            size if size > LARGEST_MAX_MESSAGE_SIZE => check.reject(
                "max_message_size",
                size.to_string(),
                format!(
                    "a number of bytes from 1 to {LARGEST_MAX_MESSAGE_SIZE} (RabbitMQ's largest), \
                     the broker's max_message_size"
                ),
            ),
            size => Some(size),
        };
        let routing = self.routing(check);

        let brokers: Option<Vec<BrokerUrl>> = brokers.into_iter().collect();
        let (relay, brokers, routing) = (relay?, brokers?, routing?);
        let max_message_size = max_message_size?;
        Some(AmqpSettings {
            brokers,
            tls_ca_pem: tls_ca_pem?,
            exchange_type: routing.exchange_type,
            declare_exchange: self.declare_exchange,
            router: routing.router,
            key_header: routing.key_header,
            extra: routing.extra,
            // Every outbox's, filled in once the outboxes are known.
            topology: Vec::new(),
            message: MessageSettings {
                content_type: self.content_type.clone(),
                max_body_bytes: max_message_size,
                node_id: relay.node_id.clone(),
            },
            publish_timeout: relay.publish_timeout,
        })
    }

    pub(super) fn router(&self, check: &mut Section<'_>) -> Option<Router> {
        let exchange = template(check, "exchange", &self.exchange);
        let routing_key = template(check, "routing_key", &self.routing_key);
        let routes: Vec<Option<Route>> = (self.routes.iter().enumerate())
            .map(|(index, route)| {
                let routing_key = match &route.routing_key {
                    Some(key) => {
                        template(check, &format!("routes[{index}].routing_key"), key).map(Some)
                    }
                    None => Some(None),
                };
                let exchange = template(check, &format!("routes[{index}].exchange"), &route.exchange);
                let by_column = !route.column.is_empty() || !route.pattern.is_empty();
                let (field, pattern) = match (route.event_type.is_empty(), by_column) {
                    (false, false) => (RouteField::EventType, route.event_type.clone()),
                    (true, true) if !route.column.is_empty() && !route.pattern.is_empty() => {
                        match ColumnName::parse(&route.column) {
                            Ok(_) => (RouteField::Column(route.column.clone()), route.pattern.clone()),
                            Err(error) => {
                                return check.reject(
                                    &format!("routes[{index}].column"),
                                    &route.column,
                                    error.to_string(),
                                )
                            }
                        }
                    }
                    (false, true) => {
                        return check.reject(
                            &format!("routes[{index}].event_type"),
                            &route.event_type,
                            "either event_type, or column and pattern, not both",
                        )
                    }
                    _ => {
                        return check.reject(
                            &format!("routes[{index}].event_type"),
                            "",
                            "a pattern such as \"room.member.*\" or \"room.#\", or column = \"aggregatetype\" with pattern = \"order\"",
                        )
                    }
                };
                Some(Route {
                    field,
                    pattern,
                    exchange: exchange?,
                    routing_key: routing_key?,
                })
            })
            .collect();
        Some(Router {
            exchange: exchange?,
            routing_key: routing_key?,
            routes: routes.into_iter().collect::<Option<_>>()?,
        })
    }
}

/// A routing key template setting.
fn template(check: &mut Section<'_>, key: &str, value: &str) -> Option<RoutingKeyTemplate> {
    match RoutingKeyTemplate::parse(value) {
        Ok(template) => Some(template),
        Err(error) => check.reject(key, value, error.to_string()),
    }
}

impl LogSettings {
    fn validate(&self, check: &mut Section<'_>) -> Option<LogConfig> {
        let format = check.parse("format", &self.format, None);
        let level = match log_level(&self.level) {
            Ok(()) => Some(()),
            Err(why) => check.reject("level", &self.level, why),
        };
        level?;
        Some(LogConfig {
            format: format?,
            level: self.level.clone(),
        })
    }
}

/// `RUST_LOG`, which wins over `log.level`, held to the same rule; `None` when unset.
pub(super) fn rust_log() -> Option<ConfigError> {
    let filter = std::env::var("RUST_LOG").ok()?;
    if filter.trim().is_empty() {
        return None;
    }
    let why = log_level(&filter).err()?;
    Some(ConfigError::Invalid {
        key: "RUST_LOG".into(),
        value: filter,
        accepted: format!("{why} (RUST_LOG replaces log.level when set)"),
    })
}

/// The levels a `log.level` directive may name.
const LEVELS: &str = "trace, debug, info, warn, error or off";

/// Checks `log.level`: what tracing's filter accepts, and nothing that silently turns
/// logging off. The filter reads a bare word that is no level (`warning`, `debugg`) as a
/// target to log at every level, leaving every other line, errors included, unlogged; so
/// each directive is a level or `target=level`.
pub(super) fn log_level(level: &str) -> Result<(), String> {
    let accepted = format!(
        "a level ({LEVELS}), or comma-separated directives such as \"info\" or \
         \"warn,outbox_pipeline=debug\""
    );
    if level.trim().is_empty() {
        return Err(accepted);
    }
    for directive in level.split(',').map(str::trim) {
        let level_part = match directive.rsplit_once('=') {
            Some((_, level)) => level,
            None => directive,
        };
        // An empty level would read as "error"; say one.
        if level_part.is_empty()
            || level_part
                .parse::<tracing::level_filters::LevelFilter>()
                .is_err()
        {
            return Err(format!("{accepted}; {directive:?} names no level"));
        }
    }
    tracing_subscriber::EnvFilter::try_new(level)
        .map(|_| ())
        .map_err(|error| format!("{accepted} ({error})"))
}

impl MetricsSettings {
    /// The endpoint's address; `None` when blank (disabled).
    fn validate(&self, check: &mut Section<'_>) -> Option<Option<SocketAddr>> {
        if self.listen.is_blank() {
            return Some(None);
        }
        check
            .parse(
                "listen",
                &self.listen,
                Some("an address such as \"127.0.0.1:9187\", or \"\" to disable the endpoint"),
            )
            .map(Some)
    }
}

impl TelemetrySettings {
    /// The URL spans are sent to; `None` when blank (no spans).
    fn validate(&self, check: &mut Section<'_>) -> Option<Option<String>> {
        let endpoint = self.otlp_endpoint.trim();
        if endpoint.is_empty() {
            return Some(None);
        }
        if !cfg!(feature = "otel") {
            return check.reject(
                "otlp_endpoint",
                redact_url(endpoint),
                "\"\" in this build, which has no OpenTelemetry: build outbox-relay with \
                 `--features otel` (the release and container builds do)",
            );
        }
        let key = check.key("otlp_endpoint");
        let (url, _) = check.take(url_setting(&key, endpoint, &["http", "https"]))?;
        let url = url::Url::parse(&url).ok()?;
        if !url.username().is_empty() || url.password().is_some() {
            return check.reject(
                "otlp_endpoint",
                redact_url(endpoint),
                "a URL without credentials: the exporter sends the headers of \
                 OTEL_EXPORTER_OTLP_HEADERS (e.g. `authorization=Basic …`)",
            );
        }
        Some(Some(crate::traces::traces_url(&url)))
    }
}

/// The values of the OTLP exporter's headers (`OTEL_EXPORTER_OTLP_HEADERS`,
/// `OTEL_EXPORTER_OTLP_TRACES_HEADERS`: `key=value,…`), to scrub: they carry credentials.
fn otlp_header_values() -> Vec<String> {
    [
        "OTEL_EXPORTER_OTLP_HEADERS",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    ]
    .iter()
    .filter_map(|name| std::env::var(name).ok())
    .flat_map(|headers| {
        headers
            .split(',')
            .filter_map(|pair| {
                pair.split_once('=')
                    .map(|(_, value)| value.trim().to_owned())
            })
            .filter(|value| !value.is_empty())
            .collect::<Vec<_>>()
    })
    .flat_map(|value| {
        let decoded = percent_encoding::percent_decode_str(&value)
            .decode_utf8_lossy()
            .into_owned();
        [value, decoded]
    })
    .collect()
}

/// `hostname-pid`: unique per running process, readable in `status`.
pub fn default_node_id() -> String {
    default_node_id_of(&std::process::id().to_string())
}

/// `hostname-<pid>`.
fn default_node_id_of(pid: &str) -> String {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    format!("{host}-{pid}")
}

/// How many times `relay.publish_timeout` the lease should at least be: a node renews its
/// leases every `lease / 3`, so a lease must cover that gap plus a publish plus the
/// outcome write; below 3 × `publish_timeout`, one slow publish between two renewals can
/// outlive the lease and hand its rows to another node (a duplicate).
const LEASE_OVER_PUBLISH_TIMEOUT: u32 = 3;

/// Settings that are each valid but defeat one another: warnings, not errors.
fn contradictions(relay: &RelayOptions) -> Vec<String> {
    let mut warnings = Vec::new();
    let shown = |duration: Duration| humantime::format_duration(duration).to_string();
    // Saturating: never an overflow, whatever bound durations have.
    let lease_floor = relay
        .publish_timeout
        .saturating_mul(LEASE_OVER_PUBLISH_TIMEOUT);
    if relay.lease < lease_floor {
        warnings.push(format!(
            "relay.lease = {:?} is not comfortably above relay.publish_timeout = {:?}: leases \
             are renewed every lease / 3, so a lease below {LEASE_OVER_PUBLISH_TIMEOUT} × \
             publish_timeout ({}) can run out during one slow publish and another node may \
             publish the same rows again; keep it a wide margin above (the defaults are 30s \
             and 3s)",
            shown(relay.lease),
            shown(relay.publish_timeout),
            shown(lease_floor),
        ));
    }
    if relay.shutdown_timeout < relay.publish_timeout {
        warnings.push(format!(
            "relay.shutdown_timeout = {:?} is below relay.publish_timeout = {:?}: a graceful \
             stop gives up before a slow publish is confirmed, and its row is published again \
             after the lease",
            shown(relay.shutdown_timeout),
            shown(relay.publish_timeout),
        ));
    }
    warnings
}

/// Parses a URL setting with one of `schemes`; returns it and its redacted form.
pub(super) fn url_setting(
    key: &str,
    value: &str,
    schemes: &[&str],
) -> Result<(String, String), ConfigError> {
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
    // Several database hosts (`db-1:5432,db-2:5432`, libpq's form): each host's URL.
    let mut parsed = None;
    for host in outbox_store::hosts::split(value) {
        let url = url::Url::parse(&host)
            .map_err(|error| invalid(format!("a URL ({error}); accepted: {accepted}")))?;
        parsed.get_or_insert(url);
    }
    let parsed = parsed.expect("one URL at least");
    if !schemes.contains(&parsed.scheme()) {
        return Err(invalid(format!(
            "scheme {:?} is not supported; accepted: {accepted}",
            parsed.scheme()
        )));
    }
    Ok((value.to_owned(), redact_url(value)))
}
