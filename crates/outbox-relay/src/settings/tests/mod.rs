//! Loading and validating whole settings files: each rejection names the key, the value
//! and what is accepted, every problem is reported at once, and no password is shown.

mod campaign;
mod key_named;
mod mutations;
mod outboxes;
mod refused;
mod secrets;
mod shape;
mod verdict;

use super::{Config, MaxPendingAge};
use figment::Jail;
use outbox_core::Ordering;
use std::path::Path;
use std::time::Duration;

// figment's Jail closures return its (large) error type.
#[allow(clippy::result_large_err)]
pub(super) fn load(toml: &str, env: &[(&str, &str)]) -> Result<Config, String> {
    let mut result = Err(String::new());
    Jail::expect_with(|jail| {
        // A comment, so that the file is never empty (an empty file is refused).
        jail.create_file("outbox.toml", &format!("# settings under test\n{toml}"))?;
        for (key, value) in env {
            jail.set_env(key, value);
        }
        result = Config::load(Path::new("outbox.toml"), true).map_err(|rejected| {
            rejected
                .errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
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
fn max_pending_age_is_off_by_default_and_counts_for_readiness_when_set() {
    assert_eq!(load("", &[]).unwrap().max_pending_age, None);
    let config = load("[relay]\nmax_pending_age = \"90s\"", &[]).unwrap();
    assert_eq!(
        config.max_pending_age,
        Some(MaxPendingAge {
            age: Duration::from_secs(90),
            readiness: true
        })
    );
    let config = load(
        "[relay]\nmax_pending_age = \"5m\"\nmax_pending_age_readiness = false",
        &[],
    )
    .unwrap();
    assert_eq!(
        config.max_pending_age,
        Some(MaxPendingAge {
            age: Duration::from_secs(300),
            readiness: false
        })
    );
}

#[test]
fn a_bad_or_zero_max_pending_age_is_named() {
    let error = load("[relay]\nmax_pending_age = \"late\"", &[]).unwrap_err();
    assert!(
        error.contains("relay.max_pending_age") && error.contains("late"),
        "{error}"
    );
    assert!(error.contains("30s"), "says what is accepted: {error}");
    let config = load("[relay]\nmax_pending_age = \"0s\"", &[]).unwrap();
    assert_eq!(config.max_pending_age, None, "zero is off");
    let warnings = config.warnings.join("\n");
    assert!(warnings.contains("relay.max_pending_age"), "{warnings}");
}

#[test]
fn startup_timeout_is_off_by_default_and_a_duration_when_set() {
    assert_eq!(
        load("", &[]).unwrap().startup_timeout,
        None,
        "waits forever"
    );
    let config = load("[relay]\nstartup_timeout = \"45s\"", &[]).unwrap();
    assert_eq!(config.startup_timeout, Some(Duration::from_secs(45)));
    let config = load("", &[("OUTBOX_RELAY__RELAY__STARTUP_TIMEOUT", "2m")]).unwrap();
    assert_eq!(config.startup_timeout, Some(Duration::from_secs(120)));
}

#[test]
fn a_bad_or_zero_startup_timeout_is_named() {
    let error = load("[relay]\nstartup_timeout = \"soon\"", &[]).unwrap_err();
    assert!(
        error.contains("relay.startup_timeout") && error.contains("soon"),
        "{error}"
    );
    assert!(error.contains("30s"), "says what is accepted: {error}");
    let config = load("[relay]\nstartup_timeout = \"0s\"", &[]).unwrap();
    assert_eq!(config.startup_timeout, None, "zero is unset: wait forever");
    let warnings = config.warnings.join("\n");
    assert!(warnings.contains("relay.startup_timeout"), "{warnings}");
}

#[test]
fn max_pending_age_without_the_endpoint_warns() {
    let config = load(
        "[relay]\nmax_pending_age = \"1m\"\n[metrics]\nlisten = \"\"",
        &[],
    )
    .unwrap();
    let warnings = config.warnings.join("\n");
    assert!(
        warnings.contains("relay.max_pending_age") && warnings.contains("metrics.listen"),
        "{warnings}"
    );
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
fn the_broker_message_size_is_rabbitmq_4s_default_and_bounded_by_rabbitmq_s_largest() {
    let config = load("", &[]).unwrap();
    assert_eq!(config.amqp.message.max_body_bytes, 16 * 1024 * 1024);
    let config = load("[amqp]\nmax_message_size = 134217728", &[]).unwrap();
    assert_eq!(
        config.amqp.message.max_body_bytes, 134_217_728,
        "3.x's default"
    );
    let error = load("[amqp]\nmax_message_size = 536870913", &[]).unwrap_err();
    assert!(
        error.contains("amqp.max_message_size") && error.contains("1 to 536870912"),
        "{error}"
    );
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
fn published_rows_are_kept_unless_delete_is_asked_per_outbox_or_for_all() {
    use outbox_core::PublishedRows;
    let config = load("", &[]).unwrap();
    assert_eq!(config.relay.published_rows, PublishedRows::Keep);
    assert_eq!(config.outboxes[0].published_rows, PublishedRows::Keep);
    let config = load("[relay]\npublished_rows = \"delete\"", &[]).unwrap();
    assert_eq!(config.outboxes[0].published_rows, PublishedRows::Delete);
    let config = load(
        "[relay]\npublished_rows = \"delete\"\n\
         [[outboxes]]\ntable = \"a\"\n\
         [[outboxes]]\ntable = \"b\"\npublished_rows = \"keep\"",
        &[],
    )
    .unwrap();
    let rows: Vec<PublishedRows> = config.outboxes.iter().map(|o| o.published_rows).collect();
    assert_eq!(rows, [PublishedRows::Delete, PublishedRows::Keep]);
    assert_eq!(
        config.outboxes[1]
            .relay_options(&config.relay)
            .published_rows,
        PublishedRows::Keep
    );
    let error = load("[relay]\npublished_rows = \"drop\"", &[]).unwrap_err();
    assert!(
        error.contains("relay.published_rows") && error.contains("\"keep\" or \"delete\""),
        "{error}"
    );
    let error = load(
        "[[outboxes]]\ntable = \"a\"\npublished_rows = \"purge\"",
        &[],
    )
    .unwrap_err();
    assert!(
        error.contains("published_rows: \"purge\" is invalid"),
        "{error}"
    );
}

#[test]
fn max_inflight_bytes_defaults_to_64_mib_and_zero_means_the_default() {
    assert_eq!(
        load("", &[]).unwrap().relay.max_inflight_bytes,
        64 * 1024 * 1024
    );
    let config = load("[relay]\nmax_inflight_bytes = 5000000", &[]).unwrap();
    assert_eq!(config.relay.max_inflight_bytes, 5_000_000);
    let config = load("[relay]\nmax_inflight_bytes = 0", &[]).unwrap();
    assert_eq!(config.relay.max_inflight_bytes, 64 * 1024 * 1024);
    assert!(
        config
            .warnings
            .join("\n")
            .contains("relay.max_inflight_bytes"),
        "{:?}",
        config.warnings
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
    assert_eq!(config.amqp.router.exchange.to_string(), "from.env");
}

#[test]
fn bad_routing_key_template_is_rejected() {
    let error = load("[amqp]\nrouting_key = \"{Tenant}.x\"", &[]).unwrap_err();
    assert!(
        error.contains("amqp.routing_key") && error.contains("{Tenant}"),
        "{error}"
    );
}

#[test]
fn every_bad_value_is_reported_at_once() {
    let error = load(
        "[database]\ntable = \"Room-Outbox\"\n\
         [amqp]\nurl = \"http://mq\"\nexchange_type = \"fanin\"\n\
         [relay]\npoll_interval = \"soon\"\nlease = \"later\"\nretry_strategy = \"linear\"\n\
         ordering = \"global\"\nmax_attempts = -1\n\
         [log]\nformat = \"xml\"\n[metrics]\nlisten = \"everywhere\"",
        &[],
    )
    .unwrap_err();
    let keys = [
        "database.table",
        "amqp.url",
        "amqp.exchange_type",
        "relay.poll_interval",
        "relay.lease",
        "relay.retry_strategy",
        "relay.ordering",
        "relay.max_attempts",
        "log.format",
        "metrics.listen",
    ];
    for key in keys {
        assert!(
            error.contains(&format!("{key} = ")),
            "{key} missing: {error}"
        );
    }
    assert_eq!(error.lines().count(), keys.len(), "{error}");
}

#[test]
fn a_number_where_a_duration_goes_is_rejected_with_its_key() {
    let error = load("[relay]\npoll_interval = 5", &[]).unwrap_err();
    assert_eq!(
        error,
        "relay.poll_interval = 5 is invalid: a duration such as \"30s\", \"250ms\" or \"5m\""
    );
}

#[test]
fn unparsable_database_url_is_rejected_without_echoing_it() {
    let error = load("[database]\nurl = \"relay s3cret db\"", &[]).unwrap_err();
    assert!(
        error.contains("database.url") && error.contains("<unparsable URL>"),
        "{error}"
    );
    assert!(!error.contains("s3cret"), "{error}");
    assert!(
        error.contains("postgres://…"),
        "says what is accepted: {error}"
    );
}

#[test]
fn amqp_url_takes_a_list_of_brokers_from_the_file_or_the_environment() {
    let one = load("[amqp]\nurl = \"amqp://mq-1/%2f\"", &[]).unwrap();
    assert_eq!(one.amqp.redacted_urls(), "amqp://mq-1/%2f");
    let listed = load(
        "[amqp]\nurl = [\"amqp://mq-1/%2f\", \"amqps://mq-2:5671/%2f\"]",
        &[],
    )
    .unwrap();
    assert_eq!(
        listed.amqp.redacted_urls(),
        "amqp://mq-1/%2f, amqps://mq-2:5671/%2f"
    );
    let from_env = load(
        "",
        &[(
            "OUTBOX_RELAY__AMQP__URL",
            "amqp://mq-1/%2f, amqp://mq-2/%2f,amqp://mq-3/%2f",
        )],
    )
    .unwrap();
    let urls: Vec<&str> = from_env
        .amqp
        .brokers
        .iter()
        .map(|b| b.url.as_str())
        .collect();
    assert_eq!(
        urls,
        vec!["amqp://mq-1/%2f", "amqp://mq-2/%2f", "amqp://mq-3/%2f"]
    );
}

#[test]
fn a_bad_broker_in_the_list_is_named() {
    let error = load("[amqp]\nurl = [\"amqp://mq-1/%2f\", \"http://mq-2/\"]", &[]).unwrap_err();
    assert!(
        error.contains("amqp.url[1] = \"http://mq-2/\"") && error.contains("amqps://…"),
        "{error}"
    );
    let error = load("[amqp]\nurl = \"amqp://mq-1/%2f,\"", &[]).unwrap_err();
    assert!(error.contains("amqp.url"), "an empty entry: {error}");
    let error = load("[amqp]\nurl = 5", &[]).unwrap_err();
    assert!(
        error.contains("amqp.url") && error.contains("list of URLs"),
        "{error}"
    );
}

#[test]
fn amqp_url_of_another_scheme_is_rejected() {
    let error = load("[amqp]\nurl = \"http://mq:5672/\"", &[]).unwrap_err();
    assert!(
        error.contains("amqp.url") && error.contains("\"http\"") && error.contains("amqps://…"),
        "{error}"
    );
}

#[test]
fn bad_table_name_is_rejected() {
    let error = load("[database]\ntable = \"Room-Outbox\"", &[]).unwrap_err();
    assert!(
        error.contains("database.table") && error.contains("Room-Outbox"),
        "{error}"
    );
}

#[test]
fn negative_max_attempts_is_rejected() {
    let error = load("[relay]\nmax_attempts = -3", &[]).unwrap_err();
    assert!(
        error.contains("relay.max_attempts") && error.contains("-3"),
        "{error}"
    );
    assert!(error.contains("from 0 (retry forever)"), "{error}");
}

#[test]
fn unknown_exchange_type_is_rejected_and_plugin_types_accepted() {
    let error = load("[amqp]\nexchange_type = \"fanin\"", &[]).unwrap_err();
    assert!(
        error.contains("amqp.exchange_type") && error.contains("fanin") && error.contains("x-…"),
        "{error}"
    );
    let config = load("[amqp]\nexchange_type = \"x-delayed-message\"", &[]).unwrap();
    assert_eq!(config.amqp.exchange_type, "x-delayed-message");
}

#[test]
fn route_without_an_event_type_or_with_a_bad_key_is_rejected() {
    let error = load(
        "[[amqp.routes]]\nevent_type = \"\"\nexchange = \"x\"\n\
         [[amqp.routes]]\nevent_type = \"room.#\"\nexchange = \"y\"\nrouting_key = \"{tenant id}\"",
        &[],
    )
    .unwrap_err();
    assert!(
        error.contains("amqp.routes[0].event_type") && error.contains("room.#"),
        "{error}"
    );
    assert!(
        error.contains("amqp.routes[1].routing_key") && error.contains("{tenant id}"),
        "both routes are reported: {error}"
    );
}

#[test]
fn unknown_log_format_is_rejected_listing_the_formats() {
    let error = load("[log]\nformat = \"xml\"", &[]).unwrap_err();
    assert!(
        error.contains("log.format") && error.contains("xml"),
        "{error}"
    );
    assert!(
        error.contains("\"pretty\"") && error.contains("\"json\""),
        "{error}"
    );
}

#[test]
fn bad_log_level_is_rejected() {
    let error = load("[log]\nlevel = \"outbox_pipeline=loud\"", &[]).unwrap_err();
    assert!(
        error.contains("log.level") && error.contains("outbox_pipeline=loud"),
        "{error}"
    );
}

#[test]
fn bad_metrics_address_is_rejected_and_blank_disables_the_endpoint() {
    let error = load("[metrics]\nlisten = \"localhost\"", &[]).unwrap_err();
    assert!(
        error.contains("metrics.listen") && error.contains("localhost"),
        "{error}"
    );
    assert!(error.contains("\"\" to disable"), "{error}");
    let listen = |toml: &str| load(toml, &[]).unwrap().metrics_listen;
    assert_eq!(listen("[metrics]\nlisten = \"\""), None);
    assert_eq!(
        listen("").map(|address| address.to_string()),
        Some("127.0.0.1:9187".into())
    );
}

#[test]
fn the_otlp_endpoint_is_off_by_default_and_needs_an_http_url_and_the_otel_feature() {
    let traces = |toml: &str| load(toml, &[]).map(|config| config.otlp_traces_url);
    assert_eq!(traces("").unwrap(), None, "off by default");
    assert_eq!(traces("[telemetry]\notlp_endpoint = \" \"").unwrap(), None);
    let set = "[telemetry]\notlp_endpoint = \"http://collector:4318\"";
    if cfg!(feature = "otel") {
        assert_eq!(
            traces(set).unwrap().as_deref(),
            Some("http://collector:4318/v1/traces")
        );
        let error = traces("[telemetry]\notlp_endpoint = \"grpc://collector:4317\"").unwrap_err();
        assert!(
            error.contains("telemetry.otlp_endpoint") && error.contains("http://"),
            "{error}"
        );
    } else {
        let error = traces(set).unwrap_err();
        assert!(
            error.contains("telemetry.otlp_endpoint") && error.contains("--features otel"),
            "a build without OpenTelemetry says so: {error}"
        );
    }
    let error = load(
        "",
        &[(
            "OUTBOX_RELAY__TELEMETRY__OTLP_ENDPOINT",
            "http://u:secret@collector:4318",
        )],
    )
    .unwrap_err();
    assert!(error.contains("telemetry.otlp_endpoint"), "{error}");
    if cfg!(feature = "otel") {
        assert!(error.contains("OTEL_EXPORTER_OTLP_HEADERS"), "{error}");
    }
    let text = error;
    assert!(
        !text.contains("secret"),
        "the password is never shown: {text}"
    );
}

#[test]
fn blank_retry_strategy_means_the_default() {
    let config = load("[relay]\nretry_strategy = \" \"", &[]).unwrap();
    assert_eq!(
        config.relay.retry.strategy,
        outbox_core::RetryStrategy::FixedInterval
    );
    let config = load("[relay]\nretry_strategy = \"exponential\"", &[]).unwrap();
    assert_eq!(
        config.relay.retry.strategy,
        outbox_core::RetryStrategy::Exponential
    );
}

#[test]
fn retry_interval_follows_a_custom_poll_interval() {
    let config = load("[relay]\npoll_interval = \"250ms\"", &[]).unwrap();
    assert_eq!(config.relay.retry.interval, Duration::from_millis(250));
    let config = load(
        "[relay]\npoll_interval = \"250ms\"\nretry_interval = \"0s\"",
        &[],
    )
    .unwrap();
    assert_eq!(config.relay.retry.interval, Duration::from_millis(250));
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
}

#[test]
fn sizes_below_zero_fall_back_to_defaults_with_warnings() {
    let config = load(
        "[database]\nmax_connections = -1\n[relay]\npublishers = -2",
        &[],
    )
    .unwrap();
    assert_eq!(config.database.max_connections, 10);
    assert_eq!(config.relay.publishers, 4);
    assert_eq!(
        config.warnings,
        [
            "database.max_connections is -1; using the default 10",
            "relay.publishers is -2; using the default 4"
        ]
    );
}

#[test]
fn wake_ups_default_to_a_5ms_probe_without_listen() {
    let config = load("", &[]).unwrap();
    assert!(!config.database.notify, "PostgreSQL probes by default");
    assert_eq!(config.database.listen_url, None);
    assert_eq!(
        config.database.probe_interval,
        Some(Duration::from_millis(5))
    );
    let off = load("[database]\nprobe = false", &[]).unwrap();
    assert_eq!(off.database.probe_interval, None);
}

#[test]
fn a_listen_url_must_be_postgres_and_a_probe_interval_a_duration() {
    let error = load(
        "[database]\nlisten_url = \"mysql://db:3306/x\"\nprobe_interval = \"often\"",
        &[],
    )
    .unwrap_err();
    assert!(error.contains("database.listen_url"), "{error}");
    assert!(error.contains("postgres"), "{error}");
    assert!(
        error.contains("database.probe_interval = \"often\""),
        "{error}"
    );
}

#[test]
fn a_listen_url_takes_the_database_password_and_never_shows_it() {
    let config = load(
        "[database]\nurl = \"postgres://relay@pgbouncer:6432/rooms\"\nlisten_url = \"postgres://relay@db-direct:5432/rooms\"\npassword = \"s3cret\"",
        &[],
    )
    .unwrap();
    let listen_url = config.database.listen_url.as_deref().unwrap();
    assert!(
        listen_url.contains("relay:s3cret@db-direct"),
        "{listen_url}"
    );
    let shown = format!("{:?} {:?}", config.database, config.effective.database);
    assert!(!shown.contains("s3cret"), "{shown}");
    assert_eq!(
        config
            .secrets
            .scrub("x postgres://relay:s3cret@db-direct y"),
        "x postgres://relay:***@db-direct y"
    );
}

#[test]
fn a_pgsslmode_libpq_would_refuse_is_an_error_naming_it() {
    let error = load(
        "[database]\nurl = \"postgres://relay@db/rooms\"",
        &[("PGSSLMODE", "verify_full")],
    )
    .unwrap_err();
    assert!(
        error.contains("PGSSLMODE (environment) = \"verify_full\" is invalid: one of disable"),
        "{error}"
    );
    for mode in ["verify-full", "require", "disable", ""] {
        load(
            "[database]\nurl = \"postgres://relay@db/rooms\"",
            &[("PGSSLMODE", mode)],
        )
        .unwrap_or_else(|error| panic!("PGSSLMODE={mode}: {error}"));
    }
    // Only PostgreSQL reads it.
    load(
        "[database]\nurl = \"mysql://relay@db/rooms\"",
        &[("PGSSLMODE", "verify_full")],
    )
    .unwrap();
}

#[test]
fn a_duration_beyond_a_thousand_years_is_refused_naming_its_key() {
    // A lease that long ended past the last timestamp: the Fetcher panicked at its first
    // claim, and the relay ran on relaying nothing.
    for (key, value) in [
        ("lease", "1000000y"),
        ("publish_timeout", "9223372036854775807s"),
        ("retention", "2000y"),
        ("max_pending_age", "1001y"),
    ] {
        let error = load(&format!("[relay]\n{key} = \"{value}\""), &[]).unwrap_err();
        assert_eq!(
            error,
            format!(
                "relay.{key} = \"{value}\" is invalid: a duration of at most 1000 years (\"1000y\")"
            )
        );
    }
    let config = load(
        "[relay]\nlease = \"1000y\"\npublish_timeout = \"1000y\"",
        &[],
    )
    .unwrap();
    assert_eq!(config.relay.lease, super::check::MAX_DURATION);
}

#[test]
fn a_publish_timeout_at_the_bound_is_weighed_against_the_lease_without_overflow() {
    // `publish_timeout × 3` overflowed a Duration (a panic, not exit code 2).
    let config = load("[relay]\npublish_timeout = \"1000y\"", &[]).unwrap();
    let warnings = config.warnings.join("\n");
    assert!(
        warnings.contains("relay.lease = \"30s\" is not comfortably above"),
        "{warnings}"
    );
}

/// A tokens file of `text` in the temporary directory, removed when dropped.
struct TokensFile(std::path::PathBuf);

impl TokensFile {
    fn new(text: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "outbox-relay-tokens-{}-{}",
            std::process::id(),
            text.len()
        ));
        std::fs::write(&path, text).unwrap();
        Self(path)
    }

    fn toml(&self) -> String {
        format!(
            "[admin]\nenabled = true\ntokens_file = {:?}",
            self.0.display().to_string()
        )
    }
}

impl Drop for TokensFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn the_admin_api_is_off_by_default_and_its_keys_are_then_inert() {
    assert!(load("", &[]).unwrap().admin.is_none());
    let config = load(
        "[admin]\nlisten = \"nowhere\"\ntokens_file = \"/nonexistent\"",
        &[],
    );
    assert!(config.unwrap().admin.is_none());
}

#[test]
fn the_admin_api_enabled_without_a_tokens_file_is_refused_naming_the_key() {
    let error = load("[admin]\nenabled = true", &[]).unwrap_err();
    assert!(error.contains("admin.tokens_file"), "{error}");
}

#[test]
fn an_unreadable_or_malformed_tokens_file_is_refused_naming_file_and_line() {
    let error = load(
        "[admin]\nenabled = true\ntokens_file = \"/nonexistent/tokens\"",
        &[],
    )
    .unwrap_err();
    assert!(
        error.contains("admin.tokens_file") && error.contains("/nonexistent/tokens"),
        "{error}"
    );
    let file = TokensFile::new("# tokens\nalice:admin:sha256:00\n");
    let error = load(&file.toml(), &[]).unwrap_err();
    let path = file.0.display().to_string();
    assert!(
        error.contains("admin.tokens_file") && error.contains(&path) && error.contains("line 2"),
        "{error}"
    );
}

#[test]
fn the_admin_api_enabled_with_good_tokens_listens_where_told() {
    let line = crate::admin::tokens::line("alice", crate::admin::Role::Operator, "t");
    let file = TokensFile::new(&format!("{line}\n"));
    let config = load(&format!("{}\nlisten = \"127.0.0.1:0\"", file.toml()), &[]).unwrap();
    let admin = config.admin.expect("enabled");
    assert_eq!(admin.listen.port(), 0);
    assert_eq!(
        admin.tokens.find("t").map(|t| t.name.as_str()),
        Some("alice")
    );
    let error = load(&format!("{}\nlisten = \"\"", file.toml()), &[]).unwrap_err();
    assert!(error.contains("admin.listen"), "{error}");
}

#[test]
fn a_tokens_file_others_may_read_is_warned_of() {
    use std::os::unix::fs::PermissionsExt as _;
    let line = crate::admin::tokens::line("alice", crate::admin::Role::Viewer, "t");
    let file = TokensFile::new(&format!("{line}\n# readable\n"));
    std::fs::set_permissions(&file.0, std::fs::Permissions::from_mode(0o644)).unwrap();
    let warnings = load(&file.toml(), &[]).unwrap().warnings.join("\n");
    assert!(
        warnings.contains("tokens file") && warnings.contains("admin.tokens_file"),
        "{warnings}"
    );
    std::fs::set_permissions(&file.0, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(load(&file.toml(), &[]).unwrap().warnings.is_empty());
}
