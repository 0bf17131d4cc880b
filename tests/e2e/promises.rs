//! Promises of the docs no other module keeps: `RUST_LOG` over `log.level`, `dead requeue`
//! logging who requeued what (one field per option), the `node_id` default,
//! `amqp.content_type`, the demo and its "duplicates 0", one-shot commands failing at once
//! where nothing listens.

use outbox_tests::output::{stderr, stdout};
use outbox_tests::{
    assert_within, event, output_within, room_events, settings_env, Backend, RelayProcess, TestApp,
    TestBroker, CHILD_DEADLINE,
};
use std::time::{Duration, Instant};

/// `dead requeue --all` with `log.level` and `RUST_LOG` (unset when `None`): its stderr.
fn requeue_logging(app: &TestApp, level: &str, rust_log: Option<&str>) -> String {
    requeue_logging_by(app, level, rust_log, &["--all"])
}

/// `dead requeue` selecting by `selection`, as [`requeue_logging`].
fn requeue_logging_by(
    app: &TestApp,
    level: &str,
    rust_log: Option<&str>,
    selection: &[&str],
) -> String {
    let settings = app.settings_with(|settings| {
        settings.log.level = level.into();
        settings.log.format = "json".into();
    });
    let mut command = std::process::Command::new(crate::RELAY);
    command
        .args(["--config", "/dev/null", "dead", "requeue"])
        .args(selection)
        .envs(settings_env(&settings))
        .env_remove("RUST_LOG");
    if let Some(filter) = rust_log {
        command.env("RUST_LOG", filter);
    }
    let output = output_within(&mut command, CHILD_DEADLINE);
    assert!(output.status.success(), "{output:?}");
    stderr(&output)
}

/// The `dead events requeued` lines of a JSON log.
fn requeued_lines(log: &str) -> Vec<serde_json::Value> {
    log.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str::<serde_json::Value>(line).expect("a JSON log line"))
        .filter(|line| line["message"] == "dead events requeued")
        .collect()
}

#[actix_rt::test]
async fn rust_log_wins_over_log_level_and_dead_requeue_logs_who_requeued() {
    let app = TestApp::on(Backend::Postgres)
        .seeded(&[event("d1", "r")])
        .build()
        .await;
    let kill = || app.database.execute("UPDATE {t} SET status = 'dead'");
    kill().await;
    // log.level = error alone: the info line is not written.
    assert_eq!(
        requeued_lines(&requeue_logging(&app, "error", None)),
        Vec::<serde_json::Value>::new()
    );
    kill().await;
    // RUST_LOG = info wins over log.level = error.
    let lines = requeued_lines(&requeue_logging(&app, "error", Some("info")));
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = &lines[0];
    assert_eq!(line["level"], "INFO", "{line}");
    assert_eq!(line["requeued"], 1, "{line}");
    assert!(
        line["by"].as_str().is_some_and(|by| !by.is_empty()),
        "names who requeued: {line}"
    );
    // The selection as plain fields, not a Rust value printed for debugging.
    assert_eq!(line["all"], true, "{line}");
    assert!(line.get("selection").is_none(), "{line}");
    assert!(!line.to_string().contains("DeadFilter"), "{line}");
    assert_eq!(app.database.row("d1").await.status, "pending");

    // Dead, and created an hour ago (for --older-than).
    let an_hour_ago = app.database.minutes_ago(60);
    app.database
        .execute(&format!(
            "UPDATE {{t}} SET status = 'dead', created_at = {an_hour_ago}"
        ))
        .await;
    let by_filters = requeue_logging_by(
        &app,
        "info",
        None,
        &["--event-id", "d1", "--key", "r", "--older-than", "1s"],
    );
    let lines = requeued_lines(&by_filters);
    assert_eq!(lines.len(), 1, "{by_filters}");
    let line = &lines[0];
    assert_eq!(line["event_ids"], "d1", "{line}");
    assert_eq!(line["key"], "r", "{line}");
    assert_eq!(line["older_than"], "1s", "{line}");
    assert!(line["created_before"].as_str().is_some(), "{line}");
    assert_eq!(line["all"], false, "{line}");
    assert!(
        line.get("event_type").is_none(),
        "not given, left out: {line}"
    );
    app.teardown().await;
}

#[actix_rt::test]
async fn the_node_id_defaults_to_hostname_pid() {
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| settings.relay.node_id = String::new())
        .seeded(&room_events("nodeid", 5, 1))
        .build()
        .await;
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    let received = app.broker.wait_for(5, Duration::from_secs(60)).await;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("the host name");
    let expected = format!("{}-{}", host.trim(), relay.pid());
    for message in &received {
        assert_eq!(
            message.header("node_id").as_deref(),
            Some(expected.as_str())
        );
    }
    relay
        .stop(outbox_tests::within(Duration::from_secs(5)))
        .await;
    app.teardown().await;
}

#[actix_rt::test]
async fn a_custom_content_type_is_the_messages_property() {
    const TYPE: &str = "application/vnd.rooms.event+json";
    let seeded = room_events("ctype", 3, 1);
    let mut app = TestApp::on(Backend::Sqlite)
        .settings(|settings| settings.amqp.content_type = TYPE.into())
        .seeded(&seeded)
        .spawn()
        .await;
    let received = app
        .broker
        .wait_for_each(&seeded, Duration::from_secs(30))
        .await;
    app.stop().await;
    outbox_tests::assert_every_event_delivered(&received, &seeded);
    for message in &received {
        assert_eq!(message.content_type, TYPE, "{}", message.message_id);
    }
    app.teardown().await;
}

