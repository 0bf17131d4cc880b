//! The broker's resource alarm, in a test binary of its own: while it lasts RabbitMQ blocks
//! every publishing connection on the broker, so it must not overlap the end-to-end tests
//! (cargo runs test binaries one after another, the tests of one binary in parallel).

/// RabbitMQ's memory alarm: publishing pauses without duplicates, the gauge and `/readyz`
/// show it, SIGTERM during it still exits in time (skipped where `rabbitmqctl` cannot reach
/// the broker).
mod alarms;

/// The binary under test (this package's `outbox-relay-under-test`).
pub const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay-under-test");
