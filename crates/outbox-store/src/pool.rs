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

use sea_orm::sqlx::{self, Connection as _};
use sea_orm::{ConnectOptions, Database, DatabaseConnection, DbErr, RuntimeErr};

/// A pool opened with `options` (its URL already the one sqlx is given).
pub(crate) async fn open(options: ConnectOptions) -> Result<DatabaseConnection, DbErr> {
    let url = options.get_url().to_owned();
    let logged = options.get_sqlx_logging();
    if url.starts_with("postgres") {
        let connect: sqlx::postgres::PgConnectOptions = url.parse().map_err(refused)?;
        let pool = shrinking::<sqlx::Postgres>(options)
            .connect_with(logging(connect, logged))
            .await
            .map_err(refused)?;
        Ok(pool.into())
    } else if url.starts_with("mysql") {
        let connect: sqlx::mysql::MySqlConnectOptions = url.parse().map_err(refused)?;
        let pool = shrinking::<sqlx::MySql>(options)
            .connect_with(logging(connect, logged))
            .await
            .map_err(refused)?;
        Ok(pool.into())
    } else {
        Database::connect(options).await
    }
}

/// sea-orm's pool settings from `options`, and buffers shrunk on every release.
fn shrinking<DB: sqlx::Database>(options: ConnectOptions) -> sqlx::pool::PoolOptions<DB> {
    options
        .sqlx_pool_options::<DB>()
        .after_release(|connection, _| {
            Box::pin(async move {
                connection.shrink_buffers();
                Ok(true)
            })
        })
}

/// Statements logged by sqlx (at `debug`) only when `logged`, as sea-orm does.
fn logging<O: sqlx::ConnectOptions>(connect: O, logged: bool) -> O {
    match logged {
        true => connect,
        false => connect.disable_statement_logging(),
    }
}

/// A refused connection as sea-orm reports it (`DbErr::Conn`), so its message is the same.
fn refused(error: sqlx::Error) -> DbErr {
    DbErr::Conn(RuntimeErr::SqlxError(error))
}
