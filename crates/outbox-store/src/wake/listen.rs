//! Wake-ups on PostgreSQL: the migration adds a statement-level trigger that NOTIFYs the
//! channel named after the table, but only while a relay sleeps: while some session holds
//! the table's wake lock ([`TableName::wake_lock`]).
//! [`PgInsertFeed`] LISTENs to the channel and holds that lock while it waits with nothing
//! to claim, so the relay claims at once instead of at the next poll, and producers pay for
//! a NOTIFY only for the first commit after the relay fell asleep. Woken, it stays awake
//! while rows keep coming ([`PgInsertFeed::lingering`]): under load nobody NOTIFYs. Polling
//! stays as the fallback. See docs/design/wake-ups.md#notify-only-a-sleeping-relay.

use super::database;
use crate::sql::TableName;
use async_trait::async_trait;
use outbox_core::{InsertFeed, StoreError};
use sea_orm::sqlx::postgres::{PgListener, PgRow};
use sea_orm::sqlx::{self, Row as _};
use std::time::Duration;
use tokio::time::Instant;
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
    /// How long one wait for the wake lock lasts at most (`lock_timeout`).
    retry: Duration,
    /// Awake after a wake-up: how the feed notices new rows meanwhile, if it lingers.
    linger: Option<Linger>,
}

/// Staying awake after a wake-up ([`PgInsertFeed::lingering`]).
#[derive(Debug)]
struct Linger {
    /// `SELECT` of the table's highest id (position), `NULL` when it is empty.
    max_id: String,
    /// Between two looks at the highest id.
    every: Duration,
    /// How long the feed stays awake with no new row before it falls asleep.
    window: Duration,
    /// The highest id seen: the claims that followed saw every row up to it.
    seen: i64,
    /// Awake until then, unless a new row comes; `None`: about to fall asleep.
    until: Option<Instant>,
}

