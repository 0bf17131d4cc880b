//! What the broker received, checked against the rows: each delivery byte for byte with
//! its headers, and each room's events in the order of their rows.

use super::{Outcome, Planned};
use lapin::types::AMQPValue;
use outbox_tests::Received;
use std::collections::{BTreeMap, HashMap, HashSet};

/// What is wrong with `message` as the delivery of `row` (`outcome` its row afterwards).
pub(super) fn check_message(
    row: &Planned,
    outcome: &Outcome,
    message: &Received,
    node_id: &str,
) -> Option<String> {
    let Ok((routing_key, table)) = &row.expect else {
        return Some("published, though it cannot be".into());
    };
    let mut expected: BTreeMap<String, AMQPValue> = table
        .inner()
        .iter()
        .map(|(key, value)| (key.to_string(), value.clone()))
        .collect();
    for (name, value) in [
        ("room_id", AMQPValue::LongString(row.room.clone().into())),
        ("outbox_id", AMQPValue::LongLongInt(outcome.id)),
        ("retry_count", AMQPValue::LongInt(outcome.retry_count)),
        ("node_id", AMQPValue::LongString(node_id.into())),
    ] {
        expected.insert(name.into(), value);
    }
    let wrong = [
        (message.body != row.envelope, "body"),
        (message.kind != row.event_type, "type"),
        (&message.routing_key != routing_key, "routing key"),
        (message.headers != expected, "headers"),
        (message.delivery_mode != 2, "delivery mode"),
        (message.app_id != "outbox-relay", "app_id"),
    ];
    let wrong: Vec<&str> = wrong.iter().filter(|(bad, _)| *bad).map(|w| w.1).collect();
    (!wrong.is_empty()).then(|| {
        let shown = match message.body != row.envelope {
            true => format!(
                "expected a body of {} bytes {:?}, received {} bytes {:?}",
                row.envelope.len(),
                String::from_utf8_lossy(&row.envelope[..row.envelope.len().min(80)]),
                message.body.len(),
                String::from_utf8_lossy(&message.body[..message.body.len().min(80)]),
            ),
            false => format!(
                "expected headers {expected:?}, received {:?}",
                message.headers
            ),
        };
        format!("{} differ(s): {}", wrong.join(", "), preview_bytes(&shown))
    })
}

fn preview_bytes(text: &str) -> String {
    match text.char_indices().nth(600) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// Per room, whether the first deliveries of its events came in the order of their rows:
/// the rows that went dead at once hold back none of the room's other events, and let none
/// overtake another. `rows` gives each event id its room and row id. One line per event
/// that arrived after a later one of its room.
pub(super) fn out_of_order(
    received: &[Received],
    rows: &HashMap<&str, (&str, i64)>,
) -> Vec<String> {
    let mut seen = HashSet::new();
    let mut last: HashMap<&str, (i64, &str)> = HashMap::new();
    let mut wrong = Vec::new();
    for message in received {
        let event = message.message_id.as_str();
        // A delivery of no row is named apart.
        let Some(&(room, id)) = rows.get(event) else {
            continue;
        };
        if !seen.insert(event) {
            continue;
        }
        if let Some((previous, before)) = last.insert(room, (id, event)) {
            if previous >= id {
                wrong.push(format!(
                    "room {}: {} (row {id}) arrived after {} (row {previous})",
                    super::preview(&format!("{room:?}")),
                    super::preview(&format!("{event:?}")),
                    super::preview(&format!("{before:?}")),
                ));
            }
        }
    }
    wrong
}
