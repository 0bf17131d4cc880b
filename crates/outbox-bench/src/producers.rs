//! `producers`: what the relay costs the services that insert into its table, measured as
//! pgbench would. N producer connections each commit one event per transaction (an
//! autocommit `INSERT`), timed from the statement's send to its result, in five states
//! per connection count, measured in turn in every round so that a drift of the machine
//! falls on all of them alike:
//!
//! - *bare*: a copy of the relay's table with its columns, indexes and defaults only (no
//!   trigger, no storage options), inserted into as fast as the producers can;
//! - *installed*: the relay's table as `migrate` left it (on PostgreSQL: its NOTIFY
//!   trigger, fillfactor and autovacuum settings), as fast as they can, no relay running;
//! - *serving-bare*: a relay running, idle, on its table while the producers insert into
//!   the bare copy at `--rate` commits/s: what the relay's wake-ups and polls cost them;
//! - *broker-bare*: serving-bare, and a bare lapin publisher sending the broker as many
//!   persistent messages as the relay would for those inserts (`broker.rs`): the broker's
//!   share of serving, which falls on the producers only where the broker shares the
//!   database's machine, as on a bench;
//! - *serving*: the same relay relaying what the producers insert into its table at the
//!   same rate: what claiming and marking beside the inserts costs them.
//!
//! Serving ÷ serving-bare is what relaying costs the producers on this machine; serving ÷
//! broker-bare is what the relay costs them beyond the broker's own work.
//!
//! The producers run on a thread and a runtime of their own, on connections of their own,
//! so that the relay's runtime (on the main thread) schedules none of their work. Every
//! state starts on two empty tables. Once per run, an idle relay's own CPU and the
//! database's statements and CPU are measured too.

mod broker;
mod load;

use crate::cost::DbServer;
use crate::idle::ServerLoad;
use crate::process;
use crate::scenario::{median, round, Backend, Bench};
use anyhow::{bail, Context as _};
use clap::Args;
use lapin::options::QueuePurgeOptions;
use load::{measure, Plan, Window};
use outbox_amqp::{Broker, Tap};
use outbox_relay::startup::{open_broker, start_relay};
use sea_orm::{ConnectionTrait as _, DatabaseConnection, DbBackend, Statement};
use std::time::Duration;

/// `producers` options.
#[derive(Debug, Clone, Args)]
pub struct ProducersArgs {
    /// Database backend.
    #[arg(long, value_enum, default_value_t = Backend::Postgres)]
    backend: Backend,
    /// Producer connection counts, each measured in every state.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,4,16,64",
        value_parser = clap::value_parser!(u32).range(1..=1000)
    )]
    connections: Vec<u32>,
    /// Seconds measured per state.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    seconds: u64,
    /// Rounds, each measuring every state once (medians reported).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Commits/s offered in the serving states, spread evenly over the connections.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    rate: u64,
    /// Seconds an idle relay is measured, once per run (0: not measured).
    #[arg(long, default_value_t = 10)]
    idle_seconds: u64,
    /// Bytes of each event's envelope.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(64..))]
    envelope_bytes: u64,
    /// PostgreSQL: the relay LISTENs (`database.notify = true`), and `migrate` enables the
    /// table's insert trigger, which every insert pays for; without it the relay probes
    /// (unless `--no-probe`) and the trigger stays disabled.
    #[arg(long)]
    notify: bool,
    /// The relay does not probe (`database.probe = false`).
    #[arg(long)]
    no_probe: bool,
}

impl ProducersArgs {
    /// The relay's wake-up, for the figures: `notify`, `probe`, `data_version` or `none`.
    fn wake_ups(&self) -> &'static str {
        match (self.backend, self.notify, self.no_probe) {
            (Backend::Postgres, true, _) => "notify",
            (_, _, true) => "none",
            (Backend::Sqlite, _, false) => "data_version",
            (Backend::Postgres | Backend::Mysql, _, false) => "probe",
        }
    }
}

