//! The binary's answers to bad and overridden settings (`docs/configuration.md`).

use outbox_tests::output::{stderr, stdout};
use outbox_tests::relay::{output_within, CHILD_DEADLINE};
use outbox_tests::services::{amqp_url, database_url};
use outbox_tests::{Backend, OutputInTime as _};
use std::collections::BTreeMap;
use std::process::{Command, Output};

/// What a refused start's messages must name, shared with outbox-relay's in-process
/// settings campaign.
#[path = "../../crates/outbox-relay/src/settings/tests/key_named.rs"]
mod key_named;
/// The settings campaign's cases, shared with outbox-relay's in-process campaign.
#[path = "../../crates/outbox-relay/src/settings/tests/mutations.rs"]
mod mutations;
/// What a refused case's messages must name, shared with the in-process campaign.
#[path = "../../crates/outbox-relay/src/settings/tests/refused.rs"]
mod refused;

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

/// The messages a refused start ended with: each `error: …` line (after `invalid
/// configuration: `), or the `error` of each JSON line at level ERROR (`log.format =
/// "json"`).
fn final_errors(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter_map(|line| {
            if let Some(error) = line.strip_prefix("error: ") {
                let error = error
                    .strip_prefix("invalid configuration: ")
                    .unwrap_or(error);
                return Some(error.to_owned());
            }
            let json: serde_json::Value = serde_json::from_str(line).ok()?;
            (json["level"] == "ERROR")
                .then(|| json["error"].as_str().map(str::to_owned))
                .flatten()
        })
        .collect()
}

/// A sample of the settings campaign through the binary: `check-config` (which asks the
/// test services, as a deployment's would) exits 0 or 2 within the deadline, never
/// panics, and every message of an exit 2 names what the case edited, as in process; a
/// start that `check-config` refuses is refused by `run` as well, the same way. `OUTBOX_SETTINGS_BINARY_CASES` sets how many
/// cases (50), `OUTBOX_SETTINGS_SEED` the seed.
#[test]
fn a_sample_of_mutated_settings_exits_0_or_2_naming_the_key_edited() {
    let count = mutations::number_from_env("OUTBOX_SETTINGS_BINARY_CASES", 50) as usize;
    let seed = mutations::number_from_env("OUTBOX_SETTINGS_SEED", mutations::SEED);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let bases = mutations::bases(&root, &database_url(Backend::Postgres), &amqp_url());
    let (mut accepted, mut refused, mut runs) = (0, 0, 0);
    let mut by_key: BTreeMap<String, usize> = BTreeMap::new();
    for case in mutations::cases(&bases, seed, count) {
        // Its own directory: a relative SQLite URL points there, and nothing else is touched.
        let directory = std::env::temp_dir().join(outbox_tests::unique_name("campaign"));
        std::fs::create_dir(&directory).unwrap();
        let file = directory.join("settings.toml");
        std::fs::write(&file, &case.file).unwrap();
        let path = file.display().to_string();
        let what = |command: &str, output: &Output| {
            format!(
                "case {} (seed {seed:#x}), {command}: exit {:?}\n  edits: {:?}\n  env: {:?}\n  \
                 stderr:\n{}\n  stdout:\n{}",
                case.number,
                output.status.code(),
                case.edits,
                case.env,
                stderr(output),
                stdout(output)
            )
        };
        for command in ["check-config", "run"] {
            let mut binary = Command::new(crate::RELAY);
            binary
                .arg("--config")
                .arg(&file)
                .arg(command)
                .current_dir(&directory)
                .envs(case.env.iter().map(|(name, value)| (name, value)));
            let output = output_within(&mut binary, CHILD_DEADLINE);
            let code = output.status.code();
            assert!(
                !stderr(&output).contains("panicked"),
                "{}",
                what(command, &output)
            );
            if command == "run" {
                runs += 1;
                assert_eq!(code, Some(2), "{}", what(command, &output));
            }
            match code {
                Some(0) => {
                    accepted += 1;
                    // `run` would start relaying: only a refused start is run.
                    break;
                }
                Some(2) => {
                    let errors = final_errors(&stderr(&output));
                    assert!(!errors.is_empty(), "{}", what(command, &output));
                    let refusal = refused::check_refused(&case, &errors, &path);
                    assert!(
                        refusal.failures.is_empty(),
                        "names nothing the case edited: {:?}\n{}",
                        refusal.failures,
                        what(command, &output)
                    );
                    for error in &errors {
                        let key = key_named::names_a_key(error, &path, &case.env);
                        let key = key.unwrap_or_else(|| {
                            panic!("names no key: {error}\n{}", what(command, &output))
                        });
                        if command == "check-config" {
                            *by_key.entry(key).or_default() += 1;
                        }
                    }
                    if command == "check-config" {
                        refused += 1;
                    }
                }
                _ => panic!("{}", what(command, &output)),
            }
        }
        let _ = std::fs::remove_dir_all(&directory);
    }
    eprintln!(
        "settings campaign through the binary (seed {seed:#x}): {count} cases: {accepted} \
         accepted by check-config (exit 0), {refused} refused (exit 2), each refused by run \
         too ({runs} runs); their messages by the key they name: {}",
        key_named::summary(&by_key)
    );
}
