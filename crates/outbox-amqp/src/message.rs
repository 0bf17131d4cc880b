//! How a record becomes an AMQP message: its properties and headers (docs/design/publishing.md).

use crate::APP_ID;
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::BasicProperties;
use outbox_core::{ColumnValue, ExtraColumns, OutboxRecord, PublishError};

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

/// Properties and headers of `record` for an outbox with no extra columns and the
/// process's `content_type` ([`outbox_properties`]).
pub fn properties(
    record: &OutboxRecord,
    settings: &MessageSettings,
    key_header: &str,
) -> Result<BasicProperties, PublishError> {
    outbox_properties(
        record,
        settings,
        &OutboxLabels {
            key_header,
            content_type: None,
            extra: &ExtraColumns::default(),
        },
    )
}

/// What one outbox adds to every message: its key header, content type and header columns.
#[derive(Debug, Clone, Copy)]
pub struct OutboxLabels<'a> {
    /// The header carrying the record's ordering key.
    pub key_header: &'a str,
    /// The outbox's `content_type`; `None`: the process's ([`MessageSettings`]).
    pub content_type: Option<&'a str>,
    /// Its extra columns: header columns and a per-row content type.
    pub extra: &'a ExtraColumns,
}

/// Properties and headers of `record`; header `key_header` carries its ordering key (the
/// record's `key`, whichever column it was read from). The `headers` column's JSON
/// object becomes typed AMQP headers ([`header_table`]); one AMQP cannot carry can never be
/// published: it is a permanent failure. Header columns (typed by their setting) win over the JSON's entries of the same name; the relay's own headers win
/// over both; a NULL column adds none. `content_type`: the row's column when it has one, else the outbox's, else
/// the process's.
pub fn outbox_properties(
    record: &OutboxRecord,
    settings: &MessageSettings,
    labels: &OutboxLabels<'_>,
) -> Result<BasicProperties, PublishError> {
    let mut headers = match record.headers.as_deref().filter(|h| !h.trim().is_empty()) {
        Some(extra) => header_table(extra)?,
        None => FieldTable::default(),
    };
    for column in labels.extra.headers() {
        if let Some(value) = labels.extra.value(record, column.read) {
            headers.insert(column.header.as_str().into(), column_value(value));
        }
    }
    // The relay's own headers win over a row's headers of the same name.
    headers.insert(labels.key_header.into(), long_string(record.key.clone()));
    headers.insert("outbox_id".into(), AMQPValue::LongLongInt(record.id));
    headers.insert("retry_count".into(), AMQPValue::LongInt(record.retry_count));
    headers.insert("node_id".into(), long_string(settings.node_id.clone()));
    let content_type = labels
        .extra
        .content_type(record)
        .or(labels.content_type)
        .unwrap_or(&settings.content_type);
    Ok(BasicProperties::default()
        .with_message_id(short(&record.event_id, "event_id")?)
        .with_type(short(&record.event_type, "event_type")?)
        .with_content_type(short(content_type, "content_type")?)
        .with_delivery_mode(2)
        .with_timestamp(u64::try_from(record.created_at.timestamp()).unwrap_or(0))
        .with_app_id(APP_ID.into())
        .with_headers(headers))
}

/// A header column's value as AMQP types it: text and UUIDs a long string, integers a
/// long-long-int, booleans a boolean, times a timestamp (whole seconds, UTC).
fn column_value(value: &ColumnValue) -> AMQPValue {
    match value {
        ColumnValue::Text(text) => long_string(text.clone()),
        ColumnValue::Integer(integer) => AMQPValue::LongLongInt(*integer),
        ColumnValue::Boolean(flag) => AMQPValue::Boolean(*flag),
        ColumnValue::Timestamp(time) => {
            AMQPValue::Timestamp(u64::try_from(time.timestamp()).unwrap_or(0))
        }
    }
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

/// How deep objects and arrays may nest in a `headers` value (the top-level object is
/// depth 1): far more than any producer's headers need, and a bound on what consumers must
/// decode.
pub const MAX_HEADER_DEPTH: usize = 16;

/// The `headers` column (a JSON object) as AMQP headers, typed as JSON types them: a string
/// is a long string, `true`/`false` a boolean, an integer a signed 64-bit integer
/// (long-long-int), any other number a double, an object a field table and an array a
/// field array, recursively; `null` drops its key (in an array it is AMQP's void).
/// Refused, naming the header: a value not JSON, not an object, an integer above
/// `i64::MAX`, a key over 255 bytes (an AMQP short string), nesting past
/// [`MAX_HEADER_DEPTH`].
pub fn header_table(json: &str) -> Result<FieldTable, PublishError> {
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| invalid(format!("not valid JSON ({e})")))?;
    if !value.is_object() {
        return Err(invalid("not a JSON object".into()));
    }
    match amqp_value(value, "", 1)? {
        Some(AMQPValue::FieldTable(table)) => Ok(table),
        _ => unreachable!("a JSON object becomes a field table"),
    }
}

