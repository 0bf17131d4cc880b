//! [`FailureLog`]: how many lines the Marker writes about failed events.
//!
//! One line per failed publish turns a leader election, a full queue or a typo'd routing
//! key into hundreds of lines a second. So for each reason ([`outbox_core::PublishError::reason`])
//! and fate (pending or dead) the first failure is said at its full level, with the event's
//! fields, and the others at debug; every [`SUMMARY_INTERVAL`] one line per reason says how
//! many failed since, with an example. A reason quiet for a whole interval starts over: its
//! next failure is said in full again (docs/design/observability.md#logs).

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How often a reason that keeps failing is summed up.
pub(crate) const SUMMARY_INTERVAL: Duration = Duration::from_secs(10);

/// What became of the failed events a line speaks of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Fate {
    /// Still pending: retried or deferred.
    Pending,
    /// Dead.
    Dead,
}

/// One failed event, as a summary shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Example {
    /// Its event id.
    pub event_id: String,
    /// Its ordering key.
    pub key: String,
    /// Its trimmed error.
    pub error: String,
}

/// The failures of one reason and fate since its last line.
#[derive(Debug)]
struct Tally {
    /// When its last line (the first failure, or a summary) was written.
    since: Instant,
    /// Failures said at debug only since then.
    count: u64,
    /// The latest of them.
    example: Option<Example>,
}

/// A summary line to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Summary {
    /// Pending or dead.
    pub fate: Fate,
    /// The failure reason.
    pub reason: &'static str,
    /// Failures since the reason's last line.
    pub failures: u64,
    /// How long that was.
    pub over: Duration,
    /// The latest of them.
    pub example: Example,
}

/// The Marker's record of what it said about failures, by reason and fate.
#[derive(Debug, Default)]
pub(crate) struct FailureLog {
    tallies: HashMap<(Fate, &'static str), Tally>,
}

impl FailureLog {
    /// A failure committed at `now`: `true` when it is the first of its reason and fate
    /// since they went quiet, to be said in full; otherwise it is counted for the next
    /// summary and said at debug only.
    pub(crate) fn note(
        &mut self,
        now: Instant,
        fate: Fate,
        reason: &'static str,
        example: impl FnOnce() -> Example,
    ) -> bool {
        match self.tallies.get_mut(&(fate, reason)) {
            Some(tally) => {
                tally.count += 1;
                tally.example = Some(example());
                false
            }
            None => {
                let tally = Tally {
                    since: now,
                    count: 0,
                    example: None,
                };
                self.tallies.insert((fate, reason), tally);
                true
            }
        }
    }

    /// The summaries due at `now`: every reason whose last line is [`SUMMARY_INTERVAL`]
    /// old and that failed since. A reason that did not fail over a whole interval is
    /// forgotten, so its next failure is said in full. `all`: every reason that failed
    /// since its last line, however recent (the Marker stops).
    pub(crate) fn due(&mut self, now: Instant, all: bool) -> Vec<Summary> {
        let mut summaries = Vec::new();
        self.tallies.retain(|&(fate, reason), tally| {
            let over = now.saturating_duration_since(tally.since);
            if over < SUMMARY_INTERVAL && !all {
                return true;
            }
            let Some(example) = tally.example.take() else {
                // Quiet for a whole interval: forgotten.
                return over < SUMMARY_INTERVAL;
            };
            summaries.push(Summary {
                fate,
                reason,
                failures: std::mem::take(&mut tally.count),
                over,
                example,
            });
            tally.since = now;
            true
        });
        summaries.sort_by_key(|summary| (summary.fate == Fate::Dead, summary.reason));
        summaries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example(n: u32) -> impl FnOnce() -> Example {
        move || Example {
            event_id: format!("e{n}"),
            key: "room-1".into(),
            error: "nacked by the broker".into(),
        }
    }

    #[test]
    fn the_first_failure_of_a_reason_is_said_and_the_rest_are_summed_up() {
        let mut log = FailureLog::default();
        let start = Instant::now();
        assert!(log.note(start, Fate::Pending, "nacked", example(0)));
        for n in 1..=10_000 {
            assert!(!log.note(start, Fate::Pending, "nacked", example(n)));
        }
        assert!(
            log.note(start, Fate::Dead, "nacked", example(0)),
            "another fate is another line"
        );
        assert!(
            log.note(start, Fate::Pending, "timeout", example(0)),
            "another reason too"
        );
        assert!(log.due(start + SUMMARY_INTERVAL / 2, false).is_empty());
        let summaries = log.due(start + SUMMARY_INTERVAL, false);
        assert_eq!(summaries.len(), 1, "{summaries:?}");
        let summary = &summaries[0];
        assert_eq!(
            (summary.fate, summary.reason, summary.failures),
            (Fate::Pending, "nacked", 10_000)
        );
        assert_eq!(summary.over, SUMMARY_INTERVAL);
        assert_eq!(summary.example.event_id, "e10000", "the latest");
    }

    #[test]
    fn a_reason_quiet_for_an_interval_is_said_in_full_again() {
        let mut log = FailureLog::default();
        let start = Instant::now();
        log.note(start, Fate::Pending, "nacked", example(0));
        log.note(start, Fate::Pending, "nacked", example(1));
        assert_eq!(log.due(start + SUMMARY_INTERVAL, false).len(), 1);
        let later = start + SUMMARY_INTERVAL;
        assert!(
            !log.note(later, Fate::Pending, "nacked", example(2)),
            "still counted: its summary was just written"
        );
        assert_eq!(log.due(later + SUMMARY_INTERVAL, false).len(), 1);
        let quiet = later + SUMMARY_INTERVAL * 2;
        assert!(log.due(quiet, false).is_empty(), "nothing failed since");
        assert!(
            log.note(quiet, Fate::Pending, "nacked", example(3)),
            "quiet for an interval: said in full"
        );
    }

    #[test]
    fn a_stop_sums_up_what_was_counted_however_recent() {
        let mut log = FailureLog::default();
        let start = Instant::now();
        log.note(start, Fate::Dead, "invalid", example(0));
        assert!(log.due(start, true).is_empty(), "nothing beyond the first");
        log.note(start, Fate::Dead, "invalid", example(1));
        let summaries = log.due(start, true);
        assert_eq!(summaries.len(), 1);
        assert_eq!(summaries[0].failures, 1);
    }
}