/// Rooms the events are spread over.
const ROOMS: usize = 1_000;
/// How long a started relay settles before the first serving state.
const SETTLE: Duration = Duration::from_secs(1);
/// How long the relay may take to mark what a serving state inserted.
const MARK_DEADLINE: Duration = Duration::from_secs(300);

/// How many states a round measures per connection count.
const STATES: usize = 5;

/// The measured states, in the order a round measures them for one connection count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Bare,
    Installed,
    ServingBare,
    BrokerBare,
    Serving,
}

impl State {
    const ALL: [State; STATES] = [
        State::Bare,
        State::Installed,
        State::ServingBare,
        State::BrokerBare,
        State::Serving,
    ];

    /// Its key in the JSON line.
    fn key(self) -> &'static str {
        match self {
            State::Bare => "bare",
            State::Installed => "installed",
            State::ServingBare => "serving_bare",
            State::BrokerBare => "broker_bare",
            State::Serving => "serving",
        }
    }

    fn label(self) -> &'static str {
        match self {
            State::Bare => "bare",
            State::Installed => "installed",
            State::ServingBare => "serving-bare",
            State::BrokerBare => "broker-bare",
            State::Serving => "serving",
        }
    }

    /// A relay runs, and the producers insert at the offered rate (open loop).
    fn serving(self) -> bool {
        matches!(
            self,
            State::ServingBare | State::BrokerBare | State::Serving
        )
    }

    /// The producers insert into the relay's table (else into the bare copy).
    fn into_installed(self) -> bool {
        matches!(self, State::Installed | State::Serving)
    }
}

/// Runs every round and prints each state's figures, then the medians per connection
/// count (a table and one JSON line each).
pub async fn run(args: ProducersArgs) -> anyhow::Result<()> {
    let backend = format!("{:?}", args.backend).to_lowercase();
    let counts: Vec<String> = args.connections.iter().map(u32::to_string).collect();
    let queue_type = crate::baseline::queue_type()?;
    println!(
        "producers: {backend}, {} queue, connections {}, {} s per state, {} round(s), serving \
         states offered {} commits/s, envelopes of {} bytes, {ROOMS} rooms, wake-ups {}",
        queue_type.name(),
        counts.join(","),
        args.seconds,
        args.rounds,
        args.rate,
        args.envelope_bytes,
        args.wake_ups()
    );
    let bench = Bench::setup(args.backend, |settings| {
        settings.database.notify = args.notify;
        settings.database.probe = !args.no_probe;
    })
    .await?;
    let bare = format!("{}_bare", bench.store.table().as_str());
    let outcome = measure_all(&args, &bench, &bare).await;
    // Teardown whatever happened: the bare copy first (on PostgreSQL its default draws on
    // the relay table's sequence, which goes with that table).
    let dropped = bench
        .store
        .connection()
        .execute_unprepared(&format!("DROP TABLE IF EXISTS {bare}"))
        .await;
    let torn_down = bench.teardown().await;
    let rounds = outcome?;
    dropped.with_context(|| format!("cannot drop {bare}"))?;
    torn_down.context("teardown")?;
    summarise(&args, &backend, queue_type, &rounds);
    Ok(())
}

