//! Support for the end-to-end tests: a fresh table, exchange and relay per test
//! ([`TestApp`]), test events, and waiting for conditions with deadlines.
//!
//! Services: `OUTBOX_TEST_DATABASE_URL`, `OUTBOX_TEST_MYSQL_URL`, `OUTBOX_TEST_AMQP_URL`,
//! by default the local ones; a missing service fails the test saying how to start it.

pub mod app;
pub mod bare_publisher;
pub mod broker;
pub mod database;
pub mod events;
pub mod load;
pub mod otlp;
pub mod output;
pub mod producer_table;
pub mod proxy;
pub mod rabbit_cluster;
pub mod relay;
pub mod replica;
pub mod services;
pub mod tls_proxy;

pub use app::{settings_on, test_config, test_settings, AppBuilder, TestApp};
pub use broker::{rabbitmqctl, BrokerUser, Received, TestBroker};
pub use database::{Backend, TestDatabase};
pub use events::{event, own_room_events, room_events, seed, TestEvent};
pub use load::Load;
pub use proxy::FaultProxy;
pub use relay::{
    finish_within, http_get, http_request, output_within, run_binary, run_binary_with_env,
    settings_env, succeeds_quietly_within, ChildGuard, HttpAnswer, InProcessRelay, OutputInTime,
    RelayProcess, SettingsFile, CHILD_DEADLINE,
};
pub use services::{
    assert_within, non_loopback_address, server_of, skip, through, within, AT_ONCE, MARGIN,
};
pub use tls_proxy::{TestCa, TlsProxy};

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// A name no other test (or earlier run) uses: `prefix_<pid>_<n>_<millis>`.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let millis = chrono::Utc::now().timestamp_millis() % 100_000_000;
    format!("{prefix}_{}_{n}_{millis}", std::process::id())
}

/// Waits until `condition` returns true, polling; panics with `what` after `deadline`.
pub async fn eventually<F, Fut>(what: &str, deadline: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = tokio::time::Instant::now() + deadline;
    loop {
        if condition().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "timed out after {deadline:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One test per backend for a scenario `async fn name(backend: Backend)`: a module `name`
/// with a test per backend listed (`postgres`, `sqlite`, `mariadb`), so the tests read
/// `delivery::delivers_10k_events_once_in_room_order::sqlite`.
#[macro_export]
macro_rules! per_backend {
    ($scenario:ident: $($backend:ident),+ $(,)?) => {
        mod $scenario {
            $(
                #[actix_rt::test]
                async fn $backend() {
                    super::$scenario($crate::backend!($backend)).await;
                }
            )+
        }
    };
}

/// The [`Backend`] a [`per_backend!`] test name stands for.
#[doc(hidden)]
#[macro_export]
macro_rules! backend {
    (postgres) => {
        $crate::Backend::Postgres
    };
    (sqlite) => {
        $crate::Backend::Sqlite
    };
    (mariadb) => {
        $crate::Backend::MySql
    };
}

/// What a run's deliveries say about per-room order.
#[derive(Debug, Default)]
pub struct RoomOrder {
    /// Deliveries of an event already delivered.
    pub duplicates: usize,
    /// First deliveries that came after a later event (higher id) of their room, described.
    pub violations: Vec<String>,
}

/// Looks at the first delivery of each event, per room, in arrival order: counts the
/// duplicates and names every first delivery that came after a later event of its room.
pub fn room_order(received: &[Received]) -> RoomOrder {
    let mut seen = std::collections::HashSet::new();
    let mut last: std::collections::HashMap<String, (i64, String)> =
        std::collections::HashMap::new();
    let mut order = RoomOrder::default();
    for message in received {
        if !seen.insert(message.message_id.clone()) {
            order.duplicates += 1;
            continue;
        }
        let room = message.header("room_id").expect("room_id header");
        let id = message.int_header("outbox_id").expect("outbox_id header");
        let node = message.header("node_id").unwrap_or_default();
        if let Some((previous, by)) = last.insert(room.clone(), (id, node.clone())) {
            if previous >= id {
                order.violations.push(format!(
                    "room {room}: event {id} (from {node}) arrived after {previous} (from {by})"
                ));
            }
        }
    }
    order
}

/// Checks that, per room, the first delivery of each event arrives in id order; returns
/// the number of duplicate deliveries.
pub fn assert_room_order(received: &[Received]) -> usize {
    let order = room_order(received);
    if let Some(first) = order.violations.first() {
        panic!("{first}");
    }
    order.duplicates
}

/// Checks that every one of `events` was delivered at least once and that each room's
/// first deliveries came in id order; returns the number of duplicate deliveries.
pub fn assert_every_event_delivered(
    received: &[Received],
    events: &[outbox_store::NewEvent],
) -> usize {
    let duplicates = assert_room_order(received);
    let distinct: std::collections::HashSet<&str> =
        received.iter().map(|r| r.message_id.as_str()).collect();
    for event in events {
        assert!(
            distinct.contains(event.event_id.as_str()),
            "{} lost",
            event.event_id
        );
    }
    duplicates
}

/// Checks that every one of `events` was delivered exactly once (none lost, none twice)
/// and that each room's deliveries came in id order: what a run without a crash promises
/// (README, "What it promises"; docs/operations/failures.md, "What a fault costs in
/// duplicates"). `received` must be the settled queue ([`TestBroker::drain`]), so a late
/// duplicate is counted too.
pub fn assert_delivered_once(what: &str, received: &[Received], events: &[outbox_store::NewEvent]) {
    let duplicates = assert_every_event_delivered(received, events);
    assert_eq!(
        duplicates,
        0,
        "{what}: {duplicates} duplicate deliveries ({} deliveries for {} events), where the \
         docs promise none",
        received.len(),
        events.len()
    );
}
