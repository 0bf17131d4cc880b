//! TLS: `amqps://` through a TLS-terminating proxy in front of the local RabbitMQ (which
//! speaks plain AMQP only), and PostgreSQL's `sslmode`.

use outbox_tests::{room_events, seed, Backend, RelayProcess, TestApp, TestCa, TlsProxy};
use sea_orm::{ConnectionTrait, Statement};
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
    // guest's password is "guest": masked where it stands, the user name kept.
    assert!(
        log.contains("cannot connect to RabbitMQ at amqp.url (amqps://guest:***@localhost:"),
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

#[test]
fn a_missing_ca_file_exits_2_naming_the_key() {
    let mut settings = outbox_relay::settings::Settings::default();
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
