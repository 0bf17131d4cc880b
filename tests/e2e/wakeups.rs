//! Insert wake-ups (docs/design/wake-ups.md): with `relay.poll_interval` at
//! 60 s a poll cannot be what delivers, so a lone event arriving in milliseconds was
//! noticed by the backend's mechanism (the `MAX(id)` probe, NOTIFY where a PostgreSQL relay
//! LISTENs, `PRAGMA data_version`).

use outbox_store::{InsertTrigger, NewEvent};
use outbox_tests::{event, eventually, per_backend, Backend, FaultProxy, RelayProcess, TestApp};
use std::time::{Duration, Instant};

/// A PostgreSQL relay that LISTENs (`database.notify = true`): migrating on start, it
/// enables the insert trigger, which `migrate` leaves disabled.
fn listening(settings: &mut outbox_relay::settings::Settings) {
    settings.database.notify = true;
    settings.database.migrate_on_start = true;
}

/// Longer than any test waits: whatever arrives was woken, not polled.
const NO_POLL: &str = "60s";
/// What a wake-up on an idle relay must take at most, commit → delivery.
const WAKE_UP: Duration = Duration::from_secs(1);
/// How long a lone event may take once the link is back after the 2 s [`outage`]: the
/// insert listener reconnects with backoff, 100 ms doubling to 10 s, each wait from half
/// to all of its step (docs/design/reconnecting.md#backoff). The waits before a 6.4 s step
/// take at least 3.15 s, longer than the outage, so the wait under way when the link
/// returns is at most 3.2 s; the reconnected feed then wakes the relay as any wake-up.
const AFTER_OUTAGE: Duration = Duration::from_millis(3_200).saturating_add(WAKE_UP);

/// Inserts `event` in a transaction of its own; the moment the commit returned.
async fn insert(app: &TestApp, event: NewEvent) -> Instant {
    outbox_tests::seed(&app.database, &[event]).await;
    Instant::now()
}

/// Waits (at most `deadline`) for the first delivery of `event_id`; how long after
/// `committed` it arrived.
async fn arrival(
    app: &TestApp,
    event_id: &str,
    committed: Instant,
    deadline: Duration,
) -> Duration {
    let mut arrived = None;
    eventually(&format!("{event_id} to arrive"), deadline, || {
        arrived = app
            .broker
            .received()
            .iter()
            .find(|message| message.message_id == event_id)
            .map(|message| message.arrived);
        std::future::ready(arrived.is_some())
    })
    .await;
    arrived
        .expect("arrived")
        .saturating_duration_since(committed)
}

/// Inserts one event and expects it at the broker within [`WAKE_UP`] of its commit.
async fn lone_event_within_a_second(app: &TestApp, test: &str, id: &str) {
    let committed = insert(app, event(id, "lone")).await;
    // A longer wait than the bound, so that a failure shows the figure.
    let took = arrival(app, id, committed, Duration::from_secs(10)).await;
    println!("{test}: {id} commit → delivery {took:?}");
    outbox_tests::assert_within(&format!("{test}: {id} commit → delivery"), took, WAKE_UP);
}

/// Lets the relay deliver a first event, inserted once it runs, and mark it: then it is
/// idle, its feed started (within the deadline whatever woke it; a poll would be 60 s).
async fn warm_up(app: &TestApp) {
    let committed = insert(app, event("warm-up", "warm-up")).await;
    arrival(app, "warm-up", committed, Duration::from_secs(10)).await;
    app.database
        .wait_all_published(Duration::from_secs(10))
        .await;
}

/// Three lone events, one after the other, each within a second of its commit.
async fn a_lone_event_on_an_idle_relay_arrives_within_a_second(backend: Backend) {
    let app = TestApp::on(backend)
        .settings(|settings| settings.relay.poll_interval = NO_POLL.into())
        .spawn()
        .await;
    warm_up(&app).await;
    for n in 1..=3 {
        lone_event_within_a_second(&app, &format!("{backend:?}"), &format!("lone-{n}")).await;
        app.database
            .wait_all_published(Duration::from_secs(10))
            .await;
    }
    app.teardown().await;
}

