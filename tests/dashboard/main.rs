//! The Grafana dashboard and the alert rules against a real Prometheus (Debian's
//! `prometheus` package), in a test binary of its own: it cuts a relay's broker link, and
//! runs a Prometheus server for a minute.

/// Every query of deploy/grafana/outbox-relay.json returns data from a Prometheus scraping
/// a relay under load with a retry, a dead event and a broker cut; the alert rules load
/// there and pass `promtool test rules`.
mod dashboard;

/// The binary under test (this package's `outbox-relay-under-test`).
pub const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay-under-test");
