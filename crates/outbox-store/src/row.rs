//! The outbox row (docs/design.md#the-outbox-table) as statements read it.
//!
//! The table name is a setting (`database.table`), so there is no sea-orm entity: every
//! statement names the table through [`crate::TableName`] and reads rows into these
//! structs with [`FromQueryResult`].

use chrono::{DateTime, Utc};
use sea_orm::FromQueryResult;

/// One whole row of the outbox table (`SELECT *`: tests and tools).
#[derive(Clone, Debug, PartialEq, Eq, FromQueryResult)]
pub struct OutboxRow {
    /// Insertion order; the order of publishing within a room.
    pub id: i64,
    /// Stable id; becomes AMQP `message_id`.
    pub event_id: String,
    /// AMQP `type`; used by routing.
    pub event_type: String,
    /// Ordering key; AMQP header `room_id`.
    pub room_id: String,
    /// The message body.
    pub envelope: String,
    /// Optional JSON object of string values for the AMQP headers.
    pub headers: Option<String>,
    /// `pending`, `published` or `dead`.
    pub status: String,
    /// Failed attempts so far.
    pub retry_count: i32,
    /// Last failure, trimmed to 512 bytes.
    pub last_error: Option<String>,
    /// When the producer wrote it.
    pub created_at: DateTime<Utc>,
    /// Not published before this.
    pub available_at: DateTime<Utc>,
    /// Node that holds the claim.
    pub locked_by: Option<String>,
    /// Claim lease expiry.
    pub locked_until: Option<DateTime<Utc>>,
    /// When the broker confirmed.
    pub published_at: Option<DateTime<Utc>>,
}

/// The columns a claim returns: what the relay needs to publish and log one event.
#[derive(Clone, Debug, PartialEq, Eq, FromQueryResult)]
pub struct ClaimedRow {
    /// Row id.
    pub id: i64,
    /// AMQP `message_id`.
    pub event_id: String,
    /// AMQP `type`.
    pub event_type: String,
    /// Ordering key.
    pub room_id: String,
    /// Body.
    pub envelope: String,
    /// Extra headers (JSON).
    pub headers: Option<String>,
    /// Failed attempts so far.
    pub retry_count: i32,
    /// Commit time of the producer.
    pub created_at: DateTime<Utc>,
}

impl From<ClaimedRow> for outbox_core::OutboxRecord {
    fn from(row: ClaimedRow) -> Self {
        Self {
            id: row.id,
            event_id: row.event_id,
            event_type: row.event_type,
            room_id: row.room_id,
            envelope: row.envelope,
            headers: row.headers,
            retry_count: row.retry_count,
            created_at: row.created_at,
        }
    }
}
