//! `outbox-bench adopt`: adopting a live Debezium-shaped table. A table of `--rows` rows,
//! a producer inserting `--rate` events/s through it all, a long transaction holding a
//! lock on the table for the first `--long-transaction` of the migration; then `migrate`
//! adopts it with a `position` column added. Reports how long `migrate` took and the
//! producer's worst (and 99th percentile) insert latency while it ran: the goal is no
//! insert waiting more than 200 ms.

use anyhow::Context as _;
use clap::Args;
use outbox_store::{ColumnName, Columns, TableName};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement, TransactionTrait};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// `adopt` options.
#[derive(Debug, Args)]
pub struct AdoptArgs {
    /// Rows in the table before the migration.
    #[arg(long, default_value_t = 1_000_000)]
    rows: u64,
    /// Producer inserts per second during the migration.
    #[arg(long, default_value_t = 500)]
    rate: u64,
    /// Database URL (PostgreSQL or MySQL/MariaDB).
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    database_url: String,
    /// How long a transaction elsewhere holds a lock on the table once the migration
    /// starts (0: none).
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    long_transaction: Duration,
}

/// Runs the scenario and prints its figures (a table and one JSON line).
pub async fn run(args: AdoptArgs) -> anyhow::Result<()> {
    let db = outbox_store::connect(&args.database_url, 8).await?;
    let backend = db.get_database_backend();
    let table = TableName::parse(&format!("bench_adopt_{}", std::process::id()))?;
    let t = table.as_str().to_owned();
    create_and_fill(&db, backend, &t, args.rows).await?;
    eprintln!(
        "adopt: {} rows in {t}; migrating under a producer of {} events/s",
        args.rows, args.rate
    );

    // The producer: one insert every 1/rate s, its latency recorded.
    let latencies: Rc<RefCell<Vec<Duration>>> = Rc::default();
    let stop = Rc::new(std::cell::Cell::new(false));
    let producer = {
        let (db, t, latencies, stop) = (db.clone(), t.clone(), latencies.clone(), stop.clone());
        let period = Duration::from_secs_f64(1.0 / args.rate.max(1) as f64);
        actix_rt::spawn(async move {
            let mut n = 0u64;
            let mut next = Instant::now();
            while !stop.get() {
                n += 1;
                let sql = insert_sql(backend, &t, &format!("p{n}"));
                let started = Instant::now();
                let _ = db.execute(Statement::from_string(backend, sql)).await;
                latencies.borrow_mut().push(started.elapsed());
                next += period;
                tokio::time::sleep_until(next.into()).await;
            }
        })
    };
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
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = latencies.borrow().len();
    let started = Instant::now();
    let migrated = outbox_store::migrate_columns(&db, &table, &debezium_columns()).await;
    let took = started.elapsed();
    let during: Vec<Duration> = latencies.borrow()[before..].to_vec();
    stop.set(true);
    let _ = producer.await;
    if let Some(long) = long {
        let _ = long.await;
    }
    let drop = format!("DROP TABLE IF EXISTS {t}, {t}_migrations, {t}_lock");
    let drop = match backend {
        DbBackend::Postgres => format!("{drop} CASCADE"),
        _ => drop,
    };
    db.execute(Statement::from_string(backend, drop)).await?;
    migrated.context("migrate")?;

    let mut sorted = during.clone();
    sorted.sort();
    let worst = sorted.last().copied().unwrap_or_default();
    let p99 = sorted
        .get((sorted.len() * 99 / 100).min(sorted.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default();
    let over = sorted
        .iter()
        .filter(|d| **d > Duration::from_millis(200))
        .count();
    println!("backend            {backend:?}");
    println!("rows               {}", args.rows);
    println!("producer rate      {}/s", args.rate);
    println!("migrate took       {:.2} s", took.as_secs_f64());
    println!("inserts during     {}", sorted.len());
    println!("worst insert       {:.1} ms", worst.as_secs_f64() * 1e3);
    println!("p99 insert         {:.1} ms", p99.as_secs_f64() * 1e3);
    println!("inserts > 200 ms   {over}");
    println!(
        "{}",
        serde_json::json!({
            "scenario": "adopt",
            "backend": format!("{backend:?}"),
            "rows": args.rows,
            "rate": args.rate,
            "long_transaction_s": args.long_transaction.as_secs_f64(),
            "migrate_s": took.as_secs_f64(),
            "inserts": sorted.len(),
            "worst_insert_ms": worst.as_secs_f64() * 1e3,
            "p99_insert_ms": p99.as_secs_f64() * 1e3,
            "inserts_over_200ms": over,
        })
    );
    Ok(())
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
