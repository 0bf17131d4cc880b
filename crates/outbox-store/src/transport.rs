//! Whether a database connection is encrypted, as the server sees it: for the warning the
//! relay logs at start about plain text to a host that is not loopback.

use crate::Error;
use sea_orm::{ConnectionTrait as _, DatabaseConnection, DbBackend, Statement};

/// How one of the pool's connections reaches its server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// TLS.
    Encrypted,
    /// Plain text.
    Plain,
    /// A file (SQLite): no network.
    File,
}

/// How a connection of `db` reaches its server: PostgreSQL's `pg_stat_ssl`, MySQL's and
/// MariaDB's `Ssl_cipher` session status (empty without TLS).
pub async fn transport(db: &DatabaseConnection) -> Result<Transport, Error> {
    let backend = db.get_database_backend();
    let sql = match backend {
        DbBackend::Postgres => {
            "SELECT CASE WHEN ssl THEN 'tls' ELSE '' END AS \"Value\" \
             FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
        }
        DbBackend::MySql => "SHOW SESSION STATUS LIKE 'Ssl_cipher'",
        DbBackend::Sqlite => return Ok(Transport::File),
    };
    let row = db.query_one(Statement::from_string(backend, sql)).await?;
    let cipher = match row {
        Some(row) => row.try_get::<Option<String>>("", "Value")?,
        None => None,
    };
    Ok(match cipher.is_some_and(|cipher| !cipher.is_empty()) {
        true => Transport::Encrypted,
        false => Transport::Plain,
    })
}
