//! The producers of one state: their connections, opened on a thread and a runtime of
//! their own, each committing one event per autocommit `INSERT`, and what they measured.

use super::ROOMS;
use crate::scenario::event;
use anyhow::Context as _;
use sea_orm::{
    ConnectOptions, ConnectionTrait as _, Database, DatabaseConnection, DbBackend, Statement,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Inserts of each connection before its window opens: they prepare the statement and
/// fill the session's caches (PostgreSQL compiles the trigger's function at its first call).
const WARM_UP: usize = 5;
/// An open-loop state reached its offered rate when its commits/s are at least this share.
const REACHED: f64 = 0.95;

/// What the producers of one state measured in its window.
#[derive(Debug, Clone, Default)]
pub(super) struct Window {
    /// Commits that ended within the window.
    pub(super) commits: usize,
    pub(super) seconds: f64,
    pub(super) p50_ms: f64,
    pub(super) p99_ms: f64,
    /// Statements that failed (SQLite: a lock not had within the busy timeout).
    pub(super) errors: u64,
    pub(super) first_error: Option<String>,
    /// Open loop: whether the commits/s reached [`REACHED`] of the offered rate.
    pub(super) reached: bool,
}

impl Window {
    pub(super) fn rate(&self) -> f64 {
        self.commits as f64 / self.seconds.max(1e-9)
    }
}

/// What the producers of one state do.
pub(super) struct Plan {
    pub(super) url: String,
    pub(super) backend: DbBackend,
    /// The INSERT of one event.
    pub(super) sql: String,
    pub(super) connections: u32,
    pub(super) seconds: u64,
    /// Commits/s of all the connections together; `None`: each as fast as it can.
    pub(super) rate: Option<u64>,
    /// The event ids' prefix, one per state of the run.
    pub(super) prefix: String,
    pub(super) envelope_bytes: usize,
}

impl Plan {
    /// Connection `index`'s `n`th insert. The ids are interleaved over the connections:
    /// unique, and the rooms dealt out evenly.
    fn statement(&self, index: usize, n: usize) -> Statement {
        let n = n * self.connections as usize + index;
        let e = event(&self.prefix, n, ROOMS, self.envelope_bytes);
        Statement::from_sql_and_values(
            self.backend,
            self.sql.as_str(),
            [
                e.event_id.into(),
                e.event_type.into(),
                e.room_id.into(),
                e.envelope.into(),
            ],
        )
    }
}

/// Runs `plan` on a thread of its own with a runtime of its own (two workers; tokio's
/// multi-thread runtime, which lapin's runtime adapter enables in this build).
pub(super) async fn measure(plan: Plan) -> anyhow::Result<Window> {
    let (sender, receiver) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("producers".into())
        .spawn(move || {
            // The runtime, and its workers, are gone before the result is sent.
            let result = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("producer")
                .enable_all()
                .build()
                .context("cannot start the producers' runtime")
                .and_then(|runtime| runtime.block_on(produce(plan)));
            let _ = sender.send(result);
        })
        .context("cannot start the producers' thread")?;
    receiver
        .await
        .context("the producers' thread ended without a result")?
}

/// Opens the connections, warms them up, then runs one task per connection over the
/// window and gathers what they measured.
async fn produce(plan: Plan) -> anyhow::Result<Window> {
    let plan = Arc::new(plan);
    let mut connections = Vec::with_capacity(plan.connections as usize);
    for _ in 0..plan.connections {
        connections.push(connect(&plan.url).await?);
    }
    let warm_ups: Vec<_> = (connections.into_iter().enumerate())
        .map(|(index, db)| {
            let plan = plan.clone();
            tokio::spawn(async move {
                for n in 0..WARM_UP {
                    db.execute(plan.statement(index, n))
                        .await
                        .context("a warm-up insert")?;
                }
                anyhow::Ok(db)
            })
        })
        .collect();
    let mut connections = Vec::with_capacity(warm_ups.len());
    for task in warm_ups {
        connections.push(task.await.context("a producer")??);
    }
    let start = Instant::now() + Duration::from_millis(20);
    let end = start + Duration::from_secs(plan.seconds);
    let tasks: Vec<_> = (connections.into_iter().enumerate())
        .map(|(index, db)| tokio::spawn(producer(plan.clone(), index, db, start, end)))
        .collect();
    let mut window = Window {
        seconds: plan.seconds as f64,
        ..Window::default()
    };
    let mut latencies = Vec::new();
    let mut connections = Vec::with_capacity(tasks.len());
    for task in tasks {
        let (db, tally) = task.await.context("a producer")?;
        latencies.extend(tally.latencies);
        window.errors += tally.errors;
        window.first_error = window.first_error.or(tally.first_error);
        connections.push(db);
    }
    for db in connections {
        let _ = db.close().await;
    }
    latencies.sort_unstable();
    window.commits = latencies.len();
    window.p50_ms = percentile(&latencies, 0.50);
    window.p99_ms = percentile(&latencies, 0.99);
    window.reached = match plan.rate {
        Some(rate) => window.rate() >= REACHED * rate as f64,
        None => true,
    };
    Ok(window)
}

/// One producer connection: as the service's own pool would have it, no pings before use,
/// no statement logging. SQLite: a writer waits up to 5 s for the file's write lock.
async fn connect(url: &str) -> anyhow::Result<DatabaseConnection> {
    let mut options = ConnectOptions::new(url.to_owned());
    options
        .max_connections(1)
        .min_connections(1)
        .connect_timeout(Duration::from_secs(10))
        .acquire_timeout(Duration::from_secs(30))
        .test_before_acquire(false)
        .sqlx_logging(false)
        .map_sqlx_sqlite_opts(|options| options.busy_timeout(Duration::from_secs(5)));
    Database::connect(options)
        .await
        .context("cannot open a producer connection")
}

/// What one connection measured.
#[derive(Debug, Default)]
struct Tally {
    /// Commit latencies in µs, of the commits that ended within the window.
    latencies: Vec<u32>,
    errors: u64,
    first_error: Option<String>,
}

/// One connection from `start` to `end`: closed loop (the next insert as soon as the last
/// returned), or open loop at its share of the rate, its sends staggered over the period
/// against the other connections' and sent at once when behind.
async fn producer(
    plan: Arc<Plan>,
    index: usize,
    db: DatabaseConnection,
    start: Instant,
    end: Instant,
) -> (DatabaseConnection, Tally) {
    let mut tally = Tally::default();
    let connections = f64::from(plan.connections);
    let period = plan
        .rate
        .map(|rate| Duration::from_secs_f64(connections / rate as f64));
    let mut next = start + period.map_or(Duration::ZERO, |p| p.mul_f64(index as f64 / connections));
    tokio::time::sleep_until(next.into()).await;
    let mut n = WARM_UP;
    while Instant::now() < end {
        let statement = plan.statement(index, n);
        n += 1;
        let sent = Instant::now();
        let result = db.execute(statement).await;
        let done = Instant::now();
        match result {
            Ok(_) if done <= end => tally
                .latencies
                .push(u32::try_from((done - sent).as_micros()).unwrap_or(u32::MAX)),
            Ok(_) => {}
            Err(error) => {
                tally.errors += 1;
                tally.first_error.get_or_insert_with(|| error.to_string());
                if period.is_none() {
                    // Not a busy loop of failures.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
        if let Some(period) = period {
            next += period;
            if next >= end {
                break;
            }
            tokio::time::sleep_until(next.into()).await;
        }
    }
    (db, tally)
}

/// The `q` quantile of sorted µs latencies, in ms (nearest rank); NaN when none.
fn percentile(sorted: &[u32], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    f64::from(sorted[rank - 1]) / 1e3
}
