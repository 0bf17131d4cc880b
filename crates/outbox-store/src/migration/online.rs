//! Adopting a live PostgreSQL table without a maintenance window: no statement rewrites
//! the table, none waits behind a long transaction while producers queue behind it.
//!
//! - A new position column is a nullable `BIGINT` (a catalogue change), whose default, set
//!   in the same transaction, is a sequence started above the most rows the table's pages
//!   can hold: new rows number above every existing one. The existing rows are numbered
//!   afterwards, in batches of pages, in their physical order ([`backfill`]).
//! - Every index of an adopted table is built `CONCURRENTLY`, outside any transaction,
//!   after the backfill ([`finish_statements`]); producers keep inserting meanwhile.
//! - The insert trigger is created disabled and, where `migrate` enables it at all
//!   (`database.notify = true`), enabled only once the adoption finished: no relay claims
//!   before, and each NOTIFYing commit holds a lock through its flush, so the producers'
//!   commits would take turns behind every flush the backfill slows down.
//! - Every migration transaction sets a short `lock_timeout` once it holds the migration
//!   lock ([`LOCK_TIMEOUT`]): an `ALTER TABLE` that would wait behind a long transaction
//!   gives up at once (and is retried, `super::migrate_columns`) instead of making every
//!   insert queue behind it.

use super::create::indexes;
use super::Context;
use crate::dialect::{Dialect, Params};
use crate::error::Error;
use crate::sql::Index;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, RuntimeErr, TransactionTrait};
use std::time::Duration;

/// How long a migration's statement may wait for a table lock on PostgreSQL before it
/// gives up (and the step is retried): what a producer's insert may wait behind it.
pub(super) const LOCK_TIMEOUT: &str = "100ms";

/// How long a migration's statement may wait for the table's metadata lock on
/// MySQL/MariaDB (`lock_wait_timeout`, whole seconds, at least 1) before it gives up and
/// the step is retried.
pub(super) const MYSQL_LOCK_WAIT_SECS: u32 = 1;

/// How many times a step that timed out waiting for a lock is tried.
pub(super) const LOCK_ATTEMPTS: u32 = 100;

/// Runs `attempt` (one try of `step` on `table`) until it does not time out waiting for a
/// lock, at most [`LOCK_ATTEMPTS`] times, [`retry_delay`] apart. Each retry is a warning:
/// what tells an operator that a long transaction holds the table (find it in
/// `pg_stat_activity`, or MySQL/MariaDB's `information_schema.innodb_trx`).
pub(super) async fn retry_lock_timeouts<T, F, Fut>(
    table: &crate::sql::TableName,
    step: &str,
    mut attempt: F,
) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        match attempt().await {
            Err(Error::Database(error)) if is_lock_timeout(&error) && tries < LOCK_ATTEMPTS => {
                tracing::warn!(
                    table = %table,
                    step,
                    attempt = tries,
                    attempts = LOCK_ATTEMPTS,
                    retry_in = ?retry_delay(tries),
                    "migration step gave up waiting for a lock on the table (PostgreSQL lock_timeout {LOCK_TIMEOUT}, MySQL/MariaDB lock_wait_timeout {MYSQL_LOCK_WAIT_SECS} s); trying again"
                );
                tokio::time::sleep(retry_delay(tries)).await;
            }
            done => return done,
        }
    }
}

/// The wait before trying a step again after a lock timeout (doubling up to 2 s).
pub(super) fn retry_delay(attempt: u32) -> Duration {
    Duration::from_millis(50u64 << attempt.min(5)).min(Duration::from_secs(2))
}

/// The backfill's own writes are handed to the kernel for writing out every this many
/// bytes (`backend_flush_after`, off by default): otherwise the rows it rewrites pile up
/// as gigabytes of dirty pages that the kernel then writes out at once, and a producer's
/// commit flush waits a few hundred milliseconds behind them (BENCHMARKS.md, "Adopting a
/// live table").
const BACKFILL_FLUSH_AFTER: &str = "256kB";

/// Pages of the table per backfill statement: with rows of a few hundred bytes, some
/// 10,000 rows, a statement of tens of milliseconds that locks only those rows.
const BACKFILL_PAGES: i64 = 256;

/// The name of the step that numbers the existing rows and builds the indexes. Recorded
/// like a migration once done.
pub(super) const FINISH: &str = "m20261204_000006_finish_room_outbox_adoption";

