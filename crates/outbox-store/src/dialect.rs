//! [`Dialect`]: every SQL difference between PostgreSQL, MySQL/MariaDB and SQLite that the
//! statements share (placeholders, time values and comparisons, id lists, index hints, row
//! locks, PostgreSQL's plan pinning and relaxed commit), and [`Params`], which binds values
//! the dialect's way. Statements that differ as a whole are written per backend: the claim
//! (`claim/`), retention and the migrations' DDL.

use crate::sql::{Index, TableName};
use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DbBackend, Statement, Value};

/// The SQL dialect of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// PostgreSQL.
    Postgres,
    /// MySQL and MariaDB.
    MySql,
    /// SQLite.
    Sqlite,
}

/// PostgreSQL, first statement of a transaction: walk the indexes, never a sequential or
/// bitmap scan, for this transaction only. With statistics that lag behind the queue the
/// planner scans every published row or collects every candidate before the `LIMIT`: a
/// claim took 454 ms instead of 3.4 ms at 10,000 pending rows (docs/design/claims.md#the-claim-on-each-backend).
pub(crate) const PIN_INDEX_PLAN: &str =
    "SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true)";

/// PostgreSQL: the relay's own bookkeeping (leases, outcomes) commits without waiting for
/// the WAL flush, for that transaction only. A database crash can then lose the last few
/// hundred milliseconds of leases and outcomes: those rows are published again, as after
/// an expired lease (duplicates, never a lost event; see docs/design/outcomes.md#cheap-commits).
const RELAXED_COMMIT: &str = "SET LOCAL synchronous_commit = off";

/// How SQLite stores timestamps: the format of `strftime('%Y-%m-%d %H:%M:%f')`.
pub(crate) const SQLITE_TIME_FORMAT: &str = "%Y-%m-%d %H:%M:%S%.3f";

impl Dialect {
    /// The dialect of `db`.
    pub(crate) fn of(db: &impl ConnectionTrait) -> Self {
        match db.get_database_backend() {
            DbBackend::Postgres => Dialect::Postgres,
            DbBackend::MySql => Dialect::MySql,
            DbBackend::Sqlite => Dialect::Sqlite,
        }
    }

    fn backend(self) -> DbBackend {
        match self {
            Dialect::Postgres => DbBackend::Postgres,
            Dialect::MySql => DbBackend::MySql,
            Dialect::Sqlite => DbBackend::Sqlite,
        }
    }

