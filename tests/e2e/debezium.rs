//! A Debezium-shaped outbox used the way a team coming from Debezium's outbox event router
//! would, through the real binary: routing by `aggregatetype` with the real `type` kept,
//! extra columns as typed AMQP headers and a per-row content type, a mapping changed after
//! adoption, and placeholders or header columns naming no column refused with exit code 2.

use lapin::types::AMQPValue;
use outbox_relay::settings::{HeaderColumnSettings, Settings};
use outbox_tests::output::{stderr, succeeded};
use outbox_tests::producer_table::{uuid, ProducerTable as Fixture};
use outbox_tests::{
    eventually, per_backend, test_settings, Backend, Received, RelayProcess, SettingsFile,
    TestBroker, TestDatabase,
};
use sea_orm::DbBackend;
use std::collections::HashSet;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);

/// 2026-01-02T03:04:05Z, the `occurred_at` of every row.
const OCCURRED: u64 = 1_767_323_045;

async fn create_table(fixture: &Fixture) {
    fixture
        .execute(match fixture.backend() {
            DbBackend::Postgres => {
                "CREATE TABLE {t} (id UUID PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL, \
                 aggregateid VARCHAR(255) NOT NULL, type VARCHAR(255) NOT NULL, payload JSONB NOT NULL, \
                 tenant_id VARCHAR(64) NULL, attempt INTEGER NULL, urgent BOOLEAN NULL, \
                 occurred_at TIMESTAMPTZ NULL, trace_id UUID NULL, ctype VARCHAR(64) NULL)"
            }
            DbBackend::MySql => {
                "CREATE TABLE {t} (id CHAR(36) NOT NULL PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL, \
                 aggregateid VARCHAR(255) NOT NULL, type VARCHAR(255) NOT NULL, payload JSON NOT NULL, \
                 tenant_id VARCHAR(64) NULL, attempt INT NULL, urgent BOOLEAN NULL, \
                 occurred_at TIMESTAMP(6) NULL DEFAULT NULL, trace_id UUID NULL, ctype VARCHAR(64) NULL)"
            }
            DbBackend::Sqlite => {
                "CREATE TABLE {t} (id TEXT PRIMARY KEY, aggregatetype TEXT NOT NULL, \
                 aggregateid TEXT NOT NULL, type TEXT NOT NULL, payload TEXT NOT NULL, \
                 tenant_id TEXT NULL, attempt INTEGER NULL, urgent BOOLEAN NULL, \
                 occurred_at DATETIME NULL, trace_id TEXT NULL, ctype TEXT NULL)"
            }
        })
        .await;
}

/// One row: event id, aggregate type, aggregate id, event type, attempt, urgent, and a
/// content type (NULL when `None`).
struct Row {
    id: String,
    aggregate: &'static str,
    key: &'static str,
    kind: &'static str,
    attempt: i64,
    urgent: bool,
    ctype: Option<&'static str>,
}

fn row(n: u8, aggregate: &'static str, key: &'static str, kind: &'static str) -> Row {
    Row {
        id: uuid(n, char::from(b'a' + n % 6)),
        aggregate,
        key,
        kind,
        attempt: i64::from(n) * 10,
        urgent: n.is_multiple_of(2),
        ctype: n.is_multiple_of(3).then_some("application/vnd.order+json"),
    }
}

fn trace_id(n: u8) -> String {
    uuid(n, '7')
}

async fn insert(fixture: &Fixture, n: u8, row: &Row) {
    let occurred = match fixture.backend() {
        DbBackend::Postgres => format!("to_timestamp({OCCURRED})"),
        DbBackend::MySql => format!("FROM_UNIXTIME({OCCURRED})"),
        DbBackend::Sqlite => "'2026-01-02 03:04:05.000'".to_owned(),
    };
    let urgent = match (fixture.backend(), row.urgent) {
        (DbBackend::Postgres, flag) => flag.to_string(),
        (_, flag) => i32::from(flag).to_string(),
    };
    let ctype = row.ctype.map_or("NULL".to_owned(), |c| format!("'{c}'"));
    fixture
        .execute(&format!(
            "INSERT INTO {{t}} (id, aggregatetype, aggregateid, type, payload, tenant_id, attempt, \
             urgent, occurred_at, trace_id, ctype) VALUES ('{}', '{}', '{}', '{}', '{{\"n\":{n}}}', \
             'acme', {}, {urgent}, {occurred}, '{}', {ctype})",
            row.id,
            row.aggregate,
            row.key,
            row.kind,
            row.attempt,
            trace_id(n)
        ))
        .await;
}

