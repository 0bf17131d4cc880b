//! Starting while the database or the broker is down: `run` waits for them (one `warn`
//! line per try, `/readyz` naming what it waits for, SIGTERM ends the wait with exit code
//! 0), gives up after `relay.startup_timeout` (exit code 1), and still fails at once with
//! exit code 2 when they refuse the settings; `migrate --wait` waits too, `status` does not.

use outbox_tests::services::{amqp_url, database_url, with_path, with_user};
use outbox_tests::{
    assert_within, eventually, http_get as get, room_events, run_binary, server_of, settings_env,
    unique_name, within, Backend, ChildGuard, FaultProxy, RelayProcess, TestApp, TestBroker,
    AT_ONCE,
};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// A graceful stop's bound: `publish_timeout` (3 s in the tests) + 2 s.
const SHUTDOWN: Duration = Duration::from_secs(5);

/// The address of `backend`'s server (`OUTBOX_TEST_*_URL`), for a proxy in front of it.
fn database_server(backend: Backend) -> SocketAddr {
    server_of(&database_url(backend))
}

/// `url` pointed at `proxy` instead of its server.
fn through(proxy: &FaultProxy, url: &str) -> String {
    outbox_tests::through(proxy.addr, url)
}

/// The JSON log lines of `relay` that say it will try `dependency` again.
fn retries(relay: &RelayProcess, dependency: &str) -> Vec<serde_json::Value> {
    relay
        .log_text()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| {
            line["level"] == "WARN"
                && line["dependency"] == dependency
                && line["message"]
                    .as_str()
                    .is_some_and(|message| message.contains("not usable yet; trying again"))
        })
        .collect()
}

/// Waits until `relay` has tried `dependency` at least `tries` times; the last line.
async fn tried(relay: &RelayProcess, dependency: &str, tries: usize) -> serde_json::Value {
    eventually(
        &format!("{tries} failed tries of the {dependency} in the log"),
        Duration::from_secs(30),
        || std::future::ready(retries(relay, dependency).len() >= tries),
    )
    .await;
    retries(relay, dependency).pop().expect("a line")
}

/// `outbox_up{dependency="…"}` in a scrape.
fn up(metrics: &str, dependency: &str) -> Option<f64> {
    let series = format!("dependency=\"{dependency}\"");
    metrics
        .lines()
        .filter(|line| line.starts_with("outbox_up{") && line.contains(&series))
        .find_map(|line| line.rsplit_once(' ')?.1.parse().ok())
}

/// Which dependency a scenario takes away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Down {
    Database,
    Broker,
}

impl Down {
    fn label(self) -> &'static str {
        match self {
            Down::Database => "database",
            Down::Broker => "broker",
        }
    }
}

