//! The `drain` and `latency` scenarios: the relay in-process on real services, the consumer
//! ([`crate::consumer`]) in a child process on a durable queue (`OUTBOX_BENCH_QUEUE_TYPE`)
//! bound to the relay's exchange.

pub use crate::args::{DrainArgs, MatrixArgs};
use crate::baseline::{self, Baseline, QueueType};
use crate::consumer::{Consume, ConsumerProcess, Report};
use crate::cost::{Cost, CostWatch};
use crate::otlp_sink::SinkProcess;
use crate::process;
use crate::published;
use anyhow::{bail, Context as _};
use clap::ValueEnum;
use outbox_amqp::tap::{delete_exchange, delete_queue};
use outbox_relay::settings::{Config, OutboxSettings, Settings};
use outbox_relay::startup::{open_broker, open_outboxes, start_relays, OpenOutbox};
use outbox_relay::traces::Traces;
use outbox_store::{insert_events, NewEvent, SeaOrmStore};
use sea_orm::{ConnectionTrait as _, DbBackend, Statement};
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

/// A fresh table and exchange for one run; the consumer runs in its own process.
pub(crate) struct Bench {
    /// The database it runs on.
    pub(crate) backend: Backend,
    pub(crate) config: Config,
    /// The first outbox's table (the only one unless `drain --outboxes`).
    pub(crate) store: SeaOrmStore,
    /// Every outbox, opened: one unless `drain --outboxes`.
    outboxes: Vec<OpenOutbox>,
    /// The relay's exchange, and the consumer's queue of the same name.
    pub(crate) queue: String,
    /// That queue's type.
    pub(crate) queue_type: QueueType,
    sqlite_file: Option<std::path::PathBuf>,
}

impl Bench {
    pub(crate) async fn setup(
        backend: Backend,
        adjust: impl FnOnce(&mut Settings),
    ) -> anyhow::Result<Self> {
        let queue_type = baseline::queue_type()?;
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
        settings.amqp.url = baseline::amqp_urls();
        settings.amqp.exchange = format!("bench.relay.{run}");
        settings.log.level = "warn".into();
        settings.metrics.listen = "".into();
        adjust(&mut settings);
        let config = settings
            .validate()
            .map_err(|errors| anyhow::anyhow!("invalid bench settings: {errors:?}"))?;
        // Warnings of the relay (and its timings under RUST_LOG=outbox_pipeline=debug).
        outbox_relay::telemetry::init(&config.log, &config.secrets);
        let outboxes = open_outboxes(&config, true).await?;
        let store = outboxes[0].store.clone();
        let queue = config.amqp.router.exchange.to_string();
        Ok(Self {
            backend,
            config,
            store,
            outboxes,
            queue,
            queue_type,
            sqlite_file,
        })
    }