/// The comment on the insert trigger of a table being adopted, which `migrate` created
/// disabled (`create_notify`). The finishing step of earlier builds enabled a trigger
/// that said this; now the migration that leaves the trigger disabled replaces it
/// (`notify::disable_notify`), and `notify::enable_notify` leaves such a trigger alone.
/// (No quote in it: it goes into the statement as a literal.)
pub(super) const DISABLED_UNTIL_FINISHED: &str =
    "disabled by outbox-relay migrate until the adoption finishes (backfill, index builds)";

/// PostgreSQL's most row versions on one 8 KiB heap page (`MaxHeapTuplesPerPage`).
const MAX_ROWS_PER_PAGE: i64 = 291;

/// The statements that add the position column `position` to the adopted table, in the
/// adoption's transaction: instant catalogue changes under the `ACCESS EXCLUSIVE` lock the
/// first `ALTER` takes, so no row comes in between the column and its default.
pub(super) fn add_position(cx: &Context<'_>, position: &str) -> Vec<String> {
    let t = cx.table;
    let sequence = sequence(cx, position);
    vec![
        format!("CREATE SEQUENCE IF NOT EXISTS {sequence} AS BIGINT"),
        format!("ALTER TABLE {t} ADD COLUMN {position} BIGINT NULL"),
        // Above the most rows the table's pages can hold: the backfill numbers the rows
        // there from 1 without meeting a new row's number.
        format!(
            "SELECT setval('{sequence}', GREATEST(1, (pg_relation_size('{t}') / \
             current_setting('block_size')::bigint + 1) * {MAX_ROWS_PER_PAGE}))"
        ),
        format!("ALTER TABLE {t} ALTER COLUMN {position} SET DEFAULT nextval('{sequence}')"),
        format!("ALTER SEQUENCE {sequence} OWNED BY {t}.{position}"),
    ]
}

fn sequence(cx: &Context<'_>, position: &str) -> String {
    format!("{}_{position}_seq", cx.table)
}

/// What [`finish`] runs, for `migrate --dry-run`: the backfill (as its first batch) and
/// the indexes, each `CONCURRENTLY`.
pub(super) fn finish_statements(cx: &Context<'_>) -> Vec<String> {
    let mut statements = vec![format!(
        "-- in batches of {BACKFILL_PAGES} pages, each its own transaction with \
         backend_flush_after = '{BACKFILL_FLUSH_AFTER}': {}",
        backfill_statement(cx, 0)
    )];
    statements.extend(concurrent_indexes(cx));
    statements
}

/// Numbers the rows of pages `[first, first + BACKFILL_PAGES)` whose position is NULL, in
/// their physical order, from the backfill sequence (which resumes where an interrupted
/// backfill stopped).
fn backfill_statement(cx: &Context<'_>, first: i64) -> String {
    let t = cx.table;
    let position = cx.columns.position.as_str();
    let numbers = backfill_sequence(cx, position);
    let end = first + BACKFILL_PAGES;
    let range = |alias: &str| {
        format!("{alias}ctid >= '({first},0)'::tid AND {alias}ctid < '({end},0)'::tid")
    };
    format!(
        "UPDATE {t} SET {position} = b.n FROM (SELECT c, nextval('{numbers}') AS n FROM \
         (SELECT ctid AS c FROM {t} WHERE {} AND {position} IS NULL ORDER BY ctid) o) b \
         WHERE {} AND {t}.ctid = b.c",
        range(""),
        range(&format!("{t}."))
    )
}

fn backfill_sequence(cx: &Context<'_>, position: &str) -> String {
    format!("{}_{position}_backfill", cx.table)
}

/// The unique position index and the relay's indexes, each built `CONCURRENTLY`.
fn concurrent_indexes(cx: &Context<'_>) -> Vec<String> {
    let t = cx.table;
    let position = cx.columns.position.as_str();
    let mut statements = vec![format!(
        "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {} ON {t} ({position})",
        t.index(Index::Position)
    )];
    // Not the index of every row by room: `m20261204_000008_drop_room_outbox_room_index` drops it on PostgreSQL (every mark
    // paid an entry in it), and this step runs after it.
    let room = format!("IF NOT EXISTS {} ON ", t.index(Index::Room));
    statements.extend(
        indexes(cx)
            .into_iter()
            .filter(|index| !index.contains(&room))
            .map(|index| index.replacen("CREATE INDEX ", "CREATE INDEX CONCURRENTLY ", 1)),
    );
    statements
}