/// A node started while `down` refuses every connection (a proxy that closes them) waits,
/// unready but alive; once it accepts again, the node delivers every event.
async fn comes_up_when_it_returns(backend: Backend, down: Down) {
    const EVENTS: usize = 500;
    let proxy = FaultProxy::start(match down {
        Down::Database => database_server(backend),
        Down::Broker => server_of(&amqp_url()),
    })
    .await;
    proxy.go_down();
    let seeded = room_events(&format!("{}down", down.label()), EVENTS, 20);
    let app = TestApp::on(backend)
        .settings(|settings| {
            match down {
                Down::Database => settings.database.url = through(&proxy, &settings.database.url),
                Down::Broker => settings.amqp.url = through(&proxy, &settings.amqp.url),
            }
            settings.metrics.listen = "127.0.0.1:0".into();
            settings.log.format = "json".into();
        })
        .seeded(&seeded)
        .build()
        .await;
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    let outage = Instant::now();
    let address = relay.metrics_address().await;

    // Five tries: an outage of a few seconds, so the backoff's step has grown (to 1.6 s
    // for the database, 3.2 s for the broker) as it would in a real one.
    let line = tried(&relay, down.label(), 5).await;
    eprintln!("{backend:?}, {} down: {line}", down.label());
    assert!(
        line["url"]
            .as_str()
            .is_some_and(|url| url.contains(&proxy.addr.to_string())),
        "names where: {line}"
    );
    assert!(
        line["reason"]
            .as_str()
            .is_some_and(|reason| !reason.is_empty()),
        "{line}"
    );
    assert!(
        line["retry_in"].as_str().is_some(),
        "names the next delay: {line}"
    );
    assert_eq!(
        get(address, "/readyz").await,
        (
            503,
            format!("not ready: waiting for the {}\n", down.label())
        ),
    );
    assert_eq!(get(address, "/healthz").await.0, 200, "alive while waiting");
    let metrics = get(address, "/metrics").await.1;
    assert_eq!(up(&metrics, down.label()), Some(0.0), "{metrics}");
    if down == Down::Broker {
        assert_eq!(
            up(&metrics, "database"),
            Some(1.0),
            "the database is up: {metrics}"
        );
    }
    assert!(
        app.broker.received().is_empty(),
        "nothing delivered while down"
    );

    proxy.restore();
    let restored = Instant::now();
    // Nothing was claimed before both answered, and neither went away after: no crash, no
    // lost confirm, so no event is published twice.
    app.expect_every_event_once(
        &format!("{backend:?}, {} down at start", down.label()),
        &seeded,
    )
    .await;
    let first = app
        .broker
        .received()
        .iter()
        .map(|received| received.arrived)
        .min()
        .expect("deliveries");
    eprintln!(
        "startup wait ({backend:?}, {} down at start for {:.1} s): {:.2} s from the end of \
         the outage to the first delivery",
        down.label(),
        restored.duration_since(outage).as_secs_f64(),
        first.saturating_duration_since(restored).as_secs_f64()
    );
    eventually("ready once up", Duration::from_secs(30), || async {
        get(address, "/readyz").await == (200, "ready\n".into())
    })
    .await;
    relay.stop(within(SHUTDOWN)).await;
    app.teardown().await;
}

async fn a_node_started_while_the_database_is_down_delivers_once_it_returns(backend: Backend) {
    comes_up_when_it_returns(backend, Down::Database).await;
}
outbox_tests::per_backend!(a_node_started_while_the_database_is_down_delivers_once_it_returns: postgres, mariadb);

async fn a_node_started_while_the_broker_is_down_delivers_once_it_returns(backend: Backend) {
    comes_up_when_it_returns(backend, Down::Broker).await;
}
outbox_tests::per_backend!(a_node_started_while_the_broker_is_down_delivers_once_it_returns: postgres, mariadb);

async fn sigterm_while_waiting_exits_0_within_a_second(backend: Backend) {
    let proxy = FaultProxy::start(database_server(backend)).await;
    proxy.go_down();
    let app = TestApp::on(backend)
        .settings(|settings| {
            settings.database.url = through(&proxy, &settings.database.url);
            settings.log.format = "json".into();
        })
        .build()
        .await;
    let mut relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    tried(&relay, "database", 2).await;

    let signalled = Instant::now();
    relay.signal("TERM");
    // The bound is a second (and the machine's margin).
    let status = relay.wait(within(Duration::from_secs(1))).await;
    assert_within(
        "SIGTERM while waiting",
        signalled.elapsed(),
        Duration::from_secs(1),
    );
    assert!(
        status.success(),
        "exit {status:?} after {:?}; log:\n{}",
        signalled.elapsed(),
        relay.log_text()
    );
    let _ = std::fs::remove_file(&relay.log);
    app.teardown().await;
}
outbox_tests::per_backend!(sigterm_while_waiting_exits_0_within_a_second: postgres, mariadb);

/// Runs `run` with `settings` and expects exit code 2 at once, the message containing
/// `says`.
fn exits_2_at_once(what: &str, settings: &outbox_relay::settings::Settings, says: &str) {
    // A refusal taken for an outage would wait: bounded, it exits 1 and fails below.
    let mut settings = settings.clone();
    settings.relay.startup_timeout = "10s".into();
    let started = Instant::now();
    let output = run_binary(crate::RELAY, &settings, &["run"]);
    let took = started.elapsed();
    let stderr = outbox_tests::output::stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{what}: {stderr}");
    // Within the bound, well before the startup timeout a wait would end at.
    assert_within(what, took, AT_ONCE);
    assert!(stderr.contains(says), "{what}: says {says:?}: {stderr}");
    assert!(
        !stderr.contains("not usable yet"),
        "{what}: not tried again: {stderr}"
    );
}

