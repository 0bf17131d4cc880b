//! `idle`: what a relay with nothing to do costs — its own CPU, and the database's queries
//! and CPU — so that the wake-ups' price is a figure (docs/decisions/0016-wake-ups.md).

use crate::cost::DbServer;
use crate::process;
use crate::scenario::{round, Backend, Bench};
use clap::Args;
use outbox_relay::startup::{open_broker, start_relay};
use sea_orm::{ConnectionTrait as _, DatabaseConnection, Statement};
use std::time::Duration;

/// `idle` options.
#[derive(Debug, Clone, Args)]
pub struct IdleArgs {
    /// Database backend.
    #[arg(long, value_enum, default_value_t = Backend::Postgres)]
    backend: Backend,
    /// Seconds measured, after a second to settle.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// PostgreSQL: LISTEN for the insert trigger's NOTIFY (`database.notify = true`,
    /// trigger enabled) instead of the probe.
    #[arg(long)]
    notify: bool,
    /// No probe: the relay only polls.
    #[arg(long)]
    no_probe: bool,
    /// `database.probe_interval` (default: the setting's default).
    #[arg(long)]
    probe_interval: Option<String>,
}

/// Runs an idle relay for `--seconds` and prints its CPU and the database's load.
pub async fn run(args: IdleArgs) -> anyhow::Result<()> {
    let bench = Bench::setup(args.backend, |settings| {
        settings.database.notify = args.notify;
        settings.database.probe = !args.no_probe;
        if let Some(interval) = &args.probe_interval {
            settings.database.probe_interval = interval.as_str().into();
        }
    })
    .await?;
    let broker = open_broker(&bench.config).await?;
    let relay = start_relay(&bench.config, &bench.store, &broker).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let db = bench.store.connection().clone();
    let db_server = DbServer::find(&db).await;
    let server = ServerLoad::read(&db, &db_server).await?;
    let cpu = process::cpu_seconds();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    let cpu = process::cpu_seconds() - cpu;
    let server = ServerLoad::read(&db, &db_server).await?.since(&server);
    relay.shutdown().await?;
    broker.close().await;
    bench.teardown().await?;

    let seconds = args.seconds.max(1) as f64;
    let backend = format!("{:?}", args.backend).to_lowercase();
    let relay_cpu = round(100.0 * cpu / seconds, 2);
    let queries = server.statements.map(|n| round(n / seconds, 1));
    let server_cpu = server.cpu_seconds.map(|s| round(100.0 * s / seconds, 2));
    println!(
        "idle: {backend}, {} s, notify {}, probe {}: relay CPU {relay_cpu} % of a core | \
         database {} statements/s, server CPU {} % of a core",
        args.seconds,
        args.notify,
        !args.no_probe,
        queries.map_or("n/a".into(), |q| q.to_string()),
        server_cpu.map_or("n/a".into(), |c| c.to_string()),
    );
    println!(
        "{}",
        serde_json::json!({"scenario": "idle", "backend": backend, "seconds": args.seconds,
            "notify": args.notify, "probe": !args.no_probe,
            "probe_interval": args.probe_interval, "relay_cpu_percent": relay_cpu,
            "statements_per_sec": queries, "server_cpu_percent": server_cpu})
    );
    Ok(())
}

/// What the database server has done so far, as far as it tells.
pub(crate) struct ServerLoad {
    /// Transactions (PostgreSQL: every statement outside one is one) or statements
    /// (MySQL `Questions`) of the whole server; `None` for SQLite, which has no server.
    pub(crate) statements: Option<f64>,
    /// CPU seconds of the server's processes ([`DbServer`]: PostgreSQL's postmaster and its
    /// descendants, or `mariadbd`).
    pub(crate) cpu_seconds: Option<f64>,
}

impl ServerLoad {
    pub(crate) async fn read(db: &DatabaseConnection, server: &DbServer) -> anyhow::Result<Self> {
        let backend = db.get_database_backend();
        let sql = match backend {
            sea_orm::DbBackend::Postgres => {
                "SELECT (xact_commit + xact_rollback)::float8 AS n FROM pg_stat_database \
                 WHERE datname = current_database()"
            }
            sea_orm::DbBackend::MySql => {
                "SELECT CAST(VARIABLE_VALUE AS DOUBLE) AS n FROM information_schema.GLOBAL_STATUS \
                 WHERE VARIABLE_NAME = 'QUESTIONS'"
            }
            sea_orm::DbBackend::Sqlite => {
                return Ok(Self {
                    statements: None,
                    cpu_seconds: None,
                })
            }
        };
        let row = db
            .query_one(Statement::from_string(backend, sql))
            .await?
            .ok_or_else(|| anyhow::anyhow!("no server statistics"))?;
        Ok(Self {
            statements: Some(row.try_get::<f64>("", "n")?),
            cpu_seconds: server.cpu_seconds(&process::all()),
        })
    }

    pub(crate) fn since(self, before: &ServerLoad) -> ServerLoad {
        let delta = |now: Option<f64>, then: Option<f64>| Some(now? - then?);
        ServerLoad {
            // Less the one statement of the first reading.
            statements: delta(self.statements, before.statements).map(|n| (n - 1.0).max(0.0)),
            cpu_seconds: delta(self.cpu_seconds, before.cpu_seconds),
        }
    }
}
