//! The binary's answers to bad and overridden settings (`docs/design.md#settings`).

use outbox_tests::output::stderr;
use std::process::{Command, Output};

fn relay(config: &str, env: &[(&str, &str)], args: &[&str]) -> Output {
    let file = std::env::temp_dir().join(outbox_tests::unique_name("settings") + ".toml");
    std::fs::write(&file, config).unwrap();
    let output = Command::new(crate::RELAY)
        .arg("--config")
        .arg(&file)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("binary runs");
    let _ = std::fs::remove_file(file);
    output
}

#[test]
fn unknown_retry_strategy_exits_2_naming_the_key() {
    let output = relay("[relay]\nretry_strategy = \"sometimes\"\n", &[], &["run"]);
    assert_eq!(output.status.code(), Some(2));
    let text = stderr(&output);
    assert!(
        text.contains("relay.retry_strategy") && text.contains("sometimes"),
        "{text}"
    );
    assert!(
        text.contains("fixed_interval"),
        "says what is accepted: {text}"
    );
}

#[test]
fn bad_duration_from_the_environment_exits_2_naming_the_key() {
    let output = relay(
        "",
        &[("OUTBOX_RELAY__RELAY__PUBLISH_TIMEOUT", "three seconds")],
        &["check-config"],
    );
    assert_eq!(output.status.code(), Some(2));
    let text = stderr(&output);
    assert!(
        text.contains("relay.publish_timeout") && text.contains("three seconds"),
        "{text}"
    );
}

#[test]
fn unknown_key_exits_2_naming_the_key() {
    let output = relay("[amqp]\nexchnage = \"typo\"\n", &[], &["check-config"]);
    assert_eq!(output.status.code(), Some(2));
    let text = stderr(&output);
    assert!(text.contains("amqp.exchnage"), "{text}");
}

#[test]
fn missing_config_file_exits_2() {
    let output = Command::new(crate::RELAY)
        .args(["--config", "/nonexistent/outbox.toml", "check-config"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).contains("/nonexistent/outbox.toml"));
}

#[test]
fn check_config_shows_env_overrides_normalised_zeros_and_no_secrets() {
    let output = relay(
        "[relay]\nbatch_size = 10\npoll_interval = \"0s\"\n[database]\nurl = \"postgres://relay:s3cret@db/app\"\n",
        &[("OUTBOX_RELAY__RELAY__BATCH_SIZE", "42")],
        &["check-config"],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("batch_size = 42"),
        "environment wins: {stdout}"
    );
    assert!(
        stdout.contains("relay.poll_interval is zero; using the default 1s"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("s3cret") && !stderr(&output).contains("s3cret"),
        "{stdout}"
    );
    assert!(stdout.contains("relay:***@db"), "{stdout}");
}

#[test]
fn usage_errors_exit_2() {
    let output = Command::new(crate::RELAY).arg("launch").output().unwrap();
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn every_bad_value_is_reported_in_one_run() {
    let output = relay(
        "[relay]\npoll_interval = \"soon\"\nordering = \"global\"\n[metrics]\nlisten = \"anywhere\"\n",
        &[("OUTBOX_RELAY__LOG__FORMAT", "xml")],
        &["check-config"],
    );
    assert_eq!(output.status.code(), Some(2));
    let text = stderr(&output);
    for (key, value) in [
        ("relay.poll_interval", "soon"),
        ("relay.ordering", "global"),
        ("log.format", "xml"),
        ("metrics.listen", "anywhere"),
    ] {
        assert!(
            text.contains(&format!("{key} = {value:?} is invalid")),
            "{key} missing: {text}"
        );
    }
    assert!(text.contains("\"per_room\" or \"none\""), "{text}");
}
