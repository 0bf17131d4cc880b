//! Passwords never reach `check-config`, the log of `run` (its reconnections and its
//! shutdown too), or an error message — whether they come in the URL, from `*.password` or
//! from `*.password_file` — and every password given in the environment reaches the server
//! exactly as written: RabbitMQ's, MariaDB's, and PostgreSQL's on a server that checks it.

use outbox_relay::settings::OutboxSettings;
use outbox_store::TableName;
use outbox_tests::output::{stderr, stdout};
use outbox_tests::replica::PgPair;
use outbox_tests::OutputInTime as _;
use outbox_tests::{
    eventually, room_events, run_binary, seed, settings_on, test_settings, unique_name, Backend,
    BrokerUser, FaultProxy, RelayProcess, SettingsFile, TestBroker, TestDatabase,
};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(30);

/// Asserts that none of `texts` shows `password`. A short one (`0123`, `true`) may occur
/// in any log by chance (a timestamp, a JSON boolean), so it is looked for where a
/// password would stand; a long one anywhere.
fn assert_not_shown(password: &str, texts: &[&str]) {
    for text in texts {
        if password.len() >= 7 {
            assert!(!text.contains(password), "{password} shown:\n{text}");
            continue;
        }
        for form in [
            format!(":{password}@"),
            format!("password={password}"),
            format!("password: \"{password}\""),
            format!("password = \"{password}\""),
        ] {
            assert!(!text.contains(&form), "{form} shown:\n{text}");
        }
    }
}

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
    let mut settings = outbox_relay::settings::Settings::default();
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
    // be looked for; the broker's, of a user of the test's own, is given through a file.
    const DATABASE_PASSWORD: &str = "pg-Pw-41d8cd98";
    const AMQP_PASSWORD: &str = "mq-Pw-9e107d9d";
    let database = TestDatabase::new(Backend::Postgres).await;
    let broker = TestBroker::new("#").await;
    let user = BrokerUser::new(AMQP_PASSWORD);
    let amqp_password = secret_file(AMQP_PASSWORD);
    // Both links through proxies, so both can be lost mid-run: the lines of a lost
    // connection carry the library's error text and the URL.
    let (database_proxy, database_url) =
        FaultProxy::in_front_of(&with_password(&database.url, DATABASE_PASSWORD)).await;
    let (broker_proxy, amqp_url) = FaultProxy::in_front_of(&user.url(&broker)).await;
    let settings = test_settings(&database, &broker, |settings| {
        settings.database.url = database_url;
        settings.amqp.url = amqp_url;
        settings.amqp.password_file = amqp_password.display().to_string();
        settings.relay.retry_interval = "100ms".into();
        // The libraries' debug lines, and amq-protocol-tcp's trace line that prints the
        // parsed broker URL, password and all.
        settings.log.level = "debug,amq_protocol_tcp=trace".into();
    });
    seed(&database, &room_events("secret", 20, 4)).await;

    let relay = RelayProcess::spawn(crate::RELAY, &settings);
    database.wait_all_published(DEADLINE).await;

    // The broker goes while events wait to be published, then the database.
    broker_proxy.go_down();
    seed(&database, &room_events("secret-later", 20, 4)).await;
    eventually("the broker's loss logged", DEADLINE, || {
        std::future::ready(relay.log_text().contains("broker connection lost"))
    })
    .await;
    database_proxy.go_down();
    eventually("the database's loss logged", DEADLINE, || {
        std::future::ready(relay.log_text().contains("database unavailable"))
    })
    .await;
    broker_proxy.restore();
    database_proxy.restore();
    database.wait_all_published(DEADLINE).await;
    eventually("both links back", DEADLINE, || {
        let log = relay.log_text();
        std::future::ready(
            log.contains("broker connection re-established")
                && log.contains("database available again"),
        )
    })
    .await;
    let log = relay.stop_and_log(Duration::from_secs(10)).await;

    assert!(log.contains("DEBUG"), "debug lines were logged: {log}");
    // What is scanned holds the lines that could show a password: the broker's URL at
    // its reconnection (masked), the database's loss with the driver's error, and the
    // shutdown, logged after SIGTERM.
    let masked = format!("{}:***@", user.name);
    assert!(
        log.lines()
            .any(|line| line.contains("re-established") && line.contains(&masked)),
        "the reconnection names the broker, password masked: {log}"
    );
    assert!(
        log.lines()
            .any(|line| line.contains("database unavailable") && line.contains("error=")),
        "the database's loss with its error: {log}"
    );
    assert!(
        log.contains("relay stopped"),
        "the shutdown was logged: {log}"
    );
    assert!(!log.contains(DATABASE_PASSWORD), "{log}");
    assert!(!log.contains(AMQP_PASSWORD), "{log}");
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

