//! [`Outage`]: whether the broker is away, and publishes waiting for it.
//!
//! A broker outage is nobody's fault: failing every event in flight once per reconnection
//! attempt would cost each an attempt (`relay.max_attempts` turning good events dead) and
//! a log line. So while the link has no connection, a publish waits for one before its
//! `publish_timeout` starts, the rows in flight stay where they are, and the Fetcher's
//! in-flight bound stops claims. The link logs the outage once when it begins and once
//! when it ends, with how long it lasted and what waited (docs/design/broker.md#broker-outages).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{info, warn};

/// The link's view of the broker: reachable, or away since some moment.
#[derive(Debug, Default)]
pub(crate) struct Outage {
    /// Away: checked on every publish, so an atomic rather than the lock below.
    away: AtomicBool,
    /// Since when, while away.
    since: Mutex<Option<Instant>>,
    /// Publishes that waited for the broker during the current outage.
    waited: AtomicU64,
    /// Publishes whose connection or channel was lost under them since the last outage
    /// ended: those of the moment the connection dropped come before the link knows.
    failed: AtomicU64,
}

impl Outage {
    /// Whether the broker is away now.
    pub(crate) fn is_away(&self) -> bool {
        self.away.load(Ordering::Relaxed)
    }

    /// The broker went away (`why`). Said once per outage, with `url`, its first cause.
    pub(crate) fn begin(&self, url: &str, why: &str) {
        let mut since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        if since.is_some() {
            return;
        }
        *since = Some(Instant::now());
        self.away.store(true, Ordering::Relaxed);
        warn!(
            url,
            reason = why,
            "broker connection lost; reconnecting with backoff, publishing paused (events keep their attempts)"
        );
    }

    /// The broker is back on `url`. Said once per outage, with its length and counts.
    pub(crate) fn end(&self, url: &str) {
        let Some(since) = self.since.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        self.away.store(false, Ordering::Relaxed);
        let down_for: Duration = since.elapsed();
        // Read outside the macro, which skips its fields when the line is filtered out.
        let waited = self.waited.swap(0, Ordering::Relaxed);
        let failed = self.failed.swap(0, Ordering::Relaxed);
        info!(
            url,
            down_for = ?down_for,
            waited,
            failed,
            "broker connection re-established; publishing resumed"
        );
    }

    /// A publish starts waiting for the broker.
    pub(crate) fn waiting(&self) {
        self.waited.fetch_add(1, Ordering::Relaxed);
    }

    /// A publish failed because its connection or channel was lost.
    pub(crate) fn lost_one(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_begins_and_ends_once() {
        let outage = Outage::default();
        assert!(!outage.is_away());
        outage.begin("amqp://mq", "connection lost");
        outage.begin("amqp://mq", "refused");
        assert!(outage.is_away());
        outage.waiting();
        outage.lost_one();
        assert_eq!(outage.waited.load(Ordering::Relaxed), 1);
        assert_eq!(outage.failed.load(Ordering::Relaxed), 1);
        outage.end("amqp://mq");
        assert!(!outage.is_away());
        assert_eq!(outage.failed.load(Ordering::Relaxed), 0, "said, then reset");
        outage.end("amqp://mq");
    }
}
