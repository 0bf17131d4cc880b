//! The layers: built-in defaults ← TOML file ← `OUTBOX_RELAY__SECTION__KEY` variables.
//!
//! Loading only checks the shape (known keys, strings where strings go); the values are
//! checked by validation, which can then report all of them at once.

use super::shape::Settings;
use super::ConfigError;
use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use std::path::Path;

/// Prefix of the environment overrides; sections and keys are separated by `__`.
pub const ENV_PREFIX: &str = "OUTBOX_RELAY__";

impl Settings {
    /// Loads defaults ← `file` (when it exists, or always when `required`) ← environment.
    pub fn load(file: &Path, required: bool) -> Result<Self, ConfigError> {
        if required && !file.exists() {
            return Err(ConfigError::Load(format!(
                "config file {} does not exist",
                file.display()
            )));
        }
        Figment::from(Serialized::defaults(Settings::default()))
            .merge(Toml::file(file))
            .merge(Env::prefixed(ENV_PREFIX).split("__"))
            .extract()
            .map_err(|error| ConfigError::Load(load_error(error)))
    }
}

/// Figment's message names the key and where it came from; make the wording ours.
fn load_error(error: figment::Error) -> String {
    error
        .into_iter()
        .map(|error| {
            let key = error.path.join(".");
            let source = match error.metadata.as_ref() {
                // Figment names only the prefix; the variable follows from the key.
                Some(metadata) if metadata.name.contains("environment") => format!(
                    " (from environment variable {ENV_PREFIX}{})",
                    error.path.join("__").to_uppercase()
                ),
                Some(metadata) => match &metadata.source {
                    Some(source) => format!(" (from {source})"),
                    None => format!(" (from {})", metadata.name),
                },
                None => String::new(),
            };
            match &error.kind {
                figment::error::Kind::UnknownField(field, expected) => format!(
                    "unknown setting {key:?}{source}: {field:?} is not a key of [{}]; accepted keys: {}",
                    error.path[..error.path.len().saturating_sub(1)].join("."),
                    expected.join(", ")
                ),
                kind => format!("setting {key:?}{source}: {kind}"),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}
