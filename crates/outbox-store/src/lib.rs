//! The outbox table through sea-orm, on PostgreSQL, SQLite and MySQL/MariaDB.
//!
//! Layout:
//! - [`admin`]: operator queries (dead events, requeue).
//! - [`connection_url`]: the URL sqlx is given (plain text unless the URL asks for TLS).
//! - [`entity`]: the row as sea-orm sees it.
//! - [`migration`]: creating and upgrading the table and its indexes.
//! - [`notify`]: LISTEN for the insert trigger's NOTIFY (PostgreSQL wake-ups).
//! - [`producer`]: inserting events: [`enqueue`] inside a service's own transaction, and
//!   [`insert_events`] in bulk (the demo, tests).
//! - [`retention`]: deleting finished rows in bounded batches (the Janitor, `purge`).
//! - [`sql`]: backend-aware statement building (placeholders, timestamps, table names).
//! - [`store`]: [`SeaOrmStore`], the implementation of the [`outbox_core::OutboxStore`] port:
//!   claim, mark, release, stats.

pub mod admin;
pub mod connection_url;
pub mod entity;
pub mod migration;
pub mod notify;
pub mod producer;
pub mod retention;
pub mod sql;
pub mod store;

pub use admin::{DeadEvent, DeadFilter, Requeue};
pub use connection_url::connection_url;
pub use migration::migrate;
pub use notify::PgInsertFeed;
pub use producer::{enqueue, insert_events, NewEvent};
pub use sql::{TableName, TableNameError};
pub use store::{connect, SeaOrmStore};
