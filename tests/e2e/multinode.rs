//! Several `outbox-relay run` processes on one table (`docs/design/claims.md`).

use outbox_tests::{
    assert_room_order, event, eventually, own_room_events, per_backend, room_events, Backend,
    FaultProxy, RelayProcess, TestApp, TestEvent,
};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

const NODES: usize = 3;

/// Starts relay processes `nodes` (of [`NODES`]) on the app's table, each its own node,
/// with `lease`.
fn spawn_nodes(app: &TestApp, lease: &str, nodes: std::ops::Range<usize>) -> Vec<RelayProcess> {
    nodes
        .map(|node| {
            let settings = app.settings_with(|settings| {
                settings.relay.node_id = format!("{}-node{node}", app.database.table);
                settings.relay.publishers = 4;
                settings.relay.lease = lease.into();
            });
            RelayProcess::spawn(crate::RELAY, &settings)
        })
        .collect()
}

async fn stop_nodes(nodes: Vec<RelayProcess>) {
    for node in nodes {
        node.stop(Duration::from_secs(5)).await;
    }
}

async fn three_nodes_deliver_everything_once_in_room_order(backend: Backend) {
    const EVENTS: usize = 30_000;
    let app = TestApp::on(backend)
        .seeded(&room_events("mn", EVENTS, 300))
        .build()
        .await;
    let nodes = spawn_nodes(&app, "30s", 0..NODES);

    app.database
        .wait_all_published(Duration::from_secs(240))
        .await;
    app.broker.wait_for(EVENTS, Duration::from_secs(30)).await;
    stop_nodes(nodes).await;
    // Settled: a duplicate arriving after the count reached EVENTS is seen too.
    let received = app.broker.drain(Duration::from_secs(30)).await;
    let duplicates = assert_room_order(&received);
    assert_eq!(duplicates, 0, "no crash, no duplicates");
    assert_eq!(received.len(), EVENTS);
    let by_node: HashSet<String> = received
        .iter()
        .filter_map(|r| r.header("node_id"))
        .collect();
    assert_eq!(by_node.len(), NODES, "every node took part: {by_node:?}");
    for row in app.database.rows().await {
        assert!(row.locked_by.is_none(), "{} still locked", row.event_id);
    }
    app.teardown().await;
}

per_backend!(three_nodes_deliver_everything_once_in_room_order: postgres, mariadb);

#[actix_rt::test]
async fn a_killed_node_loses_nothing_and_others_take_over_after_its_lease() {
    const EVENTS: usize = 30_000;
    const BATCH_SIZE: usize = 100; // the default
    let seeded = room_events("kill", EVENTS, 300);
    let app = TestApp::on(Backend::Postgres).seeded(&seeded).build().await;
    // The victim reaches the broker through a proxy that stalls before the kill, so that it
    // is sure to die holding rows (leased, published but never confirmed): killed at a
    // random moment it may hold none (a CI run caught it between a mark and its next claim).
    let (victim_link, victim_broker) = FaultProxy::in_front_of(&app.broker.url).await;
    let victim_id = format!("{}-node0", app.database.table);
    let mut victim = RelayProcess::spawn(
        crate::RELAY,
        &app.settings_with(|settings| {
            settings.relay.node_id = victim_id.clone();
            settings.relay.publishers = 4;
            settings.relay.lease = "3s".into();
            settings.amqp.url = victim_broker;
        }),
    );
    let nodes = spawn_nodes(&app, "3s", 1..NODES);

    app.broker
        .wait_for(EVENTS / 3, Duration::from_secs(120))
        .await;
    victim_link.stall();
    eventually("the victim holds rows", Duration::from_secs(30), || async {
        !app.database.held_by(&victim_id).await.is_empty()
    })
    .await;
    victim.signal("KILL");
    let (killed, killed_at) = (Instant::now(), chrono::Utc::now());
    victim.wait(Duration::from_secs(5)).await;
    // What the victim held when it died: rows under its lease, not published.
    let held: HashMap<String, chrono::DateTime<chrono::Utc>> = (app.database.held_by(&victim_id))
        .await
        .into_iter()
        .map(|row| (row.event_id, row.locked_until.expect("a lease")))
        .collect();
    assert!(!held.is_empty(), "the killed node held rows when it died");

    app.database
        .wait_all_published(Duration::from_secs(240))
        .await;
    let duplicates = app.expect_every_event("kill test", &seeded).await;
    stop_nodes(nodes).await;
    // The docs: duplicates after a crash are bounded by 4 × batch_size (what it had in
    // flight or confirmed but not marked).
    assert!(
        duplicates <= 4 * BATCH_SIZE,
        "{duplicates} duplicates, more than 4 × batch_size"
    );
    // Each held row went to another node, and only once its lease had run out.
    let received = app.broker.received();
    for (event_id, lease_end) in &held {
        let takeover = received
            .iter()
            .find(|r| {
                &r.message_id == event_id && r.header("node_id").as_deref() != Some(&victim_id)
            })
            .unwrap_or_else(|| panic!("{event_id}, held by the killed node, not taken over"));
        let at = killed_at
            + chrono::Duration::from_std(takeover.arrived.saturating_duration_since(killed))
                .expect("a duration");
        assert!(
            at + chrono::Duration::milliseconds(250) >= *lease_end,
            "{event_id} taken over at {at}, before the lease ended at {lease_end}"
        );
    }
    println!(
        "kill test: the killed node held {} rows, taken over after their lease; {duplicates} duplicates",
        held.len()
    );
    app.teardown().await;
}