/// The bare copy, the broker and its queue, the idle relay, then every round: per round,
/// per connection count, the five states' windows.
async fn measure_all(
    args: &ProducersArgs,
    bench: &Bench,
    bare: &str,
) -> anyhow::Result<Vec<Vec<[Window; STATES]>>> {
    create_bare(bench.store.connection(), bench.store.table().as_str(), bare).await?;
    let broker = open_broker(&bench.config).await?;
    // A durable queue of the exchange's name (`Bench::teardown` deletes it) takes what the
    // relay publishes, so nothing is unroutable; purged after each serving state. Declared
    // where the drain's consumer declares its own: on the first broker of the list.
    let tap = async {
        let connection = crate::baseline::connect().await?;
        let queue = bench.queue_type.queue(bench.queue.clone());
        let tap = Tap::open(connection.create_channel().await?, queue, &bench.queue, "#")
            .await
            .context("cannot bind a queue to the relay's exchange")?;
        anyhow::Ok((connection, tap))
    }
    .await;
    let (connection, tap) = match tap {
        Ok(opened) => opened,
        Err(error) => {
            broker.close().await;
            return Err(error);
        }
    };
    let run = Run {
        args,
        bench,
        bare,
        url: outbox_store::connection_url(&bench.config.outboxes[0].database_url),
        broker: &broker,
        tap: &tap,
    };
    let measured = async {
        if args.idle_seconds > 0 {
            run.idle().await?;
        }
        let mut rounds = Vec::with_capacity(args.rounds as usize);
        for n in 0..args.rounds {
            rounds.push(run.round(n).await?);
        }
        anyhow::Ok(rounds)
    }
    .await;
    tap.close().await;
    let _ = connection.close(200, "done".into()).await;
    broker.close().await;
    measured
}

/// What every state of a run shares.
struct Run<'a> {
    args: &'a ProducersArgs,
    bench: &'a Bench,
    /// The bare copy's name.
    bare: &'a str,
    /// The producers' URL: the relay's database, plain text as the relay's own pool.
    url: String,
    broker: &'a Broker,
    tap: &'a Tap,
}

