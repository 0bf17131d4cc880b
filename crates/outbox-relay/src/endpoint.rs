//! The metrics and health endpoint of `outbox-relay run`, on `metrics.listen`
//! (`docs/design/observability.md#health`):
//!
//! - `GET /metrics`: every metric in the Prometheus text format, labelled `node_id`: the
//!   relay's, `outbox_up{dependency}` (the flags `/readyz` reads), `outbox_relay_build_info`
//!   and the standard `process_*` series (sampled from /proc at each scrape).
//! - `GET /healthz`: 200 while the process runs (it answers, so it is alive).
//! - `GET /readyz`: 200 while every outbox's database and the broker are usable and the
//!   broker does not block publishers (a resource alarm) (and, with
//!   `relay.max_pending_age`, no outbox's oldest pending row is older than that, unless
//!   `relay.max_pending_age_readiness` is off) and no outbox is stalled (its events fail
//!   and none was published for `relay.stall_after`), else 503 with a line saying which is not;
//!   while `run` waits for a dependency at start, `not ready: waiting for the database`
//!   (or `the broker`).
//!
//! The actors record through the `metrics` facade (`outbox_pipeline::instruments`); this
//! module installs the Prometheus recorder behind it and serves it with actix-web on a
//! worker thread of its own, so a scrape never runs on the relay's thread. Readiness is
//! decided by [`Endpoint::probe`], never by a request, so scrapes and probes add nothing to
//! the database or the broker; the probe is a future polled beside the signal wait, dropped
//! at the first signal so it cannot reconnect a broker the shutdown has closed.

use crate::dependency::Dependency;
use crate::settings::MaxPendingAge;
use crate::startup::ConfigProblem;
use actix_web::dev::ServerHandle;
use actix_web::{web, App, HttpResponse, HttpServer};
use anyhow::Context as _;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use outbox_amqp::Broker;
use outbox_core::OutboxStore;
use outbox_pipeline::instruments;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tracing::{info, warn};

/// Broker probe cadence, and the database's while it is unreachable.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// Backlog query (gauges and database readiness) cadence while the database answers.
const BACKLOG_EVERY: Duration = Duration::from_secs(5);
/// Dead-row count cadence: the count reads a range of an index as long as the dead rows
/// are many, so it is taken less often than the backlog.
const DEAD_EVERY: Duration = Duration::from_secs(60);
/// A backlog query that takes longer counts as a database failure.
const BACKLOG_TIMEOUT: Duration = Duration::from_secs(3);
/// Histogram samples wait in the recorder until drained into their buckets, by a scrape
/// or by this upkeep; it bounds their memory when nobody scrapes.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);
/// Stopping the server may take this long at most (it drops open connections at once).
const STOP_TIMEOUT: Duration = Duration::from_millis(500);

/// Bucket bounds (seconds) of `outbox_publish_confirm_seconds`: a lone confirm takes about
/// 0.5 ms on loopback, a few milliseconds with hundreds in flight, tens with a slow disk
/// under the broker; failures stop at `publish_timeout` (3 s by default).
const CONFIRM_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];
/// Bucket bounds (seconds) of `outbox_commit_to_confirm_seconds`: milliseconds while the
/// relay keeps up and PostgreSQL wakes it on insert, up to `poll_interval` (1 s) where it
/// polls, then seconds to an hour for a backlog being drained or events being retried.
const COMMIT_TO_CONFIRM_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];
/// Bucket bounds (seconds) of `outbox_claim_seconds`: a claim of 100 rows takes about a
/// millisecond on a local PostgreSQL, tens where the table is large or the network far;
/// past a second the database is struggling.
const CLAIM_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];
/// Bucket bounds (rows) of the claim and mark batch sizes: a claim takes at most
/// `batch_size` rows (100 by default), a flush at most 4 × `batch_size`; 1-2.5-5 steps up
/// to 5,000 cover any sensible `batch_size` and show whether claims come back full.
const BATCH_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0,
];

