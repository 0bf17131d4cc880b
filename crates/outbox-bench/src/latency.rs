//! The `latency` scenario: commit → delivery time at a steady insert rate, with the relay's
//! wake-ups on or off.

use crate::consumer::{unix_nanos, Consume, ConsumerProcess};
use crate::scenario::{event, median, round, Backend, Bench};
use anyhow::{bail, Context as _};
use clap::Args;
use outbox_relay::startup::{open_broker, start_relay};
use outbox_store::insert_events;
use std::time::Duration;

/// `latency` options.
#[derive(Debug, Args)]
pub struct LatencyArgs {
    /// Database backend.
    #[arg(long, value_enum, default_value = "postgres")]
    backend: Backend,
    /// Inserts per second, one event per transaction; `--rate 2` (one every 500 ms) times
    /// lone events on an otherwise idle relay.
    #[arg(long, default_value_t = 500)]
    rate: u64,
    /// How long the producer runs.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Rooms.
    #[arg(long, default_value_t = 100)]
    rooms: usize,
    /// `relay.publishers`.
    #[arg(long, default_value_t = 4)]
    publishers: i64,
    /// PostgreSQL: LISTEN for the insert trigger's NOTIFY (`database.notify = true`, the
    /// trigger enabled by `migrate`) instead of the probe.
    #[arg(long)]
    notify: bool,
    /// Turn the probe off (`database.probe = false`): SQLite, MySQL/MariaDB and PostgreSQL
    /// without `--notify` only poll, for the old figure.
    #[arg(long)]
    no_probe: bool,
    /// Repeat the run this many times and report each run and the medians.
    #[arg(long, default_value_t = 1)]
    runs: usize,
}

impl LatencyArgs {
    /// The wake-up mechanism these options leave the relay (docs/design/wake-ups.md#insert-feeds):
    /// `notify`, `probe`, `data_version`, or `none` (polling only).
    fn wake_ups(&self) -> &'static str {
        match self.backend {
            Backend::Postgres if self.notify => "notify",
            _ if self.no_probe => "none",
            Backend::Postgres | Backend::Mysql => "probe",
            Backend::Sqlite => "data_version",
        }
    }
}

/// Commit → delivery percentiles of one `latency` run, in milliseconds.
#[derive(Debug, Clone, Copy)]
struct LatencyRun {
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
    duplicates: usize,
}

/// Inserts at a steady rate while the relay runs; reports commit → delivery percentiles,
/// `--runs` times.
pub async fn run(args: LatencyArgs) -> anyhow::Result<()> {
    let backend = format!("{:?}", args.backend).to_lowercase();
    let wake_ups = args.wake_ups();
    let queue_type = crate::baseline::queue_type()?.name();
    println!(
        "latency: {backend}, {queue_type} queue, {} events/s for {} s, {} rooms, commit → \
         delivery, wake-ups {}",
        args.rate,
        args.seconds,
        args.rooms,
        if wake_ups == "none" {
            "none (polling)"
        } else {
            wake_ups
        }
    );
    let json = |runs: &[LatencyRun]| {
        let pick = |f: fn(&LatencyRun) -> f64| round(median(runs.iter().map(f).collect()), 2);
        serde_json::json!({"scenario": "latency", "backend": backend,
            "queue_type": queue_type, "rate": args.rate,
            "seconds": args.seconds, "rooms": args.rooms, "events": args.rate * args.seconds,
            "wake_ups": wake_ups, "runs": runs.len(),
            "duplicates": runs.iter().map(|r| r.duplicates).sum::<usize>(),
            "p50_ms": pick(|r| r.p50), "p90_ms": pick(|r| r.p90), "p99_ms": pick(|r| r.p99),
            "max_ms": pick(|r| r.max)})
    };
    let mut runs = Vec::with_capacity(args.runs);
    for _ in 0..args.runs.max(1) {
        let run = latency_once(&args).await?;
        println!(
            "  p50 {:.1} ms  p90 {:.1} ms  p99 {:.1} ms  max {:.1} ms",
            run.p50, run.p90, run.p99, run.max
        );
        println!("{}", json(&[run]));
        runs.push(run);
    }
    if runs.len() > 1 {
        let medians = json(&runs);
        println!(
            "  median of {}: p50 {} ms  p90 {} ms  p99 {} ms  max {} ms",
            runs.len(),
            medians["p50_ms"],
            medians["p90_ms"],
            medians["p99_ms"],
            medians["max_ms"]
        );
        println!("{medians}");
    }
    Ok(())
}

async fn latency_once(args: &LatencyArgs) -> anyhow::Result<LatencyRun> {
    let bench = Bench::setup(args.backend, |settings| {
        settings.relay.publishers = args.publishers;
        settings.database.notify = args.notify;
        settings.database.probe = !args.no_probe;
    })
    .await?;
    let total = (args.rate * args.seconds) as usize;
    let consumer =
        ConsumerProcess::start(&bench.queue, total, args.rooms, true, Consume::Now).await?;
    let broker = open_broker(&bench.config).await?;
    let relay = start_relay(&bench.config, &bench.store, &broker).await?;
    let run = bench.store.table().as_str().to_owned();
    // One event past the timed ones (the consumer ignores it), relayed and marked before
    // the clock starts: the first timed event finds the relay idle, not starting up.
    let warm_up = event(&run, total, args.rooms, 512);
    insert_events(bench.store.connection(), bench.store.table(), &[warm_up]).await?;
    bench.wait_all_marked(Duration::from_secs(60)).await?;
    let mut committed = vec![0i64; total];
    let started = tokio::time::Instant::now();
    let period = Duration::from_secs_f64(1.0 / args.rate.max(1) as f64);
    for (n, at) in committed.iter_mut().enumerate() {
        tokio::time::sleep_until(started + period * n as u32).await;
        let event = event(&run, n, args.rooms, 512);
        insert_events(bench.store.connection(), bench.store.table(), &[event]).await?;
        // Taken once the commit returned: the moment the event exists for everyone else.
        *at = unix_nanos();
    }
    let report = consumer.finish(Duration::from_secs(60)).await?;
    relay.shutdown().await?;
    broker.close().await;
    bench.teardown().await.context("teardown")?;
    let mut latencies: Vec<f64> = report
        .times
        .iter()
        .zip(&committed)
        .map(|(delivered, committed)| (delivered - committed).max(0) as f64 / 1e6)
        .collect();
    if latencies.is_empty() {
        bail!("no delivery times were reported");
    }
    latencies.sort_unstable_by(f64::total_cmp);
    let pick = |q: f64| {
        let rank = ((q * latencies.len() as f64).ceil() as usize).clamp(1, latencies.len());
        latencies[rank - 1]
    };
    Ok(LatencyRun {
        p50: pick(0.5),
        p90: pick(0.9),
        p99: pick(0.99),
        max: pick(1.0),
        duplicates: report.duplicates,
    })
}
