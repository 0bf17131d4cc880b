//! The store's own guarantees on real databases.

use chrono::Utc;
use outbox_core::{
    trim_error, ClaimRequest, Failure, MarkBatch, Ordering, OutboxRecord, OutboxStore,
};
use outbox_store::{NewEvent, TableName};
use outbox_tests::{event, per_backend, Backend, TestDatabase};
use sea_orm::ConnectionTrait as _;
use std::time::{Duration, Instant};

fn claim(node: &str, limit: usize, ordering: Ordering) -> ClaimRequest {
    ClaimRequest {
        node_id: node.into(),
        limit,
        lease: Duration::from_secs(30),
        ordering,
        max_bytes: None,
        floor: None,
    }
}

/// The event ids of `claimed`, in claim order.
fn event_ids(claimed: &[OutboxRecord]) -> Vec<&str> {
    claimed.iter().map(|r| r.event_id.as_str()).collect()
}

async fn keeps_last_error_within_512_bytes_on_a_char_boundary(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    outbox_tests::seed(&database, &[event("e1", "r")]).await;
    let claimed = database
        .store
        .claim(&claim("n1", 10, Ordering::PerRoom))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    // 300 two-byte characters: 600 bytes.
    let error = trim_error(&"é".repeat(300));
    let batch = MarkBatch {
        retried: vec![(
            Failure {
                id: claimed[0].id,
                error,
            },
            Utc::now(),
        )],
        ..MarkBatch::default()
    };
    database
        .store
        .mark("n1", &batch)
        .await
        .expect("the database accepts the trimmed error");
    let row = database.row("e1").await;
    let stored = row.last_error.expect("last_error set");
    assert!(stored.len() <= 512, "{} bytes", stored.len());
    assert_eq!(stored, "é".repeat(256));
    assert_eq!(row.retry_count, 1);
    assert_eq!(row.locked_by, None);
    database.drop_table().await;
}

per_backend!(keeps_last_error_within_512_bytes_on_a_char_boundary: postgres, mariadb, sqlite);

async fn a_deferred_failure_keeps_the_events_attempts(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    outbox_tests::seed(&database, &[event("e1", "r"), event("e2", "s")]).await;
    let claimed = database
        .store
        .claim(&claim("n1", 10, Ordering::PerRoom))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);
    let failure = |record: &outbox_core::OutboxRecord, error: &str| Failure {
        id: record.id,
        error: error.into(),
    };
    let later = Utc::now() + chrono::Duration::seconds(30);
    let batch = MarkBatch {
        retried: vec![(failure(&claimed[0], "unroutable"), later)],
        deferred: vec![(failure(&claimed[1], "broker unavailable"), later)],
        ..MarkBatch::default()
    };
    database.store.mark("n1", &batch).await.unwrap();
    let counted = database.row("e1").await;
    let deferred = database.row("e2").await;
    assert_eq!(
        counted.retry_count, 1,
        "the event's own failure costs an attempt"
    );
    assert_eq!(deferred.retry_count, 0, "an outage costs none");
    assert_eq!(deferred.last_error.as_deref(), Some("broker unavailable"));
    assert_eq!(deferred.status, "pending");
    assert_eq!(deferred.locked_by, None);
    assert!(
        database
            .store
            .claim(&claim("n1", 10, Ordering::PerRoom))
            .await
            .unwrap()
            .is_empty(),
        "both wait for their next attempt"
    );
    database.drop_table().await;
}

per_backend!(a_deferred_failure_keeps_the_events_attempts: postgres, mariadb, sqlite);

/// Seeds one event per id, in its order; each event's room is its id's first letter.
async fn seed_rooms(database: &TestDatabase, ids: &[&str]) {
    let events: Vec<NewEvent> = ids.iter().map(|id| event(id, &id[..1])).collect();
    outbox_tests::seed(database, &events).await;
}

