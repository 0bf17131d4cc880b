//! The hostile rows themselves: proptest strategies for headers of any JSON shape
//! (numbers kept as their literal text), envelopes of any bytes and length, and event
//! types, rooms and event ids at and past their limits.

use proptest::prelude::*;
use proptest::sample::select;
use proptest::strategy::BoxedStrategy;

/// A JSON value as the producer writes it: numbers keep their literal text.
#[derive(Debug, Clone)]
pub(super) enum Json {
    Null,
    Bool(bool),
    Text(String),
    /// An integer literal: no fraction, no exponent.
    Int(String),
    /// Any other number literal.
    Float(String),
    List(Vec<Json>),
    /// Keys distinct (what a duplicate key means is not part of the contract).
    Object(Vec<(String, Json)>),
}

impl Json {
    pub(super) fn render(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(flag) => out.push_str(if *flag { "true" } else { "false" }),
            Json::Text(text) => out.push_str(&serde_json::to_string(text).unwrap()),
            Json::Int(literal) | Json::Float(literal) => out.push_str(literal),
            Json::List(items) => {
                out.push('[');
                for (index, item) in items.iter().enumerate() {
                    if index > 0 {
                        out.push(',');
                    }
                    item.render(out);
                }
                out.push(']');
            }
            Json::Object(entries) => {
                out.push('{');
                for (index, (key, value)) in entries.iter().enumerate() {
                    if index > 0 {
                        out.push_str(", ");
                    }
                    out.push_str(&serde_json::to_string(key).unwrap());
                    out.push(':');
                    value.render(out);
                }
                out.push('}');
            }
        }
    }
}

/// The `headers` column of a row.
#[derive(Debug, Clone)]
pub(super) enum Headers {
    Null,
    Json(Json),
    /// Text written as is, and what must become of it: `None` published with no row
    /// headers, `Some(reason)` dead naming it.
    Raw(&'static str, Option<&'static str>),
}

/// One generated row, before its event id (which carries its number) is made.
#[derive(Debug, Clone)]
pub(super) struct Drawn {
    pub(super) id_filler: &'static str,
    pub(super) id_chars: usize,
    pub(super) id_in_emoji: bool,
    pub(super) event_type: String,
    pub(super) room: String,
    pub(super) envelope: Vec<u8>,
    pub(super) headers: Headers,
}

const PIECES: &[&str] = &[
    "a",
    "room",
    "r1",
    ".",
    "..",
    "#",
    "*",
    " ",
    "\t",
    "\n",
    "\r\n",
    "\"",
    "\\",
    "'",
    "%",
    "{",
    "}",
    "[",
    "]",
    ":",
    ",",
    "\u{1}",
    "\u{1b}[31m",
    "\u{7f}",
    "\u{85}",
    "é",
    "e\u{301}",
    "\u{301}",
    "€",
    "😀",
    "👩\u{200d}👩\u{200d}👧",
    "\u{200b}",
    "\u{200e}",
    "\u{200f}",
    "\u{202e}",
    "\u{2028}",
    "\u{feff}",
    "\u{fffd}",
    "\u{fffe}",
    "\u{ffff}",
    "\u{10ffff}",
    "𝕏",
    "中文",
    "עברית",
    "العربية",
    "ﷺ",
    "Ω",
    "ß",
    "İ",
    "ǅ",
    "{event_type}",
    "{key}",
    "${x}",
    "%s",
    "null",
    "true",
    "-0",
    "1e400",
    "\u{e000}",
];
/// Characters of 1 to 4 bytes (and two-character graphemes) that fill strings to a limit.
const FILLERS: &[&str] = &["a", "é", "€", "😀", "e\u{301}", " ", "."];
const EDGE_INTS: &[&str] = &[
    "0",
    "-0",
    "1",
    "-1",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "18446744073709551879",
    "-18446744073709551879",
    "100000000000000000000",
];
const EDGE_FLOATS: &[&str] = &[
    "1.5",
    "1e3",
    "1E+3",
    "-0.0",
    "0.0",
    "1e400",
    "-1e400",
    "1e-400",
    "1.7976931348623157e308",
    "1.8446744073709552e19",
    "5e-324",
    "2.017351698988807e285",
    "0.1",
    "-1.0e-0",
];
const KEYS: &[&str] = &[
    "tenant",
    "a",
    "b",
    "traceparent",
    "tracestate",
    "room_id",
    "outbox_id",
    "retry_count",
    "node_id",
    "",
    " ",
    "x-death",
    "$weird",
    "#",
];
const RAW_HEADERS: &[(&str, Option<&str>)] = &[
    ("", None),
    ("  \n\t", None),
    ("null", Some("not a JSON object")),
    ("[1,2]", Some("not a JSON object")),
    ("\"text\"", Some("not a JSON object")),
    ("42", Some("not a JSON object")),
    ("{", Some("not valid JSON")),
    ("{\"a\":1,}", Some("not valid JSON")),
    ("{\"a\":1} x", Some("not valid JSON")),
    ("{\"a\":NaN}", Some("not valid JSON")),
    ("{'a':1}", Some("not valid JSON")),
    ("{\"s\":\"\\ud800\"}", Some("not valid JSON")),
    ("{\"s\":[\"\\udc00x\"]}", Some("not valid JSON")),
    ("{\"c\":\"\u{1}\"}", Some("not valid JSON")),
];

