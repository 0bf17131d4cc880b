//! The relay's options, validated.
//!
//! Settings files speak strings ("250ms", "per_room"); the CLI's settings parse them, apply
//! their defaults (including "zero means the default") and hand [`RelayOptions`] over.

use crate::retry::RetryPolicy;
use serde::Deserialize;
use std::fmt;
use std::time::Duration;

/// `relay.ordering`: what order the relay keeps. Spelled as in the settings; serde's error
/// for another spelling lists these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ordering {
    /// No event is published while an earlier event of its key is neither published nor dead.
    PerRoom,
    /// Every row is independent (the original worker's behaviour).
    None,
}

impl Ordering {
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

/// `relay.published_rows`: what becomes of a row once the broker confirmed its event.
/// Spelled as in the settings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PublishedRows {
    /// Marked `published` (with `published_at`) and kept until `relay.retention` deletes
    /// it, if ever: the table is the event's record.
    #[default]
    Keep,
    /// Deleted at once: the broker holds the event, the table only what is still to send
    /// and the dead (the convention of Debezium's and faststream's outbox users).
    Delete,
}

impl PublishedRows {
    /// The settings spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            PublishedRows::Keep => "keep",
            PublishedRows::Delete => "delete",
        }
    }
}

impl fmt::Display for PublishedRows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything the actors need to know, already validated.
#[derive(Debug, Clone)]
pub struct RelayOptions {
    /// The `worker` field of every log line.
    pub name: String,
    /// The outbox this relay serves: the `outbox` field of its log lines and label of its
    /// metrics.
    pub outbox: String,
    /// This process's identity in `locked_by`; unique per running process.
    pub node_id: String,
    /// Number of Publisher actors (each owns one confirm channel).
    pub publishers: usize,
    /// Time between two claims when nothing wakes the relay earlier.
    pub poll_interval: Duration,
    /// Rows per claim.
    pub batch_size: usize,
    /// Bound on the envelope bytes of claimed rows whose outcome is not written yet, give
    /// or take one row: a claim always takes at least one row, however large.
    pub max_inflight_bytes: usize,
    /// How long a publish may wait for the broker's confirm.
    pub publish_timeout: Duration,
    /// What a failed publish leads to.
    pub retry: RetryPolicy,
    /// How long a claim holds a row.
    pub lease: Duration,
    /// Per-key order (`per_room`) or none.
    pub ordering: Ordering,
    /// Hard bound on a graceful shutdown.
    pub shutdown_timeout: Duration,
    /// Published rows older than this are deleted (the Janitor); `None` keeps them forever.
    pub retention: Option<Duration>,
    /// Whether a published row is kept (marked) or deleted (the store's mark).
    pub published_rows: PublishedRows,
    /// Events failing and none published for this long: the outbox is stalled (a log
    /// line, `outbox_stalled`, `/readyz` 503).
    pub stall_after: Duration,
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
    use serde::de::value::{Error, StrDeserializer};
    use serde::de::IntoDeserializer;

    #[test]
    fn orderings_parse_from_their_settings_spelling() {
        let parse = |spelling: &str| {
            let spelling: StrDeserializer<'_, Error> = spelling.into_deserializer();
            Ordering::deserialize(spelling).map_err(|error| error.to_string())
        };
        for ordering in [Ordering::PerRoom, Ordering::None] {
            assert_eq!(parse(ordering.as_str()), Ok(ordering));
        }
        let error = parse("global").unwrap_err();
        assert!(
            error.contains("per_room") && error.contains("none"),
            "lists the accepted spellings: {error}"
        );
    }

    #[test]
    fn published_rows_parse_from_their_settings_spelling() {
        let parse = |spelling: &str| {
            let spelling: StrDeserializer<'_, Error> = spelling.into_deserializer();
            PublishedRows::deserialize(spelling).map_err(|error| error.to_string())
        };
        for rows in [PublishedRows::Keep, PublishedRows::Delete] {
            assert_eq!(parse(rows.as_str()), Ok(rows));
        }
        let error = parse("drop").unwrap_err();
        assert!(
            error.contains("keep") && error.contains("delete"),
            "{error}"
        );
        assert_eq!(PublishedRows::default(), PublishedRows::Keep);
    }

    #[test]
    fn durations_are_humanised_as_settings_spell_them() {
        assert_eq!(humanise(Duration::from_secs(300)), "300s");
        assert_eq!(humanise(Duration::from_millis(250)), "250ms");
    }
}
