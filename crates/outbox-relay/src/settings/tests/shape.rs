//! The file and the environment as read: the file is a file, values from the environment
//! are text, every problem of the shape is reported in our words, `log.level` cannot turn
//! logging off, and contradictions warn.

use super::load;
use crate::settings::Config;
use figment::Jail;
use std::path::Path;

/// `Config::load` of `path` (required), every error on a line of its own.
fn load_path(path: &Path) -> Result<Config, String> {
    Config::load(path, true).map_err(|rejected| {
        let errors: Vec<String> = rejected.errors.iter().map(ToString::to_string).collect();
        errors.join("\n")
    })
}

#[test]
fn passwords_from_the_environment_are_taken_verbatim() {
    for password in [
        "8675309",
        "0123",
        "true",
        "[s3cr3t,x]",
        "\"Sup3r\"",
        "1e3",
        "-7",
        "100%41 sure",
        "p@ss:w/rd?#'é",
    ] {
        let config = load(
            "[amqp]\nurl = \"amqp://relay@mq/%2f\"",
            &[("OUTBOX_RELAY__AMQP__PASSWORD", password)],
        )
        .unwrap_or_else(|error| panic!("{password}: {error}"));
        let url = url::Url::parse(&config.amqp.brokers[0].url).unwrap();
        let given = percent_encoding::percent_decode_str(url.password().unwrap())
            .decode_utf8()
            .unwrap();
        assert_eq!(given, password);
        let shown = format!("{config:?}{}", toml::to_string(&config.effective).unwrap());
        assert!(!shown.contains(&format!(":{password}@")), "{shown}");
    }
}

#[test]
fn string_settings_from_the_environment_are_text_and_numbers_parse() {
    let config = load(
        "",
        &[
            ("OUTBOX_RELAY__RELAY__NODE_ID", "7"),
            ("OUTBOX_RELAY__RELAY__NAME", "0123"),
            ("OUTBOX_RELAY__RELAY__BATCH_SIZE", "42"),
            ("OUTBOX_RELAY__DATABASE__NOTIFY", "true"),
            (
                "OUTBOX_RELAY__AMQP__ROUTES",
                "[{event_type = \"a.*\", exchange = \"x\"}]",
            ),
        ],
    )
    .unwrap();
    assert_eq!(config.relay.node_id, "7");
    assert_eq!(config.relay.name, "0123");
    assert_eq!(config.relay.batch_size, 42);
    assert!(config.database.notify);
    assert_eq!(config.amqp.routing().router.routes.len(), 1);
}

#[test]
fn a_bad_number_from_the_environment_names_the_variable_the_value_and_an_example() {
    let error = load("", &[("OUTBOX_RELAY__RELAY__BATCH_SIZE", "lots")]).unwrap_err();
    assert_eq!(
        error,
        "relay.batch_size = \"lots\" is invalid: a whole number such as 100 (from environment \
         variable OUTBOX_RELAY__RELAY__BATCH_SIZE)"
    );
    let error = load("", &[("OUTBOX_RELAY__DATABASE__NOTIFY", "maybe")]).unwrap_err();
    assert!(
        error.contains("database.notify = \"maybe\" is invalid: true or false")
            && error.contains("OUTBOX_RELAY__DATABASE__NOTIFY"),
        "{error}"
    );
    let error = load("", &[("OUTBOX_RELAY__RELAY__LEASE", "30")]).unwrap_err();
    assert!(
        error.starts_with("relay.lease = \"30\" is invalid: a duration such as \"30s\"")
            && error.ends_with("(from environment variable OUTBOX_RELAY__RELAY__LEASE)"),
        "{error}"
    );
}

#[test]
fn every_bad_duration_and_number_is_reported_at_once_in_our_words() {
    let error = load(
        "[relay]\nlease = 30\npoll_interval = 1\npublish_timeout = true\n\
         shutdown_timeout = \"soon\"\nretry_max_interval = 2.5\nbatch_size = \"many\"\n\
         publishers = 1.5\n[database]\nnotify = \"sometimes\"\n[log]\nlevel = 3",
        &[],
    )
    .unwrap_err();
    for line in [
        "relay.lease = 30 is invalid: a duration such as \"30s\"",
        "relay.poll_interval = 1 is invalid: a duration such as \"30s\"",
        "relay.publish_timeout = true is invalid: a duration such as \"30s\"",
        "relay.shutdown_timeout = \"soon\" is invalid: a duration such as \"30s\"",
        "relay.retry_max_interval = 2.5 is invalid: a duration such as \"30s\"",
        "relay.batch_size = \"many\" is invalid: a whole number such as 100",
        "relay.publishers = 1.5 is invalid: a whole number such as 4",
        "database.notify = \"sometimes\" is invalid: true or false",
        "log.level = 3 is invalid: text in quotes",
    ] {
        assert!(error.contains(line), "{line} missing:\n{error}");
    }
    assert_eq!(error.lines().count(), 9, "{error}");
    for serde in ["expected", "found", "signed int", "i64", "is not a key of"] {
        assert!(!error.contains(serde), "serde's wording {serde:?}: {error}");
    }
}

