//! What a failed publish leads to.

use serde::Deserialize;
use std::fmt;
use std::time::Duration;

/// `relay.retry_strategy`, spelled as in the settings; serde's error for another spelling
/// lists these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryStrategy {
    /// Every retry waits `retry_interval` (the original worker's only strategy).
    FixedInterval,
    /// `min(retry_interval * 2^retry_count, retry_max_interval)` with full jitter.
    Exponential,
}

impl RetryStrategy {
    /// The settings spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            RetryStrategy::FixedInterval => "fixed_interval",
            RetryStrategy::Exponential => "exponential",
        }
    }
}

impl fmt::Display for RetryStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Retry settings of the relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Fixed or exponential.
    pub strategy: RetryStrategy,
    /// The fixed delay, or the base of the exponential one.
    pub interval: Duration,
    /// Cap of the exponential delay.
    pub max_interval: Duration,
    /// Attempts before an event goes dead; 0 retries forever.
    pub max_attempts: u32,
}

/// What becomes of an event whose publish failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureDecision {
    /// Stay pending; not before `delay` from now.
    Retry {
        /// Backoff before the next attempt.
        delay: Duration,
    },
    /// Give up: `status = 'dead'`.
    Dead,
    /// Not the event's fault (the broker away or not answering): stay pending with the
    /// same `retry_count`, not before `delay` from now. Never dead.
    Defer {
        /// Before the next attempt.
        delay: Duration,
    },
}

impl RetryPolicy {
    /// Decides the fate of an event that failed with `retry_count` failed attempts
    /// before this one. A `permanent` failure can never succeed, so it is dead at once.
    pub fn decide(&self, retry_count: i32, permanent: bool) -> FailureDecision {
        let attempts = u32::try_from(retry_count).unwrap_or(0).saturating_add(1);
        if permanent || (self.max_attempts > 0 && attempts >= self.max_attempts) {
            return FailureDecision::Dead;
        }
        FailureDecision::Retry {
            delay: self.delay(retry_count),
        }
    }

    /// [`RetryPolicy::decide`] for a failure that `counts` (the event caused it:
    /// [`crate::PublishError::counts_as_attempt`]) or not: one that does not is deferred,
    /// by the delay of its current attempt, and costs nothing.
    pub fn decide_failure(
        &self,
        retry_count: i32,
        permanent: bool,
        counts: bool,
    ) -> FailureDecision {
        if counts || permanent {
            return self.decide(retry_count, permanent);
        }
        FailureDecision::Defer {
            delay: self.delay(retry_count),
        }
    }

    /// The longest wait before a next attempt: the fixed interval, or the exponential cap.
    pub fn longest_delay(&self) -> Duration {
        match self.strategy {
            RetryStrategy::FixedInterval => self.interval,
            RetryStrategy::Exponential => self.max_interval,
        }
    }

    /// The wait before the next attempt of an event with `retry_count` failed attempts.
    fn delay(&self, retry_count: i32) -> Duration {
        match self.strategy {
            RetryStrategy::FixedInterval => self.interval,
            RetryStrategy::Exponential => {
                let exponent = u32::try_from(retry_count).unwrap_or(0).min(32);
                let cap = self
                    .interval
                    .checked_mul(1u32 << exponent.min(31))
                    .unwrap_or(self.max_interval)
                    .min(self.max_interval);
                // Full jitter: spreads retries of events that failed together.
                cap.mul_f64(fastrand::f64())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(strategy: RetryStrategy, max_attempts: u32) -> RetryPolicy {
        RetryPolicy {
            strategy,
            interval: Duration::from_secs(1),
            max_interval: Duration::from_secs(10),
            max_attempts,
        }
    }

    #[test]
    fn fixed_interval_waits_the_interval() {
        let decision = policy(RetryStrategy::FixedInterval, 0).decide(7, false);
        assert_eq!(
            decision,
            FailureDecision::Retry {
                delay: Duration::from_secs(1)
            }
        );
    }

    #[test]
    fn exponential_is_capped_and_jittered() {
        let policy = policy(RetryStrategy::Exponential, 0);
        for retry_count in 0..40 {
            let FailureDecision::Retry { delay } = policy.decide(retry_count, false) else {
                panic!("unlimited attempts never go dead");
            };
            let cap = Duration::from_secs(1 << retry_count.min(4)).min(Duration::from_secs(10));
            assert!(delay <= cap, "retry {retry_count}: {delay:?} > {cap:?}");
        }
    }

    #[test]
    fn max_attempts_turns_the_event_dead() {
        let policy = policy(RetryStrategy::FixedInterval, 3);
        assert!(matches!(
            policy.decide(0, false),
            FailureDecision::Retry { .. }
        ));
        assert!(matches!(
            policy.decide(1, false),
            FailureDecision::Retry { .. }
        ));
        assert_eq!(policy.decide(2, false), FailureDecision::Dead);
    }

    #[test]
    fn failures_the_event_did_not_cause_never_go_dead() {
        let policy = policy(RetryStrategy::FixedInterval, 3);
        for retry_count in [0, 2, 50] {
            assert_eq!(
                policy.decide_failure(retry_count, false, false),
                FailureDecision::Defer {
                    delay: Duration::from_secs(1)
                }
            );
        }
        assert_eq!(policy.decide_failure(2, false, true), FailureDecision::Dead);
    }

    #[test]
    fn permanent_failures_are_dead_at_once() {
        let policy = policy(RetryStrategy::FixedInterval, 0);
        assert_eq!(policy.decide(0, true), FailureDecision::Dead);
    }

    fn parse(spelling: &str) -> Result<RetryStrategy, String> {
        use serde::de::IntoDeserializer;
        let spelling: serde::de::value::StrDeserializer<'_, serde::de::value::Error> =
            spelling.into_deserializer();
        RetryStrategy::deserialize(spelling).map_err(|error| error.to_string())
    }

    #[test]
    fn strategies_parse_from_their_settings_spelling() {
        for strategy in [RetryStrategy::FixedInterval, RetryStrategy::Exponential] {
            assert_eq!(parse(strategy.as_str()), Ok(strategy));
        }
        let error = parse("linear").unwrap_err();
        assert!(
            error.contains("fixed_interval") && error.contains("exponential"),
            "lists the accepted spellings: {error}"
        );
    }
}
