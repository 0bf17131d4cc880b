//! The layers: built-in defaults ← TOML file ← `OUTBOX_RELAY__SECTION__KEY` variables.
//!
//! Loading checks the file (a readable, non-empty file of valid TOML) and the settings'
//! shape (known keys, values of the right kind); the values are checked by validation.
//! Every shape problem is reported: a key that does not fit is recorded and dropped (its
//! default takes its place), and reading goes on, so one run names them all.

use super::config::{Config, LogFormat};
use super::environment::{self, Origins};
use super::file_modes;
use super::shape::Settings;
use super::wording;
use super::ConfigError;
use figment::providers::Serialized;
use figment::value::{Dict, Value};
use figment::Figment;
use std::path::Path;

/// Settings that cannot be used: every problem found, and the log format they ask for
/// (when it can be told), so that the problems are printed as the logs would be.
#[derive(Debug, Clone)]
pub struct Rejected {
    /// Every problem, each naming the key (or the file, or the variable).
    pub errors: Vec<ConfigError>,
    /// `log.format`, when the settings name a valid one.
    pub log_format: Option<LogFormat>,
}

/// The settings as read, with the problems of their shape.
struct Loaded {
    settings: Settings,
    origins: Origins,
    errors: Vec<ConfigError>,
    /// The settings file holds a secret of its own (`file_modes::holds_secret`).
    file_holds_secret: bool,
}

impl Settings {
    /// Loads defaults ← `file` (when it exists, or always when `required`) ← environment.
    /// Every problem of the file's shape and of the environment is returned at once.
    pub fn load(file: &Path, required: bool) -> Result<Self, Vec<ConfigError>> {
        let loaded = Loaded::read(file, required)?;
        if loaded.errors.is_empty() {
            Ok(loaded.settings)
        } else {
            Err(loaded.errors)
        }
    }
}

impl Config {
    /// [`Settings::load`], then [`Settings::validate`]: every problem of the shape and of
    /// the values at once, each from the environment naming its variable. A settings file
    /// or password file holding a secret that others may read is a warning
    /// (`file_modes`).
    pub fn load(file: &Path, required: bool) -> Result<Config, Rejected> {
        let Loaded {
            settings,
            origins,
            mut errors,
            file_holds_secret,
        } = Loaded::read(file, required).map_err(|errors| Rejected {
            errors,
            log_format: None,
        })?;
        let log_format = settings.log.format.parsed().ok().copied();
        // Read here, not in `validate`: the process's environment, like the variables.
        errors.extend(super::validate::rust_log());
        let secret_files = file_modes::secret_files(file, file_holds_secret, &settings);
        match settings.validate() {
            Ok(mut config) if errors.is_empty() => {
                config.warnings.extend(file_modes::warnings(&secret_files));
                Ok(config)
            }
            Ok(_) => Err(Rejected { errors, log_format }),
            Err(invalid) => {
                errors.extend(invalid.into_iter().map(|e| from_environment(e, &origins)));
                Err(Rejected { errors, log_format })
            }
        }
    }
}

impl Loaded {
    /// Reads the layers. Fails at once when the file cannot be used at all.
    fn read(file: &Path, required: bool) -> Result<Self, Vec<ConfigError>> {
        let mut dict = match read_file(file, required).map_err(|error| vec![error])? {
            Some(text) => parse(file, &text).map_err(|error| vec![error])?,
            None => Dict::new(),
        };
        let file_holds_secret = file_modes::holds_secret(&dict);
        let variables = environment::variables()?;
        let mut errors = Vec::new();
        let origins = environment::apply(&mut dict, &variables, &mut errors);
        misread(&mut dict, &origins, &mut errors);
        let settings = shape(dict, &origins, &mut errors);
        Ok(Self {
            settings,
            origins,
            errors,
            file_holds_secret,
        })
    }
}

