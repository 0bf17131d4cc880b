//! The command line (DESIGN §9).

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

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
