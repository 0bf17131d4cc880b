//! `outbox-bench adopt`: adopting a live Debezium-shaped table. A table of `--rows` rows,
//! producers inserting `--rate` events/s through it all (`--producers` connections, each
//! one commit at a time at `rate / producers`), a long transaction holding a lock on the
//! table for the first `--long-transaction` of the migration; then `migrate` adopts it
//! with a `position` column added. Reports how long `migrate` took and the producers'
//! worst (and 99th percentile) insert latency while it ran: the goal is no insert waiting
//! more than 200 ms. What the producers' sessions waited for, sampled from the server
//! meanwhile, tells a lock wait from a commit's I/O ([`waits`]).

mod waits;

use anyhow::Context as _;
use clap::Args;
use outbox_store::{ColumnName, Columns, TableName};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement, TransactionTrait};
use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// `adopt` options.
#[derive(Debug, Args)]
pub struct AdoptArgs {
    /// Rows in the table before the migration.
    #[arg(long, default_value_t = 1_000_000)]
    rows: u64,
    /// Producer inserts per second during the migration, all producers together.
    #[arg(long, default_value_t = 500)]
    rate: u64,
    /// Producer connections, each inserting `rate / producers` per second, one commit at
    /// a time (one connection waits for each commit's flush: some 100-200 inserts/s here).
    #[arg(long, default_value_t = 8)]
    producers: u64,
    /// Database URL (PostgreSQL or MySQL/MariaDB).
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    database_url: String,
    /// How long a transaction elsewhere holds a lock on the table once the migration
    /// starts (0: none).
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    long_transaction: Duration,
    /// How long the producers insert before the migration (no relay trigger yet): the
    /// latency of the table as it was.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    before: Duration,
    /// How long they go on inserting after it (the table adopted, its insert trigger in
    /// place, no DDL running): what the migration's own statements cost is the
    /// difference.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    after: Duration,
}

/// One producer insert: its session, when it started, how long it took.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Insert {
    pub(crate) session: i64,
    pub(crate) started: Instant,
    pub(crate) took: Duration,
}

const SLOW: Duration = Duration::from_millis(200);

/// Runs the scenario and prints its figures (a table and one JSON line).
pub async fn run(args: AdoptArgs) -> anyhow::Result<()> {
    let producers = args.producers.max(1);
    let db = outbox_store::connect(&args.database_url, 8)
        .await?
        .into_connection();
    let backend = db.get_database_backend();
    let table = TableName::parse(&format!("bench_adopt_{}", std::process::id()))?;
    let t = table.as_str().to_owned();
    let filling = Instant::now();
    let filled = create_and_fill(&db, backend, &t, args.rows).await;
    let outcome = match filled {
        Ok(()) => {
            eprintln!(
                "adopt: {} rows in {t} (filled in {:.1} s); migrating under {producers} \
                 producers of {} events/s in all",
                args.rows,
                filling.elapsed().as_secs_f64(),
                args.rate
            );
            measure(&args, &db, backend, &table, producers).await
        }
        Err(error) => Err(error),
    };
    let drop = format!("DROP TABLE IF EXISTS {t}, {t}_migrations, {t}_lock");
    let drop = match backend {
        DbBackend::Postgres => format!("{drop} CASCADE"),
        _ => drop,
    };
    db.execute(Statement::from_string(backend, drop)).await?;
    let report = outcome?;
    report.print(&args, backend, producers);
    Ok(())
}

/// What one run measured.
struct Report {
    /// Before, during and after the migration.
    windows: [(Instant, Instant); 3],
    /// Every insert of the run.
    inserts: Vec<Insert>,
    waits: waits::Waits,
    load: (String, String),
}

