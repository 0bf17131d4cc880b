//! [`SeaOrmStore`]: the [`OutboxStore`] port on a sea-orm connection pool.

use crate::entity::ClaimedRow;
use crate::sql::{time_expr, Params, TableName, PIN_INDEX_PLAN};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use outbox_core::{
    Backlog, ClaimRequest, MarkBatch, Ordering, OutboxRecord, OutboxStats, OutboxStore,
    PurgeTarget, StoreError,
};
use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, DbErr,
    FromQueryResult, IsolationLevel, QueryResult, TransactionTrait,
};
use std::time::Duration;

/// Opens a pool of at most `max_connections` to `url` (`postgres://`, `mysql://`, `sqlite://`);
/// plain text unless the URL asks for TLS (see [`crate::connection_url`]).
pub async fn connect(url: &str, max_connections: u32) -> Result<DatabaseConnection, DbErr> {
    // sea-orm's own message for an unparsable URL quotes it, password and all.
    if url::Url::parse(url).is_err() {
        return Err(DbErr::Conn(sea_orm::RuntimeErr::Internal(
            "the database URL cannot be parsed".into(),
        )));
    }
    let mut options = ConnectOptions::new(crate::connection_url(url));
    options
        .max_connections(max_connections)
        .min_connections(1)
        .connect_timeout(Duration::from_secs(5))
        // A claim or flush waits at most this long for a free connection.
        .acquire_timeout(Duration::from_secs(5))
        // No ping before every acquire: it was one more round trip per claim and per
        // flush. A connection that died fails its statement instead, sqlx drops it, and
        // the claim or flush is retried with backoff like any database error.
        .test_before_acquire(false)
        .sqlx_logging(std::env::var_os("OUTBOX_SQLX_LOG").is_some());
    let db = Database::connect(options).await?;
    if db.get_database_backend() == DbBackend::Sqlite {
        // Readers (status, producers) do not block the relay's writes, and vice versa.
        db.execute_unprepared("PRAGMA journal_mode = WAL").await?;
    }
    Ok(db)
}

/// The outbox table of one database.
#[derive(Debug, Clone)]
pub struct SeaOrmStore {
    db: DatabaseConnection,
    table: TableName,
}

fn database(error: DbErr) -> StoreError {
    StoreError::Database(error.to_string())
}

impl SeaOrmStore {
    /// A store for `table` on an open connection pool.
    pub fn new(db: DatabaseConnection, table: TableName) -> Self {
        Self { db, table }
    }

    /// The connection pool (for producers in tests and the demo).
    pub fn connection(&self) -> &DatabaseConnection {
        &self.db
    }

