//! Failovers with servers the tests own (`outbox_tests::replica`): a PostgreSQL primary
//! and its streaming standby behind one address (a TCP proxy standing in for the DNS name
//! or virtual IP that moves), and a MariaDB server whose `read_only` flips. The relay
//! never stays on a server that takes no writes: it resumes within seconds once the
//! address (or the server) is writable again; nothing lost, room order kept.

use outbox_relay::settings::Settings;
use outbox_store::{insert_events, NewEvent, TableName};
use outbox_tests::replica::{MariaServer, PgPair};
use outbox_tests::{
    assert_delivered_once, assert_every_event_delivered, eventually, http_get, room_events,
    settings_on, unique_name, FaultProxy, RelayProcess, TestBroker,
};
use sea_orm::{AccessMode, ConnectionTrait, DatabaseConnection, TransactionTrait};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the issue asks of a resumption: within seconds, not the pool's connection lifetime.
const RESUMES_WITHIN: Duration = Duration::from_secs(5);

/// A relay on `url`'s table, JSON logs, its metrics endpoint on a free port.
fn relay_settings(url: &str, table: &TableName, broker: &TestBroker) -> Settings {
    settings_on(url, table, broker, |settings| {
        settings.metrics.listen = "127.0.0.1:0".into();
        settings.log.format = "json".into();
    })
}

/// A migrated outbox table on the server at `url`, and a pool there for the producer.
async fn outbox_at(url: &str) -> (DatabaseConnection, TableName) {
    let db = outbox_store::connect(url, 2)
        .await
        .unwrap_or_else(|error| panic!("{url}: {error}"))
        .into_connection();
    let table = TableName::parse(&unique_name("failover")).expect("a table name");
    outbox_store::migrate(&db, &table)
        .await
        .expect("migration runs");
    (db, table)
}

/// Inserts `events` in a read-write transaction (the server may default to read-only).
async fn produce(db: &DatabaseConnection, table: &TableName, events: &[NewEvent]) {
    let txn = db
        .begin_with_config(None, Some(AccessMode::ReadWrite))
        .await
        .expect("a transaction");
    insert_events(&txn, table, events)
        .await
        .expect("events inserted");
    txn.commit().await.expect("committed");
}

/// Waits until more than `before` deliveries arrived; how long after `since` that was.
async fn first_delivery_after(broker: &TestBroker, before: usize, since: Instant) -> Duration {
    eventually(
        "a delivery after the failover",
        Duration::from_secs(60),
        || async { broker.received().len() > before },
    )
    .await;
    since.elapsed()
}

async fn readiness(metrics: SocketAddr, status: u16) {
    eventually(
        &format!("/readyz answering {status}"),
        Duration::from_secs(30),
        || async { http_get(metrics, "/readyz").await.0 == status },
    )
    .await;
}

