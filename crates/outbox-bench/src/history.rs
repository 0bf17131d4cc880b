//! The `history` scenario: how the drain rate holds up when the table keeps its published
//! rows (retention off, the default). One drain on an empty table, then a table pre-filled
//! with `--rows` published rows server-side and `--runs` consecutive drains on it, with no
//! manual VACUUM between them, each adding its events to the history. The pre-fill is
//! settled once before the runs (PostgreSQL `VACUUM (ANALYZE)`, MariaDB and SQLite `ANALYZE`),
//! as a table that has kept its history for days is: run 1 then measures that history, not
//! a first vacuum over millions of freshly inserted rows.

use crate::consumer::Consume;
use crate::scenario::{round, Backend, Bench, Drained};
use anyhow::Context as _;
use clap::Args;
use outbox_core::{ClaimRequest, Ordering, OutboxStore as _};
use sea_orm::ConnectionTrait as _;
use std::time::Duration;
use std::time::Instant;

/// `history` options.
#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// Database backend.
    #[arg(long, value_enum, default_value = "postgres")]
    backend: Backend,
    /// Published rows pre-filled before the history runs.
    #[arg(long, default_value_t = 1_000_000)]
    rows: u64,
    /// Pending events per drain.
    #[arg(long, default_value_t = 100_000)]
    events: usize,
    /// Consecutive drains on the table with history.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    runs: u64,
    /// Rooms the history and the events are spread over.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..))]
    rooms: u64,
    /// Bytes of each envelope, history and events alike (at least 64).
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(64..))]
    envelope_bytes: u64,
    /// Let the consumer read the queue only after each drain (RabbitMQ then writes each
    /// persistent message to disk before it confirms it).
    #[arg(long)]
    consume_after: bool,
    /// Run the history drains with `relay.retention` set to this (e.g. `1m`): the Janitor
    /// deletes the published rows older than that meanwhile, the pre-filled history included.
    #[arg(long)]
    retention: Option<String>,
    /// PostgreSQL: after the runs, print the claim's plan (`EXPLAIN (ANALYZE, BUFFERS)`)
    /// from the pending index's head and from a scan floor, on the table with its history.
    #[arg(long)]
    explain: bool,
}

/// Published rows per `INSERT … SELECT`: one statement per chunk keeps each transaction,
/// and on SQLite the write lock, to seconds.
const PREFILL_ROWS: u64 = 250_000;

/// The empty-table drain, the pre-fill, the history drains; one line per run and a JSON line.
pub async fn run(args: HistoryArgs) -> anyhow::Result<()> {
    let backend = format!("{:?}", args.backend).to_lowercase();
    let queue_type = crate::baseline::queue_type()?.name();
    println!(
        "history: {backend}, {queue_type} queue, {} published rows, {} runs of {} events of {} bytes, {} rooms, consume {}",
        args.rows,
        args.runs,
        args.events,
        args.envelope_bytes,
        args.rooms,
        if args.consume_after { "after each drain" } else { "during the drain" }
    );
    let consume = if args.consume_after {
        Consume::Later
    } else {
        Consume::Now
    };
    let (events, rooms, bytes) = (
        args.events,
        args.rooms as usize,
        args.envelope_bytes as usize,
    );

    let empty = Bench::setup(args.backend, |_| {}).await?;
    let prefix = empty.store.table().as_str().to_owned();
    empty.fill(&prefix, events, rooms, bytes).await?;
    let drained = empty.drain(events, rooms, consume).await?;
    empty.teardown().await?;
    drained.check_order()?;
    let empty_rate = rate(&drained, events);
    print_run("empty table", 0, &drained, empty_rate);
    let empty_cost = cost_json(&drained);

    let bench = Bench::setup(args.backend, |settings| {
        if let Some(retention) = &args.retention {
            settings.relay.retention = retention.as_str().into();
        }
    })
    .await?;
    let started = Instant::now();
    prefill_published(&bench, args.rows, args.rooms, args.envelope_bytes).await?;
    let prefill_seconds = started.elapsed().as_secs_f64();
    println!(
        "  pre-filled {} published rows in {prefill_seconds:.1} s ({:.0} rows/s)",
        args.rows,
        args.rows as f64 / prefill_seconds.max(1e-9)
    );
    let started = Instant::now();
    settle(&bench).await?;
    let settle_seconds = started.elapsed().as_secs_f64();
    println!("  settled the pre-fill in {settle_seconds:.1} s");
    let mut rates = Vec::new();
    let mut health = Vec::new();
    let mut costs = Vec::new();
    let mut duplicates = drained.report.duplicates;
    for k in 1..=args.runs {
        let history = args.rows + (k - 1) * events as u64;
        let prefix = format!("{}-r{k}", bench.store.table());
        bench.fill(&prefix, events, rooms, bytes).await?;
        let drained = match bench.drain(events, rooms, consume).await {
            Ok(drained) => drained,
            Err(error) => {
                let _ = bench.teardown().await;
                return Err(error.context(format!("history run {k}")));
            }
        };
        drained.check_order()?;
        duplicates += drained.report.duplicates;
        let rate = rate(&drained, events);
        print_run(
            &format!("history run {k}/{}", args.runs),
            history,
            &drained,
            rate,
        );
        rates.push(rate);
        costs.push(cost_json(&drained));
        let after = table_health(&bench).await?;
        println!("  {:<18} {after}", "");
        health.push(after);
    }
    let plans = match args.explain {
        true => explain(&bench, rooms, bytes).await,
        false => Ok(()),
    };
    bench.teardown().await?;
    plans?;

    let slowest = rates.iter().copied().fold(f64::INFINITY, f64::min);
    let worst_ratio = slowest / empty_rate;
    println!(
        "  worst ratio {worst_ratio:.2} (slowest history run ÷ empty table); events/s: relay \
         start → every event confirmed and marked"
    );
    println!(
        "{}",
        serde_json::json!({
            "scenario": "history", "backend": backend, "queue_type": queue_type,
            "history_rows": args.rows,
            "events": events, "runs": args.runs, "rooms": args.rooms,
            "envelope_bytes": args.envelope_bytes, "consume_after": args.consume_after,
            "prefill_seconds": round(prefill_seconds, 1),
            "settle_seconds": round(settle_seconds, 1),
            "empty_events_per_sec": empty_rate.round(),
            "history_events_per_sec": rates.iter().map(|r| r.round()).collect::<Vec<_>>(),
            "worst_ratio": round(worst_ratio, 2),
            "retention": args.retention,
            "table_after_runs": health,
            "empty_cost": empty_cost,
            "history_cost": costs,
            "duplicates": duplicates,
        })
    );
    Ok(())
}

