//! The outbox table through sea-orm, on PostgreSQL, SQLite and MySQL/MariaDB.
//!
//! Layout:
//! - [`entity`]: the row as sea-orm sees it.
//! - [`migration`]: creating and upgrading the table and its indexes.
//! - [`sql`]: backend-aware statement building (placeholders, timestamps, table names).
//! - [`store`]: [`SeaOrmStore`], the implementation of the [`outbox_core::OutboxStore`] port:
//!   claim, mark, release, stats.

pub mod entity;
pub mod migration;
pub mod sql;
pub mod store;

pub use migration::migrate;
pub use sql::{TableName, TableNameError};
pub use store::{connect, SeaOrmStore};
