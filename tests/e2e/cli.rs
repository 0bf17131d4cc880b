//! The binary's `--help` and `--version`, and its output to a reader that stops early.

use outbox_tests::output::stdout;
use outbox_tests::OutputInTime as _;
use std::process::{Command, Output, Stdio};

fn relay(args: &[&str]) -> Output {
    Command::new(crate::RELAY)
        .args(args)
        .output_in_time()
        .expect("binary runs")
}

#[test]
fn version_prints_the_version() {
    let output = relay(&["--version"]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        stdout(&output),
        format!("outbox-relay {}\n", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn top_level_help_lists_the_commands_where_settings_come_from_and_the_exit_codes() {
    let output = relay(&["--help"]);
    assert!(output.status.success(), "{output:?}");
    let text = stdout(&output);
    for command in [
        "run",
        "migrate",
        "check-config",
        "status",
        "dead",
        "purge",
        "demo",
        "--config",
        "--version",
    ] {
        assert!(text.contains(command), "help lacks {command}:\n{text}");
    }
    for fact in [
        "publishes the rows of a transactional outbox table to RabbitMQ",
        "config/default.toml",
        "OUTBOX_RELAY__SECTION__KEY",
        "OUTBOX_RELAY_CONFIG",
        "Exit codes",
        "2  bad configuration or usage",
        "Example",
    ] {
        assert!(text.contains(fact), "help lacks {fact:?}:\n{text}");
    }
}

#[test]
fn every_command_help_succeeds_and_explains_its_flags() {
    let commands: &[(&[&str], &[&str])] = &[
        (&["run"], &["--config", "SIGTERM"]),
        (&["migrate"], &["--config"]),
        (&["check-config"], &["--config", "redacted"]),
        (&["status"], &["--json", "oldest_pending_age_seconds"]),
        (&["dead"], &["list", "requeue"]),
        (
            &["dead", "list"],
            &[
                "--json",
                "--limit",
                "--room",
                "--event-type",
                "--older-than",
            ],
        ),
        (
            &["dead", "requeue"],
            &[
                "--event-id",
                "--event-type",
                "--room",
                "--older-than",
                "--all",
                "--dry-run",
            ],
        ),
        (
            &["purge"],
            &["--older-than", "--dead", "--dry-run", "--json"],
        ),
        (&["demo"], &["--events", "--rooms", "--prefill"]),
    ];
    for (command, mentions) in commands {
        let mut args = command.to_vec();
        args.push("--help");
        let output = relay(&args);
        assert!(
            output.status.success(),
            "`{}` failed: {output:?}",
            args.join(" ")
        );
        let text = stdout(&output);
        for mention in *mentions {
            assert!(
                text.contains(mention),
                "`{}` does not mention {mention}:\n{text}",
                args.join(" ")
            );
        }
    }
}

#[test]
fn a_reader_that_closes_the_pipe_early_ends_a_command_quietly() {
    // The read end is closed before the relay starts, so its first write fails, as it
    // does under `outbox-relay check-config | head -1` once `head` has its line.
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let child = Command::new(crate::RELAY)
        .arg("check-config")
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary runs");
    let output = outbox_tests::finish_within(child, "check-config", outbox_tests::CHILD_DEADLINE);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(output.status.success(), "{output:?}");
}
