//! [`SeaOrmStore`]: the [`OutboxStore`] port on a sea-orm connection pool. The statements
//! live beside it: `claim/`, `mark.rs`, `stats.rs`, `retention.rs`.

use crate::columns::{Columns, MappingProblem, BOOKKEEPING};
use crate::dialect::Dialect;
use crate::error::Error;
use crate::failover::Failover;
use crate::migration;
use crate::planner::StatisticsWatch;
use crate::reads::Reads;
use crate::shape::TableShape;
use crate::sql::TableName;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use outbox_core::{
    Backlog, ClaimRequest, Claimed, MarkBatch, NodeHold, OutboxRecord, OutboxStats, OutboxStore,
    PublishedRows, PurgeTarget, StoreError,
};
use sea_orm::{
    ConnectOptions, ConnectionTrait, DatabaseConnection, DbErr, Statement, TransactionTrait,
};
use std::sync::Arc;
use std::time::Duration;

/// An open connection pool and, for a PostgreSQL or MySQL/MariaDB pool that [`connect`]
/// opened, its failover state (`failover.rs`), which the pool's hooks and every store on
/// it share. A pool opened elsewhere ([`From<DatabaseConnection>`]) has none: its stores
/// do not follow a failover.
#[derive(Debug, Clone)]
pub struct Pool {
    connection: DatabaseConnection,
    failover: Option<Arc<Failover>>,
}

impl Pool {
    /// The sea-orm connection.
    pub fn connection(&self) -> &DatabaseConnection {
        &self.connection
    }

    /// The sea-orm connection, the failover state let go.
    pub fn into_connection(self) -> DatabaseConnection {
        self.connection
    }
}

impl Pool {
    /// `connection` with the failover state its hooks were given.
    pub(crate) fn with_failover(connection: DatabaseConnection, failover: Arc<Failover>) -> Self {
        Self {
            connection,
            failover: Some(failover),
        }
    }
}

impl From<DatabaseConnection> for Pool {
    fn from(connection: DatabaseConnection) -> Self {
        Self {
            connection,
            failover: None,
        }
    }
}

/// Opens a pool of at most `max_connections` to `url` (`postgres://`, `mysql://`, `sqlite://`);
/// TLS as libpq decides it (see [`crate::connection_url()`]). Connections
/// live at most [`PoolSettings::DEFAULT_MAX_LIFETIME`] and idle at most
/// [`PoolSettings::DEFAULT_IDLE_TIMEOUT`]; [`connect_with`] sets both.
pub async fn connect(url: &str, max_connections: u32) -> Result<Pool, Error> {
    connect_with(url, &PoolSettings::new(max_connections)).await
}

/// The pool's size and how long its connections may live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSettings {
    /// At most this many connections.
    pub max_connections: u32,
    /// A connection is closed once this old (when returned, or found idle): bounds how
    /// long the pool stays on a server after its name or address moved. `None`: never.
    pub max_lifetime: Option<Duration>,
    /// A connection idle this long is closed. `None`: never.
    pub idle_timeout: Option<Duration>,
}

impl PoolSettings {
    /// The default of `database.max_connection_lifetime`, as HikariCP's `maxLifetime`
    /// and pgjdbc users are used to: minutes, not sqlx's half hour.
    pub const DEFAULT_MAX_LIFETIME: Duration = Duration::from_secs(5 * 60);
    /// The default of `database.idle_timeout`.
    pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

    /// `max_connections` with the default lifetime and idle time.
    pub fn new(max_connections: u32) -> Self {
        Self {
            max_connections,
            max_lifetime: Some(Self::DEFAULT_MAX_LIFETIME),
            idle_timeout: Some(Self::DEFAULT_IDLE_TIMEOUT),
        }
    }
}

