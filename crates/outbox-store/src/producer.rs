//! The producer side: inserting events into the outbox.
//!
//! Producers insert only `event_id, event_type, room_id, envelope` and optionally
//! `headers` and `available_at`; every other column has a default (DESIGN §2).

use crate::sql::{Params, TableName};
use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DbErr};

/// One event to insert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    /// Stable id (at most 64 bytes); becomes the AMQP `message_id`.
    pub event_id: String,
    /// AMQP `type`; used by routing.
    pub event_type: String,
    /// Ordering key.
    pub room_id: String,
    /// The message body.
    pub envelope: String,
    /// Optional JSON object of string values, copied into the AMQP headers.
    pub headers: Option<String>,
    /// Not published before this; now when absent.
    pub available_at: Option<DateTime<Utc>>,
}

/// Inserts `events` with one multi-row INSERT, on `db` or inside the caller's transaction
/// (`&DatabaseTransaction`), so the events commit together with the caller's state change.
pub async fn insert_events<C: ConnectionTrait>(
    db: &C,
    table: &TableName,
    events: &[NewEvent],
) -> Result<(), DbErr> {
    if events.is_empty() {
        return Ok(());
    }
    let mut params = Params::new(db.get_database_backend());
    let mut rows = Vec::with_capacity(events.len());
    for event in events {
        let available_at = match event.available_at {
            Some(at) => params.bind_time(at),
            None => "CURRENT_TIMESTAMP".to_owned(),
        };
        rows.push(format!(
            "({}, {}, {}, {}, {}, {available_at})",
            params.bind(event.event_id.as_str()),
            params.bind(event.event_type.as_str()),
            params.bind(event.room_id.as_str()),
            params.bind(event.envelope.as_str()),
            params.bind(event.headers.clone()),
        ));
    }
    let sql = format!(
        "INSERT INTO {table} (event_id, event_type, room_id, envelope, headers, available_at) VALUES {}",
        rows.join(", ")
    );
    db.execute(params.statement(sql)).await?;
    Ok(())
}
