//! The command line; docs/reference/commands.md shows it whole (generated from it).

use clap::{ArgGroup, Args, Parser, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

/// Default settings file.
pub const DEFAULT_CONFIG: &str = "config/default.toml";

/// The environment variable naming the settings file when `--config` is not given.
pub const CONFIG_ENV: &str = "OUTBOX_RELAY_CONFIG";

/// The end of the top-level `--help`: where settings come from, exit codes, an example.
const AFTER_HELP: &str = "\
Settings, each layer overriding the one before:
  1. built-in defaults;
  2. the TOML file given by --config, else by OUTBOX_RELAY_CONFIG (default
     config/default.toml, skipped when absent);
  3. environment variables OUTBOX_RELAY__SECTION__KEY, e.g. OUTBOX_RELAY__AMQP__URL or
     OUTBOX_RELAY__DATABASE__PASSWORD.
Every key is listed in docs/reference/settings.md; `outbox-relay check-config` prints the
result with secrets redacted. --config is accepted before or after the command.

Exit codes:
  0  success
  1  runtime failure (a database or broker error, a forced stop)
  2  bad configuration or usage

Example:
  OUTBOX_RELAY__DATABASE__PASSWORD_FILE=/run/secrets/db-password \\
    outbox-relay --config /etc/outbox-relay/config.toml run";

/// outbox-relay publishes the rows of a transactional outbox table to RabbitMQ, in order
/// per room, at least once, and records each outcome.
// No bare `about`: that would show the crate's Cargo description instead of this text.
#[derive(Debug, Parser)]
#[command(name = "outbox-relay", version, after_help = AFTER_HELP)]
pub struct Cli {
    /// Settings file (TOML) [default: config/default.toml; built-in defaults when that file
    /// is absent]. OUTBOX_RELAY_CONFIG gives it when --config does not; a file named
    /// either way must exist. Environment variables OUTBOX_RELAY__SECTION__KEY override it.
    #[arg(long, global = true, value_name = "PATH", env = CONFIG_ENV)]
    pub config: Option<PathBuf>,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the relay until SIGINT or SIGTERM.
    ///
    /// Connects to the database (migrating the table first when database.migrate_on_start)
    /// and to RabbitMQ, then publishes pending rows and records each outcome. While either
    /// cannot be reached yet (refused, reset, not resolving, starting up) it keeps trying
    /// with backoff, up to relay.startup_timeout (default: as long as it takes; then exit
    /// code 1); a password, database or vhost they refuse is exit code 2 at once. The first
    /// SIGINT or SIGTERM shuts down gracefully: in-flight publishes finish, unstarted rows
    /// are released, exit code 0. A second signal, or relay.shutdown_timeout, forces the
    /// stop (exit code 1; leases then expire on their own).
    Run,
    /// Create or upgrade the outbox table and its indexes.
    ///
    /// Applies the migrations each outbox's table does not have yet and prints each; safe
    /// to run again. A producer's existing table gets the relay's bookkeeping columns and
    /// indexes, its own columns and rows untouched. Use it from a deployment when
    /// database.migrate_on_start is false.
    Migrate(MigrateArgs),
    /// Validate the settings, print the effective values (secrets redacted), and ask the
    /// databases and brokers what `run` would.
    ///
    /// Loads the defaults, the file and the OUTBOX_RELAY__ variables, validates them as
    /// `run` would, and prints the result as TOML, passwords shown as ***, then each
    /// outbox. Then connects to each outbox's database (checking the role's privileges and
    /// the column mapping against its table) and to each broker of amqp.url (login, vhost,
    /// and the type of each exchange that exists), creating nothing. Exit code 2 naming the
    /// outbox or broker, the setting and the reason when a setting is wrong or a database
    /// or broker refuses it; one that cannot be reached is a `# warning:` (exit code 0), so
    /// it can run before the services are up.
    CheckConfig(CheckConfigArgs),
    /// Show counts by status, the oldest pending age, the rows claimed per node and the
    /// table's size on disk.
    Status(StatusArgs),
    /// Inspect and requeue dead events.
    ///
    /// An event goes dead after relay.max_attempts failures, or at once when it can never
    /// be published; it stays in the table until requeued.
    #[command(subcommand)]
    Dead(DeadCommand),
    /// Seed synthetic room events into the configured outbox and relay them, with progress
    /// and a summary (events/s, end-to-end latency).
    ///
    /// Binds a temporary queue to the configured exchanges to count deliveries; the
    /// exchange must be a topic or fanout one. Meant for trying the relay out, not for
    /// production tables.
    Demo(DemoArgs),
    /// Delete published rows older than a bound, once, and print how many went.
    ///
    /// What `relay.retention` makes a running relay do continuously. Rows go in batches of
    /// 1,000 (one short DELETE each), so it is safe while relays run. Pending rows are
    /// never deleted; dead rows only with --dead. --dry-run counts instead of deleting.
    Purge(PurgeArgs),
    /// A live view of running relays: one row per outbox and node, refreshed every second.
    ///
    /// Reads the nodes' /metrics (the URLs given, else this host's metrics.listen) and
    /// shows per outbox and node: published/s and failed/s (over the last 10 s), the
    /// backlog and its oldest age (the table's, as every node sees it), events this node
    /// marked dead since it started, the p99 of commit→confirm and the node's state (up,
    /// database or broker down, blocked by a broker alarm, unreachable). Worst rows first.
    /// `q` quits. --once prints one plain table instead (two looks a second apart).
    Top(TopArgs),
    /// Make a token for the admin API and print it with the line for admin.tokens_file.
    ///
    /// The token is 32 random bytes from the operating system, in hex; the line holds its
    /// SHA-256 only (name:role:sha256:<hex>). Append the line to the tokens file and restart
    /// the relay; give the token to its holder, who sends it as `Authorization: Bearer
    /// <token>`. It is shown once and cannot be recovered from the file.
    AdminToken(AdminTokenArgs),
}

/// `admin-token` options.
#[derive(Debug, Args)]
pub struct AdminTokenArgs {
    /// Who holds the token, as audit lines name them: letters, digits, '-', '_', '.' or '@'.
    #[arg(long)]
    pub name: String,
    /// viewer (reads only) or operator (reads and requeues).
    #[arg(long, value_enum)]
    pub role: AdminRole,
}

/// `admin-token --role`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AdminRole {
    /// Reads only.
    Viewer,
    /// Reads and actions.
    Operator,
}