per_backend!(a_lone_event_on_an_idle_relay_arrives_within_a_second: postgres, sqlite, mariadb);

/// PostgreSQL with `notify = true` LISTENs (the probe is the default, as on
/// MySQL/MariaDB).
#[actix_rt::test]
async fn with_notify_postgres_listens_and_a_lone_event_arrives_within_a_second() {
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.relay.poll_interval = NO_POLL.into();
            listening(settings);
        })
        .spawn()
        .await;
    warm_up(&app).await;
    lone_event_within_a_second(&app, "postgres, notify on", "lone").await;
    app.teardown().await;
}

/// A relay idle on `backend` behind a proxy to its database (a 60 s poll), warmed up.
/// SQLite is a file in the relay's own process: there is no link to cut, so the outage
/// tests run on PostgreSQL (LISTEN, whose connection must come back) and MySQL/MariaDB
/// (the probe) only.
async fn behind_a_proxy(backend: Backend) -> (FaultProxy, TestApp) {
    assert!(backend != Backend::Sqlite, "a file has no link to cut");
    let url = outbox_tests::services::database_url(backend);
    let proxy = FaultProxy::start(outbox_tests::server_of(&url)).await;
    let app = TestApp::on(backend)
        .settings(|settings| {
            settings.database.url = outbox_tests::through(proxy.addr, &url);
            settings.relay.poll_interval = NO_POLL.into();
            if backend == Backend::Postgres {
                listening(settings);
            }
        })
        .spawn()
        .await;
    warm_up(&app).await;
    (proxy, app)
}

/// Takes the relay's database away for 2 s, running `meanwhile` during the outage.
async fn outage(proxy: &FaultProxy, meanwhile: impl std::future::Future<Output = ()>) {
    proxy.go_down();
    meanwhile.await;
    // The outage itself: the relay is without its database meanwhile.
    tokio::time::sleep(Duration::from_secs(2)).await;
    eventually(
        "the relay to try to reconnect during the outage",
        Duration::from_secs(10),
        || std::future::ready(proxy.refused() > 0),
    )
    .await;
    proxy.restore();
}

/// After a 2 s outage, a lone event arrives within seconds (the mechanism reconnects with
/// backoff), and the next one within a second again.
async fn wake_ups_survive_the_database_going_away_and_coming_back(backend: Backend) {
    let (proxy, app) = behind_a_proxy(backend).await;
    outage(&proxy, async {}).await;

    // The first may wait for the mechanism's reconnection backoff; a poll would be 60 s.
    let committed = insert(&app, event("after-outage", "lone")).await;
    let took = arrival(&app, "after-outage", committed, Duration::from_secs(10)).await;
    println!("{backend:?}: first event after the outage, commit → delivery {took:?}");
    outbox_tests::assert_within(
        &format!("{backend:?}: first event after the outage, commit → delivery"),
        took,
        AFTER_OUTAGE,
    );
    app.database
        .wait_all_published(Duration::from_secs(10))
        .await;
    // Then the mechanism is back: a lone event wakes the relay as before the outage.
    lone_event_within_a_second(&app, &format!("{backend:?} after the outage"), "lone").await;
    app.teardown().await;
}

per_backend!(wake_ups_survive_the_database_going_away_and_coming_back: postgres, mariadb);