fn rate(drained: &Drained, events: usize) -> f64 {
    events as f64 / drained.seconds
}

fn print_run(label: &str, history: u64, drained: &Drained, rate: f64) {
    println!(
        "  {label:<18} {history:>9} published rows before | {rate:>7.0} events/s in {:.2} s | CPU {:.1} µs/event | peak RSS {:.1} MiB | {} duplicates",
        drained.seconds,
        drained.cost.relay_us(),
        drained.rss_mib,
        drained.report.duplicates,
    );
    println!("  {:<18} cost: {}", "", drained.cost.summary());
}

/// A run's cost fields, with the relay's CPU among them.
fn cost_json(drained: &Drained) -> serde_json::Value {
    let mut fields = drained.cost.json();
    fields.insert(
        "cpu_us_per_event".into(),
        round(drained.cost.relay_us(), 1).into(),
    );
    fields.into()
}

/// What the runs leave behind that only housekeeping removes, read after a run:
/// PostgreSQL's dead row versions and how many updates were HOT (no index entry), MariaDB's
/// undo history not yet purged (InnoDB's history list: until purged, the old versions and
/// delete-marked index entries stay), SQLite's free pages.
async fn table_health(bench: &Bench) -> anyhow::Result<serde_json::Value> {
    let db = bench.store.connection();
    let t = bench.store.table();
    let one = |sql: String| async move {
        db.query_one(sea_orm::Statement::from_string(
            db.get_database_backend(),
            sql,
        ))
        .await?
        .context("no answer")
    };
    Ok(match bench.backend {
        Backend::Postgres => {
            // The statistics reach the view within a second of each transaction's end.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let row = one(format!(
                "SELECT n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd, autovacuum_count \
                 FROM pg_stat_user_tables WHERE relid = to_regclass('{t}')"
            ))
            .await?;
            serde_json::json!({
                "live_rows": row.try_get::<i64>("", "n_live_tup")?,
                "dead_versions": row.try_get::<i64>("", "n_dead_tup")?,
                "updates": row.try_get::<i64>("", "n_tup_upd")?,
                "hot_updates": row.try_get::<i64>("", "n_tup_hot_upd")?,
                "autovacuums": row.try_get::<i64>("", "autovacuum_count")?,
            })
        }
        Backend::Mysql => {
            let row = one("SELECT CAST(variable_value AS SIGNED) AS n \
                 FROM information_schema.global_status \
                 WHERE variable_name = 'INNODB_HISTORY_LIST_LENGTH'"
                .to_owned())
            .await?;
            serde_json::json!({ "innodb_history_list_length": row.try_get::<i64>("", "n")? })
        }
        Backend::Sqlite => {
            let row = one("SELECT f.freelist_count AS free, p.page_count AS pages \
                 FROM pragma_freelist_count() f, pragma_page_count() p"
                .to_owned())
            .await?;
            serde_json::json!({
                "free_pages": row.try_get::<i32>("", "free")?,
                "pages": row.try_get::<i32>("", "pages")?,
            })
        }
    })
}