/// Concatenated pieces; one string in ten carries a NUL.
fn hostile_text() -> BoxedStrategy<String> {
    let pieces = prop::collection::vec(select(PIECES), 0..10).prop_map(|p| p.concat());
    prop_oneof![
        9 => pieces.clone(),
        1 => (pieces, 0..4usize).prop_map(|(text, at)| {
            let at = text.char_indices().nth(at).map_or(text.len(), |(at, _)| at);
            format!("{}\0{}", &text[..at], &text[at..])
        }),
    ]
    .boxed()
}

/// A filler repeated to a count at or around a limit in characters (64, 255) or in bytes
/// (255 for 1-, 2-, 3- and 4-byte characters), or well past it.
fn limit_text() -> BoxedStrategy<String> {
    let count = prop_oneof![
        0..4usize,
        62..67usize,
        84..87usize,
        126..130usize,
        253..258usize,
        510..513usize
    ];
    (select(FILLERS), count)
        .prop_map(|(filler, count)| filler.repeat(count))
        .boxed()
}

fn int_literal() -> BoxedStrategy<String> {
    prop_oneof![
        3 => any::<i64>().prop_map(|n| n.to_string()),
        1 => any::<u64>().prop_map(|n| n.to_string()),
        1 => any::<i128>().prop_map(|n| n.to_string()),
        3 => select(EDGE_INTS).prop_map(String::from),
        1 => (19..400usize).prop_map(|digits| "9".repeat(digits)),
    ]
    .boxed()
}

/// Doubles of any magnitude in their shortest forms (`{:e}` and `{:?}` always write a
/// fraction or an exponent), and edge literals.
fn float_literal() -> BoxedStrategy<String> {
    prop_oneof![
        3 => (any::<u64>(), any::<bool>()).prop_map(|(bits, debug)| {
            let float = Some(f64::from_bits(bits)).filter(|f| f.is_finite()).unwrap_or(0.5);
            if debug { format!("{float:?}") } else { format!("{float:e}") }
        }),
        2 => select(EDGE_FLOATS).prop_map(String::from),
    ]
    .boxed()
}

fn key() -> BoxedStrategy<String> {
    prop_oneof![
        4 => select(KEYS).prop_map(String::from),
        2 => hostile_text(),
        1 => limit_text(),
    ]
    .boxed()
}

fn object_of(values: BoxedStrategy<Json>) -> BoxedStrategy<Json> {
    prop::collection::vec((key(), values), 0..6)
        .prop_map(|pairs| {
            let mut seen = std::collections::HashSet::new();
            Json::Object(
                pairs
                    .into_iter()
                    .filter(|(key, _)| seen.insert(key.clone()))
                    .collect(),
            )
        })
        .boxed()
}

