//! The whole cost of a run: beside the relay's own CPU, the database server's and the
//! broker's CPU (from /proc, over the same window), and on PostgreSQL the WAL it wrote and
//! the work its statistics count. `drain`, `history`, `baseline` and `idle` read them here
//! (BENCHMARKS.md, "How to read the figures").

use crate::process;
use crate::scenario::round;
use sea_orm::{ConnectionTrait as _, DatabaseConnection, DbBackend, Statement, TransactionTrait};

/// The broker's processes: RabbitMQ's Erlang VM (every `beam.smp` on the machine).
const BROKER_PROCESS: &str = "beam.smp";

/// The database server's processes whose CPU a run is charged, found once.
#[derive(Debug, Clone)]
pub(crate) enum DbServer {
    /// The server's root processes: PostgreSQL's postmaster (its backends and workers are
    /// its descendants), MariaDB's `mariadbd`.
    Pids(Vec<u32>),
    /// SQLite runs in the relay's process: its CPU is in the relay's figure.
    InProcess,
    /// Not found on this machine (a remote server, or a pid file this user cannot read).
    Unknown,
}

impl DbServer {
    /// Finds the server `db` is connected to: PostgreSQL's postmaster is the parent of
    /// this connection's backend (`pg_backend_pid()`), so other clusters on the machine
    /// are left out; MariaDB's pid is in its `@@pid_file`.
    pub(crate) async fn find(db: &DatabaseConnection) -> Self {
        let backend = db.get_database_backend();
        let sql = match backend {
            DbBackend::Sqlite => return Self::InProcess,
            DbBackend::Postgres => "SELECT pg_backend_pid()::text AS v",
            DbBackend::MySql => "SELECT @@pid_file AS v",
        };
        let Ok(Some(row)) = db.query_one(Statement::from_string(backend, sql)).await else {
            return Self::Unknown;
        };
        let Ok(value) = row.try_get::<String>("", "v") else {
            return Self::Unknown;
        };
        let processes = process::all();
        let named = |pid: u32, names: &[&str]| {
            processes
                .iter()
                .find(|p| p.pid == pid)
                .filter(|p| names.contains(&p.comm.as_str()))
        };
        let root = match backend {
            DbBackend::Postgres => value
                .parse()
                .ok()
                .and_then(|pid| named(pid, &["postgres"]))
                .and_then(|backend| named(backend.ppid, &["postgres", "postmaster"])),
            _ => std::fs::read_to_string(value.trim())
                .ok()
                .and_then(|pid| pid.trim().parse().ok())
                .and_then(|pid| named(pid, &["mariadbd", "mysqld"])),
        };
        root.map_or(Self::Unknown, |root| Self::Pids(vec![root.pid]))
    }

    /// CPU seconds of the server's processes so far; `None` unless [`DbServer::Pids`].
    pub(crate) fn cpu_seconds(&self, processes: &[process::Stat]) -> Option<f64> {
        match self {
            Self::Pids(roots) => Some(process::tree_cpu_seconds(processes, roots)),
            Self::InProcess | Self::Unknown => None,
        }
    }
}

/// CPU seconds so far of the broker's processes; `None` when none is on this machine.
pub(crate) fn broker_cpu_seconds(processes: &[process::Stat]) -> Option<f64> {
    let roots: Vec<u32> = processes
        .iter()
        .filter(|p| p.comm == BROKER_PROCESS)
        .map(|p| p.pid)
        .collect();
    (!roots.is_empty()).then(|| process::tree_cpu_seconds(processes, &roots))
}

/// The CPU counters of one moment.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CpuReading {
    relay: f64,
    db: Option<f64>,
    broker: Option<f64>,
}

impl CpuReading {
    /// This process's (the relay's), the database server's and the broker's CPU now. This
    /// process's is read after the scan of /proc at a window's start and before it at its
    /// end, so that the scans are not in the relay's figure.
    fn now(server: &DbServer, at_start: bool) -> Self {
        let relay = (!at_start).then(process::cpu_seconds);
        let processes = process::all();
        Self {
            relay: relay.unwrap_or_else(process::cpu_seconds),
            db: server.cpu_seconds(&processes),
            broker: broker_cpu_seconds(&processes),
        }
    }

