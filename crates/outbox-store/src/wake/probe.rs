//! [`MaxIdProbe`]: notices new rows by the table's highest id, where nothing announces
//! them (MySQL/MariaDB; PostgreSQL without LISTEN, e.g. behind PgBouncer).

use super::database;
use crate::SeaOrmStore;
use async_trait::async_trait;
use outbox_core::{InsertFeed, StoreError};
use sea_orm::{sqlx, ConnectionTrait, DatabaseConnection, Statement};
use std::time::Duration;
use tracing::debug;

/// Every `interval`, `SELECT MAX(id)` (the position column) through the store's pool: one key at the end of the
/// primary index (MySQL answers it from the index alone, "Select tables optimized away";
/// PostgreSQL reads the index's last page), so an idle relay costs the server one trivial
/// query per interval. A higher id than last seen answers the wait. A row committed after
/// a higher id was seen (two producers' transactions committing out of id order) is
/// noticed by the next new row or poll instead. Figures: docs/decisions/0016-wake-ups.md.
#[derive(Debug)]
pub struct MaxIdProbe {
    /// Its pool; a failed probe is retried on a fresh connection like any statement.
    store: SeaOrmStore,
    /// Between two probes.
    interval: Duration,
    /// The highest id seen; `None` before the first probe and after a failed one.
    seen: Option<i64>,
}

impl MaxIdProbe {
    /// A probe of `store`'s table every `interval`.
    pub fn new(store: SeaOrmStore, interval: Duration) -> Self {
        Self {
            store,
            interval,
            seen: None,
        }
    }

    async fn max_id(&self) -> Result<i64, StoreError> {
        let db = self.store.connection();
        let sql = self.store.max_id_sql();
        if let DatabaseConnection::SqlxPostgresPoolConnection(_) = db {
            // An unnamed statement, planned at each probe for the table as it is then. A
            // prepared one keeps the plan it got first: on a table that was empty then,
            // a sequential scan, which a backlog of a few thousand rows makes cost more
            // than everything else the relay asks of the server (measured: 120 scans/s
            // reading 650,000 rows/s beside 1,000 inserts/s).
            let max = sqlx::query_scalar::<_, Option<i64>>(&sql)
                .persistent(false)
                .fetch_one(db.get_postgres_connection_pool())
                .await
                .map_err(database)?;
            return Ok(max.unwrap_or(0));
        }
        let row = db
            .query_one(Statement::from_string(db.get_database_backend(), sql))
            .await
            .map_err(database)?;
        let max = row
            .map(|row| row.try_get_by_index::<Option<i64>>(0))
            .transpose()
            .map_err(database)?;
        Ok(max.flatten().unwrap_or(0))
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
