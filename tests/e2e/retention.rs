//! Retention: the Janitor (`relay.retention`) and `outbox-relay purge` delete old
//! `published` rows in bounded batches, and nothing else.

use chrono::Utc;
use outbox_core::{OutboxStore, PurgeTarget};
use outbox_tests::{
    eventually, own_room_events as events, per_backend, seed, Backend, TestApp, TestDatabase,
};
use std::collections::HashSet;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);

/// Runs `UPDATE … SET {sets}` on the rows of `prefix`.
async fn set(database: &TestDatabase, prefix: &str, sets: &str) {
    database
        .execute(&format!(
            "UPDATE {{t}} SET {sets} WHERE event_id LIKE '{prefix}-%'"
        ))
        .await;
}

/// Event ids of the rows left, by prefix.
async fn left(database: &TestDatabase, prefix: &str) -> Vec<(String, String)> {
    database
        .rows()
        .await
        .into_iter()
        .filter(|row| row.event_id.starts_with(&format!("{prefix}-")))
        .map(|row| (row.event_id, row.status))
        .collect()
}

/// Old published rows (two hours), recent published rows (ten minutes), old dead rows and
/// old pending rows — the last two also carrying an old `published_at`, so that a purge
/// that ignored `status` would take them.
async fn seed_finished_rows(database: &TestDatabase, old_published: usize) {
    let two_hours_ago = database.minutes_ago(120);
    seed(database, &events("old", old_published, 50)).await;
    let published_long_ago = format!("status = 'published', published_at = {two_hours_ago}");
    set(database, "old", &published_long_ago).await;
    seed(database, &events("recent", 10, 5)).await;
    let published_lately = format!(
        "status = 'published', published_at = {}",
        database.minutes_ago(10)
    );
    set(database, "recent", &published_lately).await;
    seed(database, &events("dead", 5, 5)).await;
    let dead =
        format!("status = 'dead', created_at = {two_hours_ago}, published_at = {two_hours_ago}");
    set(database, "dead", &dead).await;
    // Pending, and not publishable for a day: stays pending throughout.
    seed(database, &events("held", 5, 5)).await;
    let held = format!(
        "created_at = {two_hours_ago}, published_at = {two_hours_ago}, available_at = {}",
        database.minutes_ago(-1440)
    );
    set(database, "held", &held).await;
}

async fn retention_deletes_only_old_published_rows_while_relaying(backend: Backend) {
    let mut app = TestApp::on(backend)
        .settings(|settings| settings.relay.retention = "1h".into())
        .build()
        .await;
    // 2,500 expired rows: three DELETEs of at most 1,000 rows in the sweep at start.
    seed_finished_rows(&app.database, 2_500).await;
    let live = events("live", 300, 30);
    seed(&app.database, &live).await;

    app.start().await;
    let database = &app.database;
    let broker = &app.broker;
    let later = events("later", 100, 10);
    seed(database, &later).await;
    eventually("the expired rows to go", DEADLINE, || async {
        left(database, "old").await.is_empty()
    })
    .await;
    broker.wait_for(live.len() + later.len(), DEADLINE).await;
    eventually("the delivered rows to be marked", DEADLINE, || async {
        let rows = database.rows().await;
        let marked = rows.iter().filter(|row| {
            (row.event_id.starts_with("live-") || row.event_id.starts_with("later-"))
                && row.status == "published"
        });
        marked.count() == live.len() + later.len()
    })
    .await;
    app.stop().await;
    let database = &app.database;

    let received: HashSet<String> = app
        .broker
        .received()
        .into_iter()
        .map(|message| message.message_id)
        .collect();
    let expected: HashSet<String> = live
        .iter()
        .chain(&later)
        .map(|event| event.event_id.clone())
        .collect();
    assert_eq!(
        received, expected,
        "the relay kept relaying, and only these"
    );
    let statuses = |rows: Vec<(String, String)>| {
        rows.into_iter()
            .map(|(_, status)| status)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        statuses(left(database, "recent").await),
        vec!["published"; 10],
        "published within the retention: kept"
    );
    assert_eq!(statuses(left(database, "dead").await), vec!["dead"; 5]);
    assert_eq!(statuses(left(database, "held").await), vec!["pending"; 5]);
    assert_eq!(
        left(database, "live").await.len() + left(database, "later").await.len(),
        400,
        "just published: kept"
    );
    app.teardown().await;
}