/// The `dependency` labels of `outbox_up`, in the order of [`Health`]'s flags.
const DEPENDENCIES: [&str; 2] = ["database", "broker"];

/// An outbox's stall state as its relay reports it ([`outbox_pipeline::Relay::stall`]).
pub type StallReports = tokio::sync::watch::Receiver<Option<outbox_pipeline::Stall>>;

/// What `/readyz` reports, written by the probe and read by requests.
#[derive(Debug, Default)]
struct Health {
    /// The last backlog query succeeded.
    database: AtomicBool,
    /// The last broker probe found the link usable.
    broker: AtomicBool,
    /// The graceful shutdown has begun: no longer relaying.
    stopping: AtomicBool,
    /// `run` is waiting for this dependency at start.
    waiting: Mutex<Option<Dependency>>,
    /// The broker's reason while it blocks publishers (a resource alarm).
    blocked: Mutex<Option<String>>,
    /// `backlog older than …` with the late outboxes, while `relay.max_pending_age` is
    /// breached and counts for readiness.
    late: Mutex<Option<String>>,
    /// `stalled: …` with the stalled outboxes and their reasons (`relay.stall_after`).
    stalled: Mutex<Option<String>>,
}

impl Health {
    /// `None` when ready, else why not.
    fn problems(&self) -> Option<String> {
        if self.stopping.load(Ordering::Relaxed) {
            return Some("shutting down".into());
        }
        if let Some(dependency) = *self.waiting.lock().unwrap_or_else(|e| e.into_inner()) {
            return Some(format!("waiting for {dependency}"));
        }
        let mut problems = Vec::new();
        if !self.database.load(Ordering::Relaxed) {
            problems.push("database unreachable".to_owned());
        }
        if !self.broker.load(Ordering::Relaxed) {
            problems.push("broker unreachable".to_owned());
        }
        if let Some(reason) = self
            .blocked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            problems.push(format!("broker blocks publishers ({reason})"));
        }
        if let Some(late) = self.late.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            problems.push(late);
        }
        if let Some(stalled) = self
            .stalled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            problems.push(stalled);
        }
        (!problems.is_empty()).then(|| problems.join(", "))
    }
}

/// One outbox as the probe watches it.
struct Watched<'a, S> {
    name: &'a str,
    store: &'a S,
    pending: metrics::Gauge,
    oldest: metrics::Gauge,
    dead: metrics::Gauge,
    /// `outbox_max_pending_age_exceeded`, when `relay.max_pending_age` is on.
    exceeded: Option<metrics::Gauge>,
    /// At the last look, the oldest pending row was older than `relay.max_pending_age`.
    late: bool,
}

impl<S> Watched<'_, S> {
    /// The oldest pending row is `age` seconds old: a breach of `bound` begins or ends
    /// (logged once each), or goes on.
    fn check_age(&mut self, age: f64, bound: Duration) {
        let late = age > bound.as_secs_f64();
        if let Some(exceeded) = &self.exceeded {
            exceeded.set(f64::from(u8::from(late)));
        }
        if late == self.late {
            return;
        }
        self.late = late;
        let max_pending_age = humantime::format_duration(bound).to_string();
        if late {
            warn!(
                outbox = self.name,
                oldest_pending_age_seconds = age.round(),
                %max_pending_age,
                "the oldest pending event is older than relay.max_pending_age"
            );
        } else {
            info!(
                outbox = self.name,
                %max_pending_age,
                "every pending event is within relay.max_pending_age again"
            );
        }
    }
}

/// Shared by the HTTP worker's handlers.
struct Served {
    prometheus: PrometheusHandle,
    health: Arc<Health>,
    /// Samples the `process_*` series just before each render.
    process: metrics_process::Collector,
}