/// [`connect`] with the pool's size and connection lifetimes from `pool`.
pub async fn connect_with(url: &str, pool: &PoolSettings) -> Result<Pool, Error> {
    let max_connections = pool.max_connections;
    // sea-orm's own message for an unparsable URL quotes it, password and all.
    let hosts: Vec<String> = crate::hosts::split(url)
        .iter()
        .map(|host| crate::connection_url(host))
        .collect();
    if hosts.iter().any(|host| url::Url::parse(host).is_err()) {
        return Err(Error::InvalidUrl);
    }
    let mut options = ConnectOptions::new(hosts[0].clone());
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
    if let Some(lifetime) = pool.max_lifetime {
        options.max_lifetime(lifetime);
    }
    if let Some(idle) = pool.idle_timeout {
        options.idle_timeout(idle);
    }
    let pool = crate::pool::open(options, hosts)
        .await
        .map_err(|cause| Error::Connect {
            reason: crate::error::describe(&cause),
            cause,
        })?;
    if let Some(setup) = Dialect::of(&pool.connection).database_setup() {
        pool.connection.execute_unprepared(setup).await?;
    }
    Ok(pool)
}

/// The outbox table of one database.
#[derive(Debug, Clone)]
pub struct SeaOrmStore {
    db: DatabaseConnection,
    table: TableName,
    columns: Columns,
    /// How the statements read the mapped columns (casts learned by `check_columns`).
    reads: Reads,
    /// PostgreSQL: when a full claim last checked the planner's statistics.
    statistics: Arc<StatisticsWatch>,
    /// The pool's failover state (PostgreSQL, MySQL/MariaDB): a read-only answer to a
    /// statement retires the pool's connections (`failover.rs`).
    failover: Option<Arc<Failover>>,
    /// What the mark does to a published row: `UPDATE` it or `DELETE` it.
    published_rows: PublishedRows,
    /// PostgreSQL: a session connection's URL for the node lock, where the pool goes
    /// through a pooler in transaction mode (`database.listen_url`).
    session_url: Option<String>,
}

impl SeaOrmStore {
    /// A store for `table` on an open connection pool, with the relay's own column names.
    /// It follows a failover when `db` is a [`Pool`] that [`connect`] opened.
    pub fn new(db: impl Into<Pool>, table: TableName) -> Self {
        let Pool {
            connection: db,
            failover,
        } = db.into();
        let columns = Columns::default();
        let reads = Reads::plain(Dialect::of(&db), &columns);
        Self {
            db,
            table,
            columns,
            reads,
            statistics: Arc::default(),
            failover,
            published_rows: PublishedRows::Keep,
            session_url: None,
        }
    }

    /// The same store taking its node lock ([`crate::NodeLock`]) on a session connection to
    /// `url` (PostgreSQL), where the pool goes through a pooler in transaction mode.
    pub fn with_session_url(mut self, url: Option<String>) -> Self {
        self.session_url = url;
        self
    }

    /// The same store with published rows kept (marked `published`, the default) or
    /// deleted when their outcome is written (`relay.published_rows`).
    pub fn with_published_rows(mut self, rows: PublishedRows) -> Self {
        self.published_rows = rows;
        self
    }

    /// What the mark does to a published row.
    pub fn published_rows(&self) -> PublishedRows {
        self.published_rows
    }

