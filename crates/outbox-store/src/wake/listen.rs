//! Wake-ups on PostgreSQL: the migration adds a statement-level trigger that NOTIFYs the
//! channel named after the table on every insert; [`PgInsertFeed`] LISTENs to it, so the
//! relay claims at once instead of at the next poll. Polling stays as the fallback.

use super::database;
use crate::sql::TableName;
use async_trait::async_trait;
use outbox_core::{InsertFeed, StoreError};
use sea_orm::sqlx::postgres::PgListener;
use tracing::debug;

/// The [`InsertFeed`] port on a LISTEN connection to the table's channel: connects on the
/// first wait, and reconnects by itself when the connection is lost.
pub struct PgInsertFeed {
    /// May hold a password: never logged.
    url: String,
    /// The channel is named after it.
    table: TableName,
    /// Connected once a wait succeeded.
    listener: Option<PgListener>,
}

impl std::fmt::Debug for PgInsertFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgInsertFeed")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl PgInsertFeed {
    /// A feed of `table`'s inserts on the PostgreSQL server at `url` (plain text unless
    /// the URL asks for TLS, like the pool); connects on the first [`InsertFeed::wait`].
    pub fn new(url: &str, table: TableName) -> Self {
        Self {
            url: url.to_owned(),
            table,
            listener: None,
        }
    }
}

/// A LISTEN connection to `table`'s channel on the server at `url`.
async fn listen(url: &str, table: &TableName) -> Result<PgListener, sea_orm::sqlx::Error> {
    let mut listener = PgListener::connect(url).await?;
    listener.listen(table.as_str()).await?;
    Ok(listener)
}

#[async_trait]
impl InsertFeed for PgInsertFeed {
    fn kind(&self) -> &'static str {
        "notify"
    }

    async fn wait(&mut self) -> Result<(), StoreError> {
        match self.listener.as_mut() {
            // `None` means the connection was lost; sqlx would reconnect inside the next
            // call and then wait silently, so rows committed meanwhile would wait for a
            // poll. Instead the feed reports the loss and connects afresh on the next call,
            // which answers at once (a wake-up) once the server is back.
            Some(listener) => match listener.try_recv().await {
                Ok(Some(_)) => Ok(()),
                Ok(None) => {
                    self.listener = None;
                    Err(StoreError::Database(
                        "the LISTEN connection was lost".into(),
                    ))
                }
                Err(error) => {
                    self.listener = None;
                    Err(database(error))
                }
            },
            None => {
                // The first host that takes the LISTEN: a standby refuses it (25006).
                let mut failure = None;
                for url in crate::hosts::split(&self.url) {
                    match listen(&crate::connection_url(&url), &self.table).await {
                        Ok(listener) => {
                            debug!(feed = "notify", channel = %self.table, "listening for inserts");
                            self.listener = Some(listener);
                            return Ok(());
                        }
                        Err(error) => failure = Some(error),
                    }
                }
                Err(database(failure.map_or_else(
                    || "no database host".to_owned(),
                    |error| error.to_string(),
                )))
            }
        }
    }
}
