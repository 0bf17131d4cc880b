//! `dead list` and `dead requeue` through the binary: topic patterns, `--room`,
//! `--older-than`, `--dry-run`, unknown event ids, `--limit 0` and a list `--limit` cut
//! saying so on stderr, the header row.

use outbox_tests::output::{stderr, stdout, succeeded};
use outbox_tests::{event, per_backend, Backend, TestApp, TestEvent};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(30);

/// The event ids of `dead list --json` lines.
fn listed(json_lines: &str) -> Vec<String> {
    json_lines
        .lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            assert_eq!(value["key"], value["room_id"], "key beside room_id: {line}");
            value["event_id"].as_str().expect("an event_id").to_owned()
        })
        .collect()
}

async fn dead_events_are_selected_by_pattern_room_and_age(backend: Backend) {
    // Nothing is bound at first: each event dies after its one attempt.
    let mut app = TestApp::on(backend)
        .binding("nothing.bound")
        .settings(|settings| settings.relay.max_attempts = 1)
        .seeded(&[
            event("o1", "a").of_type("order.created"),
            event("o2", "b").of_type("order.paid"),
            event("o3", "c").of_type("order.created.late"),
            event("x1", "a").of_type("invoice.created"),
        ])
        .spawn()
        .await;
    let database = &app.database;
    database.wait_dead(4, DEADLINE).await;
    database
        .execute(&format!(
            "UPDATE {} SET created_at = {} WHERE event_id = 'x1'",
            database.table.as_str(),
            database.minutes_ago(120)
        ))
        .await;
    let binary = |args: &[&str]| outbox_tests::run_binary(crate::RELAY, &app.settings, args);
    let ok = |args: &[&str]| succeeded(&args.join(" "), &binary(args));

    // Text: a header row, then one line per event.
    let text = ok(&["dead", "list"]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0], "event_id\troom_id\tevent_type\tretry_count\tlast_error\toutbox",
        "{text}"
    );
    assert_eq!(lines.len(), 5, "{text}");
    assert!(
        lines[1].starts_with("o1\ta\torder.created\t1\tunroutable"),
        "{text}"
    );

    // Filters, patterns included, and --limit (0: every one).
    let list = |extra: &[&str]| listed(&ok(&[&["dead", "list", "--json"], extra].concat()));
    assert_eq!(list(&["--event-type", "order.*"]), ["o1", "o2"]);
    assert_eq!(list(&["--event-type", "order.#"]), ["o1", "o2", "o3"]);
    assert_eq!(list(&["--event-type", "#.created"]), ["o1", "x1"]);
    assert_eq!(list(&["--event-type", "order.paid"]), ["o2"]);
    assert_eq!(
        list(&["--room", "a", "--event-type", "*.created"]),
        ["o1", "x1"]
    );
    assert_eq!(
        list(&["--key", "a", "--event-type", "*.created"]),
        ["o1", "x1"],
        "--key: the neutral name of --room"
    );
    assert_eq!(list(&["--older-than", "1h"]), ["x1"]);
    assert_eq!(list(&["--limit", "0"]), ["o1", "o2", "o3", "x1"]);
    assert_eq!(list(&["--limit", "1"]), ["o1"]);

    // A list cut by --limit says so on stderr, stdout staying the listing alone.
    let cut_note = |args: &[&str]| {
        let output = binary(&[&["dead", "list"], args].concat());
        succeeded(&args.join(" "), &output);
        let notes: Vec<String> = stderr(&output)
            .lines()
            .filter(|line| line.contains("dead events; --limit N for more"))
            .map(str::to_owned)
            .collect();
        (stdout(&output), notes)
    };
    let outbox = &app.config.outboxes[0].name;
    let (json_out, notes) = cut_note(&["--json", "--limit", "1"]);
    assert_eq!(listed(&json_out), ["o1"], "JSON lines only on stdout");
    assert_eq!(
        notes,
        [format!(
            "outbox {outbox}: showing the first 1 of 4 dead events; --limit N for more, \
             --limit 0 for every one"
        )]
    );
    let (text, notes) = cut_note(&["--limit", "2", "--event-type", "order.#"]);
    assert_eq!(text.lines().count(), 3, "a header and two events: {text}");
    assert!(
        notes.len() == 1 && notes[0].contains("the first 2 of 3 dead events"),
        "a pattern's matches counted: {notes:?}"
    );
    for whole in [&["--limit", "4"][..], &["--limit", "0"], &[]] {
        assert_eq!(
            cut_note(whole).1,
            Vec::<String>::new(),
            "{whole:?}: nothing cut"
        );
    }

    // A dry run lists what it would requeue and changes nothing.
    let dry = ok(&["dead", "requeue", "--event-type", "order.*", "--dry-run"]);
    assert!(
        dry.lines().nth(1).unwrap_or("").starts_with("o1\t"),
        "{dry}"
    );
    assert!(
        dry.lines().nth(2).unwrap_or("").starts_with("o2\t"),
        "{dry}"
    );
    assert!(dry.contains("would requeue 2 dead event(s)"), "{dry}");
    assert!(!dry.contains("o3") && !dry.contains("x1"), "{dry}");
    for row in database.rows().await {
        assert_eq!(row.status, "dead", "{} after --dry-run", row.event_id);
    }

    // Then for real: exactly those two go out.
    app.broker.bind("order.#").await;
    let requeued = ok(&["dead", "requeue", "--event-type", "order.*"]);
    assert!(requeued.contains("requeued 2 dead event(s)"), "{requeued}");
    let received = app.broker.wait_for(2, DEADLINE).await;
    let mut ids: Vec<&str> = received.iter().map(|r| r.message_id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["o1", "o2"]);
    for (id, status) in [("o3", "dead"), ("x1", "dead")] {
        assert_eq!(database.row(id).await.status, status, "{id}");
    }

    // Unknown ids are named; the known one is requeued all the same; exit code 1.
    let partly = binary(&["dead", "requeue", "--event-id", "o3", "nope1"]);
    assert_eq!(partly.status.code(), Some(1), "{partly:?}");
    assert!(
        stdout(&partly).contains("requeued 1 dead event(s)"),
        "{partly:?}"
    );
    let error = stderr(&partly);
    let named = error
        .lines()
        .find(|line| line.starts_with("error: no dead event has event id"))
        .unwrap_or_else(|| panic!("no error line naming the ids: {error}"));
    assert!(named.contains("nope1") && !named.contains("o3"), "{named}");
    assert!(named.contains("the other ids were requeued"), "{named}");
    app.broker.wait_for(3, DEADLINE).await;
    let none = binary(&["dead", "requeue", "--event-id", "nope1", "nope2"]);
    assert_eq!(none.status.code(), Some(1), "{none:?}");
    assert!(stdout(&none).contains("requeued 0"), "{none:?}");
    assert!(stderr(&none).contains("nope1, nope2"), "{none:?}");

    // Without a selection: usage error naming the choices.
    let bare = binary(&["dead", "requeue"]);
    assert_eq!(bare.status.code(), Some(2), "{bare:?}");
    for choice in [
        "--event-id",
        "--event-type",
        "--key",
        "--older-than",
        "--all",
    ] {
        assert!(
            stderr(&bare).contains(choice),
            "{choice}: {}",
            stderr(&bare)
        );
    }

    app.stop().await;
    assert_eq!(app.broker.received().len(), 3, "no other event went out");
    assert_eq!(app.database.row("x1").await.status, "dead");
    app.teardown().await;
}

per_backend!(dead_events_are_selected_by_pattern_room_and_age: postgres, sqlite, mariadb);
