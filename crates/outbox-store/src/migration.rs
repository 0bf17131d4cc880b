//! Creates and upgrades the outbox table (DESIGN §2).
//!
//! Each migration has a name `mYYYYMMDD_NNNNNN_verb_table` and runs once per table;
//! applied names are kept in `<table>_migrations`. Statements are written per backend
//! because the nearest equivalent types differ (BIGSERIAL / INTEGER AUTOINCREMENT /
//! BIGINT AUTO_INCREMENT, TIMESTAMPTZ / DATETIME text / TIMESTAMP(6)) and partial
//! indexes exist only on PostgreSQL and SQLite.

use crate::sql::{Params, TableName};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, TransactionTrait,
};

/// One schema change.
struct Migration {
    name: &'static str,
    statements: fn(DbBackend, &str) -> Vec<String>,
}

/// Every migration, oldest first. Append; never edit one that has shipped.
const MIGRATIONS: &[Migration] = &[
    Migration {
        name: "m20261202_000001_create_room_outbox",
        statements: create_table,
    },
    Migration {
        name: "m20261202_000002_create_room_outbox_lock",
        statements: create_lock,
    },
    Migration {
        name: "m20261202_000003_create_room_outbox_notify",
        statements: create_notify,
    },
    Migration {
        name: "m20261202_000004_set_room_outbox_fillfactor",
        statements: set_fillfactor,
    },
];

/// PostgreSQL: leave a third of every new heap page free. A claim and a lease renewal
/// change only `locked_by` and `locked_until`, which no index covers, so with room on
/// the page PostgreSQL writes the new row version as a HOT update — no entry in any of
/// the six indexes. On full pages every claim paid for six index inserts per row.
/// Existing pages keep their layout until rewritten. InnoDB and SQLite update in place.
fn set_fillfactor(backend: DbBackend, t: &str) -> Vec<String> {
    if backend != DbBackend::Postgres {
        return Vec::new();
    }
    vec![format!("ALTER TABLE {t} SET (fillfactor = 70)")]
}

/// PostgreSQL: NOTIFY the channel named after the table once per INSERT statement (not
/// per row), delivered at commit; the relay LISTENs and claims at once. Other backends
/// keep polling.
fn create_notify(backend: DbBackend, t: &str) -> Vec<String> {
    if backend != DbBackend::Postgres {
        return Vec::new();
    }
    vec![
        format!(
            "CREATE OR REPLACE FUNCTION {t}_notify() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN PERFORM pg_notify('{t}', ''); RETURN NULL; END $$"
        ),
        format!("DROP TRIGGER IF EXISTS {t}_notify ON {t}"),
        format!(
            "CREATE TRIGGER {t}_notify AFTER INSERT ON {t} \
             FOR EACH STATEMENT EXECUTE FUNCTION {t}_notify()"
        ),
    ]
}

/// `<table>_lock`: one row whose row lock serialises per-room claims across nodes
/// (see `SeaOrmStore::take_claim_lock`). SQLite serialises writers by itself.
fn create_lock(_: DbBackend, t: &str) -> Vec<String> {
    vec![
        format!("CREATE TABLE IF NOT EXISTS {t}_lock (name VARCHAR(64) NOT NULL PRIMARY KEY)"),
        format!("INSERT INTO {t}_lock (name) VALUES ('claim')"),
    ]
}

