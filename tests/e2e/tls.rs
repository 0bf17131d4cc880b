//! TLS: `amqps://` through a TLS-terminating proxy in front of the local RabbitMQ (which
//! speaks plain AMQP only), and PostgreSQL's `sslmode` and `PGSSLMODE` as libpq takes them
//! (the local PostgreSQL has `ssl = on`).

use outbox_tests::{
    eventually, room_events, seed, unique_name, Backend, FaultProxy, RelayProcess, TestApp, TestCa,
    TestDatabase, TlsProxy,
};
use sea_orm::{ConnectionTrait, Statement};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

/// The test broker (`OUTBOX_TEST_AMQP_URL`), behind the TLS proxy.
fn local_rabbitmq() -> SocketAddr {
    outbox_tests::server_of(&outbox_tests::services::amqp_url())
}

/// `url` with one more query parameter.
fn with_param(url: &str, key: &str, value: &str) -> String {
    let mut url = url::Url::parse(url).expect("a URL");
    url.query_pairs_mut().append_pair(key, value);
    url.into()
}

#[actix_rt::test]
async fn amqps_with_the_ca_file_delivers_every_event() {
    let proxy = TlsProxy::start(local_rabbitmq()).await;
    let ca_file = proxy.ca.write_pem();
    let seeded = room_events("tls", 50, 5);
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.amqp.url = proxy.amqps_url();
            settings.amqp.tls_ca_file = ca_file.display().to_string();
        })
        .seeded(&seeded)
        .build()
        .await;

    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    app.database
        .wait_all_published(Duration::from_secs(30))
        .await;
    relay.stop(Duration::from_secs(10)).await;

    let received = app
        .broker
        .wait_for_each(&seeded, Duration::from_secs(10))
        .await;
    outbox_tests::assert_every_event_delivered(&received, &seeded);
    let _ = std::fs::remove_file(ca_file);
    app.teardown().await;
}

#[actix_rt::test]
async fn amqps_with_a_wrong_ca_fails_fast_with_a_certificate_error() {
    let proxy = TlsProxy::start(local_rabbitmq()).await;
    let other_ca = TestCa::new("some other CA").write_pem();
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.amqp.url = proxy.amqps_url();
            settings.amqp.tls_ca_file = other_ca.display().to_string();
        })
        .build()
        .await;

    let mut relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    // publish_timeout (3s) bounds the connection attempt; a rejected certificate is a
    // setting to fix (exit code 2), not an outage to wait out.
    let status = relay.wait(Duration::from_secs(15)).await;
    let log = relay.log_text();
    assert_eq!(status.code(), Some(2), "{log}");
    // The password masked where it stands, the user name kept.
    let user = url::Url::parse(&proxy.amqps_url())
        .expect("a URL")
        .username()
        .to_owned();
    assert!(
        log.contains(&format!(
            "cannot connect to RabbitMQ at amqp.url (amqps://{user}:***@localhost:"
        )),
        "names the broker, password redacted: {log}"
    );
    assert!(
        log.contains("invalid peer certificate: UnknownIssuer"),
        "says the certificate is the problem: {log}"
    );
    let _ = std::fs::remove_file(other_ca);
    let _ = std::fs::remove_file(&relay.log);
    app.teardown().await;
}

