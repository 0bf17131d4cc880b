//! The relay's metrics, recorded through the `metrics` facade only: the binary picks the
//! recorder, and without one every handle is a no-op. Each actor resolves its handles once
//! when it is built (an atomic add per event, no name lookup), so the recorder must be
//! installed before the relay starts. See docs/design/observability.md#metrics.

use crate::marker::Resolution;
use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, histogram, Counter, Histogram,
    Unit,
};
use outbox_core::PublishError;
use std::time::Duration;

/// Counter: events whose `published` outcome is committed.
pub const EVENTS_PUBLISHED: &str = "outbox_events_published_total";
/// Counter, label `reason` ([`PublishError::reason`]): committed failed attempts, retried,
/// deferred (the broker's doing: no attempt counted) or dead.
pub const EVENTS_FAILED: &str = "outbox_events_failed_total";
/// Counter: events whose `dead` outcome is committed.
pub const EVENTS_DEAD: &str = "outbox_events_dead_total";
/// Gauge: pending rows in the table (every node's).
pub const PENDING_EVENTS: &str = "outbox_pending_events";
/// Gauge: dead rows in the table (every node's), sampled once a minute.
pub const DEAD_EVENTS: &str = "outbox_dead_events";
/// Gauge: age of the oldest pending row; 0 when none is pending.
pub const OLDEST_PENDING_AGE: &str = "outbox_oldest_pending_age_seconds";
/// Histogram: a publish's hand-off to the broker's ack, in seconds.
pub const PUBLISH_CONFIRM: &str = "outbox_publish_confirm_seconds";
/// Histogram: a row's `created_at` to the broker's ack, in seconds.
pub const COMMIT_TO_CONFIRM: &str = "outbox_commit_to_confirm_seconds";
/// Histogram: rows per claim that returned rows.
pub const CLAIM_BATCH_SIZE: &str = "outbox_claim_batch_size";
/// Histogram: a successful claim's round trip to the database (every claim, empty ones
/// too), in seconds.
pub const CLAIM_DURATION: &str = "outbox_claim_seconds";
/// Histogram: outcomes per committed flush of the Marker.
pub const MARK_BATCH_SIZE: &str = "outbox_mark_batch_size";
/// Gauge, label `reason` ([`PublishError::reason`]): 1 while the outbox is stalled for
/// that reason (events fail and none was published for `relay.stall_after`), else 0.
pub const STALLED: &str = "outbox_stalled";

/// Gauge, label `dependency` (`database` or `broker`): 1 while the endpoint's probe finds
/// it usable, else 0; the flags `/readyz` reads. Set by the binary's endpoint.
pub const UP: &str = "outbox_up";
/// Gauge: 1 while the broker blocks this node's publishers (`connection.blocked`, a memory
/// or disk alarm), else 0; publishing is paused meanwhile. Set by the binary's endpoint.
pub const BROKER_BLOCKED: &str = "outbox_broker_blocked";
/// Gauge, label `version`: always 1, so a query can join a node's version onto its series.
pub const BUILD_INFO: &str = "outbox_relay_build_info";
/// Gauge: 1 while the oldest pending row is older than `relay.max_pending_age`, else 0;
/// present only when that setting is on. Set by the binary's endpoint.
pub const PENDING_AGE_EXCEEDED: &str = "outbox_max_pending_age_exceeded";
/// Gauge: `relay.max_pending_age` in seconds, the objective the oldest pending age is held
/// to (a dashboard draws it beside the age); present only when that setting is on. Set by
/// the binary's endpoint.
pub const MAX_PENDING_AGE: &str = "outbox_max_pending_age_seconds";