fn typed(column: &str, kind: &str) -> HeaderColumnSettings {
    HeaderColumnSettings::Typed {
        column: column.into(),
        kind: kind.into(),
    }
}

fn debezium_settings(fixture: &Fixture, broker: &TestBroker) -> Settings {
    fixture.debezium_settings(broker, |settings| {
        // Debezium's route.by.field = aggregatetype, route.topic.replacement =
        // outbox.event.${routedByValue}.
        settings.amqp.routing_key = "outbox.event.{aggregatetype}".into();
        settings.amqp.content_type = "application/json".into();
        settings.amqp.content_type_column = "ctype".into();
        settings.amqp.header_columns = [
            (
                "tenant".to_owned(),
                HeaderColumnSettings::Column("tenant_id".into()),
            ),
            ("attempt".to_owned(), typed("attempt", "integer")),
            ("urgent".to_owned(), typed("urgent", "boolean")),
            ("occurred".to_owned(), typed("occurred_at", "timestamp")),
            ("trace".to_owned(), typed("trace_id", "uuid")),
            ("aggregate_type".to_owned(), typed("aggregatetype", "text")),
        ]
        .into_iter()
        .collect();
    })
}

/// Waits until every one of `ids` arrived; every delivery so far.
async fn wait_for_ids(broker: &TestBroker, ids: &[String]) -> Vec<Received> {
    eventually(
        &format!("each of {} events delivered", ids.len()),
        DEADLINE,
        || async {
            let arrived: HashSet<String> = broker
                .received()
                .into_iter()
                .map(|message| message.message_id)
                .collect();
            ids.iter().all(|id| arrived.contains(id))
        },
    )
    .await;
    broker.received()
}