#[actix_rt::test]
async fn amqps_to_a_host_the_certificate_does_not_name_fails_with_a_certificate_error() {
    // A certificate from the trusted CA, naming `localhost` only: the CA checks out, the
    // name does not when the URL says 127.0.0.1.
    let proxy = TlsProxy::start_naming(local_rabbitmq(), &["localhost"]).await;
    let ca_file = proxy.ca.write_pem();
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.amqp.url = proxy.amqps_url_via("localhost");
            settings.amqp.tls_ca_file = ca_file.display().to_string();
            settings.log.format = "json".into();
        })
        .build()
        .await;

    // Through the name the certificate gives, the same CA file connects.
    let named = RelayProcess::spawn(crate::RELAY, &app.settings);
    eventually("connected via localhost", Duration::from_secs(15), || {
        std::future::ready(!named.log_lines("connected to RabbitMQ").is_empty())
    })
    .await;
    named.stop(Duration::from_secs(10)).await;

    let mut relay = RelayProcess::spawn(
        crate::RELAY,
        &app.settings_with(|settings| settings.amqp.url = proxy.amqps_url_via("127.0.0.1")),
    );
    // A certificate for another host is a setting to fix (exit code 2), as a wrong CA is.
    let status = relay.wait(Duration::from_secs(15)).await;
    let log = relay.log_text();
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(
        relay.log_lines("connected to RabbitMQ").is_empty(),
        "never connected: {log}"
    );
    let refused = relay.log_lines("outbox-relay cannot run with these settings");
    let error = refused
        .first()
        .and_then(|line| line["error"].as_str())
        .unwrap_or_default();
    assert!(
        error.starts_with("cannot connect to RabbitMQ at amqp.url (amqps://")
            && error.contains("@127.0.0.1:"),
        "names the broker: {log}"
    );
    assert!(
        error.contains(r#"invalid peer certificate: certificate not valid for name "127.0.0.1""#),
        "says the certificate does not name the host: {log}"
    );
    let _ = std::fs::remove_file(ca_file);
    let _ = std::fs::remove_file(&relay.log);
    app.teardown().await;
}

#[test]
fn a_missing_ca_file_exits_2_naming_the_key() {
    let mut settings = outbox_relay::settings::Settings::default();
    // Never contacted: the missing CA file fails the settings first.
    settings.amqp.url = "amqps://guest:guest@localhost:5671/%2f".into();
    settings.amqp.tls_ca_file = "/nonexistent/ca.pem".into();
    let output = outbox_tests::run_binary(crate::RELAY, &settings, &["check-config"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("amqp.tls_ca_file") && stderr.contains("/nonexistent/ca.pem"),
        "{stderr}"
    );
}

/// Whether the store's connection to PostgreSQL is encrypted, as the server sees it.
async fn connection_uses_tls(config: &outbox_relay::settings::Config) -> bool {
    let store = outbox_relay::startup::open_store(config, false)
        .await
        .expect("store opens");
    let sql = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()";
    let row = store
        .connection()
        .query_one(Statement::from_string(
            store.connection().get_database_backend(),
            sql,
        ))
        .await
        .expect("pg_stat_ssl readable")
        .expect("a row for this backend");
    row.try_get::<bool>("", "ssl").expect("a boolean")
}

#[actix_rt::test]
async fn postgres_is_plain_by_default_and_tls_with_sslmode_require() {
    let mut app = TestApp::on(Backend::Postgres).build().await;
    let database = &app.database;
    let ssl: String = {
        let row = database
            .db()
            .query_one(Statement::from_string(
                database.db().get_database_backend(),
                "SHOW ssl",
            ))
            .await
            .expect("SHOW ssl")
            .expect("a row");
        row.try_get("", "ssl").expect("text")
    };
    assert_eq!(
        ssl, "on",
        "this test needs PostgreSQL with ssl = on (as on the test machine)"
    );
    assert!(
        !connection_uses_tls(&app.config).await,
        "a URL without sslmode connects in plain text"
    );

    let tls = app.config_with(|settings| {
        settings.database.url = with_param(&settings.database.url, "sslmode", "require");
    });
    assert!(connection_uses_tls(&tls).await, "sslmode=require is TLS");
    let seeded = room_events("pgtls", 20, 4);
    seed(database, &seeded).await;
    app.config = tls;
    app.start().await;
    app.database
        .wait_all_published(Duration::from_secs(30))
        .await;
    app.stop().await;
    let received = app
        .broker
        .wait_for_each(&seeded, Duration::from_secs(10))
        .await;
    outbox_tests::assert_every_event_delivered(&received, &seeded);
    app.teardown().await;
}

/// The local PostgreSQL (`OUTBOX_TEST_DATABASE_URL`).
fn local_postgres() -> SocketAddr {
    outbox_tests::server_of(&outbox_tests::services::database_url(Backend::Postgres))
}

/// `url` with `application_name` set to a fresh name (which the relay's pool and LISTEN
/// connections keep, and its node lock's connection replaces), and that name.
fn named(url: &str) -> (String, String) {
    let name = unique_name("tls");
    (with_param(url, "application_name", &name), name)
}

/// The local ports of process `pid`'s TCP connections to port `server`, from /proc: what
/// PostgreSQL shows as their sessions' `client_port`, whatever they call themselves.
fn client_ports(pid: u32, server: u16) -> Vec<u16> {
    let sockets: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|entries| {
            entries
                .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
                .filter_map(|link| {
                    let inode = link.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?;
                    Some(inode.to_owned())
                })
                .collect()
        })
        .unwrap_or_default();
    let port = |address: &str| u16::from_str_radix(address.rsplit(':').next()?, 16).ok();
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            // sl, local address, remote address, state, queues, timer, retransmits, uid,
            // timeout, inode.
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(remote), Some(inode)) =
                (fields.get(1), fields.get(2), fields.get(9))
            else {
                continue;
            };
            if port(remote) == Some(server) && sockets.contains(*inode) {
                ports.extend(port(local));
            }
        }
    }
    ports
}

