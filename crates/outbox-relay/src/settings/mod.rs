//! Settings (`docs/configuration.md#validation`): layered, then validated in one place before
//! anything connects.
//!
//! - [`shape`]: the file's shape and its defaults ([`Settings`]), as written.
//! - [`field`]: one typed value as written ([`Field`]), so that every bad value is reported.
//! - `load`: the layers, built-in defaults ← TOML file ← `OUTBOX_RELAY__SECTION__KEY`
//!   (`environment`: the variables, taken as text), every problem of their shape in our
//!   words (`wording`).
//! - `validate`: each section checks itself and yields its part of the typed [`Config`],
//!   recording its errors and warnings in a report (`check`).
//! - `admin`: the `[admin]` section, whose tokens file is read as it is checked.
//! - `file_modes`: a warning for each file holding a secret that others may read.
//!
//! Every problem is reported at once, each naming the key, the bad value and what is
//! accepted; no password is ever printed (see [`crate::secrets`]).

mod admin;
mod check;
mod config;
mod environment;
pub mod field;
mod file_modes;
mod load;
mod outboxes;
pub mod shape;
mod validate;
mod wording;

#[cfg(test)]
mod tests;

pub use config::{
    AdminConfig, Config, DatabaseConfig, LogConfig, LogFormat, MaxPendingAge, OutboxConfig,
};
pub use environment::ENV_PREFIX;
pub use field::{Field, Span};
pub use load::Rejected;
pub use shape::{
    AdminSettings, AmqpSection, ColumnsSettings, DatabaseSettings, HeaderColumnSettings,
    LogSettings, MetricsSettings, OutboxColumnsSettings, OutboxSettings, RelaySettings,
    RouteSettings, Settings, TelemetrySettings,
};
pub use validate::default_node_id;

use thiserror::Error;

/// A setting that cannot be used. Exit code 2.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// The file or an environment variable does not fit the settings' shape.
    #[error("{0}")]
    Load(String),
    /// A value is out of its accepted range.
    #[error("{key} = {value:?} is invalid: {accepted}")]
    Invalid {
        /// `section.key`.
        key: String,
        /// The value as given (secrets redacted).
        value: String,
        /// What would have been accepted.
        accepted: String,
    },
    /// A value of another kind than its key takes (a bare number where a duration goes),
    /// shown as written (secrets masked).
    #[error("{key} = {written} is invalid: {accepted}")]
    Mistyped {
        /// `section.key`.
        key: String,
        /// The value as the file spells it: `30`, `true`, `"text"`, `a table`.
        written: String,
        /// What would have been accepted.
        accepted: String,
    },
    /// A problem with a value an environment variable gave.
    #[error("{error} (from environment variable {variable})")]
    FromEnvironment {
        /// The problem.
        error: Box<ConfigError>,
        /// The variable that gave the value.
        variable: String,
    },
    /// A password given twice: by its key and by its file key. Each key that an
    /// environment variable set is named with its variable.
    #[error(
        "{password}{} and {file} = {path:?}{} are both set: give the password in one of \
         them, not both",
        from_variable(.password_from),
        from_variable(.file_from)
    )]
    PasswordTwice {
        /// The password's key (`amqp.password`).
        password: String,
        /// The variable that set it, if one did.
        password_from: Option<String>,
        /// The file's key (`amqp.password_file`).
        file: String,
        /// The variable that set it, if one did.
        file_from: Option<String>,
        /// The file's path (never the password).
        path: String,
    },
    /// An outbox (an `[[outboxes]]` entry, or the mapping of `[database.columns]`) cannot
    /// be used.
    #[error("{outbox}: {problem}")]
    Outbox {
        /// `outboxes[1] (orders)`, or `database` for `[database.columns]`.
        outbox: String,
        /// What is wrong, starting with the key (`columns.key: …`).
        problem: String,
    },
}

/// ` (from environment variable NAME)` when `variable` is set, else nothing.
fn from_variable(variable: &Option<String>) -> String {
    variable
        .as_deref()
        .map(|variable| format!(" (from environment variable {variable})"))
        .unwrap_or_default()
}
