//! The `OUTBOX_RELAY__SECTION__KEY` variables, laid over the file's settings.
//!
//! Each value is taken as text, exactly as given: a password `8675309`, `0123`, `true`,
//! `[s3cr3t,x]` or `"Sup3r"` (quotes and all) is that string. The settings' own types
//! decide the rest when the settings are read (`extract_lossy`): an integer or boolean
//! setting accepts `"42"` or `"true"`. Only the settings that are lists of tables
//! (`amqp.routes`, an entry's `routes`) read their text as a list (`[{event_type = …}]`);
//! `amqp.url` splits its text at commas itself.
//!
//! `amqp.url` also takes a list (`["amqp://mq-1/%2f", "amqp://mq-2/%2f"]`).
//!
//! `[[outboxes]]` entries are named by their position in the file, 0-based as the error
//! messages name them (`OUTBOX_RELAY__OUTBOXES__0__DATABASE_PASSWORD`), or by their name
//! (`OUTBOX_RELAY__OUTBOXES__ORDERS__DATABASE_PASSWORD`, any case).

use super::ConfigError;
use figment::value::{Dict, Value};
use std::collections::BTreeMap;

/// Prefix of the environment overrides; sections and keys are separated by `__`.
pub const ENV_PREFIX: &str = "OUTBOX_RELAY__";

/// Which variable set which setting: the setting's path as the settings' reader names it
/// (`relay.lease`, `outboxes.1.database_password`) → the variable's name.
#[derive(Debug, Clone, Default)]
pub(super) struct Origins(BTreeMap<String, String>);

impl Origins {
    /// The variable that set `path` (dotted, indices as segments) or a setting around it;
    /// else one that set a key inside it (`OUTBOX_RELAY__RELAY__LEASE__DEEPER` made
    /// `relay.lease` a table).
    pub(super) fn variable(&self, path: &str) -> Option<&str> {
        let mut around = path;
        loop {
            if let Some(variable) = self.0.get(around) {
                return Some(variable);
            }
            match around.rfind('.') {
                Some(end) => around = &around[..end],
                None => break,
            }
        }
        let inside = format!("{path}.");
        (self.0.iter())
            .find(|(set, _)| set.starts_with(&inside))
            .map(|(_, variable)| variable.as_str())
    }
}

/// One `OUTBOX_RELAY__…` variable.
#[derive(Debug, Clone)]
pub(super) struct Variable {
    /// Its name, as the environment spells it.
    name: String,
    /// Its name after the prefix, lowercased and split at `__`.
    path: Vec<String>,
    /// Its value, verbatim.
    value: String,
}

/// The process's `OUTBOX_RELAY__…` variables, sorted by name. A value that is not UTF-8
/// is an error naming the variable (never the value).
pub(super) fn variables() -> Result<Vec<Variable>, Vec<ConfigError>> {
    let mut variables = Vec::new();
    let mut errors = Vec::new();
    for (name, value) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        // Any case, as before: `outbox_relay__amqp__url` is read too.
        let Some(rest) = (name.get(..ENV_PREFIX.len()))
            .filter(|prefix| prefix.eq_ignore_ascii_case(ENV_PREFIX))
            .map(|_| &name[ENV_PREFIX.len()..])
        else {
            continue;
        };
        let path = rest.split("__").map(str::to_ascii_lowercase).collect();
        match value.into_string() {
            Ok(value) => variables.push(Variable {
                name: name.to_owned(),
                path,
                value,
            }),
            Err(_) => errors.push(ConfigError::Load(format!(
                "environment variable {name}: its value is not UTF-8 text"
            ))),
        }
    }
    variables.sort_by(|a, b| a.name.cmp(&b.name));
    if errors.is_empty() {
        Ok(variables)
    } else {
        Err(errors)
    }
}

/// Lays `variables` over `settings` (the file's, as a dict); returns which variable set
/// what. A variable that names no setting shape (`OUTBOX_RELAY__`, an `[[outboxes]]`
/// entry that does not exist) is recorded in `errors`, naming the variable.
pub(super) fn apply(
    settings: &mut Dict,
    variables: &[Variable],
    errors: &mut Vec<ConfigError>,
) -> Origins {
    let mut origins = Origins::default();
    for variable in variables {
        match place(settings, variable) {
            Ok(path) => {
                origins.0.insert(path, variable.name.clone());
            }
            Err(why) => errors.push(ConfigError::Load(format!(
                "environment variable {}: {why}",
                variable.name
            ))),
        }
    }
    origins
}

