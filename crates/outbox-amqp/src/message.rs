//! How a record becomes an AMQP message: its properties and headers (docs/design/publishing.md).

use crate::APP_ID;
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::BasicProperties;
use outbox_core::{ColumnValue, ExtraColumns, OutboxRecord, PublishError};
use serde_json::value::RawValue;
use std::collections::BTreeMap;

/// `amqp.max_message_size` by default: RabbitMQ 4's default `max_message_size`, 16 MiB
/// (3.x: 128 MiB). Larger bodies are refused by the broker.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 16 * 1024 * 1024;

/// The most any RabbitMQ takes, whatever its `max_message_size` (512 MiB).
pub const LARGEST_MAX_MESSAGE_SIZE: usize = 512 * 1024 * 1024;

/// What every message of this relay shares.
#[derive(Debug, Clone)]
pub struct MessageSettings {
    /// `content_type` property.
    pub content_type: String,
    /// `node_id` header.
    pub node_id: String,
    /// Larger envelopes are refused before publishing (permanent failure):
    /// `amqp.max_message_size`, the broker's `max_message_size`.
    pub max_body_bytes: usize,
}

/// A body over the broker's limit can never be published: a permanent failure.
pub fn check_body(length: usize, limit: usize) -> Result<(), PublishError> {
    if length > limit {
        return Err(PublishError::Invalid(format!(
            "envelope of {length} bytes exceeds the broker's maximum message size of {limit} \
             bytes (amqp.max_message_size)"
        )));
    }
    Ok(())
}

/// The broker closed the channel because a body of `length` bytes is over its
/// `max_message_size` (`PRECONDITION_FAILED - message size N is larger than [configured]
/// max size M`): the event's own failure, dead at once, when the size it names is this
/// body's. The other publishes in flight on the channel lose it through no fault of theirs
/// (`None`): their bodies are of other sizes, or over the limit as well.
pub fn oversized(text: &str, length: usize) -> Option<PublishError> {
    let after = |marker: &str| -> Option<usize> {
        let rest = &text[text.find(marker)? + marker.len()..];
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        rest[..digits].parse().ok()
    };
    let size = after("message size ")?;
    let limit = after("max size ")?;
    (size == length && size > limit).then(|| {
        PublishError::Invalid(format!(
            "envelope of {size} bytes is larger than the broker's max_message_size of {limit} \
             bytes: the broker closed the channel (set amqp.max_message_size to the broker's \
             limit to refuse such events before publishing)"
        ))
    })
}

/// A content header frame's bytes besides its properties: the frame's type, channel, size
/// and end (8), and the class, weight, body size and property flags (14).
const HEADER_FRAME_OVERHEAD: usize = 8 + 14;

/// A message whose properties (its headers, mostly) do not fit in one frame of the
/// connection's `frame_max` can never be published: AMQP carries them in a single content
/// header frame, and RabbitMQ answers a larger one by closing the whole connection
/// (`FRAME_ERROR … frame_too_large`), failing every publish in flight on it, over and over
/// as the event is retried. A permanent failure instead, naming the size and the limit.
pub fn check_header_frame(
    properties: &BasicProperties,
    frame_max: u32,
) -> Result<(), PublishError> {
    let bytes = header_frame_bytes(properties);
    // 0: no limit negotiated (lapin then sends frames of any size).
    if frame_max != 0 && bytes > frame_max as usize {
        return Err(PublishError::Invalid(format!(
            "the message's properties take {bytes} bytes (headers column and relay headers), \
             above the broker's frame_max of {frame_max} bytes that one content header frame \
             must fit in; send large values in the envelope"
        )));
    }
    Ok(())
}

/// The bytes of the content header frame that carries `properties`, as AMQP 0-9-1 encodes it.
pub fn header_frame_bytes(properties: &BasicProperties) -> usize {
    let short = |value: &Option<ShortString>| value.as_ref().map_or(0, |s| 1 + s.as_str().len());
    HEADER_FRAME_OVERHEAD
        + short(properties.content_type())
        + short(properties.content_encoding())
        + properties.headers().as_ref().map_or(0, table_bytes)
        + properties.delivery_mode().map_or(0, |_| 1)
        + properties.priority().map_or(0, |_| 1)
        + short(properties.correlation_id())
        + short(properties.reply_to())
        + short(properties.expiration())
        + short(properties.message_id())
        + properties.timestamp().map_or(0, |_| 8)
        + short(properties.kind())
        + short(properties.user_id())
        + short(properties.app_id())
        + short(properties.cluster_id())
}