/// Numbers the existing rows (when the position column was added and has NULLs), then
/// builds the indexes concurrently, each statement on its own; while the migration lock
/// (`lock`, a transaction of its own on another connection) keeps other runners out.
pub(super) async fn finish(db: &DatabaseConnection, cx: &Context<'_>) -> Result<(), Error> {
    let t = cx.table;
    let position = cx.columns.position.as_str();
    let mut params = Params::new(Dialect::Postgres);
    let (table, column) = (params.bind(t.as_str()), params.bind(position));
    let nullable = db
        .query_one(params.statement(format!(
            "SELECT NOT attnotnull AS nullable FROM pg_attribute \
             WHERE attrelid = to_regclass({table}) AND attname = {column}"
        )))
        .await?
        .map(|row| row.try_get::<bool>("", "nullable"))
        .transpose()?
        .unwrap_or(false);
    if nullable {
        backfill(db, cx).await?;
    }
    // A position unique already (the primary key of a table the relay created, or a
    // producer's own index) needs no second index: every insert and every mark would pay
    // an entry in it.
    let mut params = Params::new(Dialect::Postgres);
    let (table, column) = (params.bind(t.as_str()), params.bind(position));
    let unique = db
        .query_one(params.statement(format!(
            "SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a \
             ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
             WHERE i.indrelid = to_regclass({table}) AND i.indisunique AND i.indnatts = 1 \
             AND i.indisvalid AND a.attname = {column}) AS unique_position"
        )))
        .await?
        .map(|row| row.try_get::<bool>("", "unique_position"))
        .transpose()?
        .unwrap_or(false);
    let position_index = format!(" {} ON ", t.index(Index::Position));
    for statement in concurrent_indexes(cx) {
        if unique && statement.contains(&position_index) {
            continue;
        }
        drop_if_invalid(db, &statement).await?;
        build_index(db, &statement).await?;
    }
    Ok(())
}

/// Numbers every row whose position is NULL, batch by batch over the pages the table
/// had (rows written since have their number already).
async fn backfill(db: &DatabaseConnection, cx: &Context<'_>) -> Result<(), Error> {
    let t = cx.table;
    let position = cx.columns.position.as_str();
    let row = db
        .query_one(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            format!(
                "SELECT pg_relation_size('{t}') / current_setting('block_size')::bigint AS pages"
            ),
        ))
        .await?
        .ok_or_else(|| DbErr::Custom("no answer to the page count".into()))?;
    let pages: i64 = row.try_get("", "pages")?;
    db.execute_unprepared(&format!(
        "CREATE SEQUENCE IF NOT EXISTS {} AS BIGINT",
        backfill_sequence(cx, position)
    ))
    .await?;
    let mut first = 0;
    let flush_after = format!("SET LOCAL backend_flush_after = '{BACKFILL_FLUSH_AFTER}'");
    while first <= pages {
        with_lock_timeout(
            db,
            cx,
            &[flush_after.clone(), backfill_statement(cx, first)],
        )
        .await?;
        first += BACKFILL_PAGES;
    }
    db.execute_unprepared(&format!(
        "DROP SEQUENCE IF EXISTS {}",
        backfill_sequence(cx, position)
    ))
    .await?;
    Ok(())
}

