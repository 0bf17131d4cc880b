//! One live process per `node_id` and table: a second `run` with the node of a live one is
//! refused (exit 2, naming the node and its holder) and takes none of its leases; after a
//! SIGKILL the next process with the same node starts and clears the dead one's leases at
//! once, not after they expire.

use outbox_relay::settings::Settings;
use outbox_store::NewEvent;
use outbox_tests::{
    assert_room_order, eventually, per_backend, room_events, Backend, FaultProxy, RelayProcess,
    TestApp, CHILD_DEADLINE,
};
use sea_orm::ConnectionTrait as _;
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

    link.restore();
    app.database
        .wait_all_published(Duration::from_secs(120))
        .await;
    first.stop(Duration::from_secs(10)).await;
    let received = app.broker.drain(Duration::from_secs(10)).await;
    assert_room_order(&received);
    app.expect_every_event("twin test", &seeded).await;
    app.teardown().await;
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

/// A process whose lock connection is lost while another process takes the node stops
/// relaying: it shuts down and exits 2, saying so, and the other one goes on.
#[actix_rt::test]
async fn a_process_whose_node_was_taken_over_stops_with_exit_2() {
    let seeded = room_events("taken", 20, 4);
    let app = TestApp::on(Backend::Postgres).seeded(&seeded).build().await;
    let mut first = RelayProcess::spawn(crate::RELAY, &app.settings);
    app.database
        .wait_all_published(Duration::from_secs(60))
        .await;
    // The server ends the first process's lock session, as a network fault or an
    // administrator would; a second process with the same node takes the lock at once.
    app.database
        .execute(&format!(
            "SELECT pg_terminate_backend(a.pid) FROM pg_locks l JOIN pg_stat_activity a \
             ON a.pid = l.pid WHERE l.locktype = 'advisory' \
             AND a.application_name LIKE 'outbox-relay pid {} %'",
            first.pid()
        ))
        .await;
    let held = format!(
        "SELECT 1 AS held FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND a.application_name LIKE 'outbox-relay pid {} %'",
        first.pid()
    );
    eventually(
        "the lock session ended",
        Duration::from_secs(10),
        || async {
            let statement =
                sea_orm::Statement::from_string(sea_orm::DbBackend::Postgres, held.clone());
            app.database
                .db()
                .query_one(statement)
                .await
                .unwrap()
                .is_none()
        },
    )
    .await;
    let second = RelayProcess::spawn(crate::RELAY, &app.settings);
    let status = first.wait(CHILD_DEADLINE).await;
    let log = first.log_text();
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(
        log.contains("another process took this node's lock"),
        "{log}"
    );
    let more = room_events("after", 10, 2);
    outbox_tests::seed(&app.database, &more).await;
    app.database
        .wait_all_published(Duration::from_secs(60))
        .await;
    second.stop(Duration::from_secs(10)).await;
    app.teardown().await;
}
