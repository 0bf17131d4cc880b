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
    /// The outbox table does not exist (not migrated yet).
    #[error(
        "table {0} does not exist; run `outbox-relay migrate` (or set database.migrate_on_start)"
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
    },
    /// The column mapping does not fit the table: every problem found.
    #[error("table {table}: {}", problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Mapping {
        /// The table.
        table: TableName,
        /// Each wrong setting.
        problems: Vec<MappingError>,
    },
    /// The database refused or failed a connection or a statement (the driver's message).
    #[error(transparent)]
    Database(#[from] DbErr),
}

/// Lets a producer's code that works in [`DbErr`] (its own sea-orm statements around
/// [`crate::enqueue`]) use `?` on this crate's calls.
impl From<Error> for DbErr {
    fn from(error: Error) -> Self {
        match error {
            Error::Database(error) => error,
            other => DbErr::Custom(other.to_string()),
        }
    }
}