/// `outbox-relay demo` on a SQLite file and the test broker: every event relayed, the
/// summary line the README shows, duplicates 0.
#[actix_rt::test]
async fn the_demo_relays_every_event_and_reports_no_duplicates() {
    let broker = TestBroker::new("#").await;
    let file = std::env::temp_dir().join(format!("{}.db", outbox_tests::unique_name("demo")));
    let mut settings = outbox_relay::settings::Settings::default();
    settings.database.url = format!("sqlite://{}?mode=rwc", file.display());
    settings.amqp.url = broker.url.clone();
    settings.amqp.exchange = broker.exchange.clone();
    settings.metrics.listen = "".into();
    let mut command = std::process::Command::new(crate::RELAY);
    command
        .args([
            "--config",
            "/dev/null",
            "demo",
            "--events",
            "500",
            "--rooms",
            "10",
        ])
        .envs(settings_env(&settings));
    let output = output_within(&mut command, CHILD_DEADLINE);
    let (out, err) = (stdout(&output), stderr(&output));
    assert!(output.status.success(), "{out}\n{err}");
    let summary = format!("{out}{err}")
        .lines()
        .find(|line| line.starts_with("demo: "))
        .unwrap_or_else(|| panic!("no summary line:\n{out}\n{err}"))
        .to_owned();
    assert!(
        summary.starts_with("demo: 500 events over 10 rooms relayed in "),
        "{summary}"
    );
    assert!(summary.ends_with("duplicates 0"), "{summary}");
    let distinct: std::collections::HashSet<String> = (broker.drain(Duration::from_secs(30)).await)
        .into_iter()
        .map(|r| r.message_id)
        .collect();
    assert_eq!(distinct.len(), 500, "every event reached the broker");
    broker.close().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
}

/// `status`, `dead`, `purge` and `check-config` do not wait for a database nothing
/// listens for (docs/commands.md#exit-codes): each ends at once, saying `connection refused`; the
/// first three exit 1, `check-config` warns and exits 0.
#[actix_rt::test]
async fn one_shot_commands_fail_at_once_where_nothing_listens() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let app = TestApp::on(Backend::Postgres).build().await;
    let settings = app.settings_with(|settings| {
        settings.database.url = format!("postgres://postgres@127.0.0.1:{port}/test");
    });
    for args in [
        &["dead", "list"][..],
        &["dead", "requeue", "--all"],
        &["purge", "--older-than", "1h"],
        &["check-config"],
    ] {
        let started = Instant::now();
        let output = outbox_tests::run_binary(crate::RELAY, &settings, args);
        assert_within(
            &format!("{args:?}"),
            started.elapsed(),
            Duration::from_secs(2),
        );
        let said = format!("{}{}", stdout(&output), stderr(&output));
        assert!(said.contains("connection refused"), "{args:?}: {said}");
        if args == ["check-config"] {
            // docs/commands.md#before-the-first-run: an unreachable database is a warning, so the check can
            // run before the services are up.
            assert_eq!(output.status.code(), Some(0), "{args:?}: {said}");
            assert!(said.contains("# warning:"), "{args:?}: {said}");
        } else {
            assert_eq!(output.status.code(), Some(1), "{args:?}: {said}");
        }
    }
    app.teardown().await;
}

/// Outboxes with the same database URL share one pool (docs/producing/several-outboxes.md): with
/// `database.max_connections = 1`, a transaction open through one outbox's store leaves
/// the other's waiting for the pool's one connection; an outbox on another URL has a pool
/// of its own and is not held up.
#[actix_rt::test]
async fn outboxes_on_one_url_share_one_pool_and_another_url_has_its_own() {
    use outbox_relay::settings::OutboxSettings;
    use sea_orm::{ConnectionTrait as _, TransactionTrait as _};
    let app = TestApp::on(Backend::Postgres).build().await;
    let table = app.database.table.as_str().to_owned();
    let separator = if app.database.url.contains('?') {
        '&'
    } else {
        '?'
    };
    let other_url = format!("{}{separator}application_name=other", app.database.url);
    let config = app.config_with(|settings| {
        settings.database.max_connections = 1;
        settings.outboxes = ["a", "b", "c"]
            .into_iter()
            .map(|name| OutboxSettings {
                name: name.into(),
                // Tables no one reads: `open_unchecked` opens, it does not check.
                table: format!("{table}_{name}"),
                database_url: if name == "c" {
                    other_url.clone()
                } else {
                    String::new()
                },
                ..OutboxSettings::default()
            })
            .collect();
    });
    let opened = outbox_relay::startup::open_unchecked(&config, None)
        .await
        .expect("opened");
    let [a, b, c] = &opened[..] else {
        panic!("three outboxes opened");
    };
    let select = || sea_orm::Statement::from_string(sea_orm::DbBackend::Postgres, "SELECT 1");
    let held = a.store.connection().begin().await.expect("a transaction");
    let waited = tokio::time::timeout(
        Duration::from_secs(1),
        b.store.connection().execute(select()),
    )
    .await;
    assert!(
        waited.is_err(),
        "outbox b got a connection while a held the pool's only one: {waited:?}"
    );
    tokio::time::timeout(
        Duration::from_secs(1),
        c.store.connection().execute(select()),
    )
    .await
    .expect("outbox c, on another URL, has its own pool")
    .expect("SELECT 1 through c");
    held.rollback().await.expect("rolled back");
    b.store
        .connection()
        .execute(select())
        .await
        .expect("b's query once the connection is back");
    drop(opened);
    app.teardown().await;
}
