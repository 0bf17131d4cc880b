//! [`MaxIdProbe`]: notices new rows by the table's highest id, where nothing announces
//! them (MySQL/MariaDB; PostgreSQL without LISTEN, e.g. behind PgBouncer).

use super::database;
use crate::SeaOrmStore;
use async_trait::async_trait;
use outbox_core::{InsertFeed, StoreError};
use sea_orm::{ConnectionTrait, DbBackend, Statement};
use std::time::Duration;
use tracing::debug;

/// Every `interval`, `SELECT MAX(id)` (the position column) through the store's pool: one
/// key at the end of the primary index (MySQL answers it from the index alone, "Select
/// tables optimized away"; PostgreSQL reads the index's last page), so an idle relay costs
/// the server one trivial query per interval. A higher id than last seen answers the wait.
/// A row committed after a higher id was seen (two producers' transactions committing out
/// of id order) is noticed by the next new row or poll instead. Figures:
/// docs/decisions/0016-wake-ups.md.
///
/// On PostgreSQL the probe is a prepared statement, which keeps the plan of its first run
/// until the table's statistics change. Planned on an empty, vacuumed table, that plan is
/// a sequential scan, which then reads the whole table at every probe once rows come
/// (measured: 120 scans/s reading 650,000 rows/s beside 1,000 inserts/s). So once the
/// highest id has grown by [`REPLAN_AFTER`] since the statement was last made, the probe
/// makes it again, as a statement of another text (a comment numbers it), planned for the
/// table as it is then.
#[derive(Debug)]
pub struct MaxIdProbe {
    /// Its pool; a failed probe is retried on a fresh connection like any statement.
    store: SeaOrmStore,
    /// Between two probes.
    interval: Duration,
    /// The highest id seen; `None` before the first probe and after a failed one.
    seen: Option<i64>,
    /// PostgreSQL: the number in the statement's text, and the highest id seen when it
    /// was last changed.
    plan: (u64, i64),
}

/// New ids after which the PostgreSQL probe's statement is made again (at 1,000 inserts/s,
/// once a second: one more round trip per pool connection).
const REPLAN_AFTER: i64 = 1_000;

impl MaxIdProbe {
    /// A probe of `store`'s table every `interval`.
    pub fn new(store: SeaOrmStore, interval: Duration) -> Self {
        Self {
            store,
            interval,
            seen: None,
            plan: (0, 0),
        }
    }

    async fn max_id(&mut self) -> Result<i64, StoreError> {
        let db = self.store.connection();
        let mut sql = self.store.max_id_sql();
        let postgres = db.get_database_backend() == DbBackend::Postgres;
        if postgres {
            sql.push_str(&format!(" /* plan {} */", self.plan.0));
        }
        let row = db
            .query_one(Statement::from_string(db.get_database_backend(), sql))
            .await
            .map_err(database)?;
        let max = row
            .map(|row| row.try_get_by_index::<Option<i64>>(0))
            .transpose()
            .map_err(database)?
            .flatten()
            .unwrap_or(0);
        let (number, from) = self.plan;
        if postgres && (max >= from.saturating_add(REPLAN_AFTER) || max < from) {
            self.plan = (number + 1, max);
        }
        Ok(max)
    }
}

impl SeaOrmStore {
    /// `SELECT` of the table's highest id (position) as a nullable 64-bit integer.
    pub(crate) fn max_id_sql(&self) -> String {
        let reads = self.reads();
        let max = reads.position_value(&format!("MAX({})", reads.position));
        format!("SELECT {max} FROM {}", self.table())
    }
}

#[async_trait]
impl InsertFeed for MaxIdProbe {
    fn kind(&self) -> &'static str {
        "probe"
    }

    async fn wait(&mut self) -> Result<(), StoreError> {
        let Some(mut seen) = self.seen else {
            // The first probe, or the first after a failure: rows may have come meanwhile,
            // so it answers at once.
            self.seen = Some(self.max_id().await?);
            debug!(feed = "probe", interval = ?self.interval, "listening for inserts");
            return Ok(());
        };
        loop {
            tokio::time::sleep(self.interval).await;
            let max = self.max_id().await.inspect_err(|_| self.seen = None)?;
            // Lower after a purge of the newest rows: follow it down, or ids handed out
            // again after a MySQL restart would go unnoticed.
            let grew = max > seen;
            seen = max;
            self.seen = Some(max);
            if grew {
                return Ok(());
            }
        }
    }
}
