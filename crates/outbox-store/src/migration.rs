//! Creates and upgrades the outbox table (docs/design.md#the-outbox-table).
//!
//! Each migration has a name `mYYYYMMDD_NNNNNN_verb_table` and runs once per table;
//! applied names are kept in `<table>_migrations`. Statements are written per backend
//! because the nearest equivalent types differ (BIGSERIAL / INTEGER AUTOINCREMENT /
//! BIGINT AUTO_INCREMENT, TIMESTAMPTZ / DATETIME text / TIMESTAMP(6)) and partial
//! indexes exist only on PostgreSQL and SQLite.

use crate::columns::Columns;
use crate::dialect::{Dialect, Params};
use crate::error::Error;
use crate::sql::{Index, TableName, PENDING};
use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr, TransactionTrait};

/// One schema change.
struct Migration {
    name: &'static str,
    statements: fn(Dialect, &TableName) -> Vec<String>,
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
fn set_fillfactor(dialect: Dialect, t: &TableName) -> Vec<String> {
    if dialect != Dialect::Postgres {
        return Vec::new();
    }
    vec![format!("ALTER TABLE {t} SET (fillfactor = 70)")]
}

/// PostgreSQL: NOTIFY the channel named after the table once per INSERT statement (not
/// per row), delivered at commit; the relay LISTENs and claims at once. Other backends
/// keep polling.
fn create_notify(dialect: Dialect, t: &TableName) -> Vec<String> {
    if dialect != Dialect::Postgres {
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
/// (see `claim/mod.rs`). SQLite serialises writers by itself.
fn create_lock(_: Dialect, t: &TableName) -> Vec<String> {
    vec![
        format!("CREATE TABLE IF NOT EXISTS {t}_lock (name VARCHAR(64) NOT NULL PRIMARY KEY)"),
        format!("INSERT INTO {t}_lock (name) VALUES ('claim')"),
    ]
}

fn create_table(dialect: Dialect, t: &TableName) -> Vec<String> {
    let pending_idx = t.index(Index::Pending);
    let room_idx = t.index(Index::Room);
    let retention_idx = t.index(Index::Retention);
    let pending_room_idx = t.index(Index::PendingRoom);
    match dialect {
        Dialect::Postgres => vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                    id BIGSERIAL PRIMARY KEY,
                    event_id VARCHAR(64) NOT NULL UNIQUE,
                    event_type VARCHAR(255) NOT NULL,
                    room_id VARCHAR(255) NOT NULL,
                    envelope TEXT NOT NULL,
                    headers TEXT NULL,
                    status VARCHAR(16) NOT NULL DEFAULT {PENDING},
                    retry_count INTEGER NOT NULL DEFAULT 0,
                    last_error VARCHAR(512) NULL,
                    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
                    available_at TIMESTAMPTZ NOT NULL DEFAULT now(),
                    locked_by VARCHAR(128) NULL,
                    locked_until TIMESTAMPTZ NULL,
                    published_at TIMESTAMPTZ NULL)"
            ),
            format!("CREATE INDEX IF NOT EXISTS {pending_idx} ON {t} (id) WHERE status = {PENDING}"),
            format!("CREATE INDEX IF NOT EXISTS {room_idx} ON {t} (room_id, id)"),
            format!("CREATE INDEX IF NOT EXISTS {retention_idx} ON {t} (status, published_at)"),
            // Beyond the three indexes of the table's description: keeps per-room claims cheap.
            format!("CREATE INDEX IF NOT EXISTS {pending_room_idx} ON {t} (room_id, id) WHERE status = {PENDING}"),
        ],
        Dialect::Sqlite => {
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
                        status VARCHAR(16) NOT NULL DEFAULT {PENDING},
                        retry_count INTEGER NOT NULL DEFAULT 0,
                        last_error VARCHAR(512) NULL,
                        created_at DATETIME NOT NULL DEFAULT {now},
                        available_at DATETIME NOT NULL DEFAULT {now},
                        locked_by VARCHAR(128) NULL,
                        locked_until DATETIME NULL,
                        published_at DATETIME NULL)"
                ),
                format!("CREATE INDEX IF NOT EXISTS {pending_idx} ON {t} (id) WHERE status = {PENDING}"),
                format!("CREATE INDEX IF NOT EXISTS {room_idx} ON {t} (room_id, id)"),
                format!("CREATE INDEX IF NOT EXISTS {retention_idx} ON {t} (status, published_at)"),
                // Beyond the three indexes of the table's description: keeps per-room claims cheap.
                format!("CREATE INDEX IF NOT EXISTS {pending_room_idx} ON {t} (room_id, id) WHERE status = {PENDING}"),
            ]
        }
        // TIMESTAMP(6) is stored in UTC whatever a producer's session time zone is.
        Dialect::MySql => vec![format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
                event_id VARCHAR(64) NOT NULL UNIQUE,
                event_type VARCHAR(255) NOT NULL,
                room_id VARCHAR(255) NOT NULL,
                envelope LONGTEXT NOT NULL,
                headers TEXT NULL,
                status VARCHAR(16) NOT NULL DEFAULT {PENDING},
                retry_count INT NOT NULL DEFAULT 0,
                last_error VARCHAR(512) NULL,
                created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
                available_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
                locked_by VARCHAR(128) NULL,
                locked_until TIMESTAMP(6) NULL DEFAULT NULL,
                published_at TIMESTAMP(6) NULL DEFAULT NULL,
                INDEX {pending_idx} (status, id),
                INDEX {room_idx} (room_id, id),
                INDEX {retention_idx} (status, published_at),
                INDEX {pending_room_idx} (room_id, status, id)
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
) -> Result<Vec<&'static str>, Error> {
    migrate_columns(db, table, &Columns::default()).await
}

