//! One live process per `node_id` and table: a second `run` with the node of a live one is
//! refused (exit 2, naming the node and its holder) and takes none of its leases; after a
//! SIGKILL the next process with the same node starts and clears the dead one's leases at
//! once, not after they expire; a process whose lock is taken over while it relays claims
//! nothing from that moment and exits 2; one whose lock session ends with nobody taking it
//! takes it again and goes on.

use outbox_relay::settings::Settings;
use outbox_store::NewEvent;
use outbox_tests::TestDatabase;
use outbox_tests::{
    assert_room_order, eventually, per_backend, room_events, Backend, FaultProxy, Load,
    RelayProcess, TestApp, CHILD_DEADLINE,
};
use std::time::Duration;

/// A lease far longer than the tests: a row delivered after a kill was released, not
/// taken over after its lease.
const LONG_LEASE: &str = "10m";

/// A relay process on `app` that has relayed some events and holds leases on more: it
/// reaches the broker through a proxy, stalled once it relays, and `late` is inserted then,
/// so it claims rows whose publishes cannot end (however fast it drained the rest).
/// Its settings (with the 10-minute lease), its node, the proxy and the process.
async fn a_node_holding_rows(
    app: &TestApp,
    late: &[NewEvent],
) -> (Settings, String, FaultProxy, RelayProcess) {
    let (link, broker_url) = FaultProxy::in_front_of(&app.broker.url).await;
    let settings = app.settings_with(|settings| {
        settings.relay.lease = LONG_LEASE.into();
        settings.amqp.url = broker_url;
    });
    let node_id = settings.relay.node_id.clone();
    let relay = RelayProcess::spawn(crate::RELAY, &settings);
    eventually("the node relays", Duration::from_secs(60), || async {
        app.broker.received().len() >= 10
    })
    .await;
    link.stall();
    outbox_tests::seed(&app.database, late).await;
    eventually("the node holds rows", Duration::from_secs(30), || async {
        !app.database.held_by(&node_id).await.is_empty()
    })
    .await;
    (settings, node_id, link, relay)
}

async fn a_second_process_with_a_live_node_id_is_refused(backend: Backend) {
    const EVENTS: usize = 200;
    let mut seeded = room_events("twin", EVENTS, 10);
    let late = room_events("twin-late", 20, 4);
    let app = TestApp::on(backend).seeded(&seeded).build().await;
    let (settings, node_id, link, first) = a_node_holding_rows(&app, &late).await;
    seeded.extend(late);

    let held = lease_ids(&app, &node_id).await;
    let mut second = RelayProcess::spawn(crate::RELAY, &settings);
    let status = second.wait(CHILD_DEADLINE).await;
    let log = second.log_text();
    assert_eq!(
        status.code(),
        Some(2),
        "refused as a configuration error:\n{log}"
    );
    assert!(
        log.contains(&node_id) && log.contains("is in use"),
        "names the node:\n{log}"
    );
    match backend {
        // The holder's process id and host, from pg_stat_activity or the lock file.
        Backend::Postgres | Backend::Sqlite => assert!(
            log.contains(&format!("pid {}", first.pid())),
            "names the holder's pid:\n{log}"
        ),
        Backend::MySql => assert!(log.contains("MySQL connection"), "{log}"),
    }
    assert!(!log.contains("released leases"), "{log}");
    // Each row the live process held is held still, or published by it meanwhile.
    let released: Vec<i64> = (app.database.rows().await.into_iter())
        .filter(|row| held.contains(&row.id))
        .filter(|row| row.status == "pending" && row.locked_by.as_deref() != Some(&node_id))
        .map(|row| row.id)
        .collect();
    assert!(
        released.is_empty(),
        "the refused process released leases of the live one: {released:?}"
    );

    link.restore();
    app.database
        .wait_all_published(Duration::from_secs(120))
        .await;
    first.stop(Duration::from_secs(10)).await;
    let received = app.broker.drain(Duration::from_secs(10)).await;
    assert_room_order(&received);
    let duplicates = app.expect_every_event("twin test", &seeded).await;
    // Only the live process's publishes cut off by the stalled link go out twice.
    let window = 4 * app.settings.relay.batch_size as usize;
    assert!(
        duplicates <= window,
        "{duplicates} duplicates, more than the in-flight window of {window}"
    );
    app.teardown().await;
}

