//! Several `outbox-relay run` processes on one table (DESIGN §4).

use outbox_store::NewEvent;
use outbox_tests::{
    assert_every_event_delivered, assert_room_order, eventually, room_events, seed, test_settings,
    Backend, RelayProcess, TestBroker, TestDatabase,
};
use std::collections::HashSet;
use std::time::Duration;

const NODES: usize = 3;

fn node_settings(
    database: &TestDatabase,
    broker: &TestBroker,
    node: usize,
    lease: &str,
) -> outbox_cli::settings::Settings {
    test_settings(database, broker, |settings| {
        settings.relay.node_id = format!("{}-node{node}", database.table);
        settings.relay.publishers = 4;
        settings.relay.lease = lease.into();
    })
}

fn spawn_nodes(database: &TestDatabase, broker: &TestBroker, lease: &str) -> Vec<RelayProcess> {
    (0..NODES)
        .map(|node| {
            RelayProcess::spawn(crate::RELAY, &node_settings(database, broker, node, lease))
        })
        .collect()
}

async fn three_nodes_deliver_everything_once_in_room_order(backend: Backend) {
    const EVENTS: usize = 30_000;
    let database = TestDatabase::new(backend).await;
    let broker = TestBroker::new("#").await;
    seed(&database, &room_events("mn", EVENTS, 300)).await;
    let nodes = spawn_nodes(&database, &broker, "30s");

    database.wait_all_published(Duration::from_secs(240)).await;
    let received = broker.wait_for(EVENTS, Duration::from_secs(30)).await;
    for node in nodes {
        node.stop(Duration::from_secs(5)).await;
    }
    let duplicates = assert_room_order(&received);
    assert_eq!(duplicates, 0, "no crash, no duplicates");
    assert_eq!(received.len(), EVENTS);
    let by_node: HashSet<String> = received
        .iter()
        .filter_map(|r| r.header("node_id"))
        .collect();
    assert_eq!(by_node.len(), NODES, "every node took part: {by_node:?}");
    for row in database.rows().await {
        assert!(row.locked_by.is_none(), "{} still locked", row.event_id);
    }
    broker.close().await;
    database.drop_table().await;
}

#[actix_rt::test]
async fn postgres_three_nodes_deliver_everything_once_in_room_order() {
    three_nodes_deliver_everything_once_in_room_order(Backend::Postgres).await;
}

#[actix_rt::test]
async fn mariadb_three_nodes_deliver_everything_once_in_room_order() {
    three_nodes_deliver_everything_once_in_room_order(Backend::MySql).await;
}

#[actix_rt::test]
async fn a_killed_node_loses_nothing_and_others_take_over_after_its_lease() {
    const EVENTS: usize = 30_000;
    let database = TestDatabase::new(Backend::Postgres).await;
    let broker = TestBroker::new("#").await;
    let seeded = room_events("kill", EVENTS, 300);
    seed(&database, &seeded).await;
    let mut nodes = spawn_nodes(&database, &broker, "3s");

    broker.wait_for(EVENTS / 3, Duration::from_secs(120)).await;
    let mut victim = nodes.remove(0);
    victim.signal("KILL");
    victim.wait(Duration::from_secs(5)).await;

    database.wait_all_published(Duration::from_secs(240)).await;
    let received = broker.wait_for(EVENTS, Duration::from_secs(30)).await;
    for node in nodes {
        node.stop(Duration::from_secs(5)).await;
    }
    let duplicates = assert_every_event_delivered(&received, &seeded);
    println!(
        "kill test: {} deliveries for {EVENTS} events, {duplicates} duplicates",
        received.len()
    );
    broker.close().await;
    database.drop_table().await;
}

#[actix_rt::test]
async fn a_failing_head_holds_its_room_back_on_every_node() {
    let database = TestDatabase::new(Backend::Postgres).await;
    let broker = TestBroker::new("room.#").await;
    let mut events = vec![NewEvent {
        event_id: "head".into(),
        event_type: "orphan.created".into(),
        room_id: "held".into(),
        envelope: "{}".into(),
        headers: None,
        available_at: None,
    }];
    for n in 0..30 {
        events.push(NewEvent {
            event_id: format!("held-{n:02}"),
            event_type: "room.message.posted".into(),
            room_id: "held".into(),
            envelope: "{}".into(),
            headers: None,
            available_at: None,
        });
    }
    events.extend(room_events("free", 300, 30));
    seed(&database, &events).await;
    let nodes: Vec<RelayProcess> = (0..NODES)
        .map(|node| {
            let mut settings = node_settings(&database, &broker, node, "30s");
            settings.relay.retry_interval = "100ms".into();
            RelayProcess::spawn(crate::RELAY, &settings)
        })
        .collect();

    broker.wait_for(300, Duration::from_secs(60)).await;
    eventually(
        "the head to fail on several attempts",
        Duration::from_secs(30),
        || async { database.row("head").await.retry_count >= 5 },
    )
    .await;
    let received = broker.received();
    assert!(
        received
            .iter()
            .all(|r| r.header("room_id").as_deref() != Some("held")),
        "nothing of the held room may pass its failing head"
    );

    broker.bind("orphan.#").await;
    let received = broker.wait_for(331, Duration::from_secs(60)).await;
    for node in nodes {
        node.stop(Duration::from_secs(5)).await;
    }
    let held: Vec<String> = received
        .iter()
        .filter(|r| r.header("room_id").as_deref() == Some("held"))
        .map(|r| r.message_id.clone())
        .collect();
    let mut expected = vec!["head".to_owned()];
    expected.extend((0..30).map(|n| format!("held-{n:02}")));
    assert_eq!(held, expected, "released in order once the head succeeded");
    broker.close().await;
    database.drop_table().await;
}

#[actix_rt::test]
async fn per_room_order_holds_while_producers_insert_concurrently() {
    const PRODUCERS: usize = 4;
    const PER_PRODUCER: usize = 2_500;
    let database = TestDatabase::new(Backend::Postgres).await;
    let broker = TestBroker::new("#").await;
    let nodes = spawn_nodes(&database, &broker, "30s");
    // Each producer owns its rooms, as a room service serialises writes per room.
    let mut producers = Vec::new();
    for producer in 0..PRODUCERS {
        let db = database.db().clone();
        let table = database.table.clone();
        producers.push(actix_rt::spawn(async move {
            let events: Vec<NewEvent> = room_events(&format!("p{producer}"), PER_PRODUCER, 25)
                .into_iter()
                .map(|mut event| {
                    event.room_id = format!("p{producer}-{}", event.room_id);
                    event
                })
                .collect();
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
    database.wait_all_published(Duration::from_secs(240)).await;
    let received = broker
        .wait_for(PRODUCERS * PER_PRODUCER, Duration::from_secs(30))
        .await;
    for node in nodes {
        node.stop(Duration::from_secs(5)).await;
    }
    assert_eq!(assert_room_order(&received), 0);
    broker.close().await;
    database.drop_table().await;
}