impl Run<'_> {
    fn table(&self) -> &str {
        self.bench.store.table().as_str()
    }

    /// Empties both tables (the relay's, when a relay runs, only once every row is marked),
    /// then, on PostgreSQL, asks for a checkpoint, so that no window pays for writing out
    /// the pages the one before it dirtied (without the privilege, the request fails and
    /// the window starts anyway).
    async fn clear_both(&self, relay_running: bool) -> anyhow::Result<()> {
        let db = self.bench.store.connection();
        let (bare, table) = (self.bare, self.table());
        if relay_running || db.get_database_backend() != DbBackend::Postgres {
            clear(db, bare).await?;
            clear(db, table).await?;
        } else {
            // Nobody else uses the tables: TRUNCATE leaves no dead rows and dirties nothing.
            db.execute_unprepared(&format!("TRUNCATE {bare}, {table}"))
                .await
                .with_context(|| format!("cannot empty {bare} and {table}"))?;
        }
        if db.get_database_backend() == DbBackend::Postgres {
            let _ = db.execute_unprepared("CHECKPOINT").await;
        }
        Ok(())
    }

    /// A relay with nothing to do for `--idle-seconds`: its CPU, the database's
    /// statements/s and CPU (as `idle` measures them), printed with a JSON line.
    async fn idle(&self) -> anyhow::Result<()> {
        let relay = start_relay(&self.bench.config, &self.bench.store, self.broker).await?;
        let seconds = self.args.idle_seconds;
        let measured = async {
            tokio::time::sleep(SETTLE).await;
            let db = self.bench.store.connection();
            let db_server = DbServer::find(db).await;
            let server = ServerLoad::read(db, &db_server).await?;
            let cpu = process::cpu_seconds();
            tokio::time::sleep(Duration::from_secs(seconds)).await;
            let cpu = process::cpu_seconds() - cpu;
            let server = ServerLoad::read(db, &db_server).await?.since(&server);
            anyhow::Ok((cpu, server))
        }
        .await;
        // Stopped before an error returns: a relay dropped with the runtime would drop its
        // PostgreSQL listener outside it.
        let stopped = relay.shutdown().await;
        let (cpu, server) = measured?;
        stopped?;
        let relay_cpu = round(100.0 * cpu / seconds as f64, 2);
        let statements = server.statements.map(|n| round(n / seconds as f64, 1));
        let server_cpu = server
            .cpu_seconds
            .map(|s| round(100.0 * s / seconds as f64, 2));
        let backend = format!("{:?}", self.args.backend).to_lowercase();
        let or_na = |v: Option<f64>| v.map_or("n/a".to_owned(), |v| v.to_string());
        println!(
            "  idle relay, {seconds} s: relay CPU {relay_cpu} % of a core | database {} \
             statements/s, server CPU {} % of a core",
            or_na(statements),
            or_na(server_cpu)
        );
        println!(
            "{}",
            serde_json::json!({"scenario": "producers_idle", "backend": backend,
                "wake_ups": self.args.wake_ups(),
                "seconds": seconds, "statements_per_sec": statements,
                "server_cpu_percent": server_cpu, "relay_cpu_percent": relay_cpu})
        );
        Ok(())
    }

    /// One round: bare and installed for each connection count, then a relay started for
    /// serving-bare, broker-bare and serving for each, and stopped. Per connection count, the
    /// five states' windows.
    async fn round(&self, n: u32) -> anyhow::Result<Vec<[Window; STATES]>> {
        let counts = &self.args.connections;
        let mut windows: Vec<[Window; STATES]> = vec![Default::default(); counts.len()];
        for (cell, &connections) in windows.iter_mut().zip(counts) {
            for state in in_turn(n, [State::Bare, State::Installed]) {
                cell[state as usize] = self.state(n, connections, state).await?;
            }
        }
        // Nothing pending for the relay to find when it starts.
        self.clear_both(false).await?;
        let relay = start_relay(&self.bench.config, &self.bench.store, self.broker).await?;
        let served = async {
            tokio::time::sleep(SETTLE).await;
            for (cell, &connections) in windows.iter_mut().zip(counts) {
                let states = [State::ServingBare, State::BrokerBare, State::Serving];
                for state in in_turn(n, states) {
                    cell[state as usize] = self.state(n, connections, state).await?;
                }
            }
            anyhow::Ok(())
        }
        .await;
        // Stopped before an error returns (see `idle`).
        let stopped = relay.shutdown().await;
        served?;
        stopped?;
        Ok(windows)
    }

    /// One state's window on empty tables, printed; after serving, once the relay has
    /// marked every row, the queue is purged.
    async fn state(&self, n: u32, connections: u32, state: State) -> anyhow::Result<Window> {
        self.clear_both(state.serving()).await?;
        let backend = self.bench.store.connection().get_database_backend();
        let table = match state.into_installed() {
            true => self.table(),
            false => self.bare,
        };
        let values = match backend {
            DbBackend::Postgres => "$1, $2, $3, $4",
            DbBackend::MySql | DbBackend::Sqlite => "?, ?, ?, ?",
        };
        let plan = Plan {
            url: self.url.clone(),
            backend,
            sql: format!(
                "INSERT INTO {table} (event_id, event_type, room_id, envelope) VALUES ({values})"
            ),
            connections,
            seconds: self.args.seconds,
            rate: state.serving().then_some(self.args.rate),
            prefix: format!("r{n}c{connections}{}", state.key()),
            envelope_bytes: self.args.envelope_bytes as usize,
        };
        let broker_load = match state {
            State::BrokerBare => Some(broker::Publisher::start(
                self.bench.queue.clone(),
                self.args.rate,
                self.args.envelope_bytes as usize,
            )?),
            _ => None,
        };
        let measured = measure(plan).await;
        if let Some(publisher) = broker_load {
            publisher.finish().await.context("the broker load")?;
        }
        let window =
            measured.with_context(|| format!("{connections} connections, {}", state.label()))?;
        if state == State::Serving {
            self.bench.wait_all_marked(MARK_DEADLINE).await?;
        }
        if matches!(state, State::BrokerBare | State::Serving) {
            self.tap
                .channel()
                .queue_purge(self.tap.name().into(), QueuePurgeOptions::default())
                .await?;
        }
        let mut line = format!(
            "  round {}/{}, {connections:>3} connections, {:<12} {:>8.0} commits/s | p50 {:.3} ms \
             | p99 {:.3} ms",
            n + 1,
            self.args.rounds,
            format!("{}:", state.label()),
            window.rate(),
            window.p50_ms,
            window.p99_ms
        );
        if state.serving() && !window.reached {
            line.push_str(&format!(" | offered {}/s not reached", self.args.rate));
        }
        if window.errors > 0 {
            line.push_str(&format!(
                " | {} failed statements (first: {})",
                window.errors,
                window.first_error.as_deref().unwrap_or("?")
            ));
        }
        println!("{line}");
        if window.commits == 0 {
            bail!(
                "{connections} connections, {}: no commit in {} s",
                state.label(),
                self.args.seconds
            );
        }
        Ok(window)
    }
}

