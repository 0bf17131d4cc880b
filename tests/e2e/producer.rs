//! The producer side: `enqueue` inside the service's own transaction, the plain SQL INSERT
//! of the docs for producers in other languages, and the trace context they carry.

use outbox_store::{enqueue, NewEvent};
use outbox_tests::{per_backend, Backend, TestApp, TestDatabase};
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr, Statement, TransactionTrait};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(30);
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
/// Vendor entries as a tracer writes them: commas, `=`, spaces, a `@` in a key.
const TRACESTATE: &str = "congo=t61rcWkgMzE, rojo@vendor=00f067aa0ba902b7";

/// The service's own `rooms` table, next to the test's outbox table.
async fn create_rooms(database: &TestDatabase) -> String {
    let rooms = format!("{}_rooms", database.table);
    database
        .execute(&format!(
            "CREATE TABLE {rooms} (id VARCHAR(64) NOT NULL PRIMARY KEY, name VARCHAR(255) NOT NULL)"
        ))
        .await;
    database
        .execute(&format!(
            "INSERT INTO {rooms} (id, name) VALUES ('room-1', 'Planning')"
        ))
        .await;
    rooms
}

async fn room_name(database: &TestDatabase, rooms: &str) -> String {
    let row = database
        .db()
        .query_one(Statement::from_string(
            database.backend(),
            format!("SELECT name FROM {rooms} WHERE id = 'room-1'"),
        ))
        .await
        .expect("rooms readable")
        .expect("room-1 exists");
    row.try_get("", "name").expect("a name")
}

/// What the room service does: change the room and enqueue the event, in `txn`.
async fn rename(
    txn: &DatabaseTransaction,
    database: &TestDatabase,
    rooms: &str,
    name: &str,
) -> Result<String, DbErr> {
    txn.execute_unprepared(&format!(
        "UPDATE {rooms} SET name = '{name}' WHERE id = 'room-1'"
    ))
    .await?;
    let envelope = format!(r#"{{"room_id":"room-1","name":"{name}"}}"#);
    enqueue(
        txn,
        &database.table,
        NewEvent::new("room.renamed", "room-1", envelope)
            .with_headers([("traceparent", TRACEPARENT)]),
    )
    .await
    .map_err(DbErr::from)
}

async fn enqueue_commits_and_rolls_back_with_the_callers_transaction(backend: Backend) {
    let mut app = TestApp::on(backend).binding("room.#").build().await;
    let database = &app.database;
    let rooms = create_rooms(database).await;

    let txn = database.db().begin().await.unwrap();
    let abandoned = rename(&txn, database, &rooms, "Abandoned").await.unwrap();
    txn.rollback().await.unwrap();
    assert!(
        database.rows().await.is_empty(),
        "a rolled-back transaction leaves no event"
    );
    assert_eq!(room_name(database, &rooms).await, "Planning");

    let txn = database.db().begin().await.unwrap();
    let event_id = rename(&txn, database, &rooms, "Release").await.unwrap();
    txn.commit().await.unwrap();
    assert_ne!(event_id, abandoned, "every event gets its own id");
    assert_eq!(room_name(database, &rooms).await, "Release");

    app.start().await;
    let received = app.broker.wait_for(1, DEADLINE).await;
    app.database.wait_all_published(DEADLINE).await;
    app.stop().await;
    let message = &received[0];
    assert_eq!(
        message.message_id, event_id,
        "enqueue returned the AMQP message_id"
    );
    assert_eq!(message.kind, "room.renamed");
    assert_eq!(message.body, br#"{"room_id":"room-1","name":"Release"}"#);
    assert_eq!(message.header("traceparent").as_deref(), Some(TRACEPARENT));
    let rows = app.database.rows().await;
    assert_eq!(rows.len(), 1, "only the committed event exists");
    assert_eq!(rows[0].event_id, event_id);
    app.database.execute(&format!("DROP TABLE {rooms}")).await;
    app.teardown().await;
}

per_backend!(enqueue_commits_and_rolls_back_with_the_callers_transaction: postgres, sqlite, mariadb);

/// The docs' INSERT for producers in other languages; the same text on every backend.
async fn traceparent_in_a_rows_headers_arrives_in_the_amqp_headers(backend: Backend) {
    let mut app = TestApp::on(backend).binding("room.#").build().await;
    let database = &app.database;
    let headers = serde_json::json!({
        "traceparent": TRACEPARENT,
        "tracestate": TRACESTATE,
        "tenant": "acme",
    })
    .to_string();
    let values: Vec<String> = vec![
        "ev-traced".into(),
        "room.topic.changed".into(),
        "room-42".into(),
        r#"{"room_id":"room-42","topic":"Release planning"}"#.into(),
        headers,
    ];
    let placeholders = match backend {
        Backend::Postgres => "$1, $2, $3, $4, $5",
        _ => "?, ?, ?, ?, ?",
    };
    database
        .db()
        .execute(Statement::from_sql_and_values(
            database.backend(),
            format!(
                "INSERT INTO {} (event_id, event_type, room_id, envelope, headers) VALUES ({placeholders})",
                database.table
            ),
            values.into_iter().map(sea_orm::Value::from).collect::<Vec<_>>(),
        ))
        .await
        .expect("the plain INSERT works");
    let untraced = NewEvent::new("room.topic.changed", "room-43", "{}");
    outbox_tests::seed(database, std::slice::from_ref(&untraced)).await;

    app.start().await;
    let received = app.broker.wait_for(2, DEADLINE).await;
    app.stop().await;
    let traced = received
        .iter()
        .find(|message| message.message_id == "ev-traced")
        .expect("the traced event arrived");
    assert_eq!(traced.header("traceparent").as_deref(), Some(TRACEPARENT));
    assert_eq!(traced.header("tracestate").as_deref(), Some(TRACESTATE));
    assert_eq!(traced.header("tenant").as_deref(), Some("acme"));
    assert_eq!(traced.header("room_id").as_deref(), Some("room-42"));
    let plain = received
        .iter()
        .find(|message| message.message_id == untraced.event_id)
        .expect("the untraced event arrived");
    assert_eq!(plain.header("traceparent"), None);
    assert_eq!(plain.header("tracestate"), None);
    app.teardown().await;
}

per_backend!(traceparent_in_a_rows_headers_arrives_in_the_amqp_headers: postgres, sqlite, mariadb);