    fn since(&self, before: &Self) -> Self {
        Self {
            relay: self.relay - before.relay,
            db: self.db.zip(before.db).map(|(now, then)| now - then),
            broker: self.broker.zip(before.broker).map(|(now, then)| now - then),
        }
    }
}

/// What PostgreSQL's statistics count, for the database and the outbox table(s).
#[derive(Debug, Clone, Copy, Default)]
struct PgCounters {
    /// `pg_stat_database`: xact_commit + xact_rollback of the bench's database (every
    /// client's; a statement outside a transaction block is one transaction). In a
    /// [`Cost`], the bench's own are taken out.
    xacts: f64,
    /// `pg_stat_user_tables` of the outbox table(s): rows updated, of which HOT, deleted.
    row_updates: f64,
    hot_updates: f64,
    row_deletes: f64,
}

/// A run's whole cost in the making: the readings at its start.
pub(crate) struct CostWatch {
    db: DatabaseConnection,
    server: DbServer,
    tables: Vec<String>,
    cpu: CpuReading,
    wal_lsn: Option<String>,
    counters: Option<PgCounters>,
    /// The CPU and WAL at the window's end ([`CostWatch::stop`]).
    end: Option<(CpuReading, Option<f64>)>,
    /// Transactions of this watch's own that the database counts in the window.
    own_xacts: u64,
}

impl CostWatch {
    /// Starts the window: reads every counter now. `db` is the relay's pool (idle), over
    /// `tables`, its outbox tables.
    pub(crate) async fn start(db: &DatabaseConnection, tables: Vec<String>) -> Self {
        let server = DbServer::find(db).await;
        let is_pg = db.get_database_backend() == DbBackend::Postgres;
        let counters = match is_pg {
            true => pg_counters(db, &tables).await.map(|(counters, _)| counters),
            false => None,
        };
        let wal_lsn = match is_pg {
            true => pg_wal_lsn(db).await,
            false => None,
        };
        // The reading's own SELECT (reported after it) and the WAL position's.
        let own_xacts = 2;
        Self {
            db: db.clone(),
            cpu: CpuReading::now(&server, true),
            server,
            tables,
            wal_lsn,
            counters,
            end: None,
            own_xacts,
        }
    }

    /// Ends the window of CPU and WAL (when the last event is marked).
    pub(crate) async fn stop(&mut self) {
        let cpu = CpuReading::now(&self.server, false);
        let wal = match &self.wal_lsn {
            Some(lsn) => {
                self.own_xacts += 1;
                pg_wal_since(&self.db, lsn).await
            }
            None => None,
        };
        self.end = Some((cpu, wal));
    }

    /// The cost of `events` events: [`CostWatch::stop`]'s CPU and WAL, and the statistics
    /// counted until now (call it once the relay has stopped: its connections report their
    /// statistics when asked here, not only up to 10 s later as PostgreSQL leaves them).
    /// `polls`: the bench's own statements meanwhile (waiting for the marks), taken out of
    /// the transactions.
    pub(crate) async fn finish(self, events: usize, polls: u64) -> Cost {
        let own = (self.own_xacts + polls) as f64;
        let counters = match self.counters {
            Some(before) => pg_counters(&self.db, &self.tables)
                .await
                .map(|(after, flushes)| PgCounters {
                    xacts: after.xacts - before.xacts - own - flushes as f64,
                    row_updates: after.row_updates - before.row_updates,
                    hot_updates: after.hot_updates - before.hot_updates,
                    row_deletes: after.row_deletes - before.row_deletes,
                }),
            None => None,
        };
        let (end, wal_bytes) = self
            .end
            .unwrap_or_else(|| (CpuReading::now(&self.server, false), None));
        Cost {
            events,
            cpu: end.since(&self.cpu),
            db_in_relay: matches!(self.server, DbServer::InProcess),
            wal_bytes,
            counters,
        }
    }
}

/// What a run cost, all in.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cost {
    events: usize,
    cpu: CpuReading,
    /// SQLite: the database's CPU is in the relay's.
    db_in_relay: bool,
    wal_bytes: Option<f64>,
    counters: Option<PgCounters>,
}