async fn per_room_claims_take_a_prefix_and_wait_for_outcomes(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    seed_rooms(&database, &["a1", "b1", "a2", "b2", "a3"]).await;
    let store = &database.store;

    let first = store
        .claim(&claim("n1", 3, Ordering::PerRoom))
        .await
        .unwrap();
    assert_eq!(
        event_ids(&first),
        ["a1", "b1", "a2"],
        "oldest first, a prefix of each room"
    );
    let second = store
        .claim(&claim("n2", 10, Ordering::PerRoom))
        .await
        .unwrap();
    assert!(
        second.is_empty(),
        "rooms with rows in flight are skipped: {second:?}"
    );

    // b1 published, a1 fails with backoff, a2 released: room b flows, room a waits for a1.
    let batch = MarkBatch {
        published: vec![first[1].id],
        retried: vec![(
            Failure {
                id: first[0].id,
                error: "nacked".into(),
            },
            Utc::now() + chrono::Duration::seconds(60),
        )],
        released: vec![first[2].id],
        ..MarkBatch::default()
    };
    store.mark("n1", &batch).await.unwrap();
    let third = store
        .claim(&claim("n2", 10, Ordering::PerRoom))
        .await
        .unwrap();
    assert_eq!(
        event_ids(&third),
        ["b2"],
        "a2 and a3 wait behind a1's backoff"
    );

    let none = store.claim(&claim("n3", 10, Ordering::None)).await.unwrap();
    assert_eq!(
        event_ids(&none),
        ["a2", "a3"],
        "without ordering only leases and backoff count"
    );

    let stats = store.stats().await.unwrap();
    assert_eq!(stats.claimed.get("n2"), Some(&1));
    assert_eq!(stats.claimed.get("n3"), Some(&2));
    assert_eq!(stats.pending, 4);
    assert_eq!(stats.published, 1);
    assert_eq!(stats.dead, 0);
    assert!(!stats.published_estimated, "5 rows are counted");
    assert!(
        stats.size.is_some_and(|size| size.bytes > 0),
        "{:?}",
        stats.size
    );
    assert!(stats.oldest_pending_age_seconds.is_some());
    assert_eq!(store.release_node("n3").await.unwrap(), 2);
    assert_eq!(store.stats().await.unwrap().claimed.get("n3"), None);
    database.drop_table().await;
}

per_backend!(per_room_claims_take_a_prefix_and_wait_for_outcomes: postgres, mariadb, sqlite);

async fn a_node_that_lost_its_lease_cannot_overwrite_the_new_holder_but_published_wins(
    backend: Backend,
) {
    let database = TestDatabase::new(backend).await;
    outbox_tests::seed(&database, &[event("x1", "x"), event("y1", "y")]).await;
    let store = &database.store;
    let claimed = store
        .claim(&claim("old", 10, Ordering::PerRoom))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);
    // The old node's lease expires and another node claims both rows.
    database.expire_leases().await;
    let reclaimed = store
        .claim(&claim("new", 10, Ordering::PerRoom))
        .await
        .unwrap();
    assert_eq!(reclaimed.len(), 2);
    let stale = MarkBatch {
        published: vec![claimed[0].id],
        retried: vec![(
            Failure {
                id: claimed[1].id,
                error: "late".into(),
            },
            Utc::now(),
        )],
        ..MarkBatch::default()
    };
    store.mark("old", &stale).await.unwrap();
    let x1 = database.row("x1").await;
    assert_eq!(
        x1.status, "published",
        "the broker confirmed it: published wins"
    );
    let y1 = database.row("y1").await;
    assert_eq!(
        y1.locked_by.as_deref(),
        Some("new"),
        "the new holder keeps its lease"
    );
    assert_eq!(y1.retry_count, 0, "the stale failure is ignored");
    database.drop_table().await;
}

per_backend!(
    a_node_that_lost_its_lease_cannot_overwrite_the_new_holder_but_published_wins: postgres,
    mariadb
);

#[actix_rt::test]
async fn a_node_may_claim_deeper_into_rooms_it_holds() {
    let database = TestDatabase::new(Backend::Postgres).await;
    let events: Vec<NewEvent> = ["a1", "a2", "a3", "a4"]
        .iter()
        .map(|id| event(id, "a"))
        .collect();
    outbox_tests::seed(&database, &events).await;
    let store = &database.store;
    let first = store
        .claim(&claim("n1", 2, Ordering::PerRoom))
        .await
        .unwrap();
    assert_eq!(event_ids(&first), ["a1", "a2"]);
    let other = store
        .claim(&claim("n2", 10, Ordering::PerRoom))
        .await
        .unwrap();
    assert!(other.is_empty(), "{other:?}");
    let deeper = store
        .claim(&claim("n1", 10, Ordering::PerRoom))
        .await
        .unwrap();
    assert_eq!(event_ids(&deeper), ["a3", "a4"]);
    database.drop_table().await;
}