/// The settings file's text; `None` when it is optional and absent. A directory, a file
/// that cannot be read and an empty file are errors naming the path and why. `/dev/null`
/// (not a regular file) is the way to run on defaults and the environment alone.
fn read_file(path: &Path, required: bool) -> Result<Option<String>, ConfigError> {
    let problem = |why: String| ConfigError::Load(format!("config file {} {why}", path.display()));
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound && !required => return Ok(None),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Err(problem("does not exist".into()))
        }
        Err(error) => return Err(problem(format!("cannot be read: {error}"))),
    };
    if metadata.is_dir() {
        return Err(problem(format!(
            "is a directory, not a settings file{}",
            toml_files_in(path)
        )));
    }
    let bytes = std::fs::read(path).map_err(|error| problem(format!("cannot be read: {error}")))?;
    let text = String::from_utf8(bytes).map_err(|error| {
        problem(format!(
            "is not UTF-8 text (byte {})",
            error.utf8_error().valid_up_to()
        ))
    })?;
    if metadata.is_file() && text.trim().is_empty() {
        return Err(problem(
            "is empty; write the settings into it, or give --config /dev/null to run on the \
             built-in defaults and OUTBOX_RELAY__… variables alone"
                .into(),
        ));
    }
    Ok(Some(text))
}

/// The `*.toml` files of `directory`, as a hint (a ConfigMap mounted without `subPath`).
fn toml_files_in(directory: &Path) -> String {
    let mut names: Vec<String> = std::fs::read_dir(directory)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".toml") && !name.starts_with('.'))
        .collect();
    names.sort();
    match names.as_slice() {
        [] => String::new(),
        names => format!(
            "; name the file in it: {}",
            names
                .iter()
                .map(|name| directory.join(name).display().to_string())
                .collect::<Vec<_>>()
                .join(" or ")
        ),
    }
}

/// The file's TOML as a dict. A syntax error names the line, the column and what was
/// expected, never the line's text (it may hold a password).
fn parse(path: &Path, text: &str) -> Result<Dict, ConfigError> {
    let table: toml::Table = toml::from_str(text).map_err(|error| {
        let at = match error.span() {
            Some(span) => {
                let (line, column) = line_column(text, span.start);
                format!(", line {line}, column {column}")
            }
            None => String::new(),
        };
        let message: Vec<&str> = error.message().lines().map(str::trim).collect();
        ConfigError::Load(format!(
            "config file {}{at}: invalid TOML: {} (the line is not shown, as it may hold a \
             secret)",
            path.display(),
            message.join("; ")
        ))
    })?;
    Value::serialize(table)
        .ok()
        .and_then(Value::into_dict)
        .ok_or_else(|| ConfigError::Load(format!("config file {}: not a table", path.display())))
}

/// 1-based line and column (in characters) of byte `offset` of `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit('\n')
        .next()
        .unwrap_or_default()
        .chars()
        .count()
        + 1;
    (line, column)
}

/// Reads `dict` into [`Settings`]. A key that does not fit is recorded in `errors` and
/// dropped, and reading starts again without it, until the rest fits.
fn shape(mut dict: Dict, origins: &Origins, errors: &mut Vec<ConfigError>) -> Settings {
    // Each round drops one key, so the rounds are bounded by the keys written.
    for _ in 0..256 {
        let error = match Figment::from(Serialized::defaults(&dict)).extract_lossy::<Settings>() {
            Ok(settings) => return settings,
            Err(error) => error,
        };
        let path = error.path.clone();
        errors.push(from_origin(wording::shape_error(&error), &path, origins));
        if !drop_key(&mut dict, &path) {
            break;
        }
    }
    Settings::default()
}

