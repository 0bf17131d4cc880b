//! Every event arrives once, byte for byte, with the message properties of
//! `docs/design/publishing.md`, in room order.

use lapin::types::{AMQPValue, FieldArray, FieldTable};
use outbox_tests::{
    event, per_backend, room_events, seed, Backend, Received, RelayProcess, TestApp,
};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

async fn delivers_10k_events_once_in_room_order(backend: Backend) {
    let events = 10_000;
    let seeded = room_events("ev", events, 100);
    let mut app = TestApp::on(backend)
        .settings(|settings| settings.relay.publishers = 4)
        .seeded(&seeded)
        .spawn()
        .await;
    app.broker.wait_for(events, Duration::from_secs(180)).await;
    app.stop().await;
    // Settled, so a duplicate arriving after the count reached `events` is seen too.
    let received = app.broker.drain(Duration::from_secs(30)).await;

    // Exactly once.
    assert_eq!(received.len(), events, "no duplicates");
    let by_id: HashMap<&str, &Received> = received
        .iter()
        .map(|r| (r.message_id.as_str(), r))
        .collect();
    assert_eq!(by_id.len(), events, "every event id once");

    // Byte for byte, with the contract's properties and headers.
    let rows = app.database.rows().await;
    assert_eq!(rows.len(), seeded.len(), "a row per event");
    let node_id = &app.config.relay.node_id;
    for (event, row) in seeded.iter().zip(&rows) {
        assert_eq!(row.event_id, event.event_id);
        let message = by_id[event.event_id.as_str()];
        assert_eq!(
            message.body,
            event.envelope.as_bytes(),
            "{}: body",
            event.event_id
        );
        assert_eq!(message.kind, event.event_type);
        assert_eq!(
            message.routing_key, event.event_type,
            "default routing key template"
        );
        assert_eq!(message.content_type, "application/json");
        assert_eq!(message.delivery_mode, 2);
        assert_eq!(message.app_id, "outbox-relay");
        assert_eq!(message.timestamp, row.created_at.timestamp() as u64);
        assert_eq!(
            message.header("room_id").as_deref(),
            Some(event.room_id.as_str())
        );
        assert_eq!(message.int_header("outbox_id"), Some(row.id));
        assert_eq!(message.int_header("retry_count"), Some(0));
        assert_eq!(message.header("node_id").as_ref(), Some(node_id));
        if let Some(headers) = &event.headers {
            let extra: BTreeMap<String, String> = serde_json::from_str(headers).unwrap();
            for (key, value) in extra {
                assert_eq!(
                    message.header(&key),
                    Some(value),
                    "{}: header {key}",
                    event.event_id
                );
            }
        } else {
            assert_eq!(message.header("tenant"), None);
        }
        // Every row published, with published_at, and no lease left.
        assert_eq!(row.status, "published", "{}", row.event_id);
        assert!(row.published_at.is_some(), "{}: published_at", row.event_id);
        assert_eq!(row.locked_by, None, "{}: still locked", row.event_id);
        assert_eq!(row.locked_until, None);
    }

    // Per room, the consumer saw ids in increasing order.
    let mut last: HashMap<String, i64> = HashMap::new();
    for message in &received {
        let room = message.header("room_id").unwrap();
        let id = message.int_header("outbox_id").unwrap();
        if let Some(previous) = last.insert(room.clone(), id) {
            assert!(previous < id, "room {room}: {id} arrived after {previous}");
        }
    }
    app.teardown().await;
}

per_backend!(delivers_10k_events_once_in_room_order: postgres, sqlite, mariadb);

/// The `headers` column's JSON keeps its types in the AMQP headers; a value AMQP cannot
/// carry makes its row dead at once, naming the header, and its room flows on.
async fn headers_arrive_with_their_json_types(backend: Backend) {
    let typed = r#"{"prio":5,"ok":true,"gone":null,"nested":{"a":1},"list":[1,"x"],
                    "ratio":1.5,"tenant":"t1"}"#;
    let mut events = vec![
        event("typed", "h1"),
        event("too-big", "h2"),
        event("after", "h2"),
    ];
    events[0].headers = Some(typed.into());
    events[1].headers = Some(r#"{"ok":true,"big":18446744073709551615}"#.into());
    let mut app = TestApp::on(backend).seeded(&events).spawn().await;
    app.broker.wait_for(2, Duration::from_secs(30)).await;
    app.stop().await;
    let received = app.broker.drain(Duration::from_secs(30)).await;
    assert_eq!(
        received.len(),
        2,
        "typed and after, once each: {received:?}"
    );
    let by_id: HashMap<&str, &Received> = received
        .iter()
        .map(|r| (r.message_id.as_str(), r))
        .collect();
    assert_eq!(by_id.len(), 2, "typed and after, once each: {received:?}");
    let headers = &by_id["typed"].headers;
    assert_eq!(headers.get("prio"), Some(&AMQPValue::LongLongInt(5)));
    assert_eq!(headers.get("ok"), Some(&AMQPValue::Boolean(true)));
    assert_eq!(headers.get("gone"), None, "null drops the header");
    assert_eq!(headers.get("ratio"), Some(&AMQPValue::Double(1.5)));
    assert_eq!(by_id["typed"].header("tenant").as_deref(), Some("t1"));
    let mut nested = FieldTable::default();
    nested.insert("a".into(), AMQPValue::LongLongInt(1));
    assert_eq!(headers.get("nested"), Some(&AMQPValue::FieldTable(nested)));
    let mut list = FieldArray::default();
    list.push(AMQPValue::LongLongInt(1));
    list.push(AMQPValue::LongString("x".into()));
    assert_eq!(headers.get("list"), Some(&AMQPValue::FieldArray(list)));
    assert_eq!(
        by_id["typed"].int_header("outbox_id"),
        Some(app.database.row("typed").await.id),
        "the relay's own headers beside the row's"
    );
    assert_eq!(app.database.row("typed").await.status, "published");
    assert_eq!(app.database.row("after").await.status, "published");
    let dead = app.database.row("too-big").await;
    assert_eq!(dead.status, "dead", "an integer AMQP cannot carry");
    let error = dead.last_error.unwrap_or_default();
    assert!(
        error.starts_with(
            "cannot be published: headers column: header \"big\" is 18446744073709551615"
        ),
        "{error}"
    );
    app.teardown().await;
}

