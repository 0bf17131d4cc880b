//! Operator queries: dead events and requeueing them.

use crate::dialect::Params;
use crate::error::Error;
use crate::sql::{DEAD, PENDING};
use crate::store::SeaOrmStore;
use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, FromQueryResult};

/// A dead event as `dead list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, FromQueryResult)]
pub struct DeadEvent {
    /// Row id.
    pub id: i64,
    /// Event id.
    pub event_id: String,
    /// Event type.
    pub event_type: String,
    /// Room.
    pub room_id: String,
    /// Failed attempts.
    pub retry_count: i32,
    /// Why it died.
    pub last_error: Option<String>,
    /// When the producer wrote it.
    pub created_at: DateTime<Utc>,
}

/// Which dead events to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadFilter {
    /// Only this room.
    pub room: Option<String>,
    /// Only this event type.
    pub event_type: Option<String>,
}

/// Which dead events to requeue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requeue {
    /// These event ids.
    EventIds(Vec<String>),
    /// Every dead event of this room.
    Room(String),
    /// Every dead event.
    All,
}

impl SeaOrmStore {
    /// Dead events matching `filter`, oldest first.
    pub async fn dead_events(
        &self,
        filter: &DeadFilter,
        limit: u64,
    ) -> Result<Vec<DeadEvent>, Error> {
        let t = self.table();
        let reads = self.reads();
        let mut params = Params::new(self.dialect());
        let mut conditions = String::new();
        if let Some(room) = &filter.room {
            conditions.push_str(&format!(
                " AND {} = {}",
                reads.key_text,
                params.bind(room.as_str())
            ));
        }
        if let Some(event_type) = &filter.event_type {
            conditions.push_str(&format!(
                " AND {} = {}",
                reads.event_type,
                params.bind(event_type.as_str())
            ));
        }
        let limit = params.bind(i64::try_from(limit).unwrap_or(i64::MAX));
        DeadEvent::find_by_statement(params.statement(format!(
            "SELECT {} AS id, {} AS event_id, {} AS event_type, {} AS room_id, retry_count, \
             last_error, {} AS created_at FROM {t} WHERE status = {DEAD}{conditions} \
             ORDER BY {} LIMIT {limit}",
            reads.position_value(&reads.position),
            reads.event_id,
            reads.event_type,
            reads.key_text,
            reads.created_at,
            reads.position,
        )))
        .all(self.connection())
        .await
        .map_err(Error::from)
    }

    /// Makes the selected dead events pending again: `retry_count = 0`, available now,
    /// `last_error` kept for the record. Returns how many rows changed.
    pub async fn requeue_dead(&self, which: &Requeue) -> Result<u64, Error> {
        let t = self.table();
        let reads = self.reads();
        let mut params = Params::new(self.dialect());
        let now = params.bind_time(Utc::now());
        let filter = match which {
            Requeue::EventIds(ids) if ids.is_empty() => return Ok(0),
            Requeue::EventIds(ids) => {
                let list = ids
                    .iter()
                    .map(|id| params.bind(id.as_str()))
                    .collect::<Vec<_>>()
                    .join(", ");
                format!(" AND {} IN ({list})", reads.event_id)
            }
            Requeue::Room(room) => {
                format!(" AND {} = {}", reads.key_text, params.bind(room.as_str()))
            }
            Requeue::All => String::new(),
        };
        let result = self
            .connection()
            .execute(params.statement(format!(
                "UPDATE {t} SET status = {PENDING}, retry_count = 0, available_at = {now}, \
                 locked_by = NULL, locked_until = NULL WHERE status = {DEAD}{filter}"
            )))
            .await?;
        Ok(result.rows_affected())
    }
}