/// `top` options.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// Print one plain table (a header row, then one row per outbox and node, worst
    /// first) and exit, for scripts: no screen, no keys. Exit code 1 when no node answered.
    #[arg(long)]
    pub once: bool,
    /// The nodes' metrics endpoints, such as http://relay-1:9187/metrics or relay-1:9187
    /// (then /metrics) [default: this host's metrics.listen].
    #[arg(value_name = "URL")]
    pub urls: Vec<String>,
}

/// `check-config` options.
#[derive(Debug, Args)]
pub struct CheckConfigArgs {
    /// Check the settings only: contact no database and no broker.
    #[arg(long)]
    pub offline: bool,
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
    /// Only this outbox (its name; default: every outbox).
    #[arg(long, value_name = "NAME")]
    pub outbox: Option<String>,
    /// Count the rows that would go and print that; delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print one JSON object instead of lines: dry_run, older_than (the bound, RFC 3339),
    /// published and, with --dead, dead (rows deleted, or that would be), and "outboxes"
    /// with those counts per outbox name.
    #[arg(long)]
    pub json: bool,
}

/// `migrate` options.
#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// Print, per outbox, the steps and statements that would run, and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Only this outbox (its name; default: every outbox).
    #[arg(long, value_name = "NAME")]
    pub outbox: Option<String>,
    /// How long to wait for a database that cannot be reached yet (refused, reset, not
    /// resolving, starting up), trying again with backoff; 0s: fail at once. A database
    /// that refuses the settings (password, unknown database) fails at once all the same.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_wait)]
    pub wait: Duration,
}

