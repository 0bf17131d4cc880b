//! Existing tables and several outboxes through the real binary: a Debezium-shaped table
//! planned (`migrate --dry-run`), adopted (`migrate`) and relayed (`run`); two outboxes in
//! one process, one stuck and one draining; bad mappings refused with exit code 2; the
//! original worker's table taken over without sending its published rows again; on a new
//! table, `migrate` applying exactly the steps its dry run lists.

use outbox_relay::settings::{OutboxColumnsSettings, OutboxSettings, Settings};
use outbox_store::{insert_events, NewEvent, OutboxRow, TableName};
use outbox_tests::output::{stderr, succeeded};
use outbox_tests::producer_table::{uuid, ProducerTable as Fixture};
use outbox_tests::{
    assert_every_event_delivered, eventually, own_room_events, per_backend, run_binary, seed,
    test_settings, unique_name, Backend, Received, RelayProcess, SettingsFile, TestBroker,
    TestDatabase, TestEvent,
};
use sea_orm::{DbBackend, FromQueryResult, Statement};
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);

/// How many rows of the fixture's table are not `published`.
async fn unpublished(fixture: &Fixture) -> usize {
    fixture
        .texts(
            "SELECT status FROM {t} WHERE status <> 'published'",
            "status",
        )
        .await
        .len()
}

/// Waits until every one of `ids` arrived at `broker` at least once; every delivery so far.
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

/// The first delivery of each message id, in arrival order.
fn first_deliveries(received: &[Received]) -> Vec<&Received> {
    let mut seen = HashSet::new();
    received
        .iter()
        .filter(|message| seen.insert(message.message_id.clone()))
        .collect()
}

/// The message ids of each value of the header `key_header`, in order of first arrival.
fn ids_per_key(received: &[Received], key_header: &str) -> BTreeMap<String, Vec<String>> {
    let mut keys: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for message in first_deliveries(received) {
        let key = message
            .header(key_header)
            .unwrap_or_else(|| panic!("{}: no {key_header} header", message.message_id));
        keys.entry(key)
            .or_default()
            .push(message.message_id.clone());
    }
    keys
}

/// A row of the Debezium-shaped table: event id, key, type, payload as inserted.
struct DebeziumRow {
    id: String,
    key: &'static str,
    kind: &'static str,
    payload: &'static str,
}

fn debezium(
    n: u8,
    fill: char,
    key: &'static str,
    kind: &'static str,
    payload: &'static str,
) -> DebeziumRow {
    DebeziumRow {
        id: uuid(n, fill),
        key,
        kind,
        payload,
    }
}

async fn insert_debezium(fixture: &Fixture, row: &DebeziumRow) {
    let payload = row.payload.replace('\'', "''");
    fixture
        .execute(&format!(
            "INSERT INTO {{t}} (id, aggregatetype, aggregateid, type, payload) \
             VALUES ('{}', 'order', '{}', '{}', '{payload}')",
            row.id, row.key, row.kind
        ))
        .await;
}

