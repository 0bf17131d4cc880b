//! The relay's actors and its lifecycle (docs/design/pipeline.md, docs/design/shutdown.md).
//!
//! ```text
//! Scheduler --Tick--> Fetcher --Publish--> Publisher[0..N] --Outcome--> Marker
//!     ^                  |  (stable hash of the key picks the publisher)   |
//!     +------Wake--------+<------------------ Marked ----------------------+
//! ```
//!
//! - [`scheduler`]: when to claim — at start, every `poll_interval`, at once again while
//!   claims come back full, when capacity frees up, and on each insert where the database
//!   announces them (else whenever outcomes were written).
//! - [`fetcher`]: claims batches through the [`outbox_core::OutboxStore`] port, bounds the
//!   rows in flight, routes each record to its key's publisher.
//! - [`floor`]: where the Fetcher's claims start their scan while a backlog drains.
//! - [`publisher`]: one per confirm channel; many publishes in flight, at most one per
//!   key under `per_room` ordering; holds back a key behind a failure.
//! - [`marker`]: the single writer of outcomes; batches them, decides retry or dead, and
//!   never drops one (a failed flush is retried).
//! - `failure_log`: which failures the Marker says in full, and the summary line per
//!   reason that stands for the rest.
//! - [`listener`]: beside the pipeline, when the store announces inserts (PostgreSQL):
//!   wakes the Scheduler on each, reconnecting with backoff.
//! - [`janitor`]: beside the pipeline, when `relay.retention` is set: deletes published
//!   rows past the retention in bounded batches.
//! - [`stall`]: whether an outbox's events keep failing while none is published (the
//!   Marker feeds it; `/readyz`, `outbox_stalled` and one log line show it).
//! - [`relay`]: wires the actors and shuts them down in order.
//! - [`instruments`]: the metrics the actors record (names, and handles resolved once).

mod failure_log;
pub mod fetcher;
mod flight;
pub mod floor;
pub mod instruments;
pub mod janitor;
pub mod listener;
pub mod marker;
pub mod publisher;
pub mod relay;
pub mod scheduler;
pub mod stall;
mod waiters;

pub use fetcher::{
    Fetcher, InsertsAnnounced, Marked, PublisherHandle, Stop, StopClaiming, Tick, TickReport,
};
pub use janitor::{Janitor, JanitorOptions, StopSweeping, Sweep, SweepReport};
pub use listener::{Listener, StopListening};
pub use marker::{FlushAndStop, Marker, Outcome};
pub use publisher::{Drain, Publish, Publisher, Unhold};
pub use relay::{Relay, Relays, ShutdownError};
pub use scheduler::{Scheduler, Wake};
pub use stall::Stall;

#[cfg(test)]
mod fakes;
