//! Reading counts: [`SeaOrmStore::read_stats`] for `status`, and the cheap
//! [`SeaOrmStore::read_backlog`] the metrics ask for every few seconds.

use crate::dialect::Params;
use crate::sql::{Index, PENDING};
use crate::store::SeaOrmStore;
use chrono::{DateTime, Utc};
use outbox_core::{Backlog, OutboxStats, Status};
use sea_orm::{ConnectionTrait, DbErr, QueryResult, TransactionTrait};

impl SeaOrmStore {
    /// Counts by status and lease: every row of the table.
    pub(crate) async fn read_stats(&self) -> Result<OutboxStats, DbErr> {
        let dialect = self.dialect();
        let db = self.connection();
        let t = self.table();
        let now = Utc::now();
        let mut stats = OutboxStats::default();
        let rows = db
            .query_all(Params::new(dialect).statement(format!(
                "SELECT status, COUNT(*) AS n FROM {t} GROUP BY status"
            )))
            .await?;
        for row in rows {
            let count = count(&row, "n")?;
            match row.try_get::<String>("", "status")?.parse() {
                Ok(Status::Pending) => stats.pending = count,
                Ok(Status::Published) => stats.published = count,
                Ok(Status::Dead) => stats.dead = count,
                Err(_) => {}
            }
        }
        let oldest = db
            .query_one(Params::new(dialect).statement(format!(
                "SELECT MIN({}) AS oldest FROM {t} WHERE status = {PENDING}",
                self.reads().created_at
            )))
            .await?;
        if let Some(row) = oldest {
            let oldest: Option<DateTime<Utc>> = row.try_get("", "oldest")?;
            stats.oldest_pending_age_seconds = age_seconds(now, oldest);
        }
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
        Ok(stats)
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

fn age_seconds(now: DateTime<Utc>, oldest: Option<DateTime<Utc>>) -> Option<f64> {
    oldest.map(|at| ((now - at).num_milliseconds().max(0) as f64) / 1000.0)
}

fn count(row: &QueryResult, column: &str) -> Result<u64, DbErr> {
    Ok(u64::try_from(row.try_get::<i64>("", column)?).unwrap_or(0))
}