/// Sets the setting `variable` names; returns its path (dotted).
fn place(settings: &mut Dict, variable: &Variable) -> Result<String, String> {
    let path = &variable.path;
    if path.iter().any(String::is_empty) {
        return Err(format!(
            "names no setting: use {ENV_PREFIX}SECTION__KEY, such as {ENV_PREFIX}RELAY__LEASE"
        ));
    }
    if path[0] != "outboxes" {
        set(settings, path, &variable.value);
        return Ok(path.join("."));
    }
    const FORM: &str = "set one key of an [[outboxes]] entry, named by its position in the \
                        file (from 0) or its name: OUTBOX_RELAY__OUTBOXES__0__DATABASE_PASSWORD \
                        or OUTBOX_RELAY__OUTBOXES__ORDERS__DATABASE_PASSWORD";
    if path.len() < 3 {
        return Err(FORM.into());
    }
    let entries = match settings.get_mut("outboxes") {
        Some(Value::Array(_, entries)) => entries,
        _ => {
            return Err(format!(
                "the settings file has no [[outboxes]] entries to override; {FORM}"
            ))
        }
    };
    let index = entry(entries, &path[1])?;
    let Value::Dict(_, entry) = &mut entries[index] else {
        return Err(format!("[[outboxes]] entry {index} is not a table"));
    };
    set(entry, &path[2..], &variable.value);
    Ok(format!("outboxes.{index}.{}", path[2..].join(".")))
}

/// The position of the entry `selector` names: a position from 0, or a name (any case).
fn entry(entries: &[Value], selector: &str) -> Result<usize, String> {
    let names: Vec<String> = entries.iter().map(entry_name).collect();
    let found = match selector.parse::<usize>() {
        Ok(index) => (index < entries.len()).then_some(index),
        Err(_) => names
            .iter()
            .position(|name| name.eq_ignore_ascii_case(selector)),
    };
    found.ok_or_else(|| {
        let listed: Vec<String> = (names.iter().enumerate())
            .map(|(index, name)| format!("{index} ({name})"))
            .collect();
        format!(
            "names no [[outboxes]] entry ({selector:?}); the entries are: {}",
            listed.join(", ")
        )
    })
}

/// An entry's name as validation gives it: `name`, else `table`.
fn entry_name(entry: &Value) -> String {
    let text = |key: &str| {
        entry
            .find_ref(key)
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|text| !text.is_empty())
            .map(str::to_owned)
    };
    text("name").or_else(|| text("table")).unwrap_or_default()
}

/// Sets `path` in `dict` to `value`: text, or a list for the settings that are lists of
/// tables. A setting in the way that is not a table is replaced (the settings' shape then
/// reports the key).
fn set(dict: &mut Dict, path: &[String], value: &str) {
    let (last, parents) = path.split_last().expect("a non-empty path");
    let mut dict = dict;
    for key in parents {
        let slot = dict
            .entry(key.clone())
            .or_insert_with(|| Value::from(Dict::new()));
        if !matches!(slot, Value::Dict(..)) {
            *slot = Value::from(Dict::new());
        }
        let Value::Dict(_, inner) = slot else {
            unreachable!("made a table above")
        };
        dict = inner;
    }
    let listed = match last.as_str() {
        // A list of tables cannot be spelled as comma-separated text; read it as a list.
        "routes" => list(value),
        // No URL starts with `[`: a list of broker URLs (comma-separated text is one too).
        "url" if path.len() == 2 && path[0] == "amqp" && value.trim_start().starts_with('[') => {
            list(value)
        }
        _ => None,
    };
    let value = listed.unwrap_or_else(|| Value::from(value.to_owned()));
    dict.insert(last.clone(), value);
}