#[actix_rt::test]
async fn a_failing_head_holds_its_room_back_on_every_node() {
    let mut events = vec![event("head", "held").of_type("orphan.created")];
    events.extend((0..30).map(|n| event(&format!("held-{n:02}"), "held")));
    events.extend(room_events("free", 300, 30));
    let app = TestApp::on(Backend::Postgres)
        .binding("room.#")
        .settings(|settings| settings.relay.retry_interval = "100ms".into())
        .seeded(&events)
        .build()
        .await;
    let nodes = spawn_nodes(&app, "30s", 0..NODES);

    app.broker.wait_for(300, Duration::from_secs(60)).await;
    eventually(
        "the head to fail on several attempts",
        Duration::from_secs(30),
        || async { app.database.row("head").await.retry_count >= 5 },
    )
    .await;
    let received = app.broker.received();
    assert!(
        received
            .iter()
            .all(|r| r.header("room_id").as_deref() != Some("held")),
        "nothing of the held room may pass its failing head"
    );

    app.broker.bind("orphan.#").await;
    let received = app.broker.wait_for(331, Duration::from_secs(60)).await;
    stop_nodes(nodes).await;
    let held: Vec<String> = received
        .iter()
        .filter(|r| r.header("room_id").as_deref() == Some("held"))
        .map(|r| r.message_id.clone())
        .collect();
    let mut expected = vec!["head".to_owned()];
    expected.extend((0..30).map(|n| format!("held-{n:02}")));
    assert_eq!(held, expected, "released in order once the head succeeded");
    app.teardown().await;
}

#[actix_rt::test]
async fn per_room_order_holds_while_producers_insert_concurrently() {
    const PRODUCERS: usize = 4;
    const PER_PRODUCER: usize = 2_500;
    let app = TestApp::on(Backend::Postgres).build().await;
    let nodes = spawn_nodes(&app, "30s", 0..NODES);
    // Each producer owns its rooms, as a room service serialises writes per room.
    let mut producers = Vec::new();
    for producer in 0..PRODUCERS {
        let db = app.database.db().clone();
        let table = app.database.table.clone();
        producers.push(actix_rt::spawn(async move {
            let events = own_room_events(&format!("p{producer}"), PER_PRODUCER, 25);
            for chunk in events.chunks(10) {
                outbox_store::insert_events(&db, &table, chunk)
                    .await
                    .expect("insert");
            }
        }));
    }
    for producer in producers {
        producer.await.expect("producer finished");
    }
    app.database
        .wait_all_published(Duration::from_secs(240))
        .await;
    app.broker
        .wait_for(PRODUCERS * PER_PRODUCER, Duration::from_secs(30))
        .await;
    stop_nodes(nodes).await;
    let received = app.broker.drain(Duration::from_secs(30)).await;
    assert_eq!(assert_room_order(&received), 0);
    assert_eq!(received.len(), PRODUCERS * PER_PRODUCER, "each event once");
    app.teardown().await;
}