impl std::fmt::Debug for PgInsertFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgInsertFeed")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl PgInsertFeed {
    /// A feed of `table`'s inserts on the PostgreSQL server at `url` (TLS as for the
    /// pool: [`crate::connection_url()`]); connects on the first [`InsertFeed::wait`].
    /// It waits for the wake lock `retry` at a time (a producer between its insert and its
    /// commit holds it a moment; another relay asleep, until woken).
    pub fn new(url: &str, table: TableName, retry: Duration) -> Self {
        Self {
            url: url.to_owned(),
            table,
            listener: None,
            asleep: false,
            retry,
            linger: None,
        }
    }

    /// Woken, the feed stays awake for `window` after the last new row instead of falling
    /// asleep at once, looking at the table's highest id (`max_id`, a `SELECT` of one
    /// nullable `BIGINT`) `every` so often, and answers when it grew. Under load the relay
    /// is then never asleep, so the producers' commits NOTIFY nobody, and it claims once per
    /// look rather than waking, claiming, locking and claiming again for every event. An
    /// event that comes while it is awake waits up to `every` for its claim; a lone event is
    /// still claimed the moment it is notified.
    pub fn lingering(mut self, max_id: String, every: Duration, window: Duration) -> Self {
        self.linger = Some(Linger {
            max_id,
            every,
            window,
            seen: 0,
            until: None,
        });
        self
    }

    /// Waits for a notification on the connection. The connection is dropped when it fails
    /// or is lost.
    async fn notified(&mut self) -> Result<(), StoreError> {
        let Some(listener) = self.listener.as_mut() else {
            return Err(StoreError::Database(
                "the LISTEN connection was lost".into(),
            ));
        };
        let received = listener.try_recv().await;
        match received {
            Ok(Some(_)) => Ok(()),
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

    /// Takes the wake lock (`take`), waiting for it `retry` at most, or lets it go, on the
    /// LISTEN connection; whether it is held afterwards. Waiting, rather than trying once,
    /// takes the lock the moment a producer between its insert and its commit commits (a
    /// producer whose insert comes while the relay waits finds the lock wanted, and
    /// NOTIFYs). Notifications that come meanwhile are kept for [`PgInsertFeed::wait`].
    async fn wake_lock(&mut self, take: bool) -> Result<bool, StoreError> {
        let Some(listener) = self.listener.as_mut() else {
            return Ok(false);
        };
        let keys = self.table.wake_lock();
        let sql = match take {
            true => format!("SELECT pg_advisory_lock({keys}) IS NULL"),
            false => format!("SELECT pg_advisory_unlock({keys})"),
        };
        let answer = sqlx::query_scalar::<_, bool>(&sql)
            .fetch_one(&mut *listener)
            .await;
        match answer {
            Ok(_) => Ok(take),
            // 55P03: `lock_timeout` passed, the lock still held by someone else.
            Err(sqlx::Error::Database(error))
                if take && error.code().as_deref() == Some("55P03") =>
            {
                Ok(false)
            }
            Err(error) => {
                self.lost();
                Err(database(error))
            }
        }
    }

    /// Just woken: notes the highest id (the claim this wake-up answers sees every row up
    /// to it) and stays awake for the window, if the feed lingers.
    async fn stay_awake(&mut self) -> Result<(), StoreError> {
        if self.linger.is_none() {
            return Ok(());
        }
        let max = self.max_id().await?;
        if let Some(linger) = self.linger.as_mut() {
            linger.seen = max;
            linger.until = Some(Instant::now() + linger.window);
        }
        Ok(())
    }

    /// Awake after a wake-up: looks at the table's highest id every [`Linger::every`] until
    /// it grows (`true`: rows to claim) or the window passes with none (`false`: time to
    /// fall asleep). A row whose transaction commits after a higher id was seen is claimed
    /// when the feed falls asleep, at the latest: it claims once more after taking the lock.
    async fn awake_with_new_rows(&mut self) -> Result<bool, StoreError> {
        let Some((until, every)) = (self.linger.as_ref()).and_then(|l| Some((l.until?, l.every)))
        else {
            return Ok(false);
        };
        loop {
            tokio::time::sleep(every).await;
            let max = self.max_id().await?;
            let Some(linger) = self.linger.as_mut() else {
                return Ok(false);
            };
            // Lower after a purge of the newest rows: follow it down.
            let grew = max > linger.seen;
            linger.seen = max;
            if grew {
                linger.until = Some(Instant::now() + linger.window);
                return Ok(true);
            }
            if Instant::now() >= until {
                linger.until = None;
                return Ok(false);
            }
        }
    }

    /// The table's highest id, on the LISTEN connection.
    async fn max_id(&mut self) -> Result<i64, StoreError> {
        let (Some(listener), Some(linger)) = (self.listener.as_mut(), self.linger.as_ref()) else {
            return Ok(0);
        };
        let answer = sqlx::Executor::fetch_all(&mut *listener, sqlx::raw_sql(&linger.max_id)).await;
        match highest_id(answer) {
            Ok(max) => Ok(max),
            Err(error) => {
                self.lost();
                Err(error)
            }
        }
    }

    /// Drops the notifications the connection has received; whether there were any.
    fn drop_notifications(&mut self) -> bool {
        let Some(listener) = self.listener.as_mut() else {
            return false;
        };
        let mut any = false;
        while listener.next_buffered().is_some() {
            any = true;
        }
        any
    }

    /// The connection failed: it and the lock it held are gone.
    fn lost(&mut self) {
        self.listener = None;
        self.asleep = false;
        if let Some(linger) = self.linger.as_mut() {
            linger.until = None;
        }
    }
}

/// A LISTEN connection to `table`'s channel on the server at `url`, whose lock waits last
/// `retry` at most.
async fn listen(url: &str, table: &TableName, retry: Duration) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect(url).await?;
    let timeout = format!("SET lock_timeout = '{}ms'", retry.as_millis().max(1));
    sqlx::query(&timeout).execute(&mut listener).await?;
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
    /// while the relay claims. While another relay holds the lock, waits for it `retry` at
    /// a time, answering when a notification came meanwhile.
    async fn wait(&mut self) -> Result<(), StoreError> {
        match self.listener.is_some() {
            true => loop {
                if self.asleep {
                    self.notified().await?;
                    self.asleep = self.wake_lock(false).await?;
                    self.stay_awake().await?;
                    return Ok(());
                }
                if self.awake_with_new_rows().await? {
                    return Ok(());
                }
                // Notifications that came while the relay was awake: the claim this wait
                // answers sees their rows.
                self.drop_notifications();
                if self.wake_lock(true).await? {
                    self.asleep = true;
                    return Ok(());
                }
                // Held by another relay asleep: the inserts meanwhile NOTIFYed it, and this
                // relay too.
                if self.drop_notifications() {
                    return Ok(());
                }
            },
            false => {
                // The first host that takes the LISTEN: a standby refuses it (25006).
                let mut failure = None;
                for url in crate::hosts::split(&self.url) {
                    match listen(&crate::connection_url(&url), &self.table, self.retry).await {
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

/// The table's highest id in the answer to `MAX(id)` sent as a simple query
/// (`sqlx::raw_sql`), planned at each run for the table as it is then: a prepared statement
/// would keep a plan made on an empty table, a sequential scan (docs/design/wake-ups.md).
/// It runs only while a woken relay stays awake, so its planning costs nothing idle.
fn highest_id(answer: Result<Vec<PgRow>, sqlx::Error>) -> Result<i64, StoreError> {
    let max = match answer.map_err(database)?.first() {
        Some(row) => row.try_get::<Option<i64>, _>(0).map_err(database)?,
        None => None,
    };
    Ok(max.unwrap_or(0))
}