/// `text` as a list: JSON (`[{"event_type": "a.*", …}]`) or TOML-like
/// (`[{event_type = "a.*", …}]`).
fn list(text: &str) -> Option<Value> {
    let parsed = match serde_json::from_str::<serde_json::Value>(text) {
        Ok(json) => Value::serialize(json).ok()?,
        Err(_) => text.parse::<Value>().ok()?,
    };
    matches!(parsed, Value::Array(..)).then_some(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn variable(name: &str, value: &str) -> Variable {
        let rest = name.strip_prefix(ENV_PREFIX).unwrap();
        Variable {
            name: name.into(),
            path: rest.split("__").map(str::to_ascii_lowercase).collect(),
            value: value.into(),
        }
    }

    fn file(toml: &str) -> Dict {
        let table: toml::Table = toml::from_str(toml).unwrap();
        Value::serialize(table).unwrap().into_dict().unwrap()
    }

    #[test]
    fn values_are_taken_verbatim() {
        let mut settings = Dict::new();
        let mut errors = Vec::new();
        for value in ["8675309", "0123", "true", "[s3cr3t,x]", "\"Sup3r\""] {
            let origins = apply(
                &mut settings,
                &[variable("OUTBOX_RELAY__AMQP__PASSWORD", value)],
                &mut errors,
            );
            assert_eq!(
                settings.get("amqp").and_then(|a| a.find_ref("password")),
                Some(&Value::from(value.to_owned()))
            );
            assert_eq!(
                origins.variable("amqp.password"),
                Some("OUTBOX_RELAY__AMQP__PASSWORD")
            );
        }
        assert!(errors.is_empty(), "{errors:?}");
    }

    #[test]
    fn an_outbox_is_named_by_position_or_name() {
        let mut settings = file(
            "[[outboxes]]\ntable = \"rooms\"\n[[outboxes]]\nname = \"orders\"\ntable = \"o\"\n",
        );
        let mut errors = Vec::new();
        let origins = apply(
            &mut settings,
            &[
                variable("OUTBOX_RELAY__OUTBOXES__0__DATABASE_URL", "mysql://a@db/x"),
                variable("OUTBOX_RELAY__OUTBOXES__ORDERS__DATABASE_PASSWORD", "0123"),
            ],
            &mut errors,
        );
        assert!(errors.is_empty(), "{errors:?}");
        let entries = settings["outboxes"].as_array().unwrap();
        assert_eq!(
            entries[0].find_ref("database_url").and_then(Value::as_str),
            Some("mysql://a@db/x")
        );
        assert_eq!(
            entries[1]
                .find_ref("database_password")
                .and_then(Value::as_str),
            Some("0123")
        );
        assert_eq!(
            entries[1].find_ref("table").and_then(Value::as_str),
            Some("o")
        );
        assert_eq!(
            origins.variable("outboxes.1.database_password"),
            Some("OUTBOX_RELAY__OUTBOXES__ORDERS__DATABASE_PASSWORD")
        );
    }

    #[test]
    fn an_outbox_that_does_not_exist_is_named() {
        let mut settings = file("[[outboxes]]\ntable = \"rooms\"\n");
        let mut errors = Vec::new();
        apply(
            &mut settings,
            &[
                variable("OUTBOX_RELAY__OUTBOXES__1__DATABASE_URL", "x"),
                variable("OUTBOX_RELAY__OUTBOXES__BILLING__TABLE", "x"),
                variable("OUTBOX_RELAY__OUTBOXES", "x"),
            ],
            &mut errors,
        );
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 3, "{text:?}");
        assert!(
            text[0].contains("OUTBOX_RELAY__OUTBOXES__1__DATABASE_URL")
                && text[0].contains("0 (rooms)"),
            "{text:?}"
        );
        assert!(text[1].contains("\"billing\""), "{text:?}");
        assert!(text[2].contains("OUTBOX_RELAY__OUTBOXES__0__"), "{text:?}");
    }

    #[test]
    fn routes_are_read_as_a_list() {
        let mut settings = Dict::new();
        apply(
            &mut settings,
            &[variable(
                "OUTBOX_RELAY__AMQP__ROUTES",
                "[{event_type = \"a.*\", exchange = \"x\"}]",
            )],
            &mut Vec::new(),
        );
        assert!(matches!(
            settings["amqp"].find_ref("routes"),
            Some(Value::Array(..))
        ));
        apply(
            &mut settings,
            &[variable(
                "OUTBOX_RELAY__AMQP__URL",
                "[\"amqp://mq-1/%2f\", \"amqp://mq-2/%2f\"]",
            )],
            &mut Vec::new(),
        );
        assert!(matches!(
            settings["amqp"].find_ref("url"),
            Some(Value::Array(..))
        ));
    }
}
