//! [`Error`](enum@Error): why a call into the outbox table failed.

use crate::columns::MappingError;
use crate::sql::TableName;
use sea_orm::DbErr;
use thiserror::Error;

/// Why connecting, migrating, inserting, purging or an operator query failed.
///
/// No variant quotes the connection URL: it may hold a password.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// The database URL cannot be parsed.
    #[error("the database URL cannot be parsed")]
    InvalidUrl,
    /// Another runner held the table's migration lock for longer than the wait (MySQL).
    #[error("another migration of table {table} held its lock for {seconds} s")]
    MigrationLockTimeout {
        /// The table being migrated.
        table: TableName,
        /// How long this runner waited.
        seconds: u32,
    },
    /// The outbox table does not exist (not migrated yet), or the role may not see it.
    #[error(
        "table {0} does not exist, or the role may not see it; run `outbox-relay migrate` (as the table's owner), or check the table's name and the role's privileges"
    )]
    NoTable(TableName),
    /// The table lacks some of the relay's bookkeeping columns: it is a producer's table
    /// that `migrate` has not adopted yet.
    #[error(
        "table {table} lacks the relay's columns {}; run `outbox-relay migrate`",
        missing.join(", ")
    )]
    NotMigrated {
        /// The table.
        table: TableName,
        /// The bookkeeping columns it lacks.
        missing: Vec<&'static str>,
    },
    /// The mapped columns fit the catalogue but a statement that reads them fails (a
    /// column named by a reserved word, such as MySQL's `key`).
    #[error("table {table}: the mapped columns cannot be read ({reason}); a column named by a reserved word cannot be mapped")]
    Unreadable {
        /// The table.
        table: TableName,
        /// The database's message.
        reason: String,
        /// The driver's error, for telling a failure a retry fixes (a lock not had in
        /// time, a lost connection) from a column that cannot be read. Not a `source`: its
        /// text is `reason`.
        cause: DbErr,
    },
    /// The column mapping does not fit the table: every problem found.
    #[error("table {table}: {}", problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Mapping {
        /// The table.
        table: TableName,
        /// Each wrong setting.
        problems: Vec<MappingError>,
    },
    /// A column that a routing template, a route, a header column or the content type
    /// column names is not in the table, or cannot be read as asked: every problem found.
    #[error("table {table}: {}", problems.join("; "))]
    ExtraColumns {
        /// The table.
        table: TableName,
        /// Each problem, naming the setting and the column.
        problems: Vec<String>,
    },
    /// No connection could be opened: what happened, said once (refused, reset, timed
    /// out, a name that does not resolve, or the server's own message such as a refused
    /// password), not the driver's nested copies of it.
    #[error("{reason}")]
    Connect {
        /// What happened.
        reason: String,
        /// The driver's error, for telling a retry from a refusal. Not a `source`: its
        /// text is `reason` again, several times over.
        cause: DbErr,
    },
    /// The database refused or failed a statement (the driver's message).
    #[error(transparent)]
    Database(#[from] DbErr),
    /// Another live process runs as the same `node_id` on the table ([`crate::NodeLock`]):
    /// what is known of it, and what to do.
    #[error("{0}")]
    NodeTaken(String),
    /// The node lock's file beside a SQLite database cannot be opened or written.
    #[error("cannot open the node lock file {path}: {source}")]
    NodeLockFile {
        /// The lock file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

/// Lets a producer's code that works in [`DbErr`] (its own sea-orm statements around
/// [`crate::enqueue`]) use `?` on this crate's calls.
impl From<Error> for DbErr {
    fn from(error: Error) -> Self {
        match error {
            Error::Database(error) | Error::Connect { cause: error, .. } => error,
            other => DbErr::Custom(other.to_string()),
        }
    }
}

/// The port's error: the text, and a refusal of the node as what it is.
impl From<Error> for outbox_core::StoreError {
    fn from(error: Error) -> Self {
        match error {
            Error::NodeTaken(holder) => Self::NodeTaken(holder),
            other => Self::Database(other.to_string()),
        }
    }
}

/// What went wrong opening a connection or running a statement, in a few words and
/// once: the I/O failure by name, or the server's message with its code (where the
/// error's own chain of causes repeats the server's message at every layer).
pub fn describe(error: &DbErr) -> String {
    use sea_orm::sqlx::Error as Sqlx;
    use sea_orm::{ConnAcquireErr, RuntimeErr};
    let sqlx = match error {
        DbErr::Conn(RuntimeErr::SqlxError(error))
        | DbErr::Exec(RuntimeErr::SqlxError(error))
        | DbErr::Query(RuntimeErr::SqlxError(error)) => error,
        DbErr::ConnectionAcquire(ConnAcquireErr::Timeout) => &Sqlx::PoolTimedOut,
        other => return other.to_string(),
    };
    describe_sqlx(sqlx)
}

/// [`describe`] for the driver's own error.
pub(crate) fn describe_sqlx(sqlx: &sea_orm::sqlx::Error) -> String {
    use sea_orm::sqlx::Error as Sqlx;
    match sqlx {
        Sqlx::Io(error) => io_reason(error),
        Sqlx::Database(error) => match error.code() {
            Some(code) => format!("{} (code {code})", error.message()),
            None => error.message().to_owned(),
        },
        Sqlx::PoolTimedOut => {
            "no connection within the connect timeout (the server does not answer)".into()
        }
        Sqlx::Tls(error) => format!("TLS failed: {error}"),
        other => other.to_string(),
    }
}

/// An I/O failure by name: "connection refused", "connection reset", "timed out", "the
/// host name does not resolve (DNS)", with the system's text.
fn io_reason(error: &std::io::Error) -> String {
    use std::io::ErrorKind::*;
    let what = match error.kind() {
        ConnectionRefused => "connection refused: nothing listens at that address and port",
        ConnectionReset | ConnectionAborted => "connection reset by the server",
        UnexpectedEof => "the server closed the connection",
        TimedOut => "timed out",
        HostUnreachable | NetworkUnreachable => "host or network unreachable",
        // The standard library's resolver reports every failure with this text.
        _ if error.to_string().contains("lookup address") => {
            return format!("the host name does not resolve (DNS): {error}")
        }
        _ => return error.to_string(),
    };
    match error.raw_os_error() {
        Some(code) => format!("{what} (os error {code})"),
        None => format!("{what}: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sea_orm::sqlx;
    use sea_orm::RuntimeErr;

    fn connect(error: sqlx::Error) -> DbErr {
        DbErr::Conn(RuntimeErr::SqlxError(error))
    }

    #[test]
    fn a_failed_connection_says_what_happened_once() {
        let refused = connect(sqlx::Error::Io(std::io::Error::from_raw_os_error(111)));
        assert_eq!(
            describe(&refused),
            "connection refused: nothing listens at that address and port (os error 111)"
        );
        let dns = std::io::Error::other(
            "failed to lookup address information: Name or service not known",
        );
        let said = describe(&connect(sqlx::Error::Io(dns)));
        assert!(
            said.starts_with("the host name does not resolve (DNS)"),
            "{said}"
        );
        let said = describe(&connect(sqlx::Error::PoolTimedOut));
        assert!(!said.contains("pool"), "{said}");
    }
}
