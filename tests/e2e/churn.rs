//! Churn: three nodes on one table while a producer inserts at a steady rate, and a fixed
//! schedule of faults — a node killed (SIGKILL) and restarted, one stopped (SIGTERM) and
//! restarted, the broker link cut, the database link cut, both cut at once while a killed
//! node restarts. At the end nothing is lost, each room's first deliveries came in id
//! order, no node exited by itself and no row is left locked.
//!
//! The short run is in the suite; the same scenario for longer is
//! `OUTBOX_CHURN_SECONDS=300 cargo test -p outbox-tests --test e2e -- --ignored churn_for_minutes::postgres`.

use outbox_relay::settings::Settings;
use outbox_store::{NewEvent, TableName};
use outbox_tests::{event, eventually, Backend, FaultProxy, RelayProcess, TestApp};
use sea_orm::DatabaseConnection;
use std::path::PathBuf;
use std::time::Duration;
use tokio::time::Instant;

const NODES: usize = 3;
/// The producer's rate: 15 events every 100 ms.
const PER_TICK: usize = 15;
const TICK: Duration = Duration::from_millis(100);
/// The producer's rooms, its own.
const ROOMS: usize = 20;
/// One fault every `STEP`; a cut lasts `OUTAGE`.
const STEP: Duration = Duration::from_secs(3);
const OUTAGE: Duration = Duration::from_secs(2);
/// The short run: five faults, one of each kind.
const SHORT: Duration = Duration::from_secs(16);
/// How long every event may take to arrive once the producer stopped.
const DRAIN: Duration = Duration::from_secs(60);
/// A SIGTERM stop's bound: `publish_timeout` (3 s) + 2 s, with room for a loaded machine.
const STOP: Duration = Duration::from_secs(10);

/// The faults, in the order the schedule repeats them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// SIGKILL a node, restart it at once (same `node_id`: it frees its leases at start).
    Kill,
    /// Cut every broker connection and refuse new ones for [`OUTAGE`].
    BrokerCut,
    /// SIGTERM a node, expect exit code 0, restart it.
    Stop,
    /// Cut every database connection and refuse new ones for [`OUTAGE`].
    DatabaseCut,
    /// Both links down for [`OUTAGE`] (at least until the node below says it waits);
    /// meanwhile a node is killed and restarted, so it starts while neither is reachable.
    BothCut,
}

const SCHEDULE: [Fault; 5] = [
    Fault::Kill,
    Fault::BrokerCut,
    Fault::Stop,
    Fault::DatabaseCut,
    Fault::BothCut,
];

/// One node: its settings (the same on every restart) and its current process.
struct Node {
    settings: Settings,
    process: RelayProcess,
    /// The logs of its earlier processes, removed when the test passes.
    logs: Vec<PathBuf>,
}

impl Node {
    fn start(settings: Settings) -> Self {
        let process = RelayProcess::spawn(crate::RELAY, &settings);
        Self {
            settings,
            process,
            logs: Vec::new(),
        }
    }

    /// Panics, with the end of its log, if its process has exited.
    fn assert_running(&mut self, when: &str) {
        if let Some(status) = self.process.exited() {
            panic!(
                "{} exited by itself ({status}) {when}; the end of its log:\n{}",
                self.settings.relay.node_id,
                tail(&self.process.log_text())
            );
        }
    }

    /// A new process with the same settings, after the old one exited.
    fn restart(&mut self) {
        let old = std::mem::replace(
            &mut self.process,
            RelayProcess::spawn(crate::RELAY, &self.settings),
        );
        self.logs.push(old.log.clone());
    }

    async fn kill(&mut self) {
        self.process.signal("KILL");
        self.process.wait(Duration::from_secs(5)).await;
    }

    /// SIGTERM and exit code 0 within [`STOP`]; how long it took.
    async fn stop(&mut self) -> Duration {
        let signalled = Instant::now();
        self.process.signal("TERM");
        let status = self.process.wait(STOP).await;
        assert!(
            status.success(),
            "{} exited with {status} on SIGTERM; the end of its log:\n{}",
            self.settings.relay.node_id,
            tail(&self.process.log_text())
        );
        signalled.elapsed()
    }

    /// Waits until its process says it waits for the database (it started during an
    /// outage, and must neither exit nor give up).
    async fn waits_for_the_database(&self) {
        eventually(
            &format!("{} to wait for the database", self.settings.relay.node_id),
            Duration::from_secs(30),
            || {
                std::future::ready(
                    self.process
                        .log_text()
                        .contains("database is not usable yet; trying again"),
                )
            },
        )
        .await;
    }

    fn remove_logs(self) {
        for log in self.logs.iter().chain([&self.process.log]) {
            let _ = std::fs::remove_file(log);
        }
    }
}