async fn measure(
    args: &AdoptArgs,
    db: &DatabaseConnection,
    backend: DbBackend,
    table: &TableName,
    producers: u64,
) -> anyhow::Result<Report> {
    let t = table.as_str();
    let stop = Rc::new(Cell::new(false));
    let period = Duration::from_secs_f64(producers as f64 / args.rate.max(1) as f64);
    let begin = Instant::now() + Duration::from_millis(100);
    let mut tasks = Vec::new();
    let mut sessions = Vec::new();
    for i in 0..producers {
        let connection = outbox_store::connect(&args.database_url, 1)
            .await?
            .into_connection();
        let session = waits::session_id(&connection).await?;
        sessions.push(session);
        // Staggered: the producers' inserts spread evenly over each period.
        let first = begin + period.mul_f64(i as f64 / producers as f64);
        tasks.push(actix_rt::spawn(produce(
            connection,
            backend,
            t.to_owned(),
            session,
            first,
            period,
            stop.clone(),
        )));
    }
    let sampler = waits::Sampler::start(&args.database_url, t, sessions);
    let lag = waits::Lag::start();
    tokio::time::sleep_until((begin + args.before).into()).await;
    // A long transaction that has read the table: an ALTER must wait for it.
    let long = if args.long_transaction.is_zero() {
        None
    } else {
        let txn = db.begin().await?;
        txn.execute(Statement::from_string(
            backend,
            format!("SELECT id FROM {t} LIMIT 1"),
        ))
        .await?;
        let hold = args.long_transaction;
        Some(actix_rt::spawn(async move {
            tokio::time::sleep(hold).await;
            let _ = txn.rollback().await;
        }))
    };
    let load_before = loadavg();
    let started = Instant::now();
    let migrated = outbox_store::migrate_columns(db, table, &debezium_columns()).await;
    let ended = Instant::now();
    let load_after = loadavg();
    if migrated.is_ok() {
        tokio::time::sleep(args.after).await;
    }
    stop.set(true);
    let mut inserts = Vec::new();
    for task in tasks {
        inserts.extend(task.await.context("a producer")??);
    }
    if let Some(long) = long {
        let _ = long.await;
    }
    let mut waits = sampler.stop();
    waits.lags = lag.stop().await;
    migrated.context("migrate")?;
    Ok(Report {
        windows: [
            (begin, started),
            (started, ended),
            (ended, ended + args.after),
        ],
        inserts,
        waits,
        load: (load_before, load_after),
    })
}

/// One producer: an insert every `period` from `first`, one commit at a time on its own
/// connection, until `stop`.
async fn produce(
    db: DatabaseConnection,
    backend: DbBackend,
    t: String,
    session: i64,
    first: Instant,
    period: Duration,
    stop: Rc<Cell<bool>>,
) -> anyhow::Result<Vec<Insert>> {
    let mut inserts = Vec::new();
    let mut next = first;
    let mut n = 0u64;
    tokio::time::sleep_until(next.into()).await;
    while !stop.get() {
        n += 1;
        let sql = insert_sql(backend, &t, &format!("p{session}-{n}"));
        let started = Instant::now();
        db.execute(Statement::from_string(backend, sql))
            .await
            .with_context(|| format!("producer {session}: insert {n}"))?;
        inserts.push(Insert {
            session,
            started,
            took: started.elapsed(),
        });
        next += period;
        tokio::time::sleep_until(next.into()).await;
    }
    let _ = db.close().await;
    Ok(inserts)
}

/// The inserts that started in one window, and their latencies.
struct Stats {
    count: usize,
    rate: f64,
    worst: Duration,
    p99: Duration,
    over: usize,
}

impl Stats {
    fn of(inserts: &[Insert], (from, to): (Instant, Instant)) -> Self {
        let mut sorted: Vec<Duration> = (inserts.iter())
            .filter(|insert| insert.started >= from && insert.started < to)
            .map(|insert| insert.took)
            .collect();
        sorted.sort();
        Self {
            count: sorted.len(),
            rate: sorted.len() as f64 / (to - from).as_secs_f64().max(1e-9),
            worst: sorted.last().copied().unwrap_or_default(),
            p99: sorted
                .get((sorted.len() * 99 / 100).min(sorted.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default(),
            over: sorted.iter().filter(|took| **took > SLOW).count(),
        }
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "inserts": self.count,
            "rate_reached": self.rate,
            "worst_insert_ms": self.worst.as_secs_f64() * 1e3,
            "p99_insert_ms": self.p99.as_secs_f64() * 1e3,
            "inserts_over_200ms": self.over,
        })
    }
}