/// A duration, zero included (`migrate --wait 0s`: one try).
fn parse_wait(value: &str) -> Result<Duration, String> {
    humantime::parse_duration(value.trim()).map_err(|error| {
        format!("{error}; use a duration such as \"60s\" or \"5m\", or \"0s\" to fail at once")
    })
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
    /// Print one JSON object instead of a table: pending, published, dead,
    /// oldest_pending_age_seconds, claimed (rows per node_id), expired_leases, table,
    /// outbox, published_estimated (above 1,000,000 rows published is the catalogue's
    /// estimate), table_bytes and table_bytes_method (size on disk with the indexes).
    /// With several outboxes: the totals, and "outboxes" with one such object per outbox
    /// name.
    #[arg(long)]
    pub json: bool,
    /// Only this outbox (its name; default: every outbox).
    #[arg(long, value_name = "NAME")]
    pub outbox: Option<String>,
}

/// `dead` subcommands.
#[derive(Debug, Subcommand)]
pub enum DeadCommand {
    /// List dead events with their last error.
    ///
    /// A header row, then one line per event, oldest first per outbox, tab-separated:
    /// event_id, room_id, event_type, retry_count, last_error, outbox. The filters combine
    /// (an event must pass each one given).
    List {
        /// Print one JSON object per line instead, without a header (id, event_id,
        /// event_type, room_id, retry_count, last_error, created_at, outbox).
        #[arg(long)]
        json: bool,
        /// At most this many events per outbox, oldest first; 0: every one. When an
        /// outbox has more, a line on stderr says how many it has.
        #[arg(long, value_name = "N", default_value_t = 100)]
        limit: u64,
        /// The filters.
        #[command(flatten)]
        filters: DeadFilters,
        /// Only this outbox (its name; default: every outbox).
        #[arg(long, value_name = "NAME")]
        outbox: Option<String>,
    },
    /// Make dead events pending again (retry_count 0, available now).
    ///
    /// Selects by --event-id, --event-type, --key (or --room) and --older-than, which combine (an
    /// event must pass each one given), or every dead event with --all; one of them is
    /// required. --dry-run lists the events it would requeue and changes nothing.
    /// Requeued events are published after the events of their room that went out while
    /// they were dead. Exit code 1 when an --event-id names no dead event that passes the
    /// filters: the others are requeued all the same and the missing ids are named.
    #[command(group(
        ArgGroup::new("selection")
            .required(true)
            .multiple(true)
            .args(["event_ids", "event_type", "room", "older_than", "all"])
    ))]
    Requeue {
        /// Only these event ids.
        #[arg(long = "event-id", value_name = "ID", num_args = 1..)]
        event_ids: Vec<String>,
        /// The filters.
        #[command(flatten)]
        filters: DeadFilters,
        /// Every dead event (no other selection).
        #[arg(long, conflicts_with_all = ["event_ids", "event_type", "room", "older_than"])]
        all: bool,
        /// Print the dead events that would be requeued, as `dead list` does, and how
        /// many; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Only this outbox (its name; default: every outbox).
        #[arg(long, value_name = "NAME")]
        outbox: Option<String>,
    },
}

/// The filters `dead list` and `dead requeue` share.
#[derive(Debug, Args)]
pub struct DeadFilters {
    /// Only dead events of this type, or of the types an AMQP topic pattern matches, as in
    /// [[amqp.routes]]: `*` stands for one word, `#` for zero or more ('order.*',
    /// 'order.#').
    #[arg(long, value_name = "TYPE")]
    pub event_type: Option<String>,
    /// Only the dead events of this ordering key (the value of columns.key; `--room` is
    /// the same).
    #[arg(long = "key", visible_alias = "room", value_name = "KEY")]
    pub room: Option<String>,
    /// Only dead events created longer ago than this, such as "30m", "12h" or "7d" (by
    /// the event's created_at: no time of death is recorded).
    #[arg(long, value_name = "DURATION", value_parser = parse_age)]
    pub older_than: Option<Duration>,
}

