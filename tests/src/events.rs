//! Test events, and seeding them.

use crate::database::TestDatabase;
use outbox_store::{insert_events, NewEvent};

/// Event `id` of `room`: type `room.message.posted`, body `{"id":"<id>"}`, no headers.
/// [`TestEvent`] changes the type or the body.
pub fn event(id: &str, room: &str) -> NewEvent {
    NewEvent {
        event_id: id.into(),
        event_type: "room.message.posted".into(),
        room_id: room.into(),
        envelope: format!(r#"{{"id":"{id}"}}"#),
        headers: None,
        available_at: None,
    }
}

/// What a test changes in an [`event`], beside `NewEvent`'s own builders.
pub trait TestEvent {
    /// Of type `event_type` (which routing depends on).
    fn of_type(self, event_type: &str) -> Self;
    /// With `envelope` as its body.
    fn with_envelope(self, envelope: impl Into<String>) -> Self;
}

impl TestEvent for NewEvent {
    fn of_type(mut self, event_type: &str) -> Self {
        self.event_type = event_type.into();
        self
    }

    fn with_envelope(mut self, envelope: impl Into<String>) -> Self {
        self.envelope = envelope.into();
        self
    }
}

/// `count` events spread round-robin over `rooms` rooms; every third carries headers.
/// Event ids are `<prefix>-<n>`, bodies are distinct JSON with a multi-byte character.
pub fn room_events(prefix: &str, count: usize, rooms: usize) -> Vec<NewEvent> {
    (0..count)
        .map(|n| NewEvent {
            event_id: format!("{prefix}-{n:06}"),
            event_type: "room.message.posted".into(),
            room_id: format!("room-{}", n % rooms),
            envelope: format!(r#"{{"n":{n},"text":"héllo wörld {n}"}}"#),
            headers: (n % 3 == 0).then(|| {
                format!(
                    r#"{{"tenant":"t{}","traceparent":"00-{n:032x}-{n:016x}-01"}}"#,
                    n % 7
                )
            }),
            available_at: None,
        })
        .collect()
}

/// [`room_events`] in rooms of their own (`<prefix>-room-…`), shared with no other group
/// of events: one group's waiting rows hold no other group back.
pub fn own_room_events(prefix: &str, count: usize, rooms: usize) -> Vec<NewEvent> {
    room_events(prefix, count, rooms)
        .into_iter()
        .map(|mut event| {
            event.room_id = format!("{prefix}-{}", event.room_id);
            event
        })
        .collect()
}

/// Inserts `events` in batches of 500.
pub async fn seed(database: &TestDatabase, events: &[NewEvent]) {
    for chunk in events.chunks(500) {
        insert_events(database.db(), &database.table, chunk)
            .await
            .expect("events inserted");
    }
}
