//! The outbox row (docs/design.md#the-outbox-table) as statements read it.
//!
//! The table name is a setting (`database.table`), so there is no sea-orm entity: every
//! statement names the table through [`crate::TableName`] and reads rows into these
//! structs with [`FromQueryResult`].

use crate::reads::{PayloadDecode, Reads};
use chrono::{DateTime, Utc};
use sea_orm::{DbErr, FromQueryResult, QueryResult};

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

/// The columns a claim returns: what the relay needs to publish and log one event. The
/// mapped columns are read under these names (`crate::reads::Reads::claimed_columns`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimedRow {
    /// The row's position (insert order).
    pub id: i64,
    /// AMQP `message_id`.
    pub event_id: String,
    /// AMQP `type`.
    pub event_type: String,
    /// Ordering key.
    pub room_id: String,
    /// Body, byte for byte.
    pub envelope: Vec<u8>,
    /// Extra headers (JSON).
    pub headers: Option<String>,
    /// Failed attempts so far.
    pub retry_count: i32,
    /// Commit time of the producer.
    pub created_at: DateTime<Utc>,
}

impl ClaimedRow {
    /// Reads one row of a claim written with `reads`.
    pub(crate) fn read(row: &QueryResult, reads: &Reads) -> Result<Self, DbErr> {
        let envelope = match reads.payload_decode {
            PayloadDecode::Text => row.try_get::<String>("", "envelope")?.into_bytes(),
            PayloadDecode::Bytes => row.try_get::<Vec<u8>>("", "envelope")?,
        };
        let headers = if reads.has_headers() {
            row.try_get("", "headers")?
        } else {
            None
        };
        Ok(Self {
            id: row.try_get("", "id")?,
            event_id: row.try_get("", "event_id")?,
            event_type: row.try_get("", "event_type")?,
            room_id: row.try_get("", "room_id")?,
            envelope,
            headers,
            retry_count: row.try_get("", "retry_count")?,
            created_at: row.try_get("", "created_at")?,
        })
    }

    /// Reads every row of a claim written with `reads`, dropping each driver row once read:
    /// with large envelopes the claim then holds its bytes about once, not twice (the
    /// driver's copy and ours), which is what the relay's peak memory follows.
    pub(crate) fn read_all(rows: Vec<QueryResult>, reads: &Reads) -> Result<Vec<Self>, DbErr> {
        rows.into_iter()
            .map(|row| Self::read(&row, reads))
            .collect()
    }
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
