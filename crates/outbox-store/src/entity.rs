//! The outbox row (DESIGN §2) as a sea-orm entity.
//!
//! The table name is a setting (`database.table`), so statements name the table through
//! [`crate::TableName`]; the entity is the shape rows are read into.

use sea_orm::entity::prelude::*;
use sea_orm::FromQueryResult;

/// One row of the outbox table.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "room_outbox")]
pub struct Model {
    /// Insertion order; the order of publishing within a room.
    #[sea_orm(primary_key)]
    pub id: i64,
    /// Stable id; becomes AMQP `message_id`.
    #[sea_orm(unique)]
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
    pub created_at: ChronoDateTimeUtc,
    /// Not published before this.
    pub available_at: ChronoDateTimeUtc,
    /// Node that holds the claim.
    pub locked_by: Option<String>,
    /// Claim lease expiry.
    pub locked_until: Option<ChronoDateTimeUtc>,
    /// When the broker confirmed.
    pub published_at: Option<ChronoDateTimeUtc>,
}

/// The outbox row has no relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

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
    pub created_at: ChronoDateTimeUtc,
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