/// `outbox_database_failovers_total`, summed over its series.
async fn failovers(metrics: SocketAddr) -> f64 {
    let (_, body) = http_get(metrics, "/metrics").await;
    body.lines()
        .filter(|line| line.starts_with("outbox_database_failovers_total"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The warning a switch to a server that takes no writes logs, once per switch
/// (docs/operations/failover.md, "Once per switch").
const SWITCH: &str = "the database server takes no writes";

/// How many times `relay` has logged [`SWITCH`].
fn switches_logged(relay: &RelayProcess) -> usize {
    relay.log_lines(SWITCH).len()
}

/// Rows still leased once every event is out and the relays have stopped.
async fn locked_rows(db: &DatabaseConnection, table: &TableName) -> i64 {
    let row = db
        .query_one(sea_orm::Statement::from_string(
            db.get_database_backend(),
            format!("SELECT COUNT(*) AS n FROM {table} WHERE locked_by IS NOT NULL"),
        ))
        .await
        .expect("count")
        .expect("a row");
    row.try_get_by_index::<i64>(0).expect("a count")
}

/// (a) The relay starts while the address points at the standby: it waits, saying why,
/// and starts once the address points at the primary. The address points at the
/// read-only standby again, then back at the primary without closing any connection; then the primary itself turns read-only under the relay's open
/// connections (`default_transaction_read_only`) and back. Each time: not ready while no
/// writable server answers, delivery within seconds once one does, the switch logged once
/// and counted.
#[actix_rt::test]
async fn postgres_a_read_only_server_is_left_and_delivery_resumes_within_seconds() {
    let pair = Arc::new(
        tokio::task::spawn_blocking(PgPair::start)
            .await
            .expect("pair"),
    );
    let primary_url = PgPair::url(pair.primary);
    let (primary, table) = outbox_at(&primary_url).await;
    let broker = TestBroker::new("#").await;
    let proxy = FaultProxy::start(pair.standby).await;
    let url = format!("postgres://postgres@{}/postgres", proxy.addr);
    let relay = RelayProcess::spawn(crate::RELAY, &relay_settings(&url, &table, &broker));
    let metrics = relay.metrics_address().await;
    eventually(
        "the start-up wait naming the standby",
        Duration::from_secs(30),
        || async {
            relay
                .log_lines("the database is not usable yet")
                .iter()
                .any(|line| {
                    line["reason"]
                        .as_str()
                        .is_some_and(|reason| reason.contains("standby"))
                })
        },
    )
    .await;
    proxy.point_at(pair.primary);

    let first = room_events("fo-a1", 100, 5);
    produce(&primary, &table, &first).await;
    broker.wait_for(first.len(), Duration::from_secs(30)).await;
    readiness(metrics, 200).await;
    // The start-up wait on the standby, before any switch.
    let at_start = switches_logged(&relay);
    let counted_at_start = failovers(metrics).await;

    // The address moves to the standby; the old server's connections are gone.
    proxy.point_at(pair.standby);
    proxy.cut();
    let second = room_events("fo-a2", 100, 5);
    produce(&primary, &table, &second).await;
    readiness(metrics, 503).await;
    let (_, body) = http_get(metrics, "/readyz").await;
    assert!(body.contains("database"), "{body}");
    assert_eq!(
        broker.received().len(),
        first.len(),
        "nothing from a standby"
    );

    // Back at the primary, without closing anything.
    let before = broker.received().len();
    proxy.point_at(pair.primary);
    let moved = Instant::now();
    let resumed = first_delivery_after(&broker, before, moved).await;
    println!(
        "postgres: address writable again -> first delivery: {:.2} s",
        resumed.as_secs_f64()
    );
    outbox_tests::assert_within("resuming on a writable server", resumed, RESUMES_WITHIN);
    let received = broker.wait_for_each(&second, Duration::from_secs(30)).await;
    assert_every_event_delivered(&received, &second);
    readiness(metrics, 200).await;
    assert_eq!(
        switches_logged(&relay),
        at_start + 1,
        "the move to the standby logged once; log:\n{}",
        relay.log_text()
    );
    assert_eq!(
        failovers(metrics).await,
        counted_at_start + 1.0,
        "the move to the standby counted once"
    );

    // The primary turns read-only under the relay's open connections.
    let counted = failovers(metrics).await;
    PgPair::sql(
        pair.primary,
        &[
            "ALTER SYSTEM SET default_transaction_read_only = on",
            "SELECT pg_reload_conf()",
        ],
    );
    let third = room_events("fo-a3", 100, 5);
    produce(&primary, &table, &third).await;
    readiness(metrics, 503).await;
    eventually("the switch counted", Duration::from_secs(30), || async {
        failovers(metrics).await > counted
    })
    .await;
    let before = broker.received().len();
    PgPair::sql(
        pair.primary,
        &[
            "SET default_transaction_read_only = off",
            "ALTER SYSTEM RESET default_transaction_read_only",
            "SELECT pg_reload_conf()",
        ],
    );
    let writable = Instant::now();
    let resumed = first_delivery_after(&broker, before, writable).await;
    println!(
        "postgres: server writable again -> first delivery: {:.2} s",
        resumed.as_secs_f64()
    );
    outbox_tests::assert_within("resuming on a writable server", resumed, RESUMES_WITHIN);
    broker.wait_for_each(&third, Duration::from_secs(30)).await;
    let all: Vec<NewEvent> = [first, second, third].concat();
    // Settled, so a late duplicate is counted too: a failover causes none.
    let received = broker.drain(Duration::from_secs(30)).await;
    assert_delivered_once("postgres, both switches", &received, &all);
    readiness(metrics, 200).await;
    assert_eq!(
        switches_logged(&relay),
        at_start + 2,
        "each switch logged once; log:\n{}",
        relay.log_text()
    );
    assert_eq!(
        failovers(metrics).await,
        counted + 1.0,
        "the read-only primary counted once"
    );

    relay.stop(Duration::from_secs(10)).await;
    assert_eq!(locked_rows(&primary, &table).await, 0, "no row left locked");
    broker.close().await;
    drop(pair);
}

/// (b) Promotion under load, two nodes behind the address: the primary stops, the standby
/// is promoted and the address moves to it. Nothing lost, room order among first
/// deliveries, no node exits.
#[actix_rt::test]
async fn postgres_promotion_under_load_loses_nothing() {
    let pair = Arc::new(
        tokio::task::spawn_blocking(PgPair::start)
            .await
            .expect("pair"),
    );
    let (primary, table) = outbox_at(&PgPair::url(pair.primary)).await;
    let broker = TestBroker::new("#").await;
    let proxy = FaultProxy::start(pair.primary).await;
    let url = format!("postgres://postgres@{}/postgres", proxy.addr);
    let before_failover = room_events("fo-b1", 3000, 20);
    produce(&primary, &table, &before_failover).await;
    let mut nodes: Vec<RelayProcess> = (0..2)
        .map(|_| RelayProcess::spawn(crate::RELAY, &relay_settings(&url, &table, &broker)))
        .collect();
    broker.wait_for(500, Duration::from_secs(30)).await;

    let stopping = Arc::clone(&pair);
    tokio::task::spawn_blocking(move || {
        stopping.stop_primary();
        stopping.promote_standby();
    })
    .await
    .expect("promoted");
    proxy.point_at(pair.standby);
    let promoted = Instant::now();
    let before = broker.received().len();
    let standby = outbox_store::connect(&PgPair::url(pair.standby), 2)
        .await
        .expect("the promoted standby")
        .into_connection();
    let after_failover = room_events("fo-b2", 200, 20);
    produce(&standby, &table, &after_failover).await;
    let resumed = first_delivery_after(&broker, before, promoted).await;
    println!(
        "postgres: promotion -> first delivery: {:.2} s",
        resumed.as_secs_f64()
    );
    let all: Vec<NewEvent> = [before_failover, after_failover].concat();
    broker.wait_for_each(&all, Duration::from_secs(120)).await;
    // Settled, so a late duplicate is counted too. The primary stops in `fast` mode (its
    // last WAL reaches the standby first), so no bookkeeping is lost: no duplicates.
    let received = broker.drain(Duration::from_secs(30)).await;
    assert_delivered_once("postgres, across the promotion", &received, &all);
    for node in &mut nodes {
        assert_eq!(
            node.exited(),
            None,
            "a node exited; log:\n{}",
            node.log_text()
        );
    }
    for node in nodes {
        node.stop(Duration::from_secs(10)).await;
    }
    assert_eq!(locked_rows(&standby, &table).await, 0, "no row left locked");
    broker.close().await;
    drop(pair);
}

/// (d) MariaDB: `read_only` set under the relay's open connections (a replica promoted
/// elsewhere, as Orchestrator or RDS flip it), then cleared: not ready meanwhile, delivery
/// within seconds after, nothing lost, no row left locked.
#[actix_rt::test]
async fn mariadb_read_only_set_and_cleared_resumes_within_seconds() {
    let server = tokio::task::spawn_blocking(MariaServer::start)
        .await
        .expect("mariadb");
    // The producer writes as an administrator, which read_only does not stop.
    let (producer, table) = outbox_at(&server.admin_url()).await;
    let broker = TestBroker::new("#").await;
    let relay = RelayProcess::spawn(
        crate::RELAY,
        &relay_settings(&server.url(), &table, &broker),
    );
    let metrics = relay.metrics_address().await;
    let first = room_events("fo-d1", 100, 5);
    produce(&producer, &table, &first).await;
    broker.wait_for(first.len(), Duration::from_secs(30)).await;
    readiness(metrics, 200).await;

    server.sql("SET GLOBAL read_only = 1");
    let second = room_events("fo-d2", 100, 5);
    produce(&producer, &table, &second).await;
    readiness(metrics, 503).await;
    assert!(failovers(metrics).await >= 1.0, "counted");
    let before = broker.received().len();
    server.sql("SET GLOBAL read_only = 0");
    let writable = Instant::now();
    let resumed = first_delivery_after(&broker, before, writable).await;
    println!(
        "mariadb: read_only cleared -> first delivery: {:.2} s",
        resumed.as_secs_f64()
    );
    outbox_tests::assert_within("resuming on a writable server", resumed, RESUMES_WITHIN);
    let all: Vec<NewEvent> = [first, second].concat();
    broker.wait_for_each(&all, Duration::from_secs(30)).await;
    // Settled, so a late duplicate is counted too: a failover causes none.
    let received = broker.drain(Duration::from_secs(30)).await;
    assert_delivered_once("mariadb, across the switch", &received, &all);
    readiness(metrics, 200).await;
    assert_eq!(
        switches_logged(&relay),
        1,
        "the switch logged once; log:\n{}",
        relay.log_text()
    );
    assert_eq!(failovers(metrics).await, 1.0, "the switch counted once");
    relay.stop(Duration::from_secs(10)).await;
    assert_eq!(
        locked_rows(&producer, &table).await,
        0,
        "no row left locked"
    );
    broker.close().await;
    drop(server);
}

/// (c) A two-host URL whose first host is the read-only standby: the relay starts on the
/// primary, the second host; after the primary stops and the standby is promoted, it
/// moves to the first. Nothing lost, room order kept, the node never exits.
#[actix_rt::test]
async fn postgres_a_host_list_starts_on_the_writable_host_and_follows_a_promotion() {
    let pair = Arc::new(
        tokio::task::spawn_blocking(PgPair::start_apart)
            .await
            .expect("pair"),
    );
    let (primary, table) = outbox_at(&PgPair::url(pair.primary)).await;
    let broker = TestBroker::new("#").await;
    // libpq's form, each host with its port; the standby first, as after an earlier
    // switchover nobody reordered the list.
    let url = format!(
        "postgres://postgres@{},{}/postgres",
        pair.standby, pair.primary
    );
    let mut relay = RelayProcess::spawn(crate::RELAY, &relay_settings(&url, &table, &broker));
    let first = room_events("fo-c1", 100, 5);
    produce(&primary, &table, &first).await;
    broker.wait_for_each(&first, Duration::from_secs(30)).await;

    let failing = Arc::clone(&pair);
    tokio::task::spawn_blocking(move || {
        failing.stop_primary();
        failing.promote_standby();
    })
    .await
    .expect("promoted");
    let promoted = Instant::now();
    let before = broker.received().len();
    let standby = outbox_store::connect(&PgPair::url(pair.standby), 2)
        .await
        .expect("the promoted standby")
        .into_connection();
    let second = room_events("fo-c2", 100, 5);
    produce(&standby, &table, &second).await;
    let resumed = first_delivery_after(&broker, before, promoted).await;
    println!(
        "postgres, two hosts: promotion -> first delivery: {:.2} s",
        resumed.as_secs_f64()
    );
    let all: Vec<NewEvent> = [first, second].concat();
    broker.wait_for_each(&all, Duration::from_secs(60)).await;
    // Settled, so a late duplicate is counted too: a failover causes none.
    let received = broker.drain(Duration::from_secs(30)).await;
    assert_delivered_once("postgres, two hosts, across the promotion", &received, &all);
    assert_eq!(relay.exited(), None, "exited; log:\n{}", relay.log_text());
    assert_eq!(
        relay
            .log_lines("the database pool connects to another host")
            .len(),
        1,
        "the one move logged once; log:\n{}",
        relay.log_text()
    );
    relay.stop(Duration::from_secs(10)).await;
    assert_eq!(locked_rows(&standby, &table).await, 0, "no row left locked");
    broker.close().await;
    drop(pair);
}
