//! What each edit of a settings campaign's case touched: its kind, the key, the value
//! written, and whether it is still in the file once every edit is made. Part of
//! `mutations.rs`, and shared with it by the in-process campaign and the binary's.

// The binary's campaign (`tests/e2e/settings.rs`) reads only part of what is recorded here.
#![allow(dead_code)]

/// A kind of edit, as the campaign counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A key or section deleted.
    Delete,
    /// A key added to a table that does not take it.
    Unknown,
    /// A key added where the settings take it (a field the base left out, a header).
    Added,
    /// A value replaced by another type, out of range, malformed.
    Replace,
    /// A line written twice.
    Twice,
    /// An `[[outboxes]]` entry appended.
    Outbox,
    /// Text inserted that breaks TOML where it lands.
    Break,
    /// Bytes inserted that are no UTF-8.
    NotUtf8,
    /// An `OUTBOX_RELAY__…` variable.
    Variable,
}

impl Kind {
    /// Every kind, in the order the campaign reports them.
    pub const ALL: [Kind; 9] = [
        Kind::Delete,
        Kind::Unknown,
        Kind::Added,
        Kind::Replace,
        Kind::Twice,
        Kind::Outbox,
        Kind::Break,
        Kind::NotUtf8,
        Kind::Variable,
    ];

    /// As the campaign's table names it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Delete => "delete a key",
            Kind::Unknown => "unknown key",
            Kind::Added => "add a known key",
            Kind::Replace => "replace a value",
            Kind::Twice => "a line twice",
            Kind::Outbox => "append an outbox",
            Kind::Break => "broken TOML",
            Kind::NotUtf8 => "bytes not UTF-8",
            Kind::Variable => "OUTBOX_RELAY__ variable",
        }
    }
}

/// One edit of a case, as the key it touched and what it wrote.
#[derive(Debug, Clone)]
pub struct Mutation {
    /// Its kind; the file's edits say `Unknown` for every key added, the in-process
    /// campaign tells `Added` apart by the settings' shape.
    pub kind: Kind,
    /// The key it touched, as segments (a list's position as digits): `relay`, `lease`;
    /// for a variable, its name after the prefix, lowercased and split at `__`. Empty for
    /// edits of the text that touch no one key.
    pub path: Vec<String>,
    /// The value written: TOML text for the file, the text of a variable.
    pub written: Option<String>,
    /// Still in the file once every edit is made (a later edit may delete or replace it).
    pub live: bool,
    /// A variable's name; the line written twice.
    pub name: Option<String>,
    /// Where bytes that are no UTF-8 landed in the file.
    pub at: Option<usize>,
    /// The line (from 1) a value written lands on, before the edits of the text.
    pub line: Option<usize>,
}

impl Mutation {
    pub(super) fn new(kind: Kind, path: Vec<String>, written: Option<String>) -> Self {
        Self {
            kind,
            path,
            written,
            live: true,
            name: None,
            at: None,
            line: None,
        }
    }
}

/// `path` as messages name keys: `relay.lease`, `outboxes[1].table`, `amqp.routes[0].exchange`.
pub fn key(path: &[String]) -> String {
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

/// `path` as segments, a position as digits.
pub(super) fn segments(path: &[super::Step]) -> Vec<String> {
    path.iter()
        .map(|step| match step {
            super::Step::Key(key) => key.clone(),
            super::Step::At(index) => index.to_string(),
        })
        .collect()
}

/// Where in `value` each placeholder `@@rawN@@` is now, by N.
pub(super) fn placeholders(
    value: &toml::Value,
    path: &mut Vec<String>,
    out: &mut Vec<(usize, Vec<String>)>,
) {
    match value {
        toml::Value::String(text) => {
            let number = text
                .strip_prefix("@@raw")
                .and_then(|rest| rest.strip_suffix("@@"));
            if let Some(number) = number.and_then(|number| number.parse().ok()) {
                out.push((number, path.clone()));
            }
        }
        toml::Value::Table(table) => {
            for (key, value) in table {
                path.push(key.clone());
                placeholders(value, path, out);
                path.pop();
            }
        }
        toml::Value::Array(items) => {
            for (index, value) in items.iter().enumerate() {
                path.push(index.to_string());
                placeholders(value, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

/// After `deleted` is removed: an earlier deletion inside it is gone, and one at a later
/// position of the same list has moved up by one.
pub(super) fn after_delete(mutations: &mut [Mutation], deleted: &[String]) {
    let Some((last, list)) = deleted.split_last() else {
        return;
    };
    let position = last.parse::<usize>().ok();
    for earlier in mutations.iter_mut().filter(|m| m.kind == Kind::Delete) {
        if earlier.path.len() > deleted.len() && earlier.path.starts_with(deleted) {
            earlier.live = false;
        } else if let (Some(position), true) = (position, earlier.path.len() > list.len()) {
            let moved = earlier.path.starts_with(list);
            let at = &mut earlier.path[list.len()];
            match at.parse::<usize>() {
                Ok(index) if moved && index > position => *at = (index - 1).to_string(),
                _ => {}
            }
        }
    }
}
