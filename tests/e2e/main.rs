//! End-to-end tests: real PostgreSQL, SQLite, MariaDB and RabbitMQ, one binary.
//!
//! - `cli`: `--help` and `--version`.
//! - `delivery`: every event once, byte for byte, with the contract's properties, in room order.
//! - `failures`: unroutable events, hold-back per room, retries and dead events.
//! - `faults`: broker and database links cut or stalled by a TCP proxy.
//! - `metrics`: `/metrics` counts and times a run, `/readyz` follows the broker and the
//!   database links, an empty `metrics.listen` serves nothing; the backlog query behind
//!   the gauges.
//! - `multinode`: several relay processes on one table, a killed node, concurrent producers.
//! - `producer`: `enqueue` in the caller's transaction, the README's plain INSERT, and the
//!   trace context (`traceparent`, `tracestate`) reaching the AMQP headers.
//! - `retention`: the Janitor (`relay.retention`) and `purge` delete old published rows in
//!   bounded batches, and nothing else.
//! - `secrets`: passwords never reach `check-config`, logs or error messages.
//! - `settings`: exit codes and messages of the binary for bad settings.
//! - `shutdown`: SIGTERM on the real binary.
//! - `store`: the store's own guarantees (last_error trimming, leases).
//! - `tls`: `amqps://` through a TLS proxy with a custom CA; PostgreSQL's `sslmode`.

mod cli;
mod delivery;
mod failures;
mod faults;
mod metrics;
mod multinode;
mod producer;
mod retention;
mod secrets;
mod settings;
mod shutdown;
mod store;
mod tls;

/// The relay binary, built from the test package (`src/bin/outbox-relay-under-test.rs`).
pub const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay-under-test");
