//! What the in-process settings campaign holds each case to: an accepted start holds every
//! value the case wrote (or, for a key deleted, its default), both in the settings as loaded
//! and in the validated [`Config`]; a refused start names, in each message, a key the case
//! edited (the variable that set it, the file and line its text was broken at).

use super::mutations::{key, Case, Kind, Mutation};
use super::refused::parse_value;
use crate::secrets::{masked, redact_url};
use crate::settings::shape::broker_urls;
use crate::settings::{
    Config, Field, HeaderColumnSettings, OutboxColumnsSettings, OutboxSettings, RouteSettings,
    Settings, Span,
};
use std::time::Duration;
use toml::Value;

/// How one mutation of an accepted case was judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judged {
    /// The settings as loaded hold what it wrote.
    Compared,
    /// It cannot be compared: see [`not_comparable`].
    NotCompared,
}

/// Serialised, as the settings' serde spells them.
fn value(settings: &Settings) -> Value {
    Value::try_from(settings).expect("the settings serialise")
}

/// Every key the settings take, each list holding one entry of every key and each map of
/// headers one typed header: the shape that an added key is checked against.
fn full_shape() -> Value {
    let route = RouteSettings {
        event_type: "a".into(),
        column: "c".into(),
        pattern: "p".into(),
        exchange: "x".into(),
        routing_key: Some("k".into()),
    };
    let headers = [(
        "h".to_owned(),
        HeaderColumnSettings::Typed {
            column: "c".into(),
            kind: "text".into(),
        },
    )];
    let some = || Some("c".to_owned());
    let mut settings = Settings::default();
    settings.amqp.routes = vec![route.clone()];
    settings.amqp.header_columns = headers.clone().into();
    settings.outboxes = vec![OutboxSettings {
        header_columns: Some(headers.into()),
        routes: Some(vec![route]),
        columns: OutboxColumnsSettings {
            position: some(),
            event_id: some(),
            event_type: some(),
            key: some(),
            payload: some(),
            headers: some(),
            created_at: some(),
        },
        ..OutboxSettings::default()
    }];
    value(&settings)
}

/// A key added at `path` that the settings take there (`Added`), or not (`Unknown`): a
/// field of the table's struct, or any header name in a `header_columns` map.
pub fn refine(case: &mut Case) {
    let shape = full_shape();
    for mutation in &mut case.mutations {
        if mutation.kind == Kind::Unknown && takes(&shape, &mutation.path) {
            mutation.kind = Kind::Added;
        }
    }
}

fn takes(shape: &Value, path: &[String]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut value = shape;
    let mut in_headers = false;
    for segment in parents {
        value = match value {
            // Every header as the one typed header of the shape.
            Value::Table(table) if in_headers => match table.get("h") {
                Some(value) => value,
                None => return false,
            },
            Value::Table(table) => match table.get(segment) {
                Some(value) => value,
                None => return false,
            },
            Value::Array(items) if segment.parse::<usize>().is_ok() => &items[0],
            _ => return false,
        };
        in_headers = segment == "header_columns";
    }
    match value {
        Value::Table(_) if in_headers => true,
        Value::Table(table) => table.contains_key(last),
        _ => false,
    }
}

/// The value at `path`.
fn lookup<'a>(value: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(value, |value, segment| match value {
        Value::Table(table) => table.get(segment),
        Value::Array(items) => items.get(segment.parse::<usize>().ok()?),
        _ => None,
    })
}

/// The default at `path`: the settings', an `[[outboxes]]` entry's or a route's.
fn default_at(path: &[String]) -> Option<Value> {
    let is = |segment: &String, name: &str| segment == name;
    let (root, rest) = match path {
        [o, _, r, _, rest @ ..] if is(o, "outboxes") && is(r, "routes") => {
            (Value::try_from(RouteSettings::default()).ok()?, rest)
        }
        [a, r, _, rest @ ..] if is(a, "amqp") && is(r, "routes") => {
            (Value::try_from(RouteSettings::default()).ok()?, rest)
        }
        [o, _, rest @ ..] if is(o, "outboxes") => {
            (Value::try_from(OutboxSettings::default()).ok()?, rest)
        }
        _ => (value(&Settings::default()), path),
    };
    lookup(&root, rest).cloned()
}

/// Nothing: `""`, `[]`, `{}` (what a key skipped when serialised stands for).
fn is_empty(value: &Value) -> bool {
    match value {
        Value::String(text) => text.is_empty(),
        Value::Array(items) => items.is_empty(),
        Value::Table(table) => table.is_empty(),
        _ => false,
    }
}