fn create_table(backend: DbBackend, t: &str) -> Vec<String> {
    match backend {
        DbBackend::Postgres => vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                    id BIGSERIAL PRIMARY KEY,
                    event_id VARCHAR(64) NOT NULL UNIQUE,
                    event_type VARCHAR(255) NOT NULL,
                    room_id VARCHAR(255) NOT NULL,
                    envelope TEXT NOT NULL,
                    headers TEXT NULL,
                    status VARCHAR(16) NOT NULL DEFAULT 'pending',
                    retry_count INTEGER NOT NULL DEFAULT 0,
                    last_error VARCHAR(512) NULL,
                    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
                    available_at TIMESTAMPTZ NOT NULL DEFAULT now(),
                    locked_by VARCHAR(128) NULL,
                    locked_until TIMESTAMPTZ NULL,
                    published_at TIMESTAMPTZ NULL)"
            ),
            format!("CREATE INDEX IF NOT EXISTS {t}_pending_idx ON {t} (id) WHERE status = 'pending'"),
            format!("CREATE INDEX IF NOT EXISTS {t}_room_idx ON {t} (room_id, id)"),
            format!("CREATE INDEX IF NOT EXISTS {t}_retention_idx ON {t} (status, published_at)"),
            // Not in the contract list: keeps per-room claims cheap (see store.rs).
            format!("CREATE INDEX IF NOT EXISTS {t}_pending_room_idx ON {t} (room_id, id) WHERE status = 'pending'"),
        ],
        DbBackend::Sqlite => {
            let now = "(strftime('%Y-%m-%d %H:%M:%f', 'now'))";
            vec![
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        event_id VARCHAR(64) NOT NULL UNIQUE,
                        event_type VARCHAR(255) NOT NULL,
                        room_id VARCHAR(255) NOT NULL,
                        envelope TEXT NOT NULL,
                        headers TEXT NULL,
                        status VARCHAR(16) NOT NULL DEFAULT 'pending',
                        retry_count INTEGER NOT NULL DEFAULT 0,
                        last_error VARCHAR(512) NULL,
                        created_at DATETIME NOT NULL DEFAULT {now},
                        available_at DATETIME NOT NULL DEFAULT {now},
                        locked_by VARCHAR(128) NULL,
                        locked_until DATETIME NULL,
                        published_at DATETIME NULL)"
                ),
                format!("CREATE INDEX IF NOT EXISTS {t}_pending_idx ON {t} (id) WHERE status = 'pending'"),
                format!("CREATE INDEX IF NOT EXISTS {t}_room_idx ON {t} (room_id, id)"),
                format!("CREATE INDEX IF NOT EXISTS {t}_retention_idx ON {t} (status, published_at)"),
                // Not in the contract list: keeps per-room claims cheap (see store.rs).
                format!("CREATE INDEX IF NOT EXISTS {t}_pending_room_idx ON {t} (room_id, id) WHERE status = 'pending'"),
            ]
        }
        // TIMESTAMP(6) is stored in UTC whatever a producer's session time zone is.
        DbBackend::MySql => vec![format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
                event_id VARCHAR(64) NOT NULL UNIQUE,
                event_type VARCHAR(255) NOT NULL,
                room_id VARCHAR(255) NOT NULL,
                envelope LONGTEXT NOT NULL,
                headers TEXT NULL,
                status VARCHAR(16) NOT NULL DEFAULT 'pending',
                retry_count INT NOT NULL DEFAULT 0,
                last_error VARCHAR(512) NULL,
                created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
                available_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
                locked_by VARCHAR(128) NULL,
                locked_until TIMESTAMP(6) NULL DEFAULT NULL,
                published_at TIMESTAMP(6) NULL DEFAULT NULL,
                INDEX {t}_pending_idx (status, id),
                INDEX {t}_room_idx (room_id, id),
                INDEX {t}_retention_idx (status, published_at),
                INDEX {t}_pending_room_idx (room_id, status, id)
            ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
        )],
    }
}

/// Creates or upgrades `table` and its indexes; returns the names of the migrations applied
/// now (empty when the table was already current).
///
/// Safe to run from several processes at once (every node migrates on start by default):
/// each step takes a lock named after the table first, so runners take turns and each
/// sees the others' work — on PostgreSQL a transaction-scoped advisory lock, on MySQL a
/// named lock (`GET_LOCK`), which outlives the transactions that MySQL's DDL commits on
/// its own. SQLite serialises writers itself.
pub async fn migrate(
    db: &DatabaseConnection,
    table: &TableName,
) -> Result<Vec<&'static str>, DbErr> {
    let backend = db.get_database_backend();
    let t = table.as_str();
    let applied_at = match backend {
        DbBackend::Postgres => "TIMESTAMPTZ NOT NULL DEFAULT now()",
        DbBackend::Sqlite => "DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP",
        DbBackend::MySql => "TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)",
    };
    let create = format!(
        "CREATE TABLE IF NOT EXISTS {t}_migrations (name VARCHAR(128) NOT NULL PRIMARY KEY, applied_at {applied_at})"
    );
    let txn = lock(db, t).await?;
    let created = txn.execute_unprepared(&create).await.map(|_| ());
    unlock(txn, t, created).await?;

    let mut applied = Vec::new();
    for migration in MIGRATIONS {
        let txn = lock(db, t).await?;
        let done = apply(&txn, t, migration).await;
        let done = unlock(txn, t, done).await;
        match done {
            Ok(true) => applied.push(migration.name),
            Ok(false) => {}
            // MySQL: the lock is let go before the last commit, so a runner that comes
            // next may insert the same name and fail once the first one commits.
            Err(_) if is_recorded(db, t, migration.name).await? => {}
            Err(error) => return Err(error),
        }
    }
    Ok(applied)
}