/// The ids of the rows `node_id` holds (their leases' ends move as the holder renews them).
async fn lease_ids(app: &TestApp, node_id: &str) -> Vec<i64> {
    (app.database.held_by(node_id).await.into_iter())
        .map(|row| row.id)
        .collect()
}

per_backend!(a_second_process_with_a_live_node_id_is_refused: postgres, mariadb, sqlite);

async fn after_a_kill_the_same_node_id_clears_the_dead_runs_leases_at_once(backend: Backend) {
    const EVENTS: usize = 200;
    let mut seeded = room_events("reborn", EVENTS, 10);
    let late = room_events("reborn-late", 20, 4);
    let app = TestApp::on(backend).seeded(&seeded).build().await;
    let (_, node_id, link, mut victim) = a_node_holding_rows(&app, &late).await;
    seeded.extend(late);
    victim.signal("KILL");
    victim.wait(CHILD_DEADLINE).await;

    // Same settings, the broker directly: the lock died with the victim.
    let successor = RelayProcess::spawn(
        crate::RELAY,
        &app.settings_with(|s| {
            s.relay.node_id = node_id.clone();
            s.relay.lease = LONG_LEASE.into();
        }),
    );
    // Well within the 10-minute lease: released at start, not expired.
    app.database
        .wait_all_published(Duration::from_secs(120))
        .await;
    let log = successor.log_text();
    assert!(
        log.contains("released leases left by an earlier run of this node"),
        "{log}"
    );
    successor.stop(Duration::from_secs(10)).await;
    app.expect_every_event("reborn test", &seeded).await;
    drop(link);
    app.teardown().await;
}

per_backend!(after_a_kill_the_same_node_id_clears_the_dead_runs_leases_at_once: postgres, mariadb, sqlite);

/// Behind a pooler in transaction mode the lock must live on a session connection of its
/// own: with `database.listen_url`, it is taken there, not on the pool of `database.url`.
#[actix_rt::test]
async fn with_a_listen_url_the_lock_lives_on_a_session_connection_to_it() {
    let app = TestApp::on(Backend::Postgres)
        .seeded(&room_events("session", 10, 2))
        .build()
        .await;
    let (proxy, listen_url) = FaultProxy::in_front_of(&app.database.url).await;
    let settings = app.settings_with(|settings| {
        settings.database.listen_url = listen_url;
        settings.database.notify = false;
    });
    let relay = RelayProcess::spawn(crate::RELAY, &settings);
    app.database
        .wait_all_published(Duration::from_secs(60))
        .await;
    // notify = false: nothing but the node lock connects to the listen URL.
    assert_eq!(proxy.accepted(), 1, "the lock's own session connection");
    relay.stop(Duration::from_secs(10)).await;
    app.teardown().await;
}

/// The lock's session ended by the server with nobody taking the node: the process takes
/// the lock again on a new connection at once and goes on relaying.
#[actix_rt::test]
async fn a_lock_session_ended_with_nobody_taking_the_node_is_taken_again() {
    let seeded = room_events("retaken", 20, 4);
    let app = TestApp::on(Backend::Postgres).seeded(&seeded).build().await;
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    app.database
        .wait_all_published(Duration::from_secs(60))
        .await;
    let key = outbox_store::NodeLock::server_key(&app.database.table, &app.settings.relay.node_id);
    app.database
        .execute(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' \
             AND granted AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = {key}"
        ))
        .await;
    eventually("the lock taken again", Duration::from_secs(10), || async {
        relay.log_text().contains("this node's lock is held again")
    })
    .await;
    let more = room_events("after", 10, 2);
    outbox_tests::seed(&app.database, &more).await;
    app.database
        .wait_all_published(Duration::from_secs(60))
        .await;
    let log = relay.stop_and_log(Duration::from_secs(10)).await;
    assert!(
        log.contains("the connection holding this node's lock was lost"),
        "{log}"
    );
    app.expect_every_event_once("retaken test", &[seeded, more].concat())
        .await;
    app.teardown().await;
}