/// Whether each of the relay's sessions is encrypted: the sessions PostgreSQL has from the
/// ports `ports` gives (read again at each look), once among them is one named `name` (the
/// pool's) and one named otherwise (the node lock's).
async fn sessions_tls(
    database: &TestDatabase,
    name: &str,
    ports: impl Fn() -> Vec<u16>,
) -> Vec<bool> {
    let read = || async {
        let ports = ports();
        if ports.is_empty() {
            return Vec::new();
        }
        let listed = ports.iter().map(u16::to_string).collect::<Vec<_>>();
        let sql = format!(
            "SELECT a.application_name, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s \
             USING (pid) WHERE a.client_port IN ({})",
            listed.join(", ")
        );
        let rows = database
            .db()
            .query_all(Statement::from_string(
                database.db().get_database_backend(),
                sql,
            ))
            .await
            .expect("pg_stat_ssl readable");
        (rows.iter())
            .map(|row| {
                let named: String = row.try_get("", "application_name").expect("a name");
                (named, row.try_get::<bool>("", "ssl").expect("a boolean"))
            })
            .collect::<Vec<_>>()
    };
    eventually(
        "the relay's sessions, its node lock's among them",
        Duration::from_secs(30),
        || async {
            let sessions = read().await;
            sessions.iter().any(|(named, _)| named == name)
                && sessions.iter().any(|(named, _)| named != name)
        },
    )
    .await;
    read().await.into_iter().map(|(_, ssl)| ssl).collect()
}

/// Relays `seeded` with `PGSSLMODE` and the rest of `env` as given, and returns whether
/// each of its sessions was encrypted, and its log. `proxy`: the relay reaches PostgreSQL
/// through it, and its sessions are the proxy's.
async fn relay_sessions(
    app: &TestApp,
    name: &str,
    env: &[(&str, &str)],
    seeded: &[outbox_store::NewEvent],
    proxy: Option<&FaultProxy>,
) -> (Vec<bool>, RelayProcess) {
    // The proxy's connections for an earlier relay are not this one's.
    let earlier = proxy.map_or(0, |proxy| proxy.upstream_ports().len());
    let relay = RelayProcess::spawn_with_env(crate::RELAY, &app.settings, env);
    seed(&app.database, seeded).await;
    app.database
        .wait_all_published(Duration::from_secs(30))
        .await;
    let pid = relay.pid();
    let sessions = sessions_tls(&app.database, name, || match proxy {
        Some(proxy) => proxy.upstream_ports().split_off(earlier),
        None => client_ports(pid, local_postgres().port()),
    })
    .await;
    (sessions, relay)
}