    /// The same store with claims cancelled after `timeout` instead of 1 s (PostgreSQL):
    /// a cancelled claim checks the planner's statistics and claims again
    /// (docs/design/claim-plans.md#statistics.
    pub fn with_claim_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.statistics = Arc::new(StatisticsWatch::with_claim_timeout(timeout));
        self
    }

    /// The same store reading the producer's columns as `columns` names them. Call
    /// [`SeaOrmStore::check_columns`] before relaying: it learns the columns' types.
    pub fn with_columns(mut self, columns: Columns) -> Self {
        self.reads = Reads::plain(self.dialect(), &columns);
        self.columns = columns;
        self
    }

    /// The column mapping.
    pub fn columns(&self) -> &Columns {
        &self.columns
    }

    /// Reads the table's columns and checks the mapping against them: every mapped column
    /// exists and has a type that can serve it, and the bookkeeping columns are there
    /// (the table was migrated). On success the store reads each mapped column the way
    /// its type needs (a `jsonb` payload as its text, `bytea` as bytes).
    /// [`Error::NoTable`] when the table does not exist, [`Error::Mapping`] with every
    /// problem of the mapping found, [`Error::NotMigrated`] when the mapping fits but the
    /// table lacks bookkeeping columns (a producer's table that `migrate` has yet to adopt;
    /// a position, headers or created_at column it would add is not counted as missing).
    pub async fn check_columns(&mut self) -> Result<(), Error> {
        self.columns.validate().map_err(|problems| Error::Mapping {
            table: self.table.clone(),
            problems,
        })?;
        let dialect = self.dialect();
        let Some(shape) = TableShape::read(&self.db, self.table.as_str()).await? else {
            return Err(Error::NoTable(self.table.clone()));
        };
        let reads = Reads::checked(dialect, &self.table, &self.columns, &shape);
        let unmigrated: Vec<&'static str> = BOOKKEEPING
            .into_iter()
            .filter(|column| !shape.has(column))
            .collect();
        match reads {
            Ok(mut reads) if unmigrated.is_empty() => {
                reads
                    .check_extra(dialect, &self.table, &self.columns, &shape)
                    .map_err(|problems| Error::ExtraColumns {
                        table: self.table.clone(),
                        problems,
                    })?;
                // One statement that reads every mapped column as a claim does, and no
                // row: what the catalogue cannot tell (a column named by a reserved word,
                // a cast the database refuses) fails here, at start, not at the first claim.
                let t = &self.table;
                let probe = format!("SELECT {} FROM {t} WHERE 1 = 0", reads.claimed_columns());
                if let Err(error) = self.db.execute_unprepared(&probe).await {
                    return Err(Error::Unreadable {
                        table: t.clone(),
                        reason: error.to_string(),
                        cause: error,
                    });
                }
                self.reads = reads;
                Ok(())
            }
            Ok(_) => Err(Error::NotMigrated {
                table: self.table.clone(),
                missing: unmigrated,
            }),
            Err(problems) => {
                // `migrate` adds a missing position, headers or created_at column: on a
                // table it has yet to adopt, only the other problems are the mapping's.
                let problems: Vec<_> = if unmigrated.is_empty() {
                    problems
                } else {
                    problems
                        .into_iter()
                        .filter(|problem| {
                            !(matches!(problem.problem, MappingProblem::Missing { .. })
                                && migration::adds(problem.setting))
                        })
                        .collect()
                };
                if problems.is_empty() {
                    Err(Error::NotMigrated {
                        table: self.table.clone(),
                        missing: unmigrated,
                    })
                } else {
                    Err(Error::Mapping {
                        table: self.table.clone(),
                        problems,
                    })
                }
            }
        }
    }

    /// [`OutboxStore::hold_node`] with the driver's error kept: [`Error::NodeTaken`] while
    /// another live process runs as `node_id` on the table, [`Error::Database`] when the
    /// database failed the lock's statements (a retry may fix that).
    pub async fn take_node(&self, node_id: &str) -> Result<NodeHold, Error> {
        let session_url = self.session_url.as_deref();
        let lock = crate::NodeLock::take(&self.db, session_url, &self.table, node_id).await?;
        let lost = Box::pin(lock.lost());
        let holding = outbox_core::Holding::new(lock.stands());
        Ok(NodeHold::new(Box::new(lock), lost).with_holding(holding))
    }

    /// How statements read the mapped columns.
    pub(crate) fn reads(&self) -> &Reads {
        &self.reads
    }

    /// The connection pool (for producers in tests and the demo).
    pub fn connection(&self) -> &DatabaseConnection {
        &self.db
    }

    /// The pool with its failover state: for another store on the same pool.
    pub fn pool(&self) -> Pool {
        Pool {
            connection: self.db.clone(),
            failover: self.failover.clone(),
        }
    }

    /// The table this store works on.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    pub(crate) fn dialect(&self) -> Dialect {
        Dialect::of(&self.db)
    }

    /// Runs `statement` and returns the rows it changed. PostgreSQL: in a transaction
    /// whose plans are pinned to the indexes ([`Dialect::pin_index_plan`]), as the
    /// claim's are, so that a statement on pending (or expired) rows walks its index
    /// whatever the statistics say, never the whole table. Elsewhere hints do that.
    pub(crate) async fn execute_on_indexes(&self, statement: Statement) -> Result<u64, DbErr> {
        let db = self.connection();
        let Some(pin) = self.dialect().pin_index_plan() else {
            return Ok(db.execute(statement).await?.rows_affected());
        };
        let txn = db.begin().await?;
        txn.execute_unprepared(pin).await?;
        let changed = txn.execute(statement).await?.rows_affected();
        txn.commit().await?;
        Ok(changed)
    }
}