async fn routes_by_aggregatetype_with_typed_header_columns_and_a_changed_mapping(backend: Backend) {
    let fixture = Fixture::new(backend, "dbz").await;
    let broker = TestBroker::new("outbox.event.#").await;
    create_table(&fixture).await;
    let rows = [
        row(1, "order", "o-1", "OrderCreated"),
        row(2, "customer", "c-1", "CustomerRegistered"),
        row(3, "order", "o-1", "OrderPaid"),
    ];
    insert(&fixture, 1, &rows[0]).await;
    let mut settings = debezium_settings(&fixture, &broker);
    let file = SettingsFile::write(&settings);
    succeeded("migrate", &file.run(crate::RELAY, &["migrate"]));
    insert(&fixture, 2, &rows[1]).await;
    insert(&fixture, 3, &rows[2]).await;

    let relay = file.spawn(crate::RELAY, "debezium-routes");
    let ids: Vec<String> = rows.iter().map(|row| row.id.clone()).collect();
    let received = wait_for_ids(&broker, &ids).await;
    relay.stop(DEADLINE).await;
    for (n, row) in (1u8..).zip(&rows) {
        let message = received
            .iter()
            .find(|message| message.message_id == row.id)
            .unwrap();
        let what = &row.id;
        assert_eq!(
            message.routing_key,
            format!("outbox.event.{}", row.aggregate),
            "{what}: routed by aggregatetype"
        );
        assert_eq!(message.kind, row.kind, "{what}: the real type kept");
        assert_eq!(message.header("aggregate_id").as_deref(), Some(row.key));
        assert_eq!(message.header("tenant").as_deref(), Some("acme"));
        assert_eq!(
            message.header("aggregate_type").as_deref(),
            Some(row.aggregate)
        );
        assert_eq!(
            message.headers.get("attempt"),
            Some(&AMQPValue::LongLongInt(row.attempt)),
            "{what}: integer header"
        );
        assert_eq!(
            message.headers.get("urgent"),
            Some(&AMQPValue::Boolean(row.urgent)),
            "{what}: boolean header"
        );
        assert_eq!(
            message.headers.get("occurred"),
            Some(&AMQPValue::Timestamp(OCCURRED)),
            "{what}: timestamp header"
        );
        assert_eq!(
            message.header("trace").as_deref(),
            Some(trace_id(n).as_str()),
            "{what}: UUID header, canonical text"
        );
        assert_eq!(
            message.content_type,
            row.ctype.unwrap_or("application/json"),
            "{what}: the row's content type, else the outbox's"
        );
    }

    // The mapping changes after adoption: a headers column the table lacks.
    settings.database.columns.headers = "hdrs".into();
    let file = SettingsFile::write(&settings);
    let plan = succeeded(
        "migrate --dry-run",
        &file.run(crate::RELAY, &["migrate", "--dry-run"]),
    );
    let t = &fixture.table;
    assert!(
        plan.contains(&format!("ALTER TABLE {t} ADD COLUMN hdrs ")),
        "the plan adds the newly mapped column:\n{plan}"
    );
    succeeded("migrate", &file.run(crate::RELAY, &["migrate"]));
    assert!(
        fixture
            .columns_of(t.as_str())
            .await
            .contains(&"hdrs".to_owned()),
        "migrate added hdrs"
    );
    let again = succeeded(
        "migrate --dry-run",
        &file.run(crate::RELAY, &["migrate", "--dry-run"]),
    );
    assert!(again.contains("nothing to do"), "{again}");
    let late = row(4, "order", "o-2", "OrderShipped");
    insert(&fixture, 4, &late).await;
    fixture
        .execute(&format!(
            "UPDATE {{t}} SET hdrs = '{{\"source\":\"shop\"}}' WHERE id = '{}'",
            late.id
        ))
        .await;
    let relay = file.spawn(crate::RELAY, "debezium-changed");
    let received = wait_for_ids(&broker, std::slice::from_ref(&late.id)).await;
    relay.stop(DEADLINE).await;
    let message = received
        .iter()
        .find(|message| message.message_id == late.id)
        .unwrap();
    assert_eq!(message.header("source").as_deref(), Some("shop"));
    assert_eq!(message.routing_key, "outbox.event.order");
    broker.close().await;
    fixture.finish().await;
}

per_backend!(routes_by_aggregatetype_with_typed_header_columns_and_a_changed_mapping: postgres, mariadb, sqlite);

/// Asserts exit code 2 and an error naming each of `names`.
fn refused(what: &str, code: Option<i32>, text: &str, names: &[&str]) {
    assert_eq!(code, Some(2), "{what}: exit code; output:\n{text}");
    for name in names {
        assert!(text.contains(name), "{what}: {name} not named in:\n{text}");
    }
}

async fn placeholders_and_header_columns_naming_no_column_exit_2(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let broker = TestBroker::new("#").await;
    let settings = test_settings(&database, &broker, |settings| {
        settings.amqp.routing_key = "rooms.{tenant}".into();
        settings.amqp.header_columns = [(
            "trace".to_owned(),
            HeaderColumnSettings::Column("trace_col".into()),
        )]
        .into_iter()
        .collect();
    });
    let file = SettingsFile::write(&settings);
    let names = [
        "column \"tenant\" does not exist",
        "header_columns.trace: column \"trace_col\" does not exist",
        "its columns: id, event_id, event_type, room_id",
    ];
    let checked = file.run(crate::RELAY, &["check-config"]);
    refused(
        "check-config",
        checked.status.code(),
        &stderr(&checked),
        &names,
    );
    let mut relay: RelayProcess = file.spawn(crate::RELAY, "bad-placeholder");
    let status = relay.wait(DEADLINE).await;
    refused("run", status.code(), &relay.log_text(), &names);
    let _ = std::fs::remove_file(&relay.log);
    broker.close().await;
    database.drop_table().await;
}

per_backend!(placeholders_and_header_columns_naming_no_column_exit_2: postgres, mariadb, sqlite);