/// The running endpoint: the HTTP server, its recorder, and what its probe found.
pub struct Endpoint {
    /// Where it listens (with the port chosen by the system when `metrics.listen` said 0).
    pub address: SocketAddr,
    server: ServerHandle,
    health: Arc<Health>,
    /// Runs the recorder's upkeep off the relay's thread.
    upkeep: actix_rt::Arbiter,
}

/// Why `metrics.listen` could not be bound. An address in use, not of this host or
/// needing privileges is the settings' problem (exit code 2: a supervisor restarting the
/// relay would fail the same way forever); anything else is a runtime failure.
fn bind_error(listen: SocketAddr, error: std::io::Error) -> anyhow::Error {
    use std::io::ErrorKind;
    let why = match error.kind() {
        ErrorKind::AddrInUse => "the address is in use (another process listens there)",
        ErrorKind::AddrNotAvailable => "the address is not one of this host's",
        ErrorKind::PermissionDenied => "permission denied (ports below 1024 need privileges)",
        _ => {
            return anyhow::Error::new(error)
                .context(format!("cannot listen on {listen} (metrics.listen)"))
        }
    };
    anyhow::Error::new(ConfigProblem(format!(
        "metrics.listen = \"{listen}\": cannot listen there: {why}; choose another address or \
         port, or \"\" to serve no metrics"
    )))
}

/// Registers the help text and unit of every metric of the relay (besides the standard
/// `process_*` ones) with the installed recorder: what `/metrics` says of each, and what
/// the book's metrics reference is generated from.
pub fn describe_metrics() {
    instruments::describe();
    crate::admin::describe_metrics();
    metrics::describe_counter!(
        outbox_store::failover::FAILOVERS,
        metrics::Unit::Count,
        "Times a database server answered that it takes no writes (a failover): the pool \
         dropped its connections and connected again."
    );
}

