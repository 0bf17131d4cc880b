//! What the in-process settings campaign holds each case to: an accepted start holds every
//! value the case wrote (or, for a key deleted, its default), both in the settings as loaded
//! and in the validated [`Config`]; a refused start names, in each message, a key the case
//! edited (the variable that set it, the file and line its text was broken at).

use super::mutations::{key, Case, Kind, Mutation};
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

/// The TOML text `raw` as a value.
fn parse_value(raw: &str) -> Option<Value> {
    let table: toml::Table = toml::from_str(&format!("v = {raw}")).ok()?;
    table.get("v").cloned()
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

/// The key paths `message` names: each that starts with a section (`relay.lease`,
/// `amqp.url[1]`, `log` of `log = 5 is invalid`), the key of `[database.columns]` after
/// `database: ` (`database: columns.key: …` names `database.columns.key`), and an
/// `[[outboxes]]` entry's key after its label (`outboxes[1] (orders): table: required`
/// names `outboxes[1].table`).
fn paths_in(message: &str) -> Vec<String> {
    let in_path = |c: char| c.is_alphanumeric() || matches!(c, '_' | '.' | '[' | ']');
    let mut paths = Vec::new();
    for section in super::key_named::SECTIONS {
        for (start, _) in message.match_indices(section) {
            let before = message[..start].chars().next_back();
            if !before.is_none_or(|c| c.is_whitespace() || "\"'`,(".contains(c)) {
                continue;
            }
            let rest = &message[start..];
            let end = rest.find(|c| !in_path(c)).unwrap_or(rest.len());
            let mut path = rest[..end].trim_end_matches('.').to_owned();
            let after = &rest[end..];
            let problem = match after.strip_prefix(" (") {
                Some(label) if section == "outboxes" => label.split_once("): ").map(|(_, p)| p),
                _ if path == "database" => after.strip_prefix(": "),
                _ => None,
            };
            if let Some(problem) = problem {
                let end = problem.find(|c| !in_path(c)).unwrap_or(problem.len());
                let inner = problem[..end].trim_end_matches('.');
                if !inner.is_empty() && problem[end..].starts_with([':', ' ']) {
                    path = format!("{path}.{inner}");
                }
            }
            paths.push(path);
        }
    }
    paths
}

/// What the refused start of `case` showed.
#[derive(Debug, Default)]
pub struct Refusal {
    /// Each message that names nothing the case edited, with why.
    pub failures: Vec<String>,
    /// Messages that name a key, but of a case whose text was edited (a line twice, text
    /// inserted): such an edit moves the keys after it, so any key may be the one named.
    pub any_key: usize,
}

/// Checks that each of `errors` (the refused start of `case`, whose settings file is
/// `file`) names what the case edited: a variable it set; the file with the line its text
/// was changed at (or after), or the byte where it stops being UTF-8; an unknown key as
/// added; or a key path that is an edited key's, or one inside it (a value deleted or
/// replaced whole).
pub fn check_refused(case: &Case, errors: &[String], file: &str) -> Refusal {
    let targets: Vec<String> = (case.mutations.iter())
        .filter(|m| m.live && !m.path.is_empty() && m.kind != Kind::Variable)
        .map(|m| key(&m.path))
        .collect();
    let mut refusal = Refusal::default();
    for error in errors {
        let variable = (case.mutations.iter())
            .filter_map(|m| m.name.as_deref().filter(|_| m.kind == Kind::Variable))
            .any(|name| error.contains(name));
        let prefix = format!("config file {file}");
        let why = if variable {
            None
        } else if let Some(rest) = error.strip_prefix(&prefix) {
            file_message(case, rest)
        } else if (case.mutations.iter()).any(|m| {
            m.live
                && match m.path.as_slice() {
                    [section] => error.contains(&format!("unknown section {section:?}")),
                    path => error.contains(&format!("unknown setting {:?}", key(path))),
                }
        }) {
            None
        } else {
            let named = paths_in(error);
            // The key, one inside it, or the `[[outboxes]]` entry holding it (a name
            // that two entries share is named by both entries).
            let inside = |named: &String, target: &String| {
                named == target
                    || named.starts_with(&format!("{target}."))
                    || named.starts_with(&format!("{target}["))
                    || named.starts_with("outboxes[")
                        && !named.contains('.')
                        && target.starts_with(&format!("{named}."))
            };
            // A key of any characters (a header's name) is named as written.
            let verbatim = |target: &String| {
                (error.match_indices(target.as_str())).any(|(start, _)| {
                    let before = error[..start].chars().next_back();
                    before.is_none_or(|c| c.is_whitespace() || "\"'`,(".contains(c))
                })
            };
            if named.iter().any(|n| targets.iter().any(|t| inside(n, t)))
                || targets.iter().any(verbatim)
            {
                None
            } else if case.text_changed_from.is_some()
                && super::key_named::names_a_key(error, file, &case.env).is_some()
            {
                refusal.any_key += 1;
                None
            } else {
                Some(format!(
                    "names {named:?}, none of the keys edited ({targets:?})"
                ))
            }
        };
        if let Some(why) = why {
            refusal.failures.push(format!("{why}: {error}"));
        }
    }
    refusal
}

/// `None` when a message about the settings file (`rest`: what follows its name) points
/// at what `case` did to the file's text or bytes, else why not.
fn file_message(case: &Case, rest: &str) -> Option<String> {
    if let Some(byte) = rest.strip_prefix(" is not UTF-8 text (byte ") {
        let byte: usize = byte.trim_end_matches(')').parse().ok()?;
        let first = (case.mutations.iter())
            .filter(|m| m.kind == Kind::NotUtf8)
            .filter_map(|m| m.at)
            .min();
        // Bytes inserted inside a character: the text stops being UTF-8 where it starts.
        return match first {
            Some(first) if byte <= first && first - byte <= 3 => None,
            _ => Some(format!(
                "no UTF-8 from byte {byte}, but bytes were inserted at {first:?}"
            )),
        };
    }
    if rest.contains("invalid TOML") {
        let line = (rest.strip_prefix(", line "))
            .and_then(|rest| rest.split(',').next())
            .and_then(|line| line.parse::<usize>().ok());
        // A value TOML cannot hold (`1e309`, `18446744073709551616`), on its line.
        let unreadable = (case.mutations.iter())
            .filter(|m| {
                m.live
                    && m.written
                        .as_deref()
                        .is_some_and(|w| parse_value(w).is_none())
            })
            .any(|m| m.line.is_some() && m.line == line);
        return match (case.text_changed_from, line) {
            _ if unreadable => None,
            (Some(first), Some(line)) if line >= first => None,
            (Some(_), None) => None,
            (first, line) => Some(format!(
                "invalid TOML at line {line:?}, but the text was changed from line {first:?}"
            )),
        };
    }
    if rest.starts_with(" is empty") && String::from_utf8_lossy(&case.file).trim().is_empty() {
        return None;
    }
    Some("a message about the file, whose text was not changed so".into())
}