/// The port's error: the driver's message as text (the core knows no driver).
fn database(error: DbErr) -> StoreError {
    StoreError::Database(error.to_string())
}

impl SeaOrmStore {
    /// The port's error for `error`, after telling the pool's failover state: a read-only
    /// answer retires the connections opened so far, so the retry gets a fresh one.
    fn failed(&self, error: DbErr) -> StoreError {
        if let Some(failover) = &self.failover {
            let read_only = failover.notice(&error);
            let unusable = crate::hosts::server_unusable(&error);
            if read_only || unusable {
                failover.follow(&self.db);
            }
        }
        database(error)
    }
}

#[async_trait]
impl OutboxStore for SeaOrmStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<Vec<OutboxRecord>, StoreError> {
        Ok(self.claim_with_floor(request).await?.records)
    }

    async fn claim_with_floor(&self, request: &ClaimRequest) -> Result<Claimed, StoreError> {
        let postgres = self.dialect() == Dialect::Postgres;
        if postgres {
            self.statistics
                .before_claim(&self.db, &self.table, request.limit)
                .await;
        }
        let started = std::time::Instant::now();
        let timeout = match postgres {
            true => self.statistics.claim_timeout(started),
            false => None,
        };
        let mut leased = match self.claim_rows(request, timeout).await {
            // Cancelled at its timeout: most likely on a plan from stale statistics, which
            // the check refreshes; claimed again either way.
            Err(error) if timeout.is_some() && crate::planner::cancelled(&error) => {
                self.statistics
                    .after_timeout(&self.db, &self.table, request.limit)
                    .await;
                self.claim_rows(request, None).await
            }
            claimed => claimed,
        }
        .map_err(|error| self.failed(error))?;
        if postgres && leased.rows.len() >= request.limit {
            self.statistics
                .after_full_claim(&self.db, &self.table, leased.rows.len(), started.elapsed())
                .await;
        }
        // RETURNING does not promise any order.
        leased.rows.sort_unstable_by_key(|row| row.id);
        Ok(Claimed {
            records: leased.rows.into_iter().map(OutboxRecord::from).collect(),
            floor: leased.next_floor,
        })
    }

    async fn mark(&self, node_id: &str, batch: &MarkBatch) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        self.mark_batch(node_id, batch)
            .await
            .map_err(|error| self.failed(error))
    }

    async fn hold_node(&self, node_id: &str) -> Result<NodeHold, StoreError> {
        Ok(self.take_node(node_id).await?)
    }

    async fn release_node(&self, node_id: &str) -> Result<u64, StoreError> {
        self.release_leases(node_id)
            .await
            .map_err(|error| self.failed(error))
    }

    async fn renew(
        &self,
        node_id: &str,
        lease: Duration,
        up_to: Option<i64>,
    ) -> Result<u64, StoreError> {
        self.renew_leases(node_id, lease, up_to)
            .await
            .map_err(|error| self.failed(error))
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        self.read_stats().await.map_err(|error| self.failed(error))
    }

    async fn backlog(&self) -> Result<Backlog, StoreError> {
        self.read_backlog()
            .await
            .map_err(|error| self.failed(error))
    }

    async fn dead_count(&self) -> Result<u64, StoreError> {
        self.read_dead_count()
            .await
            .map_err(|error| self.failed(error))
    }

    async fn purge(
        &self,
        target: PurgeTarget,
        older_than: DateTime<Utc>,
        limit: usize,
    ) -> Result<u64, StoreError> {
        self.purge_rows(target, older_than, limit)
            .await
            .map_err(|error| self.failed(error))
    }
}
