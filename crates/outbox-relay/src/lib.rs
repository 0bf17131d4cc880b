//! The `outbox-relay` binary as a library, so tests can drive the same code.
//!
//! Layout:
//! - [`cli`]: the command line.
//! - [`settings`]: layered settings and their validation.
//! - [`secrets`]: passwords from settings or files, and scrubbing them from output.
//! - [`telemetry`]: the tracing subscriber.
//! - [`traces`]: OpenTelemetry spans exported over OTLP (feature `otel`).
//! - [`startup`]: opening the store and the broker, starting the relay.
//! - [`dependency`]: waiting at start for the database and the broker, and which failures
//!   to reach them a retry can fix.
//! - [`signals`]: the stop signals (SIGINT, SIGTERM).
//! - [`endpoint`]: the metrics and health endpoint of `run` (`/metrics`, `/healthz`,
//!   `/readyz`).
//! - [`admin`]: the admin API of `run` (`/api/v1`, on `admin.listen`) and its tokens.
//! - [`commands`]: one module per subcommand (`top`, the terminal view, in a folder of its
//!   own: scraping, rows, screen).

pub mod admin;
pub mod cli;
pub mod commands;
pub mod dependency;
pub mod endpoint;
pub mod secrets;
pub mod settings;
pub mod signals;
pub mod startup;
pub mod telemetry;
pub mod traces;

#[cfg(test)]
mod changelog;

use clap::{CommandFactory as _, FromArgMatches as _};
use cli::Cli;
use settings::{Config, LogFormat};
use std::path::PathBuf;
use std::process::ExitCode;

/// Exit code of a bad configuration or usage.
pub const EXIT_CONFIG: u8 = 2;
/// Exit code of a runtime failure.
pub const EXIT_FAILURE: u8 = 1;

/// Parses the command line (`--config`, else `OUTBOX_RELAY_CONFIG`), loads and validates the settings, installs telemetry and runs
/// the command on an actix system. Returns the process exit code.
pub fn main() -> ExitCode {
    // An empty OUTBOX_RELAY_CONFIG would reach clap as an empty --config, and clap's
    // message would not name the variable.
    if std::env::var_os(cli::CONFIG_ENV).is_some_and(|value| value.is_empty()) {
        eprintln!(
            "error: invalid configuration: {} is set but empty; name a settings file or unset it",
            cli::CONFIG_ENV
        );
        return ExitCode::from(EXIT_CONFIG);
    }
    let matches = Cli::command().get_matches();
    let from_env = matches.value_source("config") == Some(clap::parser::ValueSource::EnvVariable);
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(error) => error.exit(),
    };
    let (path, required) = match &cli.config {
        Some(path) => (path.clone(), true),
        None => (PathBuf::from(cli::DEFAULT_CONFIG), false),
    };
    if from_env && !path.exists() {
        eprintln!(
            "error: invalid configuration: config file {} (from {}) does not exist",
            path.display(),
            cli::CONFIG_ENV
        );
        return ExitCode::from(EXIT_CONFIG);
    }
    let config = match Config::load(&path, required) {
        Ok(config) => config,
        Err(rejected) => {
            let json = rejected.log_format == Some(LogFormat::Json);
            for error in rejected.errors {
                final_error(json, Ending::InvalidConfiguration, &error.to_string());
            }
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    telemetry::init(&config.log, &config.secrets);
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    let secrets = config.secrets.clone();
    let json = config.log.format == LogFormat::Json;
    let system = actix_rt::System::new();
    match system.block_on(commands::dispatch(cli.command, config)) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`outbox-relay status | head -3`): it has what it wanted.
        Err(error) if commands::OutputError::reader_gone(&error) => ExitCode::SUCCESS,
        // A bad mapping, or a database or broker refusing the settings (credentials, an
        // unknown database or vhost, a certificate, an exchange of another type).
        Err(error) if dependency::classify(&error) == dependency::Verdict::Refused => {
            let error = secrets.scrub(&format!("{error:#}"));
            final_error(json, Ending::Refused, &error);
            ExitCode::from(EXIT_CONFIG)
        }
        Err(error) => {
            // A second signal, or relay.shutdown_timeout: a forced stop.
            let forced =
                error.is::<commands::ForcedStop>() || error.is::<outbox_pipeline::ShutdownError>();
            // Our messages carry redacted URLs only; a library's may echo more.
            let error = secrets.scrub(&format!("{error:#}"));
            final_error(json, Ending::Failed, &error);
            if forced {
                // What still runs is abandoned, not dropped (see `ForcedStop`).
                std::process::exit(EXIT_FAILURE.into());
            }
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

/// What ended the process.
#[derive(Debug, Clone, Copy)]
enum Ending {
    /// A setting cannot be used (before anything connects).
    InvalidConfiguration,
    /// A database or broker refused the settings.
    Refused,
    /// Anything else.
    Failed,
}

impl Ending {
    /// The message of its JSON line.
    fn message(self) -> &'static str {
        match self {
            Self::InvalidConfiguration => "invalid configuration",
            Self::Refused => "outbox-relay cannot run with these settings",
            Self::Failed => "outbox-relay failed",
        }
    }
}

/// Prints the error that ends the process, once, on stderr: with JSON logs as one JSON
/// line shaped as the log lines are (whatever `log.level` lets through), else as one plain
/// `error: …` line (`error: invalid configuration: …` for a setting).
fn final_error(json: bool, ending: Ending, error: &str) {
    let message = ending.message();
    if !json {
        match ending {
            Ending::InvalidConfiguration => eprintln!("error: {message}: {error}"),
            Ending::Refused | Ending::Failed => eprintln!("error: {error}"),
        }
        return;
    }
    let line = serde_json::json!({
        "timestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        "level": "ERROR",
        "message": message,
        "error": error,
        "target": "outbox_relay",
    });
    eprintln!("{line}");
}