/// A renewal extends the node's own leases and no other node's; with `up_to`, none on a
/// row above that position.
async fn renewing_extends_only_this_nodes_leases(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    outbox_tests::seed(&database, &[event("r1", "r"), event("s1", "s")]).await;
    let store = &database.store;
    let mut short = claim("n1", 1, Ordering::PerRoom);
    short.lease = Duration::from_secs(1);
    assert_eq!(store.claim(&short).await.unwrap().len(), 1);
    assert_eq!(
        store
            .claim(&claim("n2", 1, Ordering::PerRoom))
            .await
            .unwrap()
            .len(),
        1
    );
    let before = database.row("s1").await.locked_until;
    let r1 = database.row("r1").await;
    let long = Duration::from_secs(600);
    assert_eq!(
        store.renew("n1", long, Some(r1.id - 1)).await.unwrap(),
        0,
        "a lease above `up_to` is not renewed"
    );
    assert_eq!(database.row("r1").await.locked_until, r1.locked_until);
    assert_eq!(store.renew("n1", long, Some(r1.id)).await.unwrap(), 1);
    let renewed = database.row("r1").await.locked_until.expect("leased");
    assert!(
        renewed > Utc::now() + chrono::Duration::seconds(500),
        "{renewed}"
    );
    assert_eq!(store.renew("n1", long, None).await.unwrap(), 1);
    assert_eq!(
        database.row("s1").await.locked_until,
        before,
        "another node's lease is untouched"
    );
    database.drop_table().await;
}

per_backend!(renewing_extends_only_this_nodes_leases: postgres, sqlite, mariadb);

/// Every node migrates on start by default: nodes started together must not fail.
async fn runners_started_together_migrate_one_table(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let together = TableName::parse(&outbox_tests::unique_name("e2e_mig")).unwrap();
    let alone = TableName::parse(&outbox_tests::unique_name("e2e_mig")).unwrap();
    let mut every = outbox_store::migrate(database.db(), &alone)
        .await
        .expect("a lone migration");
    let runners: Vec<_> = (0..4)
        .map(|_| {
            let db = database.db().clone();
            let table = together.clone();
            actix_rt::spawn(async move { outbox_store::migrate(&db, &table).await })
        })
        .collect();
    let mut applied = Vec::new();
    for runner in runners {
        let names = runner
            .await
            .unwrap()
            .expect("every runner started together succeeds");
        applied.extend(names);
    }
    applied.sort_unstable();
    every.sort_unstable();
    assert_eq!(applied, every, "each migration applied once, by one runner");
    outbox_store::insert_events(database.db(), &together, &[event("m1", "r")])
        .await
        .expect("the table takes inserts");
    let store = outbox_store::SeaOrmStore::new(database.db().clone(), together.clone());
    let claimed = store.claim(&claim("n1", 10, Ordering::PerRoom)).await;
    assert_eq!(claimed.expect("the table works").len(), 1);
    for table in [&together, &alone] {
        database.drop_outbox(table).await;
    }
    database.drop_table().await;
}

per_backend!(runners_started_together_migrate_one_table: postgres, mariadb);