async fn a_database_refusing_the_login_or_the_database_name_exits_2_at_once(backend: Backend) {
    let app = TestApp::on(backend).build().await;
    let url = &app.database.url;
    let (login, database) = match backend {
        // The test server trusts every local login, so an unknown role is the refusal.
        Backend::Postgres => (
            with_user(url, "no_such_role", None),
            with_path(url, "/no_such_db"),
        ),
        _ => (
            with_user(url, "no_such_user", Some("wrong-pw")),
            with_path(url, "/no_such_db"),
        ),
    };
    let settings = app.settings_with(|settings| settings.database.url = login);
    exits_2_at_once("a login the database refuses", &settings, "no_such");
    let settings = app.settings_with(|settings| settings.database.url = database);
    exits_2_at_once("an unknown database", &settings, "no_such_db");
    app.teardown().await;
}
outbox_tests::per_backend!(a_database_refusing_the_login_or_the_database_name_exits_2_at_once: postgres, mariadb);

#[actix_rt::test]
async fn a_broker_refusing_the_password_or_the_vhost_exits_2_at_once() {
    let app = TestApp::on(Backend::Postgres).build().await;
    let url = amqp_url();
    let user = url::Url::parse(&url).expect("a URL").username().to_owned();
    let settings = app.settings_with(|settings| {
        settings.amqp.url = with_user(&url, &user, Some("wrong-pw"));
    });
    exits_2_at_once("a wrong broker password", &settings, "ACCESS_REFUSED");
    let settings = app.settings_with(|settings| {
        settings.amqp.url = with_path(&url, "/no_such_vhost");
    });
    exits_2_at_once("an unknown vhost", &settings, "no_such_vhost");
    // The test's exchange exists as a topic exchange.
    let settings = app.settings_with(|settings| settings.amqp.exchange_type = "direct".into());
    exits_2_at_once(
        "an exchange declared with another type",
        &settings,
        "PRECONDITION_FAILED",
    );
    app.teardown().await;
}

async fn startup_timeout_exceeded_exits_1_naming_the_setting(backend: Backend) {
    let proxy = FaultProxy::start(database_server(backend)).await;
    proxy.go_down();
    let app = TestApp::on(backend)
        .settings(|settings| {
            settings.database.url = through(&proxy, &settings.database.url);
            settings.relay.startup_timeout = "2s".into();
        })
        .build()
        .await;
    let started = Instant::now();
    // Off this thread, which runs the proxy.
    let settings = app.settings.clone();
    let output = tokio::task::spawn_blocking(move || run_binary(crate::RELAY, &settings, &["run"]))
        .await
        .expect("the binary ran");
    let took = started.elapsed();
    let stderr = outbox_tests::output::stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        took >= Duration::from_secs(2),
        "gave up before the bound: {took:?}"
    );
    assert_within(
        "giving up at relay.startup_timeout",
        took,
        Duration::from_secs(2),
    );
    assert!(
        stderr.contains("gave up waiting for the database")
            && stderr.contains("relay.startup_timeout"),
        "{stderr}"
    );
    assert!(
        proxy.refused() >= 2,
        "tried more than once: {}",
        proxy.refused()
    );
    app.teardown().await;
}
outbox_tests::per_backend!(startup_timeout_exceeded_exits_1_naming_the_setting: postgres, mariadb);