#[actix_rt::test]
async fn passwords_that_look_like_numbers_booleans_lists_or_quotes_reach_the_broker_verbatim() {
    let database = TestDatabase::new(Backend::Postgres).await;
    let broker = TestBroker::new("#").await;
    for (round, password) in ["8675309", "0123", "true", "[s3cr3t,x]", "\"Sup3r\""]
        .into_iter()
        .enumerate()
    {
        let user = BrokerUser::new(password);
        let settings = test_settings(&database, &broker, |settings| {
            settings.amqp.url = user.url(&broker);
            // As OUTBOX_RELAY__AMQP__PASSWORD: every setting reaches the binary as a variable.
            settings.amqp.password = password.into();
            settings.log.level = "debug".into();
            // A refused login exits 2 at once; anything else gets 10 s.
            settings.relay.startup_timeout = "10s".into();
        });
        let check = run_binary(crate::RELAY, &settings, &["check-config"]);
        assert!(check.status.success(), "{password}: {}", stderr(&check));
        let events = room_events(&format!("verbatim{round}"), 5, 1);
        seed(&database, &events).await;
        let relay = RelayProcess::spawn(crate::RELAY, &settings);
        database.wait_all_published(DEADLINE).await;
        let log = relay.stop_and_log(Duration::from_secs(10)).await;
        assert!(log.contains("DEBUG"), "debug lines were logged: {log}");
        // A short password is looked for where it would stand in a URL: one was logged.
        assert!(
            log.contains(&format!("{}:***@", user.name)),
            "the broker's URL logged, password masked: {log}"
        );
        assert_not_shown(password, &[&stdout(&check), &stderr(&check), &log]);
    }
    broker.close().await;
    database.drop_table().await;
}

#[actix_rt::test]
async fn a_database_password_reaches_postgresql_verbatim() {
    // The shared PostgreSQL trusts every local login, so a server of the test's own asks
    // this role for its password: a wrong one is refused, only the exact one gets in.
    const PASSWORD: &str = "pg Pw'\"@:/?#%41 é-7c3e";
    let pair = tokio::task::spawn_blocking(PgPair::start)
        .await
        .expect("a server");
    let role = unique_name("e2e_pw");
    pair.require_password(&role, PASSWORD);
    let url = format!("postgres://{role}@{}/postgres", pair.primary);
    let wrong = with_password(&url, "not-the-password");
    eventually("a wrong password refused", DEADLINE, || async {
        outbox_store::connect(&wrong, 1)
            .await
            .is_err_and(|error| error.to_string().contains("password authentication failed"))
    })
    .await;
    // Every byte but letters and digits percent-encoded, apart from the URL code under test.
    let encoded: String = PASSWORD
        .bytes()
        .map(|byte| match byte.is_ascii_alphanumeric() {
            true => char::from(byte).to_string(),
            false => format!("%{byte:02X}"),
        })
        .collect();
    let exact = format!("postgres://{role}:{encoded}@{}/postgres", pair.primary);
    outbox_store::connect(&exact, 1)
        .await
        .unwrap_or_else(|error| panic!("the role logs in with its password: {error}"));

    // The table and the events, by the server's superuser; the role may use them.
    let admin = outbox_store::connect(&PgPair::url(pair.primary), 2)
        .await
        .expect("the superuser connects")
        .into_connection();
    let table = TableName::parse(&unique_name("verbatim")).expect("a table name");
    outbox_store::migrate(&admin, &table)
        .await
        .expect("migration runs");
    PgPair::sql(
        pair.primary,
        &[
            &format!("GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}"),
            &format!("GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}"),
        ],
    );
    let events = room_events("verbatim-pg", 10, 2);
    outbox_store::insert_events(&admin, &table, &events)
        .await
        .expect("events inserted");

    let broker = TestBroker::new("#").await;
    let settings = settings_on(&url, &table, &broker, |settings| {
        settings.database.password = PASSWORD.into();
        settings.relay.startup_timeout = "10s".into();
    });
    let relay = RelayProcess::spawn(crate::RELAY, &settings);
    broker.wait_for_each(&events, DEADLINE).await;
    let log = relay.stop_and_log(Duration::from_secs(10)).await;
    outbox_tests::assert_every_event_delivered(&broker.drain(DEADLINE).await, &events);
    assert!(!log.contains(PASSWORD), "{log}");
    broker.close().await;
}

