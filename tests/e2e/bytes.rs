//! Memory bounded by bytes (`relay.max_inflight_bytes`): the claim's byte budget on every
//! backend, and large rows delivered in room order while the claimed bytes stay within the
//! budget plus one row.

use outbox_core::{ClaimRequest, Ordering, OutboxRecord, OutboxStore};
use outbox_store::{NewEvent, TableName};
use outbox_tests::{event, per_backend, seed, Backend, TestApp, TestDatabase, TestEvent};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;

fn claim(node: &str, ordering: Ordering, max_bytes: usize) -> ClaimRequest {
    ClaimRequest {
        node_id: node.into(),
        limit: 100,
        lease: Duration::from_secs(30),
        ordering,
        max_bytes: Some(max_bytes),
        floor: None,
    }
}

fn event_ids(claimed: &[OutboxRecord]) -> Vec<&str> {
    claimed.iter().map(|r| r.event_id.as_str()).collect()
}

/// Event `id` of `room` with a body of `bytes` bytes (a multi-byte character first, so a
/// count of characters would be wrong).
fn sized(id: &str, room: &str, bytes: usize) -> NewEvent {
    event(id, room).with_envelope(format!("é{}", "x".repeat(bytes - 2)))
}

/// Inserts `events` one at a time: large rows would exceed MariaDB's packet limit in one
/// statement.
async fn seed_one_by_one(database: &TestDatabase, events: &[NewEvent]) {
    for event in events {
        seed(database, std::slice::from_ref(event)).await;
    }
}

async fn a_claim_takes_rows_within_its_byte_budget_and_always_one(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let events = [
        sized("a1", "a", 100),
        sized("b1", "b", 300),
        sized("a2", "a", 50),
        sized("b2", "b", 1_000),
        sized("a3", "a", 10),
    ];
    seed_one_by_one(&database, &events).await;
    let store = &database.store;

    // 0 and 100 bytes before a1 and b1: under 400; 400 before a2: cut.
    let first = store
        .claim(&claim("n1", Ordering::PerRoom, 400))
        .await
        .unwrap();
    assert_eq!(event_ids(&first), ["a1", "b1"]);
    assert_eq!(first[0].envelope.len(), 100, "bytes, not characters");
    for cut in ["a2", "b2", "a3"] {
        assert_eq!(
            database.row(cut).await.locked_by,
            None,
            "{cut} is not leased"
        );
    }
    // A budget smaller than the next row still takes it.
    let second = store
        .claim(&claim("n1", Ordering::PerRoom, 1))
        .await
        .unwrap();
    assert_eq!(event_ids(&second), ["a2"]);
    // Without ordering (MariaDB: under SKIP LOCKED) the same rule.
    let third = store
        .claim(&claim("n2", Ordering::None, 1_001))
        .await
        .unwrap();
    assert_eq!(event_ids(&third), ["b2", "a3"]);
    database.drop_table().await;
}

per_backend!(a_claim_takes_rows_within_its_byte_budget_and_always_one: postgres, mariadb, sqlite);

/// Envelopes above a MiB: PostgreSQL's claim reads them in pieces of a MiB
/// (`claim/postgres.rs`), whose edges here fall inside two-byte characters.
async fn a_large_envelope_is_claimed_byte_for_byte(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let large = format!("a{}", "é".repeat(1_300_000));
    let exact = "b".repeat(1024 * 1024);
    seed_one_by_one(
        &database,
        &[
            event("large", "a").with_envelope(large.clone()),
            event("exact", "b").with_envelope(exact.clone()),
            sized("small", "a", 100),
        ],
    )
    .await;
    let claimed = database
        .store
        .claim(&claim("n1", Ordering::PerRoom, 64 * 1024 * 1024))
        .await
        .unwrap();
    assert_eq!(event_ids(&claimed), ["large", "exact", "small"]);
    assert_eq!(claimed[0].envelope.len(), 2_600_001);
    assert!(
        claimed[0].envelope == large.as_bytes(),
        "large: byte for byte"
    );
    assert!(
        claimed[1].envelope == exact.as_bytes(),
        "a MiB: byte for byte"
    );
    assert_eq!(claimed[2].envelope.len(), 100);
    database.drop_table().await;
}

per_backend!(a_large_envelope_is_claimed_byte_for_byte: postgres, mariadb, sqlite);

/// The envelope bytes of rows leased and not yet resolved, read from the table.
async fn leased_bytes(db: &DatabaseConnection, t: &TableName) -> i64 {
    let backend = db.get_database_backend();
    let sql = match backend {
        DbBackend::Postgres => format!(
            "SELECT CAST(COALESCE(SUM(octet_length(envelope)), 0) AS BIGINT) AS b FROM {t} \
             WHERE status = 'pending' AND locked_by IS NOT NULL"
        ),
        DbBackend::MySql => format!(
            "SELECT CAST(COALESCE(SUM(LENGTH(envelope)), 0) AS SIGNED) AS b FROM {t} \
             WHERE status = 'pending' AND locked_by IS NOT NULL"
        ),
        DbBackend::Sqlite => format!(
            "SELECT COALESCE(SUM(octet_length(envelope)), 0) AS b FROM {t} \
             WHERE status = 'pending' AND locked_by IS NOT NULL"
        ),
    };
    let row = db
        .query_one(Statement::from_string(backend, sql))
        .await
        .expect("leased bytes readable")
        .expect("one row");
    row.try_get::<i64>("", "b").expect("a number")
}

async fn large_rows_flow_in_room_order_within_the_byte_budget(backend: Backend) {
    const ROW: usize = 2 * 1024 * 1024;
    const BUDGET: usize = 5 * 1024 * 1024;
    let events: Vec<NewEvent> = (0..21)
        .map(|n| sized(&format!("big-{n:02}"), &format!("room-{}", n % 3), ROW))
        .collect();
    let mut app = TestApp::on(backend)
        .settings(|settings| settings.relay.max_inflight_bytes = BUDGET as i64)
        .build()
        .await;
    seed_one_by_one(&app.database, &events).await;

    // Watch the table while the relay drains it: the most bytes ever leased at once.
    let most = Arc::new(AtomicI64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (most, done) = (Arc::clone(&most), Arc::clone(&done));
        let (db, table) = (app.database.db().clone(), app.database.table.clone());
        actix_rt::spawn(async move {
            while !done.load(AtomicOrdering::SeqCst) {
                let bytes = leased_bytes(&db, &table).await;
                most.fetch_max(bytes, AtomicOrdering::SeqCst);
                tokio::task::yield_now().await;
            }
        })
    };
    app.start().await;
    app.broker
        .wait_for(events.len(), Duration::from_secs(120))
        .await;
    app.stop().await;
    done.store(true, AtomicOrdering::SeqCst);
    watcher.await.expect("the watcher ends");

    // Settled, so a duplicate arriving after the count reached the rows is counted too.
    let received = app.broker.drain(Duration::from_secs(30)).await;
    assert_eq!(received.len(), events.len(), "every row, once");
    outbox_tests::assert_delivered_once("large rows", &received, &events);
    assert!(received.iter().all(|message| message.body.len() == ROW));
    let most = most.load(AtomicOrdering::SeqCst) as usize;
    assert!(most >= ROW, "the watcher saw claimed rows: {most} bytes");
    assert!(
        most <= BUDGET + ROW,
        "at most the budget plus one row leased at once: {most} bytes"
    );
    app.teardown().await;
}

per_backend!(large_rows_flow_in_room_order_within_the_byte_budget: postgres, mariadb, sqlite);
