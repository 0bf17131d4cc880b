//! The producer side: inserting events into the outbox.
//!
//! Producers insert only `event_id, event_type, room_id, envelope` and optionally
//! `headers` and `available_at`; every other column has a default
//! (docs/producing/events.md#inserting-an-event).
//!
//! A Rust service calls [`enqueue`] inside the sea-orm transaction that changes its own
//! state, so the event commits, or rolls back, with that change:
//!
//! ```no_run
//! # async fn rename(db: &sea_orm::DatabaseConnection, table: &outbox_store::TableName) -> Result<(), sea_orm::DbErr> {
//! use outbox_store::{enqueue, NewEvent};
//! use sea_orm::{ConnectionTrait, TransactionTrait};
//!
//! let txn = db.begin().await?;
//! txn.execute_unprepared("UPDATE rooms SET name = 'Release planning' WHERE id = 'room-42'")
//!     .await?;
//! let event_id = enqueue(
//!     &txn,
//!     table,
//!     NewEvent::new("room.renamed", "room-42", r#"{"name":"Release planning"}"#),
//! )
//! .await?;
//! txn.commit().await?;
//! # let _ = event_id;
//! # Ok(())
//! # }
//! ```

use crate::dialect::Params;
use crate::error::Error;
use crate::sql::TableName;
use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DatabaseTransaction};

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

impl NewEvent {
    /// An event with a fresh id, no extra headers, available at once.
    ///
    /// The id is a UUID v7 in its hyphenated form (36 bytes): unique without coordination,
    /// and time-ordered, so the UNIQUE index on `event_id` grows at its end. Set
    /// `event_id` yourself instead when the event has a natural id that consumers should
    /// de-duplicate on (it becomes the AMQP `message_id`).
    pub fn new(
        event_type: impl Into<String>,
        room_id: impl Into<String>,
        envelope: impl Into<String>,
    ) -> Self {
        Self {
            event_id: uuid::Uuid::now_v7().hyphenated().to_string(),
            event_type: event_type.into(),
            room_id: room_id.into(),
            envelope: envelope.into(),
            headers: None,
            available_at: None,
        }
    }

    /// Sets the AMQP headers the event carries, e.g. a W3C `traceparent`, written as the
    /// JSON object of strings the `headers` column holds. Replaces earlier headers.
    pub fn with_headers<K, V>(mut self, headers: impl IntoIterator<Item = (K, V)>) -> Self
    where
        K: Into<String>,
        V: Into<String>,
    {
        let object: serde_json::Map<String, serde_json::Value> = headers
            .into_iter()
            .map(|(key, value)| (key.into(), serde_json::Value::String(value.into())))
            .collect();
        self.headers = (!object.is_empty()).then(|| serde_json::Value::Object(object).to_string());
        self
    }

    /// Delays publishing until `at`.
    pub fn available_at(mut self, at: DateTime<Utc>) -> Self {
        self.available_at = Some(at);
        self
    }
}

/// Inserts `event` into `table` inside the caller's transaction and returns its event id.
///
/// The event becomes visible to the relay when `txn` commits, and vanishes with it on a
/// rollback: the outbox promise. Taking a [`DatabaseTransaction`] rather than any
/// connection is deliberate: an event inserted on its own connection could commit while
/// the state change it describes rolls back. (Seeding and bulk loads use
/// [`insert_events`], which takes any connection.)
///
/// The [`Error`] converts into `sea_orm::DbErr`, so `?` works in code that returns
/// sea-orm's errors (the module's example).
pub async fn enqueue(
    txn: &DatabaseTransaction,
    table: &TableName,
    event: NewEvent,
) -> Result<String, Error> {
    insert_events(txn, table, std::slice::from_ref(&event)).await?;
    Ok(event.event_id)
}

/// Inserts `events` with one multi-row INSERT, on `db` or inside the caller's transaction
/// (`&DatabaseTransaction`), so the events commit together with the caller's state change.
pub async fn insert_events<C: ConnectionTrait>(
    db: &C,
    table: &TableName,
    events: &[NewEvent],
) -> Result<(), Error> {
    if events.is_empty() {
        return Ok(());
    }
    let mut params = Params::of(db);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_events_get_distinct_time_ordered_ids() {
        let first = NewEvent::new("room.renamed", "room-1", "{}");
        let second = NewEvent::new("room.renamed", "room-1", "{}");
        assert_ne!(first.event_id, second.event_id);
        assert_eq!(first.event_id.len(), 36, "fits event_id VARCHAR(64)");
        let version = uuid::Uuid::parse_str(&first.event_id)
            .unwrap()
            .get_version_num();
        assert_eq!(version, 7);
        assert!(first.event_id < second.event_id, "later ids sort later");
        assert_eq!(first.headers, None);
        assert_eq!(first.available_at, None);
    }

    #[test]
    fn headers_are_written_as_a_json_object_of_strings() {
        let event = NewEvent::new("room.renamed", "room-1", "{}").with_headers([
            (
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
            ("note", "quote \" inside"),
        ]);
        let parsed: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(event.headers.as_deref().unwrap()).unwrap();
        assert_eq!(parsed["note"], "quote \" inside");
        assert_eq!(
            parsed["traceparent"],
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        let none = NewEvent::new("a", "b", "{}").with_headers(Vec::<(String, String)>::new());
        assert_eq!(none.headers, None, "no headers: NULL, not {{}}");
    }
}