/// The last 40 lines of a log.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Event `n` of the producer: in room `churn-room-<n mod ROOMS>`.
fn churn_event(n: usize) -> NewEvent {
    event(
        &format!("churn-{n:07}"),
        &format!("churn-room-{:02}", n % ROOMS),
    )
}

/// Inserts [`PER_TICK`] events every [`TICK`] until `until`, straight into the database
/// (not through the proxy: the producer's own link is not cut); what it inserted.
async fn produce(db: DatabaseConnection, table: TableName, until: Instant) -> Vec<NewEvent> {
    let mut ticks = tokio::time::interval(TICK);
    let mut inserted = Vec::new();
    while Instant::now() < until {
        ticks.tick().await;
        let batch: Vec<NewEvent> = (inserted.len()..inserted.len() + PER_TICK)
            .map(churn_event)
            .collect();
        outbox_store::insert_events(&db, &table, &batch)
            .await
            .expect("the producer's insert");
        inserted.extend(batch);
    }
    inserted
}

/// Takes the links of `proxies` away for [`OUTAGE`].
async fn outage(proxies: &[&FaultProxy]) {
    for proxy in proxies {
        proxy.go_down();
    }
    // The outage itself: the nodes are without the service meanwhile.
    tokio::time::sleep(OUTAGE).await;
    for proxy in proxies {
        proxy.restore();
    }
}

/// What a run counted.
#[derive(Debug, Default)]
struct Figures {
    kills: usize,
    stops: usize,
    broker_cuts: usize,
    database_cuts: usize,
    both_cuts: usize,
    slowest_stop: Duration,
}

impl Figures {
    fn faults(&self) -> usize {
        self.kills + self.stops + self.broker_cuts + self.database_cuts + self.both_cuts
    }

    /// The most duplicates the faults may cause, given a node's in-flight `window` (the
    /// most rows it holds published but not yet marked: 4 × `relay.batch_size`, README,
    /// "Limits"), as docs/operations/failures.md counts
    /// them ("What a fault costs in duplicates"): a duplicate is a row the broker took
    /// whose outcome was never written, so each fault costs at most the in-flight window
    /// of every node it hit. A kill: the killed node's window (a both-cut kills one too).
    /// A broker cut: confirms lost with the connection, at most every node's window
    /// (a both-cut cuts the broker too). A SIGTERM stop: none (a graceful stop). A
    /// database cut: none, since it ends long before `relay.lease` (30 s) expires.
    fn duplicate_bound(&self, window: usize) -> usize {
        window * (self.kills + self.both_cuts)
            + NODES * window * (self.broker_cuts + self.both_cuts)
    }
}