/// A bare number or boolean as a typed setting ([`Field`]) keeps it: its text.
fn bare_text(value: &Value) -> Option<String> {
    match value {
        Value::Integer(n) => Some(n.to_string()),
        Value::Float(n) => Some(n.to_string()),
        Value::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The last key of `path` that is no list position.
fn last_key(path: &[String]) -> &str {
    (path.iter().rev())
        .find(|segment| segment.parse::<usize>().is_err())
        .map_or("", String::as_str)
}

/// `value` as the loaded settings show it at `path`: URLs redacted, passwords masked
/// (`Config::effective` is redacted for `check-config`), `amqp.url` as one comma-separated
/// list.
fn shown(path: &[String], value: Value) -> Value {
    let Value::String(text) = value else {
        if path == ["amqp", "url"] {
            if let Value::Array(items) = &value {
                let urls: Option<Vec<&str>> = items.iter().map(Value::as_str).collect();
                if let Some(urls) = urls {
                    return shown(path, Value::String(urls.join(",")));
                }
            }
        }
        return value;
    };
    let last = last_key(path);
    Value::String(if path == ["amqp", "url"] {
        let urls: Vec<String> = broker_urls(&text).into_iter().map(redact_url).collect();
        urls.join(",")
    } else if matches!(
        last,
        "url" | "listen_url" | "database_url" | "otlp_endpoint"
    ) {
        redact_url(&text)
    } else if matches!(last, "password" | "database_password") {
        masked(&text).to_owned()
    } else {
        text
    })
}

/// Whether `loaded` holds `written` at `path`; a key not written holds its default.
fn holds(written: Option<&Value>, loaded: Option<&Value>, path: &[String]) -> bool {
    if path == ["relay", "node_id"] {
        // The node id in force: the one written, else this host's.
        let written = written.and_then(Value::as_str).map(str::trim);
        return written.is_none_or(str::is_empty)
            || written == loaded.and_then(Value::as_str).map(str::trim);
    }
    let written = written.cloned().or_else(|| default_at(path));
    let loaded = loaded.cloned().or_else(|| default_at(path));
    match (
        written.map(|w| shown(path, w)),
        loaded.map(|l| shown(path, l)),
    ) {
        (None, None) => true,
        (Some(one), None) | (None, Some(one)) => is_empty(&one),
        (Some(Value::Table(written)), Some(Value::Table(loaded))) => {
            (written.keys().chain(loaded.keys())).all(|name| {
                let path = [path, std::slice::from_ref(name)].concat();
                holds(written.get(name), loaded.get(name), &path)
            })
        }
        (Some(Value::Array(written)), Some(Value::Array(loaded))) => {
            written.len() == loaded.len()
                && (written.iter().zip(&loaded).enumerate()).all(|(index, (w, l))| {
                    holds(Some(w), Some(l), &[path, &[index.to_string()]].concat())
                })
        }
        (Some(written), Some(Value::String(loaded))) if !written.is_str() => {
            bare_text(&written).is_some_and(|text| text == loaded)
        }
        // Text where a number or boolean goes is read as the one it spells, as from a
        // variable.
        (Some(Value::String(written)), Some(loaded @ (Value::Integer(_) | Value::Boolean(_)))) => {
            variable_holds(&written, Some(&loaded), path)
        }
        (Some(written), Some(loaded)) => written == loaded,
    }
}

/// Whether two keys overlap: the same, or one inside the other.
fn overlaps(one: &[String], other: &[String]) -> bool {
    one.starts_with(other) || other.starts_with(one)
}

/// A variable's path with its `[[outboxes]]` selector (a position or a name, any case)
/// turned into the entry's position in `loaded`.
fn variable_path(mutation: &Mutation, loaded: &Value) -> Vec<String> {
    let mut path = mutation.path.clone();
    if let [outboxes, selector, ..] = path.as_mut_slice() {
        let entries = lookup(loaded, std::slice::from_ref(outboxes));
        let entries = entries
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice);
        let name = |entry: &Value| {
            let text = |key: &str| entry.get(key).and_then(Value::as_str).map(str::trim);
            (text("name").filter(|name| !name.is_empty()))
                .or_else(|| text("table"))
                .unwrap_or_default()
                .to_ascii_lowercase()
        };
        if outboxes == "outboxes" && selector.parse::<usize>().is_err() {
            if let Some(index) = entries.iter().position(|entry| name(entry) == *selector) {
                *selector = index.to_string();
            }
        }
    }
    path
}

/// Whether a variable's text `written` is what the settings hold at `path`: the text
/// itself, or the number or boolean it spells where the setting is one.
fn variable_holds(written: &str, loaded: Option<&Value>, path: &[String]) -> bool {
    let text = written.trim().to_ascii_lowercase();
    match loaded {
        Some(Value::Integer(n)) => text.parse::<i64>() == Ok(*n),
        Some(Value::Boolean(b)) => match text.as_str() {
            "true" | "yes" | "on" | "1" => *b,
            "false" | "no" | "off" | "0" => !*b,
            _ => false,
        },
        loaded => holds(Some(&Value::String(written.to_owned())), loaded, path),
    }
}

/// Checks that `config`, the accepted start of `case`, holds what the case wrote; returns
/// the failures, and how each mutation was judged.
pub fn check_accepted(case: &Case, config: &Config) -> (Vec<String>, Vec<(Kind, Judged)>) {
    let loaded = value(&config.effective);
    let mut failures = typed(config, &loaded);
    let mut judged = Vec::new();
    let variables: Vec<(&Mutation, Vec<String>)> = (case.mutations.iter())
        .filter(|m| m.kind == Kind::Variable)
        .map(|m| (m, variable_path(m, &loaded)))
        .collect();
    // Edits of the text (a line twice, inserted text) may move, extend or comment out
    // any value written before or after them: none of the case's values can be told.
    let text_edited = case.text_changed_from.is_some();
    let broken = case.mutations.iter().any(|m| m.kind == Kind::Break);
    for (index, mutation) in case.mutations.iter().enumerate().filter(|(_, m)| m.live) {
        // Set again by a variable applied later: by name, or the same name set again.
        let overridden = |path: &[String], by: Option<&str>| {
            (variables.iter()).any(|(v, p)| {
                let later = v.name.as_deref() > by
                    || v.name.as_deref() == by && !std::ptr::eq(*v, &case.mutations[index]);
                overlaps(p, path) && later
            })
        };
        let verdict = match mutation.kind {
            // Text inserted after it may comment it out, or move it where it is taken.
            Kind::Unknown if broken => None,
            Kind::Unknown => Some(format!("unknown key {} accepted", key(&mutation.path))),
            Kind::NotUtf8 => Some("a file that is no UTF-8 accepted".into()),
            // Twice and Break: only text_edited cases have them.
            Kind::Twice | Kind::Break => None,
            _ if not_comparable(mutation) || text_edited && mutation.kind != Kind::Variable => None,
            Kind::Variable => {
                let path = variable_path(mutation, &loaded);
                if overridden(&path, mutation.name.as_deref()) {
                    None
                } else {
                    let written = mutation.written.as_deref().unwrap_or_default();
                    let at = lookup(&loaded, &path);
                    Some(if variable_holds(written, at, &path) {
                        String::new()
                    } else {
                        format!(
                            "{} = {written:?} (variable {}) accepted but loaded as {}",
                            key(&path),
                            mutation.name.as_deref().unwrap_or_default(),
                            at.map_or("nothing".into(), ToString::to_string)
                        )
                    })
                }
            }
            _ if overridden(&mutation.path, None) => None,
            _ => {
                let written = mutation.written.as_deref().and_then(parse_value);
                let at = lookup(&loaded, &mutation.path);
                Some(if holds(written.as_ref(), at, &mutation.path) {
                    String::new()
                } else {
                    format!(
                        "{} accepted but loaded as {}, not as written ({})",
                        key(&mutation.path),
                        at.map_or("nothing".into(), ToString::to_string),
                        mutation
                            .written
                            .as_deref()
                            .unwrap_or("deleted: its default")
                    )
                })
            }
        };
        match verdict {
            None => judged.push((mutation.kind, Judged::NotCompared)),
            Some(failure) => {
                judged.push((mutation.kind, Judged::Compared));
                if !failure.is_empty() {
                    failures.push(failure);
                }
            }
        }
    }
    (failures, judged)
}

/// Mutations whose value cannot be compared with the loaded settings: a list's entry
/// deleted (the entries after it move up, and the list is shorter than written), the
/// lists of tables a variable spells as text (`amqp.routes`, an entry's `routes`), and a
/// list of broker URLs a variable spells as text (`[…]`), which figment parses.
fn not_comparable(mutation: &Mutation) -> bool {
    let last = mutation.path.last().map(String::as_str).unwrap_or_default();
    match mutation.kind {
        Kind::Delete => last.parse::<usize>().is_ok(),
        Kind::Variable => {
            let text = mutation.written.as_deref().unwrap_or_default();
            last == "routes" || last == "url" && text.trim_start().starts_with('[')
        }
        _ => false,
    }
}

/// The sizes and durations as the validated [`Config`] holds them, against the settings as
/// loaded: the value written, or, for zero (and a blank duration), the default with a
/// warning naming the key (the documented rule); never clamped or replaced otherwise.
fn typed(config: &Config, loaded: &Value) -> Vec<String> {
    let defaults = value(&Settings::default());
    let at = |value: &Value, name: &str| {
        let path: Vec<String> = name.split('.').map(str::to_owned).collect();
        lookup(value, &path).cloned()
    };
    let span = |value: Option<Value>| {
        let text = value.as_ref().and_then(Value::as_str).unwrap_or_default();
        match Field::<Span>::new(text).parsed() {
            Ok(Span(duration)) => Some(*duration),
            Err(_) => text.trim().is_empty().then_some(Duration::ZERO),
        }
    };
    let warned = |name: &str| {
        (config.warnings.iter()).any(|warning| {
            warning.starts_with(&format!("{name} is ")) && warning.contains("; using the default")
        })
    };
    let mut failures = Vec::new();
    let mut check = |name: &str, held: String, expected: String, warns: bool| {
        if held != expected || warned(name) != warns {
            failures.push(format!(
                "{name}: the Config holds {held} (a warning: {}), the settings ask for {expected} \
                 (a warning: {warns})",
                warned(name)
            ));
        }
    };
    let relay = &config.relay;
    let database = &config.database;
    let durations = [
        ("relay.poll_interval", relay.poll_interval),
        ("relay.publish_timeout", relay.publish_timeout),
        ("relay.lease", relay.lease),
        ("relay.shutdown_timeout", relay.shutdown_timeout),
        ("relay.retry_max_interval", relay.retry.max_interval),
        ("relay.stall_after", relay.stall_after),
        (
            "database.max_connection_lifetime",
            database.max_connection_lifetime,
        ),
        ("database.idle_timeout", database.idle_timeout),
    ];
    for (name, held) in durations {
        let written = span(at(loaded, name)).unwrap_or_default();
        let default = span(at(&defaults, name)).unwrap_or_default();
        let zero = written.is_zero();
        let expected = if zero { default } else { written };
        check(name, format!("{held:?}"), format!("{expected:?}"), zero);
    }
    let optional = [
        ("relay.retention", relay.retention),
        (
            "relay.max_pending_age",
            config.max_pending_age.map(|age| age.age),
        ),
        ("relay.startup_timeout", config.startup_timeout),
    ];
    for (name, held) in optional {
        let text = at(loaded, name);
        let blank = text
            .as_ref()
            .and_then(Value::as_str)
            .is_none_or(|t| t.trim().is_empty());
        let written = span(text).unwrap_or_default();
        let expected = (!written.is_zero()).then_some(written);
        check(
            name,
            format!("{held:?}"),
            format!("{expected:?}"),
            !blank && written.is_zero(),
        );
    }
    let retry = span(at(loaded, "relay.retry_interval")).unwrap_or_default();
    let expected = if retry.is_zero() {
        relay.poll_interval
    } else {
        retry
    };
    check(
        "relay.retry_interval",
        format!("{:?}", relay.retry.interval),
        format!("{expected:?}"),
        false,
    );
    let probe = at(loaded, "database.probe").and_then(|p| p.as_bool()) == Some(true);
    let interval = span(at(loaded, "database.probe_interval")).unwrap_or_default();
    let default = span(at(&defaults, "database.probe_interval")).unwrap_or_default();
    let expected = probe.then_some(if interval.is_zero() {
        default
    } else {
        interval
    });
    check(
        "database.probe_interval",
        format!("{:?}", database.probe_interval),
        format!("{expected:?}"),
        interval.is_zero(),
    );
    let sizes = [
        ("relay.batch_size", relay.batch_size as i64),
        ("relay.max_inflight_bytes", relay.max_inflight_bytes as i64),
        (
            "database.max_connections",
            i64::from(database.max_connections),
        ),
        (
            "amqp.max_message_size",
            config.amqp.message.max_body_bytes as i64,
        ),
    ];
    for (name, held) in sizes {
        let written = at(loaded, name)
            .and_then(|n| n.as_integer())
            .unwrap_or_default();
        let default = at(&defaults, name)
            .and_then(|n| n.as_integer())
            .unwrap_or_default();
        let expected = if written <= 0 { default } else { written };
        check(name, held.to_string(), expected.to_string(), written <= 0);
    }
    let attempts = at(loaded, "relay.max_attempts").and_then(|n| n.as_integer());
    check(
        "relay.max_attempts",
        relay.retry.max_attempts.to_string(),
        attempts.unwrap_or_default().to_string(),
        false,
    );
    failures
}
