//! Synthetic room events and seeding them.

use crate::database::TestDatabase;
use outbox_store::{insert_events, NewEvent};

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

/// Inserts `events` in batches of 500.
pub async fn seed(database: &TestDatabase, events: &[NewEvent]) {
    for chunk in events.chunks(500) {
        insert_events(database.db(), &database.table, chunk)
            .await
            .expect("events inserted");
    }
}
