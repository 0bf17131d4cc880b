//! Unroutable events, hold-back per room, retries and dead events.

use outbox_store::NewEvent;
use outbox_tests::{
    eventually, seed, test_config, Backend, InProcessRelay, TestBroker, TestDatabase,
};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(30);

fn event(id: &str, room: &str, event_type: &str) -> NewEvent {
    NewEvent {
        event_id: id.into(),
        event_type: event_type.into(),
        room_id: room.into(),
        envelope: format!(r#"{{"id":"{id}"}}"#),
        headers: None,
        available_at: None,
    }
}

/// Room `a` has an unroutable event `a1` between routable ones; room `b` is healthy.
fn rooms_with_an_orphan() -> Vec<NewEvent> {
    vec![
        event("a0", "a", "room.message.posted"),
        event("b0", "b", "room.message.posted"),
        event("a1", "a", "orphan.created"),
        event("b1", "b", "room.message.posted"),
        event("a2", "a", "room.message.posted"),
        event("b2", "b", "room.message.posted"),
        event("a3", "a", "room.message.posted"),
        event("b3", "b", "room.message.posted"),
    ]
}

fn ids(received: &[outbox_tests::Received]) -> Vec<String> {
    received.iter().map(|r| r.message_id.clone()).collect()
}

async fn wait_for_retries(database: &TestDatabase, event_id: &str, retries: i32) {
    eventually(
        &format!("{event_id} to fail {retries} times"),
        DEADLINE,
        || async { database.row(event_id).await.retry_count >= retries },
    )
    .await;
}

#[actix_rt::test]
async fn unroutable_event_holds_back_its_room_until_a_binding_exists() {
    unroutable_event_holds_back_its_room(Backend::Postgres).await;
}

#[actix_rt::test]
async fn mariadb_unroutable_event_holds_back_its_room_until_a_binding_exists() {
    unroutable_event_holds_back_its_room(Backend::MySql).await;
}

async fn unroutable_event_holds_back_its_room(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let broker = TestBroker::new("room.#").await;
    let config = test_config(&database, &broker, |settings| {
        settings.relay.retry_interval = "100ms".into();
    });
    seed(&database, &rooms_with_an_orphan()).await;
    let relay = InProcessRelay::start(&config).await;

    wait_for_retries(&database, "a1", 2).await;
    let orphan = database.row("a1").await;
    assert_eq!(orphan.status, "pending");
    let error = orphan.last_error.unwrap_or_default();
    assert!(error.starts_with("unroutable: exchange="), "{error}");
    assert!(error.contains("routing_key=orphan.created"), "{error}");
    let received = ids(&broker.received());
    for healthy in ["a0", "b0", "b1", "b2", "b3"] {
        assert!(
            received.contains(&healthy.to_owned()),
            "{healthy} missing from {received:?}"
        );
    }
    for held in ["a2", "a3"] {
        assert!(
            !received.contains(&held.to_owned()),
            "{held} overtook a1: {received:?}"
        );
        assert_eq!(database.row(held).await.status, "pending");
    }

    broker.bind("orphan.#").await;
    let received = ids(&broker.wait_for(8, DEADLINE).await);
    let room_a: Vec<&String> = received.iter().filter(|id| id.starts_with('a')).collect();
    assert_eq!(
        room_a,
        ["a0", "a1", "a2", "a3"],
        "room a in order once a1 succeeded"
    );
    relay.stop().await;
    for row in database.rows().await {
        assert_eq!(row.status, "published", "{}", row.event_id);
    }
    broker.close().await;
    database.drop_table().await;
}

#[actix_rt::test]
async fn without_ordering_an_unroutable_event_holds_nothing_back() {
    let database = TestDatabase::new(Backend::Postgres).await;
    let broker = TestBroker::new("room.#").await;
    let config = test_config(&database, &broker, |settings| {
        settings.relay.ordering = "none".into();
        settings.relay.retry_interval = "100ms".into();
    });
    seed(&database, &rooms_with_an_orphan()).await;
    let relay = InProcessRelay::start(&config).await;

    let received = ids(&broker.wait_for(7, DEADLINE).await);
    assert!(!received.contains(&"a1".to_owned()));
    wait_for_retries(&database, "a1", 1).await;
    assert_eq!(database.row("a1").await.status, "pending");

    broker.bind("orphan.#").await;
    let received = ids(&broker.wait_for(8, DEADLINE).await);
    assert_eq!(
        received.last().map(String::as_str),
        Some("a1"),
        "a1 comes last, once bound"
    );
    relay.stop().await;
    broker.close().await;
    database.drop_table().await;
}

#[actix_rt::test]
async fn max_attempts_turns_a_failing_event_dead_and_its_room_flows_on() {
    max_attempts_turns_an_event_dead(Backend::Sqlite).await;
}

#[actix_rt::test]
async fn mariadb_max_attempts_turns_a_failing_event_dead_and_its_room_flows_on() {
    max_attempts_turns_an_event_dead(Backend::MySql).await;
}

async fn max_attempts_turns_an_event_dead(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let broker = TestBroker::new("room.#").await;
    let settings = outbox_tests::test_settings(&database, &broker, |settings| {
        settings.relay.max_attempts = 3;
        settings.relay.retry_interval = "50ms".into();
    });
    let config = settings.clone().validate().unwrap();
    seed(&database, &rooms_with_an_orphan()).await;
    let relay = InProcessRelay::start(&config).await;

    let received = ids(&broker.wait_for(7, DEADLINE).await);
    let room_a: Vec<&String> = received.iter().filter(|id| id.starts_with('a')).collect();
    assert_eq!(
        room_a,
        ["a0", "a2", "a3"],
        "the room flows on once a1 is dead"
    );
    relay.stop().await;
    let dead = database.row("a1").await;
    assert_eq!(dead.status, "dead");
    assert_eq!(dead.retry_count, 3);
    assert!(dead
        .last_error
        .unwrap_or_default()
        .starts_with("unroutable"));

    let status = outbox_tests::run_binary(crate::RELAY, &settings, &["status", "--json"]);
    assert!(status.status.success(), "{status:?}");
    let json: serde_json::Value =
        serde_json::from_slice(&status.stdout).expect("status --json is JSON");
    assert_eq!(json["dead"], 1, "{json}");
    assert_eq!(json["published"], 7, "{json}");
    assert_eq!(json["pending"], 0, "{json}");
    let list = outbox_tests::run_binary(crate::RELAY, &settings, &["dead", "list", "--json"]);
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(text.contains("\"event_id\":\"a1\""), "{text}");
    broker.close().await;
    database.drop_table().await;
}

#[actix_rt::test]
async fn permanent_failures_go_dead_at_once_and_transient_ones_are_retried() {
    let database = TestDatabase::new(Backend::Postgres).await;
    let broker = TestBroker::new("room.#").await;
    let mut config = test_config(&database, &broker, |settings| {
        settings.amqp.routing_key = "{event_type}.{room_id}".into();
        settings.relay.retry_interval = "100ms".into();
    });
    // As if the broker's max_message_size were 1 KiB (its default, 128 MiB, is too big
    // to insert in a test).
    config.amqp.message.max_body_bytes = 1024;
    let mut too_big = event("too-big", "p5", "room.message.posted");
    too_big.envelope = "x".repeat(1025);
    let mut bad_headers = event("bad-headers", "p1", "room.message.posted");
    bad_headers.headers = Some("[1, 2]".into());
    let long_key = event("long-key", &"r".repeat(250), "room.message.posted");
    let transient = event("transient", "p3", "orphan.created");
    let fine = event("fine", "p4", "room.message.posted");
    seed(
        &database,
        &[bad_headers, long_key, transient, fine, too_big],
    )
    .await;
    let relay = InProcessRelay::start(&config).await;

    broker.wait_for(1, DEADLINE).await;
    wait_for_retries(&database, "transient", 2).await;
    relay.stop().await;
    for (id, error) in [
        ("bad-headers", "headers column: not a JSON object"),
        (
            "long-key",
            "routing key of 270 bytes exceeds the AMQP limit",
        ),
        (
            "too-big",
            "envelope of 1025 bytes exceeds the broker's maximum message size of 1024 bytes",
        ),
    ] {
        let row = database.row(id).await;
        assert_eq!(row.status, "dead", "{id} is dead at once");
        assert_eq!(row.retry_count, 1, "{id}: one attempt");
        let last_error = row.last_error.unwrap_or_default();
        assert!(
            last_error.starts_with("cannot be published: "),
            "{last_error}"
        );
        assert!(last_error.contains(error), "{id}: {last_error}");
    }
    let transient = database.row("transient").await;
    assert_eq!(
        transient.status, "pending",
        "a transient failure is retried"
    );
    assert!(transient
        .last_error
        .unwrap_or_default()
        .starts_with("unroutable"));
    assert_eq!(ids(&broker.received()), ["fine"]);
    broker.close().await;
    database.drop_table().await;
}

#[actix_rt::test]
async fn dead_events_are_listed_and_requeued_by_id_room_and_all() {
    let database = TestDatabase::new(Backend::Postgres).await;
    let broker = TestBroker::new("room.#").await;
    let settings = outbox_tests::test_settings(&database, &broker, |settings| {
        settings.relay.max_attempts = 1;
    });
    let config = settings.clone().validate().unwrap();
    seed(
        &database,
        &[
            event("a1", "a", "orphan.created"),
            event("a2", "a", "room.message.posted"),
            event("b1", "b", "orphan.created"),
            event("b2", "b", "orphan.updated"),
            event("c1", "c", "orphan.created"),
        ],
    )
    .await;
    let relay = InProcessRelay::start(&config).await;
    eventually("four dead events", DEADLINE, || async {
        database
            .rows()
            .await
            .iter()
            .filter(|row| row.status == "dead")
            .count()
            == 4
    })
    .await;
    broker.bind("orphan.#").await;

    let dead = |args: &[&str]| {
        let output = outbox_tests::run_binary(crate::RELAY, &settings, args);
        assert!(output.status.success(), "{output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let room_a = dead(&["dead", "list", "--json", "--room", "a"]);
    assert_eq!(room_a.lines().count(), 1, "{room_a}");
    assert!(
        room_a.contains("\"event_id\":\"a1\"") && room_a.contains("unroutable"),
        "{room_a}"
    );
    let created = dead(&["dead", "list", "--json", "--event-type", "orphan.created"]);
    assert_eq!(created.lines().count(), 3, "{created}");

    assert!(dead(&["dead", "requeue", "--event-id", "a1"]).contains("requeued 1"));
    broker.wait_for(2, DEADLINE).await;
    assert!(dead(&["dead", "requeue", "--room", "b"]).contains("requeued 2"));
    broker.wait_for(4, DEADLINE).await;
    assert!(dead(&["dead", "requeue", "--all"]).contains("requeued 1"));
    let received = ids(&broker.wait_for(5, DEADLINE).await);
    relay.stop().await;
    assert_eq!(
        received,
        ["a2", "a1", "b1", "b2", "c1"],
        "requeued rooms in order"
    );
    for row in database.rows().await {
        assert_eq!(row.status, "published", "{}", row.event_id);
    }
    broker.close().await;
    database.drop_table().await;
}