async fn dry_run_migrate_and_run_relay_a_debezium_table(backend: Backend) {
    let fixture = Fixture::new(backend, "adopt").await;
    let broker = TestBroker::new("#").await;
    fixture
        .execute(match fixture.backend() {
            DbBackend::Postgres => {
                "CREATE TABLE {t} (id UUID PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL, \
                 aggregateid VARCHAR(255) NOT NULL, type VARCHAR(255) NOT NULL, payload JSONB NOT NULL)"
            }
            DbBackend::MySql => {
                "CREATE TABLE {t} (id CHAR(36) NOT NULL PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL, \
                 aggregateid VARCHAR(255) NOT NULL, type VARCHAR(255) NOT NULL, payload JSON NOT NULL)"
            }
            DbBackend::Sqlite => {
                "CREATE TABLE {t} (id TEXT PRIMARY KEY, aggregatetype TEXT NOT NULL, \
                 aggregateid TEXT NOT NULL, type TEXT NOT NULL, payload TEXT NOT NULL)"
            }
        })
        .await;
    // Rows the producer wrote before the relay came: event ids in insert order.
    let before = [
        debezium(
            1,
            '1',
            "o-1",
            "order.created",
            r#"{"n": 1,"lines":[1,2], "note":"l'été"}"#,
        ),
        debezium(2, '2', "o-2", "order.created", r#"{"n":2}"#),
        debezium(3, '3', "o-1", "order.paid", r#"{"n":3, "text":"héllo"}"#),
    ];
    for row in &before {
        insert_debezium(&fixture, row).await;
    }
    let t = fixture.table.clone();
    let settings = fixture.debezium_settings(&broker, |_| {});
    let file = SettingsFile::write(&settings);

    let shape = fixture.columns_of(t.as_str()).await;
    let plan = succeeded(
        "migrate --dry-run",
        &file.run(crate::RELAY, &["migrate", "--dry-run"]),
    );
    let mut added = outbox_store::columns::BOOKKEEPING.to_vec();
    added.push("created_at");
    if backend != Backend::Sqlite {
        added.push("seq");
    }
    for column in added {
        assert!(
            plan.contains(&format!("ALTER TABLE {t} ADD COLUMN {column} ")),
            "the plan adds {column}:\n{plan}"
        );
    }
    assert!(
        !plan.contains("DROP COLUMN") && !plan.contains("DROP TABLE"),
        "{plan}"
    );
    assert_eq!(
        fixture.columns_of(t.as_str()).await,
        shape,
        "--dry-run changes no column"
    );
    assert!(
        fixture
            .columns_of(&format!("{t}_migrations"))
            .await
            .is_empty(),
        "--dry-run records no migration"
    );

    let migrated = succeeded("migrate", &file.run(crate::RELAY, &["migrate"]));
    assert!(migrated.contains(&format!("to table {t}")), "{migrated}");
    let columns = fixture.columns_of(t.as_str()).await;
    assert_eq!(
        columns[..shape.len()],
        shape[..],
        "the producer's columns stay as they were"
    );
    assert!(columns.contains(&"status".to_owned()), "{columns:?}");
    let again = succeeded(
        "migrate --dry-run",
        &file.run(crate::RELAY, &["migrate", "--dry-run"]),
    );
    assert!(again.contains("nothing to do"), "{again}");

    // Rows written after the adoption: event ids in no particular order.
    let after = [
        debezium(4, 'f', "o-2", "order.paid", r#"{"n":4}"#),
        debezium(5, '0', "o-1", "order.shipped", r#"{"n":5}"#),
        debezium(6, '9', "o-3", "order.created", r#"{"n":6}"#),
        debezium(7, '5', "o-2", "order.shipped", r#"{"n":7}"#),
    ];
    for row in &after {
        insert_debezium(&fixture, row).await;
    }
    let relay = file.spawn(crate::RELAY, "debezium");
    let rows: Vec<&DebeziumRow> = before.iter().chain(&after).collect();
    let ids: Vec<String> = rows.iter().map(|row| row.id.clone()).collect();
    let received = wait_for_ids(&broker, &ids).await;

    let mut expected: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for row in &rows {
        expected
            .entry(row.key.to_owned())
            .or_default()
            .push(row.id.clone());
    }
    assert_eq!(
        ids_per_key(&received, "aggregate_id"),
        expected,
        "each key in insert order"
    );
    for row in &rows {
        let message = received
            .iter()
            .find(|message| message.message_id == row.id)
            .unwrap();
        assert_eq!(
            message.body,
            fixture.payload_of(&row.id).await,
            "{}: body",
            row.id
        );
        assert_eq!(message.kind, row.kind, "{}: type", row.id);
        assert_eq!(message.routing_key, row.kind, "{}: routing key", row.id);
        assert_eq!(message.header("aggregate_id").as_deref(), Some(row.key));
        assert_eq!(
            message.header("room_id"),
            None,
            "{}: the key goes in aggregate_id only",
            row.id
        );
        assert_eq!(message.int_header("retry_count"), Some(0));
        assert!(message
            .int_header("outbox_id")
            .is_some_and(|position| position > 0));
    }
    if backend == Backend::Postgres {
        let first = received
            .iter()
            .find(|m| m.message_id == uuid(1, '1'))
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&first.body),
            r#"{"n": 1, "note": "l'été", "lines": [1, 2]}"#,
            "jsonb: the text PostgreSQL prints"
        );
    } else {
        assert_eq!(
            rows[0].payload.as_bytes(),
            fixture.payload_of(&rows[0].id).await,
            "stored as written"
        );
    }
    eventually("every row published", DEADLINE, || async {
        unpublished(&fixture).await == 0
    })
    .await;
    relay.stop(DEADLINE).await;
    broker.close().await;
    fixture.finish().await;
}

per_backend!(dry_run_migrate_and_run_relay_a_debezium_table: postgres, mariadb, sqlite);

/// Every row of `table` in `database`, by id.
async fn rows_of(database: &TestDatabase, table: &TableName) -> Vec<OutboxRow> {
    let sql = format!("SELECT * FROM {table} ORDER BY id");
    OutboxRow::find_by_statement(Statement::from_string(database.backend(), sql))
        .all(database.db())
        .await
        .expect("rows readable")
}

async fn row_of(database: &TestDatabase, table: &TableName, event_id: &str) -> OutboxRow {
    rows_of(database, table)
        .await
        .into_iter()
        .find(|row| row.event_id == event_id)
        .unwrap_or_else(|| panic!("no row {event_id} in {table}"))
}

/// The value of `metric` labelled `outbox="<outbox>"` in Prometheus text.
fn sample(text: &str, metric: &str, outbox: &str) -> Option<f64> {
    let label = format!("outbox=\"{outbox}\"");
    text.lines()
        .filter(|line| line.starts_with(&format!("{metric}{{")) && line.contains(&label))
        .find_map(|line| line.rsplit_once(' ')?.1.parse().ok())
}

/// Runs `args` with `file` and parses the JSON it prints.
fn json_of(file: &SettingsFile, args: &[&str]) -> serde_json::Value {
    let output = file.run(crate::RELAY, args);
    let text = succeeded(&args.join(" "), &output);
    serde_json::from_str(&text).unwrap_or_else(|error| panic!("{args:?}: {error}: {text}"))
}

async fn one_process_relays_two_outboxes_and_a_stuck_one_holds_back_only_itself(backend: Backend) {
    // Outbox "rooms": the test database's table; outbox "orders": a second table beside it.
    let database = TestDatabase::new(backend).await;
    let orders = TableName::parse(&unique_name("e2e_orders")).unwrap();
    outbox_store::migrate(database.db(), &orders)
        .await
        .expect("migrated");
    let rooms_broker = TestBroker::new("#").await;
    let orders_broker = TestBroker::new("#").await;

    let room_events = own_room_events("rooms", 40, 4);
    seed(&database, &room_events).await;
    let mut poison = outbox_tests::event("poison", "poisoned");
    poison.headers = Some("[1, 2]".into());
    let held = [
        outbox_tests::event("held-1", "held").of_type("doomed.created"),
        outbox_tests::event("held-2", "held"),
        outbox_tests::event("held-3", "held"),
    ];
    let flowing = own_room_events("orders", 20, 2);
    let mut order_events: Vec<NewEvent> = held.to_vec();
    order_events.push(poison);
    order_events.extend(flowing.iter().cloned());
    insert_events(database.db(), &orders, &order_events)
        .await
        .expect("inserted");

    let missing_exchange = unique_name("e2e.missing");
    let settings = test_settings(&database, &orders_broker, |settings| {
        // The missing exchange must stay missing.
        settings.amqp.declare_exchange = false;
        settings.relay.retry_interval = "100ms".into();
        // Port 0: the system picks one, which the JSON log names.
        settings.metrics.listen = "127.0.0.1:0".into();
        settings.log.format = "json".into();
        settings.outboxes = vec![
            OutboxSettings {
                name: "rooms".into(),
                table: database.table.as_str().into(),
                exchange: rooms_broker.exchange.clone(),
                ..OutboxSettings::default()
            },
            OutboxSettings {
                name: "orders".into(),
                table: orders.as_str().into(),
                routes: Some(vec![outbox_relay::settings::RouteSettings {
                    event_type: "doomed.created".into(),
                    exchange: missing_exchange.clone(),
                    routing_key: None,
                    ..Default::default()
                }]),
                ..OutboxSettings::default()
            },
        ];
    });
    let file = SettingsFile::write(&settings);
    let relay = file.spawn(crate::RELAY, "two-outboxes");

    let received = rooms_broker.wait_for_each(&room_events, DEADLINE).await;
    assert_every_event_delivered(&received, &room_events);
    database.wait_all_published(DEADLINE).await;
    let received = orders_broker.wait_for_each(&flowing, DEADLINE).await;
    assert_every_event_delivered(&received, &flowing);
    eventually("poison dead and held-1 failing twice", DEADLINE, || async {
        row_of(&database, &orders, "poison").await.status == "dead"
            && row_of(&database, &orders, "held-1").await.retry_count >= 2
    })
    .await;

    let poisoned = row_of(&database, &orders, "poison").await;
    assert!(
        poisoned
            .last_error
            .as_deref()
            .unwrap_or_default()
            .contains("headers column"),
        "{:?}",
        poisoned.last_error
    );
    let failing = row_of(&database, &orders, "held-1").await;
    assert_eq!(failing.status, "pending");
    assert!(failing.last_error.is_some(), "held-1 failed");
    for id in ["held-2", "held-3"] {
        let row = row_of(&database, &orders, id).await;
        assert_eq!(
            (row.status.as_str(), row.retry_count),
            ("pending", 0),
            "{id} is held back"
        );
    }
    let everything: Vec<Received> = rooms_broker
        .received()
        .into_iter()
        .chain(orders_broker.received())
        .collect();
    for id in ["held-1", "held-2", "held-3", "poison"] {
        assert!(
            everything.iter().all(|message| message.message_id != id),
            "{id} was delivered"
        );
    }
    assert!(
        rooms_broker
            .received()
            .iter()
            .all(|m| m.message_id.starts_with("rooms-")),
        "the rooms exchange got only rooms' events"
    );

    let orders_status = json_of(&file, &["status", "--json", "--outbox", "orders"]);
    assert_eq!(orders_status["outbox"], "orders", "{orders_status}");
    assert_eq!(orders_status["table"], orders.as_str(), "{orders_status}");
    assert_eq!(orders_status["dead"], 1, "{orders_status}");
    assert_eq!(
        orders_status["pending"], 3,
        "the held room: {orders_status}"
    );
    assert_eq!(orders_status["published"], 20, "{orders_status}");

    let all = json_of(&file, &["status", "--json"]);
    assert_eq!(all["pending"], 3, "{all}");
    assert_eq!(all["dead"], 1, "{all}");
    assert_eq!(all["published"], 60, "{all}");
    assert_eq!(all["outboxes"]["rooms"]["published"], 40, "{all}");
    assert_eq!(all["outboxes"]["rooms"]["pending"], 0, "{all}");
    assert_eq!(all["outboxes"]["orders"]["dead"], 1, "{all}");
    assert_eq!(all["outboxes"]["orders"]["pending"], 3, "{all}");
    assert_eq!(all["outboxes"]["orders"]["table"], orders.as_str(), "{all}");

    let dead = succeeded(
        "dead list",
        &file.run(
            crate::RELAY,
            &["dead", "list", "--json", "--outbox", "orders"],
        ),
    );
    assert_eq!(dead.lines().count(), 1, "{dead}");
    assert!(dead.contains("\"event_id\":\"poison\""), "{dead}");
    let none = succeeded(
        "dead list",
        &file.run(
            crate::RELAY,
            &["dead", "list", "--json", "--outbox", "rooms"],
        ),
    );
    assert_eq!(none.lines().count(), 0, "{none}");

    // Each outbox counts under its own label.
    let address = relay.metrics_address().await;
    let scraped = std::cell::RefCell::new(String::new());
    eventually(
        "the published counters of both outboxes",
        DEADLINE,
        || async {
            let text = outbox_tests::http_get(address, "/metrics").await.1;
            let counted = sample(&text, "outbox_events_published_total", "rooms") == Some(40.0)
                && sample(&text, "outbox_events_published_total", "orders") == Some(20.0);
            *scraped.borrow_mut() = text;
            counted
        },
    )
    .await;
    let text = scraped.into_inner();
    assert_eq!(
        sample(&text, "outbox_events_dead_total", "orders"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "outbox_events_dead_total", "rooms"),
        Some(0.0),
        "{text}"
    );

    relay.stop(DEADLINE).await;
    rooms_broker.close().await;
    orders_broker.close().await;
    database.drop_outbox(&orders).await;
    database.drop_table().await;
}

per_backend!(one_process_relays_two_outboxes_and_a_stuck_one_holds_back_only_itself: postgres, mariadb, sqlite);

/// Asserts exit code 2 and an error naming each of `names`.
fn refused(what: &str, code: Option<i32>, text: &str, names: &[&str]) {
    assert_eq!(code, Some(2), "{what}: exit code; output:\n{text}");
    for name in names {
        assert!(text.contains(name), "{what}: {name} not named in:\n{text}");
    }
}

/// `check-config` and `run` with `settings` (environment) exit 2 naming `names`.
async fn single_outbox_refused(settings: &Settings, names: &[&str]) {
    let checked = run_binary(crate::RELAY, settings, &["check-config"]);
    refused(
        "check-config",
        checked.status.code(),
        &stderr(&checked),
        names,
    );
    let mut relay = RelayProcess::spawn(crate::RELAY, settings);
    let status = relay.wait(DEADLINE).await;
    refused("run", status.code(), &relay.log_text(), names);
    let _ = std::fs::remove_file(&relay.log);
}

/// `check-config` and `run` with `file` exit 2 naming `names`.
async fn listed_outbox_refused(file: &SettingsFile, names: &[&str]) {
    let checked = file.run(crate::RELAY, &["check-config"]);
    refused(
        "check-config",
        checked.status.code(),
        &stderr(&checked),
        names,
    );
    let mut relay = file.spawn(crate::RELAY, "bad-mapping");
    let status = relay.wait(DEADLINE).await;
    let log = relay.log_text();
    refused("run", status.code(), &log, names);
    assert!(
        !log.contains("outbox fine:"),
        "the good outbox is not blamed:\n{log}"
    );
    let _ = std::fs::remove_file(&relay.log);
}

async fn bad_mappings_exit_2_naming_the_outbox_the_setting_and_the_column(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let other = TableName::parse(&unique_name("e2e_other")).unwrap();
    outbox_store::migrate(database.db(), &other)
        .await
        .expect("migrated");
    let broker = TestBroker::new("#").await;
    seed(&database, &[outbox_tests::event("kept", "r")]).await;
    // A producer's text column of its own, which a mapping may wrongly name as the position.
    for table in [&database.table, &other] {
        database
            .execute(&format!(
                "ALTER TABLE {table} ADD COLUMN label VARCHAR(32) NULL"
            ))
            .await;
    }
    let t = database.table.clone();

    // The one outbox of database.table, from the environment.
    let missing = test_settings(&database, &broker, |settings| {
        settings.database.columns.key = "aggregate_id".into();
    });
    single_outbox_refused(
        &missing,
        &[
            &format!("outbox {t}"),
            "columns.key",
            "\"aggregate_id\"",
            "does not exist",
        ],
    )
    .await;
    let text_position = test_settings(&database, &broker, |settings| {
        settings.database.columns.position = "label".into();
    });
    single_outbox_refused(
        &text_position,
        &[
            &format!("outbox {t}"),
            "columns.position",
            "\"label\"",
            "integer",
        ],
    )
    .await;

    // An [[outboxes]] entry beside a good one, from a file.
    let listed = |columns: OutboxColumnsSettings| {
        test_settings(&database, &broker, |settings| {
            settings.outboxes = vec![
                OutboxSettings {
                    name: "fine".into(),
                    table: t.as_str().into(),
                    ..OutboxSettings::default()
                },
                OutboxSettings {
                    name: "orders".into(),
                    table: other.as_str().into(),
                    columns,
                    ..OutboxSettings::default()
                },
            ];
        })
    };
    let file = SettingsFile::write(&listed(OutboxColumnsSettings {
        key: Some("aggregate_id".into()),
        ..OutboxColumnsSettings::default()
    }));
    listed_outbox_refused(
        &file,
        &[
            "outbox orders",
            "columns.key",
            "\"aggregate_id\"",
            "does not exist",
        ],
    )
    .await;
    let file = SettingsFile::write(&listed(OutboxColumnsSettings {
        position: Some("label".into()),
        ..OutboxColumnsSettings::default()
    }));
    listed_outbox_refused(
        &file,
        &["outbox orders", "columns.position", "\"label\"", "integer"],
    )
    .await;

    let kept = database.row("kept").await;
    assert_eq!(
        (kept.status.as_str(), kept.retry_count),
        ("pending", 0),
        "nothing touched"
    );
    broker.close().await;
    database.drop_outbox(&other).await;
    database.drop_table().await;
}

per_backend!(bad_mappings_exit_2_naming_the_outbox_the_setting_and_the_column: postgres, mariadb, sqlite);

/// The original worker's table, as its repository writes it (nearest types per backend),
/// with rows it published, rows it never tried and rows it retried.
async fn create_original(fixture: &Fixture) {
    fixture
        .execute(outbox_tests::database::original_worker_table(
            fixture.backend(),
        ))
        .await;
    // (event id, room, status, retry count)
    let rows = [
        ("w1", "r1", "published", 0),
        ("w2", "r1", "pending", 2),
        ("w3", "r2", "published", 1),
        ("w4", "r1", "pending", 0),
        ("w5", "r2", "pending", 2),
        ("w6", "r2", "pending", 0),
        ("w7", "r3", "pending", 0),
    ];
    for (id, room, status, retries) in rows {
        let (last_error, published_at) = match (status, retries) {
            ("published", _) => ("NULL", "'2024-05-06 07:08:09'"),
            (_, 0) => ("NULL", "NULL"),
            _ => ("'broker down'", "NULL"),
        };
        fixture
            .execute(&format!(
                "INSERT INTO {{t}} (event_id, event_type, room_id, envelope, status, retry_count, \
                 last_error, published_at) VALUES ('{id}', 'room.renamed', '{room}', \
                 '{{\"id\":\"{id}\"}}', '{status}', {retries}, {last_error}, {published_at})"
            ))
            .await;
    }
}

/// `published_at` of `event_id` as text, as the database prints it.
async fn published_at(fixture: &Fixture, event_id: &str) -> Option<String> {
    let expr = match fixture.backend() {
        DbBackend::Postgres => "published_at::text",
        DbBackend::MySql => "CAST(published_at AS CHAR)",
        DbBackend::Sqlite => "published_at",
    };
    fixture
        .texts(
            &format!("SELECT {expr} AS p FROM {{t}} WHERE event_id = '{event_id}'"),
            "p",
        )
        .await
        .remove(0)
}

async fn the_original_workers_table_sends_only_what_it_had_not_sent(backend: Backend) {
    let fixture = Fixture::new(backend, "adopt").await;
    let broker = TestBroker::new("#").await;
    create_original(&fixture).await;
    let published_before = [
        published_at(&fixture, "w1").await,
        published_at(&fixture, "w3").await,
    ];
    assert!(published_before.iter().all(Option::is_some));
    let t = fixture.table.clone();
    let settings = test_settings(&fixture.database, &broker, |settings| {
        settings.database.table = t.as_str().to_owned();
    });

    let migrated = succeeded(
        "migrate",
        &run_binary(crate::RELAY, &settings, &["migrate"]),
    );
    assert!(migrated.contains(&format!("to table {t}")), "{migrated}");
    let relay = RelayProcess::spawn(crate::RELAY, &settings);
    let pending: Vec<String> = ["w2", "w4", "w5", "w6", "w7"].map(String::from).to_vec();
    wait_for_ids(&broker, &pending).await;
    eventually("every row published", DEADLINE, || async {
        unpublished(&fixture).await == 0
    })
    .await;
    relay.stop(DEADLINE).await;

    // Everything, also what arrived while the relay was stopping.
    let received = broker.received();
    let per_room = ids_per_key(&received, "room_id");
    let expected: BTreeMap<String, Vec<String>> = [
        ("r1", vec!["w2", "w4"]),
        ("r2", vec!["w5", "w6"]),
        ("r3", vec!["w7"]),
    ]
    .into_iter()
    .map(|(room, ids)| (room.to_owned(), ids.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(
        per_room, expected,
        "exactly the pending rows, in id order per room"
    );
    for message in first_deliveries(&received) {
        let retries = if ["w2", "w5"].contains(&message.message_id.as_str()) {
            2
        } else {
            0
        };
        assert_eq!(
            message.int_header("retry_count"),
            Some(retries),
            "{}: retry_count kept",
            message.message_id
        );
        assert_eq!(
            message.body,
            format!(r#"{{"id":"{}"}}"#, message.message_id).into_bytes()
        );
    }
    assert_eq!(
        [
            published_at(&fixture, "w1").await,
            published_at(&fixture, "w3").await
        ],
        published_before,
        "published rows keep their published_at"
    );
    for (id, retries) in [("w1", 0), ("w3", 1)] {
        let row = row_of(&fixture.database, &fixture.table, id).await;
        assert_eq!(
            (row.status.as_str(), row.retry_count, row.locked_by),
            ("published", retries, None),
            "{id} was never claimed again"
        );
    }
    broker.close().await;
    fixture.finish().await;
}

per_backend!(the_original_workers_table_sends_only_what_it_had_not_sent: postgres, mariadb, sqlite);

/// The step names of `migrate --dry-run`'s output: each `-- name` line followed by its
/// `-- locks:` line (a statement may be a comment too).
fn planned_steps(plan: &str) -> Vec<String> {
    let lines: Vec<&str> = plan.lines().collect();
    lines
        .windows(2)
        .filter(|pair| pair[1].starts_with("-- locks: "))
        .filter_map(|pair| pair[0].strip_prefix("-- ").map(str::to_owned))
        .collect()
}

/// On a table that does not exist yet, `migrate --dry-run` lists exactly the steps
/// `migrate` then applies, and `migrate` creates no index twice: no server notice that one
/// exists already.
async fn migrate_applies_the_steps_its_dry_run_lists_on_a_new_table(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let table = TableName::parse(&unique_name("e2e_new")).expect("a table name");
    let mut settings = database.binary_settings();
    settings.database.table = table.as_str().to_owned();
    settings.log.format = "json".into();

    let output = run_binary(crate::RELAY, &settings, &["migrate", "--dry-run"]);
    let plan = succeeded("migrate --dry-run", &output);
    let planned = planned_steps(&plan);
    assert!(
        plan.contains(&format!("{} step(s) would run:", planned.len())),
        "the count is the steps listed:\n{plan}"
    );
    assert!(!planned.is_empty(), "{plan}");

    let output = run_binary(crate::RELAY, &settings, &["migrate"]);
    let migrated = succeeded("migrate", &output);
    let suffix = format!(" to table {table}");
    let applied: Vec<String> = migrated
        .lines()
        .filter_map(|line| line.strip_prefix("applied ")?.strip_suffix(suffix.as_str()))
        .map(str::to_owned)
        .collect();
    assert_eq!(applied, planned, "migrate:\n{migrated}\n--dry-run:\n{plan}");
    let log = stderr(&output);
    for notice in ["already exists", "skipping"] {
        assert!(
            !log.contains(notice),
            "a server notice ({notice:?}):\n{log}"
        );
    }

    let again = succeeded(
        "migrate --dry-run, after",
        &run_binary(crate::RELAY, &settings, &["migrate", "--dry-run"]),
    );
    assert!(again.contains("nothing to do"), "{again}");
    database.drop_outbox(&table).await;
    database.drop_table().await;
}

per_backend!(migrate_applies_the_steps_its_dry_run_lists_on_a_new_table: postgres, mariadb, sqlite);
