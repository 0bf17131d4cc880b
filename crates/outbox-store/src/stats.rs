//! Reading counts: [`SeaOrmStore::read_stats`] for `status`, and the cheap
//! [`SeaOrmStore::read_backlog`] the metrics ask for every few seconds.

use crate::dialect::{Dialect, Params};
use crate::error::Error;
use crate::sql::{Index, Literal, DEAD, PENDING, PUBLISHED};
use crate::store::SeaOrmStore;
use chrono::{DateTime, Utc};
use outbox_core::{Backlog, FailingEvent, OutboxStats, TableSize};
use sea_orm::{ConnectionTrait, DbErr, FromQueryResult, QueryResult, TransactionTrait};

/// Above this many rows (the catalogue's estimate) `status` estimates the published rows
/// instead of counting them. Counting 1,000,000 published rows on PostgreSQL took 0.1 s
/// over the retention index of a vacuumed table, but 0.8 s reading the heap before the
/// first vacuum (as after a bulk insert), growing with the table: 4.6 GB at 5,000,000.
pub(crate) const EXACT_COUNT_ROWS: u64 = 1_000_000;

/// SQLite: above this file size `status` gives the file's size (`page_count × page_size`)
/// instead of summing the table's pages with `dbstat`, which reads them all.
const DBSTAT_MAX_FILE_BYTES: i64 = 256 * 1024 * 1024;

/// A table as the catalogue describes it.
struct Catalogue {
    /// Estimated rows; `None` where the database keeps no estimate (SQLite).
    rows: Option<u64>,
    /// Bytes on disk, when known.
    size: Option<TableSize>,
}

impl Catalogue {
    /// From a row with `bytes` and, where the backend has one, `n`.
    fn read(row: Option<QueryResult>, method: &'static str) -> Result<Self, DbErr> {
        let Some(row) = row else {
            return Ok(Self {
                rows: None,
                size: None,
            });
        };
        let rows = row.try_get::<Option<i64>>("", "n").ok().flatten();
        let bytes: Option<i64> = row.try_get("", "bytes")?;
        Ok(Self {
            rows: rows.map(|n| u64::try_from(n).unwrap_or(0)),
            size: bytes.map(|bytes| TableSize {
                bytes: u64::try_from(bytes).unwrap_or(0),
                method,
            }),
        })
    }
}

impl SeaOrmStore {
    /// Counts by status and lease, the table's size, from cheap reads: pending rows through
    /// the pending index, dead and published rows through the `(status, published_at)`
    /// index, and on a table the catalogue puts above [`EXACT_COUNT_ROWS`] rows an estimate
    /// of the published rows instead of a count (labelled as such).
    pub(crate) async fn read_stats(&self) -> Result<OutboxStats, DbErr> {
        let dialect = self.dialect();
        let db = self.connection();
        let t = self.table();
        let now = Utc::now();
        let backlog = self.read_backlog().await?;
        let mut stats = OutboxStats {
            pending: backlog.pending,
            oldest_pending_age_seconds: backlog.oldest_pending_age_seconds,
            dead: self.count_status(DEAD).await?,
            ..OutboxStats::default()
        };
        let catalogue = self.read_catalogue().await?;
        match catalogue.rows {
            Some(rows) if rows > EXACT_COUNT_ROWS => {
                stats.published = rows.saturating_sub(stats.pending + stats.dead);
                stats.published_estimated = true;
            }
            _ => stats.published = self.count_status(PUBLISHED).await?,
        }
        stats.size = catalogue.size;
        stats.autovacuum = self.read_autovacuum().await?;
        let mut params = Params::new(dialect);
        let at = params.bind_time_expr(now);
        let rows = db
            .query_all(params.statement(format!(
                "SELECT locked_by, COUNT(*) AS n FROM {t} WHERE status = {PENDING} \
                 AND locked_by IS NOT NULL AND {} >= {at} GROUP BY locked_by",
                dialect.time("locked_until")
            )))
            .await?;
        for row in rows {
            stats
                .claimed
                .insert(row.try_get("", "locked_by")?, count(&row, "n")?);
        }
        let mut params = Params::new(dialect);
        let at = params.bind_time_expr(now);
        let expired = db
            .query_one(params.statement(format!(
                "SELECT COUNT(*) AS n FROM {t} WHERE status = {PENDING} \
                 AND locked_until IS NOT NULL AND {} < {at}",
                dialect.time("locked_until")
            )))
            .await?;
        if let Some(row) = expired {
            stats.expired_leases = count(&row, "n")?;
        }
        self.read_failing(&mut stats).await?;
        Ok(stats)
    }

