//! What a publish attempt came to ([`OutcomeKind`]), and a flush of such results for the store.

use crate::ports::PublishError;
use chrono::{DateTime, Utc};

/// What happened to one claimed record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutcomeKind {
    /// The broker acked it.
    Published,
    /// The publish failed; the Marker decides between retry and dead.
    Failed(PublishError),
    /// Not attempted (shutdown, or held back behind a failed event of its key):
    /// only the lease is given back.
    Released,
}

/// A failed attempt as written to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Row id.
    pub id: i64,
    /// Trimmed error text for `last_error`.
    pub error: String,
}

/// Everything one Marker flush writes, in one transaction and one statement per kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MarkBatch {
    /// Rows confirmed by the broker.
    pub published: Vec<i64>,
    /// Rows that stay pending, with the time of their next attempt: the failure cost one
    /// attempt (`retry_count + 1`).
    pub retried: Vec<(Failure, DateTime<Utc>)>,
    /// Rows that stay pending, with the time of their next attempt, keeping their
    /// `retry_count`: the failure was not the event's (the broker away or not answering).
    pub deferred: Vec<(Failure, DateTime<Utc>)>,
    /// Rows that gave up.
    pub dead: Vec<Failure>,
    /// Rows whose lease is simply given back.
    pub released: Vec<i64>,
}

impl MarkBatch {
    /// Number of rows the batch touches.
    pub fn len(&self) -> usize {
        self.published.len()
            + self.retried.len()
            + self.deferred.len()
            + self.dead.len()
            + self.released.len()
    }

    /// True when there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