#[test]
fn a_toml_syntax_error_in_a_line_holding_a_password_names_the_place_only() {
    let file = std::env::temp_dir().join(unique_name("syntax") + ".toml");
    std::fs::write(
        &file,
        "[relay]\nbatch_size = 10\n[amqp]\nurl = \"amqp://guest:TopSecret42@127.0.0.1:5672/%2f\n",
    )
    .unwrap();
    for command in ["check-config", "run"] {
        let output = Command::new(crate::RELAY)
            .arg("--config")
            .arg(&file)
            .arg(command)
            .output_in_time()
            .unwrap();
        let text = format!("{}{}", stdout(&output), stderr(&output));
        assert_eq!(output.status.code(), Some(2), "{text}");
        assert!(
            text.contains(&format!("config file {}, line 4, column ", file.display()))
                && text.contains("invalid TOML"),
            "{text}"
        );
        assert!(
            !text.contains("TopSecret42") && !text.contains("guest"),
            "{text}"
        );
    }
    let _ = std::fs::remove_file(file);
}

#[actix_rt::test]
async fn a_one_letter_password_does_not_mangle_log_lines() {
    let database = TestDatabase::new(Backend::Sqlite).await;
    let broker = TestBroker::new("#").await;
    let user = BrokerUser::new("e");
    let settings = test_settings(&database, &broker, |settings| {
        settings.amqp.url = user.url(&broker);
        settings.amqp.password = "e".into();
        settings.relay.startup_timeout = "10s".into();
    });
    let events = room_events("one-letter", 5, 1);
    seed(&database, &events).await;
    let relay = RelayProcess::spawn(crate::RELAY, &settings);
    database.wait_all_published(DEADLINE).await;
    let log = relay.stop_and_log(Duration::from_secs(10)).await;

    // The checks below look at the masks: the broker's URL was logged, masked.
    assert!(
        log.contains(&format!("amqp://{}:***@", user.name)),
        "the broker's URL logged, password masked: {log}"
    );
    assert!(
        log.contains("relay") && log.contains(&user.name),
        "words with an e, and the user name, as written: {log}"
    );
    let masks = log.matches("***").count();
    assert_eq!(
        masks,
        log.matches(":***@").count(),
        "*** only where a URL's password stands: {log}"
    );
    assert!(!log.contains(":e@"), "{log}");
    broker.close().await;
    database.drop_table().await;
}

