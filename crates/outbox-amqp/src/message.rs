//! How a record becomes an AMQP message: its properties and headers (docs/design.md#publishing).

use crate::APP_ID;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::BasicProperties;
use outbox_core::{OutboxRecord, PublishError};

/// RabbitMQ's default `max_message_size` (128 MiB): larger bodies are refused by the broker.
pub const MAX_BODY_BYTES: usize = 128 * 1024 * 1024;

/// What every message of this relay shares.
#[derive(Debug, Clone)]
pub struct MessageSettings {
    /// `content_type` property.
    pub content_type: String,
    /// `node_id` header.
    pub node_id: String,
    /// Larger envelopes are refused before publishing (permanent failure): the broker's
    /// `max_message_size`, [`MAX_BODY_BYTES`] unless the broker is configured otherwise.
    pub max_body_bytes: usize,
}

/// A body over the broker's limit can never be published: a permanent failure.
pub fn check_body(length: usize, limit: usize) -> Result<(), PublishError> {
    if length > limit {
        return Err(PublishError::Invalid(format!(
            "envelope of {length} bytes exceeds the broker's maximum message size of {limit} bytes"
        )));
    }
    Ok(())
}

/// Properties and headers of `record`; header `key_header` carries its ordering key (the
/// record's `room_id`, whichever column it was read from). A `headers` column that is not a JSON object of
/// strings can never be published: it is a permanent failure.
pub fn properties(
    record: &OutboxRecord,
    settings: &MessageSettings,
    key_header: &str,
) -> Result<BasicProperties, PublishError> {
    let mut headers = FieldTable::default();
    if let Some(extra) = record.headers.as_deref().filter(|h| !h.trim().is_empty()) {
        for (key, value) in parse_headers(extra)? {
            headers.insert(ShortString::from(key), long_string(value));
        }
    }
    // The relay's own headers win over a row's headers of the same name.
    headers.insert(key_header.into(), long_string(record.room_id.clone()));
    headers.insert("outbox_id".into(), AMQPValue::LongLongInt(record.id));
    headers.insert("retry_count".into(), AMQPValue::LongInt(record.retry_count));
    headers.insert("node_id".into(), long_string(settings.node_id.clone()));
    Ok(BasicProperties::default()
        .with_message_id(short(&record.event_id, "event_id")?)
        .with_type(short(&record.event_type, "event_type")?)
        .with_content_type(ShortString::from(settings.content_type.as_str()))
        .with_delivery_mode(2)
        .with_timestamp(u64::try_from(record.created_at.timestamp()).unwrap_or(0))
        .with_app_id(APP_ID.into())
        .with_headers(headers))
}

fn long_string(value: String) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

fn short(value: &str, column: &str) -> Result<ShortString, PublishError> {
    if value.len() > 255 {
        return Err(PublishError::Invalid(format!(
            "{column} is {} bytes; AMQP allows 255",
            value.len()
        )));
    }
    Ok(ShortString::from(value))
}

fn parse_headers(json: &str) -> Result<Vec<(String, String)>, PublishError> {
    let invalid = |why: String| PublishError::Invalid(format!("headers column: {why}"));
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| invalid(format!("not valid JSON ({e})")))?;
    let serde_json::Value::Object(map) = value else {
        return Err(invalid("not a JSON object".into()));
    };
    map.into_iter()
        .map(|(key, value)| match value {
            serde_json::Value::String(text) if key.len() <= 255 => Ok((key, text)),
            serde_json::Value::String(_) => Err(invalid(format!("key of {} bytes", key.len()))),
            other => Err(invalid(format!(
                "value of {key:?} is not a string: {other}"
            ))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn record(headers: Option<&str>) -> OutboxRecord {
        OutboxRecord {
            id: 7,
            event_id: "ev-7".into(),
            event_type: "room.created".into(),
            room_id: "r1".into(),
            envelope: b"{}".to_vec(),
            headers: headers.map(str::to_owned),
            retry_count: 2,
            created_at: chrono::Utc.timestamp_opt(1_700_000_000, 0).unwrap(),
        }
    }

    fn settings() -> MessageSettings {
        MessageSettings {
            content_type: "application/json".into(),
            node_id: "node-a".into(),
            max_body_bytes: MAX_BODY_BYTES,
        }
    }

    #[test]
    fn properties_follow_the_contract() {
        let props = properties(
            &record(Some(r#"{"traceparent":"00-ab","room_id":"spoof"}"#)),
            &settings(),
            "room_id",
        )
        .unwrap();
        assert_eq!(props.message_id().as_ref().unwrap().as_str(), "ev-7");
        assert_eq!(props.kind().as_ref().unwrap().as_str(), "room.created");
        assert_eq!(*props.delivery_mode(), Some(2));
        assert_eq!(*props.timestamp(), Some(1_700_000_000));
        assert_eq!(props.app_id().as_ref().unwrap().as_str(), "outbox-relay");
        let headers = props.headers().as_ref().unwrap().inner();
        assert_eq!(headers.get("outbox_id"), Some(&AMQPValue::LongLongInt(7)));
        assert_eq!(headers.get("retry_count"), Some(&AMQPValue::LongInt(2)));
        assert_eq!(headers.get("room_id"), Some(&long_string("r1".into())));
        assert_eq!(
            headers.get("traceparent"),
            Some(&long_string("00-ab".into()))
        );
    }

    #[test]
    fn the_ordering_key_goes_in_the_outbox_key_header() {
        let props = properties(
            &record(Some(r#"{"aggregateid":"spoof","room_id":"kept"}"#)),
            &settings(),
            "aggregateid",
        )
        .unwrap();
        let headers = props.headers().as_ref().unwrap().inner();
        assert_eq!(
            headers.get("aggregateid"),
            Some(&long_string("r1".into())),
            "the record's key, winning over the row's header of that name"
        );
        assert_eq!(
            headers.get("room_id"),
            Some(&long_string("kept".into())),
            "no room_id header of the relay's own: the row's passes through"
        );
        assert_eq!(headers.get("outbox_id"), Some(&AMQPValue::LongLongInt(7)));
        assert_eq!(headers.get("node_id"), Some(&long_string("node-a".into())));
    }

    #[test]
    fn bodies_over_the_broker_limit_are_permanent_failures() {
        assert!(check_body(MAX_BODY_BYTES, MAX_BODY_BYTES).is_ok());
        let error = check_body(MAX_BODY_BYTES + 1, MAX_BODY_BYTES).unwrap_err();
        assert!(error.is_permanent());
        assert!(
            error.to_string().contains("maximum message size"),
            "{error}"
        );
    }

    #[test]
    fn headers_that_are_not_an_object_of_strings_are_permanent_failures() {
        for bad in ["[1]", "{\"a\":1}", "not json"] {
            let error = properties(&record(Some(bad)), &settings(), "room_id").unwrap_err();
            assert!(error.is_permanent(), "{bad}: {error}");
            assert!(error.to_string().contains("headers column"), "{error}");
        }
    }
}