/// Registers the help text and unit of every metric with the installed recorder.
pub fn describe() {
    describe_counter!(
        EVENTS_PUBLISHED,
        Unit::Count,
        "Events marked published after the broker's ack (committed outcomes)."
    );
    describe_counter!(
        EVENTS_FAILED,
        Unit::Count,
        "Failed publish attempts by reason (committed outcomes): retried, deferred or dead."
    );
    describe_counter!(
        EVENTS_DEAD,
        Unit::Count,
        "Events marked dead (committed outcomes)."
    );
    describe_gauge!(
        PENDING_EVENTS,
        Unit::Count,
        "Pending rows in the outbox table, all nodes' (sampled every few seconds)."
    );
    describe_gauge!(
        DEAD_EVENTS,
        Unit::Count,
        "Dead rows in the outbox table, all nodes' (sampled every minute): events that go out only once requeued."
    );
    describe_gauge!(
        OLDEST_PENDING_AGE,
        Unit::Seconds,
        "Age of the oldest pending row, 0 when none (sampled every few seconds)."
    );
    describe_gauge!(
        UP,
        "1 while the dependency (database, broker) is usable, else 0: what /readyz reads."
    );
    describe_gauge!(
        BROKER_BLOCKED,
        "1 while the broker blocks publishers (a resource alarm; publishing paused), else 0."
    );
    describe_gauge!(BUILD_INFO, "Always 1; the labels name the running build.");
    describe_gauge!(
        STALLED,
        "1 while the outbox is stalled for the reason: its events fail and none was published for relay.stall_after."
    );
    describe_gauge!(
        PENDING_AGE_EXCEEDED,
        "1 while the oldest pending row is older than relay.max_pending_age, else 0."
    );
    describe_histogram!(
        PUBLISH_CONFIRM,
        Unit::Seconds,
        "From handing a message to the broker to its ack (acked publishes only)."
    );
    describe_histogram!(
        COMMIT_TO_CONFIRM,
        Unit::Seconds,
        "From the row's created_at to the broker's ack (acked publishes only)."
    );
    describe_gauge!(
        MAX_PENDING_AGE,
        Unit::Seconds,
        "relay.max_pending_age: the objective for the oldest pending row's age."
    );
    describe_histogram!(
        CLAIM_DURATION,
        Unit::Seconds,
        "A claim's round trip to the database (successful claims, empty ones included)."
    );
    describe_histogram!(
        CLAIM_BATCH_SIZE,
        Unit::Count,
        "Rows per claim, for claims that returned rows."
    );
    describe_histogram!(
        MARK_BATCH_SIZE,
        Unit::Count,
        "Outcomes per committed write of the Marker."
    );
}

// Every metric carries label `outbox` (the outbox's name): one process relays several.

/// The Publisher's latency histograms.
pub(crate) struct ConfirmTimes {
    publish_confirm: Histogram,
    commit_to_confirm: Histogram,
}

impl ConfirmTimes {
    pub(crate) fn new(outbox: &str) -> Self {
        Self {
            publish_confirm: histogram!(PUBLISH_CONFIRM, "outbox" => outbox.to_owned()),
            commit_to_confirm: histogram!(COMMIT_TO_CONFIRM, "outbox" => outbox.to_owned()),
        }
    }

    /// An ack for a row created at `created_at`, `took` after its hand-off.
    pub(crate) fn acked(&self, took: Duration, created_at: chrono::DateTime<chrono::Utc>) {
        self.publish_confirm.record(took.as_secs_f64());
        // `created_at` is the database's clock: a skew ahead of ours counts as 0.
        let since_commit = (chrono::Utc::now() - created_at).to_std();
        self.commit_to_confirm
            .record(since_commit.map_or(0.0, |since| since.as_secs_f64()));
    }
}

/// The Marker's counters of committed outcomes and its flush sizes.
pub(crate) struct OutcomeCounters {
    published: Counter,
    dead: Counter,
    /// One per [`PublishError::REASONS`], same order.
    failed: [Counter; PublishError::REASONS.len()],
    mark_batch: Histogram,
    /// The `outbox` label, for a reason missing from [`PublishError::REASONS`].
    outbox: String,
}

impl OutcomeCounters {
    pub(crate) fn new(outbox: &str) -> Self {
        let label = || outbox.to_owned();
        Self {
            published: counter!(EVENTS_PUBLISHED, "outbox" => label()),
            dead: counter!(EVENTS_DEAD, "outbox" => label()),
            failed: PublishError::REASONS
                .map(|reason| counter!(EVENTS_FAILED, "reason" => reason, "outbox" => label())),
            mark_batch: histogram!(MARK_BATCH_SIZE, "outbox" => label()),
            outbox: label(),
        }
    }

    /// One committed flush: each row's [`Resolution`], failures by reason. Counted once
    /// per flush.
    pub(crate) fn committed<'a>(&self, outcomes: impl ExactSizeIterator<Item = &'a Resolution>) {
        self.mark_batch.record(outcomes.len() as f64);
        let (mut published, mut dead) = (0, 0);
        let mut failed = [0u64; PublishError::REASONS.len()];
        for resolution in outcomes {
            let reason = match resolution {
                Resolution::Published => {
                    published += 1;
                    continue;
                }
                Resolution::Released => continue,
                Resolution::Retried { reason, .. } | Resolution::Deferred { reason, .. } => reason,
                Resolution::Dead { reason, .. } => {
                    dead += 1;
                    reason
                }
            };
            match PublishError::REASONS
                .iter()
                .position(|known| known == reason)
            {
                Some(index) => failed[index] += 1,
                // A reason missing from the list (a test in outbox-core prevents it).
                None => {
                    counter!(EVENTS_FAILED, "reason" => *reason, "outbox" => self.outbox.clone())
                        .increment(1)
                }
            }
        }
        if published > 0 {
            self.published.increment(published);
        }
        if dead > 0 {
            self.dead.increment(dead);
        }
        for (counter, n) in self.failed.iter().zip(failed) {
            if n > 0 {
                counter.increment(n);
            }
        }
    }
}