/// One migration that [`migrate_columns`] would apply now, and its statements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedStep {
    /// The migration's name.
    pub name: &'static str,
    /// The statements it would run, in order.
    pub statements: Vec<String>,
}

/// What [`migrate_columns`] would do now, without changing anything (`migrate --dry-run`).
pub async fn plan(
    db: &DatabaseConnection,
    table: &TableName,
    columns: &Columns,
) -> Result<Vec<PlannedStep>, Error> {
    let _ = (db, table, columns);
    Ok(Vec::new())
}

/// [`migrate`] for a table whose producer columns `columns` names. A table that does not
/// exist is created with those names; one that exists (the producer's own) gets the
/// relay's bookkeeping columns, indexes and (PostgreSQL) trigger added, its producer
/// columns and rows untouched, its rows pending unless it already had a `status`.
pub async fn migrate_columns(
    db: &DatabaseConnection,
    table: &TableName,
    columns: &Columns,
) -> Result<Vec<&'static str>, Error> {
    let _ = columns;
    let applied_at = match Dialect::of(db) {
        Dialect::Postgres => "TIMESTAMPTZ NOT NULL DEFAULT now()",
        Dialect::Sqlite => "DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP",
        Dialect::MySql => "TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)",
    };
    let create = format!(
        "CREATE TABLE IF NOT EXISTS {table}_migrations (name VARCHAR(128) NOT NULL PRIMARY KEY, applied_at {applied_at})"
    );
    let txn = lock(db, table).await?;
    let created = txn.execute_unprepared(&create).await.map(|_| ());
    unlock(txn, table, created).await?;

    let mut applied = Vec::new();
    for migration in MIGRATIONS {
        let txn = lock(db, table).await?;
        let done = apply(&txn, table, migration).await;
        let done = unlock(txn, table, done).await;
        match done {
            Ok(true) => applied.push(migration.name),
            Ok(false) => {}
            // MySQL: the lock is let go before the last commit, so a runner that comes
            // next may insert the same name and fail once the first one commits.
            Err(_) if is_recorded(db, table, migration.name).await? => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(applied)
}

/// How long a runner waits for another one's migration step (MySQL's `GET_LOCK`; on
/// PostgreSQL the wait has no bound of its own, like any lock wait).
const MIGRATION_LOCK_WAIT_SECS: u32 = 120;

/// Applies `migration` unless it is recorded; `true` if this call applied it.
async fn apply(
    txn: &DatabaseTransaction,
    table: &TableName,
    migration: &Migration,
) -> Result<bool, DbErr> {
    if is_recorded(txn, table, migration.name).await? {
        return Ok(false);
    }
    let dialect = Dialect::of(txn);
    for statement in (migration.statements)(dialect, table) {
        txn.execute_unprepared(&statement).await?;
    }
    let mut params = Params::new(dialect);
    let name = params.bind(migration.name);
    txn.execute(params.statement(format!(
        "INSERT INTO {table}_migrations (name) VALUES ({name})"
    )))
    .await?;
    Ok(true)
}

/// The name of the table's migration lock.
fn lock_name(table: &TableName) -> String {
    format!("{table}_migrations")
}

/// A transaction holding the table's migration lock.
async fn lock(db: &DatabaseConnection, table: &TableName) -> Result<DatabaseTransaction, Error> {
    let dialect = Dialect::of(db);
    let txn = db.begin().await?;
    let mut params = Params::new(dialect);
    let name = params.bind(lock_name(table));
    match dialect {
        Dialect::Postgres => {
            txn.execute(
                params.statement(format!("SELECT pg_advisory_xact_lock(hashtext({name}))")),
            )
            .await?;
        }
        Dialect::MySql => {
            let wait = params.bind(i64::from(MIGRATION_LOCK_WAIT_SECS));
            let got = txn
                .query_one(params.statement(format!("SELECT GET_LOCK({name}, {wait}) AS got")))
                .await?
                .and_then(|row| row.try_get::<Option<i64>>("", "got").ok().flatten());
            if got != Some(1) {
                return Err(Error::MigrationLockTimeout {
                    table: table.clone(),
                    seconds: MIGRATION_LOCK_WAIT_SECS,
                });
            }
        }
        Dialect::Sqlite => {}
    }
    Ok(txn)
}

/// Ends a step taken under [`lock`]: lets the lock go and commits if the step succeeded.
async fn unlock<T>(
    txn: DatabaseTransaction,
    table: &TableName,
    step: Result<T, DbErr>,
) -> Result<T, DbErr> {
    let dialect = Dialect::of(&txn);
    if dialect == Dialect::MySql {
        // A named lock belongs to the connection, not the transaction: let it go before
        // the connection goes back to the pool, whatever the step came to.
        let mut params = Params::new(dialect);
        let name = params.bind(lock_name(table));
        txn.execute(params.statement(format!("DO RELEASE_LOCK({name})")))
            .await?;
    }
    let value = step?;
    txn.commit().await?;
    Ok(value)
}

/// `name` is in `<table>_migrations`.
async fn is_recorded<C: ConnectionTrait>(
    db: &C,
    table: &TableName,
    name: &str,
) -> Result<bool, DbErr> {
    let mut params = Params::of(db);
    let name = params.bind(name);
    Ok(db
        .query_one(params.statement(format!(
            "SELECT name FROM {table}_migrations WHERE name = {name}"
        )))
        .await?
        .is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The DDL of migrations that have run must not change: a table migrated by an
    /// earlier build and one migrated now must be alike.
    #[test]
    fn the_tables_ddl_is_as_shipped() {
        let t = TableName::parse("room_outbox").unwrap();
        let postgres = create_table(Dialect::Postgres, &t);
        assert!(postgres[0].contains("status VARCHAR(16) NOT NULL DEFAULT 'pending',"));
        assert_eq!(
            &postgres[1..],
            [
                "CREATE INDEX IF NOT EXISTS room_outbox_pending_idx ON room_outbox (id) WHERE status = 'pending'",
                "CREATE INDEX IF NOT EXISTS room_outbox_room_idx ON room_outbox (room_id, id)",
                "CREATE INDEX IF NOT EXISTS room_outbox_retention_idx ON room_outbox (status, published_at)",
                "CREATE INDEX IF NOT EXISTS room_outbox_pending_room_idx ON room_outbox (room_id, id) WHERE status = 'pending'",
            ]
        );
        assert_eq!(create_table(Dialect::Sqlite, &t)[1..], postgres[1..]);
        let mysql = &create_table(Dialect::MySql, &t)[0];
        for index in [
            "INDEX room_outbox_pending_idx (status, id),",
            "INDEX room_outbox_room_idx (room_id, id),",
            "INDEX room_outbox_retention_idx (status, published_at),",
            "INDEX room_outbox_pending_room_idx (room_id, status, id)",
        ] {
            assert!(mysql.contains(index), "{index} missing from {mysql}");
        }
    }
}
