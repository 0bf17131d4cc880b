//! [`StallWatch`]: an outbox whose events keep failing while none is published.
//!
//! A relay that delivers nothing is worse than one that is down: nothing restarts it, and
//! `/readyz` said ready while every event came back unroutable. The Marker, which writes
//! every outcome, feeds this watch: once `relay.stall_after` has passed with failures and
//! no event published, the outbox is stalled, until an event is published again or no
//! failure has come for as long as a retry can wait. The Marker says so once in the log
//! (with the cause and the next step), in `outbox_stalled{outbox,reason}`, and to `/readyz`.

use outbox_core::PublishError;
use std::time::{Duration, Instant};

/// What a stalled outbox shows on-call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stall {
    /// The most frequent failure since the last event published
    /// ([`PublishError::reason`]).
    pub reason: &'static str,
    /// Failures since the last event published.
    pub failures: u64,
    /// The last failure of that reason, as written to `last_error`.
    pub error: String,
    /// Its event.
    pub event_id: String,
    /// How long its events have failed with none published.
    pub for_: Duration,
}

impl Stall {
    /// What to do about it, by reason.
    pub fn next_step(&self) -> &'static str {
        match self.reason {
            "unroutable" => {
                "no queue is bound to the exchange for these routing keys: bind one, or check \
                 amqp.exchange, amqp.routing_key and [[amqp.routes]]"
            }
            "no_exchange" => {
                "the exchange does not exist: create it, set amqp.declare_exchange = true, or \
                 check amqp.exchange (a typo is the usual cause)"
            }
            "nacked" => {
                "the broker refuses the messages (a queue at its length limit with overflow = \
                 reject-publish, a quorum queue without a majority): check the queues' policies \
                 and the broker's log"
            }
            "timeout" => {
                "the broker does not confirm within relay.publish_timeout (a hung node, a \
                 resource alarm, a slow disk): check the broker's health"
            }
            "channel" => {
                "the broker closes the channel or the connection: check the broker's log and \
                 the user's permissions on the exchange"
            }
            _ => {
                "the events cannot be published as they are: `outbox-relay status` and \
                 `outbox-relay dead list` show them"
            }
        }
    }
}

/// A change of the stall state, for the Marker to report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StallChange {
    /// The outbox stalled.
    Began(Stall),
    /// It moves again (or has nothing left that fails).
    Ended,
}

/// The state behind [`Stall`]: progress and failures as the Marker commits them.
#[derive(Debug)]
pub(crate) struct StallWatch {
    /// `relay.stall_after`.
    after: Duration,
    /// No failure for this long ends a stall that no publish ended: `after` plus the
    /// longest a retry waits, so a head retried rarely does not end it between two tries.
    quiet: Duration,
    /// The last event published, or the start.
    progress: Instant,
    /// The first failure since `progress`: the stall's clock starts there, so an outbox
    /// idle for long is not stalled by its first failure.
    first_failure: Option<Instant>,
    /// Failures since `progress`, by [`PublishError::REASONS`] index.
    failures: [u64; PublishError::REASONS.len()],
    /// The last failure of each reason since `progress`: when, `last_error`, event id.
    last: [Option<(Instant, String, String)>; PublishError::REASONS.len()],
    /// The reason of the stall under way.
    stalled: Option<&'static str>,
}

impl StallWatch {
    pub(crate) fn new(after: Duration, longest_retry: Duration, now: Instant) -> Self {
        Self {
            after,
            quiet: after + longest_retry,
            progress: now,
            first_failure: None,
            failures: [0; PublishError::REASONS.len()],
            last: Default::default(),
            stalled: None,
        }
    }

    /// An event was published.
    pub(crate) fn published(&mut self, now: Instant) {
        self.progress = now;
        self.first_failure = None;
        self.failures = [0; PublishError::REASONS.len()];
        self.last = Default::default();
    }

    /// An event failed with `reason`, written as `error`.
    pub(crate) fn failed(&mut self, now: Instant, reason: &str, error: &str, event_id: &str) {
        if let Some(index) = PublishError::REASONS.iter().position(|r| *r == reason) {
            self.first_failure.get_or_insert(now);
            self.failures[index] += 1;
            self.last[index] = Some((now, error.to_owned(), event_id.to_owned()));
        }
    }