/// An event committed while the relay cannot reach its database (no notification or probe
/// can see it) is delivered within seconds of the link coming back, not at the next poll:
/// the mechanism's reconnection wakes the relay, since it may have missed inserts.
async fn events_inserted_during_an_outage_arrive_soon_after_it(backend: Backend) {
    let (proxy, app) = behind_a_proxy(backend).await;
    // The test's own connection does not go through the proxy.
    outage(&proxy, async {
        outbox_tests::seed(&app.database, &[event("during-outage", "outage")]).await;
    })
    .await;
    let restored = Instant::now();
    let took = arrival(&app, "during-outage", restored, Duration::from_secs(10)).await;
    println!("{backend:?}: event of the outage, restore → delivery {took:?}");
    outbox_tests::assert_within(
        &format!("{backend:?}: event of the outage, restore → delivery"),
        took,
        AFTER_OUTAGE,
    );
    app.teardown().await;
}

per_backend!(events_inserted_during_an_outage_arrive_soon_after_it: postgres, mariadb);

/// Waits for every one of `ids` at the broker (polling delivers them within `deadline`).
async fn expect_delivered(app: &TestApp, ids: &[String], deadline: Duration) {
    eventually(&format!("{} events delivered", ids.len()), deadline, || {
        let received = app.broker.received();
        std::future::ready(
            ids.iter()
                .all(|id| received.iter().any(|message| &message.message_id == id)),
        )
    })
    .await;
}

/// The LISTEN connection (`database.listen_url`) is refused every time: the relay polls
/// (200 ms) and says so once, not once per attempt.
#[actix_rt::test]
async fn an_unavailable_listen_connection_falls_back_to_polling_with_one_warning() {
    let url = outbox_tests::services::database_url(Backend::Postgres);
    let refusing = FaultProxy::start(outbox_tests::server_of(&url)).await;
    refusing.go_down();
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.database.listen_url = outbox_tests::through(refusing.addr, &url);
            settings.relay.poll_interval = "200ms".into();
            settings.log.format = "json".into();
            listening(settings);
        })
        .build()
        .await;
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);

    let mut ids = Vec::new();
    for n in 0..5 {
        let id = format!("polled-{n}");
        outbox_tests::seed(&app.database, &[event(&id, "polled")]).await;
        ids.push(id);
    }
    // Several attempts: the first and at least three retries of the listener's backoff.
    eventually(
        "four attempts at the LISTEN connection",
        Duration::from_secs(30),
        || std::future::ready(refusing.refused() >= 4),
    )
    .await;
    expect_delivered(&app, &ids, Duration::from_secs(10)).await;

    let warnings = relay.log_lines("insert wake-ups unavailable");
    assert_eq!(
        warnings.len(),
        1,
        "one warning over {} attempts; log:\n{}",
        refusing.refused(),
        relay.log_text()
    );
    assert_eq!(warnings[0]["level"], "WARN", "{}", warnings[0]);
    relay.stop(Duration::from_secs(10)).await;
    app.teardown().await;
}

/// Debug lines of the relay's own crates (where a feed says it started), as JSON.
const FEED_LOGS: &str = "info,outbox_store=debug,outbox_pipeline=debug,outbox_relay=debug";

/// The state of the app's table's insert trigger.
async fn trigger(app: &TestApp) -> InsertTrigger {
    app.database
        .store
        .insert_trigger()
        .await
        .expect("the insert trigger's state")
}

/// A PostgreSQL app whose relay logs [`FEED_LOGS`] as JSON, with `notify` and
/// `migrate_on_start` as given.
async fn logging_app(notify: bool, migrate_on_start: bool) -> TestApp {
    TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.database.notify = notify;
            settings.database.migrate_on_start = migrate_on_start;
            settings.log.format = "json".into();
            settings.log.level = FEED_LOGS.into();
        })
        .build()
        .await
}

