//! What a refused start of a settings campaign's case is held to, in process and through
//! the binary: each message names what the case edited (a variable it set; the file with
//! the line its text was changed at, or the byte where it stops being UTF-8; an unknown key
//! as added; or an edited key's path, or one inside it).

use super::mutations::{key, Case, Kind};
use toml::Value;

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

/// The TOML text `raw` as a value.
pub fn parse_value(raw: &str) -> Option<Value> {
    let table: toml::Table = toml::from_str(&format!("v = {raw}")).ok()?;
    table.get("v").cloned()
}