/// Records and drops the values that serde would read as something else: a list where a
/// table of settings goes (`relay = []`, read as the table at its defaults) and a number
/// where `true` or `false` goes (`notify = 1`, read as a boolean).
fn misread(dict: &mut Dict, origins: &Origins, errors: &mut Vec<ConfigError>) {
    fn walk(shape: &Dict, dict: &mut Dict, path: &mut Vec<String>, found: &mut Vec<ConfigError>) {
        for (key, expected) in shape {
            path.push(key.clone());
            let written = match (expected, dict.get_mut(key)) {
                (Value::Dict(_, shape), Some(Value::Dict(_, inner))) => {
                    walk(shape, inner, path, found);
                    None
                }
                (Value::Dict(..), Some(Value::Array(..))) => {
                    Some(("a list".to_owned(), "a table of settings"))
                }
                (Value::Bool(..), Some(Value::Num(_, number))) => {
                    let text = (number.to_i128().map(|n| n.to_string()))
                        .or_else(|| number.to_f64().map(|n| n.to_string()))
                        .unwrap_or_default();
                    Some((text, "true or false"))
                }
                _ => None,
            };
            if let Some((written, accepted)) = written {
                dict.remove(key);
                found.push(ConfigError::Mistyped {
                    key: wording::key(path),
                    written,
                    accepted: accepted.into(),
                });
            }
            path.pop();
        }
    }
    let Some(shape) = Value::serialize(Settings::default())
        .ok()
        .and_then(Value::into_dict)
    else {
        return;
    };
    let mut found = Vec::new();
    walk(&shape, dict, &mut Vec::new(), &mut found);
    for error in found {
        let ConfigError::Mistyped { key, .. } = &error else {
            continue;
        };
        let path: Vec<String> = key.split('.').map(str::to_owned).collect();
        errors.push(from_origin(error.clone(), &path, origins));
    }
}

/// Removes the value at `path` (or the nearest one around it that exists); `false` when
/// there is nothing to remove.
fn drop_key(dict: &mut Dict, path: &[String]) -> bool {
    fn drop_in(value: &mut Value, path: &[String]) -> bool {
        let Some((first, rest)) = path.split_first() else {
            return false;
        };
        match value {
            Value::Dict(_, dict) => drop_from_dict(dict, first, rest),
            Value::Array(_, items) => match first.parse::<usize>() {
                Ok(index) if index < items.len() => {
                    drop_in(&mut items[index], rest) || {
                        items.remove(index);
                        true
                    }
                }
                _ => false,
            },
            _ => false,
        }
    }
    fn drop_from_dict(dict: &mut Dict, first: &str, rest: &[String]) -> bool {
        match dict.get_mut(first) {
            None => false,
            Some(value) => drop_in(value, rest) || dict.remove(first).is_some(),
        }
    }
    match path.split_first() {
        Some((first, rest)) => drop_from_dict(dict, first, rest),
        None => false,
    }
}

/// `error`, naming the variable when the value at `path` came from the environment.
fn from_origin(error: ConfigError, path: &[String], origins: &Origins) -> ConfigError {
    match origins.variable(&path.join(".")) {
        Some(variable) => ConfigError::FromEnvironment {
            error: Box::new(error),
            variable: variable.to_owned(),
        },
        None => error,
    }
}

