//! Wake-ups: how the relay hears of new rows before its next poll, one
//! [`outbox_core::InsertFeed`] per mechanism (docs/design/wake-ups.md#insert-feeds):
//!
//! - [`listen`]: PostgreSQL's insert trigger NOTIFYs while a relay sleeps, its LISTEN
//!   connection hears it.
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

/// PostgreSQL without probes: how often a LISTEN connection whose wake lock is taken tries
/// it again ([`listen::PgInsertFeed`]); otherwise `database.probe_interval`.
const LOCK_RETRY: Duration = Duration::from_millis(5);

/// PostgreSQL: how long a woken relay stays awake with no new row before it falls asleep
/// again ([`listen::PgInsertFeed::lingering`]).
const LINGER: Duration = Duration::from_millis(20);

/// Which wake-ups the settings allow.
#[derive(Debug, Clone, Default)]
pub struct WakeUps {
    /// PostgreSQL: LISTEN on this URL (the pool's, or a session connection's beside a
    /// pooler); `None`: no LISTEN. May hold a password: never logged.
    pub listen_url: Option<String>,
    /// Probe this often where nothing announces inserts, and on PostgreSQL look this often
    /// for new rows while a woken relay stays awake; `None`: poll only (PostgreSQL: a woken
    /// relay falls asleep the moment a claim finds nothing).
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
            (Dialect::Postgres, Some(url)) => {
                let every = wake_ups.probe_interval.unwrap_or(LOCK_RETRY);
                let feed = listen::PgInsertFeed::new(url, table, every);
                Some(Box::new(match wake_ups.probe_interval {
                    Some(every) => feed.lingering(self.max_id_sql(), every, LINGER),
                    None => feed,
                }))
            }
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

    /// How inserts into the table are announced: on PostgreSQL, by its insert trigger
    /// ([`crate::TableName::notify_trigger`], made by `migrate`) when it is there and
    /// enabled — without it a LISTEN hears nothing
    /// (docs/operations/wake-ups.md#what-each-wake-up-costs). Always
    /// [`InsertTrigger::NotNeeded`] elsewhere.
    pub async fn insert_trigger(&self) -> Result<InsertTrigger, StoreError> {
        if Dialect::of(self.connection()) != Dialect::Postgres {
            return Ok(InsertTrigger::NotNeeded);
        }
        let t = self.table();
        let mut params = Params::new(Dialect::Postgres);
        let (table, name) = (params.bind(t.as_str()), params.bind(t.notify_trigger()));
        let lock = params.bind(format!("({})", t.wake_lock()));
        let row = self
            .connection()
            .query_one(params.statement(format!(
                "SELECT tgqual IS NULL AS every, \
                 position({lock} in pg_get_triggerdef(oid)) > 0 AS asleep FROM pg_trigger \
                 WHERE tgrelid = to_regclass({table}) AND tgname = {name} AND tgenabled <> 'D'"
            )))
            .await
            .map_err(database)?;
        let Some(row) = row else {
            return Ok(InsertTrigger::Off);
        };
        let every = row.try_get::<bool>("", "every").map_err(database)?;
        let asleep = row.try_get::<bool>("", "asleep").map_err(database)?;
        Ok(match (every, asleep) {
            (true, _) => InsertTrigger::EveryInsert,
            (false, true) => InsertTrigger::WhileAsleep,
            // A condition on another lock (the trigger of a table renamed since): it
            // NOTIFYs nobody.
            (false, false) => InsertTrigger::Off,
        })
    }
}

/// What announces inserts into a table ([`SeaOrmStore::insert_trigger`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertTrigger {
    /// PostgreSQL: no trigger, a disabled one, or one made for the table under another name:
    /// a LISTEN would hear nothing.
    Off,
    /// PostgreSQL: the trigger of a table `migrate` has not upgraded yet, which NOTIFYs on
    /// every insert: LISTEN works, and every producer's commit pays for a NOTIFY.
    EveryInsert,
    /// PostgreSQL: the trigger NOTIFYs only while a relay sleeps.
    WhileAsleep,
    /// Not PostgreSQL: no trigger; the relay's wake-up needs none.
    NotNeeded,
}

/// A feed's failure, as the port carries it: the driver's text.
fn database(error: impl std::fmt::Display) -> StoreError {
    StoreError::Database(error.to_string())
}