impl Report {
    fn print(&self, args: &AdoptArgs, backend: DbBackend, producers: u64) {
        let [before, during, after] = self.windows.map(|window| Stats::of(&self.inserts, window));
        let (started, ended) = self.windows[1];
        let took = ended - started;
        println!("backend            {backend:?}");
        println!("rows               {}", args.rows);
        println!(
            "producers          {producers} connections, {}/s asked in all",
            args.rate
        );
        println!("migrate took       {:.2} s", took.as_secs_f64());
        println!(
            "load average       {} (start), {} (end)",
            self.load.0, self.load.1
        );
        println!("window   inserts   reached/s   worst ms   p99 ms   > 200 ms");
        for (name, stats) in [("before", &before), ("during", &during), ("after", &after)] {
            println!(
                "{name:<8} {:>7} {:>11.0} {:>10.1} {:>8.1} {:>10}",
                stats.count,
                stats.rate,
                stats.worst.as_secs_f64() * 1e3,
                stats.p99.as_secs_f64() * 1e3,
                stats.over
            );
        }
        let during_inserts: Vec<Insert> = (self.inserts.iter())
            .filter(|insert| insert.started >= started && insert.started < ended)
            .copied()
            .collect();
        for (name, (from, to)) in ["before", "during", "after"].iter().zip(self.windows) {
            self.waits.print_tally(name, from, to);
        }
        (self.waits).print_slowest(&during_inserts, started, SLOW);
        println!(
            "{}",
            serde_json::json!({
                "scenario": "adopt",
                "backend": format!("{backend:?}"),
                "rows": args.rows,
                "rate": args.rate,
                "producers": producers,
                "long_transaction_s": args.long_transaction.as_secs_f64(),
                "migrate_s": took.as_secs_f64(),
                "inserts": during.count,
                "rate_reached": during.rate,
                "worst_insert_ms": during.worst.as_secs_f64() * 1e3,
                "p99_insert_ms": during.p99.as_secs_f64() * 1e3,
                "inserts_over_200ms": during.over,
                "before": before.json(),
                "after": after.json(),
                "load_start": self.load.0,
                "load_end": self.load.1,
            })
        );
    }
}

/// The load averages of `/proc/loadavg` (1, 5, 15 min), or "?" where there is none.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "?".into())
}

/// Debezium's table: `id` a UUID, `aggregatetype`, `aggregateid`, `type`, `payload`.
async fn create_and_fill(
    db: &DatabaseConnection,
    backend: DbBackend,
    t: &str,
    rows: u64,
) -> anyhow::Result<()> {
    let (create, fill) = match backend {
        DbBackend::Postgres => (
            format!(
                "CREATE TABLE {t} (id UUID PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL, \
                 aggregateid VARCHAR(255) NOT NULL, type VARCHAR(255) NOT NULL, payload JSONB NOT NULL)"
            ),
            format!(
                "INSERT INTO {t} SELECT gen_random_uuid(), 'order', 'o-' || (g % 1000), 'OrderCreated', \
                 jsonb_build_object('n', g, 'note', repeat('x', 200)) FROM generate_series(1, {rows}) g"
            ),
        ),
        DbBackend::MySql => (
            format!(
                "CREATE TABLE {t} (id CHAR(36) NOT NULL PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL, \
                 aggregateid VARCHAR(255) NOT NULL, type VARCHAR(255) NOT NULL, payload JSON NOT NULL)"
            ),
            format!(
                "INSERT INTO {t} SELECT UUID(), 'order', CONCAT('o-', seq % 1000), 'OrderCreated', \
                 JSON_OBJECT('n', seq, 'note', REPEAT('x', 200)) FROM seq_1_to_{rows}"
            ),
        ),
        DbBackend::Sqlite => anyhow::bail!("adopt measures PostgreSQL and MySQL/MariaDB"),
    };
    db.execute(Statement::from_string(backend, create)).await?;
    db.execute(Statement::from_string(backend, fill)).await?;
    if backend == DbBackend::Postgres {
        // What a live table has: statistics and a visibility map (autovacuum would get
        // there on its own some time after the fill).
        db.execute(Statement::from_string(
            backend,
            format!("VACUUM ANALYZE {t}"),
        ))
        .await?;
        // And what it has not: a gigabyte of pages just written, which the kernel would
        // otherwise write back during the measurement (its fill is long past). A
        // checkpoint writes and syncs them (a superuser's or `pg_checkpoint`'s right).
        if let Err(error) = db
            .execute(Statement::from_string(backend, "CHECKPOINT".to_owned()))
            .await
        {
            eprintln!("adopt: no CHECKPOINT after the fill ({error}); the pages just written may be written back during the measurement");
        }
    }
    Ok(())
}

fn insert_sql(backend: DbBackend, t: &str, key: &str) -> String {
    match backend {
        DbBackend::Postgres => format!(
            "INSERT INTO {t} (id, aggregatetype, aggregateid, type, payload) \
             VALUES (gen_random_uuid(), 'order', '{key}', 'OrderCreated', '{{\"n\":1}}')"
        ),
        _ => format!(
            "INSERT INTO {t} (id, aggregatetype, aggregateid, type, payload) \
             VALUES (UUID(), 'order', '{key}', 'OrderCreated', '{{\"n\":1}}')"
        ),
    }
}

fn debezium_columns() -> Columns {
    let name = |column: &str| ColumnName::parse(column).expect("a valid name");
    Columns {
        position: name("seq"),
        event_id: name("id"),
        event_type: name("type"),
        key: name("aggregateid"),
        payload: name("payload"),
        headers: None,
        created_at: name("created_at"),
        extra: Vec::new(),
    }
}
