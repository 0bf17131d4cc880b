//! An outbox row as the relay carries it through the pipeline.

use chrono::{DateTime, Utc};
use std::fmt;
use std::str::FromStr;

/// One claimed outbox row: everything needed to publish it and to log its outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRecord {
    /// Insertion order; the publishing order among the rows of one key.
    pub id: i64,
    /// Stable id; becomes the AMQP `message_id`.
    pub event_id: String,
    /// AMQP `type`; drives routing.
    pub event_type: String,
    /// Ordering key (the mapped key column, `room_id` by default); in the AMQP header
    /// named by `key_header` (`room_id` by default).
    pub key: String,
    /// The message body, published byte for byte (the payload column's bytes; a JSON
    /// column's text form).
    pub envelope: Vec<u8>,
    /// Optional JSON object of string values, copied into the AMQP headers.
    pub headers: Option<String>,
    /// Failed attempts before this one.
    pub retry_count: i32,
    /// When the producer committed the row.
    pub created_at: DateTime<Utc>,
    /// The outbox's extra columns (routing placeholders, header columns, a content type),
    /// in the order of its [`crate::ExtraColumns::reads`]; `None` for NULL. Empty when
    /// the outbox reads none.
    pub columns: Vec<Option<crate::ColumnValue>>,
}

/// The `status` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Waiting to be published (possibly after a failed attempt).
    Pending,
    /// Confirmed by the broker.
    Published,
    /// Gave up after `max_attempts`, or failed permanently; kept for `dead requeue`.
    Dead,
}

impl Status {
    /// Every status.
    pub const ALL: [Status; 3] = [Status::Pending, Status::Published, Status::Dead];

    /// The value stored in the `status` column.
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Published => "published",
            Status::Dead => "dead",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Reads a `status` column value (the store's counts by status).
impl FromStr for Status {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Status::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| format!("unknown status {s:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::Status;

    #[test]
    fn a_status_reads_back_from_its_column_value() {
        for status in Status::ALL {
            assert_eq!(status.as_str().parse(), Ok(status));
        }
        assert!("Pending".parse::<Status>().is_err());
    }
}