/// The scan floor (docs/design/claim-plans.md#the-scan-floor: a claim
/// says where the pending rows begin; a claim from a floor takes nothing below it, and
/// under `per_room` a pending row below it (committed late) holds back its room's later
/// rows instead of being overtaken, unless the claiming node holds its lease.
async fn claims_from_a_floor_skip_below_it_and_keep_room_order(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    seed_rooms(&database, &["a1", "b1", "a2", "b2", "c1"]).await;
    let store = &database.store;
    let id = |claimed: &[OutboxRecord], event: &str| {
        claimed
            .iter()
            .find(|r| r.event_id == event)
            .map(|r| r.id)
            .unwrap()
    };

    let first = store
        .claim_with_floor(&claim("n1", 2, Ordering::PerRoom))
        .await
        .unwrap();
    assert_eq!(event_ids(&first.records), ["a1", "b1"]);
    let a1 = id(&first.records, "a1");
    assert_eq!(
        first.floor,
        Some(a1),
        "the lowest pending row, leased ones included"
    );

    // a1 and b1 published: the pending rows now begin at a2.
    let batch = MarkBatch {
        published: first.records.iter().map(|r| r.id).collect(),
        ..MarkBatch::default()
    };
    store.mark("n1", &batch).await.unwrap();
    let mut request = claim("n1", 1, Ordering::PerRoom);
    request.floor = first.floor;
    let second = store.claim_with_floor(&request).await.unwrap();
    assert_eq!(event_ids(&second.records), ["a2"]);
    let a2 = id(&second.records, "a2");
    assert_eq!(second.floor, Some(a2), "moved up past the published rows");

    // From a floor above b2 (as if b2 had committed after the floor passed it): nothing
    // below is taken, and room b's later row waits behind b2.
    outbox_tests::seed(&database, &[event("b3", "b")]).await;
    let all = store
        .claim(&claim("peek", 10, Ordering::None))
        .await
        .unwrap();
    let (b2, c1) = (id(&all, "b2"), id(&all, "c1"));
    store
        .mark(
            "peek",
            &MarkBatch {
                released: all.iter().map(|r| r.id).collect(),
                ..MarkBatch::default()
            },
        )
        .await
        .unwrap();
    assert!(b2 < c1);
    let mut request = claim("n1", 10, Ordering::PerRoom);
    request.floor = Some(c1);
    let third = store.claim_with_floor(&request).await.unwrap();
    assert_eq!(
        event_ids(&third.records),
        ["c1"],
        "b3 waits behind b2, below the floor"
    );
    assert_eq!(third.floor, Some(c1));
    let mut request = claim("n2", 10, Ordering::None);
    request.floor = Some(c1);
    let unordered = store.claim_with_floor(&request).await.unwrap();
    assert_eq!(
        event_ids(&unordered.records),
        ["b3"],
        "without ordering only the floor counts"
    );

    let from_head = store
        .claim_with_floor(&claim("n3", 10, Ordering::PerRoom))
        .await
        .unwrap();
    assert_eq!(event_ids(&from_head.records), ["b2"]);
    assert_eq!(from_head.floor, Some(a2));

    // A floor past the node's own rows in flight (as the Fetcher sets it after a full
    // claim): a2, leased to n1 below it, does not hold back a3 for n1, whose Publisher
    // keeps a2 ahead; for any other node it does.
    outbox_tests::seed(&database, &[event("a3", "a")]).await;
    let mut request = claim("n4", 10, Ordering::PerRoom);
    request.floor = Some(c1 + 1);
    let other = store.claim_with_floor(&request).await.unwrap();
    assert!(other.records.is_empty(), "a3 waits behind n1's a2");
    let mut request = claim("n1", 10, Ordering::PerRoom);
    request.floor = Some(c1 + 1);
    let own = store.claim_with_floor(&request).await.unwrap();
    assert_eq!(
        event_ids(&own.records),
        ["a3"],
        "n1's own a2, below the floor, does not hold a3 back"
    );
    database.drop_table().await;
}

per_backend!(claims_from_a_floor_skip_below_it_and_keep_room_order: postgres, mariadb, sqlite);