/// `outbox_stalled`, one gauge per reason, all 0 until a stall.
pub(crate) struct StallGauges {
    /// One per [`PublishError::REASONS`], same order.
    gauges: [metrics::Gauge; PublishError::REASONS.len()],
}

impl StallGauges {
    pub(crate) fn new(outbox: &str) -> Self {
        let gauges = PublishError::REASONS.map(|reason| {
            let gauge = metrics::gauge!(STALLED, "reason" => reason, "outbox" => outbox.to_owned());
            gauge.set(0.0);
            gauge
        });
        Self { gauges }
    }

    /// Stalled for `reason`, or (`None`) not stalled.
    pub(crate) fn set(&self, reason: Option<&str>) {
        for (known, gauge) in PublishError::REASONS.iter().zip(&self.gauges) {
            gauge.set(f64::from(u8::from(Some(*known) == reason)));
        }
    }
}

/// The Fetcher's claim sizes and durations.
pub(crate) struct ClaimSizes {
    claim_batch: Histogram,
    claim_duration: Histogram,
}

impl ClaimSizes {
    pub(crate) fn new(outbox: &str) -> Self {
        Self {
            claim_batch: histogram!(CLAIM_BATCH_SIZE, "outbox" => outbox.to_owned()),
            claim_duration: histogram!(CLAIM_DURATION, "outbox" => outbox.to_owned()),
        }
    }

    /// A claim returned `rows` rows after `took`. Its duration is always recorded (an
    /// idle poll costs the database too); empty claims' sizes are not: idle polls would
    /// drown the sizes of the claims that did work.
    pub(crate) fn claimed(&self, rows: usize, took: Duration) {
        self.claim_duration.record(took.as_secs_f64());
        if rows > 0 {
            self.claim_batch.record(rows as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics::{Key, KeyName, Metadata, Recorder, SharedString};
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    /// A recorder that keeps counter totals by key, for checking what the Marker counts.
    #[derive(Default)]
    struct Totals(Mutex<HashMap<String, Arc<AtomicU64>>>);

    impl Totals {
        /// A registered counter's total; panics for one never registered, so a series
        /// that must exist from the start cannot read as 0 by being absent.
        fn get(&self, key: &str) -> u64 {
            let totals = self.0.lock().unwrap();
            let total = totals.get(key).unwrap_or_else(|| {
                panic!("{key} never registered; registered: {:?}", totals.keys())
            });
            total.load(Ordering::SeqCst)
        }
    }

    struct Total(Arc<AtomicU64>);

    impl metrics::CounterFn for Total {
        fn increment(&self, value: u64) {
            self.0.fetch_add(value, Ordering::SeqCst);
        }

        fn absolute(&self, value: u64) {
            self.0.store(value, Ordering::SeqCst);
        }
    }

    impl Recorder for Totals {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            let labels: Vec<String> = key
                .labels()
                .map(|label| format!("{}={}", label.key(), label.value()))
                .collect();
            let name = format!("{}{{{}}}", key.name(), labels.join(","));
            let total = Arc::clone(self.0.lock().unwrap().entry(name).or_default());
            Counter::from_arc(Arc::new(Total(total)))
        }

        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> metrics::Gauge {
            metrics::Gauge::noop()
        }

        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    #[test]
    fn a_flush_counts_each_outcome_once_by_kind_and_reason() {
        let totals = Arc::new(Totals::default());
        let counters =
            metrics::with_local_recorder(totals.as_ref(), || OutcomeCounters::new("orders"));
        let retried = |reason| Resolution::Retried {
            reason,
            error: "error text".into(),
        };
        let dead = |reason| Resolution::Dead {
            reason,
            error: "error text".into(),
        };
        let flush = [
            Resolution::Published,
            Resolution::Published,
            retried("timeout"),
            dead("invalid"),
            Resolution::Released,
        ];
        let failed = |reason| format!("{EVENTS_FAILED}{{reason={reason},outbox=orders}}");
        // Every series exists from the start, at 0, so a first failure is a rate > 0.
        for reason in PublishError::REASONS {
            assert_eq!(totals.get(&failed(reason)), 0, "{reason}");
        }
        assert_eq!(totals.get(&format!("{EVENTS_DEAD}{{outbox=orders}}")), 0);
        counters.committed(flush.iter());
        counters.committed([dead("timeout")].iter());
        assert_eq!(
            totals.get(&format!("{EVENTS_PUBLISHED}{{outbox=orders}}")),
            2
        );
        assert_eq!(totals.get(&format!("{EVENTS_DEAD}{{outbox=orders}}")), 2);
        assert_eq!(totals.get(&failed("timeout")), 2);
        assert_eq!(totals.get(&failed("invalid")), 1);
        assert_eq!(totals.get(&failed("nacked")), 0);
    }
}
