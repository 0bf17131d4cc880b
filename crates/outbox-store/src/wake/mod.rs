//! Wake-ups: how the relay hears of new rows before its next poll, one
//! [`outbox_core::InsertFeed`] per mechanism (docs/design/wake-ups.md#insert-feeds):
//!
//! - [`listen`]: PostgreSQL's insert trigger NOTIFYs, a LISTEN connection hears it.
//! - [`probe`]: `SELECT MAX(id)` every few milliseconds (MySQL/MariaDB, and PostgreSQL
//!   without LISTEN, e.g. behind PgBouncer): one key of the primary index.
//! - [`data_version`]: SQLite's `PRAGMA data_version` on a connection of its own, which
//!   changes when another connection commits; it reads no table.

pub mod data_version;
pub mod listen;
pub mod probe;

use crate::dialect::{Dialect, Params};
use crate::SeaOrmStore;
use outbox_core::{InsertFeed, StoreError};
use sea_orm::ConnectionTrait;
use std::time::Duration;

/// Which wake-ups the settings allow.
#[derive(Debug, Clone, Default)]
pub struct WakeUps {
    /// PostgreSQL: LISTEN on this URL (the pool's, or a session connection's beside a
    /// pooler); `None`: no LISTEN. May hold a password: never logged.
    pub listen_url: Option<String>,
    /// Probe this often where nothing announces inserts; `None`: poll only.
    pub probe_interval: Option<Duration>,
    /// SQLite: the database URL, for the probe's own connection.
    pub url: String,
}

impl SeaOrmStore {
    /// The feed of this store's inserts that `wake_ups` allow on its backend: LISTEN on
    /// PostgreSQL when a listen URL is given, else a probe; `None` when neither is allowed.
    pub fn insert_feed(&self, wake_ups: &WakeUps) -> Option<Box<dyn InsertFeed>> {
        let table = self.table().clone();
        match (Dialect::of(self.connection()), &wake_ups.listen_url) {
            (Dialect::Postgres, Some(url)) => Some(Box::new(listen::PgInsertFeed::new(url, table))),
            (Dialect::Sqlite, _) => Some(Box::new(data_version::DataVersionFeed::new(
                &wake_ups.url,
                wake_ups.probe_interval?,
            ))),
            (Dialect::Postgres | Dialect::MySql, _) => Some(Box::new(probe::MaxIdProbe::new(
                self.clone(),
                wake_ups.probe_interval?,
            ))),
        }
    }

    /// Whether inserts into the table are announced: on PostgreSQL, whether its insert
    /// trigger ([`crate::TableName::notify_trigger`], made by `migrate`) is there and enabled — without it a
    /// LISTEN hears nothing (docs/operations/wake-ups.md#what-the-notify-costs-the-producers.
    /// Always `true` elsewhere.
    pub async fn announces_inserts(&self) -> Result<bool, StoreError> {
        if Dialect::of(self.connection()) != Dialect::Postgres {
            return Ok(true);
        }
        let t = self.table();
        let mut params = Params::new(Dialect::Postgres);
        let (table, name) = (params.bind(t.as_str()), params.bind(t.notify_trigger()));
        let row = self
            .connection()
            .query_one(params.statement(format!(
                "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass({table}) \
                 AND tgname = {name} AND tgenabled <> 'D') AS announced"
            )))
            .await
            .map_err(database)?;
        row.map_or(Ok(false), |row| {
            row.try_get::<bool>("", "announced").map_err(database)
        })
    }
}

/// A feed's failure, as the port carries it: the driver's text.
fn database(error: impl std::fmt::Display) -> StoreError {
    StoreError::Database(error.to_string())
}