/// States compared with one another, in the order of round `n`: rotated by one each round,
/// so that none always inherits what the one before it left (the dirty pages and the
/// write-ahead log of the rows just deleted, the server's caches).
fn in_turn<const N: usize>(n: u32, mut states: [State; N]) -> [State; N] {
    states.rotate_left(n as usize % N);
    states
}

/// The copy of `table` the bare states insert into: the same columns, indexes and
/// defaults, nothing else the relay adds (no trigger, no storage options).
async fn create_bare(db: &DatabaseConnection, table: &str, bare: &str) -> anyhow::Result<()> {
    let backend = db.get_database_backend();
    let statements = match backend {
        DbBackend::Postgres => vec![format!(
            "CREATE TABLE {bare} (LIKE {table} INCLUDING DEFAULTS INCLUDING INDEXES \
             INCLUDING CONSTRAINTS)"
        )],
        DbBackend::MySql => vec![format!("CREATE TABLE {bare} LIKE {table}")],
        // The table's and its indexes' own DDL, renamed (the index names start with the
        // table's, so they are renamed too); the UNIQUE constraint's index comes with it.
        DbBackend::Sqlite => {
            let rows = db
                .query_all(Statement::from_sql_and_values(
                    backend,
                    "SELECT sql FROM sqlite_master WHERE tbl_name = ? \
                     AND type IN ('table', 'index') AND sql IS NOT NULL \
                     ORDER BY type = 'index', name",
                    [table.into()],
                ))
                .await?;
            let mut statements = Vec::with_capacity(rows.len());
            for row in rows {
                statements.push(row.try_get::<String>("", "sql")?.replace(table, bare));
            }
            statements
        }
    };
    for statement in statements {
        db.execute_unprepared(&statement)
            .await
            .with_context(|| format!("cannot create {bare}"))?;
    }
    Ok(())
}

/// Empties `table`: DELETE (a running relay may be using it), then on PostgreSQL a VACUUM,
/// so that no state inherits the dead rows of the one before, and on SQLite a checkpoint,
/// so that each state starts on an empty WAL.
async fn clear(db: &DatabaseConnection, table: &str) -> anyhow::Result<()> {
    db.execute_unprepared(&format!("DELETE FROM {table}"))
        .await
        .with_context(|| format!("cannot empty {table}"))?;
    match db.get_database_backend() {
        DbBackend::Postgres => {
            db.execute_unprepared(&format!("VACUUM {table}")).await?;
        }
        DbBackend::Sqlite => {
            // Best effort: a reader of the relay's may hold the WAL a moment.
            let _ = db
                .execute_unprepared("PRAGMA wal_checkpoint(TRUNCATE)")
                .await;
        }
        DbBackend::MySql => {}
    }
    Ok(())
}