    /// Whether the state changed at `now`.
    pub(crate) fn check(&mut self, now: Instant) -> Option<StallChange> {
        let latest = self.last.iter().flatten().map(|(at, ..)| *at).max();
        let failing = latest.is_some_and(|at| now.duration_since(at) < self.quiet);
        match self.stalled {
            Some(_) if !failing => {
                self.stalled = None;
                Some(StallChange::Ended)
            }
            Some(_) => None,
            None if failing
                && self
                    .first_failure
                    .is_some_and(|first| now.duration_since(first) >= self.after) =>
            {
                let (index, failures) = self
                    .failures
                    .iter()
                    .enumerate()
                    .max_by_key(|(_, n)| **n)
                    .map(|(index, n)| (index, *n))?;
                let (_, error, event_id) = self.last[index].clone()?;
                let reason = PublishError::REASONS[index];
                self.stalled = Some(reason);
                Some(StallChange::Began(Stall {
                    reason,
                    failures,
                    error,
                    event_id,
                    for_: now.duration_since(self.first_failure.unwrap_or(self.progress)),
                }))
            }
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AFTER: Duration = Duration::from_secs(60);
    const RETRY: Duration = Duration::from_secs(10);

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn failures_without_a_publish_for_stall_after_stall_the_outbox() {
        let start = Instant::now();
        let mut watch = StallWatch::new(AFTER, RETRY, start);
        for n in 0..5 {
            watch.failed(start + secs(n * 10), "unroutable", "unroutable: x", "e1");
        }
        watch.failed(start + secs(5), "timeout", "no confirm", "e2");
        assert_eq!(watch.check(start + secs(59)), None, "not yet");
        let Some(StallChange::Began(stall)) = watch.check(start + secs(60)) else {
            panic!("stalled at stall_after");
        };
        assert_eq!(stall.reason, "unroutable", "the most frequent reason");
        assert_eq!((stall.failures, stall.event_id.as_str()), (5, "e1"));
        assert!(stall.next_step().contains("bind"));
        assert_eq!(watch.check(start + secs(61)), None, "said once");
        watch.published(start + secs(62));
        assert_eq!(watch.check(start + secs(62)), Some(StallChange::Ended));
    }

    #[test]
    fn the_first_failure_after_a_long_idle_time_does_not_stall_at_once() {
        let start = Instant::now();
        let mut watch = StallWatch::new(AFTER, RETRY, start);
        watch.failed(start + secs(3600), "nacked", "nacked", "e1");
        assert_eq!(watch.check(start + secs(3601)), None);
        watch.failed(start + secs(3650), "nacked", "nacked", "e1");
        assert!(
            matches!(watch.check(start + secs(3660)), Some(StallChange::Began(stall)) if stall.for_ == secs(60)),
            "a minute of failures"
        );
    }

    #[test]
    fn an_idle_outbox_or_one_that_publishes_never_stalls() {
        let start = Instant::now();
        let mut watch = StallWatch::new(AFTER, RETRY, start);
        assert_eq!(watch.check(start + secs(600)), None, "idle: nothing failed");
        watch.failed(start + secs(601), "nacked", "nacked", "e1");
        watch.published(start + secs(602));
        assert_eq!(watch.check(start + secs(700)), None, "it published since");
    }

    #[test]
    fn a_stall_ends_once_nothing_has_failed_for_a_retry_s_wait() {
        let start = Instant::now();
        let mut watch = StallWatch::new(AFTER, RETRY, start);
        watch.failed(start + secs(30), "channel", "closed", "e1");
        watch.failed(start + secs(85), "channel", "closed", "e1");
        assert!(matches!(
            watch.check(start + secs(90)),
            Some(StallChange::Began(_))
        ));
        assert_eq!(watch.check(start + secs(85 + 69)), None);
        assert_eq!(
            watch.check(start + secs(85 + 70)),
            Some(StallChange::Ended),
            "no failure for stall_after plus the longest retry"
        );
    }
}
