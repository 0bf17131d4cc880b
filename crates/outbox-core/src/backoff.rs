//! [`Backoff`]: how long to wait before trying a lost database or broker again.

use std::time::Duration;

/// Capped exponential backoff with *equal jitter*: the step starts at `first` and doubles
/// after every failure up to `cap`, and each wait is drawn uniformly from `[step / 2,
/// step]`. Jittered so that nodes that lost the database or broker together do not retry
/// in lockstep; equal rather than full jitter so a wait is never near zero (an outage is
/// not hammered) and `cap` stays the longest wait. See docs/design/reconnecting.md#backoff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    /// The step after a success: the longest first wait.
    first: Duration,
    /// The step stops doubling here: the longest wait.
    cap: Duration,
    /// The step of the next wait.
    step: Duration,
}

impl Backoff {
    /// A backoff whose first wait is at most `first` and no wait longer than `cap`.
    pub const fn new(first: Duration, cap: Duration) -> Self {
        Self {
            first,
            cap,
            step: first,
        }
    }

    /// The wait before the next attempt; doubles the step for the one after.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.step;
        self.step = step.saturating_mul(2).min(self.cap);
        step.mul_f64(0.5 + fastrand::f64() / 2.0)
    }

    /// Back to the first step, after a success.
    pub fn reset(&mut self) {
        self.step = self.first;
    }

    /// True when no failure came since the last success (or the start).
    pub fn is_reset(&self) -> bool {
        self.step == self.first
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn waits_double_up_to_the_cap_each_between_half_and_all_of_its_step() {
        let mut backoff = Backoff::new(100 * MS, 1000 * MS);
        for step in [100, 200, 400, 800, 1000, 1000] {
            let delay = backoff.next_delay();
            assert!(
                delay >= step * MS / 2 && delay <= step * MS,
                "step {step} ms: waited {delay:?}"
            );
        }
        assert!(!backoff.is_reset());
        backoff.reset();
        assert!(backoff.is_reset());
        assert!(backoff.next_delay() <= 100 * MS, "a success starts over");
    }

    #[test]
    fn two_nodes_failing_together_do_not_wait_alike() {
        let (mut a, mut b) = (
            Backoff::new(100 * MS, 1000 * MS),
            Backoff::new(100 * MS, 1000 * MS),
        );
        let same = (0..10).filter(|_| a.next_delay() == b.next_delay()).count();
        assert!(same < 10, "every wait was the same");
    }
}