#[actix_rt::test]
async fn pgsslmode_in_the_environment_is_honoured_and_never_lowered() {
    let mut app = TestApp::on(Backend::Postgres)
        .settings(|settings| settings.log.format = "json".into())
        .build()
        .await;
    let (url, name) = named(&app.settings.database.url);
    app.settings.database.url = url;

    // A loopback URL without a mode would be plain text: PGSSLMODE=require encrypts.
    let seeded = room_events("pgsslmode", 20, 4);
    let (sessions, relay) =
        relay_sessions(&app, &name, &[("PGSSLMODE", "require")], &seeded, None).await;
    assert!(
        sessions.iter().all(|ssl| *ssl),
        "PGSSLMODE=require: every session of the relay is TLS, got {sessions:?}"
    );
    relay.stop(Duration::from_secs(10)).await;

    // Neither the URL nor the environment asks: plain text on loopback, as documented.
    let seeded = room_events("pgplain", 20, 4);
    let (sessions, relay) = relay_sessions(&app, &name, &[("PGSSLMODE", "")], &seeded, None).await;
    assert!(
        sessions.iter().all(|ssl| !*ssl),
        "loopback without a mode is plain text, got {sessions:?}"
    );
    assert!(
        relay
            .log_lines("the database connection is plain text")
            .is_empty(),
        "no warning on loopback"
    );
    relay.stop(Duration::from_secs(10)).await;
    app.teardown().await;
}

#[actix_rt::test]
async fn pgsslmode_verify_full_with_a_wrong_ca_fails_to_connect() {
    let app = TestApp::on(Backend::Postgres).build().await;
    let wrong_ca = TestCa::new("not the server's CA").write_pem();
    let ca = wrong_ca.display().to_string();
    let env = [("PGSSLMODE", "verify-full"), ("PGSSLROOTCERT", ca.as_str())];
    let output =
        outbox_tests::run_binary_with_env(crate::RELAY, &app.settings, &env, &["check-config"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_ne!(
        output.status.code(),
        Some(0),
        "verify-full with a wrong CA: {stderr}"
    );
    assert!(
        stderr.contains("database.url") && stderr.contains("invalid peer certificate"),
        "says the certificate is the problem: {stderr}"
    );
    // The same without the environment: the default connects.
    let output = outbox_tests::run_binary_with_env(
        crate::RELAY,
        &app.settings,
        &[("PGSSLMODE", "")],
        &["check-config"],
    );
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let _ = std::fs::remove_file(wrong_ca);
    app.teardown().await;
}

#[actix_rt::test]
async fn plain_text_to_a_host_that_is_not_loopback_is_warned_once_each() {
    let address = outbox_tests::non_loopback_address();
    let database = FaultProxy::start_on(address, local_postgres()).await;
    let broker = FaultProxy::start_on(address, local_rabbitmq()).await;
    let mut app = TestApp::on(Backend::Postgres)
        .settings(|settings| settings.log.format = "json".into())
        .build()
        .await;
    let through = |url: &str, proxy: &FaultProxy| {
        let mut url = url::Url::parse(url).expect("a URL");
        url.set_host(Some(&proxy.addr.ip().to_string()))
            .expect("a host");
        url.set_port(Some(proxy.addr.port())).expect("a port");
        String::from(url)
    };
    let (url, name) = named(&through(&app.settings.database.url, &database));
    app.settings.amqp.url = through(&app.settings.amqp.url, &broker);

    // Another host, no mode anywhere: the drivers' "prefer", TLS where the server offers it.
    app.settings.database.url = url.clone();
    let seeded = room_events("prefer", 20, 4);
    let (sessions, relay) =
        relay_sessions(&app, &name, &[("PGSSLMODE", "")], &seeded, Some(&database)).await;
    assert!(
        sessions.iter().all(|ssl| *ssl),
        "prefer: TLS, got {sessions:?}"
    );
    assert!(relay
        .log_lines("the database connection is plain text")
        .is_empty());
    assert_eq!(
        relay.log_lines("the broker connection is plain text").len(),
        1,
        "amqp:// to another host: one warning"
    );
    relay.stop(Duration::from_secs(10)).await;

    // sslmode=disable, the operator's explicit choice: kept, and warned of once.
    app.settings.database.url = with_param(&url, "sslmode", "disable");
    let seeded = room_events("disabled", 20, 4);
    let (sessions, relay) =
        relay_sessions(&app, &name, &[("PGSSLMODE", "")], &seeded, Some(&database)).await;
    assert!(sessions.iter().all(|ssl| !*ssl), "{sessions:?}");
    let warnings = relay.log_lines("the database connection is plain text");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(
        warnings[0]["outbox"],
        app.config.outboxes[0].name.as_str(),
        "{warnings:?}"
    );
    relay.stop(Duration::from_secs(10)).await;
    app.teardown().await;
}
