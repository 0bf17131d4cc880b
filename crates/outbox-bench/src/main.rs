//! `outbox-bench`: how fast the relay moves events, next to what the broker itself takes.
//! Each scenario (the `Scenario` variants) prints a readable table and one JSON line; the
//! consumer runs as a child process, so the CPU time and peak RSS reported are the relay's
//! own. The figures and how to read them: BENCHMARKS.md.

mod adopt;
mod args;
mod baseline;
mod compare;
mod consumer;
mod cost;
mod history;
mod idle;
mod latency;
mod otlp_sink;
mod process;
mod producers;
mod published;
mod report;
mod scenario;

use clap::{Args, Parser, Subcommand};
use std::process::ExitCode;

/// The relay's allocator (`outbox-relay`'s main.rs): the relay runs in this process.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Benchmarks of outbox-relay against a raw lapin baseline, on local services.
#[derive(Debug, Parser)]
#[command(name = "outbox-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Debug, Subcommand)]
enum Scenario {
    /// Relay a pre-filled backlog; measure events/s, CPU per event, peak RSS.
    Drain(scenario::DrainArgs),
    /// A bare lapin publisher with pipelined confirms.
    Baseline(BaselineArgs),
    /// Commit → delivery latency at a steady insert rate.
    Latency(latency::LatencyArgs),
    /// `drain` over publishers × batch sizes, medians per cell.
    Matrix(scenario::MatrixArgs),
    /// Drains on an empty table, then on one with `--rows` published rows kept (no retention):
    /// the rate ratio history ÷ empty.
    History(history::HistoryArgs),
    /// An idle relay: its CPU, and the database's statements/s and CPU (wake-ups' cost).
    Idle(idle::IdleArgs),
    /// What the relay costs the producers: their commits/s and commit latency, with and without.
    Producers(producers::ProducersArgs),
    /// One scenario run by two builds, interleaved over rounds: every figure's medians,
    /// their ratio, and whether the rounds' spread is too large to call the difference.
    Compare(compare::CompareArgs),
    /// Adopting a live Debezium-shaped table: migrate's duration and the producer's worst
    /// insert latency while it runs.
    Adopt(adopt::AdoptArgs),
    /// The JSON lines of the scenarios above (files, or standard input) as BENCHMARKS.md's
    /// Markdown tables; `scripts/benchmarks` runs BENCHMARKS.md's commands through it.
    Report(report::ReportArgs),
    /// The consumer child of `drain` and `latency` (started by them).
    #[command(hide = true)]
    Consume(consumer::ConsumeArgs),
    /// The OTLP receiver child of `drain --otlp` (started by it).
    #[command(hide = true)]
    OtlpSink(otlp_sink::SinkArgs),
}

/// `baseline` options.
#[derive(Debug, Args)]
struct BaselineArgs {
    /// Messages to publish per window size.
    #[arg(long, default_value_t = 100_000)]
    events: usize,
    /// Bytes per message body.
    #[arg(long, default_value_t = 512)]
    envelope_bytes: usize,
    /// Let the consumer read the queue only after each window (as `drain --consume-after`).
    #[arg(long)]
    consume_after: bool,
    /// Channels to spread the messages over, by room (the relay has one per Publisher).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    channels: u16,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let system = actix_rt::System::new();
    let result = system.block_on(async move {
        match cli.scenario {
            Scenario::Drain(args) => scenario::drain(args).await,
            Scenario::Baseline(args) => baseline::run(
                args.events,
                args.envelope_bytes,
                match args.consume_after {
                    true => consumer::Consume::Later,
                    false => consumer::Consume::Now,
                },
                usize::from(args.channels),
            )
            .await
            .map(|result| result.print()),
            Scenario::Latency(args) => latency::run(args).await,
            Scenario::Matrix(args) => scenario::matrix(args).await,
            Scenario::History(args) => history::run(args).await,
            Scenario::Idle(args) => idle::run(args).await,
            Scenario::Producers(args) => producers::run(args).await,
            Scenario::Compare(args) => compare::run(args).await,
            Scenario::Adopt(args) => adopt::run(args).await,
            Scenario::Report(args) => report::run(args),
            Scenario::Consume(args) => consumer::run(args).await,
            Scenario::OtlpSink(args) => otlp_sink::run(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