    /// The pending rows that have failed: their most frequent errors, and the oldest one.
    /// Only the pending rows are read (the pending index), those that failed by their
    /// `last_error`.
    async fn read_failing(&self, stats: &mut OutboxStats) -> Result<(), DbErr> {
        let t = self.table();
        let reads = self.reads();
        let limit = OutboxStats::FAILING_ERRORS;
        let rows = self
            .connection()
            .query_all(Params::new(self.dialect()).statement(format!(
                "SELECT last_error, COUNT(*) AS n FROM {t} WHERE status = {PENDING} \
                 AND last_error IS NOT NULL GROUP BY last_error ORDER BY n DESC, last_error \
                 LIMIT {limit}"
            )))
            .await?;
        for row in rows {
            stats
                .failing
                .push((row.try_get("", "last_error")?, count(&row, "n")?));
        }
        if stats.failing.is_empty() {
            return Ok(());
        }
        // Read as a dead event is: the same columns through the same mapping.
        let oldest =
            crate::DeadEvent::find_by_statement(Params::new(self.dialect()).statement(format!(
                "SELECT {} FROM {t} WHERE status = {PENDING} AND last_error IS NOT NULL \
                 ORDER BY {} LIMIT 1",
                crate::DeadEvent::columns(reads),
                reads.position,
            )))
            .one(self.connection())
            .await?;
        stats.oldest_failing = oldest.map(|event| FailingEvent {
            event_id: event.event_id,
            key: event.key,
            retry_count: event.retry_count,
            last_error: event.last_error.unwrap_or_default(),
            created_at: event.created_at,
        });
        Ok(())
    }

    /// Rows of one status, counted on an index that leads with `status` (the retention
    /// index; MySQL's pending index too), never by reading every row.
    async fn count_status(&self, status: Literal) -> Result<u64, DbErr> {
        let t = self.table();
        let row = self
            .connection()
            .query_one(Params::new(self.dialect()).statement(format!(
                "SELECT COUNT(*) AS n FROM {t} WHERE status = {status}"
            )))
            .await?;
        row.map_or(Ok(0), |row| count(&row, "n"))
    }

    /// What the database's catalogue knows of the table without reading it: its estimated
    /// rows (PostgreSQL, MySQL) and its size on disk.
    async fn read_catalogue(&self) -> Result<Catalogue, DbErr> {
        let db = self.connection();
        let t = self.table();
        let dialect = self.dialect();
        let one = |sql: String| db.query_one(Params::new(dialect).statement(sql));
        match dialect {
            // n_live_tup follows inserts at once; reltuples is -1 until the first ANALYZE.
            Dialect::Postgres => {
                let row = one(format!(
                    "SELECT GREATEST(c.reltuples::BIGINT, COALESCE(s.n_live_tup, 0)) AS n, \
                     pg_total_relation_size(c.oid) AS bytes FROM pg_class c \
                     LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid \
                     WHERE c.oid = to_regclass('{t}')"
                ))
                .await?;
                Catalogue::read(row, "pg_total_relation_size")
            }
            // InnoDB's own estimates, refreshed with its statistics.
            Dialect::MySql => {
                let row = one(format!(
                    "SELECT CAST(table_rows AS SIGNED) AS n, \
                     CAST(data_length + index_length AS SIGNED) AS bytes \
                     FROM information_schema.tables \
                     WHERE table_schema = DATABASE() AND table_name = '{t}'"
                ))
                .await?;
                Catalogue::read(row, "information_schema")
            }
            // No row estimate: SQLite counts on the index. `dbstat` (when SQLite was built
            // with it) sums the pages of the table and its indexes, but reads every one of
            // them (0.3–2 s for a file of 780 MB): above DBSTAT_MAX_FILE_BYTES, and without
            // `dbstat`, the whole database file.
            Dialect::Sqlite => {
                let file = one("SELECT page_count * page_size AS bytes \
                                FROM pragma_page_count(), pragma_page_size()"
                    .to_owned())
                .await?;
                let file_bytes = file
                    .as_ref()
                    .and_then(|row| row.try_get::<i64>("", "bytes").ok())
                    .unwrap_or(0);
                let dbstat = match file_bytes <= DBSTAT_MAX_FILE_BYTES {
                    true => one(format!(
                        "SELECT SUM(pgsize) AS bytes FROM dbstat \
                         WHERE name IN (SELECT name FROM sqlite_master WHERE tbl_name = '{t}')"
                    ))
                    .await
                    .ok(),
                    false => None,
                };
                let (row, method) = match dbstat {
                    Some(row) => (row, "dbstat"),
                    None => (file, "page_count"),
                };
                let mut catalogue = Catalogue::read(row, method)?;
                catalogue.rows = None;
                Ok(catalogue)
            }
        }
    }