/// The session holding a node's lock, ended by the server while the node relays a
/// producer's events, and the lock taken by another session at once, as a second process
/// with the node would: from that moment the process claims nothing more, at most the
/// claim under way then, and exits 2 once its publishes in flight settle, leaving the
/// node's leases to the new holder. A successor with the node then relays the rest: every
/// event, first deliveries in room order, duplicates within the in-flight window.
async fn a_node_whose_lock_is_taken_over_claims_nothing_more(backend: Backend) {
    let app = TestApp::on(backend).build().await;
    let node_id = app.settings.relay.node_id.clone();
    let batch = app.settings.relay.batch_size as usize;
    // 1,000 events/s over 20 rooms: were claims to go on until a periodic check noticed
    // the loss, thousands would be claimed meanwhile.
    let load = Load::named("takeover", &app.database, 20, Duration::from_millis(20));
    let mut first = RelayProcess::spawn(crate::RELAY, &app.settings);
    eventually("the node relays", Duration::from_secs(60), || async {
        app.broker.received().len() >= 200
    })
    .await;

    let key = outbox_store::NodeLock::server_key(&app.database.table, &node_id);
    let taker = TakenLock::from_its_holder(&app.database, key).await;
    let cut = std::time::Instant::now();
    let last_before = (app.database.rows().await.iter())
        .map(|row| row.id)
        .max()
        .expect("rows");
    let status = first.wait(CHILD_DEADLINE).await;
    let exited_after = cut.elapsed();
    let log = first.log_text();
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(
        log.contains("another process took this node's lock"),
        "{log}"
    );
    // Nothing else relays meanwhile: what the process published or holds of the rows
    // committed after the cut, it claimed after the cut.
    let claimed_after: Vec<_> = (app.database.rows().await.into_iter())
        .filter(|row| row.id > last_before)
        .filter(|row| row.status != "pending" || row.locked_by.is_some())
        .collect();
    eprintln!(
        "{backend:?}: exited {exited_after:?} after its lock was taken over, having claimed \
         {} rows committed after that",
        claimed_after.len()
    );
    assert!(
        claimed_after.len() <= batch,
        "{} rows committed after the lock was taken over were claimed by the process that \
         lost it (at most the claim under way, {batch}, may be): {:?}",
        claimed_after.len(),
        claimed_after.first().map(|row| &row.event_id)
    );
    outbox_tests::assert_within(
        "the process that lost its lock exits",
        exited_after,
        Duration::from_secs(5),
    );

    drop(taker);
    let successor = RelayProcess::spawn(crate::RELAY, &app.settings);
    let inserted = load.inserted();
    eventually("more events inserted", Duration::from_secs(60), || {
        std::future::ready(load.inserted() >= inserted + 1_000)
    })
    .await;
    load.stop().await;
    app.database
        .wait_all_published(Duration::from_secs(120))
        .await;
    successor.stop(Duration::from_secs(10)).await;
    let received = app.broker.drain(Duration::from_secs(10)).await;
    let order = outbox_tests::room_order(&received);
    assert!(
        order.violations.is_empty(),
        "{:?}",
        order.violations.first()
    );
    let delivered: std::collections::HashSet<&str> =
        received.iter().map(|m| m.message_id.as_str()).collect();
    let rows = app.database.rows().await;
    let lost: Vec<_> = (rows.iter())
        .filter(|row| !delivered.contains(row.event_id.as_str()))
        .map(|row| &row.event_id)
        .collect();
    assert!(
        lost.is_empty(),
        "never delivered: {:?}",
        &lost[..lost.len().min(5)]
    );
    let window = 4 * batch;
    assert!(
        order.duplicates <= window,
        "{} duplicates, more than the in-flight window of {window}",
        order.duplicates
    );
    app.teardown().await;
}

per_backend!(a_node_whose_lock_is_taken_over_claims_nothing_more: postgres, mariadb);

/// A node's lock taken from the session holding it: the test's own connection asks for the
/// lock and waits in the server's queue for it, then the holder's session is ended by the
/// server. The waiter is granted the lock the moment the holder's end frees it, ahead of
/// the old holder's retake, and holds it until dropped.
struct TakenLock {
    /// The connection holding the lock: held, never read.
    _session: Box<dyn std::any::Any>,
}

/// How long the test waits for its connection to queue for the lock, and to be granted it.
const TAKEOVER_DEADLINE: Duration = Duration::from_secs(30);

