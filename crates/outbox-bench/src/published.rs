//! The relay's own count of committed `published` outcomes, read in the bench's process:
//! `drain` learns that every row is marked from it, and asks the database only to confirm
//! (and once a second meanwhile, in case some events end otherwise). Asking the database
//! every 10 ms, as `drain` did, cost the relay's process and the database a share of what
//! they were being measured for (docs/decisions/0026-bench-ends-on-the-published-count.md).
//!
//! A `metrics` recorder that keeps one number, the sum of every
//! [`EVENTS_PUBLISHED`] counter: every other metric is a no-op, as it was without a
//! recorder, so the relay does no more work per event than before.

use metrics::{
    Counter, CounterFn, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use outbox_pipeline::instruments::EVENTS_PUBLISHED;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Events whose `published` outcome the relays in this process have committed.
static PUBLISHED: AtomicU64 = AtomicU64::new(0);

/// Installs the recorder for this process (once; later calls change nothing). Call before
/// a relay starts: its actors take their counters when they are built.
pub(crate) fn install() {
    let _ = metrics::set_global_recorder(PublishedOnly);
}

/// The count so far.
pub(crate) fn so_far() -> u64 {
    PUBLISHED.load(Ordering::Relaxed)
}

struct PublishedOnly;

struct Total;

impl CounterFn for Total {
    fn increment(&self, value: u64) {
        PUBLISHED.fetch_add(value, Ordering::Relaxed);
    }

    fn absolute(&self, _: u64) {}
}

impl Recorder for PublishedOnly {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        match key.name() == EVENTS_PUBLISHED {
            true => Counter::from_arc(Arc::new(Total)),
            false => Counter::noop(),
        }
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_published_counter_counts() {
        let recorder = PublishedOnly;
        let meta = Metadata::new("test", metrics::Level::INFO, None);
        let before = so_far();
        let published = recorder.register_counter(
            &Key::from_parts(EVENTS_PUBLISHED, vec![metrics::Label::new("outbox", "a")]),
            &meta,
        );
        let dead = recorder.register_counter(&Key::from_name("outbox_events_dead_total"), &meta);
        published.increment(3);
        dead.increment(5);
        assert_eq!(so_far() - before, 3);
    }
}