    /// The table this store works on.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    fn backend(&self) -> DbBackend {
        self.db.get_database_backend()
    }

    /// Names the index a claim must walk. SQLite picks the `(status, published_at)` index
    /// for `status = 'pending'` and sorts every pending row when it has no statistics;
    /// MySQL, with stale statistics, probes a room through `(room_id, id)` and reads every
    /// published row of the room's history. (PostgreSQL: see `claim_returning`.)
    fn index_hint(&self, index: &str) -> String {
        match self.backend() {
            DbBackend::Sqlite => format!(" INDEXED BY {}_{index}", self.table),
            DbBackend::MySql => format!(" FORCE INDEX ({}_{index})", self.table),
            DbBackend::Postgres => String::new(),
        }
    }

    /// The conditions that make row alias `c` publishable for `request.node_id` at `now`.
    fn claimable(&self, params: &mut Params, now: DateTime<Utc>, request: &ClaimRequest) -> String {
        let backend = self.backend();
        let t = self.table.as_str();
        let at = |params: &mut Params| time_expr(backend, &params.bind_time(now));
        let mut sql = format!(
            "c.status = 'pending' AND {} <= {} AND (c.locked_until IS NULL OR {} < {})",
            time_expr(backend, "c.available_at"),
            at(params),
            time_expr(backend, "c.locked_until"),
            at(params),
        );
        if request.ordering == Ordering::PerRoom {
            // Per-room order: no row is published while an earlier row of its room is
            // unresolved. A row is claimable only while no earlier pending row of its room
            // is waiting out a backoff (or a producer's delay) or leased to another node.
            // Every earlier pending row is then either claimable itself — it has a lower
            // id, so `ORDER BY id LIMIT n` takes it first, in this same claim — or already
            // leased to this node, hence queued before it in the room's Publisher, which
            // publishes a room in claim order, one confirm at a time, and holds the room
            // back after a failure until the failure is written (see outbox-relay's
            // Publisher). So a claim takes a prefix of each room this node may work on,
            // and may go deeper into rooms the node already holds.
            //
            // The check probes the partial `_pending_room_idx` once per candidate: the
            // earliest pending rows of a room come first, so a blocked room is found at
            // once. On PostgreSQL `OFFSET 0` keeps the planner from turning the probe into
            // an anti-join that scans every pending row (9 ms instead of 1 ms at 10,000
            // pending rows).
            let fence = if backend == DbBackend::Postgres {
                " OFFSET 0"
            } else {
                ""
            };
            // `?` placeholders are positional: bind in the order they appear.
            let waiting = format!("{} > {}", time_expr(backend, "e.available_at"), at(params));
            let leased = format!("{} >= {}", time_expr(backend, "e.locked_until"), at(params));
            let node = params.bind(request.node_id.as_str());
            let hint = self.index_hint("pending_room_idx");
            sql.push_str(&format!(
                " AND NOT EXISTS (SELECT 1 FROM {t} e{hint} WHERE e.room_id = c.room_id \
                 AND e.status = 'pending' AND e.id < c.id \
                 AND ({waiting} OR ({leased} AND e.locked_by <> {node})){fence})"
            ));
        }
        sql
    }

    async fn claim_returning(&self, request: &ClaimRequest) -> Result<Vec<ClaimedRow>, DbErr> {
        let backend = self.backend();
        let t = self.table.as_str();
        let now = Utc::now();
        let mut params = Params::new(backend);
        let node = params.bind(request.node_id.as_str());
        let until = params.bind_time(now + lease(request));
        let claimable = self.claimable(&mut params, now, request);
        let limit = params.bind(limit(request));
        // PostgreSQL skips rows another claimer holds; SQLite runs the single statement
        // under its database write lock, which serialises claims.
        let lock = if backend == DbBackend::Postgres {
            " FOR UPDATE SKIP LOCKED"
        } else {
            ""
        };
        let hint = self.index_hint("pending_idx");
        let candidates = format!(
            "SELECT c.id FROM {t} c{hint} WHERE {claimable} ORDER BY c.id LIMIT {limit}{lock}"
        );
        // PostgreSQL: `= ANY(ARRAY(…))` makes the update a probe of the primary key per
        // claimed id; `IN (…)` planned a hash of the candidates and a join (measured with
        // 100 rows of 100,000 pending: 0.6–0.9 ms instead of 1.6 ms, planning 0.2 instead
        // of 0.5 ms).
        let ids = match backend {
            DbBackend::Postgres => format!("= ANY(ARRAY({candidates}))"),
            _ => format!("IN ({candidates})"),
        };
        let sql = format!(
            "UPDATE {t} SET locked_by = {node}, locked_until = {until} WHERE id {ids} \
             RETURNING {COLUMNS}"
        );
        if backend != DbBackend::Postgres {
            return ClaimedRow::find_by_statement(params.statement(sql))
                .all(&self.db)
                .await;
        }
        // Pin the plan: walk the pending index in id order and stop at the limit. With
        // statistics that lag behind the queue (autovacuum off, or a table analysed while
        // empty), PostgreSQL otherwise fetches every pending row, runs the per-room probe
        // on each and sorts: measured 454 ms instead of 3.4 ms per claim at 10,000
        // pending rows. SET LOCAL ends with the transaction.
        // The settings (plan, and a relaxed commit: see RELAXED_COMMIT) and the claim
        // lock go in one simple-protocol round trip.
        let txn = self.db.begin().await?;
        let mut prelude = format!(
            "{PIN_INDEX_PLAN}, set_config('enable_sort', 'off', true), \
             set_config('synchronous_commit', 'off', true)"
        );
        if request.ordering == Ordering::PerRoom {
            prelude.push_str("; ");
            prelude.push_str(&self.claim_lock_sql());
        }
        txn.execute_unprepared(&prelude).await?;
        let rows = ClaimedRow::find_by_statement(params.statement(sql))
            .all(&txn)
            .await?;
        txn.commit().await?;
        Ok(rows)
    }

    /// MySQL has neither `UPDATE … RETURNING` nor `LIMIT` in an `IN` subquery of the
    /// updated table: select, then update, in one transaction.
    async fn claim_mysql(&self, request: &ClaimRequest) -> Result<Vec<ClaimedRow>, DbErr> {
        let t = self.table.as_str();
        let now = Utc::now();
        // Per-room claims: the claim lock serialises them across nodes, and the candidates
        // are read without row locks. InnoDB takes a transaction's snapshot at its first
        // plain read — the candidate SELECT, after the lock was granted — so it sees every
        // earlier claim, with no `SET TRANSACTION` round trip. Locking reads were the slow
        // part of the claim (every in-flight row skipped and every per-room probe took and
        // dropped a row lock), and on MariaDB `SKIP LOCKED` also applied inside the
        // per-room subquery, hiding earlier events of a room.
        // Without ordering: no claim lock; `SKIP LOCKED` lets nodes claim side by side,
        // under READ COMMITTED so that no gap lock holds up producers' inserts.
        let (txn, lock) = match request.ordering {
            Ordering::PerRoom => {
                let txn = self.db.begin().await?;
                self.take_claim_lock(&txn).await?;
                (txn, "")
            }
            Ordering::None => {
                let txn = self
                    .db
                    .begin_with_config(Some(IsolationLevel::ReadCommitted), None)
                    .await?;
                (txn, " FOR UPDATE SKIP LOCKED")
            }
        };
        let mut params = Params::new(DbBackend::MySql);
        let claimable = self.claimable(&mut params, now, request);
        let limit = params.bind(limit(request));
        let hint = self.index_hint("pending_idx");
        let sql = format!(
            "SELECT {COLUMNS} FROM {t} c{hint} WHERE {claimable} ORDER BY c.id LIMIT {limit}{lock}"
        );
        let mut rows = ClaimedRow::find_by_statement(params.statement(sql))
            .all(&txn)
            .await?;
        if !rows.is_empty() {
            let ids: Vec<i64> = rows.iter().map(|row| row.id).collect();
            let mut params = Params::new(DbBackend::MySql);
            let node = params.bind(request.node_id.as_str());
            let until = params.bind_time(now + lease(request));
            let list = params.bind_ids(&ids);
            // `status = 'pending'`: a row read without a lock may have been marked
            // published meanwhile, by a node whose lease on it had expired.
            let sql = format!(
                "UPDATE {t} SET locked_by = {node}, locked_until = {until} \
                 WHERE id IN ({list}) AND status = 'pending'"
            );
            let updated = txn.execute(params.statement(sql)).await?.rows_affected();
            if updated < rows.len() as u64 {
                // Rare: keep only the rows this claim leased.
                let mut params = Params::new(DbBackend::MySql);
                let list = params.bind_ids(&ids);
                let node = params.bind(request.node_id.as_str());
                let leased: std::collections::HashSet<i64> = txn
                    .query_all(params.statement(format!(
                        "SELECT id FROM {t} WHERE id IN ({list}) AND locked_by = {node} \
                         AND status = 'pending'"
                    )))
                    .await?
                    .iter()
                    .map(|row| row.try_get::<i64>("", "id"))
                    .collect::<Result<_, _>>()?;
                rows.retain(|row| leased.contains(&row.id));
            }
        }
        txn.commit().await?;
        Ok(rows)
    }

    /// Serialises per-room claims of all nodes on this table: waits for the row lock on
    /// `<table>_lock`, held until the claim commits.
    ///
    /// Why: a claim checks, in its snapshot, that no earlier row of a candidate's room is
    /// leased to another node. Two claims running at once would each see the other's rows
    /// as still free (uncommitted leases are invisible, and `SKIP LOCKED` hides the rows
    /// themselves), so node A could take row 1 of a room while node B takes row 2. With
    /// claims serialised, every claim's snapshot (taken after the lock, under READ
    /// COMMITTED) holds every earlier claim. Only the claim statement is serialised —
    /// a few milliseconds — while publishing and marking run in parallel on every node.
    async fn take_claim_lock<C: ConnectionTrait>(&self, txn: &C) -> Result<(), DbErr> {
        txn.execute_unprepared(&self.claim_lock_sql()).await?;
        Ok(())
    }

    fn claim_lock_sql(&self) -> String {
        format!(
            "SELECT name FROM {}_lock WHERE name = 'claim' FOR UPDATE",
            self.table
        )
    }

    /// One statement per kind of outcome. A batch of one kind (the common case: all
    /// published) is a single statement, atomic by itself, so it runs without BEGIN and
    /// COMMIT round trips; a mixed batch runs in one transaction.
    async fn mark_batch(&self, node_id: &str, batch: &MarkBatch) -> Result<(), DbErr> {
        let backend = self.backend();
        let t = self.table.as_str();
        let now = Utc::now();
        let mut statements: Vec<(Params, String)> = Vec::with_capacity(4);
        if !batch.published.is_empty() {
            // The broker confirmed: `published` wins even if the lease was lost meanwhile.
            let mut params = Params::new(backend);
            let at = params.bind_time(now);
            let ids = params.any_of(&batch.published);
            let sql = format!(
                "UPDATE {t} SET status = 'published', published_at = {at}, locked_by = NULL, \
                 locked_until = NULL WHERE id {ids} AND status <> 'published'"
            );
            statements.push((params, sql));
        }
        if !batch.retried.is_empty() {
            let mut params = Params::new(backend);
            let mut errors = String::from("CASE id");
            for (failure, _) in &batch.retried {
                let id = params.bind(failure.id);
                let error = params.bind(failure.error.as_str());
                errors.push_str(&format!(" WHEN {id} THEN {error}"));
            }
            errors.push_str(" END");
            let mut available = String::from("CASE id");
            for (failure, at) in &batch.retried {
                let id = params.bind(failure.id);
                let at = params.bind_time(*at);
                available.push_str(&format!(" WHEN {id} THEN {at}"));
            }
            available.push_str(" END");
            let ids: Vec<i64> = batch
                .retried
                .iter()
                .map(|(failure, _)| failure.id)
                .collect();
            let ids = params.any_of(&ids);
            let node = params.bind(node_id);
            let sql = format!(
                "UPDATE {t} SET retry_count = retry_count + 1, last_error = {errors}, \
                 available_at = {available}, locked_by = NULL, locked_until = NULL \
                 WHERE id {ids} AND status = 'pending' AND locked_by = {node}"
            );
            statements.push((params, sql));
        }
        if !batch.dead.is_empty() {
            let mut params = Params::new(backend);
            let mut errors = String::from("CASE id");
            for failure in &batch.dead {
                let id = params.bind(failure.id);
                let error = params.bind(failure.error.as_str());
                errors.push_str(&format!(" WHEN {id} THEN {error}"));
            }
            errors.push_str(" END");
            let ids: Vec<i64> = batch.dead.iter().map(|failure| failure.id).collect();
            let ids = params.any_of(&ids);
            let node = params.bind(node_id);
            let sql = format!(
                "UPDATE {t} SET status = 'dead', retry_count = retry_count + 1, \
                 last_error = {errors}, locked_by = NULL, locked_until = NULL \
                 WHERE id {ids} AND status = 'pending' AND locked_by = {node}"
            );
            statements.push((params, sql));
        }
        if !batch.released.is_empty() {
            let mut params = Params::new(backend);
            let ids = params.any_of(&batch.released);
            let node = params.bind(node_id);
            let sql = format!(
                "UPDATE {t} SET locked_by = NULL, locked_until = NULL \
                 WHERE id {ids} AND status = 'pending' AND locked_by = {node}"
            );
            statements.push((params, sql));
        }
        if statements.len() == 1 {
            let (params, sql) = statements.remove(0);
            let sql = if backend == DbBackend::Postgres {
                relaxed_commit(&sql)
            } else {
                sql
            };
            self.db.execute(params.statement(sql)).await?;
            return Ok(());
        }
        let txn = self.db.begin().await?;
        if backend == DbBackend::Postgres {
            txn.execute_unprepared(RELAXED_COMMIT).await?;
        }
        for (params, sql) in statements {
            txn.execute(params.statement(sql)).await?;
        }
        txn.commit().await
    }

    async fn read_stats(&self) -> Result<OutboxStats, DbErr> {
        let backend = self.backend();
        let t = self.table.as_str();
        let now = Utc::now();
        let mut stats = OutboxStats::default();
        let rows = self
            .db
            .query_all(Params::new(backend).statement(format!(
                "SELECT status, COUNT(*) AS n FROM {t} GROUP BY status"
            )))
            .await?;
        for row in rows {
            let count = count(&row, "n")?;
            match row.try_get::<String>("", "status")?.as_str() {
                "pending" => stats.pending = count,
                "published" => stats.published = count,
                "dead" => stats.dead = count,
                _ => {}
            }
        }
        let oldest = self
            .db
            .query_one(Params::new(backend).statement(format!(
                "SELECT MIN(created_at) AS oldest FROM {t} WHERE status = 'pending'"
            )))
            .await?;
        if let Some(row) = oldest {
            let oldest: Option<DateTime<Utc>> = row.try_get("", "oldest")?;
            stats.oldest_pending_age_seconds =
                oldest.map(|at| ((now - at).num_milliseconds().max(0) as f64) / 1000.0);
        }
        let mut params = Params::new(backend);
        let at = time_expr(backend, &params.bind_time(now));
        let rows = self
            .db
            .query_all(params.statement(format!(
                "SELECT locked_by, COUNT(*) AS n FROM {t} WHERE status = 'pending' \
                 AND locked_by IS NOT NULL AND {} >= {at} GROUP BY locked_by",
                time_expr(backend, "locked_until")
            )))
            .await?;
        for row in rows {
            stats
                .claimed
                .insert(row.try_get("", "locked_by")?, count(&row, "n")?);
        }
        let mut params = Params::new(backend);
        let at = time_expr(backend, &params.bind_time(now));
        let expired = self
            .db
            .query_one(params.statement(format!(
                "SELECT COUNT(*) AS n FROM {t} WHERE status = 'pending' \
                 AND locked_until IS NOT NULL AND {} < {at}",
                time_expr(backend, "locked_until")
            )))
            .await?;
        if let Some(row) = expired {
            stats.expired_leases = count(&row, "n")?;
        }
        Ok(stats)
    }

    /// Pending rows and the oldest one's age, from pending rows only (the metrics ask every
    /// few seconds; `read_stats` counts every row of the table, which grows with the
    /// retention). Walks the pending index, as the claim does: measured on PostgreSQL with
    /// 200 pending among 200,000 rows, 0.3 ms, where `read_stats`'s count took 64 ms.
    async fn read_backlog(&self) -> Result<Backlog, DbErr> {
        let backend = self.backend();
        let t = self.table.as_str();
        let hint = self.index_hint("pending_idx");
        let sql = format!(
            "SELECT COUNT(*) AS n, MIN(created_at) AS oldest FROM {t}{hint} WHERE status = 'pending'"
        );
        let now = Utc::now();
        let row = if backend == DbBackend::Postgres {
            // The claim's reason for pinning its plan holds here too: with statistics that
            // lag behind the queue, a scan of every published row can look cheaper than
            // the partial pending index.
            let txn = self.db.begin().await?;
            txn.execute_unprepared(PIN_INDEX_PLAN).await?;
            let row = txn.query_one(Params::new(backend).statement(sql)).await?;
            txn.commit().await?;
            row
        } else {
            self.db
                .query_one(Params::new(backend).statement(sql))
                .await?
        };
        let Some(row) = row else {
            return Ok(Backlog::default());
        };
        let oldest: Option<DateTime<Utc>> = row.try_get("", "oldest")?;
        Ok(Backlog {
            pending: count(&row, "n")?,
            oldest_pending_age_seconds: oldest
                .map(|at| ((now - at).num_milliseconds().max(0) as f64) / 1000.0),
        })
    }
}

