//! Creates and upgrades the outbox table (docs/design/table.md), or adopts a
//! producer's existing one.
//!
//! Each migration has a name `mYYYYMMDD_NNNNNN_verb_table` and runs once per table;
//! applied names are kept in `<table>_migrations`. Statements are written per backend
//! because the nearest equivalent types differ (BIGSERIAL / INTEGER AUTOINCREMENT /
//! BIGINT AUTO_INCREMENT, TIMESTAMPTZ / DATETIME text / TIMESTAMP(6)) and partial
//! indexes exist only on PostgreSQL and SQLite. Each step is built from a [`Context`]:
//! the column mapping and the table as it is when the step runs (read under the
//! migration lock). `create.rs`: a new table; `adopt.rs`: an existing one.

mod adopt;
mod create;
mod notify;
mod online;

pub use notify::{enable_notify, plan_enable_notify, ENABLE_NOTIFY};

use crate::columns::{ColumnSetting, Columns};
use crate::dialect::{Dialect, Params};
use crate::error::Error;
use crate::shape::TableShape;
use crate::sql::TableName;
use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr, TransactionTrait};

/// What a migration step's statements are built from.
pub(crate) struct Context<'a> {
    /// The backend.
    dialect: Dialect,
    /// The outbox table.
    table: &'a TableName,
    /// The column mapping.
    columns: &'a Columns,
    /// The table's columns now; `None` when it does not exist yet.
    shape: Option<&'a TableShape>,
    /// PostgreSQL: this run adopts a table that existed before it (the finishing step,
    /// [`online::FINISH`], is still to run on it): the insert trigger is created disabled
    /// ([`notify::create_notify`]).
    adopting: bool,
}

impl Context<'_> {
    /// SQLite's implicit row id serves as the position (`columns.position = "rowid"`).
    fn rowid_position(&self) -> bool {
        self.dialect == Dialect::Sqlite
            && ["rowid", "_rowid_", "oid"].contains(&self.columns.position.as_str())
            && !self
                .shape
                .is_some_and(|shape| shape.has(self.columns.position.as_str()))
    }
}

/// The DDL of a new table with the default mapping: what the first migration has always
/// run (kept as the shipped DDL's reference, see the tests).
#[cfg_attr(not(test), allow(dead_code))]
fn create_table(dialect: Dialect, table: &TableName) -> Vec<String> {
    create::create_table(&Context {
        dialect,
        table,
        columns: &Columns::default(),
        shape: None,
        adopting: false,
    })
}

/// `migrate` adds the column of `setting` to an existing table that lacks it.
pub(crate) fn adds(setting: ColumnSetting) -> bool {
    matches!(
        setting,
        ColumnSetting::Position | ColumnSetting::Headers | ColumnSetting::CreatedAt
    )
}

