//! [`DataVersionFeed`]: notices commits to a SQLite database by `PRAGMA data_version`.

use super::database;
use async_trait::async_trait;
use outbox_core::{InsertFeed, StoreError};
use sea_orm::sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sea_orm::sqlx::ConnectOptions as _;
use std::str::FromStr;
use std::time::Duration;
use tracing::debug;

/// Every `interval`, `PRAGMA data_version` on a connection of its own: SQLite changes the
/// value when another connection commits (a producer, or the relay's own pool), and reading
/// it touches no table and no page, so an idle relay costs next to nothing. A change
/// answers the wait; the relay's own writes thus wake it too, which only claims once more.
/// Chosen over watching the `-wal` file, which needs a watcher thread and a dependency and
/// fires on every page write rather than per commit (docs/decisions/0016-wake-ups.md).
pub struct DataVersionFeed {
    /// The database URL (a file path; no secret in it).
    url: String,
    /// Between two looks.
    interval: Duration,
    /// The connection and the last value it read; `None` before the first look and after
    /// a failed one. The value means something only on the connection that read it.
    connection: Option<(SqliteConnection, i64)>,
}

impl std::fmt::Debug for DataVersionFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataVersionFeed")
            .field("url", &self.url)
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

impl DataVersionFeed {
    /// A feed of commits to the SQLite database at `url`, looked at every `interval`.
    pub fn new(url: &str, interval: Duration) -> Self {
        Self {
            url: url.to_owned(),
            interval,
            connection: None,
        }
    }
}

async fn data_version(connection: &mut SqliteConnection) -> Result<i64, StoreError> {
    sea_orm::sqlx::query_scalar::<_, i64>("PRAGMA data_version")
        .fetch_one(connection)
        .await
        .map_err(database)
}

#[async_trait]
impl InsertFeed for DataVersionFeed {
    fn kind(&self) -> &'static str {
        "data_version"
    }

    async fn wait(&mut self) -> Result<(), StoreError> {
        let Some((connection, seen)) = self.connection.as_mut() else {
            // The first look, or the first after a failure: commits may have come
            // meanwhile, so it answers at once.
            let options = SqliteConnectOptions::from_str(&self.url).map_err(database)?;
            let mut connection = options.connect().await.map_err(database)?;
            let version = data_version(&mut connection).await?;
            self.connection = Some((connection, version));
            debug!(feed = "data_version", interval = ?self.interval, "listening for inserts");
            return Ok(());
        };
        loop {
            tokio::time::sleep(self.interval).await;
            match data_version(connection).await {
                Ok(version) if version == *seen => continue,
                Ok(version) => {
                    *seen = version;
                    return Ok(());
                }
                Err(error) => {
                    self.connection = None;
                    return Err(error);
                }
            }
        }
    }
}