#[actix_rt::test]
async fn sqlite_waits_for_its_directory_to_appear() {
    let broker = TestBroker::new("#").await;
    let directory = std::env::temp_dir().join(unique_name("outbox_volume"));
    let url = format!(
        "sqlite://{}?mode=rwc",
        directory.join("outbox.db").display()
    );
    let mut settings = outbox_relay::settings::Settings::default();
    settings.database.url = url.clone();
    settings.database.migrate_on_start = true;
    settings.amqp.url = broker.url.clone();
    settings.amqp.exchange = broker.exchange.clone();
    settings.relay.node_id = unique_name("node");
    settings.relay.poll_interval = "100ms".into();
    settings.metrics.listen = "".into();
    settings.log.format = "json".into();
    let relay = RelayProcess::spawn(crate::RELAY, &settings);
    let line = tried(&relay, "database", 2).await;
    assert!(
        line["reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("unable to open")),
        "{line}"
    );

    // A volume mounted late: the relay creates the database in it, then relays.
    std::fs::create_dir(&directory).expect("directory created");
    eventually("the relay to start", Duration::from_secs(30), || {
        std::future::ready(relay.log_text().contains("relay started"))
    })
    .await;
    let db = outbox_store::connect(&url, 1)
        .await
        .expect("database opens")
        .into_connection();
    let table = outbox_store::TableName::parse("room_outbox").expect("a name");
    let events = room_events("volume", 50, 5);
    outbox_store::insert_events(&db, &table, &events)
        .await
        .expect("events inserted");
    broker.wait_for_each(&events, Duration::from_secs(30)).await;
    // Settled, so a late duplicate is counted too: a start that waited causes none.
    let received = broker.drain(Duration::from_secs(30)).await;
    outbox_tests::assert_delivered_once("a late volume", &received, &events);
    relay.stop(within(SHUTDOWN)).await;
    let _ = db.close().await;
    broker.close().await;
    let _ = std::fs::remove_dir_all(&directory);
}

#[actix_rt::test]
async fn migrate_waits_for_the_database_and_status_does_not() {
    let proxy = FaultProxy::start(database_server(Backend::Postgres)).await;
    proxy.go_down();
    let app = TestApp::on(Backend::Postgres).build().await;
    let table = outbox_store::TableName::parse(&unique_name("e2e_migrated")).expect("a name");
    let settings = app.settings_with(|settings| {
        settings.database.url = through(&proxy, &settings.database.url);
        settings.database.table = table.as_str().to_owned();
    });

    let started = Instant::now();
    // Off this thread, which runs the proxy.
    let one_shot = settings.clone();
    let status =
        tokio::task::spawn_blocking(move || run_binary(crate::RELAY, &one_shot, &["status"]))
            .await
            .expect("the binary ran");
    assert_eq!(status.status.code(), Some(1), "{status:?}");
    assert_within("status failing at once", started.elapsed(), AT_ONCE);
    assert_eq!(proxy.refused(), 1, "one try");

    let log = std::env::temp_dir().join(format!("{}.log", unique_name("migrate")));
    // Killed if the test fails before it exits.
    let mut migrate = ChildGuard(
        std::process::Command::new(crate::RELAY)
            .args(["--config", "/dev/null", "migrate", "--wait", "60s"])
            .envs(settings_env(&settings))
            .env("OUTBOX_RELAY__LOG__FORMAT", "json")
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("migrate starts"),
    );
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    eventually("migrate to try twice", Duration::from_secs(30), || {
        std::future::ready(log_text().matches("not usable yet; trying again").count() >= 2)
    })
    .await;
    assert!(
        migrate.0.try_wait().expect("status").is_none(),
        "still waiting"
    );
    proxy.restore();
    let mut exit = None;
    eventually("migrate to finish", Duration::from_secs(30), || {
        exit = migrate.0.try_wait().expect("status");
        std::future::ready(exit.is_some())
    })
    .await;
    let mut stdout = String::new();
    std::io::Read::read_to_string(
        migrate.0.stdout.as_mut().expect("piped stdout"),
        &mut stdout,
    )
    .expect("stdout read");
    assert!(exit.is_some_and(|exit| exit.success()), "{}", log_text());
    assert!(stdout.contains(&format!("to table {table}")), "{stdout}");
    app.database.drop_outbox(&table).await;
    let _ = std::fs::remove_file(&log);
    app.teardown().await;
}

#[actix_rt::test]
async fn with_nothing_listening_status_and_migrate_say_connection_refused_once_at_once() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let app = TestApp::on(Backend::Postgres).build().await;
    let settings = app.settings_with(|settings| {
        settings.database.url = format!("postgres://postgres@127.0.0.1:{port}/test");
    });
    for args in [&["status"][..], &["migrate", "--wait", "0s"]] {
        let started = Instant::now();
        let output = run_binary(crate::RELAY, &settings, args);
        let took = started.elapsed();
        let stderr = outbox_tests::output::stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert_within(&format!("{args:?} failing at once"), took, AT_ONCE);
        let said: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(said.len(), 1, "{args:?}: one error: {stderr}");
        assert_eq!(
            said[0].matches("connection refused").count(),
            1,
            "{args:?}: says it once: {stderr}"
        );
        assert!(
            said[0].contains(&format!("127.0.0.1:{port}/test")),
            "{args:?}: names where: {stderr}"
        );
        assert!(!stderr.contains("pool timed out"), "{args:?}: {stderr}");
    }
    app.teardown().await;
}