    /// What a new pool runs once. SQLite: write-ahead logging, so readers (`status`,
    /// producers) do not block the relay's writes, and vice versa.
    pub(crate) fn database_setup(self) -> Option<&'static str> {
        match self {
            Dialect::Sqlite => Some("PRAGMA journal_mode = WAL"),
            Dialect::Postgres | Dialect::MySql => None,
        }
    }

    /// The placeholder of the `n`th bound value (from 1): `$n`, or a positional `?`.
    fn placeholder(self, n: usize) -> String {
        match self {
            Dialect::Postgres => format!("${n}"),
            Dialect::MySql | Dialect::Sqlite => "?".to_owned(),
        }
    }

    /// `time` in the column representation.
    fn time_value(self, time: DateTime<Utc>) -> Value {
        match self {
            Dialect::Postgres => time.into(),
            Dialect::MySql => time.naive_utc().into(),
            // SQLite has no time type: text in the format of its own defaults, compared
            // through julianday() so producers may write any ISO-8601 form.
            Dialect::Sqlite => time.format(SQLITE_TIME_FORMAT).to_string().into(),
        }
    }

    /// A comparable time expression for a column or placeholder.
    pub(crate) fn time(self, expr: &str) -> String {
        match self {
            Dialect::Sqlite => format!("julianday({expr})"),
            Dialect::Postgres | Dialect::MySql => expr.to_owned(),
        }
    }

    /// After a table in `FROM`: names the index a query must walk. SQLite without
    /// statistics picks the `(status, published_at)` index and sorts every pending row;
    /// MySQL with stale statistics probes a room through `(room_id, id)` and reads its whole
    /// history. PostgreSQL takes no hints: see [`PIN_INDEX_PLAN`].
    pub(crate) fn index_hint(self, table: &TableName, index: Index) -> String {
        match self {
            Dialect::Sqlite => format!(" INDEXED BY {}", table.index(index)),
            Dialect::MySql => format!(" FORCE INDEX ({})", table.index(index)),
            Dialect::Postgres => String::new(),
        }
    }

    /// After a `SELECT`: lock the selected rows, passing over rows another transaction
    /// holds. Nothing on SQLite, whose writers take the database's lock one at a time.
    pub(crate) fn skip_locked(self) -> &'static str {
        match self {
            Dialect::Postgres | Dialect::MySql => " FOR UPDATE SKIP LOCKED",
            Dialect::Sqlite => "",
        }
    }

    /// At the end of a correlated `NOT EXISTS` probe: on PostgreSQL `OFFSET 0` keeps the
    /// planner from turning it into an anti-join that scans every pending row (9 ms
    /// instead of 1 ms at 10,000 pending rows).
    pub(crate) fn probe_fence(self) -> &'static str {
        match self {
            Dialect::Postgres => " OFFSET 0",
            Dialect::MySql | Dialect::Sqlite => "",
        }
    }

    /// The condition after `id` that matches the ids `select` returns. PostgreSQL:
    /// `= ANY(ARRAY(…))` probes the primary key per id, where `IN (…)` planned a hash join
    /// (0.6–0.9 ms instead of 1.6 ms for 100 of 100,000 pending rows).
    pub(crate) fn in_subquery(self, select: &str) -> String {
        match self {
            Dialect::Postgres => format!("= ANY(ARRAY({select}))"),
            Dialect::MySql | Dialect::Sqlite => format!("IN ({select})"),
        }
    }

    /// The size of `expr` (text or bytes) in bytes, not characters.
    pub(crate) fn octet_length(self, expr: &str) -> String {
        match self {
            Dialect::Postgres | Dialect::Sqlite => format!("octet_length({expr})"),
            Dialect::MySql => format!("LENGTH({expr})"),
        }
    }

    /// The first statement of a transaction whose plans must walk the indexes
    /// ([`PIN_INDEX_PLAN`]); `None` where hints do that ([`Dialect::index_hint`]).
    pub(crate) fn pin_index_plan(self) -> Option<&'static str> {
        match self {
            Dialect::Postgres => Some(PIN_INDEX_PLAN),
            Dialect::MySql | Dialect::Sqlite => None,
        }
    }

    /// The first statement of a transaction of the relay's bookkeeping that may commit
    /// without waiting for the disk ([`RELAXED_COMMIT`]); `None` where there is no such
    /// setting per transaction.
    pub(crate) fn relaxed_commit(self) -> Option<&'static str> {
        match self {
            Dialect::Postgres => Some(RELAXED_COMMIT),
            Dialect::MySql | Dialect::Sqlite => None,
        }
    }

    /// `sql`, a single `UPDATE … WHERE …`, made to relax its own commit without a round
    /// trip of its own: a one-time condition on a CTE sets the transaction-local setting
    /// before any row is written. Unchanged where [`Dialect::relaxed_commit`] is `None`.
    pub(crate) fn relax_commit_of(self, sql: String) -> String {
        match self {
            Dialect::Postgres => format!(
                "WITH relaxed AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true)) \
                 {sql} AND EXISTS (SELECT 1 FROM relaxed)"
            ),
            Dialect::MySql | Dialect::Sqlite => sql,
        }
    }
}

/// Collects bound values and hands out the matching placeholders.
///
/// SQLite and MySQL placeholders (`?`) are positional: bind values in the order their
/// placeholders appear in the statement's text (the SQLite tests catch a slip).
#[derive(Debug)]
pub(crate) struct Params {
    dialect: Dialect,
    values: Vec<Value>,
}

