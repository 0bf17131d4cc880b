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
//! - [`commands`]: one module per subcommand.

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
use settings::Settings;
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
    let config = match Settings::load(&path, required)
        .map_err(|error| vec![error])
        .and_then(Settings::validate)
    {
        Ok(config) => config,
        Err(errors) => {
            for error in errors {
                eprintln!("error: invalid configuration: {error}");
            }
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    telemetry::init(&config.log, &config.secrets);
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    let secrets = config.secrets.clone();
    let system = actix_rt::System::new();
    match system.block_on(commands::dispatch(cli.command, config)) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`outbox-relay status | head -3`): it has what it wanted.
        Err(error) if commands::OutputError::reader_gone(&error) => ExitCode::SUCCESS,
        // A bad mapping, or a database or broker refusing the settings (credentials, an
        // unknown database or vhost, a certificate, an exchange of another type).
        Err(error) if dependency::classify(&error) == dependency::Verdict::Refused => {
            let error = secrets.scrub(&format!("{error:#}"));
            tracing::error!(%error, "outbox-relay cannot run with these settings");
            eprintln!("error: {error}");
            ExitCode::from(EXIT_CONFIG)
        }
        Err(error) => {
            // Our messages carry redacted URLs only; a library's may echo more.
            let error = secrets.scrub(&format!("{error:#}"));
            tracing::error!(%error, "outbox-relay failed");
            eprintln!("error: {error}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}
