//! The outbox table through sea-orm, on PostgreSQL, SQLite and MySQL/MariaDB.
//!
//! Layout:
//! - [`store`]: [`SeaOrmStore`], the implementation of the [`outbox_core::OutboxStore`]
//!   port, and [`connect`]. The port's statements live beside it: `claim/` (one file per
//!   backend), `mark.rs` (outcomes and leases), `stats.rs`, [`retention`].
//! - `dialect.rs`: every SQL difference between the backends (placeholders, time values,
//!   index hints, row locks, PostgreSQL's plan pinning and relaxed commit).
//! - [`columns`]: the column mapping (which producer columns hold the id, type, key,
//!   payload, headers, creation time and insert order).
//! - [`sql`]: the table name, its index names and the `status` literals.
//! - [`admin`]: operator queries (dead events, requeue).
//! - [`connection_url`](mod@connection_url): the URL sqlx is given (TLS as libpq decides it; plain text to loopback unless asked for).
//! - [`error`]: [`Error`], what the public functions return.
//! - [`failover`]: never working on a server that takes no writes (a standby after a
//!   failover): new connections checked, older ones dropped after a read-only answer.
//! - [`transport`]: whether a connection is encrypted, as the server sees it.
//! - [`hosts`]: several hosts in one URL (libpq's form): the first writable one.
//! - `pool.rs`: the connection pool (sea-orm's settings; connections shrink the buffers a
//!   large row grew when they return to the pool).
//! - [`migration`]: creating and upgrading the table and its indexes.
//! - [`wake`]: how the relay hears of new rows before its next poll: LISTEN (PostgreSQL),
//!   a `MAX(id)` probe (MySQL/MariaDB, PostgreSQL without LISTEN), `PRAGMA data_version`
//!   (SQLite).
//! - [`producer`]: inserting events: [`enqueue`] inside a service's own transaction, and
//!   [`insert_events`] in bulk (the demo, tests).
//! - `planner.rs`: PostgreSQL's statistics kept in step with a backlog (checked before
//!   the first claim, after full claims, at once after a slow one, and after a claim
//!   cancelled at its 1 s timeout; a planner that expects fewer pending rows than a claim
//!   takes gets the `status` column analyzed).
//! - [`node_lock`]: one live process per `node_id` and table (an advisory lock, `GET_LOCK`,
//!   or a file lock beside a SQLite database, held for the process's life).
//! - [`privileges`]: whether the connected role may do what the relay does to its tables.
//! - [`retention`]: deleting finished rows in bounded batches (the Janitor, `purge`).
//! - [`row`]: rows as statements read them.
//! - `shape.rs`: a table's columns and types as the database describes them; `reads.rs`:
//!   how statements read the mapped columns (casts where a type needs one).

pub mod admin;
mod claim;
pub mod columns;
pub mod connection_url;
mod dialect;
pub mod error;
pub mod failover;
pub mod hosts;
mod mark;
pub mod migration;
pub mod node_lock;
mod planner;
mod pool;
pub mod privileges;
pub mod producer;
mod reads;
pub mod retention;
pub mod row;
mod shape;
pub mod sql;
mod stats;
pub mod store;
pub mod transport;
pub mod wake;

pub use admin::{DeadEvent, DeadFilter, DeadOrder, EventDetail};
pub use columns::{
    ColumnName, ColumnNameError, ColumnSetting, Columns, MappingError, MappingProblem,
};
pub use connection_url::{connection_url, is_local, PG_SSL_MODES};
pub use error::Error;
pub use migration::{
    enable_notify, migrate, migrate_columns, plan, plan_enable_notify, PlannedStep, ENABLE_NOTIFY,
};
pub use node_lock::NodeLock;
pub use privileges::{missing_privileges, MissingPrivilege};
pub use producer::{enqueue, insert_events, NewEvent};
pub use row::OutboxRow;
pub use sql::{TableName, TableNameError};
pub use store::{connect, connect_with, Pool, PoolSettings, SeaOrmStore};
pub use transport::{transport, Transport};
pub use wake::{InsertTrigger, WakeUps};