/// One schema change.
struct Migration {
    name: &'static str,
    statements: fn(&Context<'_>) -> Result<Vec<String>, Error>,
}

/// The first migration: the table created, or an existing one adopted.
const CREATE: &str = "m20261202_000001_create_room_outbox";

/// Every migration, oldest first. Append; never edit one that has shipped.
const MIGRATIONS: &[Migration] = &[
    Migration {
        name: CREATE,
        statements: create_or_adopt,
    },
    Migration {
        name: "m20261202_000002_create_room_outbox_lock",
        statements: create_lock,
    },
    Migration {
        name: notify::CREATE_NOTIFY,
        statements: notify::create_notify,
    },
    Migration {
        name: "m20261202_000004_set_room_outbox_fillfactor",
        statements: set_fillfactor,
    },
    Migration {
        name: "m20261203_000005_set_room_outbox_autovacuum",
        statements: set_autovacuum,
    },
    Migration {
        name: "m20261204_000007_lower_room_outbox_fillfactor",
        statements: lower_fillfactor,
    },
    Migration {
        name: "m20261204_000008_drop_room_outbox_room_index",
        statements: drop_room_index,
    },
    Migration {
        name: WAKE_SLEEPERS,
        statements: notify::wake_sleepers,
    },
    Migration {
        name: notify::DISABLE_NOTIFY,
        statements: notify::disable_notify,
    },
];

/// The migration that makes the insert trigger NOTIFY only a sleeping relay.
const WAKE_SLEEPERS: &str = "m20261206_000009_wake_room_outbox_sleepers";

/// PostgreSQL's per-table autovacuum parameters that [`set_autovacuum`] sets.
pub const AUTOVACUUM_PARAMETERS: &[(&str, &str)] = &[
    ("autovacuum_vacuum_scale_factor", "0"),
    ("autovacuum_vacuum_threshold", "10000"),
    ("autovacuum_vacuum_insert_scale_factor", "0"),
    ("autovacuum_vacuum_insert_threshold", "10000"),
    ("autovacuum_vacuum_cost_limit", "2000"),
    ("autovacuum_vacuum_cost_delay", "2"),
];

/// PostgreSQL (13 or later): vacuum the table after a fixed amount of work, not a share of
/// its size. Every event leaves about two dead row versions (claim, then mark), and the
/// claim reads through the dead entries of the pending indexes; the default (20 % of the
/// table dead) lets a table of 5 million published rows gather a million of them before a
/// vacuum, and claims slowed fourfold. So: a vacuum per 10,000 dead versions (or inserts,
/// which keeps the visibility map current while a backlog builds up), whatever the table's
/// size, at ten times the default cost limit so that it ends quickly; the heap pages
/// already all-visible are skipped, so a vacuum's cost follows the work since the last
/// one. Why these values: docs/design/table.md#autovacuum-parameters. Replaces any value the table
/// had for these six parameters; others are left alone.
fn set_autovacuum(cx: &Context<'_>) -> Result<Vec<String>, Error> {
    let t = cx.table;
    if cx.dialect != Dialect::Postgres {
        return Ok(Vec::new());
    }
    let parameters: Vec<String> = AUTOVACUUM_PARAMETERS
        .iter()
        .map(|(name, value)| format!("{name} = {value}"))
        .collect();
    Ok(vec![format!(
        "ALTER TABLE {t} SET ({})",
        parameters.join(", ")
    )])
}

/// PostgreSQL: leave a third of every new heap page free. A claim and a lease renewal
/// change only `locked_by` and `locked_until`, which no index covers, so with room on
/// the page PostgreSQL writes the new row version as a HOT update — no entry in any of
/// the six indexes. On full pages every claim paid for six index inserts per row.
/// Existing pages keep their layout until rewritten. InnoDB and SQLite update in place.
fn set_fillfactor(cx: &Context<'_>) -> Result<Vec<String>, Error> {
    let t = cx.table;
    if cx.dialect != Dialect::Postgres {
        return Ok(Vec::new());
    }
    Ok(vec![format!("ALTER TABLE {t} SET (fillfactor = 70)")])
}

/// PostgreSQL: leave more than half of every new heap page free, so that every row of a
/// page can take its lease as a HOT update, not a third of them (measured: at 70, 56 % of
/// the leases found no room and wrote a new entry in each of the table's indexes). The
/// cost: a new row takes about 1.5 times the pages until its versions are pruned.
/// Existing pages keep their layout until rewritten. Why 45 and what it saves:
/// docs/design/table.md#fillfactor-45.
fn lower_fillfactor(cx: &Context<'_>) -> Result<Vec<String>, Error> {
    let t = cx.table;
    if cx.dialect != Dialect::Postgres {
        return Ok(Vec::new());
    }
    Ok(vec![format!(
        "ALTER TABLE {t} SET (fillfactor = {FILLFACTOR})"
    )])
}

/// PostgreSQL: no index of every row by room. A mark cannot be HOT (it moves the row out
/// of the pending indexes), so it writes an entry in every index whose predicate the
/// published row meets; `(room_id, id)` over every row, which no statement of the relay
/// reads, cost each mark an entry: 14 % of its buffers and 18 % of its WAL (measured).
/// Pending rows by room keep their index (the claim's per-room check); dead rows are
/// found through `(status, published_at)`. A table of the relay's own only: a producer's
/// index by another name is left alone. InnoDB and SQLite update only the indexes whose
/// columns change, so there the index costs a mark nothing and stays.
fn drop_room_index(cx: &Context<'_>) -> Result<Vec<String>, Error> {
    if cx.dialect != Dialect::Postgres {
        return Ok(Vec::new());
    }
    Ok(vec![format!(
        "DROP INDEX IF EXISTS {}",
        cx.table.index(crate::sql::Index::Room)
    )])
}

/// The fillfactor of PostgreSQL outbox tables ([`lower_fillfactor`]).
pub const FILLFACTOR: u32 = 45;

/// `<table>_lock`: one row whose row lock serialises per-room claims across nodes
/// (see `claim/mod.rs`). SQLite serialises writers by itself.
fn create_lock(cx: &Context<'_>) -> Result<Vec<String>, Error> {
    let t = cx.table;
    Ok(vec![
        format!("CREATE TABLE IF NOT EXISTS {t}_lock (name VARCHAR(64) NOT NULL PRIMARY KEY)"),
        format!("INSERT INTO {t}_lock (name) VALUES ('claim')"),
    ])
}

/// The table with the mapped names when it does not exist; else the bookkeeping columns
/// it lacks, and the indexes. (The name says `create`: it shipped before adoption did.)
fn create_or_adopt(cx: &Context<'_>) -> Result<Vec<String>, Error> {
    match cx.shape {
        Some(shape) => adopt::adopt(cx, shape),
        None if cx.rowid_position() => Err(Error::Mapping {
            table: cx.table.clone(),
            problems: vec![crate::columns::MappingError {
                setting: ColumnSetting::Position,
                column: cx.columns.position.to_string(),
                problem: crate::columns::MappingProblem::Unsupported(
                    "serves only a table that exists; for a new table name an integer column",
                ),
            }],
        }),
        None => Ok(create::create_table(cx)),
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
    /// What it locks, and for how long it is expected to.
    pub locks: &'static str,
}

/// What step `name` locks on `dialect`, and for how long (`migrate --dry-run`).
fn lock_note(name: &str, dialect: Dialect) -> &'static str {
    match (dialect, name) {
        (Dialect::Sqlite, _) => "the database's write lock, for the step's statements (milliseconds on a new table; adding created_at to an existing one rewrites each row)",
        (Dialect::Postgres, online::FINISH) => "no table lock that stops inserts: row locks of one batch of pages at a time (tens of milliseconds each), then each index built CONCURRENTLY (SHARE UPDATE EXCLUSIVE: inserts and updates go on; it waits for older transactions)",
        (Dialect::Postgres, CREATE | ADD_MAPPED_COLUMNS) => "ACCESS EXCLUSIVE on the table for catalogue changes only (no rewrite, no index build): milliseconds; it waits at most 100 ms for the lock (lock_timeout), then gives up and is retried",
        (Dialect::Postgres, "m20261204_000008_drop_room_outbox_room_index") => "ACCESS EXCLUSIVE on the table for DROP INDEX: milliseconds once granted; at most 100 ms waiting for the lock, retried",
        (Dialect::Postgres, WAKE_SLEEPERS) => "ACCESS EXCLUSIVE on the table to drop and create the insert trigger again in one transaction: milliseconds once granted; at most 100 ms waiting for the lock, retried",
        (Dialect::Postgres, notify::DISABLE_NOTIFY) => "SHARE ROW EXCLUSIVE on the table for DISABLE TRIGGER (skipped when it is disabled already): milliseconds; at most 100 ms waiting for the lock, retried",
        (Dialect::Postgres, notify::CREATE_NOTIFY) => "SHARE ROW EXCLUSIVE on the table for CREATE TRIGGER (on a table being adopted, created disabled until the finishing step ends, so the producers' commits do not take turns at NOTIFY while the backfill and the index builds keep the disk busy): milliseconds; at most 100 ms waiting for the lock, retried",
        (Dialect::Postgres, _) => "SHARE UPDATE EXCLUSIVE or none (inserts go on): milliseconds; at most 100 ms waiting for the lock, retried",
        (Dialect::MySql, CREATE | ADD_MAPPED_COLUMNS) => "ADD COLUMN: a metadata lock for an instant change where the server allows (MariaDB 10.3+, MySQL 8.0.12+; an AUTO_INCREMENT position copies the table, blocking writes for as long); each CREATE INDEX ALGORITHM=INPLACE LOCK=NONE: writes go on while it builds; each statement waits at most 1 s for the metadata lock behind a transaction open on the table (lock_wait_timeout; inserts queue behind it meanwhile), then gives up and is retried",
        (Dialect::MySql, _) => "a metadata lock: milliseconds; at most 1 s waiting for it, retried",
    }
}

/// What [`migrate_columns`] would do now, without changing anything (`migrate --dry-run`).
pub async fn plan(
    db: &DatabaseConnection,
    table: &TableName,
    columns: &Columns,
) -> Result<Vec<PlannedStep>, Error> {
    validate(table, columns)?;
    let dialect = Dialect::of(db);
    let migrations = format!("{table}_migrations");
    let recorded_any = TableShape::read(db, &migrations).await?.is_some();
    let shape = TableShape::read(db, table.as_str()).await?;
    let finished = recorded_any && is_recorded(db, table, online::FINISH).await?;
    let cx = Context {
        dialect,
        table,
        columns,
        shape: shape.as_ref(),
        adopting: dialect == Dialect::Postgres && shape.is_some() && !finished,
    };
    let mut steps = Vec::new();
    for migration in MIGRATIONS {
        if recorded_any && is_recorded(db, table, migration.name).await? {
            continue;
        }
        steps.push(PlannedStep {
            name: migration.name,
            statements: (migration.statements)(&cx)?,
            locks: lock_note(migration.name, dialect),
        });
    }
    // A table adopted (or created) earlier whose mapping now names a column it lacks.
    let mut added = false;
    if steps.is_empty() {
        if let Some(statements) = add_mapped_columns(&cx)? {
            added = true;
            steps.push(PlannedStep {
                name: ADD_MAPPED_COLUMNS,
                statements,
                locks: lock_note(ADD_MAPPED_COLUMNS, dialect),
            });
        }
    }
    if dialect == Dialect::Postgres && shape.is_some() && (added || !finished) {
        steps.push(PlannedStep {
            name: online::FINISH,
            statements: online::finish_statements(&cx),
            locks: lock_note(online::FINISH, dialect),
        });
    }
    Ok(steps)
}

/// The name `migrate` reports for [`add_mapped_columns`]: not recorded, since it depends
/// on the mapping of the day, not on the table's history.
const ADD_MAPPED_COLUMNS: &str = "add_mapped_columns";

/// On a table whose migrations have all run: the headers, created_at or position column
/// the mapping names and the table lacks (a mapping changed after adoption), as
/// `migrate` adds them on adoption; `None` when there is none to add.
fn add_mapped_columns(cx: &Context<'_>) -> Result<Option<Vec<String>>, Error> {
    let Some(shape) = cx.shape else {
        return Ok(None);
    };
    // A mapping `migrate` cannot mend adds nothing here: checking the columns reports it
    // (exit 2), as before, without a migration being attempted.
    let Ok(statements) = adopt::changed_mapping(cx, shape) else {
        return Ok(None);
    };
    Ok((!statements.is_empty()).then_some(statements))
}

/// The mapping on its own ([`Columns::validate`]), as an [`Error`].
fn validate(table: &TableName, columns: &Columns) -> Result<(), Error> {
    columns.validate().map_err(|problems| Error::Mapping {
        table: table.clone(),
        problems,
    })
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
    validate(table, columns)?;
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
    unlock::<_, DbErr>(txn, table, created).await?;
    // PostgreSQL: a table that exists before its finishing step ran is being adopted (a
    // table this run creates has every index already when the finishing step comes).
    let adopting = Dialect::of(db) == Dialect::Postgres
        && TableShape::read(db, table.as_str()).await?.is_some()
        && !is_recorded(db, table, online::FINISH).await?;

    let mut applied = Vec::new();
    for migration in MIGRATIONS {
        let done = online::retry_lock_timeouts(table, migration.name, || async {
            let txn = lock(db, table).await?;
            let done = apply(&txn, table, columns, migration, adopting).await;
            unlock(txn, table, done).await
        })
        .await;
        match done {
            Ok(true) => applied.push(migration.name),
            Ok(false) => {}
            // MySQL: the lock is let go before the last commit, so a runner that comes
            // next may insert the same name and fail once the first one commits.
            Err(_) if is_recorded(db, table, migration.name).await? => {}
            Err(error) => return Err(error),
        }
    }
    let txn = lock(db, table).await?;
    let added = add_mapped(&txn, table, columns).await;
    let added = unlock(txn, table, added).await?;
    if added {
        applied.push(ADD_MAPPED_COLUMNS);
    }
    if Dialect::of(db) == Dialect::Postgres
        && (added || !is_recorded(db, table, online::FINISH).await?)
        && finish_once(db, table, columns, added).await?
    {
        applied.push(online::FINISH);
    }
    Ok(applied)
}

/// Runs [`finish`] in one runner at a time: under an advisory lock of its own, taken with
/// `pg_try_advisory_xact_lock` in a transaction that then stays idle. A runner waiting in
/// `pg_advisory_xact_lock` would hold a snapshot, which `CREATE INDEX CONCURRENTLY` waits
/// for (while the runner waits for the lock holder, which waits for the index): the
/// others poll instead. `true` when this runner recorded the step.
async fn finish_once(
    db: &DatabaseConnection,
    table: &TableName,
    columns: &Columns,
    again: bool,
) -> Result<bool, Error> {
    let deadline = std::time::Instant::now()
        + std::time::Duration::from_secs(u64::from(MIGRATION_LOCK_WAIT_SECS) * 10);
    loop {
        let txn = db.begin().await?;
        let mut params = Params::new(Dialect::Postgres);
        let name = params.bind(format!("{table}_finish"));
        let got = txn
            .query_one(params.statement(format!(
                "SELECT pg_try_advisory_xact_lock(hashtext({name})) AS got"
            )))
            .await?
            .map(|row| row.try_get::<bool>("", "got"))
            .transpose()?
            .unwrap_or(false);
        if !got {
            txn.rollback().await?;
            if std::time::Instant::now() > deadline {
                return Err(Error::MigrationLockTimeout {
                    table: table.clone(),
                    seconds: MIGRATION_LOCK_WAIT_SECS * 10,
                });
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        }
        if !again && is_recorded(&txn, table, online::FINISH).await? {
            txn.commit().await?;
            return Ok(false);
        }
        let recorded = finish(db, &txn, table, columns).await;
        return unlock(txn, table, recorded).await;
    }
}

/// PostgreSQL: numbers an adopted table's existing rows and builds its indexes
/// concurrently (`online.rs`), on connections of the pool while `txn` holds the finish
/// lock; then records [`online::FINISH`] (`true` when this call recorded it).
async fn finish(
    db: &DatabaseConnection,
    txn: &DatabaseTransaction,
    table: &TableName,
    columns: &Columns,
) -> Result<bool, Error> {
    let shape = TableShape::read(db, table.as_str()).await?;
    let cx = Context {
        dialect: Dialect::Postgres,
        table,
        columns,
        shape: shape.as_ref(),
        adopting: false,
    };
    online::finish(db, &cx).await?;
    if is_recorded(txn, table, online::FINISH).await? {
        return Ok(false);
    }
    let mut params = Params::new(Dialect::Postgres);
    let name = params.bind(online::FINISH);
    txn.execute(params.statement(format!(
        "INSERT INTO {table}_migrations (name) VALUES ({name})"
    )))
    .await?;
    Ok(true)
}

/// Adds the mapped columns the table lacks ([`add_mapped_columns`]); `true` if it added any.
async fn add_mapped(
    txn: &DatabaseTransaction,
    table: &TableName,
    columns: &Columns,
) -> Result<bool, Error> {
    let shape = TableShape::read(txn, table.as_str()).await?;
    let cx = Context {
        dialect: Dialect::of(txn),
        table,
        columns,
        shape: shape.as_ref(),
        adopting: false,
    };
    let Some(statements) = add_mapped_columns(&cx)? else {
        return Ok(false);
    };
    for statement in statements {
        txn.execute_unprepared(&statement).await?;
    }
    Ok(true)
}

/// How long a runner waits for another one's migration step (MySQL's `GET_LOCK`; on
/// PostgreSQL the wait has no bound of its own, like any lock wait).
const MIGRATION_LOCK_WAIT_SECS: u32 = 120;

/// Applies `migration` unless it is recorded; `true` if this call applied it.
async fn apply(
    txn: &DatabaseTransaction,
    table: &TableName,
    columns: &Columns,
    migration: &Migration,
    adopting: bool,
) -> Result<bool, Error> {
    if is_recorded(txn, table, migration.name).await? {
        return Ok(false);
    }
    let dialect = Dialect::of(txn);
    let shape = TableShape::read(txn, table.as_str()).await?;
    let cx = Context {
        dialect,
        table,
        columns,
        shape: shape.as_ref(),
        adopting,
    };
    for statement in (migration.statements)(&cx)? {
        txn.execute_unprepared(&statement).await?;
    }
    let mut recorded = vec![migration.name];
    // PostgreSQL: a table this step creates has every index already and no row to number,
    // so the adoption's finishing step has nothing to do: recorded with the creation, not
    // run (its `CREATE INDEX CONCURRENTLY IF NOT EXISTS` would meet each index just made).
    // `plan` lists no finishing step for a table that does not exist either.
    if dialect == Dialect::Postgres && migration.name == CREATE && shape.is_none() {
        recorded.push(online::FINISH);
    }
    for name in recorded {
        let mut params = Params::new(dialect);
        let name = params.bind(name);
        txn.execute(params.statement(format!(
            "INSERT INTO {table}_migrations (name) VALUES ({name})"
        )))
        .await?;
    }
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
            // `IF NOT EXISTS` and `IF EXISTS` answer with a NOTICE ("already exists,
            // skipping"), which the driver logs at INFO on every start: this transaction
            // hears warnings and errors only.
            txn.execute_unprepared("SET LOCAL client_min_messages = warning")
                .await?;
            txn.execute(
                params.statement(format!("SELECT pg_advisory_xact_lock(hashtext({name}))")),
            )
            .await?;
            // Once the migration lock is held (another runner may hold it for a while):
            // an ALTER that waits behind a producer's long transaction gives up at once,
            // instead of making every insert queue behind it; the step is tried again.
            txn.execute_unprepared(&format!(
                "SET LOCAL lock_timeout = '{}'",
                online::LOCK_TIMEOUT
            ))
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
            // As on PostgreSQL: a DDL statement waiting for the table's metadata lock
            // behind a long transaction gives up after a second (the server's least,
            // `lock_wait_timeout` counts whole seconds) and the step is tried again,
            // instead of making every insert queue behind it for up to a year. A session
            // setting: [`unlock`] puts it back before the connection returns to the pool.
            txn.execute_unprepared(&format!(
                "SET SESSION lock_wait_timeout = {}",
                online::MYSQL_LOCK_WAIT_SECS
            ))
            .await?;
        }
        Dialect::Sqlite => {}
    }
    Ok(txn)
}

/// Ends a step taken under [`lock`]: lets the lock go and commits if the step succeeded.
async fn unlock<T, E: From<DbErr>>(
    txn: DatabaseTransaction,
    table: &TableName,
    step: Result<T, E>,
) -> Result<T, E> {
    let dialect = Dialect::of(&txn);
    if dialect == Dialect::MySql {
        // A named lock belongs to the connection, not the transaction: let it go before
        // the connection goes back to the pool, whatever the step came to.
        let mut params = Params::new(dialect);
        let name = params.bind(lock_name(table));
        txn.execute(params.statement(format!("DO RELEASE_LOCK({name})")))
            .await?;
        txn.execute_unprepared("SET SESSION lock_wait_timeout = DEFAULT")
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