fn invalid(why: String) -> PublishError {
    PublishError::Invalid(format!("headers column: {why}"))
}

/// `value` (at `path` in the headers, `depth` levels deep) as an AMQP field value; `None`
/// for `null`.
fn amqp_value(
    value: serde_json::Value,
    path: &str,
    depth: usize,
) -> Result<Option<AMQPValue>, PublishError> {
    use serde_json::Value;
    let nested = |what: &str| {
        if depth > MAX_HEADER_DEPTH {
            Err(invalid(format!(
                "header {} nests {what} deeper than {MAX_HEADER_DEPTH} levels",
                preview(path)
            )))
        } else {
            Ok(())
        }
    };
    Ok(Some(match value {
        Value::Null => return Ok(None),
        Value::Bool(flag) => AMQPValue::Boolean(flag),
        Value::String(text) => long_string(text),
        Value::Number(number) => match (number.as_i64(), number.as_f64()) {
            (Some(integer), _) => AMQPValue::LongLongInt(integer),
            (None, _) if number.is_u64() => {
                return Err(invalid(format!(
                    "header {path} is {number}, above the largest AMQP integer \
                     ({}, a signed 64-bit long-long-int); send it as a string",
                    i64::MAX
                )))
            }
            (None, Some(float)) => AMQPValue::Double(float),
            (None, None) => return Err(invalid(format!("header {path} is {number}"))),
        },
        Value::Object(map) => {
            nested("objects")?;
            let mut table = FieldTable::default();
            for (key, value) in map {
                let here = if path.is_empty() {
                    format!("{key:?}")
                } else {
                    format!("{path}.{key:?}")
                };
                if key.len() > 255 {
                    return Err(invalid(format!(
                        "header key {} is {} bytes; AMQP allows 255",
                        preview(&here),
                        key.len()
                    )));
                }
                if let Some(value) = amqp_value(value, &here, depth + 1)? {
                    table.insert(ShortString::from(key), value);
                }
            }
            AMQPValue::FieldTable(table)
        }
        Value::Array(items) => {
            nested("arrays")?;
            let mut array = FieldArray::default();
            for (index, item) in items.into_iter().enumerate() {
                let here = format!("{path}[{index}]");
                array.push(amqp_value(item, &here, depth + 1)?.unwrap_or(AMQPValue::Void));
            }
            AMQPValue::FieldArray(array)
        }
    }))
}