impl Params {
    /// An empty parameter list.
    pub(crate) fn new(dialect: Dialect) -> Self {
        Self {
            dialect,
            values: Vec::new(),
        }
    }

    /// An empty parameter list for statements on `db`.
    pub(crate) fn of(db: &impl ConnectionTrait) -> Self {
        Self::new(Dialect::of(db))
    }

    /// Binds `value` and returns its placeholder.
    pub(crate) fn bind(&mut self, value: impl Into<Value>) -> String {
        self.values.push(value.into());
        self.dialect.placeholder(self.values.len())
    }

    /// Binds a timestamp in the column representation.
    pub(crate) fn bind_time(&mut self, time: DateTime<Utc>) -> String {
        let value = self.dialect.time_value(time);
        self.bind(value)
    }

    /// [`Params::bind_time`] as a comparable expression ([`Dialect::time`]).
    pub(crate) fn bind_time_expr(&mut self, time: DateTime<Utc>) -> String {
        let at = self.bind_time(time);
        self.dialect.time(&at)
    }

    /// Binds `ids` and returns the condition that follows a column to match any of them:
    /// `= ANY($n)` with one array on PostgreSQL (one prepared statement whatever the
    /// count), `IN (?, …)` elsewhere.
    pub(crate) fn any_of(&mut self, ids: &[i64]) -> String {
        match self.dialect {
            Dialect::Postgres => format!("= ANY({})", self.bind(ids.to_vec())),
            Dialect::MySql | Dialect::Sqlite => format!("IN ({})", self.bind_ids(ids)),
        }
    }

    /// Binds every id and returns `p1, p2, …` for an `IN (…)` list.
    pub(crate) fn bind_ids(&mut self, ids: &[i64]) -> String {
        ids.iter()
            .map(|id| self.bind(*id))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Finishes a statement with the bound values.
    pub(crate) fn statement(self, sql: String) -> Statement {
        Statement::from_sql_and_values(self.dialect.backend(), sql, self.values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_placeholders_are_numbered() {
        let mut params = Params::new(Dialect::Postgres);
        assert_eq!(params.bind(1i64), "$1");
        assert_eq!(params.bind_ids(&[2, 3]), "$2, $3");
        let mut params = Params::new(Dialect::MySql);
        assert_eq!(params.bind_ids(&[2, 3]), "?, ?");
    }

    #[test]
    fn id_lists_are_one_array_on_postgres() {
        let mut params = Params::new(Dialect::Postgres);
        params.bind(1i64);
        assert_eq!(params.any_of(&[2, 3, 4]), "= ANY($2)");
        let mut params = Params::new(Dialect::Sqlite);
        assert_eq!(params.any_of(&[2, 3]), "IN (?, ?)");
    }

    #[test]
    fn index_hints_name_the_tables_index() {
        let table = TableName::parse("room_outbox").unwrap();
        assert_eq!(
            Dialect::Sqlite.index_hint(&table, Index::Pending),
            " INDEXED BY room_outbox_pending_idx"
        );
        assert_eq!(
            Dialect::MySql.index_hint(&table, Index::PendingRoom),
            " FORCE INDEX (room_outbox_pending_room_idx)"
        );
        assert_eq!(Dialect::Postgres.index_hint(&table, Index::Pending), "");
    }

    #[test]
    fn a_single_update_relaxes_its_own_commit_on_postgres_only() {
        let sql = "UPDATE t SET locked_by = NULL WHERE id = 1".to_owned();
        let relaxed = Dialect::Postgres.relax_commit_of(sql.clone());
        assert!(
            relaxed.starts_with("WITH relaxed AS MATERIALIZED"),
            "{relaxed}"
        );
        assert!(relaxed.ends_with("WHERE id = 1 AND EXISTS (SELECT 1 FROM relaxed)"));
        assert_eq!(Dialect::MySql.relax_commit_of(sql.clone()), sql);
    }
}