/// `database.probe = false` switches SQLite's wake-ups off: no feed starts, and polling
/// (200 ms) still delivers.
#[actix_rt::test]
async fn with_the_probe_off_sqlite_polls_and_starts_no_feed() {
    let app = TestApp::on(Backend::Sqlite)
        .settings(|settings| {
            settings.database.probe = false;
            settings.relay.poll_interval = "200ms".into();
            settings.log.format = "json".into();
            settings.log.level = FEED_LOGS.into();
        })
        .build()
        .await;
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    let ids: Vec<String> = (0..3).map(|n| format!("polled-{n}")).collect();
    for id in &ids {
        outbox_tests::seed(&app.database, &[event(id, "polled")]).await;
    }
    expect_delivered(&app, &ids, Duration::from_secs(10)).await;
    // A feed starts with the relay, before its first claim: it would have said so by now.
    let started = relay.log_lines("listening for inserts");
    assert!(started.is_empty(), "a feed started: {started:?}");
    relay.stop(Duration::from_secs(10)).await;
    app.teardown().await;
}

/// The feed each backend starts, as its debug line names it (`adjust`: more settings).
async fn starts_feed(
    backend: Backend,
    adjust: fn(&mut outbox_relay::settings::Settings),
    feed: &str,
) {
    let app = TestApp::on(backend)
        .settings(|settings| {
            settings.log.format = "json".into();
            settings.log.level = FEED_LOGS.into();
            adjust(settings);
        })
        .build()
        .await;
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    eventually(
        &format!("the {feed} feed to start"),
        Duration::from_secs(10),
        || std::future::ready(!relay.log_lines("listening for inserts").is_empty()),
    )
    .await;
    let started = relay.log_lines("listening for inserts");
    assert_eq!(started.len(), 1, "{started:?}");
    assert_eq!(started[0]["feed"], feed, "{}", started[0]);
    relay.stop(Duration::from_secs(10)).await;
    app.teardown().await;
}

/// The probe on PostgreSQL and MySQL/MariaDB, `PRAGMA data_version` on SQLite.
async fn each_backend_starts_its_own_feed(backend: Backend) {
    let feed = match backend {
        Backend::Postgres => "probe",
        Backend::Sqlite => "data_version",
        Backend::MySql => "probe",
    };
    starts_feed(backend, |_| {}, feed).await;
}

per_backend!(each_backend_starts_its_own_feed: postgres, sqlite, mariadb);

/// With the insert trigger disabled (as `migrate` leaves it; docs/operations/wake-ups.md#what-each-wake-up-costs),
/// a node with `notify = true` that does not migrate on start says so, naming `migrate`,
/// and probes: a lone event still arrives within a second.
#[actix_rt::test]
async fn postgres_with_the_trigger_off_probes_even_with_notify_on() {
    let app = logging_app(true, false).await;
    assert_eq!(
        trigger(&app).await,
        InsertTrigger::Off,
        "migrate leaves it disabled"
    );
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    let started = feed_started(&relay).await;
    assert_eq!(started["feed"], "probe", "{started}");
    let warned = relay.log_lines("the table's insert trigger");
    one_warning_naming(
        &warned,
        "`outbox-relay migrate` with database.notify = true",
    );
    lone_event_within_a_second(&app, "trigger-off", "trigger-off-1").await;
    relay.stop(Duration::from_secs(10)).await;
    app.teardown().await;
}

/// A relay that probes (`notify = false`) on a table whose insert trigger was enabled (by
/// another node's `migrate` with `notify = true`) says once that it still costs every
/// insert, naming the statement that disables it; once it is disabled, as `migrate` leaves
/// it, a relay says nothing of it.
#[actix_rt::test]
async fn postgres_without_notify_names_the_trigger_every_insert_still_pays_for() {
    let app = logging_app(false, false).await;
    assert!(
        outbox_store::enable_notify(app.database.db(), &app.database.table)
            .await
            .expect("enable the insert trigger"),
        "migrate left it disabled"
    );
    let t = app.database.table.as_str();
    let disable = format!("ALTER TABLE {t} DISABLE TRIGGER {t}_notify");
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    assert_eq!(feed_started(&relay).await["feed"], "probe");
    let said = relay.log_lines("the table's insert trigger");
    assert_eq!(said.len(), 1, "one line: {said:?}");
    assert_eq!(said[0]["level"], "INFO", "{}", said[0]);
    let message = said[0]["message"].as_str().unwrap_or_default();
    assert!(message.contains(&disable), "{message}");
    relay.stop(Duration::from_secs(10)).await;

    app.database.execute(&disable).await;
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    assert_eq!(feed_started(&relay).await["feed"], "probe");
    let said = relay.log_lines("the table's insert trigger");
    assert!(
        said.is_empty(),
        "nothing said of a disabled trigger: {said:?}"
    );
    lone_event_within_a_second(&app, "trigger-disabled", "trigger-disabled-1").await;
    relay.stop(Duration::from_secs(10)).await;
    app.teardown().await;
}