/// PostgreSQL: the relay's own bookkeeping (leases and outcomes) commits without waiting
/// for the WAL flush (`synchronous_commit = off` for that transaction only; producers'
/// inserts are untouched). Waiting for an fsync on every claim and every flush was the
/// relay's largest cost per batch, and it grows on cloud disks. What a database crash can
/// then lose is the last few hundred milliseconds of leases and outcomes: those rows are
/// pending and free again, so they are published again — duplicates, as after an expired
/// lease, never a lost event and never a broken room order (visibility to other
/// sessions is unchanged; only durability waits less).
const RELAXED_COMMIT: &str = "SET LOCAL synchronous_commit = off";

/// `sql`, a single `UPDATE … WHERE …`, made to relax its own commit (see
/// [`RELAXED_COMMIT`]) without a round trip of its own: a one-time condition on a CTE
/// that sets the transaction-local setting before any row is written.
fn relaxed_commit(sql: &str) -> String {
    format!(
        "WITH relaxed AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true)) \
         {sql} AND EXISTS (SELECT 1 FROM relaxed)"
    )
}

/// The columns of [`ClaimedRow`].
const COLUMNS: &str =
    "id, event_id, event_type, room_id, envelope, headers, retry_count, created_at";

fn lease(request: &ClaimRequest) -> chrono::Duration {
    chrono::Duration::from_std(request.lease).unwrap_or(chrono::Duration::seconds(30))
}

