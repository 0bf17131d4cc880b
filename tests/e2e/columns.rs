//! Column mapping and adoption of existing tables: a Debezium-shaped table and the
//! original worker's table migrated and relayed in place, `plan` changing nothing,
//! `check_columns` naming the setting and the column, and tables of the old migration
//! path left as they are.

use chrono::{Duration as TimeDelta, Utc};
use outbox_core::{
    ClaimRequest, InsertFeed, MarkBatch, Ordering, OutboxRecord, OutboxStore, PurgeTarget,
};
use outbox_store::{ColumnName, Columns, Error, SeaOrmStore};
use outbox_tests::producer_table::{uuid, ProducerTable as Fixture};
use outbox_tests::{per_backend, Backend, TestDatabase};
use sea_orm::DbBackend;
use std::collections::BTreeMap;
use std::time::Duration;

/// A store on the fixture's table with `columns`, checked.
async fn checked_store(fixture: &Fixture, columns: Columns) -> SeaOrmStore {
    let mut store = SeaOrmStore::new(fixture.database.db().clone(), fixture.table.clone())
        .with_columns(columns);
    store
        .check_columns()
        .await
        .expect("the mapping fits the migrated table");
    store
}

fn name(column: &str) -> ColumnName {
    ColumnName::parse(column).unwrap()
}

fn claim_all() -> ClaimRequest {
    ClaimRequest {
        node_id: "n1".into(),
        limit: 100,
        lease: Duration::from_secs(30),
        ordering: Ordering::PerRoom,
        max_bytes: None,
        floor: None,
    }
}

/// The event ids of each key, in claim order.
fn per_key(claimed: &[OutboxRecord]) -> BTreeMap<&str, Vec<&str>> {
    let mut keys: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for record in claimed {
        keys.entry(&record.key).or_default().push(&record.event_id);
    }
    keys
}

/// Marks every claimed row published.
async fn publish(store: &SeaOrmStore, claimed: &[OutboxRecord]) {
    let batch = MarkBatch {
        published: claimed.iter().map(|record| record.id).collect(),
        ..MarkBatch::default()
    };
    store.mark("n1", &batch).await.expect("outcomes recorded");
}

/// The Debezium-shaped mapping: `id` the event id, `type`, `aggregateid` the key, `payload`;
/// a new `seq` column (SQLite: the rowid) the position, a new `created_at`.
fn debezium_columns(backend: DbBackend) -> Columns {
    Columns {
        position: name(if backend == DbBackend::Sqlite {
            "rowid"
        } else {
            "seq"
        }),
        event_id: name("id"),
        event_type: name("type"),
        key: name("aggregateid"),
        payload: name("payload"),
        headers: None,
        created_at: name("created_at"),
        extra: Vec::new(),
    }
}

/// Creates the Debezium-shaped table (uuid / CHAR(36) / TEXT id; jsonb / JSON / BLOB
/// payload).
async fn create_debezium(fixture: &Fixture) {
    fixture
        .execute(match fixture.backend() {
            DbBackend::Postgres => {
                "CREATE TABLE {t} (id UUID PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL, \
                 aggregateid VARCHAR(255) NOT NULL, type VARCHAR(255) NOT NULL, payload JSONB)"
            }
            DbBackend::MySql => {
                "CREATE TABLE {t} (id CHAR(36) NOT NULL PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL, \
                 aggregateid VARCHAR(255) NOT NULL, type VARCHAR(255) NOT NULL, payload JSON)"
            }
            DbBackend::Sqlite => {
                "CREATE TABLE {t} (id TEXT PRIMARY KEY, aggregatetype TEXT NOT NULL, \
                 aggregateid TEXT NOT NULL, type TEXT NOT NULL, payload BLOB)"
            }
        })
        .await;
}

/// Inserts a Debezium row as a producer does (its own columns only).
async fn insert_debezium(fixture: &Fixture, id: &str, key: &str, payload: &str) {
    fixture
        .execute(&format!(
            "INSERT INTO {{t}} (id, aggregatetype, aggregateid, type, payload) \
             VALUES ('{id}', 'room', '{key}', 'room.renamed', {payload})"
        ))
        .await;
}