/// A validation error naming the variable when its key came from the environment (for a
/// password given twice, the variable of each of its two keys).
fn from_environment(error: ConfigError, origins: &Origins) -> ConfigError {
    let path = match &error {
        ConfigError::PasswordTwice {
            password,
            file,
            path,
            ..
        } => {
            return ConfigError::PasswordTwice {
                password_from: origins.variable(password).map(str::to_owned),
                file_from: origins.variable(file).map(str::to_owned),
                password: password.clone(),
                file: file.clone(),
                path: path.clone(),
            }
        }
        ConfigError::Invalid { key, accepted, .. }
        | ConfigError::Mistyped { key, accepted, .. } => {
            // `amqp.url[1]`: the variable set the whole list.
            let own = key.split('[').next().unwrap_or_default();
            // Else another key the problem names that a variable set: `amqp.url` with a
            // password, refused because `amqp.password` is set.
            let other = accepted
                .split(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.')))
                .find(|word| word.contains('.') && origins.variable(word).is_some());
            match other {
                Some(other) if origins.variable(own).is_none() => other.to_owned(),
                _ => own.to_owned(),
            }
        }
        // `[database.columns]`: `columns.key: …`.
        ConfigError::Outbox { outbox, problem } if outbox == "database" => {
            let key = problem.split(':').next().unwrap_or_default();
            format!("database.{key}")
        }
        ConfigError::Outbox { outbox, problem } => {
            // `outboxes[1] (orders)` and `database_url: …`: the key the problem starts
            // with, else another key it names that a variable set (`database_password and
            // database_password_file = … are both set`, the file from the environment).
            let Some(index) = outbox
                .strip_prefix("outboxes[")
                .and_then(|rest| rest.split(']').next())
            else {
                return error;
            };
            let path = |key: &str| format!("outboxes.{index}.{key}");
            let mut keys = problem
                .split(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.')))
                .filter(|word| !word.is_empty());
            let Some(first) = problem
                .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
                .then(|| keys.next())
                .flatten()
            else {
                return error;
            };
            std::iter::once(first)
                .chain(keys.filter(|key| key.contains('_')))
                .map(path)
                .find(|path| origins.variable(path).is_some())
                .unwrap_or_else(|| path(first))
        }
        _ => return error,
    };
    let path: Vec<String> = path.split('.').map(str::to_owned).collect();
    from_origin(error, &path, origins)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::settings::tests::load;

    #[test]
    fn a_variable_is_named_when_it_sets_a_key_inside_a_setting() {
        let error = load("", &[("OUTBOX_RELAY__RELAY__LEASE__DEEPER", "1s")]).unwrap_err();
        assert!(
            error.contains("relay.lease") && error.contains("OUTBOX_RELAY__RELAY__LEASE__DEEPER"),
            "{error}"
        );
        let error = load("", &[("OUTBOX_RELAY__BOGUS__KEY", "1")]).unwrap_err();
        assert!(error.contains("OUTBOX_RELAY__BOGUS__KEY"), "{error}");
    }

    #[test]
    fn a_variable_is_named_for_database_columns_and_a_password_beside_a_url() {
        let error = load("", &[("OUTBOX_RELAY__DATABASE__COLUMNS__KEY", "a b")]).unwrap_err();
        assert!(
            error.contains("columns.key") && error.contains("OUTBOX_RELAY__DATABASE__COLUMNS__KEY"),
            "{error}"
        );
        let error = load(
            "[amqp]\nurl = \"amqp://relay:pw@mq/%2f\"",
            &[("OUTBOX_RELAY__AMQP__PASSWORD", "other")],
        )
        .unwrap_err();
        assert!(
            error.contains("amqp.url") && error.contains("OUTBOX_RELAY__AMQP__PASSWORD"),
            "{error}"
        );
    }

    #[test]
    fn a_list_for_a_table_and_a_number_for_a_boolean_are_refused() {
        let error = load("relay = []", &[]).unwrap_err();
        assert!(error.contains("relay = a list is invalid"), "{error}");
        let error = load("[database]\nmigrate_on_start = 1", &[]).unwrap_err();
        assert!(
            error.contains("database.migrate_on_start = 1 is invalid: true or false"),
            "{error}"
        );
    }

    #[test]
    fn a_pool_larger_than_a_u32_is_refused() {
        let error = load("[database]\nmax_connections = 4294967296", &[]).unwrap_err();
        assert!(
            error.contains("database.max_connections = \"4294967296\" is invalid"),
            "{error}"
        );
    }

    #[test]
    fn lines_and_columns_count_from_one() {
        assert_eq!(line_column("a = 1\nb = \"x", 10), (2, 5));
        assert_eq!(line_column("", 0), (1, 1));
    }
}