/// The top node's `Buffers: shared hit=… read=…` of an `EXPLAIN (ANALYZE, BUFFERS)` plan:
/// every page the statement touched.
fn buffers(plan: &str) -> u64 {
    let line = plan
        .lines()
        .find(|line| line.trim_start().starts_with("Buffers: shared"))
        .unwrap_or_else(|| panic!("no buffers in\n{plan}"));
    ["hit=", "read="]
        .iter()
        .filter_map(|key| line.split(key).nth(1))
        .map(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .sum()
}

/// With history (published rows) and the dead index entries of rows marked since the last
/// vacuum, the claim plan reads the pending rows and no published ones: the candidates from
/// the pending index, the per-room probe on the pending-per-room index bounded at its
/// candidate, and, from a floor, not the dead head. A plan regression fails here.
#[actix_rt::test]
async fn postgres_claim_plans_read_the_pending_rows_not_the_history() {
    let database = TestDatabase::new(Backend::Postgres).await;
    // 30,000 published rows over 100 rooms, then 3,000 pending rows marked published
    // without a vacuum (dead entries at the pending index's head), then 500 pending.
    published_history(&database).await;
    pending_rows(&database, "d", 3000).await;
    database.execute("ANALYZE {t}").await;
    database
        .execute(
            "UPDATE {t} SET status = 'published', published_at = now() WHERE status = 'pending'",
        )
        .await;
    database
        .execute(
            "INSERT INTO {t} (event_id, event_type, room_id, envelope) \
             SELECT 'p-' || n, 'room.message.posted', 'room-' || (n % 50), repeat('x', 200) \
             FROM generate_series(1, 500) AS n",
        )
        .await;
    let store = &database.store;
    // A claim from the head says where the pending rows begin (and kills the dead entries
    // it passes, as the relay's first claim does).
    let first = store
        .claim_with_floor(&claim("n1", 100, Ordering::PerRoom))
        .await
        .unwrap();
    assert_eq!(first.records.len(), 100);
    let floor = first.floor.expect("a floor");
    assert_eq!(floor, first.records[0].id);

    let request = claim("n2", 100, Ordering::PerRoom);
    let floored = ClaimRequest {
        floor: Some(floor),
        ..request.clone()
    };
    // A dead entry is skipped once a scan finds its row dead to every transaction; a
    // snapshot older than the marks (another test's ANALYZE) postpones that, so the plans
    // are read again until they show it, or the deadline passes and the asserts say why.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (from_head, from_floor) = loop {
        let from_head = store.explain_claim(&request).await.unwrap().unwrap();
        let from_floor = store.explain_claim(&floored).await.unwrap().unwrap();
        let settled = buffers(&from_floor) < 4_000 && buffers(&from_floor) < buffers(&from_head);
        if settled || Instant::now() > deadline {
            break (from_head, from_floor);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let t = database.table.as_str();
    for plan in [&from_head, &from_floor] {
        assert!(!plan.contains("Seq Scan"), "a sequential scan:\n{plan}");
        assert!(!plan.contains("Bitmap"), "a bitmap scan:\n{plan}");
        assert!(
            plan.contains(&format!("Index Scan using {t}_pending_idx on {t} c")),
            "candidates not from the pending index:\n{plan}"
        );
        assert!(
            plan.contains(&format!("using {t}_pending_room_idx on {t} e")),
            "the per-room probe not on the pending-per-room index:\n{plan}"
        );
        // Both ends of the probe's range are index conditions: the room's first entry
        // and the candidate (a row comparison's bound would not end the scan).
        assert!(
            plan.lines().any(|line| line
                .contains("Index Cond: (((room_id)::text = (c.room_id)::text) AND (id < c.id))")),
            "the probe's range is not an index condition:\n{plan}"
        );
    }
    assert!(
        from_floor.contains("Index Cond: (id >= "),
        "the floor is not the scan's start:\n{from_floor}"
    );
    // n2 finds nothing claimable (every room has n1's row in flight): each plan reads the
    // 500 pending rows' pages and probes; the history's 30,000 rows are never read.
    let (head, floored) = (buffers(&from_head), buffers(&from_floor));
    assert!(
        floored < head,
        "from the floor {floored} buffers, from the head {head}:\n{from_floor}"
    );
    assert!(
        floored < 4_000,
        "{floored} buffers for 500 pending rows:\n{from_floor}"
    );
    database.drop_table().await;
}

/// A table analyzed while it held no pending rows (history, then a backlog)
/// makes PostgreSQL's planner expect none, and it then walks the whole pending index for
/// every per-room probe (measured: 2.9 s for one claim over a 100,000-row backlog). The
/// store refreshes the statistics after a full claim when the planner expects fewer
/// pending rows than it leased, before its first claim when the table already holds a
/// backlog, after a slow full claim however recent its last check, and when a claim runs
/// past its timeout; the next claim's probe is on the pending-per-room index again.
#[actix_rt::test]
async fn postgres_claims_refresh_statistics_that_expect_no_pending_rows() {
    let database = TestDatabase::new(Backend::Postgres).await;
    let backlog = |prefix: &'static str, rows: u32| pending_rows(&database, prefix, rows);
    let all_published = || {
        database.execute(
            "UPDATE {t} SET status = 'published', locked_by = NULL WHERE status = 'pending'",
        )
    };
    published_history(&database).await;
    database.execute("ANALYZE {t}").await;
    let store = &database.store;
    // A first claim on the quiet table: nothing to claim, nothing to refresh.
    let none = store
        .claim_with_floor(&claim("n1", 100, Ordering::PerRoom))
        .await;
    assert!(none.unwrap().records.is_empty());
    backlog("a", 2_000).await;
    let before = planned_pending(&database).await;
    assert!(
        before < 100,
        "the planner expects {before} pending rows after ANALYZE saw none"
    );

    // A backlog arrives: the first full claim refreshes the statistics.
    claim_refreshes(&database, store, "n1", "a full claim").await;
    let plan = store
        .explain_claim(&claim("n2", 100, Ordering::PerRoom))
        .await
        .unwrap()
        .unwrap();
    let t = database.table.as_str();
    assert!(
        plan.contains(&format!("using {t}_pending_room_idx on {t} e")),
        "the per-room probe not on the pending-per-room index:\n{plan}"
    );

    // A relay started on a backlog the statistics do not know: refreshed before its
    // first claim.
    all_published().await;
    database.execute("VACUUM (ANALYZE) {t}").await;
    backlog("b", 2_000).await;
    assert!(planned_pending(&database).await < 100);
    let restarted = outbox_store::SeaOrmStore::new(database.db().clone(), database.table.clone());
    claim_refreshes(&database, &restarted, "n3", "a new store's first claim").await;

    // An ANALYZE that ran while no row was pending (autovacuum's, at the end of a drain)
    // lands after that check found the statistics right: the stale plan makes every full
    // claim slow (about 100 ms over 10,000 pending rows here, against 1 ms), and slow
    // claims check again within a second instead of a minute.
    all_published().await;
    database.execute("ANALYZE {t}").await;
    backlog("c", 10_000).await;
    assert!(planned_pending(&database).await < 100);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut claims = 0;
    while planned_pending(&database).await < 1_000 {
        assert!(
            std::time::Instant::now() < deadline,
            "the statistics were not refreshed after {claims} slow claims in 10 s"
        );
        let claimed = restarted
            .claim_with_floor(&claim("n3", 100, Ordering::PerRoom))
            .await
            .unwrap();
        assert_eq!(claimed.records.len(), 100, "the backlog ran out");
        claims += 1;
    }

    // The same, but the claim on the stale plan runs past the claim timeout: it is
    // cancelled, the statistics refreshed, and the claim made again, all in one call. The
    // node has 5,000 rows in flight, as in the middle of a drain: the stale plan's probe
    // walks the pending index from its head to each candidate, through all of them.
    let timed = outbox_store::SeaOrmStore::new(database.db().clone(), database.table.clone())
        .with_claim_timeout(std::time::Duration::from_millis(20));
    claim_refreshes(&database, &timed, "n3", "a claim with the statistics right").await;
    all_published().await;
    database.execute("ANALYZE {t}").await;
    backlog("d", 10_000).await;
    database
        .execute(
            "UPDATE {t} SET locked_by = 'n4', locked_until = now() + interval '1 hour' \
             WHERE id IN (SELECT id FROM {t} WHERE status = 'pending' ORDER BY id LIMIT 5000)",
        )
        .await;
    assert!(planned_pending(&database).await < 100);
    claim_refreshes(&database, &timed, "n4", "a claim cancelled at its timeout").await;
    database.drop_table().await;
}

/// A claim of 100 rows by `node` on `store` leases 100 of a backlog of at least 2,000
/// rows and leaves the planner expecting at least 1,000.
async fn claim_refreshes(
    database: &TestDatabase,
    store: &outbox_store::SeaOrmStore,
    node: &str,
    what: &str,
) {
    let claimed = store
        .claim_with_floor(&claim(node, 100, Ordering::PerRoom))
        .await
        .unwrap();
    assert_eq!(claimed.records.len(), 100);
    let after = planned_pending(database).await;
    assert!(
        after >= 1_000,
        "the planner still expects {after} pending rows (of at least 2,000) after {what}"
    );
}

/// 30,000 published rows over 100 rooms in the test's table.
async fn published_history(database: &TestDatabase) {
    database
        .execute(
            "INSERT INTO {t} (event_id, event_type, room_id, envelope, status, published_at) \
             SELECT 'h-' || n, 'room.message.posted', 'room-' || (n % 100), repeat('x', 200), \
             'published', now() FROM generate_series(1, 30000) AS n",
        )
        .await;
}

/// The pending rows PostgreSQL's planner expects in the test's table.
async fn planned_pending(database: &TestDatabase) -> u64 {
    let line: String = database
        .db()
        .query_one(sea_orm::Statement::from_string(
            database.backend(),
            format!(
                "EXPLAIN SELECT 1 FROM {} WHERE status = 'pending'",
                database.table.as_str()
            ),
        ))
        .await
        .unwrap()
        .unwrap()
        .try_get_by_index(0)
        .unwrap();
    let (_, after) = line.split_once(" rows=").expect("a row estimate");
    after
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|digits| digits.parse().ok())
        .expect("a row estimate")
}

/// `status`'s autovacuum reading: the server's setting and the table's own
/// `autovacuum_enabled` on PostgreSQL, nothing elsewhere.
async fn stats_say_whether_autovacuum_looks_after_the_table(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let stats = database.store.stats().await.unwrap();
    if backend != Backend::Postgres {
        assert_eq!(stats.autovacuum, None);
        database.drop_table().await;
        return;
    }
    let server: bool = database
        .db()
        .query_one(sea_orm::Statement::from_string(
            database.backend(),
            "SELECT current_setting('autovacuum')::bool AS on",
        ))
        .await
        .unwrap()
        .unwrap()
        .try_get("", "on")
        .unwrap();
    assert_eq!(stats.autovacuum, Some(server), "the server's setting");
    database
        .execute("ALTER TABLE {t} SET (autovacuum_enabled = false)")
        .await;
    let stats = database.store.stats().await.unwrap();
    assert_eq!(stats.autovacuum, Some(false), "turned off for the table");
    assert_eq!(database.store.autovacuum().await.unwrap(), Some(false));
    database.drop_table().await;
}

per_backend!(stats_say_whether_autovacuum_looks_after_the_table: postgres, mariadb, sqlite);

/// The heap page of each row, by id (PostgreSQL: the block of its `ctid`).
async fn pages(database: &TestDatabase) -> Vec<(i64, i64)> {
    let sql = format!(
        "SELECT id, (ctid::text::point)[0]::bigint AS page FROM {} ORDER BY id",
        database.table
    );
    database
        .db()
        .query_all(sea_orm::Statement::from_string(database.backend(), sql))
        .await
        .expect("pages readable")
        .iter()
        .map(|row| {
            (
                row.try_get::<i64>("", "id").unwrap(),
                row.try_get::<i64>("", "page").unwrap(),
            )
        })
        .collect()
}

/// The table's fillfactor leaves every row of a page room for its lease, so a
/// claim's updates are all HOT — each new version stays on its page (a version that had
/// to move would have written an entry in each of the table's indexes). At 70 a claim of
/// whole pages of 600-byte rows moved more than half of them.
#[actix_rt::test]
async fn postgres_leases_stay_on_their_pages_and_marks_skip_a_room_index() {
    let database = TestDatabase::new(Backend::Postgres).await;
    // And no index of every row by room, which cost each mark an entry (`m20261204_000008_drop_room_outbox_room_index`).
    let sql = format!(
        "SELECT indexname::text AS name FROM pg_indexes WHERE tablename = '{}' ORDER BY 1",
        database.table
    );
    let indexes: Vec<String> = database
        .db()
        .query_all(sea_orm::Statement::from_string(database.backend(), sql))
        .await
        .unwrap()
        .iter()
        .map(|row| row.try_get::<String>("", "name").unwrap())
        .collect();
    let t = &database.table;
    assert_eq!(
        indexes,
        [
            format!("{t}_event_id_key"),
            format!("{t}_pending_idx"),
            format!("{t}_pending_room_idx"),
            format!("{t}_pkey"),
            format!("{t}_retention_idx"),
        ]
    );
    let events: Vec<NewEvent> = (0..400)
        .map(|n| NewEvent {
            envelope: format!(r#"{{"n":{n},"text":"{}"}}"#, "x".repeat(500)),
            ..event(&format!("e{n:03}"), &format!("r{}", n % 40))
        })
        .collect();
    outbox_tests::seed(&database, &events).await;
    let before = pages(&database).await;
    assert!(
        before.last().map(|(_, page)| *page).unwrap_or(0) >= 10,
        "several pages of rows: {before:?}"
    );
    let mut claimed = 0;
    for _ in 0..4 {
        claimed += database
            .store
            .claim(&claim("n1", 100, Ordering::PerRoom))
            .await
            .unwrap()
            .len();
    }
    assert_eq!(claimed, 400);
    let after = pages(&database).await;
    let moved: Vec<_> = before.iter().zip(&after).filter(|(b, a)| b != a).collect();
    assert_eq!(before.len(), after.len());
    assert!(moved.is_empty(), "leases that left their page: {moved:?}");
    database.drop_table().await;
}

/// The rig's own reader survives a test's `ALTER TABLE … ADD COLUMN` on SQLite: sqlx
/// caches a prepared statement's columns, SQLite prepares it again with the new column,
/// and reading `SELECT *` through the stale statement panicked in sqlx-sqlite (a CI run
/// failed on it in `outboxes::bad_mappings…::sqlite`); `TestDatabase::rows` names its
/// columns.
#[actix_rt::test]
async fn the_rows_reader_survives_a_column_added_on_sqlite() {
    let database = outbox_tests::TestDatabase::new(Backend::Sqlite).await;
    outbox_tests::seed(&database, &[outbox_tests::event("a", "r")]).await;
    for _ in 0..3 {
        let _ = database.rows().await;
    }
    database
        .execute("ALTER TABLE {t} ADD COLUMN label VARCHAR(32) NULL")
        .await;
    for _ in 0..5 {
        assert_eq!(database.rows().await.len(), 1);
    }
    database.drop_table().await;
}

/// The PostgreSQL probe reads the primary index's last entry however the table looked when
/// it first ran. Planned on a vacuumed, empty table (as after a clean-up, or a table that
/// `published_rows = "delete"` empties whenever the relay has caught up), a prepared
/// `MAX(id)` kept a sequential scan, and every probe then read the whole backlog: 120
/// scans/s reading 650,000 rows/s beside 1,000 inserts/s, more of the server than
/// everything else the relay asked of it. The probe now makes its statement again once
/// the table has grown: at most the probe that sees the backlog arrive scans it.
#[actix_rt::test]
async fn postgres_probes_read_the_index_however_empty_the_table_was_at_first() {
    let database = TestDatabase::new(Backend::Postgres).await;
    database.execute("VACUUM (ANALYZE) {t}").await;
    let wake_ups = outbox_store::wake::WakeUps {
        listen_url: None,
        probe_interval: Some(Duration::from_millis(1)),
        url: database.url.clone(),
    };
    let mut probe = database.store.insert_feed(&wake_ups).expect("a probe");
    // The first probes, on the pool's connections in turn, plan on an all but empty table.
    probe.wait().await.unwrap();
    for n in 0..10 {
        outbox_tests::seed(&database, &[event(&format!("e-{n}"), "r")]).await;
        probe.wait().await.unwrap();
    }
    pending_rows(&database, "b", 20_000).await;
    // Rows read by sequential scans: the first probes' scans read next to nothing, so
    // their counts may land in the statistics at any time (a session's, within seconds
    // of its going idle) without moving this.
    let before = scans(&database).await;
    probe.wait().await.unwrap();
    for n in 0..50 {
        outbox_tests::seed(&database, &[event(&format!("p-{n}"), "r")]).await;
        probe.wait().await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = loop {
        let after = scans(&database).await;
        if after.index_scans >= before.index_scans + 50 || Instant::now() > deadline {
            break after;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let read = after.rows_read_sequentially - before.rows_read_sequentially;
    assert!(
        read < 60_000,
        "sequential scans read {read} rows of a 20,000-row table during 51 probes ({} index \
         scans counted)",
        after.index_scans - before.index_scans
    );
    assert!(
        after.index_scans >= before.index_scans + 50,
        "51 probes, {} index scans counted in 30 s",
        after.index_scans - before.index_scans
    );
    database.drop_table().await;
}

/// `rows` pending rows over 100 rooms, event ids `<prefix>-1`…, in one statement.
async fn pending_rows(database: &TestDatabase, prefix: &str, rows: u32) {
    database
        .execute(&format!(
            "INSERT INTO {{t}} (event_id, event_type, room_id, envelope) \
             SELECT '{prefix}-' || n, 'room.message.posted', 'room-' || (n % 100), \
             repeat('x', 200) FROM generate_series(1, {rows}) AS n"
        ))
        .await;
}

/// What the server counted of the scans of a test's table.
struct Scans {
    rows_read_sequentially: i64,
    index_scans: i64,
}

async fn scans(database: &TestDatabase) -> Scans {
    let row = database
        .db()
        .query_one(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            format!(
                "SELECT seq_tup_read, COALESCE(idx_scan, 0) AS idx_scan \
                 FROM pg_stat_user_tables WHERE relid = '{}'::regclass",
                database.table.as_str()
            ),
        ))
        .await
        .unwrap()
        .expect("the table's statistics");
    Scans {
        rows_read_sequentially: row.try_get("", "seq_tup_read").unwrap(),
        index_scans: row.try_get("", "idx_scan").unwrap(),
    }
}