impl Cost {
    fn per_event(&self, total: f64) -> f64 {
        total / self.events.max(1) as f64
    }

    /// The relay's CPU µs per event.
    pub(crate) fn relay_us(&self) -> f64 {
        self.per_event(self.cpu.relay) * 1e6
    }

    /// The database server's CPU µs per event (`None`: in the relay's, or not measured).
    pub(crate) fn db_us(&self) -> Option<f64> {
        self.cpu.db.map(|s| self.per_event(s) * 1e6)
    }

    /// RabbitMQ's CPU µs per message.
    pub(crate) fn broker_us(&self) -> Option<f64> {
        self.cpu.broker.map(|s| self.per_event(s) * 1e6)
    }

    /// Relay + database + broker CPU µs per event; `None` when a part was not measured.
    pub(crate) fn all_in_us(&self) -> Option<f64> {
        let db = match self.db_in_relay {
            true => Some(0.0),
            false => self.db_us(),
        };
        Some(self.relay_us() + db? + self.broker_us()?)
    }

    /// The JSON fields (docs/design/tests.md#benchmarks-outbox-bench), `null` where not
    /// measured.
    pub(crate) fn json(&self) -> serde_json::Map<String, serde_json::Value> {
        let per = |value: Option<f64>, digits| value.map(|v| round(self.per_event(v), digits));
        let counters = self.counters;
        let fields = serde_json::json!({
            "db_cpu_us_per_event": self.db_us().map(|v| round(v, 1)),
            "db_cpu_in_relay": self.db_in_relay,
            "broker_cpu_us_per_message": self.broker_us().map(|v| round(v, 1)),
            "all_in_cpu_us_per_event": self.all_in_us().map(|v| round(v, 1)),
            "db_wal_bytes_per_event": per(self.wal_bytes, 0),
            "db_xacts_per_event": per(counters.map(|c| c.xacts), 3),
            "db_row_updates_per_event": per(counters.map(|c| c.row_updates), 3),
            "db_hot_updates_per_event": per(counters.map(|c| c.hot_updates), 3),
            "db_row_deletes_per_event": per(counters.map(|c| c.row_deletes), 3),
        });
        match fields {
            serde_json::Value::Object(map) => map,
            _ => unreachable!("a JSON object"),
        }
    }

    /// The readable part: `db … | broker … | all in …`.
    pub(crate) fn summary(&self) -> String {
        let us = |v: Option<f64>| v.map_or("n/a".to_owned(), |v| format!("{v:.1}"));
        let db = match self.db_in_relay {
            true => "in the relay's (SQLite)".to_owned(),
            false => format!("{} µs/event", us(self.db_us())),
        };
        let mut line = format!(
            "db CPU {db} | broker CPU {} µs/message | all in {} µs/event",
            us(self.broker_us()),
            us(self.all_in_us())
        );
        if let Some(wal) = self.wal_bytes {
            line.push_str(&format!(" | WAL {:.0} B/event", self.per_event(wal)));
        }
        if let Some(c) = self.counters {
            line.push_str(&format!(
                " | {:.3} xacts, {:.2} row updates ({:.2} HOT), {:.2} deletes per event",
                self.per_event(c.xacts),
                self.per_event(c.row_updates),
                self.per_event(c.hot_updates),
                self.per_event(c.row_deletes)
            ));
        }
        line
    }
}

/// The current WAL position, as text.
async fn pg_wal_lsn(db: &DatabaseConnection) -> Option<String> {
    let sql = "SELECT pg_current_wal_lsn()::text AS lsn";
    let row = db
        .query_one(Statement::from_string(DbBackend::Postgres, sql))
        .await
        .ok()??;
    row.try_get::<String>("", "lsn").ok()
}

/// WAL bytes written (by the whole cluster) since `lsn`.
async fn pg_wal_since(db: &DatabaseConnection, lsn: &str) -> Option<f64> {
    let sql = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8 AS bytes";
    let statement = Statement::from_sql_and_values(DbBackend::Postgres, sql, [lsn.into()]);
    let row = db.query_one(statement).await.ok()??;
    row.try_get::<f64>("", "bytes").ok()
}

