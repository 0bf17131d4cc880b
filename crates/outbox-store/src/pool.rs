//! The connection pool: sea-orm's settings on a sqlx pool whose connections give back
//! the buffer space a large row made them take.
//!
//! A PostgreSQL or MySQL connection grows its read buffer to the largest message it
//! received (one 25 MiB envelope: a 26–52 MB buffer) and its write buffer to the largest
//! statement it sent, and keeps them while pooled: after a drain of large rows every
//! connection of the pool would hold one, and memory would follow the pool's size times
//! the largest row, not `relay.max_inflight_bytes` (issue 17). sqlx shrinks them back to
//! 8 KiB on request; this pool asks whenever a connection is returned (nothing to do for
//! a connection that stayed small). SQLite runs in the process and has no such buffers.

use sea_orm::sqlx::{self, ConnectOptions as _, Connection as _};
use sea_orm::{ConnectOptions, Database, DatabaseConnection, DbErr, RuntimeErr};

/// A pool opened with `options` (its URL already the one sqlx is given).
pub(crate) async fn open(options: ConnectOptions) -> Result<DatabaseConnection, DbErr> {
    let url = options.get_url();
    if url.starts_with("postgres") {
        Ok(shrinking::<sqlx::Postgres>(options).await?.into())
    } else if url.starts_with("mysql") {
        Ok(shrinking::<sqlx::MySql>(options).await?.into())
    } else {
        Database::connect(options).await
    }
}

/// A pool with sea-orm's settings from `options` whose connections shrink their buffers
/// on every release; statements logged by sqlx (at `debug`) only when `options` says so,
/// as sea-orm does.
async fn shrinking<DB: sqlx::Database>(options: ConnectOptions) -> Result<sqlx::Pool<DB>, DbErr> {
    let connect: <DB::Connection as sqlx::Connection>::Options =
        options.get_url().parse().map_err(refused)?;
    let connect = match options.get_sqlx_logging() {
        true => connect,
        false => connect.disable_statement_logging(),
    };
    probe::<DB>(&connect, options.get_connect_timeout()).await?;
    options
        .sqlx_pool_options::<DB>()
        .after_release(|connection, _| {
            Box::pin(async move {
                connection.shrink_buffers();
                Ok(true)
            })
        })
        .connect_with(connect)
        .await
        .map_err(refused)
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