fn limit(request: &ClaimRequest) -> i64 {
    i64::try_from(request.limit).unwrap_or(i64::MAX)
}

fn count(row: &QueryResult, column: &str) -> Result<u64, DbErr> {
    Ok(u64::try_from(row.try_get::<i64>("", column)?).unwrap_or(0))
}

#[async_trait]
impl OutboxStore for SeaOrmStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<Vec<OutboxRecord>, StoreError> {
        let mut rows = match self.backend() {
            DbBackend::MySql => self.claim_mysql(request).await,
            _ => self.claim_returning(request).await,
        }
        .map_err(database)?;
        // RETURNING does not promise any order.
        rows.sort_unstable_by_key(|row| row.id);
        Ok(rows.into_iter().map(OutboxRecord::from).collect())
    }

    async fn mark(&self, node_id: &str, batch: &MarkBatch) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        self.mark_batch(node_id, batch).await.map_err(database)
    }

    async fn release_node(&self, node_id: &str) -> Result<u64, StoreError> {
        let t = self.table.as_str();
        let mut params = Params::new(self.backend());
        let node = params.bind(node_id);
        let result = self
            .db
            .execute(params.statement(format!(
                "UPDATE {t} SET locked_by = NULL, locked_until = NULL \
                 WHERE locked_by = {node} AND status = 'pending'"
            )))
            .await
            .map_err(database)?;
        Ok(result.rows_affected())
    }

    async fn renew(&self, node_id: &str, lease: Duration) -> Result<u64, StoreError> {
        let t = self.table.as_str();
        let mut params = Params::new(self.backend());
        let lease = chrono::Duration::from_std(lease).unwrap_or(chrono::Duration::seconds(30));
        let until = params.bind_time(Utc::now() + lease);
        let node = params.bind(node_id);
        let result = self
            .db
            .execute(params.statement(format!(
                "UPDATE {t} SET locked_until = {until} WHERE locked_by = {node} AND status = 'pending'"
            )))
            .await
            .map_err(database)?;
        Ok(result.rows_affected())
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        self.read_stats().await.map_err(database)
    }

    async fn backlog(&self) -> Result<Backlog, StoreError> {
        self.read_backlog().await.map_err(database)
    }

    async fn purge(
        &self,
        target: PurgeTarget,
        older_than: DateTime<Utc>,
        limit: usize,
    ) -> Result<u64, StoreError> {
        // The statements live in retention.rs.
        self.purge_rows(target, older_than, limit)
            .await
            .map_err(database)
    }
}
