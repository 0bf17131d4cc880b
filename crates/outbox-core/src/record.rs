//! An outbox row as the relay carries it through the pipeline.

use chrono::{DateTime, Utc};
use std::fmt;
use std::str::FromStr;

/// One claimed outbox row: everything needed to publish it and to log its outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRecord {
    /// Insertion order; the publishing order within a room.
    pub id: i64,
    /// Stable id; becomes the AMQP `message_id`.
    pub event_id: String,
    /// AMQP `type`; drives routing.
    pub event_type: String,
    /// Ordering key; AMQP header `room_id`.
    pub room_id: String,
    /// The message body, published byte for byte.
    pub envelope: String,
    /// Optional JSON object of string values, copied into the AMQP headers.
    pub headers: Option<String>,
    /// Failed attempts before this one.
    pub retry_count: i32,
    /// When the producer committed the row.
    pub created_at: DateTime<Utc>,
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

impl FromStr for Status {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pending" => Ok(Status::Pending),
            "published" => Ok(Status::Published),
            "dead" => Ok(Status::Dead),
            other => Err(format!("unknown status {other:?}")),
        }
    }
}
