//! What a refused start's messages must name — a key — and the settings campaign's counts
//! by the key named. Shared, as `mutations.rs` beside it, by the in-process campaign and
//! the binary's (`tests/e2e/settings.rs`, which includes this file).

/// The settings' sections, as keys in messages start.
pub(crate) const SECTIONS: [&str; 8] = [
    "database",
    "amqp",
    "relay",
    "log",
    "metrics",
    "telemetry",
    "admin",
    "outboxes",
];

/// The variables besides `OUTBOX_RELAY__…` that the settings read.
const OTHER_VARIABLES: [&str; 2] = ["RUST_LOG", "PGSSLMODE"];

/// The key a rejection's message names, if it names one; what "names a key" means:
///
/// - the settings file's path as given (`file`): a problem of the file as a whole (its
///   TOML, its bytes);
/// - an environment variable's name: one of `env` (the case's `OUTBOX_RELAY__…`), or
///   `RUST_LOG` or `PGSSLMODE`;
/// - a key path: a section's name (`database`, `amqp`, `relay`, `log`, `metrics`,
///   `telemetry`, `admin`, `outboxes`) at the start of the message or after a blank, a quote, a
///   comma or an opening parenthesis (not inside a word or a path: `outbox-relay.db`,
///   `/etc/relay.toml`), followed by `.` or `[` and then a letter, digit or `_`
///   (`relay.lease`, `amqp.url[1]`, `outboxes[0] (x)`, `amqp.routes[0].exchange`); or
///   `database: columns.` (how `[database.columns]` problems are named); or a section's
///   name starting the message and followed by ` = ` (the section itself given a value:
///   `log = 5 is invalid: a table of settings`);
/// - an unknown key or section, quoted as written: `unknown setting "…"` or
///   `unknown section "…"`.
pub fn names_a_key(message: &str, file: &str, env: &[(String, String)]) -> Option<String> {
    if !file.is_empty() && message.contains(file) {
        return Some("the settings file".into());
    }
    let variables = env
        .iter()
        .map(|(name, _)| name.as_str())
        .chain(OTHER_VARIABLES);
    for variable in variables {
        if message.contains(variable) {
            return Some(variable.to_owned());
        }
    }
    for quoted in ["unknown setting \"", "unknown section \""] {
        if message.contains(quoted) {
            return Some(quoted.trim_end_matches('"').to_owned());
        }
    }
    if message.contains("database: columns.") {
        return Some("database.columns".into());
    }
    if let Some(section) = SECTIONS
        .iter()
        .find(|section| message.starts_with(&format!("{section} = ")))
    {
        return Some((*section).to_owned());
    }
    let word = |c: char| c.is_alphanumeric() || c == '_';
    for section in SECTIONS {
        for (start, _) in message.match_indices(section) {
            let before = message[..start].chars().next_back();
            let starts = before.is_none_or(|c| c.is_whitespace() || "\"'`,(".contains(c));
            let mut after = message[start + section.len()..].chars();
            let (separator, next) = (after.next(), after.next());
            if starts && matches!(separator, Some('.' | '[')) && next.is_some_and(word) {
                let end = message[start..]
                    .find(|c: char| !(word(c) || matches!(c, '.' | '[' | ']')))
                    .map_or(message.len(), |end| start + end);
                return Some(message[start..end].to_owned());
            }
        }
    }
    None
}

/// What [`names_a_key`] found, by kind, for the campaign's counts: the section of a key
/// path, `OUTBOX_RELAY__… variable`, the file, an unknown key.
pub fn family(key: &str) -> String {
    if key.to_ascii_uppercase().starts_with("OUTBOX_RELAY__") {
        return "OUTBOX_RELAY__… variable".into();
    }
    match SECTIONS.iter().find(|section| key.starts_with(*section)) {
        Some(section) => format!("{section}.…"),
        None => key.trim().to_owned(),
    }
}

/// `counts` (by key) as `family n (key n, key n, …), …`, most first.
pub fn summary(counts: &std::collections::BTreeMap<String, usize>) -> String {
    let mut families: std::collections::BTreeMap<String, Vec<(usize, &str)>> = Default::default();
    for (key, n) in counts {
        families.entry(family(key)).or_default().push((*n, key));
    }
    let mut families: Vec<_> = families
        .into_iter()
        .map(|(family, mut keys)| {
            keys.sort_by(|a, b| b.cmp(a));
            (keys.iter().map(|(n, _)| n).sum::<usize>(), family, keys)
        })
        .collect();
    families.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let shown: Vec<String> = families
        .iter()
        .map(|(total, family, keys)| {
            let top: Vec<String> = keys
                .iter()
                .take(3)
                .map(|(n, key)| format!("{key} {n}"))
                .collect();
            let more = if keys.len() > 3 { ", …" } else { "" };
            match keys.as_slice() {
                [(_, key)] if family == key.trim() => format!("{family} {total}"),
                _ => format!("{family} {total} ({}{more})", top.join(", ")),
            }
        })
        .collect();
    shown.join("; ")
}

#[test]
fn a_message_names_a_key_by_path_variable_or_file() {
    let env = [("OUTBOX_RELAY__RELAY__LEASE".to_owned(), "x".to_owned())];
    let names = |message: &str| names_a_key(message, "/tmp/s.toml", &env);
    assert_eq!(
        names("relay.lease = \"x\" is invalid: a duration").as_deref(),
        Some("relay.lease")
    );
    assert_eq!(
        names("amqp.url[1] = \"amqp://\" is invalid").as_deref(),
        Some("amqp.url[1]")
    );
    assert_eq!(
        names("outboxes[0] (rooms): table: required").as_deref(),
        Some("outboxes[0]")
    );
    assert_eq!(
        names("config file /tmp/s.toml, line 1, column 2: invalid TOML").as_deref(),
        Some("the settings file")
    );
    assert_eq!(
        names("x (from environment variable OUTBOX_RELAY__RELAY__LEASE)").as_deref(),
        Some("OUTBOX_RELAY__RELAY__LEASE")
    );
    assert_eq!(
        names("log = 5 is invalid: a table of settings").as_deref(),
        Some("log")
    );
    assert_eq!(names("a value of another kind"), None);
    assert_eq!(
        names("the relay.  is invalid"),
        None,
        "no key after the dot"
    );
    assert_eq!(names("outbox-relay.db is missing"), None, "inside a word");
    assert_eq!(names("read /etc/relay.toml"), None, "inside a path");
}
