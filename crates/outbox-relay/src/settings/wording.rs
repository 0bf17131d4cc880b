//! Our words for a value that does not fit the settings' shape: the key, the value as
//! written (secrets masked) and what is accepted, instead of serde's (`expected i64`,
//! `found signed int`, `"foo" is not a key of []`).

use super::shape::Settings;
use super::ConfigError;
use crate::secrets::{redact_url, MASK};
use figment::error::{Actual, Kind};
use figment::providers::Serialized;
use figment::Figment;

/// `error` (the first problem of reading the settings) in our words.
pub(super) fn shape_error(error: &figment::Error) -> ConfigError {
    let path = &error.path;
    let name = key(path);
    match &error.kind {
        Kind::UnknownField(field, accepted) => {
            let parent = key(&path[..path.len().saturating_sub(1)]);
            let accepted = accepted.join(", ");
            ConfigError::Load(if parent.is_empty() {
                format!("unknown section {field:?}: the sections are {accepted}")
            } else {
                format!("unknown setting {name:?}: the settings of {parent} are {accepted}")
            })
        }
        Kind::InvalidType(actual, expected) | Kind::InvalidValue(actual, expected) => {
            ConfigError::Mistyped {
                written: written(actual, path),
                accepted: accepted(expected, path),
                key: name,
            }
        }
        Kind::MissingField(field) => {
            ConfigError::Load(format!("{name} has no {field:?}, which is required"))
        }
        Kind::Message(message) => ConfigError::Load(format!("{name} is invalid: {message}")),
        _ => ConfigError::Load(format!(
            "{name} is invalid: it does not fit the settings' shape ({})",
            kind_name(&error.kind)
        )),
    }
}

/// `relay.lease`, `outboxes[1].database_url`, `amqp.routes[0].exchange`.
pub(super) fn key(path: &[String]) -> String {
    let mut key = String::new();
    for segment in path {
        if segment.parse::<usize>().is_ok() {
            key.push_str(&format!("[{segment}]"));
        } else {
            if !key.is_empty() {
                key.push('.');
            }
            key.push_str(segment);
        }
    }
    key
}

/// Whether the setting at `path` holds a secret, or a URL that may hold one.
fn secret(path: &[String]) -> bool {
    let last = path
        .iter()
        .rev()
        .find(|segment| segment.parse::<usize>().is_err())
        .map(String::as_str)
        .unwrap_or_default();
    last.contains("password") || last.ends_with("url") || last == "otlp_endpoint"
}

/// The value as the file would spell it; a secret masked.
fn written(actual: &Actual, path: &[String]) -> String {
    let secret = secret(path);
    match actual {
        Actual::Str(text) if secret && path.last().is_some_and(|key| key.ends_with("url")) => {
            format!("{:?}", redact_url(text))
        }
        Actual::Map => "a table".into(),
        Actual::Seq => "a list".into(),
        _ if secret => MASK.into(),
        Actual::Str(text) => format!("{text:?}"),
        Actual::Bool(value) => value.to_string(),
        Actual::Unsigned(value) => value.to_string(),
        Actual::Signed(value) => value.to_string(),
        Actual::Float(value) => value.to_string(),
        Actual::Char(value) => format!("{value:?}"),
        _ => "a value of another kind".into(),
    }
}

/// What the setting accepts, with an example: its default where it has one.
fn accepted(expected: &str, path: &[String]) -> String {
    let example = Figment::from(Serialized::defaults(Settings::default()))
        .find_value(&path.join("."))
        .ok()
        .and_then(|value| value.to_i128());
    let expected = expected.trim_start_matches("a ").trim_start_matches("an ");
    match expected {
        "i64" | "i32" | "u64" | "u32" | "usize" | "integer" => format!(
            "a whole number such as {}",
            example.map_or("10".into(), |n| n.to_string())
        ),
        "boolean" | "bool" => "true or false".into(),
        "string" => {
            if secret(path) {
                "text in quotes, such as \"…\" (a bare number or word is not text in TOML)".into()
            } else {
                "text in quotes".into()
            }
        }
        "sequence" => "a list, such as [\"…\", \"…\"]".into(),
        other if other.starts_with("struct") || other == "map" => "a table of settings".into(),
        other => other.to_owned(),
    }
}

/// A problem that serde reports rarely, named without its value.
fn kind_name(kind: &Kind) -> &'static str {
    match kind {
        Kind::InvalidLength(..) => "a list of another length",
        Kind::UnknownVariant(..) => "an unknown choice",
        Kind::DuplicateField(..) => "a key given twice",
        Kind::ISizeOutOfRange(..) | Kind::USizeOutOfRange(..) => "a number out of range",
        _ => "a value of another kind",
    }
}
