//! W3C trace context in a row's `headers`.
//!
//! A producer that traces its requests writes `traceparent` (and optionally `tracestate`)
//! into the row's `headers` JSON. The AMQP adapter copies every entry of that JSON into
//! the message headers untouched, these two included, so the consumer continues the trace.
//! The relay itself only *links* to it: its outcome log lines carry the `traceparent`
//! field, which lets log tools join them to the producer's trace. It exports no spans.

use serde::Deserialize;

/// The header that carries the W3C trace id and parent span id.
pub const TRACEPARENT: &str = "traceparent";

/// The `traceparent` entry of a row's `headers` JSON, as written; `None` when the headers
/// are absent, not a JSON object, or have no such string entry.
///
/// Cheap by design, since it runs for every logged outcome: rows without the word are not
/// parsed at all (no allocation), and for the others only this entry is built, the rest
/// being skipped by the parser.
pub fn traceparent(headers: Option<&str>) -> Option<String> {
    let headers = headers?;
    // The struct below would also accept a JSON array (serde reads structs from sequences).
    if !headers.contains(TRACEPARENT) || !headers.trim_start().starts_with('{') {
        return None;
    }
    #[derive(Deserialize)]
    struct Trace {
        #[serde(default)]
        traceparent: Option<String>,
    }
    serde_json::from_str::<Trace>(headers).ok()?.traceparent
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_is_read_as_written() {
        let headers =
            format!(r#" {{"tenant":"t1","traceparent":"{PARENT}","tracestate":"k=v","n":[1]}}"#);
        assert_eq!(traceparent(Some(&headers)).as_deref(), Some(PARENT));
    }

    #[test]
    fn rows_without_trace_context_have_none() {
        assert_eq!(traceparent(None), None);
        assert_eq!(traceparent(Some(r#"{"tenant":"t1"}"#)), None);
        // Bad headers make the event dead elsewhere; here they simply carry no context.
        assert_eq!(traceparent(Some("traceparent")), None);
        assert_eq!(traceparent(Some(r#"{"traceparent":42}"#)), None);
        assert_eq!(traceparent(Some(r#"["traceparent"]"#)), None);
    }

    #[test]
    fn escaped_values_are_unescaped() {
        let found = traceparent(Some(r#"{"traceparent":"00-\u0061b-01"}"#));
        assert_eq!(found.as_deref(), Some("00-ab-01"));
    }
}
