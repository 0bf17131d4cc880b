//! The outbox row (docs/design.md#the-outbox-table) as statements read it.
//!
//! The table name is a setting (`database.table`), so there is no sea-orm entity: every
//! statement names the table through [`crate::TableName`] and reads rows into these
//! structs with [`FromQueryResult`].

use crate::reads::{Decode, PayloadDecode, Reads};
use chrono::{DateTime, Utc};
use futures_lite::StreamExt;
use sea_orm::{DbErr, FromQueryResult, QueryResult, Statement, StreamTrait};

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
    /// The extra columns, in the order of `Columns::extra` (`None`: NULL).
    pub columns: Vec<Option<outbox_core::ColumnValue>>,
}

impl ClaimedRow {
    /// Reads one row of a claim written with `reads`.
    pub(crate) fn read(row: &QueryResult, reads: &Reads) -> Result<Self, DbErr> {
        let (mut claimed, envelope) = Self::read_columns(row, reads)?;
        claimed.envelope = envelope.ok_or_else(|| null_payload(claimed.id))?;
        Ok(claimed)
    }

    /// Reads one row of a claim whose select list is [`Reads::claimed_columns_inline`]:
    /// the row, and the size of its envelope when the claim left it out for being large
    /// (the envelope is then empty until read in pieces).
    pub(crate) fn read_inline(
        row: &QueryResult,
        reads: &Reads,
    ) -> Result<(Self, Option<usize>), DbErr> {
        let (mut claimed, envelope) = Self::read_columns(row, reads)?;
        let size = row.try_get::<Option<i32>>("", "envelope_bytes")?;
        match (envelope, size) {
            (Some(envelope), _) => {
                claimed.envelope = envelope;
                Ok((claimed, None))
            }
            (None, Some(size)) => Ok((claimed, Some(usize::try_from(size).unwrap_or(0)))),
            (None, None) => Err(null_payload(claimed.id)),
        }
    }

    /// The row's columns, its envelope apart (`None`: NULL).
    fn read_columns(row: &QueryResult, reads: &Reads) -> Result<(Self, Option<Vec<u8>>), DbErr> {
        let envelope = match reads.payload_decode {
            PayloadDecode::Text => row
                .try_get::<Option<String>>("", "envelope")?
                .map(String::into_bytes),
            PayloadDecode::Bytes => row.try_get::<Option<Vec<u8>>>("", "envelope")?,
        };
        let headers = if reads.has_headers() {
            row.try_get("", "headers")?
        } else {
            None
        };
        let claimed = Self {
            id: row.try_get("", "id")?,
            event_id: row.try_get("", "event_id")?,
            event_type: row.try_get("", "event_type")?,
            room_id: row.try_get("", "room_id")?,
            envelope: Vec::new(),
            headers,
            retry_count: row.try_get("", "retry_count")?,
            created_at: row.try_get("", "created_at")?,
            columns: read_extra(row, reads)?,
        };
        Ok((claimed, envelope))
    }
}

/// The extra columns of a claimed row, each decoded as its read says.
fn read_extra(
    row: &QueryResult,
    reads: &Reads,
) -> Result<Vec<Option<outbox_core::ColumnValue>>, DbErr> {
    use outbox_core::ColumnValue;
    let mut values = Vec::with_capacity(reads.extra.len());
    for (index, (_, decode)) in reads.extra.iter().enumerate() {
        let name = format!("extra_{index}");
        let value = match decode {
            Decode::Text => row
                .try_get::<Option<String>>("", &name)?
                .map(ColumnValue::Text),
            Decode::Integer => row
                .try_get::<Option<i64>>("", &name)?
                .map(ColumnValue::Integer),
            Decode::Boolean => row
                .try_get::<Option<bool>>("", &name)?
                .map(ColumnValue::Boolean),
            Decode::BooleanInteger => row
                .try_get::<Option<i64>>("", &name)?
                .map(|value| ColumnValue::Boolean(value != 0)),
            Decode::Timestamp => row
                .try_get::<Option<DateTime<Utc>>>("", &name)?
                .map(ColumnValue::Timestamp),
        };
        values.push(value);
    }
    Ok(values)
}

/// Runs `statement` on `conn` and reads each row of its answer with `read` as it
/// arrives. Each driver row is dropped once read, so a claim of large envelopes holds
/// their bytes about once (ours), not twice (the driver's whole answer and ours): what
/// the relay's peak memory follows (docs/operations.md, "Memory and large envelopes").
pub(crate) async fn read_each<C: StreamTrait, T>(
    conn: &C,
    statement: Statement,
    mut read: impl FnMut(&QueryResult) -> Result<T, DbErr>,
) -> Result<Vec<T>, DbErr> {
    let stream = conn.stream(statement).await?;
    let mut stream = std::pin::pin!(stream);
    let mut rows = Vec::new();
    while let Some(row) = stream.next().await {
        rows.push(read(&row?)?);
    }
    Ok(rows)
}

/// A claimed row whose payload is NULL: nothing to publish.
fn null_payload(id: i64) -> DbErr {
    DbErr::Custom(format!("row {id}: the payload is NULL"))
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
            columns: row.columns,
        }
    }
}