    /// PostgreSQL: whether autovacuum will vacuum the table ([`OutboxStats::autovacuum`]);
    /// `None` on the other backends.
    pub async fn autovacuum(&self) -> Result<Option<bool>, Error> {
        Ok(self.read_autovacuum().await?)
    }

    async fn read_autovacuum(&self) -> Result<Option<bool>, DbErr> {
        if self.dialect() != Dialect::Postgres {
            return Ok(None);
        }
        let t = self.table();
        let row = self
            .connection()
            .query_one(Params::new(Dialect::Postgres).statement(format!(
                "SELECT current_setting('autovacuum')::bool AND current_setting('track_counts')::bool \
                 AND COALESCE((SELECT option_value::bool FROM pg_options_to_table(c.reloptions) \
                 WHERE option_name = 'autovacuum_enabled'), true) AS on \
                 FROM pg_class c WHERE c.oid = to_regclass('{t}')"
            )))
            .await?;
        row.map(|row| row.try_get::<bool>("", "on")).transpose()
    }

    /// Pending rows and the oldest one's age, from pending rows only: walks the pending
    /// index, as the claim does, where `read_stats` counts every row (with 200 pending
    /// among 200,000 rows on PostgreSQL: 0.3 ms instead of 64 ms).
    pub(crate) async fn read_backlog(&self) -> Result<Backlog, DbErr> {
        let dialect = self.dialect();
        let t = self.table();
        let hint = dialect.index_hint(t, Index::Pending);
        let sql = format!(
            "SELECT COUNT(*) AS n, MIN({}) AS oldest FROM {t}{hint} WHERE status = {PENDING}",
            self.reads().created_at
        );
        let now = Utc::now();
        let statement = Params::new(dialect).statement(sql);
        let row = match dialect.pin_index_plan() {
            // The claim's reason to pin its plan holds here too.
            Some(pin) => {
                let txn = self.connection().begin().await?;
                txn.execute_unprepared(pin).await?;
                let row = txn.query_one(statement).await?;
                txn.commit().await?;
                row
            }
            None => self.connection().query_one(statement).await?,
        };
        let Some(row) = row else {
            return Ok(Backlog::default());
        };
        let oldest: Option<DateTime<Utc>> = row.try_get("", "oldest")?;
        Ok(Backlog {
            pending: count(&row, "n")?,
            oldest_pending_age_seconds: age_seconds(now, oldest),
        })
    }
}

impl SeaOrmStore {
    /// Rows with `status = 'dead'`: a range of the `(status, published_at)` index, so it
    /// costs what the dead rows number, not the table.
    pub(crate) async fn read_dead_count(&self) -> Result<u64, DbErr> {
        self.count_status(DEAD).await
    }
}

fn age_seconds(now: DateTime<Utc>, oldest: Option<DateTime<Utc>>) -> Option<f64> {
    oldest.map(|at| ((now - at).num_milliseconds().max(0) as f64) / 1000.0)
}

fn count(row: &QueryResult, column: &str) -> Result<u64, DbErr> {
    Ok(u64::try_from(row.try_get::<i64>("", column)?).unwrap_or(0))
}