per_backend!(retention_deletes_only_old_published_rows_while_relaying: postgres, sqlite, mariadb);

async fn purge_deletes_at_most_its_limit_and_only_its_status(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    seed_finished_rows(&database, 2_500).await;
    let bound = Utc::now() - chrono::Duration::hours(1);
    let store = &database.store;
    let mut batches = Vec::new();
    loop {
        let deleted = store
            .purge(PurgeTarget::Published, bound, 1_000)
            .await
            .expect("purge runs");
        batches.push(deleted);
        if deleted < 1_000 {
            break;
        }
    }
    assert_eq!(batches, vec![1_000, 1_000, 500], "bounded batches");
    assert!(left(&database, "old").await.is_empty());
    assert_eq!(left(&database, "recent").await.len(), 10);
    assert_eq!(
        left(&database, "dead").await.len(),
        5,
        "dead rows need --dead"
    );
    assert_eq!(left(&database, "held").await.len(), 5);

    let deleted = store.purge(PurgeTarget::Dead, bound, 2).await.unwrap();
    assert_eq!(deleted, 2, "dead rows by their age, in bounded batches too");
    assert_eq!(store.purge(PurgeTarget::Dead, bound, 10).await.unwrap(), 3);
    assert!(left(&database, "dead").await.is_empty());
    assert_eq!(
        left(&database, "held").await.len(),
        5,
        "pending rows are never purged"
    );
    assert_eq!(left(&database, "recent").await.len(), 10);
    database.drop_table().await;
}

per_backend!(purge_deletes_at_most_its_limit_and_only_its_status: postgres, sqlite, mariadb);

async fn purge_command_keeps_pending_and_dead_rows_unless_asked(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    // 1,200 expired rows: two batches.
    seed_finished_rows(&database, 1_200).await;
    seed(&database, &events("fresh-dead", 1, 1)).await;
    set(&database, "fresh-dead", "status = 'dead'").await;
    let settings = database.binary_settings();
    let purge = |args: &[&str]| {
        let output = outbox_tests::run_binary(crate::RELAY, &settings, args);
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "{args:?}: {output:?}\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        stdout
    };

    let stdout = purge(&["purge", "--older-than", "1h"]);
    assert!(
        stdout.contains("purged 1200 published row(s)"),
        "prints how many: {stdout}"
    );
    assert!(!stdout.contains("dead"), "{stdout}");
    assert!(left(&database, "old").await.is_empty());
    assert_eq!(left(&database, "recent").await.len(), 10);
    assert_eq!(left(&database, "dead").await.len(), 5, "dead rows kept");
    assert_eq!(left(&database, "held").await.len(), 5, "pending rows kept");

    let stdout = purge(&["purge", "--older-than", "1h", "--dead"]);
    assert!(stdout.contains("purged 0 published row(s)"), "{stdout}");
    assert!(stdout.contains("purged 5 dead row(s)"), "{stdout}");
    assert!(left(&database, "dead").await.is_empty());
    assert_eq!(
        left(&database, "fresh-dead").await.len(),
        1,
        "a dead event younger than the bound stays"
    );
    assert_eq!(left(&database, "held").await.len(), 5, "pending rows kept");
    assert_eq!(left(&database, "recent").await.len(), 10);

    let output =
        outbox_tests::run_binary(crate::RELAY, &settings, &["purge", "--older-than", "soon"]);
    assert_eq!(output.status.code(), Some(2), "a usage error: {output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--older-than") && stderr.contains("soon"),
        "{stderr}"
    );
    database.drop_table().await;
}

per_backend!(purge_command_keeps_pending_and_dead_rows_unless_asked: postgres, sqlite);
