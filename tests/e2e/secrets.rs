//! Passwords never reach `check-config`, the log of `run`, or an error message — whether
//! they come in the URL, from `*.password` or from `*.password_file`.

use outbox_tests::{
    room_events, seed, test_settings, Backend, RelayProcess, TestBroker, TestDatabase,
};
use std::path::PathBuf;
use std::time::Duration;

/// A file holding `secret` and a newline, as secret mounts usually do.
fn secret_file(secret: &str) -> PathBuf {
    let path = std::env::temp_dir().join(outbox_tests::unique_name("secret"));
    std::fs::write(&path, format!("{secret}\n")).expect("secret written");
    path
}

/// `url` with `password` in it.
fn with_password(url: &str, password: &str) -> String {
    let mut url = url::Url::parse(url).expect("a URL");
    url.set_password(Some(password)).expect("a URL with a host");
    url.into()
}

/// A loopback port nobody listens on (bound, then released).
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

#[test]
fn check_config_prints_no_password_from_the_environment_or_a_file() {
    const FROM_ENV: &str = "env-Pw-6f1c2a";
    const FROM_FILE: &str = "file-Pw-93b7e0";
    let file = secret_file(FROM_FILE);
    let mut settings = outbox_cli::settings::Settings::default();
    settings.database.url = "postgres://relay@db.internal:5432/rooms".into();
    settings.database.password = FROM_ENV.into();
    settings.amqp.url = "amqp://relay@mq.internal:5672/%2f".into();
    settings.amqp.password_file = file.display().to_string();

    let output = outbox_tests::run_binary(crate::RELAY, &settings, &["check-config"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    for secret in [FROM_ENV, FROM_FILE] {
        assert!(
            !stdout.contains(secret) && !stderr.contains(secret),
            "{secret} leaked:\n{stdout}\n{stderr}"
        );
    }
    assert!(stdout.contains("password = \"***\""), "{stdout}");
    assert!(
        stdout.contains(&format!("password_file = \"{}\"", file.display())),
        "{stdout}"
    );
    let _ = std::fs::remove_file(file);
}

#[actix_rt::test]
async fn the_log_of_run_holds_no_password() {
    // Trust authentication ignores the password, so a distinctive one is accepted and can
    // be looked for; RabbitMQ's guest has exactly "guest", given here through a file.
    const DATABASE_PASSWORD: &str = "pg-Pw-41d8cd98";
    let database = TestDatabase::new(Backend::Postgres).await;
    let broker = TestBroker::new("#").await;
    let amqp_password = secret_file("guest");
    let settings = test_settings(&database, &broker, |settings| {
        settings.database.url = with_password(&database.url, DATABASE_PASSWORD);
        settings.amqp.url = "amqp://guest@127.0.0.1:5672/%2f".into();
        settings.amqp.password_file = amqp_password.display().to_string();
        // The libraries' debug lines, and amq-protocol-tcp's trace line that prints the
        // parsed broker URL, password and all.
        settings.log.level = "debug,amq_protocol_tcp=trace".into();
    });
    let seeded = room_events("secret", 20, 4);
    seed(&database, &seeded).await;

    let relay = RelayProcess::spawn(crate::RELAY, &settings);
    database.wait_all_published(Duration::from_secs(30)).await;
    let log = relay.log_text();
    relay.stop(Duration::from_secs(10)).await;

    assert!(log.contains("DEBUG"), "debug lines were logged: {log}");
    assert!(!log.contains(DATABASE_PASSWORD), "{log}");
    assert!(!log.contains(":guest@"), "{log}");
    let _ = std::fs::remove_file(amqp_password);
    broker.close().await;
    database.drop_table().await;
}

#[actix_rt::test]
async fn a_database_connection_error_names_no_password() {
    const PASSWORD: &str = "db-Bogus-Pw-5e3a91";
    let database = TestDatabase::new(Backend::Postgres).await;
    let broker = TestBroker::new("#").await;
    let port = closed_port();
    let settings = test_settings(&database, &broker, |settings| {
        settings.database.url = format!("postgres://postgres:{PASSWORD}@127.0.0.1:{port}/test");
        // Refused is a failure `run` waits out; the bound makes it give up.
        settings.relay.startup_timeout = "1s".into();
    });

    let mut relay = RelayProcess::spawn(crate::RELAY, &settings);
    let status = relay.wait(Duration::from_secs(30)).await;
    let log = relay.log_text();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains(&format!("postgres://postgres:***@127.0.0.1:{port}/test")),
        "names the database, password redacted: {log}"
    );
    assert!(!log.contains(PASSWORD), "{log}");
    let _ = std::fs::remove_file(&relay.log);
    broker.close().await;
    database.drop_table().await;
}

#[actix_rt::test]
async fn a_broker_connection_error_names_no_password_from_a_file() {
    const PASSWORD: &str = "amqp-Bogus-Pw-c0ffee";
    let database = TestDatabase::new(Backend::Postgres).await;
    let broker = TestBroker::new("#").await;
    let port = closed_port();
    let password_file = secret_file(PASSWORD);
    let settings = test_settings(&database, &broker, |settings| {
        settings.amqp.url = format!("amqp://guest@127.0.0.1:{port}/%2f");
        settings.amqp.password_file = password_file.display().to_string();
        settings.log.level = "debug,amq_protocol_tcp=trace".into();
        settings.relay.startup_timeout = "1s".into();
    });

    let mut relay = RelayProcess::spawn(crate::RELAY, &settings);
    let status = relay.wait(Duration::from_secs(30)).await;
    let log = relay.log_text();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains(&format!(
            "cannot connect to RabbitMQ at amqp.url (amqp://guest:***@127.0.0.1:{port}"
        )),
        "names the broker, password redacted: {log}"
    );
    assert!(!log.contains(PASSWORD), "{log}");
    let _ = std::fs::remove_file(password_file);
    let _ = std::fs::remove_file(&relay.log);
    broker.close().await;
    database.drop_table().await;
}