#[test]
fn unknown_sections_and_keys_are_named_with_what_exists() {
    let error = load("[foo]\nbar = 1\n[relay]\nleese = \"30s\"", &[]).unwrap_err();
    assert!(
        error.contains("unknown section \"foo\": the sections are database, amqp, relay"),
        "{error}"
    );
    assert!(
        error.contains("unknown setting \"relay.leese\": the settings of relay are ")
            && error.contains("lease"),
        "{error}"
    );
}

#[test]
fn a_password_of_the_wrong_kind_is_not_shown() {
    let error = load("[amqp]\npassword = 8675309\n[database]\nurl = 5", &[]).unwrap_err();
    assert!(
        error.contains("amqp.password = *** is invalid: text in quotes"),
        "{error}"
    );
    assert!(!error.contains("8675309"), "{error}");
}

#[test]
fn a_toml_syntax_error_names_the_place_not_the_line() {
    let error = load(
        "[amqp]\nurl = \"amqp://guest:TopSecret42@mq:5672/%2f\nexchange = \"x\"",
        &[],
    )
    .unwrap_err();
    // The file under test starts with a comment line.
    assert!(
        error.starts_with("config file outbox.toml, line 3, column ")
            && error.contains("invalid TOML"),
        "{error}"
    );
    assert!(
        !error.contains("TopSecret42") && !error.contains("guest"),
        "{error}"
    );
}

#[test]
// figment's Jail closures return its (large) error type.
#[allow(clippy::result_large_err)]
fn a_directory_an_empty_file_and_a_missing_file_are_refused() {
    Jail::expect_with(|jail| {
        std::fs::create_dir("conf").expect("a directory");
        jail.create_file("conf/outbox-relay.toml", "[relay]\n")?;
        let error = load_path(Path::new("conf")).unwrap_err();
        assert_eq!(
            error,
            "config file conf is a directory, not a settings file; name the file in it: \
             conf/outbox-relay.toml"
        );
        jail.create_file("empty.toml", " \n")?;
        let error = load_path(Path::new("empty.toml")).unwrap_err();
        assert!(
            error.starts_with("config file empty.toml is empty"),
            "{error}"
        );
        let error = load_path(Path::new("missing.toml")).unwrap_err();
        assert_eq!(error, "config file missing.toml does not exist");
        assert!(
            load_path(Path::new("/dev/null")).is_ok(),
            "/dev/null: defaults and the environment alone"
        );
        Ok(())
    });
}

#[test]
fn a_log_level_that_would_turn_logging_off_is_refused() {
    for level in [
        "warning",
        "debugg",
        "outbox_pipeline",
        "info,",
        "outbox_pipeline=loud",
        "",
    ] {
        let error = load(&format!("[log]\nlevel = {level:?}"), &[]).unwrap_err();
        assert!(
            error.contains(&format!("log.level = {level:?} is invalid"))
                && error.contains("trace, debug, info, warn, error or off"),
            "{level}: {error}"
        );
    }
    for level in [
        "warn",
        "INFO",
        "off",
        "warn,outbox_pipeline=debug",
        "lapin=error,info",
    ] {
        load(&format!("[log]\nlevel = {level:?}"), &[]).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn rust_log_is_held_to_the_same_rule() {
    let error = load("", &[("RUST_LOG", "warning")]).unwrap_err();
    assert!(
        error.starts_with("RUST_LOG = \"warning\" is invalid: a level (trace, debug"),
        "{error}"
    );
    load("", &[("RUST_LOG", "debug,lapin=warn")]).unwrap();
}

#[test]
fn a_lease_close_to_the_publish_timeout_warns() {
    let config = load("[relay]\nlease = \"5s\"\npublish_timeout = \"3s\"", &[]).unwrap();
    let warnings = config.warnings.join("\n");
    assert!(
        warnings.contains(
            "relay.lease = \"5s\" is not comfortably above relay.publish_timeout = \"3s\""
        ) && warnings.contains("(9s)"),
        "{warnings}"
    );
    let config = load("[relay]\nlease = \"9s\"\nshutdown_timeout = \"1s\"", &[]).unwrap();
    let warnings = config.warnings.join("\n");
    assert!(!warnings.contains("relay.lease"), "{warnings}");
    assert!(
        warnings.contains("relay.shutdown_timeout = \"1s\""),
        "{warnings}"
    );
}

#[test]
fn check_config_shows_the_node_id_of_run_not_its_own() {
    let config = load("", &[]).unwrap();
    assert!(
        config.effective.relay.node_id.ends_with("-<pid of run>"),
        "{}",
        config.effective.relay.node_id
    );
    let config = load("[relay]\nnode_id = \"relay-a\"", &[]).unwrap();
    assert_eq!(config.effective.relay.node_id, "relay-a");
}

#[test]
fn every_broker_is_named_by_its_position_and_masked_url() {
    let error = load(
        "[amqp]\nurl = [\"amqp://guest:guest@mq-1/%2f\", \"amqp//guest:pw2@mq-2\", \"http://u:pw3@mq-3\"]",
        &[],
    )
    .unwrap_err();
    assert!(
        error.contains("amqp.url[1] = \"amqp//guest:***@mq-2\" is invalid"),
        "{error}"
    );
    assert!(
        error.contains("amqp.url[2] = \"http://u:***@mq-3/\" is invalid"),
        "{error}"
    );
    assert!(!error.contains("pw2") && !error.contains("pw3"), "{error}");
}
