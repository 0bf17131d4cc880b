//! Wake-ups on PostgreSQL: the migration adds a statement-level trigger that NOTIFYs the
//! channel named after the table, but only while a relay sleeps: while some session holds
//! the table's wake lock ([`TableName::wake_lock`]).
//! [`PgInsertFeed`] LISTENs to the channel and holds that lock while it waits with nothing
//! to claim, so the relay claims at once instead of at the next poll, and producers pay for
//! a NOTIFY only for the first commit after the relay fell asleep. Polling stays as the
//! fallback. See docs/design/wake-ups.md#notify-only-a-sleeping-relay.

use super::database;
use crate::sql::TableName;
use async_trait::async_trait;
use outbox_core::{InsertFeed, StoreError};
use sea_orm::sqlx::postgres::PgListener;
use std::time::Duration;
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
    /// The LISTEN connection holds the wake lock: producers' inserts NOTIFY.
    asleep: bool,
    /// How long to wait before trying the wake lock again when it is taken.
    retry: Duration,
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
    /// While the wake lock is taken (by a producer between its insert and its commit, or
    /// by another relay asleep) it tries again every `retry`.
    pub fn new(url: &str, table: TableName, retry: Duration) -> Self {
        Self {
            url: url.to_owned(),
            table,
            listener: None,
            asleep: false,
            retry,
        }
    }

    /// Waits for a notification on the connection; `Ok(false)` after `limit` without one.
    /// The connection is dropped when it fails or is lost.
    async fn notified(&mut self, limit: Option<Duration>) -> Result<bool, StoreError> {
        let Some(listener) = self.listener.as_mut() else {
            return Err(StoreError::Database(
                "the LISTEN connection was lost".into(),
            ));
        };
        // `try_recv` is cancel-safe: a message half read stays in the connection's buffer.
        let received = match limit {
            Some(limit) => match tokio::time::timeout(limit, listener.try_recv()).await {
                Ok(received) => received,
                Err(_) => return Ok(false),
            },
            None => listener.try_recv().await,
        };
        match received {
            Ok(Some(_)) => Ok(true),
            // `None` means the connection was lost; sqlx would reconnect inside the next
            // call and then wait silently, so rows committed meanwhile would wait for a
            // poll. Instead the feed reports the loss and connects afresh on the next call,
            // which answers at once (a wake-up) once the server is back.
            Ok(None) => {
                self.lost();
                Err(StoreError::Database(
                    "the LISTEN connection was lost".into(),
                ))
            }
            Err(error) => {
                self.lost();
                Err(database(error))
            }
        }
    }

    /// Tries the wake lock (`take`) or lets it go, on the LISTEN connection; whether it is
    /// held afterwards.
    async fn wake_lock(&mut self, take: bool) -> Result<bool, StoreError> {
        let Some(listener) = self.listener.as_mut() else {
            return Ok(false);
        };
        let function = match take {
            true => "pg_try_advisory_lock",
            false => "pg_advisory_unlock",
        };
        let sql = format!("SELECT {function}({})", self.table.wake_lock());
        let answer = sea_orm::sqlx::query_scalar::<_, bool>(&sql)
            .fetch_one(&mut *listener)
            .await;
        match answer {
            Ok(answer) => Ok(take && answer),
            Err(error) => {
                self.lost();
                Err(database(error))
            }
        }
    }

    /// The connection failed: it and the lock it held are gone.
    fn lost(&mut self) {
        self.listener = None;
        self.asleep = false;
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

    /// Connected and awake: takes the wake lock and answers at once, since rows committed
    /// before it was taken NOTIFYed nobody. Asleep (the lock held): waits for a
    /// notification, then lets the lock go, so that the producers' commits NOTIFY no more
    /// while the relay claims. When the lock is taken by someone else, waits for a
    /// notification for `retry` at most and tries again.
    async fn wait(&mut self) -> Result<(), StoreError> {
        match self.listener.is_some() {
            true => loop {
                if self.asleep {
                    self.notified(None).await?;
                    self.asleep = self.wake_lock(false).await?;
                    return Ok(());
                }
                // Notifications that came while the relay was awake: the claim this wait
                // answers sees their rows.
                while self
                    .listener
                    .as_mut()
                    .and_then(PgListener::next_buffered)
                    .is_some()
                {}
                if self.wake_lock(true).await? {
                    self.asleep = true;
                    return Ok(());
                }
                if self.notified(Some(self.retry)).await? {
                    return Ok(());
                }
            },
            false => {
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