/// The churn scenario on `backend`, the producer inserting for `duration`, one fault of
/// [`SCHEDULE`] every [`STEP`] meanwhile.
async fn churn(backend: Backend, duration: Duration) {
    let app = TestApp::on(backend).build().await;
    let window = 4 * usize::try_from(app.settings.relay.batch_size).expect("a batch size");
    let (database_proxy, database_url) = FaultProxy::in_front_of(&app.settings.database.url).await;
    let (broker_proxy, broker_url) = FaultProxy::in_front_of(&app.settings.amqp.url).await;
    let mut nodes: Vec<Node> = (0..NODES)
        .map(|n| {
            Node::start(app.settings_with(|settings| {
                settings.database.url = database_url.clone();
                settings.amqp.url = broker_url.clone();
                settings.relay.node_id = format!("{}-node{n}", app.database.table);
            }))
        })
        .collect();

    let start = Instant::now();
    let producer = actix_rt::spawn(produce(
        app.database.db().clone(),
        app.database.table.clone(),
        start + duration,
    ));
    let mut figures = Figures::default();
    for step in 0_usize.. {
        let at = start + STEP / 3 + STEP * u32::try_from(step).expect("a few steps");
        if at + STEP > start + duration {
            break;
        }
        tokio::time::sleep_until(at).await;
        let when = format!("before fault {step}");
        for node in &mut nodes {
            node.assert_running(&when);
        }
        // Each fault takes the next node in turn.
        let node = &mut nodes[step % NODES];
        match SCHEDULE[step % SCHEDULE.len()] {
            Fault::Kill => {
                node.kill().await;
                node.restart();
                figures.kills += 1;
            }
            Fault::Stop => {
                figures.slowest_stop = figures.slowest_stop.max(node.stop().await);
                node.restart();
                figures.stops += 1;
            }
            Fault::BrokerCut => {
                outage(&[&broker_proxy]).await;
                figures.broker_cuts += 1;
            }
            Fault::DatabaseCut => {
                outage(&[&database_proxy]).await;
                figures.database_cuts += 1;
            }
            Fault::BothCut => {
                let cut = Instant::now();
                database_proxy.go_down();
                broker_proxy.go_down();
                node.kill().await;
                node.restart();
                node.waits_for_the_database().await;
                // The rest of the outage.
                tokio::time::sleep_until(cut + OUTAGE).await;
                database_proxy.restore();
                broker_proxy.restore();
                figures.both_cuts += 1;
            }
        }
    }
    let events = producer.await.expect("the producer finished");
    let produced = Instant::now();

    app.broker.wait_for_each(&events, DRAIN).await;
    let drained = produced.elapsed();
    // Settled, so a late duplicate is counted too.
    let received = app.broker.drain(Duration::from_secs(30)).await;
    for node in &mut nodes {
        node.assert_running("by the end of the run");
    }
    let order = outbox_tests::room_order(&received);
    let arrived: std::collections::HashSet<&str> =
        received.iter().map(|r| r.message_id.as_str()).collect();
    let lost: Vec<&str> = events
        .iter()
        .map(|e| e.event_id.as_str())
        .filter(|id| !arrived.contains(id))
        .collect();
    println!(
        "churn ({backend:?}, {} s, {NODES} nodes): {} events, {} faults (kill -9 and restart: {}, \
         SIGTERM and restart: {}, broker cut: {}, database cut: {}, both cut with a restart \
         during the cut: {}), {} deliveries, {} duplicates, {} order violations, {} lost; every \
         event delivered {:.1} s after the producer stopped (duplicates allowed: {}); slowest SIGTERM stop {:.2} s; \
         connections refused while down: {} broker, {} database",
        duration.as_secs(),
        events.len(),
        figures.faults(),
        figures.kills,
        figures.stops,
        figures.broker_cuts,
        figures.database_cuts,
        figures.both_cuts,
        received.len(),
        order.duplicates,
        order.violations.len(),
        lost.len(),
        drained.as_secs_f64(),
        figures.duplicate_bound(window),
        figures.slowest_stop.as_secs_f64(),
        broker_proxy.refused(),
        database_proxy.refused(),
    );
    assert!(
        lost.is_empty(),
        "{} events lost within {DRAIN:?}, the first: {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    assert!(
        order.violations.is_empty(),
        "per-room order broken {} times, the first: {:?}",
        order.violations.len(),
        &order.violations[..order.violations.len().min(5)]
    );
    assert!(
        order.duplicates <= figures.duplicate_bound(window),
        "{} duplicates, more than the faults' in-flight windows allow ({}: {figures:?})",
        order.duplicates,
        figures.duplicate_bound(window)
    );
    assert!(
        figures.kills > 0
            && figures.stops > 0
            && figures.broker_cuts > 0
            && figures.database_cuts > 0
            && figures.both_cuts > 0,
        "every kind of fault happened: {figures:?}"
    );
    // The cuts bit: nodes tried to reach each service while it was down.
    assert!(
        broker_proxy.refused() > 0 && database_proxy.refused() > 0,
        "connections refused while down: {} broker, {} database",
        broker_proxy.refused(),
        database_proxy.refused()
    );

    // The final graceful stop leaves every row published and none leased.
    for node in &mut nodes {
        node.stop().await;
    }
    let rows = app.database.rows().await;
    assert_eq!(rows.len(), events.len(), "one row per event");
    for row in &rows {
        assert_eq!(row.status, "published", "{}", row.event_id);
        assert!(
            row.locked_by.is_none() && row.locked_until.is_none(),
            "{} still leased to {:?} until {:?}",
            row.event_id,
            row.locked_by,
            row.locked_until
        );
    }
    for node in nodes {
        node.remove_logs();
    }
    app.teardown().await;
}

async fn three_nodes_ride_out_kills_stops_and_cuts_while_a_producer_inserts(backend: Backend) {
    churn(backend, SHORT).await;
}
outbox_tests::per_backend!(three_nodes_ride_out_kills_stops_and_cuts_while_a_producer_inserts: postgres, mariadb);

/// The same for `OUTBOX_CHURN_SECONDS` (default 300): a documented command, not in the
/// suite.
async fn churn_for_minutes(backend: Backend) {
    let seconds = std::env::var("OUTBOX_CHURN_SECONDS").map_or(300, |text| {
        text.parse()
            .unwrap_or_else(|_| panic!("OUTBOX_CHURN_SECONDS={text:?}: expected whole seconds"))
    });
    churn(backend, Duration::from_secs(seconds)).await;
}

/// [`churn_for_minutes`] per backend, as `per_backend!` would make them, but ignored.
mod churn_for_minutes {
    use outbox_tests::Backend;

    #[actix_rt::test]
    #[ignore = "minutes long: OUTBOX_CHURN_SECONDS=300 cargo test -p outbox-tests --test e2e -- --ignored churn_for_minutes::postgres"]
    async fn postgres() {
        super::churn_for_minutes(Backend::Postgres).await;
    }

    #[actix_rt::test]
    #[ignore = "minutes long: OUTBOX_CHURN_SECONDS=300 cargo test -p outbox-tests --test e2e -- --ignored churn_for_minutes::mariadb"]
    async fn mariadb() {
        super::churn_for_minutes(Backend::MySql).await;
    }
}
