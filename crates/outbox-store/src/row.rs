//! The outbox row (docs/producing/events.md#the-outbox-table) as statements read it.
//!
//! The table name is a setting (`database.table`), so there is no sea-orm entity: every
//! statement names the table through [`crate::TableName`] and reads rows into these
//! structs with [`FromQueryResult`].

use crate::reads::{Decode, PayloadDecode, Reads};
use chrono::{DateTime, Utc};
use futures_lite::StreamExt;
use sea_orm::{DbErr, FromQueryResult, QueryResult, Statement, StreamTrait, TryGetable};
use std::fmt::Display;

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

/// The columns a claim returns: what the relay needs to publish and log one event, read by
/// position in the order of `crate::reads::Reads::claimed_columns` (whose aliases are
/// these names, `room_id` for `key`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimedRow {
    /// The row's position (insert order).
    pub id: i64,
    /// AMQP `message_id`.
    pub event_id: String,
    /// AMQP `type`.
    pub event_type: String,
    /// Ordering key (the mapped key column).
    pub key: String,
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
    /// Reads one row of a claim written with `reads`, from its first column on; `next`
    /// is left at the column after the row's (a claim's `RETURNING` may add its own).
    pub(crate) fn read(next: &mut Cursor<'_>, reads: &Reads) -> Result<Self, DbErr> {
        let (mut claimed, payload) = Self::read_columns(next, reads, false)?;
        claimed.envelope = payload.envelope.ok_or_else(|| null_payload(claimed.id))?;
        Ok(claimed)
    }

    /// Reads one row of a claim whose select list is [`Reads::claimed_columns_inline`]:
    /// the row, and the size of its envelope when the claim left it out for being large
    /// (the envelope is then empty until read in pieces).
    pub(crate) fn read_inline(
        next: &mut Cursor<'_>,
        reads: &Reads,
    ) -> Result<(Self, Option<usize>), DbErr> {
        let (mut claimed, payload) = Self::read_columns(next, reads, true)?;
        match (payload.envelope, payload.size) {
            (Some(envelope), _) => {
                claimed.envelope = envelope;
                Ok((claimed, None))
            }
            (None, Some(size)) => Ok((claimed, Some(usize::try_from(size).unwrap_or(0)))),
            (None, None) => Err(null_payload(claimed.id)),
        }
    }

    /// The row's columns in the order of [`Reads::claimed_columns`], with
    /// `envelope_bytes` after the envelope when `inline`: the row, and its envelope apart.
    fn read_columns(
        next: &mut Cursor<'_>,
        reads: &Reads,
        inline: bool,
    ) -> Result<(Self, Payload), DbErr> {
        let id = next.get("id")?;
        let event_id = next.get("event_id")?;
        let event_type = next.get("event_type")?;
        let key = next.get("room_id")?;
        let envelope = match reads.payload_decode {
            PayloadDecode::Text => next
                .get::<Option<String>>("envelope")?
                .map(String::into_bytes),
            PayloadDecode::Bytes => next.get::<Option<Vec<u8>>>("envelope")?,
        };
        let size = match inline {
            true => next.get::<Option<i32>>("envelope_bytes")?,
            false => None,
        };
        let headers = match reads.has_headers() {
            true => next.get("headers")?,
            false => None,
        };
        let claimed = Self {
            id,
            event_id,
            event_type,
            key,
            envelope: Vec::new(),
            headers,
            retry_count: next.get("retry_count")?,
            created_at: next.get("created_at")?,
            columns: read_extra(next, reads)?,
        };
        Ok((claimed, Payload { envelope, size }))
    }
}

/// A claimed row's envelope as read: `None` where NULL (or left out for its size), and
/// its size where the claim asked for it (`envelope_bytes`).
struct Payload {
    envelope: Option<Vec<u8>>,
    size: Option<i32>,
}

/// Reads a row's columns by position, in the order of its select list: by name, sea-orm
/// builds each column's name anew and the driver hashes it to find the column, for every
/// column of every row claimed (about a twentieth of the relay's CPU per event).
pub(crate) struct Cursor<'a> {
    row: &'a QueryResult,
    next: usize,
}

impl<'a> Cursor<'a> {
    /// At the first column of `row`.
    pub(crate) fn new(row: &'a QueryResult) -> Self {
        Self { row, next: 0 }
    }

    /// The next column, which the select list calls `name` (for the error only).
    pub(crate) fn get<T: TryGetable>(&mut self, name: impl Display) -> Result<T, DbErr> {
        let index = self.next;
        self.next += 1;
        self.row
            .try_get_by_index(index)
            .map_err(|error| DbErr::Type(format!("column {name} (#{index}): {error}")))
    }
}

/// The extra columns of a claimed row, each decoded as its read says.
fn read_extra(
    next: &mut Cursor<'_>,
    reads: &Reads,
) -> Result<Vec<Option<outbox_core::ColumnValue>>, DbErr> {
    use outbox_core::ColumnValue;
    let mut values = Vec::with_capacity(reads.extra.len());
    for (index, (_, decode)) in reads.extra.iter().enumerate() {
        let name = format_args!("extra_{index}");
        let value = match decode {
            Decode::Text => next.get::<Option<String>>(name)?.map(ColumnValue::Text),
            Decode::Integer => next.get::<Option<i64>>(name)?.map(ColumnValue::Integer),
            Decode::Boolean => next.get::<Option<bool>>(name)?.map(ColumnValue::Boolean),
            Decode::BooleanInteger => next
                .get::<Option<i64>>(name)?
                .map(|value| ColumnValue::Boolean(value != 0)),
            Decode::Timestamp => next
                .get::<Option<DateTime<Utc>>>(name)?
                .map(ColumnValue::Timestamp),
        };
        values.push(value);
    }
    Ok(values)
}

/// Runs `statement` on `conn` and reads each row of its answer with `read` as it
/// arrives. Each driver row is dropped once read, so a claim of large envelopes holds
/// their bytes about once (ours), not twice (the driver's whole answer and ours): what
/// the relay's peak memory follows (docs/operations/sizing.md#memory-and-large-envelopes.
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
            key: row.key,
            envelope: row.envelope,
            headers: row.headers,
            retry_count: row.retry_count,
            created_at: row.created_at,
            columns: row.columns,
        }
    }
}