/// The statistics counters, once every connection of `db`'s pool has reported its own;
/// and how many transactions that asking took (counted in what it read).
async fn pg_counters(db: &DatabaseConnection, tables: &[String]) -> Option<(PgCounters, u32)> {
    let flushes = flush_pool_statistics(db).await?;
    let names = tables
        .iter()
        .map(|t| format!("'{t}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!(
        "SELECT (SELECT (xact_commit + xact_rollback)::float8 FROM pg_stat_database \
           WHERE datname = current_database()) AS xacts, \
         COALESCE(sum(n_tup_upd), 0)::float8 AS upd, COALESCE(sum(n_tup_hot_upd), 0)::float8 AS hot, \
         COALESCE(sum(n_tup_del), 0)::float8 AS del \
         FROM pg_stat_user_tables WHERE relid IN (SELECT to_regclass(t) FROM unnest(ARRAY[{names}]::text[]) AS t)"
    );
    let row = db
        .query_one(Statement::from_string(DbBackend::Postgres, sql))
        .await
        .ok()??;
    let counters = PgCounters {
        xacts: row.try_get("", "xacts").ok()?,
        row_updates: row.try_get("", "upd").ok()?,
        hot_updates: row.try_get("", "hot").ok()?,
        row_deletes: row.try_get("", "del").ok()?,
    };
    Some((counters, flushes))
}

/// PostgreSQL (15+) keeps a backend's statistics up to 10 s before they reach the views
/// when it goes idle soon after its last report. Holding every connection of the pool at
/// once and asking each for `pg_stat_force_next_flush()` makes each report at its commit,
/// before the commit returns. Returns the transactions that took; `None` when the server
/// cannot (before 15).
async fn flush_pool_statistics(db: &DatabaseConnection) -> Option<u32> {
    let size = db.get_postgres_connection_pool().size().max(1);
    let mut held = Vec::with_capacity(size as usize);
    for _ in 0..size {
        held.push(db.begin().await.ok()?);
    }
    for transaction in held {
        transaction
            .execute_unprepared("SELECT pg_stat_force_next_flush()")
            .await
            .ok()?;
        transaction.commit().await.ok()?;
    }
    Some(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(db: Option<f64>, db_in_relay: bool, broker: Option<f64>) -> Cost {
        Cost {
            events: 1000,
            cpu: CpuReading {
                relay: 0.030,
                db,
                broker,
            },
            db_in_relay,
            wal_bytes: Some(1_500_000.0),
            counters: Some(PgCounters {
                xacts: 70.0,
                row_updates: 2000.0,
                hot_updates: 1000.0,
                row_deletes: 0.0,
            }),
        }
    }

    #[test]
    fn all_in_is_relay_database_and_broker_per_event() {
        let pg = cost(Some(0.075), false, Some(0.115));
        assert!((pg.relay_us() - 30.0).abs() < 1e-9);
        assert!((pg.all_in_us().unwrap() - 220.0).abs() < 1e-9);
        let json = pg.json();
        assert_eq!(json["db_cpu_us_per_event"], 75.0);
        assert_eq!(json["broker_cpu_us_per_message"], 115.0);
        assert_eq!(json["all_in_cpu_us_per_event"], 220.0);
        assert_eq!(json["db_wal_bytes_per_event"], 1500.0);
        assert_eq!(json["db_xacts_per_event"], 0.07);
        assert_eq!(json["db_row_updates_per_event"], 2.0);
        assert_eq!(json["db_hot_updates_per_event"], 1.0);
    }

    #[test]
    fn sqlite_is_in_the_relay_and_a_missing_part_leaves_no_all_in() {
        let sqlite = cost(None, true, Some(0.100));
        assert!((sqlite.all_in_us().unwrap() - 130.0).abs() < 1e-9);
        assert_eq!(
            sqlite.json()["db_cpu_us_per_event"],
            serde_json::Value::Null
        );
        assert_eq!(sqlite.json()["db_cpu_in_relay"], true);
        assert_eq!(cost(None, false, Some(0.1)).all_in_us(), None);
        assert_eq!(cost(Some(0.1), false, None).all_in_us(), None);
        assert!(cost(None, true, None)
            .summary()
            .contains("in the relay's (SQLite)"));
    }
}
