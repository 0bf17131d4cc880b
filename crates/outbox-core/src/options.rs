//! The relay's options after validation and normalisation.
//!
//! Settings files speak strings ("250ms", "per_room"); the CLI parses them and hands
//! [`RelayOptions`] to [`RelayOptions::normalise`], which applies the original worker's
//! rule: a zero duration or size means "use the default", with a warning.

use crate::retry::RetryPolicy;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Default `relay.poll_interval`.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Default `relay.batch_size`.
pub const DEFAULT_BATCH_SIZE: usize = 100;
/// Default `relay.publish_timeout`.
pub const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(3);
/// Default `relay.publishers`.
pub const DEFAULT_PUBLISHERS: usize = 4;
/// Default `relay.lease`.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Default `relay.shutdown_timeout`.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// Default `relay.retry_max_interval`.
pub const DEFAULT_RETRY_MAX_INTERVAL: Duration = Duration::from_secs(300);

/// `relay.ordering`: what order the relay keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ordering {
    /// No event is published while an earlier event of its room is neither published nor dead.
    #[default]
    PerRoom,
    /// Every row is independent (the original worker's behaviour).
    None,
}

impl Ordering {
    /// The accepted spellings, for error messages.
    pub const ACCEPTED: &'static str = "\"per_room\" or \"none\"";

    /// The settings spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            Ordering::PerRoom => "per_room",
            Ordering::None => "none",
        }
    }
}

impl fmt::Display for Ordering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Ordering {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "per_room" => Ok(Ordering::PerRoom),
            "none" => Ok(Ordering::None),
            _ => Err(()),
        }
    }
}

/// Everything the actors need to know, already validated.
#[derive(Debug, Clone)]
pub struct RelayOptions {
    /// The `worker` field of every log line.
    pub name: String,
    /// This process's identity in `locked_by`; unique per running process.
    pub node_id: String,
    /// Number of Publisher actors (each owns one confirm channel).
    pub publishers: usize,
    /// Time between two claims when nothing wakes the relay earlier.
    pub poll_interval: Duration,
    /// Rows per claim.
    pub batch_size: usize,
    /// How long a publish may wait for the broker's confirm.
    pub publish_timeout: Duration,
    /// What a failed publish leads to.
    pub retry: RetryPolicy,
    /// How long a claim holds a row.
    pub lease: Duration,
    /// Per-room order or none.
    pub ordering: Ordering,
    /// Hard bound on a graceful shutdown.
    pub shutdown_timeout: Duration,
    /// Published rows older than this are deleted (the Janitor); `None` keeps them forever.
    pub retention: Option<Duration>,
}

/// A value together with the warnings its normalisation produced.
#[derive(Debug, Clone)]
pub struct Normalised<T> {
    /// The normalised value.
    pub value: T,
    /// One line per setting that was replaced by its default.
    pub warnings: Vec<String>,
}

impl RelayOptions {
    /// Replaces zero durations and sizes by their defaults, saying so in a warning
    /// (the original worker's "non-positive means default" rule).
    pub fn normalise(mut self) -> Normalised<RelayOptions> {
        let mut warnings = Vec::new();
        let mut duration = |key: &str, value: &mut Duration, default: Duration| {
            if value.is_zero() {
                warnings.push(format!(
                    "relay.{key} is zero; using the default {}",
                    humanise(default)
                ));
                *value = default;
            }
        };
        duration(
            "poll_interval",
            &mut self.poll_interval,
            DEFAULT_POLL_INTERVAL,
        );
        duration(
            "publish_timeout",
            &mut self.publish_timeout,
            DEFAULT_PUBLISH_TIMEOUT,
        );
        duration("lease", &mut self.lease, DEFAULT_LEASE);
        duration(
            "shutdown_timeout",
            &mut self.shutdown_timeout,
            DEFAULT_SHUTDOWN_TIMEOUT,
        );
        duration(
            "retry_max_interval",
            &mut self.retry.max_interval,
            DEFAULT_RETRY_MAX_INTERVAL,
        );
        // An unset retry interval means "the next round", as in the original worker.
        if self.retry.interval.is_zero() {
            self.retry.interval = self.poll_interval;
        }
        let mut size = |key: &str, value: &mut usize, default: usize| {
            if *value == 0 {
                warnings.push(format!("relay.{key} is zero; using the default {default}"));
                *value = default;
            }
        };
        size("batch_size", &mut self.batch_size, DEFAULT_BATCH_SIZE);
        size("publishers", &mut self.publishers, DEFAULT_PUBLISHERS);
        Normalised {
            value: self,
            warnings,
        }
    }
}

/// "1s", "250ms": the way settings spell durations.
pub fn humanise(duration: Duration) -> String {
    if duration.subsec_nanos() == 0 {
        format!("{}s", duration.as_secs())
    } else {
        format!("{}ms", duration.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::RetryStrategy;

    fn zeroed() -> RelayOptions {
        RelayOptions {
            name: "room_outbox".into(),
            node_id: "n1".into(),
            publishers: 0,
            poll_interval: Duration::ZERO,
            batch_size: 0,
            publish_timeout: Duration::ZERO,
            retry: RetryPolicy {
                strategy: RetryStrategy::FixedInterval,
                interval: Duration::ZERO,
                max_interval: Duration::ZERO,
                max_attempts: 0,
            },
            lease: Duration::ZERO,
            ordering: Ordering::PerRoom,
            shutdown_timeout: Duration::ZERO,
            retention: None,
        }
    }

    #[test]
    fn zero_values_fall_back_to_defaults_with_warnings() {
        let normalised = zeroed().normalise();
        let options = normalised.value;
        assert_eq!(options.poll_interval, DEFAULT_POLL_INTERVAL);
        assert_eq!(options.batch_size, DEFAULT_BATCH_SIZE);
        assert_eq!(options.publish_timeout, DEFAULT_PUBLISH_TIMEOUT);
        assert_eq!(options.publishers, DEFAULT_PUBLISHERS);
        assert_eq!(options.retry.interval, DEFAULT_POLL_INTERVAL);
        let warnings = normalised.warnings.join("\n");
        for key in ["poll_interval", "batch_size", "publish_timeout"] {
            assert!(
                warnings.contains(&format!("relay.{key} is zero")),
                "{warnings}"
            );
        }
    }

    #[test]
    fn retry_interval_follows_a_custom_poll_interval() {
        let mut options = zeroed();
        options.poll_interval = Duration::from_millis(250);
        let options = options.normalise().value;
        assert_eq!(options.retry.interval, Duration::from_millis(250));
    }
}