/// Adds `rows` published rows, in `rooms` rooms, with one server-side `INSERT … SELECT`
/// over a generated series per chunk: PostgreSQL `generate_series`, MariaDB the SEQUENCE
/// engine's `seq_A_to_B`, SQLite a recursive CTE. Ids come before the events drained next,
/// as a table's history does.
async fn prefill_published(
    bench: &Bench,
    rows: u64,
    rooms: u64,
    envelope_bytes: u64,
) -> anyhow::Result<()> {
    let db = bench.store.connection();
    let t = bench.store.table();
    let columns = "event_id, event_type, room_id, envelope, status, published_at";
    let kind = "'room.message.posted'";
    for first in (1..=rows).step_by(PREFILL_ROWS as usize) {
        let last = rows.min(first + PREFILL_ROWS - 1);
        let sql = match bench.backend {
            Backend::Postgres => format!(
                "INSERT INTO {t} ({columns}) SELECT 'history-' || n, {kind}, \
                 'room-' || (n % {rooms}), repeat('x', {envelope_bytes}), 'published', now() \
                 FROM generate_series({first}, {last}) AS n"
            ),
            Backend::Mysql => format!(
                "INSERT INTO {t} ({columns}) SELECT CONCAT('history-', seq), {kind}, \
                 CONCAT('room-', seq % {rooms}), REPEAT('x', {envelope_bytes}), 'published', \
                 CURRENT_TIMESTAMP(6) FROM seq_{first}_to_{last}"
            ),
            Backend::Sqlite => format!(
                "WITH RECURSIVE series(n) AS (SELECT {first} UNION ALL \
                 SELECT n + 1 FROM series WHERE n < {last}) \
                 INSERT INTO {t} ({columns}) SELECT 'history-' || n, {kind}, \
                 'room-' || (n % {rooms}), \
                 substr(replace(hex(zeroblob({envelope_bytes})), '0', 'x'), 1, {envelope_bytes}), \
                 'published', strftime('%Y-%m-%d %H:%M:%f', 'now') FROM series"
            ),
        };
        db.execute_unprepared(&sql).await.with_context(|| {
            format!(
                "pre-filling published rows {first}–{last}{}",
                match bench.backend {
                    Backend::Mysql => " (MariaDB's SEQUENCE engine is needed for seq_A_to_B)",
                    _ => "",
                }
            )
        })?;
    }
    Ok(())
}

/// Settles the pre-filled history as days of ordinary housekeeping would have: PostgreSQL
/// `VACUUM (ANALYZE)` (hint bits, visibility map, statistics), MariaDB and SQLite `ANALYZE`
/// (statistics; neither leaves anything for a vacuum after plain inserts).
async fn settle(bench: &Bench) -> anyhow::Result<()> {
    let db = bench.store.connection();
    let t = bench.store.table();
    let sql = match bench.backend {
        Backend::Postgres => format!("VACUUM (ANALYZE) {t}"),
        Backend::Mysql => format!("ANALYZE TABLE {t}"),
        Backend::Sqlite => format!("ANALYZE {t}"),
    };
    db.execute_unprepared(&sql)
        .await
        .with_context(|| format!("settling the pre-fill: {sql}"))?;
    Ok(())
}

/// `--explain`: 1,000 new pending rows on the table the runs left (its history, and the
/// dead entries of the last run's marks: no vacuum), one claim from the head as the relay's
/// first (it kills the dead entries it passes), then the plans of the next claim from the
/// head and from the floor that first claim returned. Nothing is leased by the plans.
async fn explain(bench: &Bench, rooms: usize, bytes: usize) -> anyhow::Result<()> {
    let prefix = format!("{}-explain", bench.store.table());
    bench.fill(&prefix, 1_000, rooms, bytes).await?;
    let request = |node: &str, floor| ClaimRequest {
        node_id: node.into(),
        limit: 100,
        lease: Duration::from_secs(30),
        ordering: Ordering::PerRoom,
        max_bytes: Some(64 << 20),
        floor,
    };
    let first = bench
        .store
        .claim_with_floor(&request("first", None))
        .await?;
    println!(
        "  explain: a first claim from the head leased {} rows; floor {:?}",
        first.records.len(),
        first.floor
    );
    for (label, floor) in [("from the head", None), ("from the floor", first.floor)] {
        match bench.store.explain_claim(&request("second", floor)).await? {
            Some(plan) => println!("  claim plan {label}:\n{plan}"),
            None => println!("  claim plans: PostgreSQL only"),
        }
    }
    Ok(())
}
