//! The connection pool: sea-orm's settings on a sqlx pool whose connections give back
//! the buffer space a large row made them take.
//!
//! A PostgreSQL or MySQL connection grows its read buffer to the largest message it
//! received (one 25 MiB envelope: a 26–52 MB buffer) and its write buffer to the largest
//! statement it sent, and keeps them while pooled: after a drain of large rows every
//! connection of the pool would hold one, and memory would follow the pool's size times
//! the largest row, not `relay.max_inflight_bytes`. sqlx shrinks them back to
//! 8 KiB on request; this pool asks whenever a connection is returned (nothing to do for
//! a connection that stayed small). SQLite runs in the process and has no such buffers.
//!
//! Its connections also follow a failover (`failover.rs`): a new one is refused when its
//! server takes no writes, and one opened before a read-only answer is closed at its next
//! acquire instead of being used.

use crate::failover::{Failover, Host, Server};
use crate::store::Pool;
use sea_orm::sqlx::{self, ConnectOptions as _, Connection as _};
use sea_orm::{ConnectOptions, Database, DatabaseConnection, DbErr, RuntimeErr};
use std::sync::Arc;

/// A pool opened with `options` on `hosts` (the URLs sqlx is given, one per host: see
/// [`crate::hosts`]; `options`' URL is the first), with its failover state.
pub(crate) async fn open(options: ConnectOptions, hosts: Vec<String>) -> Result<Pool, DbErr> {
    let url = options.get_url();
    let (connection, failover): (DatabaseConnection, _) = if url.starts_with("postgres") {
        let (pool, failover) = shrinking::<sqlx::Postgres>(options, hosts).await?;
        (pool.into(), failover)
    } else if url.starts_with("mysql") {
        let (pool, failover) = shrinking::<sqlx::MySql>(options, hosts).await?;
        (pool.into(), failover)
    } else {
        return Ok(Database::connect(options).await?.into());
    };
    Ok(Pool::with_failover(connection, failover))
}

/// A pool with sea-orm's settings from `options` whose connections shrink their buffers
/// on every release and that follow a failover; statements logged by sqlx (at `debug`)
/// only when `options` says so, as sea-orm does.
async fn shrinking<DB: Server>(
    options: ConnectOptions,
    hosts: Vec<String>,
) -> Result<(sqlx::Pool<DB>, Arc<Failover>), DbErr> {
    let log_statements = options.get_sqlx_logging();
    let (current, connect) = match hosts.len() {
        // Several hosts: start on the first that takes writes.
        2.. => crate::hosts::first_writable::<DB>(&hosts, log_statements, true)
            .await
            .map_err(refused)?,
        _ => (
            0,
            crate::hosts::options::<DB>(options.get_url(), log_statements).map_err(refused)?,
        ),
    };
    if hosts.len() < 2 {
        // Several hosts were each connected to by the search above.
        probe::<DB>(&connect, options.get_connect_timeout()).await?;
    }
    let failover = Failover::new(Host::of::<DB>(&connect), hosts, current, log_statements);
    let (checked, fresh) = (failover.clone(), failover.clone());
    let pool = options
        .sqlx_pool_options::<DB>()
        .after_connect(move |connection, _| {
            let failover = checked.clone();
            Box::pin(async move {
                match DB::read_only(connection).await? {
                    None => {
                        failover.writable();
                        Ok(())
                    }
                    // sqlx closes it and connects again (the name resolved anew) with its
                    // backoff, until the acquire timeout.
                    Some(refusal) => {
                        failover.refuse(refusal.clone());
                        Err(sqlx::Error::Database(Box::new(refusal)))
                    }
                }
            })
        })
        .before_acquire(move |_, meta| {
            let usable = !fresh.stale(meta.age);
            Box::pin(async move { Ok(usable) })
        })
        .after_release(|connection, _| {
            Box::pin(async move {
                connection.shrink_buffers();
                Ok(true)
            })
        })
        .connect_with(connect)
        .await;
    match pool {
        // Only read-only servers answered: say so rather than "timed out".
        Err(sqlx::Error::PoolTimedOut) => match failover.refused() {
            Some(refusal) => Err(refused(sqlx::Error::Database(Box::new(refusal)))),
            None => Err(refused(sqlx::Error::PoolTimedOut)),
        },
        Ok(pool) => Ok((pool, failover)),
        Err(error) => Err(refused(error)),
    }
}

/// One connection, opened and closed: the pool retries a refused connection by itself
/// until its connect timeout and then says only "pool timed out", where this says
/// "connection refused" at once (and a reset, a DNS failure or the server's refusal as
/// they are).
async fn probe<DB: sqlx::Database>(
    connect: &<DB::Connection as sqlx::Connection>::Options,
    timeout: Option<std::time::Duration>,
) -> Result<(), DbErr> {
    let timeout = timeout.unwrap_or(std::time::Duration::from_secs(5));
    match tokio::time::timeout(timeout, connect.connect()).await {
        Ok(Ok(connection)) => {
            // A close that fails leaves nothing behind that the pool would use.
            let _ = connection.close().await;
            Ok(())
        }
        Ok(Err(error)) => Err(refused(error)),
        Err(_) => Err(refused(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {timeout:?}"),
        )))),
    }
}

/// A refused connection as sea-orm reports it (`DbErr::Conn`), so its message is the same.
fn refused(error: sqlx::Error) -> DbErr {
    DbErr::Conn(RuntimeErr::SqlxError(error))
}
