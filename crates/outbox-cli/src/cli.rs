//! The command line (DESIGN §9).

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

/// Default settings file.
pub const DEFAULT_CONFIG: &str = "config/default.toml";

/// outbox-relay publishes the rows of a transactional outbox table to RabbitMQ, in order
/// per room, at least once, and records each outcome.
#[derive(Debug, Parser)]
#[command(name = "outbox-relay", version, about, long_about = None)]
pub struct Cli {
    /// Settings file (TOML) [default: config/default.toml; built-in defaults when that file
    /// is absent]. Environment variables OUTBOX_RELAY__SECTION__KEY override it.
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the relay until SIGINT or SIGTERM.
    Run,
    /// Create or upgrade the outbox table and its indexes.
    Migrate,
    /// Validate the settings and print the effective values (secrets redacted).
    CheckConfig,
    /// Show counts by status, the oldest pending age and the rows claimed per node.
    Status(StatusArgs),
    /// Inspect and requeue dead events.
    #[command(subcommand)]
    Dead(DeadCommand),
    /// Seed synthetic room events into the configured outbox and relay them, with progress
    /// and a summary (events/s, end-to-end latency).
    Demo(DemoArgs),
    /// Delete published rows older than a bound, once, and print how many went.
    ///
    /// What `relay.retention` makes a running relay do continuously. Rows go in batches of
    /// 1,000 (one short DELETE each), so it is safe while relays run. Pending rows are
    /// never deleted; dead rows only with --dead.
    Purge(PurgeArgs),
}

/// `purge` options.
#[derive(Debug, Args)]
pub struct PurgeArgs {
    /// Delete published rows whose broker confirm (published_at) is older than this, such
    /// as "7d", "12h" or "30m".
    #[arg(long, value_name = "DURATION", value_parser = parse_age)]
    pub older_than: Duration,
    /// Also delete dead rows whose event was created longer ago than --older-than. Without
    /// it dead rows are kept, for `dead list` and `dead requeue`.
    #[arg(long)]
    pub dead: bool,
}

/// A duration above zero: `purge --older-than 0s` would delete every published row, which
/// is more likely a slip than a wish.
fn parse_age(value: &str) -> Result<Duration, String> {
    match humantime::parse_duration(value.trim()) {
        Ok(age) if !age.is_zero() => Ok(age),
        Ok(_) => Err("must be above zero, such as \"7d\" or \"12h\"".into()),
        Err(error) => Err(format!(
            "{error}; use a duration such as \"7d\", \"12h\" or \"30m\""
        )),
    }
}

/// `status` options.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `dead` subcommands.
#[derive(Debug, Subcommand)]
pub enum DeadCommand {
    /// List dead events with their last error.
    List {
        /// Print JSON lines instead of a table.
        #[arg(long)]
        json: bool,
        /// At most this many rows, oldest first.
        #[arg(long, default_value_t = 100)]
        limit: u64,
        /// Only this room's dead events.
        #[arg(long)]
        room: Option<String>,
        /// Only dead events of this type.
        #[arg(long)]
        event_type: Option<String>,
    },
    /// Make dead events pending again (retry_count 0, available now).
    Requeue {
        /// Requeue these event ids.
        #[arg(long = "event-id", value_name = "ID", num_args = 1.., required_unless_present_any = ["room", "all"])]
        event_ids: Vec<String>,
        /// Requeue every dead event of this room.
        #[arg(long, conflicts_with_all = ["event_ids", "all"])]
        room: Option<String>,
        /// Requeue every dead event.
        #[arg(long, conflicts_with_all = ["event_ids", "room"])]
        all: bool,
    },
}

/// `demo` options.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Events to seed.
    #[arg(long, default_value_t = 10_000)]
    pub events: u64,
    /// Rooms to spread them over.
    #[arg(long, default_value_t = 100)]
    pub rooms: u64,
    /// Insert every event before the relay starts (relay a backlog) instead of while it
    /// runs (relay live traffic).
    #[arg(long)]
    pub prefill: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn purge_takes_a_duration_above_zero() {
        let cli = Cli::try_parse_from(["outbox-relay", "purge", "--older-than", "7d", "--dead"])
            .expect("parses");
        let Command::Purge(args) = cli.command else {
            panic!("not purge: {:?}", cli.command);
        };
        assert_eq!(args.older_than, Duration::from_secs(7 * 86_400));
        assert!(args.dead);
        for bad in ["0s", "soon"] {
            let error = Cli::try_parse_from(["outbox-relay", "purge", "--older-than", bad])
                .unwrap_err()
                .to_string();
            assert!(error.contains("--older-than"), "{error}");
        }
        assert!(
            Cli::try_parse_from(["outbox-relay", "purge"]).is_err(),
            "--older-than is required"
        );
    }
}