/// `lines` are one warning, and it says `phrase`.
fn one_warning_naming(lines: &[serde_json::Value], phrase: &str) {
    assert_eq!(lines.len(), 1, "one warning: {lines:?}");
    assert_eq!(lines[0]["level"], "WARN", "{}", lines[0]);
    assert!(
        lines[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains(phrase)),
        "{phrase:?} not in {}",
        lines[0]
    );
}

/// The first log line of `relay`'s feed starting (`listening for inserts`), once there.
async fn feed_started(relay: &RelayProcess) -> serde_json::Value {
    eventually("the feed to start", Duration::from_secs(10), || {
        std::future::ready(!relay.log_lines("listening for inserts").is_empty())
    })
    .await;
    relay.log_lines("listening for inserts").remove(0)
}

/// A table whose trigger `migrate` has not upgraded yet (it NOTIFYs on every insert) and a
/// relay that does not migrate on start: it says to run `migrate`, and LISTENs as before,
/// a lone event arriving within a second.
#[actix_rt::test]
async fn postgres_with_a_trigger_that_notifies_every_insert_says_to_migrate() {
    let app = logging_app(true, false).await;
    let t = app.database.table.as_str();
    for sql in [
        format!("DROP TRIGGER {t}_notify ON {t}"),
        format!(
            "CREATE TRIGGER {t}_notify AFTER INSERT ON {t} \
             FOR EACH STATEMENT EXECUTE FUNCTION {t}_notify()"
        ),
    ] {
        app.database.execute(&sql).await;
    }
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    let started = feed_started(&relay).await;
    assert_eq!(started["feed"], "notify", "{started}");
    let warned: Vec<_> = relay
        .log_lines("the table's insert trigger")
        .into_iter()
        .filter(|line| {
            line["message"]
                .as_str()
                .is_some_and(|m| m.contains("NOTIFYs on every insert"))
        })
        .collect();
    one_warning_naming(&warned, "outbox-relay migrate");
    lone_event_within_a_second(&app, "old-trigger", "old-trigger-1").await;
    relay.stop(Duration::from_secs(10)).await;
    app.teardown().await;
}

/// `notify = true` with `migrate_on_start`: migrating enables the insert trigger (and says
/// so), and the relay LISTENs.
#[actix_rt::test]
async fn postgres_with_notify_migrate_enables_the_trigger_and_the_relay_listens() {
    let app = logging_app(true, true).await;
    assert_eq!(
        trigger(&app).await,
        InsertTrigger::Off,
        "migrate leaves it disabled"
    );
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    assert_eq!(feed_started(&relay).await["feed"], "notify");
    let applied = relay.log_lines("migration applied");
    assert_eq!(applied.len(), 1, "{applied:?}");
    assert_eq!(
        applied[0]["migration"], "enable_room_outbox_notify",
        "{}",
        applied[0]
    );
    assert_eq!(trigger(&app).await, InsertTrigger::WhileAsleep);
    assert!(
        relay.log_lines("the table's insert trigger").is_empty(),
        "nothing to say of the trigger it enabled"
    );
    relay.stop(Duration::from_secs(10)).await;
    app.teardown().await;
}