async fn relays_a_debezium_table_in_place(backend: Backend) {
    let fixture = Fixture::new(backend, "cols").await;
    create_debezium(&fixture).await;
    let json = |text: &str| match fixture.backend() {
        DbBackend::Sqlite => format!("X'{}'", hex(text.as_bytes())),
        _ => format!("'{text}'"),
    };
    // Before migrating: ids in the order of inserts (MySQL numbers existing rows by
    // primary key when it adds the position column).
    let before = [
        (uuid(1, '1'), "a", json(r#"{"n": 1,"b":[1,2]}"#)),
        (uuid(2, '2'), "b", json(r#"{"n":2}"#)),
        (uuid(3, '3'), "a", json(r#"{"n":3, "text":"héllo"}"#)),
    ];
    for (id, key, payload) in &before {
        insert_debezium(&fixture, id, key, payload).await;
    }
    let columns = debezium_columns(fixture.backend());
    let applied = outbox_store::migrate_columns(fixture.database.db(), &fixture.table, &columns)
        .await
        .expect("the table is adopted");
    // PostgreSQL: the nine migrations and the online finish (rows numbered, indexes
    // built concurrently); elsewhere the nine (lowering the fillfactor, dropping the
    // index of every row by key and the insert trigger's changes do nothing there).
    let expected = if fixture.backend() == DbBackend::Postgres {
        10
    } else {
        9
    };
    assert_eq!(applied.len(), expected, "{applied:?}");
    // After: ids in no particular order; SQLite also gets a payload that is no UTF-8.
    let mut after = vec![
        (uuid(4, 'f'), "a", json(r#"{"n":4}"#)),
        (uuid(5, '0'), "b", json(r#"{"n":5}"#)),
        (uuid(6, '9'), "a", json(r#"{"n":6}"#)),
    ];
    if fixture.backend() == DbBackend::Sqlite {
        after.push((uuid(7, '5'), "b", "X'00FF7B7D'".to_owned()));
    }
    // Above a MiB: PostgreSQL reads the jsonb's text in pieces.
    let big = format!(r#"{{"n":8,"text":"{}"}}"#, "é".repeat(600_000));
    after.push((uuid(8, 'e'), "a", json(&big)));
    for (id, key, payload) in &after {
        insert_debezium(&fixture, id, key, payload).await;
    }
    let store = checked_store(&fixture, columns).await;

    let claimed = store.claim(&claim_all()).await.expect("the claim works");
    let inserted: Vec<_> = before.iter().chain(&after).collect();
    assert_eq!(claimed.len(), inserted.len());
    let mut expected: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (id, key, _) in &inserted {
        expected.entry(key).or_default().push(id);
    }
    assert_eq!(per_key(&claimed), expected, "each key in insert order");
    for record in &claimed {
        assert_eq!(
            record.envelope,
            fixture.payload_of(&record.event_id).await,
            "{}: payload bytes",
            record.event_id
        );
        assert_eq!(record.event_type, "room.renamed");
        assert_eq!(record.headers, None);
        assert_eq!(record.retry_count, 0);
        let age = Utc::now() - record.created_at;
        assert!(
            age < TimeDelta::minutes(10) && age > TimeDelta::minutes(-10),
            "{}: created_at {} is the insert's or the migration's time",
            record.event_id,
            record.created_at
        );
    }
    if fixture.backend() == DbBackend::Postgres {
        let first = claimed.iter().find(|r| r.event_id == uuid(1, '1')).unwrap();
        assert_eq!(
            first.envelope, br#"{"b": [1, 2], "n": 1}"#,
            "jsonb: the text PostgreSQL gives"
        );
    }

    // Outcomes, counts, the probe and retention work on the mapped columns.
    publish(&store, &claimed).await;
    assert!(
        store.claim(&claim_all()).await.unwrap().is_empty(),
        "all published"
    );
    let stats = store.stats().await.unwrap();
    assert_eq!(stats.published, inserted.len() as u64);
    assert_eq!(stats.pending, 0);
    assert_eq!(store.backlog().await.unwrap().pending, 0);
    let mut probe =
        outbox_store::wake::probe::MaxIdProbe::new(store.clone(), Duration::from_millis(10));
    probe.wait().await.expect("MAX(position) reads");
    let purged = store
        .purge(
            PurgeTarget::Published,
            Utc::now() + TimeDelta::hours(1),
            100,
        )
        .await
        .expect("retention works");
    assert_eq!(purged, inserted.len() as u64);
    fixture.finish().await;
}

per_backend!(relays_a_debezium_table_in_place: postgres, mariadb, sqlite);

/// The original worker's table, as its repository writes it (nearest types per backend).
async fn create_original(fixture: &Fixture) {
    fixture
        .execute(outbox_tests::database::original_worker_table(
            fixture.backend(),
        ))
        .await;
    let now = match fixture.backend() {
        DbBackend::Postgres => "now()",
        DbBackend::MySql => "CURRENT_TIMESTAMP(6)",
        DbBackend::Sqlite => "CURRENT_TIMESTAMP",
    };
    fixture
        .execute(
            "INSERT INTO {t} (event_id, event_type, room_id, envelope) VALUES ('w1', 'room.created', 'r1', '{\"n\":1}')",
        )
        .await;
    fixture
        .execute(
            "INSERT INTO {t} (event_id, event_type, room_id, envelope, retry_count, last_error) \
             VALUES ('w2', 'room.renamed', 'r1', '{\"n\":2}', 2, 'broker down')",
        )
        .await;
    fixture
        .execute(&format!(
            "INSERT INTO {{t}} (event_id, event_type, room_id, envelope, status, published_at) \
             VALUES ('w3', 'room.renamed', 'r2', '{{\"n\":3}}', 'published', {now})"
        ))
        .await;
    fixture
        .execute(
            "INSERT INTO {t} (event_id, event_type, room_id, envelope) VALUES ('w4', 'room.closed', 'r2', '{\"n\":4}')",
        )
        .await;
}

async fn adopts_the_original_workers_table(backend: Backend) {
    let fixture = Fixture::new(backend, "cols").await;
    create_original(&fixture).await;
    let applied =
        outbox_store::migrate_columns(fixture.database.db(), &fixture.table, &Columns::default())
            .await
            .expect("the table is adopted");
    // PostgreSQL: the nine migrations and the online finish (rows numbered, indexes
    // built concurrently); elsewhere the nine (lowering the fillfactor, dropping the
    // index of every row by key and the insert trigger's changes do nothing there).
    let expected = if fixture.backend() == DbBackend::Postgres {
        10
    } else {
        9
    };
    assert_eq!(applied.len(), expected, "{applied:?}");
    let store = checked_store(&fixture, Columns::default()).await;
    let stats = store.stats().await.unwrap();
    assert_eq!(
        (stats.pending, stats.published),
        (3, 1),
        "published rows stay published"
    );

    let claimed = store.claim(&claim_all()).await.unwrap();
    let ids: Vec<&str> = claimed.iter().map(|r| r.event_id.as_str()).collect();
    assert_eq!(
        ids,
        ["w1", "w2", "w4"],
        "pending rows in id order, never w3"
    );
    assert!(claimed.windows(2).all(|pair| pair[0].id < pair[1].id));
    let retries: Vec<i32> = claimed.iter().map(|r| r.retry_count).collect();
    assert_eq!(retries, [0, 2, 0], "retry counts kept");
    assert_eq!(claimed[0].envelope, br#"{"n":1}"#);
    publish(&store, &claimed).await;
    assert!(store.claim(&claim_all()).await.unwrap().is_empty());
    assert_eq!(store.stats().await.unwrap().published, 4);
    let again =
        outbox_store::migrate_columns(fixture.database.db(), &fixture.table, &Columns::default())
            .await
            .unwrap();
    assert!(again.is_empty(), "nothing left to do: {again:?}");
    fixture.finish().await;
}

per_backend!(adopts_the_original_workers_table: postgres, mariadb, sqlite);

async fn plan_lists_the_changes_and_makes_none(backend: Backend) {
    let fixture = Fixture::new(backend, "cols").await;
    create_debezium(&fixture).await;
    insert_debezium(&fixture, &uuid(1, '1'), "a", "'{}'").await;
    let columns = debezium_columns(fixture.backend());
    let before = fixture.shape_of(fixture.table.as_str()).await;
    let steps = outbox_store::plan(fixture.database.db(), &fixture.table, &columns)
        .await
        .expect("a plan");
    let names: Vec<&str> = steps.iter().map(|step| step.name).collect();
    let expected = if fixture.backend() == DbBackend::Postgres {
        10
    } else {
        9
    };
    assert_eq!(names.len(), expected, "{names:?}");
    let adopt = steps[0].statements.join("\n");
    let t = &fixture.table;
    for column in [
        "status",
        "retry_count",
        "available_at",
        "locked_by",
        "published_at",
        "created_at",
    ] {
        assert!(
            adopt.contains(&format!("ALTER TABLE {t} ADD COLUMN {column} ")),
            "{column} missing from {adopt}"
        );
    }
    if fixture.backend() != DbBackend::Sqlite {
        assert!(
            adopt.contains(&format!("ALTER TABLE {t} ADD COLUMN seq ")),
            "{adopt}"
        );
    }
    assert!(!adopt.contains("DROP"), "{adopt}");
    assert_eq!(
        fixture.shape_of(t.as_str()).await,
        before,
        "the table is unchanged"
    );
    assert!(
        fixture
            .shape_of(&format!("{t}_migrations"))
            .await
            .is_empty(),
        "no migrations table"
    );

    let applied = outbox_store::migrate_columns(fixture.database.db(), t, &columns)
        .await
        .unwrap();
    assert_eq!(applied, names, "migrate runs what plan listed");
    let steps = outbox_store::plan(fixture.database.db(), t, &columns)
        .await
        .unwrap();
    assert!(steps.is_empty(), "nothing left: {steps:?}");
    fixture.finish().await;
}

per_backend!(plan_lists_the_changes_and_makes_none: postgres, mariadb, sqlite);

async fn check_columns_names_the_setting_and_the_column(backend: Backend) {
    let fixture = Fixture::new(backend, "cols").await;
    let store = || SeaOrmStore::new(fixture.database.db().clone(), fixture.table.clone());
    let columns = debezium_columns(fixture.backend());

    let mut absent = store().with_columns(columns.clone());
    match absent.check_columns().await {
        Err(Error::NoTable(table)) => assert_eq!(table, fixture.table),
        other => panic!("expected NoTable, got {other:?}"),
    }
    create_debezium(&fixture).await;
    let mut unmigrated = store().with_columns(columns.clone());
    let error = unmigrated.check_columns().await.unwrap_err();
    assert!(matches!(error, Error::NotMigrated { .. }), "{error:?}");
    assert!(
        error.to_string().contains("run `outbox-relay migrate`"),
        "{error}"
    );

    outbox_store::migrate_columns(fixture.database.db(), &fixture.table, &columns)
        .await
        .unwrap();
    let wrong = Columns {
        key: name("aggregate_id"),
        position: name("aggregatetype"),
        ..columns
    };
    let mut mapped = store().with_columns(wrong);
    let error = mapped.check_columns().await.unwrap_err();
    let Error::Mapping { table, problems } = &error else {
        panic!("expected Mapping, got {error:?}");
    };
    assert_eq!(table, &fixture.table);
    assert_eq!(problems.len(), 2, "{problems:?}");
    let text = error.to_string();
    let t = &fixture.table;
    assert!(
        text.contains(&format!(
            "columns.key: column \"aggregate_id\" does not exist in table {t}"
        )),
        "{text}"
    );
    assert!(
        text.contains("columns.position: column \"aggregatetype\" is ")
            && text.contains("needs an integer column"),
        "{text}"
    );
    fixture.finish().await;
}

per_backend!(check_columns_names_the_setting_and_the_column: postgres, mariadb, sqlite);

async fn tables_of_the_old_migration_path_are_left_alone(backend: Backend) {
    // TestDatabase migrates its table with `outbox_store::migrate`.
    let database = TestDatabase::new(backend).await;
    let before = outbox_store::plan(database.db(), &database.table, &Columns::default())
        .await
        .unwrap();
    assert!(before.is_empty(), "{before:?}");
    let applied =
        outbox_store::migrate_columns(database.db(), &database.table, &Columns::default())
            .await
            .unwrap();
    assert!(applied.is_empty(), "nothing applied: {applied:?}");
    let mut store = database.store.clone();
    store
        .check_columns()
        .await
        .expect("the default mapping fits");
    outbox_tests::seed(&database, &[outbox_tests::event("d1", "r")]).await;
    let claimed = store.claim(&claim_all()).await.unwrap();
    assert_eq!(claimed[0].envelope, br#"{"id":"d1"}"#);
    database.drop_table().await;
}

per_backend!(tables_of_the_old_migration_path_are_left_alone: postgres, mariadb, sqlite);

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02X}")).collect()
}

/// MySQL cannot index a TEXT key without a prefix: `migrate` says so, naming the setting,
/// and changes nothing.
async fn a_text_key_on_mysql_is_refused_by_name(backend: Backend) {
    let fixture = Fixture::new(backend, "cols").await;
    fixture
        .execute(
            "CREATE TABLE {t} (id CHAR(36) NOT NULL PRIMARY KEY, aggregateid TEXT NOT NULL, \
             type VARCHAR(255) NOT NULL, payload LONGTEXT)",
        )
        .await;
    let before = fixture.shape_of(fixture.table.as_str()).await;
    let columns = debezium_columns(fixture.backend());
    let error = outbox_store::migrate_columns(fixture.database.db(), &fixture.table, &columns)
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("columns.key: column \"aggregateid\" is a TEXT or BLOB column"),
        "{text}"
    );
    assert_eq!(
        fixture.shape_of(fixture.table.as_str()).await,
        before,
        "nothing added"
    );
    fixture.finish().await;
}

per_backend!(a_text_key_on_mysql_is_refused_by_name: mariadb);

/// The table's storage parameters (`pg_class.reloptions`), sorted.
async fn reloptions(
    db: &sea_orm::DatabaseConnection,
    table: &outbox_store::TableName,
) -> Vec<String> {
    use sea_orm::{ConnectionTrait, Statement};
    let sql = format!(
        "SELECT COALESCE(array_to_string(reloptions, ','), '') AS options FROM pg_class \
         WHERE oid = '{table}'::regclass"
    );
    let options: String = db
        .query_one(Statement::from_string(DbBackend::Postgres, sql))
        .await
        .expect("pg_class readable")
        .expect("the table exists")
        .try_get("", "options")
        .unwrap();
    let mut options: Vec<String> = options
        .split(',')
        .filter(|option| !option.is_empty())
        .map(str::to_owned)
        .collect();
    options.sort();
    options
}

/// The autovacuum parameters as `reloptions` lists them.
fn autovacuum_options() -> Vec<String> {
    outbox_store::migration::AUTOVACUUM_PARAMETERS
        .iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect()
}

const AUTOVACUUM_STEP: &str = "m20261203_000005_set_room_outbox_autovacuum";

#[actix_rt::test]
async fn postgres_autovacuum_parameters_are_set_on_new_adopted_and_earlier_tables_once() {
    // A new table (TestDatabase migrates it).
    let database = TestDatabase::new(Backend::Postgres).await;
    let (db, t) = (database.db(), &database.table);
    let options = reloptions(db, t).await;
    for option in autovacuum_options() {
        assert!(
            options.contains(&option),
            "{option} missing from {options:?}"
        );
    }
    assert!(options.contains(&"fillfactor=45".to_owned()), "{options:?}");
    // Migrating again changes nothing.
    let again = outbox_store::migrate(db, t).await.unwrap();
    assert!(again.is_empty(), "{again:?}");
    assert_eq!(reloptions(db, t).await, options);

    // A table migrated by a build from before this step: the step, and only it, is due;
    // `migrate --dry-run` (plan) shows its statement, and changes nothing.
    let names: Vec<String> = outbox_store::migration::AUTOVACUUM_PARAMETERS
        .iter()
        .map(|(name, _)| name.to_string())
        .collect();
    database
        .execute(&format!("ALTER TABLE {{t}} RESET ({})", names.join(", ")))
        .await;
    database
        .execute(&format!(
            "DELETE FROM {{t}}_migrations WHERE name = '{AUTOVACUUM_STEP}'"
        ))
        .await;
    let steps = outbox_store::plan(db, t, &Columns::default())
        .await
        .unwrap();
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!(steps[0].name, AUTOVACUUM_STEP);
    assert_eq!(
        steps[0].statements,
        [format!(
            "ALTER TABLE {t} SET (autovacuum_vacuum_scale_factor = 0, \
             autovacuum_vacuum_threshold = 10000, autovacuum_vacuum_insert_scale_factor = 0, \
             autovacuum_vacuum_insert_threshold = 10000, autovacuum_vacuum_cost_limit = 2000, \
             autovacuum_vacuum_cost_delay = 2)"
        )]
    );
    assert_eq!(
        reloptions(db, t).await,
        ["fillfactor=45"],
        "plan changed nothing"
    );
    let applied = outbox_store::migrate(db, t).await.unwrap();
    assert_eq!(applied, [AUTOVACUUM_STEP]);
    assert_eq!(reloptions(db, t).await, options);
    database.drop_table().await;

    // An adopted table: the original worker's.
    let fixture = Fixture::new(Backend::Postgres, "cols").await;
    create_original(&fixture).await;
    let (db, t) = (fixture.database.db(), &fixture.table);
    assert!(reloptions(db, t).await.is_empty());
    outbox_store::migrate_columns(db, t, &Columns::default())
        .await
        .expect("the table is adopted");
    let options = reloptions(db, t).await;
    for option in autovacuum_options() {
        assert!(
            options.contains(&option),
            "{option} missing from {options:?}"
        );
    }
    fixture.finish().await;
}