impl TakenLock {
    /// Ends the session holding lock `key` on the database at `url`, and takes the lock.
    async fn from_its_holder(database: &TestDatabase, key: i64) -> Self {
        use sea_orm::sqlx::{query, query_scalar, Connection as _, MySqlConnection, PgConnection};
        use sea_orm::DbBackend;
        let url = database.url.as_str();
        match database.backend() {
            DbBackend::Postgres => {
                let mut waiter = PgConnection::connect(url).await.expect("PostgreSQL");
                let pid: i32 = query_scalar("SELECT pg_backend_pid()")
                    .fetch_one(&mut waiter)
                    .await
                    .expect("the waiter's pid");
                let asked = actix_rt::spawn(async move {
                    query("SELECT pg_advisory_lock($1)")
                        .bind(key)
                        .execute(&mut waiter)
                        .await
                        .expect("the lock taken");
                    waiter
                });
                let waiting =
                    format!("SELECT count(*) AS n FROM pg_locks WHERE pid = {pid} AND NOT granted");
                queued("PostgreSQL", || async {
                    count(database, &waiting).await == 1
                })
                .await;
                let ended = count(
                    database,
                    &format!(
                        "SELECT count(pg_terminate_backend(pid)) AS n FROM pg_locks \
                         WHERE locktype = 'advisory' AND granted AND objsubid = 1 \
                         AND ((classid::bigint << 32) | objid::bigint) = {key}"
                    ),
                )
                .await;
                assert_eq!(ended, 1, "one session held the node's lock");
                let waiter = tokio::time::timeout(TAKEOVER_DEADLINE, asked)
                    .await
                    .expect("the lock granted to the waiter")
                    .expect("the waiter's task");
                Self {
                    _session: Box::new(waiter),
                }
            }
            DbBackend::MySql => {
                let name = "CONCAT('outbox-relay/', LEFT(SHA1(CONCAT(DATABASE(), '/', ?)), 40))";
                let mut waiter = MySqlConnection::connect(url).await.expect("MariaDB");
                let id: i64 = query_scalar("SELECT CAST(CONNECTION_ID() AS SIGNED)")
                    .fetch_one(&mut waiter)
                    .await
                    .expect("the waiter's id");
                let holder: Option<i64> =
                    query_scalar(&format!("SELECT CAST(IS_USED_LOCK({name}) AS SIGNED)"))
                        .bind(key.to_string())
                        .fetch_one(&mut waiter)
                        .await
                        .expect("the lock's holder");
                let holder = holder.expect("a connection holds the node's lock");
                let asked = actix_rt::spawn(async move {
                    let taken: Option<i64> = query_scalar(&format!(
                        "SELECT GET_LOCK({name}, {})",
                        TAKEOVER_DEADLINE.as_secs()
                    ))
                    .bind(key.to_string())
                    .fetch_one(&mut waiter)
                    .await
                    .expect("the lock asked for");
                    (waiter, taken)
                });
                let waiting = format!(
                    "SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST \
                     WHERE ID = {id} AND INFO LIKE 'SELECT GET_LOCK%'"
                );
                queued("MariaDB", || async { count(database, &waiting).await == 1 }).await;
                database.execute(&format!("KILL CONNECTION {holder}")).await;
                let (waiter, taken) = asked.await.expect("the waiter's task");
                assert_eq!(taken, Some(1), "the lock granted to the waiter");
                Self {
                    _session: Box::new(waiter),
                }
            }
            DbBackend::Sqlite => unreachable!("a file lock is not lost while its process lives"),
        }
    }
}

/// The integer column `n` of the one row `sql` answers on `database`.
async fn count(database: &TestDatabase, sql: &str) -> i64 {
    use sea_orm::ConnectionTrait as _;
    let statement = sea_orm::Statement::from_string(database.backend(), sql.to_owned());
    let row = (database.db().query_one(statement).await)
        .unwrap_or_else(|error| panic!("{sql}: {error}"))
        .unwrap_or_else(|| panic!("{sql}: no row"));
    row.try_get("", "n")
        .unwrap_or_else(|error| panic!("{sql}: {error}"))
}

/// Waits until `waiting` says the test's connection waits for the lock on `server`.
async fn queued<F, Fut>(server: &str, mut waiting: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = std::time::Instant::now() + TAKEOVER_DEADLINE;
    while !waiting().await {
        assert!(
            std::time::Instant::now() < until,
            "{server}: the test's connection never waited for the node's lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