per_backend!(headers_arrive_with_their_json_types: postgres, sqlite, mariadb);

#[actix_rt::test]
async fn postgres_wake_ups_deliver_without_waiting_for_the_poll() {
    let mut app = TestApp::on(Backend::Postgres)
        .settings(|settings| settings.relay.poll_interval = "60s".into())
        .seeded(&room_events("before", 1, 1))
        .spawn()
        .await;
    // The first tick delivers this one; after it, only a wake-up can trigger a claim.
    app.broker.wait_for(1, Duration::from_secs(10)).await;
    let inserted = std::time::Instant::now();
    seed(&app.database, &room_events("after", 1, 1)).await;
    app.broker.wait_for(2, Duration::from_secs(10)).await;
    let waited = inserted.elapsed();
    app.stop().await;
    // A wake-up's bound on an idle relay (docs/design/tests.md), far below the 60 s poll.
    outbox_tests::assert_within(
        "insert → delivery by a wake-up, not the poll",
        waited,
        Duration::from_secs(1),
    );
    app.teardown().await;
}

/// A producer's transaction that took its id before a backlog and commits while the relay
/// drains it, its claims starting at a scan floor above that id (docs/design/claim-plans.md#the-scan-floor: the late row is delivered, and before the row its room gets after it. The
/// relay runs as a process with the Fetcher's debug log, whose `claimed` lines give the
/// floor each claim started from, so the test knows the floor passed the late row.
#[actix_rt::test]
async fn postgres_a_late_commit_below_the_scan_floor_keeps_its_room_order() {
    use sea_orm::{ConnectionTrait as _, TransactionTrait as _};
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.relay.batch_size = 20;
            settings.log.format = "json".into();
            settings.log.level = "info,outbox_pipeline::fetcher=debug".into();
        })
        .build()
        .await;
    let late = event("late-1", "room-late");
    let txn = app.database.db().begin().await.unwrap();
    outbox_store::insert_events(&txn, &app.database.table, std::slice::from_ref(&late))
        .await
        .unwrap();
    let late_id: i64 = txn
        .query_one(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            format!(
                "SELECT id FROM {} WHERE event_id = 'late-1'",
                app.database.table
            ),
        ))
        .await
        .unwrap()
        .expect("late-1 in its transaction")
        .try_get_by_index(0)
        .unwrap();
    let backlog = room_events("backlog", 6_000, 40);
    seed(&app.database, &backlog).await;
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    // A quarter delivered, and a claim has started from a floor above late-1's id.
    app.broker.wait_for(1_500, Duration::from_secs(60)).await;
    let floors: Vec<i64> = relay
        .log_lines("claimed")
        .iter()
        .filter_map(|line| line["floor"].as_i64())
        .collect();
    assert!(
        floors.iter().any(|floor| *floor > late_id),
        "no claim started from a floor above late-1 (id {late_id}): floors {floors:?}"
    );
    txn.commit().await.unwrap();
    let next = event("late-2", "room-late");
    seed(&app.database, std::slice::from_ref(&next)).await;
    app.broker
        .wait_for(backlog.len() + 2, Duration::from_secs(60))
        .await;
    relay.stop(Duration::from_secs(30)).await;
    let received = app.broker.drain(Duration::from_secs(30)).await;
    let position = |id: &str| {
        received
            .iter()
            .position(|r| r.message_id == id)
            .unwrap_or_else(|| panic!("{id} not delivered"))
    };
    assert!(
        position("late-1") < position("late-2"),
        "late-2 overtook late-1 in their room"
    );
    assert_eq!(received.len(), backlog.len() + 2, "no duplicates");
    app.teardown().await;
}
