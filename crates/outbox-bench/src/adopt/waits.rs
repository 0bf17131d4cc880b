//! What the producers' sessions, and the migration's statements, were doing while
//! `migrate` ran: sampled from the server every [`EVERY`] (PostgreSQL `pg_stat_activity`,
//! MySQL/MariaDB `information_schema.PROCESSLIST`), so that a slow insert can be told a
//! lock wait (`Lock/relation`, `Waiting for table metadata lock`) from a commit's I/O
//! (`IO/WALSync`, `LWLock/WALWrite`) or the CPU (no wait event: running or runnable).

use super::Insert;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use std::cell::Cell;
use std::collections::{BTreeMap, HashSet};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the server is asked.
const EVERY: Duration = Duration::from_millis(20);

/// The server's id of `db`'s one session.
pub(crate) async fn session_id(db: &DatabaseConnection) -> anyhow::Result<i64> {
    let backend = db.get_database_backend();
    let sql = match backend {
        DbBackend::Postgres => "SELECT pg_backend_pid()::bigint AS id",
        _ => "SELECT CAST(CONNECTION_ID() AS SIGNED) AS id",
    };
    let row = db
        .query_one(Statement::from_string(backend, sql))
        .await?
        .ok_or_else(|| anyhow::anyhow!("no session id"))?;
    Ok(row.try_get("", "id")?)
}

/// One active session seen at one moment.
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    at: Instant,
    session: i64,
    /// `type/event` on PostgreSQL, the thread's state on MySQL; empty: none.
    wait: String,
    query: String,
}

/// Samples the server on a connection of its own, on a thread and runtime of its own (a
/// stall of the producers' runtime does not stop it), until stopped.
pub(crate) struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<anyhow::Result<Vec<Sample>>>,
    producers: HashSet<i64>,
}

impl Sampler {
    /// Starts sampling the producers' `sessions` and the statements naming `table`.
    pub(crate) fn start(url: &str, table: &str, sessions: Vec<i64>) -> Self {
        let list = sessions
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let postgres = url.starts_with("postgres");
        let sql = if postgres {
            format!(
                "SELECT pid::bigint AS session, coalesce(wait_event_type || '/' || wait_event, '') \
                 AS wait, left(query, 160) AS query FROM pg_stat_activity \
                 WHERE pid <> pg_backend_pid() AND state = 'active' \
                 AND (pid IN ({list}) OR query LIKE '%{table}%')"
            )
        } else {
            format!(
                "SELECT CAST(ID AS SIGNED) AS session, coalesce(STATE, '') AS wait, \
                 coalesce(LEFT(INFO, 160), '') AS query FROM information_schema.PROCESSLIST \
                 WHERE ID <> CONNECTION_ID() AND COMMAND <> 'Sleep' \
                 AND (ID IN ({list}) OR INFO LIKE '%{table}%')"
            )
        };
        let stop = Arc::new(AtomicBool::new(false));
        let url = url.to_owned();
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(async move {
                    let db = outbox_store::connect(&url, 1).await?.into_connection();
                    let backend = db.get_database_backend();
                    let mut samples = Vec::new();
                    let mut next = tokio::time::Instant::now();
                    while !stop.load(Ordering::Relaxed) {
                        let at = Instant::now();
                        for row in db
                            .query_all(Statement::from_string(backend, sql.clone()))
                            .await?
                        {
                            samples.push(Sample {
                                at,
                                session: row.try_get("", "session")?,
                                wait: row.try_get("", "wait")?,
                                query: row.try_get("", "query")?,
                            });
                        }
                        next += EVERY;
                        tokio::time::sleep_until(next).await;
                    }
                    let _ = db.close().await;
                    Ok(samples)
                })
            }
        });
        Self {
            stop,
            thread,
            producers: sessions.into_iter().collect(),
        }
    }

    /// Stops sampling; what was seen.
    pub(crate) fn stop(self) -> Waits {
        self.stop.store(true, Ordering::Relaxed);
        let samples = match self.thread.join() {
            Ok(Ok(samples)) => samples,
            Ok(Err(error)) => {
                eprintln!("adopt: sampling the server's sessions failed: {error:#}");
                Vec::new()
            }
            Err(_) => {
                eprintln!("adopt: the sampler panicked");
                Vec::new()
            }
        };
        Waits {
            samples,
            producers: self.producers,
            lags: Vec::new(),
        }
    }
}

/// How late the producers' runtime wakes up: a task that sleeps [`EVERY`] / 4 again and
/// again and notes how much later than asked it woke. A slow insert during which the
/// runtime woke late by as much was the client's stall (no CPU for the bench), not the
/// server's.
pub(crate) struct Lag {
    stop: Rc<Cell<bool>>,
    task: actix_rt::task::JoinHandle<Vec<(Instant, Duration)>>,
}

impl Lag {
    pub(crate) fn start() -> Self {
        let stop = Rc::new(Cell::new(false));
        let task = actix_rt::spawn({
            let stop = stop.clone();
            async move {
                let mut lags = Vec::new();
                while !stop.get() {
                    let asked = Instant::now() + EVERY / 4;
                    tokio::time::sleep_until(asked.into()).await;
                    lags.push((asked, Instant::now().saturating_duration_since(asked)));
                }
                lags
            }
        });
        Self { stop, task }
    }

    pub(crate) async fn stop(self) -> Vec<(Instant, Duration)> {
        self.stop.set(true);
        self.task.await.unwrap_or_default()
    }
}