fn json_value() -> BoxedStrategy<Json> {
    let leaf = prop_oneof![
        1 => Just(Json::Null),
        1 => any::<bool>().prop_map(Json::Bool),
        4 => prop_oneof![3 => hostile_text(), 1 => limit_text()].prop_map(Json::Text),
        3 => int_literal().prop_map(Json::Int),
        2 => float_literal().prop_map(Json::Float),
    ];
    leaf.prop_recursive(5, 40, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Json::List),
            object_of(inner),
        ]
    })
    .boxed()
}

/// An object holding a chain of arrays and objects around and past the depth limit (and
/// past serde_json's own recursion limit of 128).
fn deep_headers() -> BoxedStrategy<Json> {
    let depth = prop_oneof![4 => 13..19usize, 1 => Just(200usize)];
    (depth, any::<u64>())
        .prop_map(|(depth, shape)| {
            let mut value = Json::Int("1".into());
            for level in 0..depth {
                value = match (shape >> (level % 64)) & 1 {
                    0 => Json::List(vec![value]),
                    _ => Json::Object(vec![("k".into(), value)]),
                };
            }
            Json::Object(vec![("deep".into(), value)])
        })
        .boxed()
}

/// A header string around RabbitMQ's default `frame_max` (128 KiB, which the message's
/// header frame cannot span) and MariaDB's TEXT (64 KiB).
fn big_headers() -> BoxedStrategy<Json> {
    let size = prop_oneof![60_000..70_000usize, 125_000..140_000usize];
    (size, select(FILLERS))
        .prop_map(|(size, filler)| {
            let text = filler.repeat(size / filler.len());
            Json::Object(vec![("big".into(), Json::Text(text))])
        })
        .boxed()
}

fn headers() -> BoxedStrategy<Headers> {
    prop_oneof![
        3 => Just(Headers::Null),
        7 => object_of(json_value()).prop_map(Headers::Json),
        1 => select(RAW_HEADERS).prop_map(|(text, expect)| Headers::Raw(text, expect)),
        1 => deep_headers().prop_map(Headers::Json),
        1 => prop::bool::weighted(0.1).prop_flat_map(|big| match big {
            true => big_headers().prop_map(Headers::Json).boxed(),
            false => object_of(json_value()).prop_map(Headers::Json).boxed(),
        }),
    ]
    .boxed()
}

fn envelope() -> BoxedStrategy<Vec<u8>> {
    let json = object_of(json_value()).prop_map(|json| {
        let mut text = String::new();
        json.render(&mut text);
        text.into_bytes()
    });
    prop_oneof![
        4 => hostile_text().prop_map(String::into_bytes),
        3 => json,
        1 => Just(Vec::new()),
        1 => prop::collection::vec(any::<u8>(), 0..64),
        1 => (select(FILLERS), 1_000..200_000usize)
            .prop_map(|(filler, size)| filler.repeat(size / filler.len()).into_bytes()),
    ]
    .boxed()
}

fn keyed(text: BoxedStrategy<String>) -> BoxedStrategy<String> {
    (any::<bool>(), text)
        .prop_map(|(keyed, text)| if keyed { format!("keyed.{text}") } else { text })
        .boxed()
}

pub(super) fn drawn() -> BoxedStrategy<Drawn> {
    let event_type = prop_oneof![
        5 => select(&["room.message.posted", "room.created", "keyed.room.renamed", "keyed", "", "a..b"][..])
            .prop_map(String::from),
        3 => keyed(hostile_text()),
        2 => keyed(limit_text()),
    ];
    let room = prop_oneof![
        5 => (0..20u8).prop_map(|n| format!("r{n}")),
        2 => hostile_text(),
        2 => limit_text(),
    ];
    let id = (
        select(&["a", "é", "😀", " "][..]),
        prop_oneof![2 => 0..12usize, 1 => 60..68usize],
        prop::bool::weighted(0.05),
    );
    (id, event_type, room, envelope(), headers())
        .prop_map(
            |((id_filler, id_chars, id_in_emoji), event_type, room, envelope, headers)| Drawn {
                id_filler,
                id_chars,
                id_in_emoji,
                event_type,
                room,
                envelope,
                headers,
            },
        )
        .boxed()
}