#[actix_rt::test]
async fn an_outbox_on_a_second_database_takes_its_own_password_from_the_environment() {
    const PG_PASSWORD: &str = "pg-Pw-2b7d41";
    const MARIA_PASSWORD: &str = "maria-Pw-0123";
    let postgres = TestDatabase::new(Backend::Postgres).await;
    let maria = TestDatabase::new(Backend::MySql).await;
    let user = unique_name("e2e_relay");
    for host in ["%", "localhost", "127.0.0.1"] {
        maria
            .execute(&format!(
                "CREATE USER '{user}'@'{host}' IDENTIFIED BY '{MARIA_PASSWORD}'"
            ))
            .await;
        maria
            .execute(&format!("GRANT ALL ON test.* TO '{user}'@'{host}'"))
            .await;
    }
    let broker = TestBroker::new("#").await;
    let on_postgres = room_events("on-postgres", 10, 2);
    let on_maria = room_events("on-maria", 10, 2);
    seed(&postgres, &on_postgres).await;
    seed(&maria, &on_maria).await;

    let mut maria_url = url::Url::parse(&maria.url).unwrap();
    maria_url.set_username(&user).unwrap();
    maria_url.set_password(None).unwrap();
    let settings = test_settings(&postgres, &broker, |settings| {
        settings.log.level = "debug".into();
        settings.relay.startup_timeout = "10s".into();
        settings.outboxes = vec![
            OutboxSettings {
                name: "rooms".into(),
                table: postgres.table.as_str().into(),
                ..OutboxSettings::default()
            },
            OutboxSettings {
                name: "orders".into(),
                table: maria.table.as_str().into(),
                database_url: maria_url.to_string(),
                ..OutboxSettings::default()
            },
        ];
    });
    let file = SettingsFile::write(&settings);
    let relay = file.spawn_with_env(
        crate::RELAY,
        "second-database",
        &[
            // PostgreSQL trusts local connections, so this password is accepted and
            // ignored there; put into the MariaDB URL, it would be refused.
            ("OUTBOX_RELAY__DATABASE__PASSWORD", PG_PASSWORD),
            (
                "OUTBOX_RELAY__OUTBOXES__ORDERS__DATABASE_PASSWORD",
                MARIA_PASSWORD,
            ),
        ],
    );
    postgres.wait_all_published(DEADLINE).await;
    maria.wait_all_published(DEADLINE).await;
    let log = relay.stop_and_log(Duration::from_secs(10)).await;
    for password in [PG_PASSWORD, MARIA_PASSWORD] {
        assert!(!log.contains(password), "{password}: {log}");
    }

    // By position too; a position with no entry is refused, naming the variable.
    let output = Command::new(crate::RELAY)
        .arg("--config")
        .arg(&file.path)
        .arg("check-config")
        .env(
            "OUTBOX_RELAY__OUTBOXES__1__DATABASE_PASSWORD",
            MARIA_PASSWORD,
        )
        .env(
            "OUTBOX_RELAY__OUTBOXES__2__DATABASE_PASSWORD",
            MARIA_PASSWORD,
        )
        .output_in_time()
        .unwrap();
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(
        text.contains("environment variable OUTBOX_RELAY__OUTBOXES__2__DATABASE_PASSWORD: names no [[outboxes]] entry")
            && text.contains("0 (rooms), 1 (orders)"),
        "{text}"
    );
    assert!(!text.contains(MARIA_PASSWORD), "{text}");

    for host in ["%", "localhost", "127.0.0.1"] {
        maria.execute(&format!("DROP USER '{user}'@'{host}'")).await;
    }
    broker.close().await;
    postgres.drop_table().await;
    maria.drop_table().await;
}

/// Sets `path`'s mode.
fn chmod(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// The `# warning:` lines of `check-config`'s output.
fn warnings(output: &std::process::Output) -> Vec<String> {
    stdout(output)
        .lines()
        .filter(|line| line.starts_with("# warning:"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn check_config_warns_of_a_settings_file_with_a_password_that_others_may_read() {
    let mut settings = outbox_relay::settings::Settings::default();
    settings.database.url = "postgres://relay:Mode-Pw-7a1e@db.internal:5432/rooms".into();
    let file = SettingsFile::write(&settings);
    let path = file.path.display().to_string();

    chmod(&file.path, 0o644);
    let output = file.run(crate::RELAY, &["check-config", "--offline"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let warned = warnings(&output);
    assert!(
        warned.iter().any(|line| line.contains(&format!(
            "settings file {path} holds a secret and is readable by its group or others \
             (mode 0644): chmod 600 {path}"
        ))),
        "{warned:?}"
    );
    assert_not_shown("Mode-Pw-7a1e", &[&stdout(&output), &stderr(&output)]);

    chmod(&file.path, 0o600);
    let output = file.run(crate::RELAY, &["check-config", "--offline"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        !warnings(&output).iter().any(|line| line.contains(&path)),
        "{}",
        stdout(&output)
    );
}

#[test]
fn check_config_warns_of_a_password_file_that_its_group_may_read() {
    let password = secret_file("Group-Pw-31c9");
    chmod(&password, 0o640);
    let mut settings = outbox_relay::settings::Settings::default();
    settings.amqp.url = "amqp://relay@mq.internal:5672/%2f".into();
    settings.amqp.password_file = password.display().to_string();

    let output = run_binary(crate::RELAY, &settings, &["check-config", "--offline"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let path = password.display();
    let warned = warnings(&output);
    assert!(
        warned.iter().any(|line| line.contains(&format!(
            "password file {path} (amqp.password_file) is readable by its group or others \
             (mode 0640): chmod 600 {path}"
        ))),
        "{warned:?}"
    );
    let _ = std::fs::remove_file(password);
}