/// How long a runner waits for another one's migration step (MySQL's `GET_LOCK`; on
/// PostgreSQL the wait has no bound of its own, like any lock wait).
const MIGRATION_LOCK_WAIT_SECS: u32 = 120;

/// Applies `migration` unless it is recorded; `true` if this call applied it.
async fn apply(txn: &DatabaseTransaction, t: &str, migration: &Migration) -> Result<bool, DbErr> {
    let backend = txn.get_database_backend();
    if is_recorded(txn, t, migration.name).await? {
        return Ok(false);
    }
    for statement in (migration.statements)(backend, t) {
        txn.execute_unprepared(&statement).await?;
    }
    let mut params = Params::new(backend);
    let name = params.bind(migration.name);
    txn.execute(params.statement(format!("INSERT INTO {t}_migrations (name) VALUES ({name})")))
        .await?;
    Ok(true)
}

/// The name of the table's migration lock.
fn lock_name(t: &str) -> String {
    format!("{t}_migrations")
}

/// A transaction holding the table's migration lock.
async fn lock(db: &DatabaseConnection, t: &str) -> Result<DatabaseTransaction, DbErr> {
    let backend = db.get_database_backend();
    let txn = db.begin().await?;
    let mut params = Params::new(backend);
    let name = params.bind(lock_name(t));
    match backend {
        DbBackend::Postgres => {
            txn.execute(
                params.statement(format!("SELECT pg_advisory_xact_lock(hashtext({name}))")),
            )
            .await?;
        }
        DbBackend::MySql => {
            let wait = params.bind(i64::from(MIGRATION_LOCK_WAIT_SECS));
            let got = txn
                .query_one(params.statement(format!("SELECT GET_LOCK({name}, {wait}) AS got")))
                .await?
                .and_then(|row| row.try_get::<Option<i64>>("", "got").ok().flatten());
            if got != Some(1) {
                return Err(DbErr::Custom(format!(
                    "another migration of table {t} held its lock for {MIGRATION_LOCK_WAIT_SECS} s"
                )));
            }
        }
        DbBackend::Sqlite => {}
    }
    Ok(txn)
}

/// Ends a step taken under [`lock`]: lets the lock go and commits if the step succeeded.
async fn unlock<T>(txn: DatabaseTransaction, t: &str, step: Result<T, DbErr>) -> Result<T, DbErr> {
    let backend = txn.get_database_backend();
    if backend == DbBackend::MySql {
        // A named lock belongs to the connection, not the transaction: let it go before
        // the connection goes back to the pool, whatever the step came to.
        let mut params = Params::new(backend);
        let name = params.bind(lock_name(t));
        txn.execute(params.statement(format!("DO RELEASE_LOCK({name})")))
            .await?;
    }
    let value = step?;
    txn.commit().await?;
    Ok(value)
}

/// `name` is in `<table>_migrations`.
async fn is_recorded<C: ConnectionTrait>(db: &C, t: &str, name: &str) -> Result<bool, DbErr> {
    let mut params = Params::new(db.get_database_backend());
    let name = params.bind(name);
    Ok(db
        .query_one(params.statement(format!(
            "SELECT name FROM {t}_migrations WHERE name = {name}"
        )))
        .await?
        .is_some())
}