/// Runs `statements` in a transaction of their own under [`LOCK_TIMEOUT`], retried when
/// it times out.
async fn with_lock_timeout(
    db: &DatabaseConnection,
    cx: &Context<'_>,
    statements: &[String],
) -> Result<(), Error> {
    retry_lock_timeouts(cx.table, FINISH, || async {
        let txn = db.begin().await?;
        txn.execute_unprepared(&format!("SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
            .await?;
        for statement in statements {
            txn.execute_unprepared(statement).await?;
        }
        txn.commit().await?;
        Ok(())
    })
    .await
}

/// Runs the index build `statement` on a connection of its own under
/// [`BACKFILL_FLUSH_AFTER`] too: its first scan of the table sets the hint bits of every
/// row the backfill wrote, dirtying every page again. Hearing warnings and errors only, as
/// the migration's transactions do: an index the table has already (a producer's, or one
/// an earlier run built) is skipped with a NOTICE, which the driver would log. Session
/// settings, put back after (`CONCURRENTLY` cannot run in a transaction, where `SET LOCAL`
/// would end with it).
async fn build_index(db: &DatabaseConnection, statement: &str) -> Result<(), Error> {
    use sea_orm::sqlx;
    let failed = |error: sqlx::Error| Error::Database(DbErr::Exec(RuntimeErr::SqlxError(error)));
    let mut connection = db
        .get_postgres_connection_pool()
        .acquire()
        .await
        .map_err(failed)?;
    sqlx::raw_sql(&format!(
        "SET backend_flush_after = '{BACKFILL_FLUSH_AFTER}'; SET client_min_messages = warning"
    ))
    .execute(&mut *connection)
    .await
    .map_err(failed)?;
    let built = sqlx::raw_sql(statement).execute(&mut *connection).await;
    let reset = sqlx::raw_sql("RESET backend_flush_after; RESET client_min_messages")
        .execute(&mut *connection)
        .await;
    built.map_err(failed)?;
    reset.map_err(failed)?;
    Ok(())
}

/// A `CREATE … INDEX CONCURRENTLY IF NOT EXISTS name` that failed earlier leaves an invalid
/// index of that name, which `IF NOT EXISTS` would keep: dropped first.
async fn drop_if_invalid(db: &DatabaseConnection, statement: &str) -> Result<(), Error> {
    let Some(name) = statement
        .split("IF NOT EXISTS ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
    else {
        return Ok(());
    };
    let invalid = db
        .query_one(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            format!(
                "SELECT 1 AS invalid FROM pg_index WHERE indexrelid = to_regclass('{name}') \
                 AND NOT indisvalid"
            ),
        ))
        .await?
        .is_some();
    if invalid {
        db.execute_unprepared(&format!("DROP INDEX CONCURRENTLY IF EXISTS {name}"))
            .await?;
    }
    Ok(())
}

/// A lock wait ran out: PostgreSQL's `lock_not_available` (55P03, `lock_timeout`), or
/// MySQL/MariaDB's `ER_LOCK_WAIT_TIMEOUT` (1205, `lock_wait_timeout` for a metadata lock).
pub(super) fn is_lock_timeout(error: &DbErr) -> bool {
    use sea_orm::sqlx::mysql::MySqlDatabaseError;
    let (DbErr::Exec(RuntimeErr::SqlxError(error)) | DbErr::Query(RuntimeErr::SqlxError(error))) =
        error
    else {
        return false;
    };
    let Some(error) = error.as_database_error() else {
        return false;
    };
    match error.try_downcast_ref::<MySqlDatabaseError>() {
        Some(mysql) => mysql.number() == 1205,
        None => error.code().is_some_and(|code| code == "55P03"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::columns::{ColumnName, Columns};
    use crate::sql::TableName;

    #[test]
    fn a_position_is_added_without_a_rewrite_and_indexes_concurrently() {
        let table = TableName::parse("outbox").unwrap();
        let columns = Columns {
            position: ColumnName::parse("seq").unwrap(),
            ..Columns::default()
        };
        let cx = Context {
            dialect: Dialect::Postgres,
            table: &table,
            columns: &columns,
            shape: None,
            adopting: true,
        };
        let added = add_position(&cx, "seq");
        assert_eq!(added[1], "ALTER TABLE outbox ADD COLUMN seq BIGINT NULL");
        assert!(added.iter().all(|s| !s.contains("BIGSERIAL")), "{added:?}");
        let finish = finish_statements(&cx);
        assert!(finish[0].contains("ctid >= '(0,0)'::tid"), "{}", finish[0]);
        assert!(finish[0].contains("backend_flush_after"), "{}", finish[0]);
        assert!(finish[1..]
            .iter()
            .all(|s| s.contains(" INDEX CONCURRENTLY IF NOT EXISTS ")));
        let created = super::super::notify::create_notify(&cx).unwrap();
        assert_eq!(
            created[3],
            "ALTER TABLE outbox DISABLE TRIGGER outbox_notify"
        );
        assert!(created[4].contains(DISABLED_UNTIL_FINISHED), "{created:?}");
        let fresh = Context {
            adopting: false,
            ..cx
        };
        assert_eq!(
            super::super::notify::create_notify(&fresh).unwrap().len(),
            3
        );
        assert_eq!(retry_delay(1), Duration::from_millis(100));
        assert_eq!(retry_delay(30), Duration::from_millis(1600));
    }
}
