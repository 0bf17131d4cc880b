//! The `drain` and `latency` scenarios: the relay in-process on real services, a consumer
//! on a durable queue bound to the relay's exchange.

use crate::{baseline, process};
use anyhow::{bail, Context as _};
use clap::{Args, ValueEnum};
use futures_lite::StreamExt;
use lapin::options::{
    BasicConsumeOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::FieldTable;
use outbox_cli::settings::{Config, Settings};
use outbox_cli::startup::{open_broker, open_store, start_relay};
use outbox_core::OutboxStore;
use outbox_store::{insert_events, NewEvent, SeaOrmStore};
use sea_orm::ConnectionTrait as _;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Which database the relay runs on.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Backend {
    /// `OUTBOX_BENCH_DATABASE_URL`, default the local PostgreSQL.
    Postgres,
    /// A temporary SQLite file.
    Sqlite,
    /// `OUTBOX_BENCH_MYSQL_URL`, default the local MariaDB.
    Mysql,
}

/// `drain` options.
#[derive(Debug, Args)]
pub struct DrainArgs {
    /// Database backend.
    #[arg(long, value_enum, default_value = "postgres")]
    backend: Backend,
    /// Events to pre-fill.
    #[arg(long, default_value_t = 100_000)]
    events: usize,
    /// Rooms they are spread over (1 or 10 for a hot-room case).
    #[arg(long, default_value_t = 1_000)]
    rooms: usize,
    /// `relay.publishers`.
    #[arg(long, default_value_t = 4)]
    publishers: i64,
    /// `relay.batch_size`.
    #[arg(long, default_value_t = 100)]
    batch_size: i64,
    /// `relay.ordering`: per_room or none.
    #[arg(long, default_value = "per_room")]
    ordering: String,
    /// Skip the baseline run (no ratio).
    #[arg(long)]
    no_baseline: bool,
}

/// `latency` options.
#[derive(Debug, Args)]
pub struct LatencyArgs {
    /// Database backend.
    #[arg(long, value_enum, default_value = "postgres")]
    backend: Backend,
    /// Inserts per second, one event per transaction.
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
}

/// Delivery times by event id.
type Deliveries = Rc<RefCell<HashMap<String, Instant>>>;

/// A fresh table, exchange and queue, and a consumer recording deliveries.
struct Bench {
    config: Config,
    store: SeaOrmStore,
    deliveries: Deliveries,
    queue: String,
    sqlite_file: Option<std::path::PathBuf>,
}

impl Bench {
    async fn setup(backend: Backend, adjust: impl FnOnce(&mut Settings)) -> anyhow::Result<Self> {
        let run = format!(
            "{}_{}",
            std::process::id(),
            chrono::Utc::now().timestamp_millis() % 100_000_000
        );
        let mut sqlite_file = None;
        let mut settings = Settings::default();
        settings.database.url = match backend {
            Backend::Postgres => std::env::var("OUTBOX_BENCH_DATABASE_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into()),
            Backend::Mysql => std::env::var("OUTBOX_BENCH_MYSQL_URL")
                .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into()),
            Backend::Sqlite => {
                let file = std::env::temp_dir().join(format!("outbox_bench_{run}.db"));
                let url = format!("sqlite://{}?mode=rwc", file.display());
                sqlite_file = Some(file);
                url
            }
        };
        settings.database.table = format!("bench_{run}");
        settings.amqp.url = baseline::amqp_url();
        settings.amqp.exchange = format!("bench.relay.{run}");
        settings.log.level = "warn".into();
        settings.metrics.listen = String::new();
        adjust(&mut settings);
        let config = settings
            .validate()
            .map_err(|errors| anyhow::anyhow!("invalid bench settings: {errors:?}"))?;
        let store = open_store(&config, true).await?;
        let queue = config.amqp.router.exchange.clone();
        let deliveries: Deliveries = Rc::default();
        let bench = Self {
            config,
            store,
            deliveries,
            queue,
            sqlite_file,
        };
        bench.consume().await?;
        Ok(bench)
    }

    /// A durable queue bound to the relay's exchange, consumed here.
    async fn consume(&self) -> anyhow::Result<()> {
        let broker = open_broker(&self.config).await?;
        let channel = broker.open_channel().await?;
        let queue = self.queue.as_str();
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .queue_declare(queue.into(), durable, FieldTable::default())
            .await?;
        channel
            .queue_bind(
                queue.into(),
                queue.into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let mut consumer = channel
            .basic_consume(
                queue.into(),
                "outbox-bench".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        let deliveries = Rc::clone(&self.deliveries);
        actix_rt::spawn(async move {
            // Keeps the consumer's connection alive as long as deliveries come.
            let _broker = broker;
            while let Some(Ok(delivery)) = consumer.next().await {
                if let Some(id) = delivery.properties.message_id() {
                    deliveries
                        .borrow_mut()
                        .entry(id.to_string())
                        .or_insert_with(Instant::now);
                }
            }
        });
        Ok(())
    }

    fn delivered(&self) -> usize {
        self.deliveries.borrow().len()
    }

    async fn wait_until(
        &self,
        what: &str,
        deadline: Duration,
        mut done: impl FnMut(&Self) -> bool,
    ) -> anyhow::Result<()> {
        let until = Instant::now() + deadline;
        while !done(self) {
            if Instant::now() > until {
                bail!("{what} did not happen within {deadline:?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    async fn teardown(self) -> anyhow::Result<()> {
        let broker = open_broker(&self.config).await?;
        let channel = broker.open_channel().await?;
        let _ = channel
            .queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
            .await;
        let _ = channel
            .exchange_delete(self.queue.as_str().into(), ExchangeDeleteOptions::default())
            .await;
        let _ = channel.close(200, "done".into()).await;
        broker.close().await;
        let t = self.store.table().as_str();
        for suffix in ["", "_migrations", "_lock"] {
            let _ = self
                .store
                .connection()
                .execute_unprepared(&format!("DROP TABLE IF EXISTS {t}{suffix}"))
                .await;
        }
        if let Some(file) = self.sqlite_file {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
            }
        }
        Ok(())
    }
}

/// A 512-byte JSON envelope.
fn event(run: &str, n: usize, rooms: usize) -> NewEvent {
    let room_id = format!("room-{}", n % rooms);
    let event_id = format!("{run}-{n:08}");
    let mut envelope = format!(r#"{{"event_id":"{event_id}","room_id":"{room_id}","text":""#);
    envelope.push_str(&"x".repeat(512usize.saturating_sub(envelope.len() + 2)));
    envelope.push_str("\"}");
    NewEvent {
        event_id,
        event_type: "room.message.posted".into(),
        room_id,
        envelope,
        headers: None,
        available_at: None,
    }
}

/// Pre-fills, relays, measures; then the baseline and the ratio.
pub async fn drain(args: DrainArgs) -> anyhow::Result<()> {
    let bench = Bench::setup(args.backend, |settings| {
        settings.relay.publishers = args.publishers;
        settings.relay.batch_size = args.batch_size;
        settings.relay.ordering = args.ordering.clone();
    })
    .await?;
    let run = bench.store.table().as_str().to_owned();
    let events: Vec<NewEvent> = (0..args.events)
        .map(|n| event(&run, n, args.rooms))
        .collect();
    for chunk in events.chunks(500) {
        insert_events(bench.store.connection(), bench.store.table(), chunk).await?;
    }
    drop(events);

    let cpu_before = process::cpu_seconds();
    let started = Instant::now();
    let relay = start_relay(
        &bench.config,
        &bench.store,
        &open_broker(&bench.config).await?,
    )
    .await?;
    let deadline = Duration::from_secs(120).max(Duration::from_millis(args.events as u64 * 2));
    bench
        .wait_until("every delivery", deadline, |bench| {
            bench.delivered() >= args.events
        })
        .await?;
    let mut marked = false;
    let until = Instant::now() + deadline;
    while !marked {
        marked = bench.store.stats().await?.pending == 0;
        if !marked {
            if Instant::now() > until {
                bail!("not every event was marked within {deadline:?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = process::cpu_seconds() - cpu_before;
    relay.shutdown().await?;
    let rate = args.events as f64 / seconds;
    let cpu_us = cpu / args.events as f64 * 1e6;
    let rss = process::peak_rss_mib();
    bench.teardown().await?;

    let backend = format!("{:?}", args.backend).to_lowercase();
    println!(
        "drain: {backend}, {} events, {} rooms, {} publishers, batch {}, ordering {}",
        args.events, args.rooms, args.publishers, args.batch_size, args.ordering
    );
    println!("  relayed in     {seconds:.2} s");
    println!("  events/s       {rate:.0}");
    println!("  CPU/event      {cpu_us:.1} µs (whole process: relay and consumer)");
    println!("  peak RSS       {rss:.1} MiB");
    let mut json = serde_json::json!({
        "scenario": "drain", "backend": backend, "events": args.events, "rooms": args.rooms,
        "publishers": args.publishers, "batch_size": args.batch_size, "ordering": args.ordering,
        "seconds": (seconds * 1000.0).round() / 1000.0, "events_per_sec": rate.round(),
        "cpu_us_per_event": (cpu_us * 10.0).round() / 10.0, "peak_rss_mib": (rss * 10.0).round() / 10.0,
    });
    if !args.no_baseline {
        let baseline = baseline::run(args.events).await?;
        let ratio = rate / baseline.rate;
        println!(
            "  baseline       {:.0} msg/s (lapin, window {})",
            baseline.rate, baseline.window
        );
        println!("  ratio          {ratio:.2}");
        json["baseline_events_per_sec"] = baseline.rate.round().into();
        json["ratio"] = ((ratio * 100.0).round() / 100.0).into();
    }
    println!("{json}");
    Ok(())
}

/// Inserts at a steady rate while the relay runs; reports insert → delivery percentiles.
pub async fn latency(args: LatencyArgs) -> anyhow::Result<()> {
    let bench = Bench::setup(args.backend, |settings| {
        settings.relay.publishers = args.publishers
    })
    .await?;
    let relay = start_relay(
        &bench.config,
        &bench.store,
        &open_broker(&bench.config).await?,
    )
    .await?;
    let run = bench.store.table().as_str().to_owned();
    let total = (args.rate * args.seconds) as usize;
    let mut sent: HashMap<String, Instant> = HashMap::with_capacity(total);
    let started = tokio::time::Instant::now();
    let period = Duration::from_secs_f64(1.0 / args.rate.max(1) as f64);
    for n in 0..total {
        tokio::time::sleep_until(started + period * n as u32).await;
        let event = event(&run, n, args.rooms);
        sent.insert(event.event_id.clone(), Instant::now());
        insert_events(bench.store.connection(), bench.store.table(), &[event]).await?;
    }
    bench
        .wait_until("every delivery", Duration::from_secs(60), |bench| {
            bench.delivered() >= total
        })
        .await?;
    relay.shutdown().await?;
    let mut latencies: Vec<Duration> = bench
        .deliveries
        .borrow()
        .iter()
        .filter_map(|(id, at)| sent.get(id).map(|sent| at.saturating_duration_since(*sent)))
        .collect();
    latencies.sort_unstable();
    bench.teardown().await.context("teardown")?;
    let pick = |q: f64| {
        let rank = ((q * latencies.len() as f64).ceil() as usize).clamp(1, latencies.len());
        latencies[rank - 1].as_secs_f64() * 1e3
    };
    let (p50, p90, p99, max) = (pick(0.5), pick(0.9), pick(0.99), pick(1.0));
    let backend = format!("{:?}", args.backend).to_lowercase();
    println!(
        "latency: {backend}, {} events/s for {} s, insert → delivery",
        args.rate, args.seconds
    );
    println!("  p50 {p50:.1} ms  p90 {p90:.1} ms  p99 {p99:.1} ms  max {max:.1} ms");
    println!(
        "{}",
        serde_json::json!({"scenario": "latency", "backend": backend, "rate": args.rate, "seconds": args.seconds,
            "events": total, "p50_ms": p50, "p90_ms": p90, "p99_ms": p99, "max_ms": max})
    );
    Ok(())
}