/// The samples of one run.
pub(crate) struct Waits {
    samples: Vec<Sample>,
    producers: HashSet<i64>,
    /// When the producers' runtime woke late, and by how much ([`Lag`]).
    pub(crate) lags: Vec<(Instant, Duration)>,
}

/// `wait` as printed: the CPU when the session waited for nothing.
fn label(wait: &str) -> &str {
    if wait.is_empty() {
        "none (on CPU)"
    } else {
        wait
    }
}

const BACKFILL: &str = "the backfill (UPDATE)";
const INDEX: &str = "an index build (CREATE INDEX)";
const ALTER: &str = "an ALTER TABLE";
const OTHER: &str = "another statement";
/// The phases, the one named first when several were sampled during an insert.
const PHASES: [&str; 4] = [BACKFILL, INDEX, ALTER, OTHER];

/// Which of the migration's phases `query` belongs to.
fn phase(query: &str) -> &'static str {
    let query = query.trim_start();
    if query.starts_with("UPDATE") {
        BACKFILL
    } else if query.starts_with("CREATE UNIQUE INDEX") || query.starts_with("CREATE INDEX") {
        INDEX
    } else if query.starts_with("ALTER") {
        ALTER
    } else {
        OTHER
    }
}

/// `n×label` of each distinct label, most frequent first.
fn tally<'a>(waits: impl Iterator<Item = &'a str>) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for wait in waits {
        *counts.entry(label(wait)).or_default() += 1;
    }
    let mut counts: Vec<(&str, usize)> = counts.into_iter().collect();
    counts.sort_by_key(|count| std::cmp::Reverse(count.1));
    counts
        .iter()
        .map(|(wait, n)| format!("{n}×{wait}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Waits {
    /// Prints what the producers waited for in the samples between `from` and `to`.
    pub(crate) fn print_tally(&self, window: &str, from: Instant, to: Instant) {
        let producers: Vec<&Sample> = (self.samples.iter())
            .filter(|sample| sample.at >= from && sample.at < to)
            .filter(|sample| self.producers.contains(&sample.session))
            .collect();
        println!(
            "producer waits {window}: {} samples of an active insert every {EVERY:?}: {}",
            producers.len(),
            tally(producers.iter().map(|sample| sample.wait.as_str()))
        );
    }

    /// Prints, for each of `inserts` slower than `slow` (or the three slowest), what it
    /// and the migration's statements were doing meanwhile, and whether the bench itself
    /// stalled; `from`: the migration's start.
    pub(crate) fn print_slowest(&self, inserts: &[Insert], from: Instant, slow: Duration) {
        let mut slowest: Vec<&Insert> = inserts.iter().collect();
        slowest.sort_by_key(|insert| std::cmp::Reverse(insert.took));
        let over = slowest
            .iter()
            .take_while(|insert| insert.took > slow)
            .count();
        let meanwhile = |insert: &Insert| {
            let end = insert.started + insert.took;
            (self.samples.iter())
                .filter(|sample| sample.at >= insert.started && sample.at <= end)
                .filter(|sample| !self.producers.contains(&sample.session))
                .map(|sample| phase(&sample.query))
                .min_by_key(|phase| PHASES.iter().position(|p| p == phase))
                .unwrap_or("nothing sampled")
        };
        println!(
            "inserts > {slow:?} by what the migration ran meanwhile: {}",
            tally(slowest[..over].iter().map(|insert| meanwhile(insert)))
        );
        let migration: Vec<&Sample> = (self.samples.iter())
            .filter(|sample| !self.producers.contains(&sample.session))
            .collect();
        for name in [BACKFILL, INDEX] {
            let seen: Vec<f64> = (migration.iter())
                .filter(|sample| phase(&sample.query) == name)
                .map(|sample| sample.at.saturating_duration_since(from).as_secs_f64())
                .collect();
            if let (Some(first), Some(last)) = (seen.first(), seen.last()) {
                println!("{name} sampled from +{first:.1} s to +{last:.1} s");
            }
        }
        for insert in slowest.iter().take(over.clamp(3, 10)) {
            let end = insert.started + insert.took;
            let within = |sample: &&Sample| sample.at >= insert.started && sample.at <= end;
            let own = (self.samples.iter().filter(within))
                .filter(|sample| sample.session == insert.session)
                .map(|sample| sample.wait.as_str());
            let stalled = (self.lags.iter())
                .filter(|(at, _)| *at >= insert.started && *at <= end)
                .map(|(_, lag)| *lag)
                .max()
                .unwrap_or_default();
            let others: std::collections::BTreeSet<String> = (self.samples.iter().filter(within))
                .filter(|sample| !self.producers.contains(&sample.session))
                .map(|sample| format!("[{}] {}", label(&sample.wait), phase(&sample.query)))
                .collect();
            println!(
                "  insert at +{:.3} s took {:.0} ms; the bench's runtime woke up to {:.0} ms late \
                 meanwhile; the insert's session sampled: {}; migration meanwhile: {}",
                insert.started.saturating_duration_since(from).as_secs_f64(),
                insert.took.as_secs_f64() * 1e3,
                stalled.as_secs_f64() * 1e3,
                tally(own),
                if others.is_empty() {
                    "nothing sampled".to_owned()
                } else {
                    others.into_iter().collect::<Vec<_>>().join(", ")
                }
            );
        }
    }
}