    /// Waits until no row is pending, asking every 10 ms with the cheapest question the
    /// partial pending index answers (`stats()` would count the whole table each time).
    /// Returns how many questions it asked (the database counts them as transactions).
    pub(crate) async fn wait_all_marked(&self, deadline: Duration) -> anyhow::Result<u64> {
        let until = Instant::now() + deadline;
        let mut asked = 0;
        for outbox in &self.outboxes {
            // The bench's rows never become pending again, so nothing below the last
            // pending row found can be pending later.
            let mut from = 0_i64;
            loop {
                asked += 1;
                let Some(pending) = first_pending(outbox, from).await? else {
                    break;
                };
                from = pending;
                if Instant::now() > until {
                    bail!("not every event was marked within {deadline:?}");
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        Ok(asked)
    }

    /// Waits until the relays in this process have committed `target` `published`
    /// outcomes in all ([`published`]'s count, read every 10 ms), then confirms that no
    /// row is pending ([`Bench::wait_all_marked`]). Meanwhile the database is asked once a
    /// second, so that a run whose events end otherwise (dead) still ends. Returns how
    /// many questions it asked.
    pub(crate) async fn wait_published(
        &self,
        target: u64,
        deadline: Duration,
    ) -> anyhow::Result<u64> {
        let until = Instant::now() + deadline;
        let mut asked = 0;
        let mut next_question = Instant::now() + Duration::from_secs(1);
        // Per outbox, the last pending row found: each question starts there, as
        // `wait_all_marked`'s do, instead of walking the marked rows from the head again.
        let mut from = vec![0_i64; self.outboxes.len()];
        while published::so_far() < target {
            if Instant::now() >= next_question {
                let mut any = false;
                for (outbox, from) in self.outboxes.iter().zip(&mut from) {
                    asked += 1;
                    if let Some(pending) = first_pending(outbox, *from).await? {
                        *from = pending;
                        any = true;
                    }
                }
                if !any {
                    return Ok(asked);
                }
                next_question = Instant::now() + Duration::from_secs(1);
            }
            if Instant::now() > until {
                bail!("not every event was marked within {deadline:?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let left = until.saturating_duration_since(Instant::now());
        Ok(asked + self.wait_all_marked(left).await?)
    }

    /// Inserts `events` pending events, ids `{prefix}-{n:08}`, room `n % rooms`, a chunk at
    /// a time: the backlog lives in the database, not in this process. With several
    /// outboxes, a room's events all go to one of them (room order is kept within a table),
    /// the rooms dealt out in turn.
    pub(crate) async fn fill(
        &self,
        prefix: &str,
        events: usize,
        rooms: usize,
        envelope_bytes: usize,
    ) -> anyhow::Result<()> {
        let outboxes = self.outboxes.len();
        // Chunks of at most PREFILL_BYTES too: large envelopes stay within MariaDB's packet
        // limit, and the prefill's memory out of the relay's peak RSS.
        let chunk = PREFILL_CHUNK.min(PREFILL_BYTES / envelope_bytes).max(1);
        // Through connections of their own, closed afterwards: the relay's pool is not to
        // carry the benchmark's inserts (a 25 MiB envelope grew a connection's write buffer
        // to 150 MB; the relay's pool now shrinks it on release, but the benchmark's own
        // memory stays out of what the relay is measured with).
        let mut producers = Vec::with_capacity(outboxes);
        for outbox in &self.outboxes {
            producers.push(
                outbox_store::connect(&outbox.config.database_url, 1)
                    .await?
                    .into_connection(),
            );
        }
        for start in (0..events).step_by(chunk) {
            let mut chunks: Vec<Vec<NewEvent>> = vec![Vec::new(); outboxes];
            for n in start..events.min(start + chunk) {
                chunks[(n % rooms) % outboxes].push(event(prefix, n, rooms, envelope_bytes));
            }
            for ((outbox, db), chunk) in self.outboxes.iter().zip(&producers).zip(&chunks) {
                insert_events(db, outbox.store.table(), chunk).await?;
            }
        }
        for db in producers {
            db.close().await?;
        }
        Ok(())
    }

    /// Relays the `events` pending events of the table(s) and times it: a consumer process
    /// on the queue, then the relay from its start until every row is marked (so every
    /// publish was confirmed), then the relay's shutdown and the consumer's report. Fails
    /// when an event did not arrive.
    pub(crate) async fn drain(
        &self,
        events: usize,
        rooms: usize,
        consume: Consume,
    ) -> anyhow::Result<Drained> {
        let mut consumer =
            ConsumerProcess::start(&self.queue, events, rooms, false, consume).await?;
        let tables = self
            .outboxes
            .iter()
            .map(|o| o.store.table().as_str().to_owned());
        let mut cost = CostWatch::start(self.store.connection(), tables.collect()).await;
        process::reset_peak_rss();
        published::install();
        let target = published::so_far() + events as u64;
        let started = Instant::now();
        let broker = open_broker(&self.config).await?;
        let relays = start_relays(&self.config, &self.outboxes, &broker).await?;
        let deadline = Duration::from_secs(120).max(Duration::from_millis(events as u64 * 2));
        // Every row marked means every publish was confirmed: the broker holds every event.
        let asked = match self.wait_published(target, deadline).await {
            Ok(asked) => asked,
            Err(error) => {
                // Stopped before the error returns: a relay dropped with the runtime would
                // drop its PostgreSQL listener outside it (a panic, and the consumer child left).
                let _ = relays.shutdown(self.config.relay.shutdown_timeout).await;
                broker.close().await;
                return Err(error);
            }
        };
        let seconds = started.elapsed().as_secs_f64();
        cost.stop().await;
        let rss_mib = process::peak_rss_mib();
        relays.shutdown(self.config.relay.shutdown_timeout).await?;
        broker.close().await;
        // After the relay stopped: its connections' statistics are complete.
        let cost = cost.finish(events, asked).await;
        // The consumer checks that every event is there, once or more, in room order.
        if consume == Consume::Later {
            consumer.release()?;
        }
        let report = consumer.finish(deadline).await?;
        if report.delivered < events {
            bail!("only {} of {} events arrived", report.delivered, events);
        }
        Ok(Drained {
            seconds,
            rss_mib,
            report,
            cost,
        })
    }

    pub(crate) async fn teardown(self) -> anyhow::Result<()> {
        // Where the consumer declared the queue: the first broker of the list.
        let connection = baseline::connect().await?;
        let channel = connection.create_channel().await?;
        let _ = delete_queue(&channel, &self.queue).await;
        let _ = delete_exchange(&channel, &self.queue).await;
        let _ = channel.close(200, "done".into()).await;
        let _ = connection.close(200, "done".into()).await;
        for outbox in &self.outboxes {
            let t = outbox.store.table().as_str();
            let db = outbox.store.connection();
            for suffix in ["", "_migrations", "_lock"] {
                let _ = db
                    .execute_unprepared(&format!("DROP TABLE IF EXISTS {t}{suffix}"))
                    .await;
            }
            if db.get_database_backend() == DbBackend::Postgres {
                // The insert trigger's function outlives its table.
                let _ = db
                    .execute_unprepared(&format!("DROP FUNCTION IF EXISTS {t}_notify()"))
                    .await;
            }
        }
        if let Some(file) = self.sqlite_file {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
            }
            // The node lock's file beside the database (`<file>.outbox-relay-<hash>.lock`).
            let (dir, name) = (file.parent(), file.file_name());
            if let (Some(dir), Some(name)) = (dir, name.and_then(|name| name.to_str())) {
                let prefix = format!("{name}.outbox-relay-");
                for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                    if entry.file_name().to_string_lossy().starts_with(&prefix) {
                        let _ = std::fs::remove_file(entry.path());
                    }
                }
            }
        }
        Ok(())
    }
}

/// A JSON envelope of `bytes` bytes (more if the ids alone are longer).
pub(crate) fn event(run: &str, n: usize, rooms: usize, bytes: usize) -> NewEvent {
    let room_id = format!("room-{}", n % rooms);
    let event_id = format!("{run}-{n:08}");
    let mut envelope = format!(r#"{{"event_id":"{event_id}","room_id":"{room_id}","text":""#);
    envelope.push_str(&"x".repeat(bytes.saturating_sub(envelope.len() + 2)));
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

/// One question to `outbox`'s table: the position of a pending row (on PostgreSQL the
/// first at or above `from`; elsewhere any, as 0), or `None` when no row is pending.
///
/// PostgreSQL: the pending index's first entry at or above `from`. Without `ORDER BY id`
/// the planner, whose statistics saw a table of pending rows, scans the heap for the first
/// pending row, through every published one; from the index's head, each
/// question reads the pages of every entry the drain's marks left dead there (140 pages a
/// question at the end of 100,000 events). Not elsewhere: MariaDB and SQLite answer
/// `ORDER BY id` from the primary key, through every published row, and the pending index
/// without it.
async fn first_pending(outbox: &OpenOutbox, from: i64) -> anyhow::Result<Option<i64>> {
    let db = outbox.store.connection();
    let backend = db.get_database_backend();
    let table = outbox.store.table();
    let question = match backend {
        DbBackend::Postgres => Statement::from_sql_and_values(
            backend,
            format!(
                "SELECT id AS one FROM {table} WHERE status = 'pending' AND id >= $1 \
                 ORDER BY id LIMIT 1"
            ),
            [from.into()],
        ),
        DbBackend::MySql | DbBackend::Sqlite => Statement::from_string(
            backend,
            format!("SELECT 1 AS one FROM {table} WHERE status = 'pending' LIMIT 1"),
        ),
    };
    let Some(row) = db.query_one(question).await? else {
        return Ok(None);
    };
    Ok(Some(match backend {
        DbBackend::Postgres => row.try_get::<i64>("", "one")?,
        DbBackend::MySql | DbBackend::Sqlite => 0,
    }))
}

/// What one timed [`Bench::drain`] measured.
pub(crate) struct Drained {
    /// Relay start → every row marked.
    pub(crate) seconds: f64,
    /// Peak RSS of this process meanwhile.
    pub(crate) rss_mib: f64,
    /// The consumer's account.
    pub(crate) report: Report,
    /// CPU of this process (the relay), the database's and the broker's meanwhile, and
    /// the database's work.
    pub(crate) cost: Cost,
}

impl Drained {
    /// Fails when an event arrived after a later event of its room.
    pub(crate) fn check_order(&self) -> anyhow::Result<()> {
        if self.report.out_of_order > 0 {
            bail!(
                "{} events arrived out of room order",
                self.report.out_of_order
            );
        }
        Ok(())
    }
}

/// One `drain` run.
#[derive(Debug, Clone, Copy)]
struct DrainRun {
    seconds: f64,
    rate: f64,
    rss_mib: f64,
    duplicates: usize,
    /// The relay's CPU, the database's and the broker's.
    cost: Cost,
    /// The bare lapin publisher in the same run, when measured.
    baseline: Option<Baseline>,
}

impl DrainRun {
    fn ratio(&self) -> Option<f64> {
        self.baseline.map(|baseline| self.rate / baseline.rate)
    }

    /// All-in CPU per event ÷ the bare publisher's all-in CPU per message.
    fn all_in_ratio(&self) -> Option<f64> {
        Some(self.cost.all_in_us()? / self.baseline?.all_in_us()?)
    }
}

/// The median of `values` (the mean of the middle two for an even count).
pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_unstable_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

pub(crate) fn round(value: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (value * scale).round() / scale
}

/// Pre-fills, relays, measures, then the baseline and the ratio; `--runs` times.
pub async fn drain(args: DrainArgs) -> anyhow::Result<()> {
    let backend = format!("{:?}", args.backend).to_lowercase();
    let queue_type = baseline::queue_type()?;
    println!(
        "drain: {backend}, {} queue, {} events of {} bytes, {} rooms, {} outbox(es) with {} publishers each, batch {}, ordering {}, published rows: {}",
        queue_type.name(),
        args.events, args.envelope_bytes, args.rooms, args.outboxes, args.publishers, args.batch_size, args.ordering, args.published_rows
    );
    // One sink and one exporter for every run: spans of a run still queued when it ends
    // leave during the next (a second, at most: the exporter's batch delay).
    let tracing = match args.otlp {
        true => {
            let sink = SinkProcess::start()?;
            let traces = Traces::start(Some(&format!("{}/v1/traces", sink.endpoint)), "bench")?
                .context("an exporter")?;
            Some((sink, traces))
        }
        false => None,
    };
    let mut runs = Vec::with_capacity(args.runs);
    for _ in 0..args.runs.max(1) {
        let run = drain_once(&args).await?;
        println!(
            "  {:>7.0} events/s in {:.2} s | CPU {:.1} µs/event | peak RSS {:.1} MiB | {} duplicates{}",
            run.rate,
            run.seconds,
            run.cost.relay_us(),
            run.rss_mib,
            run.duplicates,
            match run.baseline {
                Some(baseline) => format!(
                    " | baseline {:.0} msg/s, CPU {:.1} µs/message | ratio {:.2}",
                    baseline.rate,
                    baseline.cpu_us,
                    run.rate / baseline.rate
                ),
                None => String::new(),
            }
        );
        println!("    cost: {}", run.cost.summary());
        if let Some(baseline) = run.baseline {
            println!(
                "    bare publisher: broker CPU {} µs/message | all in {} µs/message | all in ÷ bare {}",
                optional(baseline.broker_us, 1),
                optional(baseline.all_in_us(), 1),
                optional(run.all_in_ratio(), 2)
            );
        }
        let mut json = drain_json(&args, queue_type, &[run]);
        json["seconds"] = round(run.seconds, 3).into();
        println!("{json}");
        runs.push(run);
    }
    if runs.len() > 1 {
        let json = drain_json(&args, queue_type, &runs);
        println!(
            "  median of {}: {} events/s, CPU {} µs/event, peak RSS {} MiB{}, db CPU {} µs/event, \
             broker CPU {} µs/message, all in {} µs/event{}",
            runs.len(),
            json["events_per_sec"],
            json["cpu_us_per_event"],
            json["peak_rss_mib"],
            match json.get("ratio") {
                Some(ratio) => format!(", ratio {ratio}"),
                None => String::new(),
            },
            json["db_cpu_us_per_event"],
            json["broker_cpu_us_per_message"],
            json["all_in_cpu_us_per_event"],
            match json.get("all_in_ratio") {
                Some(ratio) => format!(", all in ÷ bare {ratio}"),
                None => String::new(),
            }
        );
        println!("{json}");
    }
    if let Some((sink, traces)) = tracing {
        traces.shutdown().await;
        let (spans, bytes) = sink.finish()?;
        let events = args.events * args.runs.max(1);
        println!(
            "  spans exported: {spans} for {events} events ({:.0} bytes of OTLP per span)",
            bytes as f64 / spans.max(1) as f64
        );
        println!(
            "{}",
            serde_json::json!({"scenario": "drain", "otlp_spans": spans, "events": events,
                "otlp_bytes_per_span": (bytes as f64 / spans.max(1) as f64).round()})
        );
    }
    println!(
        "  (events/s: relay start → every event confirmed by the broker and marked; CPU and \
         RSS: the relay's process; a consumer in its own process checks that every event \
         arrived and each room's first deliveries came in order)"
    );
    Ok(())
}

/// The JSON line of one run, or of the medians of several.
fn drain_json(args: &DrainArgs, queue_type: QueueType, runs: &[DrainRun]) -> serde_json::Value {
    let pick = |f: fn(&DrainRun) -> f64| median(runs.iter().map(f).collect());
    // The median of the runs that have the figure; `None` when none has it.
    let some = |f: &dyn Fn(&DrainRun) -> Option<f64>, digits| {
        let values: Vec<f64> = runs.iter().filter_map(f).collect();
        (!values.is_empty()).then(|| round(median(values), digits))
    };
    let mut json = serde_json::json!({
        "scenario": "drain", "backend": format!("{:?}", args.backend).to_lowercase(),
        "queue_type": queue_type.name(),
        "events": args.events, "rooms": args.rooms, "publishers": args.publishers,
        "batch_size": args.batch_size, "ordering": args.ordering, "runs": runs.len(),
        "published_rows": args.published_rows,
        "events_per_sec": pick(|r| r.rate).round(),
        "cpu_us_per_event": round(pick(|r| r.cost.relay_us()), 1),
        "peak_rss_mib": round(pick(|r| r.rss_mib), 1),
        "duplicates": runs.iter().map(|r| r.duplicates).sum::<usize>(),
        "consume_after": args.consume_after, "outboxes": args.outboxes, "otlp": args.otlp,
        "envelope_bytes": args.envelope_bytes,
        "mb_per_sec": round(pick(|r| r.rate) * args.envelope_bytes as f64 / 1e6, 1),
        "max_inflight_bytes": args.max_inflight_bytes,
    });
    // The whole cost: each figure the median of the runs' (rounded as one run's is).
    if let Some(first) = runs.first() {
        for (key, value) in first.cost.json() {
            let values: Vec<f64> = runs
                .iter()
                .filter_map(|r| r.cost.json().get(&key).and_then(serde_json::Value::as_f64))
                .collect();
            json[key.as_str()] = match value {
                serde_json::Value::Number(_) if !values.is_empty() => median(values).into(),
                other => other,
            };
        }
    }
    if runs.iter().all(|r| r.baseline.is_some()) && !runs.is_empty() {
        let baseline = |r: &DrainRun| r.baseline.unwrap_or_default();
        json["baseline_events_per_sec"] =
            pick(|r| r.baseline.unwrap_or_default().rate).round().into();
        json["ratio"] = round(pick(|r| r.ratio().unwrap_or(0.0)), 2).into();
        json["baseline_cpu_us_per_event"] =
            round(pick(|r| r.baseline.unwrap_or_default().cpu_us), 1).into();
        json["baseline_broker_cpu_us_per_message"] = some(&|r| baseline(r).broker_us, 1).into();
        json["baseline_all_in_cpu_us_per_message"] = some(&|r| baseline(r).all_in_us(), 1).into();
        json["all_in_ratio"] = some(&|r| r.all_in_ratio(), 2).into();
        json["baseline_channels"] = args.baseline_channels.into();
    }
    json
}

/// `value` rounded to `digits`, or `n/a`.
fn optional(value: Option<f64>, digits: usize) -> String {
    value.map_or("n/a".into(), |v| format!("{v:.digits$}"))
}

async fn drain_once(args: &DrainArgs) -> anyhow::Result<DrainRun> {
    let bench = Bench::setup(args.backend, |settings| {
        settings.relay.publishers = args.publishers;
        settings.relay.batch_size = args.batch_size;
        if let Some(bytes) = args.max_inflight_bytes {
            settings.relay.max_inflight_bytes = bytes;
        }
        settings.relay.ordering = args.ordering.as_str().into();
        settings.relay.published_rows = args.published_rows.as_str().into();
        if args.outboxes > 1 {
            // Same exchange, mapping and options for each: only the table differs.
            settings.outboxes = (0..args.outboxes)
                .map(|n| OutboxSettings {
                    name: format!("outbox{n}"),
                    table: format!("{}_{n}", settings.database.table),
                    ..OutboxSettings::default()
                })
                .collect();
        }
    })
    .await?;
    let run = bench.store.table().as_str().to_owned();
    bench
        .fill(&run, args.events, args.rooms, args.envelope_bytes as usize)
        .await?;
    let consume = if args.consume_after {
        Consume::Later
    } else {
        Consume::Now
    };
    let drained = bench.drain(args.events, args.rooms, consume).await?;
    bench.teardown().await?;
    // Room order is promised under `per_room` only; `none` may deliver a room out of order.
    if args.ordering == "per_room" {
        drained.check_order()?;
    }
    let baseline = if args.no_baseline {
        None
    } else {
        let channels = usize::from(args.baseline_channels);
        Some(baseline::run(args.events, args.envelope_bytes as usize, consume, channels).await?)
    };
    Ok(DrainRun {
        seconds: drained.seconds,
        rate: args.events as f64 / drained.seconds,
        rss_mib: drained.rss_mib,
        duplicates: drained.report.duplicates,
        cost: drained.cost,
        baseline,
    })
}

/// `drain` over publishers × batch sizes: a table of medians.
pub async fn matrix(args: MatrixArgs) -> anyhow::Result<()> {
    let backend = format!("{:?}", args.backend).to_lowercase();
    let queue_type = baseline::queue_type()?;
    println!(
        "matrix: {backend}, {} queue, {} events, {} rooms, ordering {}, median of {} runs per cell",
        queue_type.name(),
        args.events,
        args.rooms,
        args.ordering,
        args.runs
    );
    println!("  publishers  batch   events/s  baseline  ratio  CPU µs/event");
    for &batch_size in &args.batch_sizes {
        for &publishers in &args.publishers {
            let cell = DrainArgs {
                backend: args.backend,
                events: args.events,
                rooms: args.rooms,
                publishers,
                batch_size,
                ordering: args.ordering.clone(),
                published_rows: "keep".into(),
                no_baseline: false,
                runs: args.runs,
                consume_after: false,
                outboxes: 1,
                otlp: false,
                envelope_bytes: 512,
                baseline_channels: 1,
                max_inflight_bytes: None,
            };
            let mut runs = Vec::with_capacity(args.runs);
            for _ in 0..args.runs.max(1) {
                runs.push(drain_once(&cell).await?);
            }
            let json = drain_json(&cell, queue_type, &runs);
            println!(
                "  {publishers:>10}  {batch_size:>5}  {:>9}  {:>8}  {:>5}  {:>12}",
                json["events_per_sec"],
                json["baseline_events_per_sec"],
                json["ratio"],
                json["cpu_us_per_event"]
            );
            println!("{json}");
        }
    }
    Ok(())
}

/// Rows per prefill INSERT.
const PREFILL_CHUNK: usize = 500;
/// Envelope bytes per pre-fill statement, at most (one event when larger).
const PREFILL_BYTES: usize = 8 * 1024 * 1024;