/// Per connection count, the medians over the rounds: a table and one JSON line each.
/// The ratios are the medians of each round's ratio (the states of a ratio were measured
/// next to each other).
fn summarise(
    args: &ProducersArgs,
    backend: &str,
    queue_type: crate::baseline::QueueType,
    rounds: &[Vec<[Window; STATES]>],
) {
    println!(
        "  medians of {} round(s); ratios: the median of each round's\n  connections  state        \
         commits/s     p50 ms     p99 ms",
        rounds.len()
    );
    for (cell, &connections) in args.connections.iter().enumerate() {
        let windows = |state: State| rounds.iter().map(move |r| &r[cell][state as usize]);
        let pick = |state: State, f: fn(&Window) -> f64| median(windows(state).map(f).collect());
        let ratio = |over: State, under: State, f: fn(&Window) -> f64| {
            median(
                (windows(over).zip(windows(under)))
                    .map(|(o, u)| f(o) / f(u))
                    .collect(),
            )
        };
        let mut json = serde_json::json!({
            "scenario": "producers", "backend": backend, "wake_ups": args.wake_ups(),
            "queue_type": queue_type.name(),
            "connections": connections,
            "seconds": args.seconds, "rounds": args.rounds, "rate": args.rate,
            "envelope_bytes": args.envelope_bytes, "rooms": ROOMS,
        });
        for state in State::ALL {
            let rate = pick(state, Window::rate);
            let (p50, p99) = (pick(state, |w| w.p50_ms), pick(state, |w| w.p99_ms));
            let mut line = format!(
                "  {connections:>11}  {:<12} {rate:>9.0}  {p50:>9.3}  {p99:>9.3}",
                state.label()
            );
            let mut figures = serde_json::json!({"commits_per_sec": round(rate, 0),
                "p50_ms": round(p50, 3), "p99_ms": round(p99, 3)});
            if state.serving() {
                let reached = windows(state).all(|w| w.reached);
                figures["rate_reached"] = reached.into();
                if !reached {
                    line.push_str(&format!("  (offered {}/s not reached)", args.rate));
                }
            }
            println!("{line}");
            json[state.key()] = figures;
        }
        let installed = ratio(State::Installed, State::Bare, Window::rate);
        let p50 = ratio(State::Serving, State::ServingBare, |w| w.p50_ms);
        let p99 = ratio(State::Serving, State::ServingBare, |w| w.p99_ms);
        let beyond_p50 = ratio(State::Serving, State::BrokerBare, |w| w.p50_ms);
        let beyond_p99 = ratio(State::Serving, State::BrokerBare, |w| w.p99_ms);
        let errors: u64 = rounds.iter().flat_map(|r| &r[cell]).map(|w| w.errors).sum();
        println!(
            "  {connections:>11}  installed ÷ bare commits/s {installed:.3} | serving ÷ \
             serving-bare: p50 {p50:.3}, p99 {p99:.3} | serving ÷ broker-bare: p50 \
             {beyond_p50:.3}, p99 {beyond_p99:.3}{}",
            match errors {
                0 => String::new(),
                n => format!(" | {n} failed statements"),
            }
        );
        json["installed_over_bare"] = round(installed, 3).into();
        json["serving_p50_over_bare"] = round(p50, 3).into();
        json["serving_p99_over_bare"] = round(p99, 3).into();
        json["serving_p50_over_broker_bare"] = round(beyond_p50, 3).into();
        json["serving_p99_over_broker_bare"] = round(beyond_p99, 3).into();
        json["errors"] = errors.into();
        println!("{json}");
    }
    println!(
        "  (one autocommit INSERT per transaction and connection, timed from its send to its \
         result; bare: the relay's table's columns, indexes and defaults only; installed: the \
         table as migrate left it, no relay; serving-bare: an idle relay beside inserts into \
         the bare copy at the offered rate; broker-bare: the same, and a bare lapin publisher \
         sending the broker a persistent message per insert; serving: the relay relaying the \
         inserts)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_state_of_a_comparison_comes_first_once_every_so_many_rounds() {
        let states = [State::ServingBare, State::BrokerBare, State::Serving];
        let firsts: Vec<State> = (0..3).map(|n| in_turn(n, states)[0]).collect();
        assert_eq!(firsts, states);
        assert_eq!(in_turn(3, states), states);
        assert_eq!(
            in_turn(1, [State::Bare, State::Installed]),
            [State::Installed, State::Bare]
        );
    }
}