impl Endpoint {
    /// Installs the Prometheus recorder (labelling every metric `node_id`) and starts
    /// serving on `listen`. Must run before the relay starts: the actors take their metric
    /// handles from the recorder installed when they are built. Not ready until
    /// [`Endpoint::probe`] has found the database and the broker usable.
    pub fn start(listen: SocketAddr, node_id: &str) -> anyhow::Result<Self> {
        let prometheus = recorder(node_id)?
            .install_recorder()
            .context("cannot install the metrics recorder")?;
        describe_metrics();
        let process = metrics_process::Collector::default();
        process.describe();
        metrics::gauge!(instruments::BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
        // Present from the first scrape: unusable until the probe has found otherwise.
        for dependency in DEPENDENCIES {
            metrics::gauge!(instruments::UP, "dependency" => dependency).set(0.0);
        }
        metrics::gauge!(instruments::BROKER_BLOCKED).set(0.0);
        let listener =
            std::net::TcpListener::bind(listen).map_err(|error| bind_error(listen, error))?;
        let address = listener.local_addr()?;
        let health = Arc::new(Health::default());
        let served = web::Data::new(Served {
            prometheus: prometheus.clone(),
            health: Arc::clone(&health),
            process,
        });
        let server = HttpServer::new(move || {
            App::new()
                .app_data(served.clone())
                .route("/metrics", web::get().to(metrics))
                .route("/healthz", web::get().to(healthz))
                .route("/readyz", web::get().to(readyz))
        })
        // One worker thread is plenty for a scrape every few seconds.
        .workers(1)
        // SIGINT and SIGTERM are the relay's: the server stops when `run` says so.
        .disable_signals()
        .shutdown_timeout(0)
        // Scrapers and probes, not clients: a bound keeps a flood from using up memory.
        .max_connections(64)
        .listen(listener)
        .with_context(|| format!("cannot serve on {address} (metrics.listen)"))?
        .run();
        let handle = server.handle();
        actix_rt::spawn(server);
        let upkeep = actix_rt::Arbiter::new();
        upkeep.spawn(async move {
            let mut every = tokio::time::interval(UPKEEP_EVERY);
            loop {
                every.tick().await;
                prometheus.run_upkeep();
            }
        });
        info!(%address, "metrics and health endpoint listening (/metrics, /healthz, /readyz)");
        Ok(Self {
            address,
            server: handle,
            health,
            upkeep,
        })
    }

    /// Keeps readiness and the backlog gauges current; runs until dropped. The broker every
    /// second (lapin's status flag while connected, a reconnect within the link's backoff
    /// while not, so an idle relay is ready again soon); each outbox's database by the
    /// gauges' backlog query (labelled `outbox`) every 5 s, every second while one fails or
    /// takes over 3 s, and its dead rows every minute. `stores` are the outboxes by name. With `max_pending_age`, the
    /// same query checks each outbox's oldest pending row against it: a breach is logged
    /// once when it begins and once when it ends, shown by
    /// `outbox_max_pending_age_exceeded`, and makes the node unready if `readiness` says
    /// so. Poll it only while the relay runs: after [`Broker::close`] a broker probe
    /// would open the connection again.
    pub async fn probe<S: OutboxStore>(
        &self,
        stores: &[(&str, &S)],
        broker: &Broker,
        max_pending_age: Option<MaxPendingAge>,
        stalls: &[(String, StallReports)],
    ) -> Infallible {
        let mut watched: Vec<_> = stores
            .iter()
            .map(|(name, store)| {
                let label = || name.to_string();
                Watched {
                    name,
                    store: *store,
                    pending: metrics::gauge!(instruments::PENDING_EVENTS, "outbox" => label()),
                    oldest: metrics::gauge!(instruments::OLDEST_PENDING_AGE, "outbox" => label()),
                    dead: metrics::gauge!(instruments::DEAD_EVENTS, "outbox" => label()),
                    exceeded: max_pending_age.map(|bound| {
                        metrics::gauge!(instruments::MAX_PENDING_AGE, "outbox" => label())
                            .set(bound.age.as_secs_f64());
                        let gauge =
                            metrics::gauge!(instruments::PENDING_AGE_EXCEEDED, "outbox" => label());
                        gauge.set(0.0);
                        gauge
                    }),
                    late: false,
                }
            })
            .collect();
        let [database_up, broker_up] = DEPENDENCIES
            .map(|dependency| metrics::gauge!(instruments::UP, "dependency" => dependency));
        let broker_blocked = metrics::gauge!(instruments::BROKER_BLOCKED);
        let mut backlog_due = Instant::now();
        let mut dead_due = Instant::now();
        // Readiness as last logged: a change is logged once (the links log the details of
        // their own losses and recoveries).
        let mut logged = Some(String::from("starting"));
        loop {
            let usable = broker.probe().await;
            // The gauge first: whoever saw /readyz change finds it changed too.
            broker_up.set(f64::from(u8::from(usable)));
            self.health.broker.store(usable, Ordering::Relaxed);
            let blocked = broker.blocked();
            broker_blocked.set(f64::from(u8::from(blocked.is_some())));
            *self
                .health
                .blocked
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = blocked;
            if Instant::now() >= backlog_due {
                let mut usable = true;
                for outbox in &mut watched {
                    let backlog =
                        tokio::time::timeout(BACKLOG_TIMEOUT, outbox.store.backlog()).await;
                    match backlog {
                        Ok(Ok(backlog)) => {
                            let age = backlog.oldest_pending_age_seconds.unwrap_or(0.0);
                            outbox.pending.set(backlog.pending as f64);
                            outbox.oldest.set(age);
                            if let Some(bound) = max_pending_age {
                                outbox.check_age(age, bound.age);
                            }
                        }
                        // A breach stays as last seen while the database does not answer.
                        Ok(Err(_)) | Err(_) => usable = false,
                    }
                }
                if usable && Instant::now() >= dead_due {
                    for outbox in &watched {
                        let dead =
                            tokio::time::timeout(BACKLOG_TIMEOUT, outbox.store.dead_count()).await;
                        if let Ok(Ok(dead)) = dead {
                            outbox.dead.set(dead as f64);
                        }
                    }
                    dead_due = Instant::now() + DEAD_EVERY;
                }
                if let Some(bound) = max_pending_age.filter(|bound| bound.readiness) {
                    let late: Vec<&str> = watched
                        .iter()
                        .filter(|outbox| outbox.late)
                        .map(|outbox| outbox.name)
                        .collect();
                    *self.health.late.lock().unwrap_or_else(|e| e.into_inner()) =
                        (!late.is_empty()).then(|| {
                            format!(
                                "backlog older than {} ({})",
                                humantime::format_duration(bound.age),
                                late.join(", ")
                            )
                        });
                }
                database_up.set(f64::from(u8::from(usable)));
                self.health.database.store(usable, Ordering::Relaxed);
                backlog_due = Instant::now() + if usable { BACKLOG_EVERY } else { PROBE_EVERY };
            }
            let stalled: Vec<String> = stalls
                .iter()
                .filter_map(|(outbox, reports)| {
                    let reason = reports.borrow().as_ref().map(|stall| stall.reason)?;
                    Some(format!("{outbox} ({reason})"))
                })
                .collect();
            *self
                .health
                .stalled
                .lock()
                .unwrap_or_else(|e| e.into_inner()) =
                (!stalled.is_empty()).then(|| format!("stalled: {}", stalled.join(", ")));
            let problems = self.health.problems();
            if problems != logged {
                match &problems {
                    None => info!("ready: database and broker usable"),
                    Some(problems) => warn!(%problems, "not ready; /readyz answers 503"),
                }
                logged = problems;
            }
            tokio::time::sleep(PROBE_EVERY).await;
        }
    }

    /// `run` waits for `dependency` at start (`None`: no longer): `/readyz` says so. Those
    /// before it are up: the database before the broker.
    pub fn waiting_for(&self, dependency: Option<Dependency>) {
        if dependency == Some(Dependency::Broker) {
            metrics::gauge!(instruments::UP, "dependency" => Dependency::Database.label()).set(1.0);
        }
        *self
            .health
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = dependency;
    }

    /// The graceful shutdown has begun: `/readyz` answers 503 from now on, while
    /// `/metrics` keeps answering until [`Endpoint::stop`].
    pub fn shutting_down(&self) {
        self.health.stopping.store(true, Ordering::Relaxed);
    }

    /// Stops serving; open connections are dropped. Bounded by a fraction of a second.
    pub async fn stop(self) {
        let _ = tokio::time::timeout(STOP_TIMEOUT, self.server.stop(false)).await;
        let _ = self.upkeep.stop();
    }
}

/// The recorder's settings: the `node_id` label, and histograms with buckets chosen for
/// each metric (the exporter's default would be summaries, which cannot be aggregated
/// across nodes).
fn recorder(node_id: &str) -> anyhow::Result<PrometheusBuilder> {
    let buckets = [
        (instruments::PUBLISH_CONFIRM, CONFIRM_BUCKETS),
        (instruments::COMMIT_TO_CONFIRM, COMMIT_TO_CONFIRM_BUCKETS),
        (instruments::CLAIM_BATCH_SIZE, BATCH_BUCKETS),
        (instruments::CLAIM_DURATION, CLAIM_BUCKETS),
        (instruments::MARK_BATCH_SIZE, BATCH_BUCKETS),
    ];
    let mut builder = PrometheusBuilder::new().add_global_label("node_id", node_id);
    for (name, bounds) in buckets {
        builder = builder.set_buckets_for_metric(Matcher::Full(name.into()), bounds)?;
    }
    Ok(builder)
}

async fn metrics(served: web::Data<Served>) -> HttpResponse {
    // A few reads of /proc/self, on the endpoint's own thread.
    served.process.collect();
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(served.prometheus.render())
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .body("alive\n")
}

async fn readyz(served: web::Data<Served>) -> HttpResponse {
    match served.health.problems() {
        None => HttpResponse::Ok()
            .content_type("text/plain; charset=utf-8")
            .body("ready\n"),
        Some(problems) => HttpResponse::ServiceUnavailable()
            .content_type("text/plain; charset=utf-8")
            .body(format!("not ready: {problems}\n")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_needs_both_sides_and_ends_with_the_shutdown() {
        let health = Health::default();
        assert_eq!(
            health.problems().as_deref(),
            Some("database unreachable, broker unreachable"),
            "nothing probed yet: not ready"
        );
        health.database.store(true, Ordering::Relaxed);
        assert_eq!(health.problems().as_deref(), Some("broker unreachable"));
        health.broker.store(true, Ordering::Relaxed);
        assert_eq!(health.problems(), None);
        health.database.store(false, Ordering::Relaxed);
        assert_eq!(health.problems().as_deref(), Some("database unreachable"));
        health.database.store(true, Ordering::Relaxed);
        health.stopping.store(true, Ordering::Relaxed);
        assert_eq!(health.problems().as_deref(), Some("shutting down"));
    }

    #[test]
    fn while_waiting_at_start_readiness_names_the_dependency() {
        let health = Health::default();
        *health.waiting.lock().unwrap() = Some(Dependency::Database);
        assert_eq!(
            health.problems().as_deref(),
            Some("waiting for the database")
        );
        *health.waiting.lock().unwrap() = Some(Dependency::Broker);
        assert_eq!(health.problems().as_deref(), Some("waiting for the broker"));
        *health.waiting.lock().unwrap() = None;
        assert_eq!(
            health.problems().as_deref(),
            Some("database unreachable, broker unreachable"),
            "not probed yet"
        );
    }

    #[test]
    fn a_broker_alarm_is_named_while_it_lasts() {
        let health = Health::default();
        health.database.store(true, Ordering::Relaxed);
        health.broker.store(true, Ordering::Relaxed);
        *health.blocked.lock().unwrap() = Some("low on memory".into());
        assert_eq!(
            health.problems().as_deref(),
            Some("broker blocks publishers (low on memory)")
        );
        *health.blocked.lock().unwrap() = None;
        assert_eq!(health.problems(), None);
    }

    #[test]
    fn a_late_backlog_is_one_more_problem() {
        let health = Health::default();
        health.database.store(true, Ordering::Relaxed);
        health.broker.store(true, Ordering::Relaxed);
        *health.late.lock().unwrap() = Some("backlog older than 30s (orders)".into());
        assert_eq!(
            health.problems().as_deref(),
            Some("backlog older than 30s (orders)")
        );
        health.broker.store(false, Ordering::Relaxed);
        assert_eq!(
            health.problems().as_deref(),
            Some("broker unreachable, backlog older than 30s (orders)")
        );
    }

    #[test]
    fn a_breach_begins_and_ends_past_the_bound() {
        let mut outbox = Watched {
            name: "orders",
            store: &(),
            pending: metrics::Gauge::noop(),
            oldest: metrics::Gauge::noop(),
            dead: metrics::Gauge::noop(),
            exceeded: None,
            late: false,
        };
        let bound = Duration::from_secs(30);
        outbox.check_age(30.0, bound);
        assert!(!outbox.late, "at the bound: not yet late");
        outbox.check_age(30.5, bound);
        assert!(outbox.late);
        outbox.check_age(0.0, bound);
        assert!(!outbox.late, "drained");
    }

    #[test]
    fn every_histogram_gets_sorted_buckets() {
        for bounds in [CONFIRM_BUCKETS, COMMIT_TO_CONFIRM_BUCKETS, BATCH_BUCKETS] {
            assert!(
                bounds.windows(2).all(|pair| pair[0] < pair[1]),
                "{bounds:?}"
            );
        }
        assert!(recorder("node-a").is_ok());
    }
}