/// `demo` options.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Events to seed.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub events: u64,
    /// Rooms to spread them over (events of one room are delivered in order).
    #[arg(long, value_name = "R", default_value_t = 100)]
    pub rooms: u64,
    /// Insert every event before the relay starts (relay a backlog) instead of while it
    /// runs (relay live traffic).
    #[arg(long)]
    pub prefill: bool,
    /// Live traffic: events inserted per second, a small batch every 10 ms, so the latency
    /// shows the relay rather than a queue; 0 inserts as fast as the database takes them.
    #[arg(long, value_name = "N", default_value_t = 2_000)]
    pub rate: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every command, at any depth, with its path (`dead list`).
    fn commands(command: &clap::Command, path: String, out: &mut Vec<(String, clap::Command)>) {
        for sub in command.get_subcommands() {
            let path = format!("{path} {}", sub.get_name()).trim().to_owned();
            out.push((path.clone(), sub.clone()));
            commands(sub, path, out);
        }
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_command_and_flag_has_a_help_text() {
        let root = Cli::command();
        let mut all = vec![(String::from("outbox-relay"), root.clone())];
        commands(&root, String::new(), &mut all);
        for (path, command) in all {
            assert!(command.get_about().is_some(), "`{path}` has no help text");
            for arg in command.get_arguments() {
                assert!(
                    arg.get_help().is_some(),
                    "`{path} --{}` has no help text",
                    arg.get_id()
                );
            }
        }
    }

    #[test]
    fn the_outbox_selector_is_accepted_by_the_table_commands() {
        for args in [
            &["status", "--outbox", "orders"][..],
            &["dead", "list", "--outbox", "orders"],
            &["dead", "requeue", "--all", "--outbox", "orders"],
            &["purge", "--older-than", "7d", "--outbox", "orders"],
            &["migrate", "--outbox", "orders", "--dry-run"],
        ] {
            let cli =
                Cli::try_parse_from(std::iter::once("outbox-relay").chain(args.iter().copied()))
                    .unwrap_or_else(|error| panic!("{args:?}: {error}"));
            let outbox = match cli.command {
                Command::Status(args) => args.outbox,
                Command::Dead(DeadCommand::List { outbox, .. })
                | Command::Dead(DeadCommand::Requeue { outbox, .. }) => outbox,
                Command::Purge(args) => args.outbox,
                Command::Migrate(args) => {
                    assert!(args.dry_run);
                    args.outbox
                }
                other => panic!("{other:?}"),
            };
            assert_eq!(outbox.as_deref(), Some("orders"), "{args:?}");
        }
    }

    #[test]
    fn purge_takes_dry_run_and_json() {
        let cli = Cli::try_parse_from([
            "outbox-relay",
            "purge",
            "--older-than",
            "1h",
            "--dry-run",
            "--json",
        ])
        .expect("parses");
        let Command::Purge(args) = cli.command else {
            panic!("not purge: {:?}", cli.command);
        };
        assert!(args.dry_run && args.json && !args.dead);
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

    #[test]
    fn dead_requeue_names_the_selections_it_takes() {
        let error = Cli::try_parse_from(["outbox-relay", "dead", "requeue"])
            .unwrap_err()
            .to_string();
        for choice in [
            "--event-id",
            "--event-type",
            "--key",
            "--older-than",
            "--all",
        ] {
            assert!(error.contains(choice), "{choice} not in {error}");
        }
        let combined = Cli::try_parse_from([
            "outbox-relay",
            "dead",
            "requeue",
            "--event-type",
            "order.*",
            "--room",
            "r1",
            "--older-than",
            "1h",
            "--dry-run",
        ])
        .expect("filters combine");
        let Command::Dead(DeadCommand::Requeue {
            filters, dry_run, ..
        }) = combined.command
        else {
            panic!("not dead requeue: {:?}", combined.command);
        };
        assert!(dry_run);
        assert_eq!(filters.event_type.as_deref(), Some("order.*"));
        assert_eq!(filters.older_than, Some(Duration::from_secs(3600)));
        assert!(
            Cli::try_parse_from(["outbox-relay", "dead", "requeue", "--all", "--room", "r1"])
                .is_err(),
            "--all selects every dead event: no filter beside it"
        );
    }
}
