//! The binary's answers to bad and overridden settings (`docs/configuration.md`).

use outbox_tests::output::{stderr, stdout};
use outbox_tests::OutputInTime as _;
use std::process::{Command, Output};

/// Runs the binary on a settings file holding `config` (after a comment: an empty file is
/// refused).
fn relay(config: &str, env: &[(&str, &str)], args: &[&str]) -> Output {
    let file = std::env::temp_dir().join(outbox_tests::unique_name("settings") + ".toml");
    std::fs::write(&file, format!("# settings under test\n{config}")).unwrap();
    let output = Command::new(crate::RELAY)
        .arg("--config")
        .arg(&file)
        .args(args)
        .envs(env.iter().copied())
        .output_in_time()
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
        .output_in_time()
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
    let output = Command::new(crate::RELAY)
        .arg("launch")
        .output_in_time()
        .unwrap();
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

#[test]
fn a_directory_or_an_empty_file_as_the_config_exits_2_naming_the_path() {
    let directory = std::env::temp_dir().join(outbox_tests::unique_name("config-dir"));
    std::fs::create_dir(&directory).unwrap();
    std::fs::write(directory.join("outbox-relay.toml"), "[relay]\n").unwrap();
    let empty = std::env::temp_dir().join(outbox_tests::unique_name("empty") + ".toml");
    std::fs::write(&empty, "").unwrap();
    for (path, why) in [
        (&directory, "is a directory, not a settings file"),
        (&empty, "is empty"),
    ] {
        for command in ["check-config", "run"] {
            // Run in the temporary directory: nothing may be created there either.
            let output = Command::new(crate::RELAY)
                .arg("--config")
                .arg(path)
                .arg(command)
                .current_dir(&directory)
                .output_in_time()
                .unwrap();
            let text = stderr(&output);
            assert_eq!(output.status.code(), Some(2), "{command}: {text}");
            assert!(
                text.contains(&format!("config file {} {why}", path.display())),
                "{text}"
            );
        }
        let output = Command::new(crate::RELAY)
            .arg("check-config")
            .env("OUTBOX_RELAY_CONFIG", path)
            .output_in_time()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    }
    assert!(
        !directory.join("outbox-relay.db").exists(),
        "run did not start on the defaults"
    );
    let _ = std::fs::remove_dir_all(directory);
    let _ = std::fs::remove_file(empty);
}

#[test]
fn a_log_level_that_would_silence_the_relay_exits_2_naming_the_levels() {
    for level in ["warning", "debugg"] {
        let output = relay(&format!("[log]\nlevel = {level:?}\n"), &[], &["run"]);
        let text = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{text}");
        assert!(
            text.contains(&format!("log.level = {level:?} is invalid"))
                && text.contains("trace, debug, info, warn, error or off"),
            "{text}"
        );
    }
}

#[test]
fn a_number_for_a_duration_and_four_more_bad_durations_are_all_reported() {
    let output = relay(
        "[relay]\nlease = 30\npoll_interval = 5\npublish_timeout = \"soon\"\n\
         shutdown_timeout = 10\nretry_max_interval = \"forever\"\n",
        &[],
        &["check-config"],
    );
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{text}");
    for line in [
        "relay.lease = 30 is invalid: a duration such as \"30s\"",
        "relay.poll_interval = 5 is invalid: a duration such as \"30s\"",
        "relay.publish_timeout = \"soon\" is invalid: a duration such as \"30s\"",
        "relay.shutdown_timeout = 10 is invalid: a duration such as \"30s\"",
        "relay.retry_max_interval = \"forever\" is invalid: a duration such as \"30s\"",
    ] {
        assert!(text.contains(line), "{line} missing:\n{text}");
    }
    assert_eq!(text.lines().count(), 5, "{text}");
}

#[test]
fn a_node_id_of_digits_from_the_environment_is_text() {
    let output = relay(
        "[database]\nurl = \"sqlite::memory:\"\n",
        &[("OUTBOX_RELAY__RELAY__NODE_ID", "7")],
        &["check-config"],
    );
    let text = stdout(&output);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(text.contains("node_id = \"7\""), "{text}");
}

#[test]
fn check_config_names_the_node_id_of_run_not_its_own() {
    let output = relay(
        "[database]\nurl = \"sqlite::memory:\"\n",
        &[],
        &["check-config"],
    );
    let text = stdout(&output);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(text.contains("-<pid of run>\""), "{text}");
}

#[test]
fn with_json_logs_the_final_error_is_one_json_line() {
    let output = relay(
        "[log]\nformat = \"json\"\n[relay]\nlease = 30\n",
        &[],
        &["check-config"],
    );
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    let line: serde_json::Value = serde_json::from_str(text.trim()).expect("a JSON line");
    assert_eq!(line["level"], "ERROR");
    assert!(
        line["error"]
            .as_str()
            .is_some_and(|error| error.starts_with("relay.lease = 30 is invalid")),
        "{line}"
    );
    let output = relay("[relay]\nlease = 30\n", &[], &["check-config"]);
    let text = stderr(&output);
    assert_eq!(text.lines().count(), 1, "one plain line: {text}");
    assert!(
        text.starts_with("error: invalid configuration: relay.lease = 30"),
        "{text}"
    );
}