/// The first 40 characters of a long header path, for a message that names it.
fn preview(path: &str) -> String {
    match path.char_indices().nth(40) {
        Some((end, _)) => format!("{}…", &path[..end]),
        None => path.to_owned(),
    }
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
            key: "r1".into(),
            envelope: b"{}".to_vec(),
            headers: headers.map(str::to_owned),
            retry_count: 2,
            created_at: chrono::Utc.timestamp_opt(1_700_000_000, 0).unwrap(),
            columns: Vec::new(),
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
    fn headers_keep_their_json_types() {
        let props = properties(
            &record(Some(
                r#"{"prio":5,"neg":-3,"ok":true,"gone":null,"ratio":1.5,"s":"x",
                   "nested":{"a":1,"b":null},"list":[1,"x",null,[false]],
                   "huge":100000000000000000000}"#,
            )),
            &settings(),
            "room_id",
        )
        .unwrap();
        let headers = props.headers().as_ref().unwrap().inner();
        assert_eq!(headers.get("prio"), Some(&AMQPValue::LongLongInt(5)));
        assert_eq!(headers.get("neg"), Some(&AMQPValue::LongLongInt(-3)));
        assert_eq!(headers.get("ok"), Some(&AMQPValue::Boolean(true)));
        assert_eq!(headers.get("gone"), None, "null drops the header");
        assert_eq!(headers.get("ratio"), Some(&AMQPValue::Double(1.5)));
        assert_eq!(
            headers.get("huge"),
            Some(&AMQPValue::Double(1e20)),
            "beyond 64 bits, JSON's reading: a double"
        );
        assert_eq!(headers.get("s"), Some(&long_string("x".into())));
        let mut nested = FieldTable::default();
        nested.insert("a".into(), AMQPValue::LongLongInt(1));
        assert_eq!(headers.get("nested"), Some(&AMQPValue::FieldTable(nested)));
        let mut inner = FieldArray::default();
        inner.push(AMQPValue::Boolean(false));
        let mut list = FieldArray::default();
        for value in [
            AMQPValue::LongLongInt(1),
            long_string("x".into()),
            AMQPValue::Void,
            AMQPValue::FieldArray(inner),
        ] {
            list.push(value);
        }
        assert_eq!(headers.get("list"), Some(&AMQPValue::FieldArray(list)));
    }

    #[test]
    fn headers_amqp_cannot_carry_are_permanent_failures_naming_the_header() {
        let deep = format!("{{\"d\":{}1{}}}", "[".repeat(16), "]".repeat(16));
        let long_key = format!("{{\"n\":{{\"{}\":1}}}}", "k".repeat(256));
        for (bad, says) in [
            ("[1]", "not a JSON object".to_owned()),
            ("not json", "not valid JSON".to_owned()),
            (
                r#"{"big":18446744073709551615}"#,
                "header \"big\" is 18446744073709551615, above the largest AMQP integer".into(),
            ),
            (
                r#"{"a":{"b":[0,9223372036854775808]}}"#,
                "header \"a\".\"b\"[1] is 9223372036854775808".into(),
            ),
            (&long_key, "header key \"n\".\"kkkk".into()),
            (&long_key, "is 256 bytes; AMQP allows 255".into()),
            (&deep, "header \"d\"[0][0]".into()),
            (&deep, "nests arrays deeper than 16 levels".into()),
        ] {
            let error = properties(&record(Some(bad)), &settings(), "room_id").unwrap_err();
            assert!(error.is_permanent(), "{bad}: {error}");
            let error = error.to_string();
            assert!(error.contains("headers column: "), "{error}");
            assert!(error.contains(&says), "{says:?} not in {error}");
        }
        let just_deep_enough = format!("{{\"d\":{}1{}}}", "[".repeat(15), "]".repeat(15));
        assert!(properties(&record(Some(&just_deep_enough)), &settings(), "room_id").is_ok());
    }

    #[test]
    fn header_columns_are_typed_and_a_row_may_name_its_content_type() {
        use outbox_core::ValueKind;
        let mut extra = ExtraColumns::default();
        extra.add_header("tenant", "tenant_id", ValueKind::Text);
        extra.add_header("attempt", "attempt", ValueKind::Integer);
        extra.add_header("urgent", "urgent", ValueKind::Boolean);
        extra.add_header("occurred", "occurred_at", ValueKind::Timestamp);
        extra.add_header("gone", "missing", ValueKind::Text);
        extra.set_content_type_column("ctype");
        let mut record = record(Some(r#"{"tenant":"from-json","gone":"json"}"#));
        record.columns = vec![
            Some(ColumnValue::Text("acme".into())),
            Some(ColumnValue::Integer(3)),
            Some(ColumnValue::Boolean(true)),
            Some(ColumnValue::Timestamp(
                chrono::Utc.timestamp_opt(1_700_000_001, 0).unwrap(),
            )),
            None,
            Some(ColumnValue::Text("application/avro".into())),
        ];
        let labels = OutboxLabels {
            key_header: "aggregate_id",
            content_type: Some("text/plain"),
            extra: &extra,
        };
        let props = outbox_properties(&record, &settings(), &labels).unwrap();
        let headers = props.headers().as_ref().unwrap().inner();
        assert_eq!(headers.get("tenant"), Some(&long_string("acme".into())));
        assert_eq!(headers.get("attempt"), Some(&AMQPValue::LongLongInt(3)));
        assert_eq!(headers.get("urgent"), Some(&AMQPValue::Boolean(true)));
        assert_eq!(
            headers.get("occurred"),
            Some(&AMQPValue::Timestamp(1_700_000_001))
        );
        assert_eq!(
            headers.get("gone"),
            Some(&long_string("json".into())),
            "a NULL column adds no header"
        );
        assert_eq!(
            props.content_type().as_ref().unwrap().as_str(),
            "application/avro"
        );
        record.columns[5] = None;
        let props = outbox_properties(&record, &settings(), &labels).unwrap();
        assert_eq!(
            props.content_type().as_ref().unwrap().as_str(),
            "text/plain"
        );
    }
}