fn table_bytes(table: &FieldTable) -> usize {
    4 + table
        .inner()
        .iter()
        .map(|(key, value)| 1 + key.as_str().len() + value_bytes(value))
        .sum::<usize>()
}

/// A field value's type octet and its encoding.
fn value_bytes(value: &AMQPValue) -> usize {
    1 + match value {
        AMQPValue::Boolean(_) | AMQPValue::ShortShortInt(_) | AMQPValue::ShortShortUInt(_) => 1,
        AMQPValue::ShortInt(_) | AMQPValue::ShortUInt(_) => 2,
        AMQPValue::LongInt(_) | AMQPValue::LongUInt(_) | AMQPValue::Float(_) => 4,
        AMQPValue::LongLongInt(_) | AMQPValue::Double(_) | AMQPValue::Timestamp(_) => 8,
        AMQPValue::DecimalValue(_) => 5,
        AMQPValue::ShortString(text) => 1 + text.as_str().len(),
        AMQPValue::LongString(text) => 4 + text.as_bytes().len(),
        AMQPValue::ByteArray(bytes) => 4 + bytes.len(),
        AMQPValue::FieldArray(items) => 4 + items.as_slice().iter().map(value_bytes).sum::<usize>(),
        AMQPValue::FieldTable(table) => table_bytes(table),
        AMQPValue::Void => 0,
    }
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
/// Refused, naming the header: a value not JSON, not an object, an integer outside
/// `i64` (however many digits it has: never rounded to a double), a number beyond a
/// double's range, a key over 255 bytes (an AMQP short string), nesting past
/// [`MAX_HEADER_DEPTH`].
///
/// Each value is read from its own text ([`RawValue`]), so a number keeps what the
/// producer wrote: `18446744073709551879` is an integer too large, not the double
/// `1.8446744073709552e19`, and a double is the one nearest its digits.
pub fn header_table(json: &str) -> Result<FieldTable, PublishError> {
    let value: &RawValue =
        serde_json::from_str(json).map_err(|e| invalid(format!("not valid JSON ({e})")))?;
    if !value.get().starts_with('{') {
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
/// for `null`. `value` is valid JSON already: only strings' escapes are checked here.
fn amqp_value(
    value: &RawValue,
    path: &str,
    depth: usize,
) -> Result<Option<AMQPValue>, PublishError> {
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
    let text = value.get();
    let parse_error =
        |e: serde_json::Error| invalid(format!("not valid JSON (header {}: {e})", preview(path)));
    Ok(Some(match text.as_bytes().first() {
        Some(b'n') => return Ok(None),
        Some(b't') => AMQPValue::Boolean(true),
        Some(b'f') => AMQPValue::Boolean(false),
        Some(b'"') => long_string(serde_json::from_str(text).map_err(parse_error)?),
        Some(b'{') => {
            nested("objects")?;
            let map: BTreeMap<String, &RawValue> =
                serde_json::from_str(text).map_err(parse_error)?;
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
        Some(b'[') => {
            nested("arrays")?;
            let items: Vec<&RawValue> = serde_json::from_str(text).map_err(parse_error)?;
            let mut array = FieldArray::default();
            for (index, item) in items.into_iter().enumerate() {
                let here = format!("{path}[{index}]");
                array.push(amqp_value(item, &here, depth + 1)?.unwrap_or(AMQPValue::Void));
            }
            AMQPValue::FieldArray(array)
        }
        _ => number(text, path)?,
    }))
}

/// A JSON number (`text`, its literal) at `path`: an integer literal (no fraction, no
/// exponent) is a long-long-int or refused, never a double; any other number is the
/// double nearest its digits (Rust's parser rounds correctly, where serde_json's default
/// one may be a unit in the last place off), refused beyond a double's range.
fn number(text: &str, path: &str) -> Result<AMQPValue, PublishError> {
    if text.contains(['.', 'e', 'E']) {
        return match text.parse::<f64>() {
            Ok(float) if float.is_finite() => Ok(AMQPValue::Double(float)),
            _ => Err(invalid(format!(
                "header {} is {}, beyond the range of an AMQP double; send it as a string",
                preview(path),
                preview(text)
            ))),
        };
    }
    text.parse::<i64>()
        .map(AMQPValue::LongLongInt)
        .map_err(|_| {
            let (side, bound) = match text.starts_with('-') {
                true => ("below the smallest", i64::MIN),
                false => ("above the largest", i64::MAX),
            };
            invalid(format!(
                "header {} is {}, {side} AMQP integer ({bound}, a signed 64-bit long-long-int); \
             send it as a string",
                preview(path),
                preview(text)
            ))
        })
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
            max_body_bytes: DEFAULT_MAX_MESSAGE_SIZE,
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
        assert!(check_body(DEFAULT_MAX_MESSAGE_SIZE, DEFAULT_MAX_MESSAGE_SIZE).is_ok());
        let error = check_body(DEFAULT_MAX_MESSAGE_SIZE + 1, DEFAULT_MAX_MESSAGE_SIZE).unwrap_err();
        assert!(error.is_permanent());
        assert!(
            error.to_string().contains("maximum message size"),
            "{error}"
        );
    }

    #[test]
    fn a_channel_closed_over_this_bodys_size_is_its_own_failure() {
        for text in [
            "protocol error: AMQPError { kind: Soft(PRECONDITIONFAILED), message: \"PRECONDITION_FAILED - message size 17825804 is larger than configured max size 16777216\" }",
            "PRECONDITION_FAILED - message size 17825804 is larger than max size 16777216",
        ] {
            let refused = oversized(text, 17_825_804).expect("this body's size");
            assert!(refused.is_permanent());
            let said = refused.to_string();
            assert!(
                said.contains("17825804") && said.contains("16777216"),
                "names both sizes: {said}"
            );
            assert!(
                oversized(text, 512).is_none(),
                "another publish in flight on the channel: {text}"
            );
        }
        for text in [
            "connection reset by peer",
            "PRECONDITION_FAILED - unknown delivery tag 7",
            "PRECONDITION_FAILED - message size 100 is larger than max size",
        ] {
            assert!(oversized(text, 100).is_none(), "{text}");
        }
    }

    #[test]
    fn headers_keep_their_json_types() {
        let props = properties(
            &record(Some(
                r#"{"prio":5,"neg":-3,"ok":true,"gone":null,"ratio":1.5,"s":"x",
                   "nested":{"a":1,"b":null},"list":[1,"x",null,[false]],
                   "e":1e3,"neg_zero":-0}"#,
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
        assert_eq!(headers.get("e"), Some(&AMQPValue::Double(1e3)));
        assert_eq!(
            headers.get("neg_zero"),
            Some(&AMQPValue::LongLongInt(0)),
            "-0 is an integer literal"
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

    /// serde_json reads an integer beyond 64 bits as the double nearest it: published, the
    /// consumer would read `1.8446744073709552e19` where the producer wrote
    /// `18446744073709551879`. Such an integer is refused like one just above `i64::MAX`.
    #[test]
    fn integers_beyond_64_bits_are_refused_not_rounded_to_doubles() {
        for (bad, says) in [
            (
                r#"{"a":18446744073709551879}"#,
                "header \"a\" is 18446744073709551879, above the largest AMQP integer \
                 (9223372036854775807, a signed 64-bit long-long-int); send it as a string",
            ),
            (
                r#"{"a":{"b":[100000000000000000000]}}"#,
                "header \"a\".\"b\"[0] is 100000000000000000000, above the largest",
            ),
            (
                r#"{"low":-9223372036854775809}"#,
                "header \"low\" is -9223372036854775809, below the smallest AMQP integer \
                 (-9223372036854775808, a signed 64-bit long-long-int); send it as a string",
            ),
            (
                r#"{"low":-18446744073709551879}"#,
                "header \"low\" is -18446744073709551879, below the smallest",
            ),
        ] {
            let error = properties(&record(Some(bad)), &settings(), "room_id").unwrap_err();
            assert!(error.is_permanent(), "{bad}: {error}");
            let error = error.to_string();
            assert!(error.contains(says), "{says:?} not in {error}");
        }
        let digits = format!(r#"{{"n":{}}}"#, "9".repeat(400));
        let error = properties(&record(Some(&digits)), &settings(), "room_id")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("header \"n\" is 9999") && error.ends_with("send it as a string"),
            "a long literal is cut, its reason kept: {error}"
        );
        assert!(error.len() < 300, "{error}");
        // The bounds themselves are integers; a double written as one stays a double.
        let props = properties(
            &record(Some(
                r#"{"max":9223372036854775807,"min":-9223372036854775808,
                   "as_double":1.8446744073709552e19}"#,
            )),
            &settings(),
            "room_id",
        )
        .unwrap();
        let headers = props.headers().as_ref().unwrap().inner();
        assert_eq!(headers.get("max"), Some(&AMQPValue::LongLongInt(i64::MAX)));
        assert_eq!(headers.get("min"), Some(&AMQPValue::LongLongInt(i64::MIN)));
        assert_eq!(
            headers.get("as_double"),
            Some(&AMQPValue::Double(1.8446744073709552e19))
        );
    }

    /// serde_json's default float parser is fast but not correctly rounded: about a third
    /// of random doubles, written in their shortest form, come back a unit in the last
    /// place off (`2.017351698988807e285` read as `2.0173516989888072e285`). A header's
    /// double is the one its digits name, as the producer's JSON library wrote it.
    #[test]
    fn doubles_are_read_exactly_as_written() {
        for written in [
            2.017351698988807e285,
            -4.5331899032281076e51,
            -5.181469492581746e-160,
            1.52215880359348e-273,
            0.1,
            f64::MAX,
            f64::MIN_POSITIVE,
            5e-324,
        ] {
            let json = format!(r#"{{"d":{written:e},"r":{written:?}}}"#);
            let props = properties(&record(Some(&json)), &settings(), "room_id").unwrap();
            let headers = props.headers().as_ref().unwrap().inner();
            for name in ["d", "r"] {
                match headers.get(name) {
                    Some(AMQPValue::Double(read)) => {
                        assert_eq!(read.to_bits(), written.to_bits(), "{json}: {read:e}")
                    }
                    other => panic!("{json}: {other:?}"),
                }
            }
        }
        let error = properties(&record(Some(r#"{"inf":1e400}"#)), &settings(), "room_id")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("header \"inf\" is 1e400, beyond the range of an AMQP double"),
            "{error}"
        );
    }

    /// A lone surrogate escape is no string: refused naming the header, as JSON that is
    /// not valid; so is nesting deeper than serde_json's own recursion limit, which is
    /// named as nesting.
    #[test]
    fn invalid_strings_and_very_deep_nesting_name_the_header() {
        let error = properties(&record(Some(r#"{"s":"\ud800"}"#)), &settings(), "room_id")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("not valid JSON (header \"s\": unexpected end of hex escape"),
            "{error}"
        );
        let deep = format!("{{\"d\":{}1{}}}", "[".repeat(500), "]".repeat(500));
        let error = properties(&record(Some(&deep)), &settings(), "room_id")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("nests arrays deeper than 16 levels"),
            "{error}"
        );
        let padded =
            properties(&record(Some(" \n{\"a\" : 1 }\t")), &settings(), "room_id").unwrap();
        let headers = padded.headers().as_ref().unwrap().inner();
        assert_eq!(headers.get("a"), Some(&AMQPValue::LongLongInt(1)));
    }

    /// RabbitMQ closes the whole connection on a content header frame above its
    /// `frame_max` (128 KiB by default): a row whose headers take more is dead at once
    /// instead, and the size counted is the one AMQP's encoder writes.
    #[test]
    fn properties_larger_than_a_frame_are_permanent_failures() {
        let big = format!(
            r#"{{"big":"{}","n":[1,2.5,null,true,{{"k":"v"}}]}}"#,
            "x".repeat(140_000)
        );
        let props = properties(&record(Some(&big)), &settings(), "room_id").unwrap();
        let encoded =
            cookie_factory::gen_simple(lapin::protocol::basic::gen_properties(&props), Vec::new())
                .unwrap();
        // Flags and properties, plus the frame's 8 bytes and class, weight and body size.
        assert_eq!(header_frame_bytes(&props), encoded.len() + 8 + 12);
        let error = check_header_frame(&props, 131_072).unwrap_err();
        assert!(error.is_permanent());
        let error = error.to_string();
        assert!(
            error.contains(&format!("properties take {} bytes", encoded.len() + 20))
                && error.contains("above the broker's frame_max of 131072 bytes"),
            "{error}"
        );
        assert!(
            check_header_frame(&props, 0).is_ok(),
            "no frame_max negotiated"
        );
        let small = properties(&record(Some(r#"{"a":1}"#)), &settings(), "room_id").unwrap();
        assert!(check_header_frame(&small, 4096).is_ok());
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
