//! `check-config` answers what `run` would: it asks every database and every broker of
//! `amqp.url`; a refusal (login, unknown database or vhost, an exchange of another type)
//! is exit code 2 naming the outbox or the broker entry, the setting and the reason; an
//! address that cannot be reached is a `# warning:` and exit code 0, each host of a
//! database URL listing several too (and `run` names a host it passes over); `--offline`
//! asks nothing.

use outbox_tests::output::{stderr, stdout};
use outbox_tests::services::{amqp_url, with_path, with_user};
use outbox_tests::{assert_within, run_binary, through, unique_name, Backend, TestApp, AT_ONCE};
use std::time::{Duration, Instant};

/// A loopback port nobody listens on (bound, then released).
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// Runs `check-config` with `settings` and expects exit code 2 at once, its
/// error naming each of `names` and containing no `secret`.
fn refused(what: &str, settings: &outbox_relay::settings::Settings, names: &[&str], secret: &str) {
    let started = Instant::now();
    let output = run_binary(crate::RELAY, settings, &["check-config"]);
    let took = started.elapsed();
    let (out, err) = (stdout(&output), stderr(&output));
    assert_eq!(output.status.code(), Some(2), "{what}: {out}\n{err}");
    assert_within(what, took, AT_ONCE);
    for name in names {
        assert!(err.contains(name), "{what}: names {name:?}: {err}");
    }
    assert!(
        !out.contains(secret) && !err.contains(secret),
        "{what}: {secret} printed:\n{out}\n{err}"
    );
}

/// A user of the test's MariaDB with a password, dropped by [`MariaDbUser::drop_now`] or,
/// when a test fails first, on drop.
struct MariaDbUser {
    name: String,
    admin_url: String,
}

impl MariaDbUser {
    async fn create(admin_url: &str, password: &str) -> Self {
        let name = unique_name("relay");
        let db = outbox_store::connect(admin_url, 1)
            .await
            .expect("MariaDB")
            .into_connection();
        let sql = format!("CREATE USER '{name}'@'%' IDENTIFIED BY '{password}'");
        sea_orm::ConnectionTrait::execute_unprepared(&db, &sql)
            .await
            .expect("user created");
        let _ = db.close().await;
        Self {
            name,
            admin_url: admin_url.to_owned(),
        }
    }
}

impl Drop for MariaDbUser {
    fn drop(&mut self) {
        let (url, sql) = (
            self.admin_url.clone(),
            format!("DROP USER IF EXISTS '{}'@'%'", self.name),
        );
        // Off the test's runtime, which may be unwinding.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Runtime::new().expect("a runtime");
            runtime.block_on(async {
                if let Ok(db) = outbox_store::connect(&url, 1)
                    .await
                    .map(outbox_store::Pool::into_connection)
                {
                    let _ = sea_orm::ConnectionTrait::execute_unprepared(&db, &sql).await;
                    let _ = db.close().await;
                }
            });
        })
        .join();
    }
}

async fn a_database_refusing_the_login_or_the_database_name_is_exit_2(backend: Backend) {
    const PASSWORD: &str = "Right-pw-51c3";
    const WRONG: &str = "Wrong-pw-0d9e";
    let app = TestApp::on(backend).build().await;
    let mut url = url::Url::parse(&app.settings.database.url).expect("a URL");
    // The test's PostgreSQL trusts every local login, whatever the password: an unknown
    // role is its refusal of the login. MariaDB checks the password of a user made here.
    let _user = match backend {
        Backend::Postgres => {
            url.set_username(&unique_name("no_such_role")).unwrap();
            url.set_password(Some(WRONG)).unwrap();
            None
        }
        _ => {
            let user = MariaDbUser::create(&app.settings.database.url, PASSWORD).await;
            url.set_username(&user.name).unwrap();
            url.set_password(Some(WRONG)).unwrap();
            Some(user)
        }
    };
    let settings = app.settings_with(|settings| settings.database.url = url.to_string());
    let names = [app.database.table.as_str(), "database.url", "(code 28"];
    refused("a login the database refuses", &settings, &names, WRONG);
    let output = run_binary(crate::RELAY, &settings, &["check-config"]);
    let err = stderr(&output);
    for line in err.lines() {
        // The server's message once (MariaDB's came four times, one per layer).
        let says = if backend == Backend::Postgres {
            "does not exist"
        } else {
            "Access denied"
        };
        assert!(line.matches(says).count() <= 1, "once: {line}");
    }

    let mut unknown = url::Url::parse(&app.settings.database.url).expect("a URL");
    let database = unique_name("no_such_db");
    unknown.set_path(&format!("/{database}"));
    let settings = app.settings_with(|settings| settings.database.url = unknown.to_string());
    refused(
        "an unknown database",
        &settings,
        &["database.url", &database],
        WRONG,
    );
    app.teardown().await;
}
outbox_tests::per_backend!(a_database_refusing_the_login_or_the_database_name_is_exit_2: postgres, mariadb);

#[actix_rt::test]
async fn a_sqlite_file_that_is_not_a_database_is_exit_2_and_a_missing_one_is_not_created() {
    let app = TestApp::on(Backend::Sqlite).build().await;
    let garbage = std::env::temp_dir().join(format!("{}.db", unique_name("not_a_db")));
    std::fs::write(&garbage, vec![b'x'; 4096]).expect("file written");
    let settings = app.settings_with(|settings| {
        settings.database.url = format!("sqlite://{}", garbage.display());
    });
    refused(
        "a file that is not a database",
        &settings,
        &["database.url", &garbage.display().to_string()],
        "(none)",
    );
    let _ = std::fs::remove_file(&garbage);

    let missing = std::env::temp_dir().join(format!("{}.db", unique_name("missing")));
    let settings = app.settings_with(|settings| {
        settings.database.url = format!("sqlite://{}?mode=rwc", missing.display());
    });
    let output = run_binary(crate::RELAY, &settings, &["check-config"]);
    let out = outbox_tests::output::succeeded("a missing SQLite file", &output);
    assert!(out.contains("does not exist yet; not checked"), "{out}");
    assert!(
        !missing.exists(),
        "check-config created {}",
        missing.display()
    );

    // The test's own file and table fit, and the broker takes the login.
    let output = run_binary(crate::RELAY, &app.settings, &["check-config"]);
    let out = outbox_tests::output::succeeded("the test's settings", &output);
    assert!(out.contains("fits the mapping"), "{out}");
    assert!(out.contains("login and vhost accepted"), "{out}");
    app.teardown().await;
}

#[actix_rt::test]
async fn a_broker_refusing_the_password_the_vhost_or_the_exchange_type_is_exit_2() {
    const WRONG: &str = "Wrong-mq-7a2b";
    let app = TestApp::on(Backend::Postgres).build().await;
    let url = amqp_url();
    let user = url::Url::parse(&url).expect("a URL").username().to_owned();
    let settings = app.settings_with(|settings| {
        settings.amqp.url = with_user(&url, &user, Some(WRONG));
    });
    // The URL as the error shows it: the password masked, the rest as given.
    let masked = format!("amqp.url ({})", with_user(&url, &user, Some("***")));
    refused(
        "a wrong broker password",
        &settings,
        &[&masked, "ACCESS_REFUSED"],
        WRONG,
    );
    let vhost = unique_name("no_such_vhost");
    let settings = app.settings_with(|settings| {
        settings.amqp.url = with_path(&url, &format!("/{vhost}"));
    });
    refused("an unknown vhost", &settings, &["amqp.url", &vhost], WRONG);
    // The test's exchange exists as a topic exchange.
    let settings = app.settings_with(|settings| settings.amqp.exchange_type = "direct".into());
    refused(
        "an exchange of another type",
        &settings,
        &["amqp.url", &app.broker.exchange, "PRECONDITION_FAILED"],
        WRONG,
    );
    // Checking created nothing: a missing exchange is a warning naming the usual cause (a
    // typo), and still missing after.
    let missing = unique_name("e2e.missing");
    let settings = app.settings_with(|settings| settings.amqp.exchange = missing.clone());
    let output = run_binary(crate::RELAY, &settings, &["check-config"]);
    let out = outbox_tests::output::succeeded("a missing exchange", &output);
    assert!(
        out.contains(&format!(
            "# warning: exchange {missing:?} does not exist yet: `run` will create it"
        )) && out.contains("check amqp.exchange for a typo"),
        "{out}"
    );
    let output = run_binary(crate::RELAY, &settings, &["check-config"]);
    let out = outbox_tests::output::succeeded("a missing exchange, again", &output);
    assert!(out.contains("does not exist yet"), "not created: {out}");
    app.teardown().await;
}

#[actix_rt::test]
async fn unreachable_addresses_are_warnings_and_offline_contacts_nothing() {
    let app = TestApp::on(Backend::Postgres).build().await;
    let (database_port, broker_port) = (closed_port(), closed_port());
    // The test's database and broker, each moved to a loopback port nobody listens on.
    let closed = |port: u16| std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let database_url = through(closed(database_port), &app.settings.database.url);
    let url = amqp_url();
    let user = url::Url::parse(&url).expect("a URL").username().to_owned();
    let settings = app.settings_with(|settings| {
        settings.database.url = database_url.clone();
        // One broker that answers, one that cannot be reached.
        settings.amqp.url = format!("{url}, {}", through(closed(broker_port), &url));
    });
    let started = Instant::now();
    let output = run_binary(crate::RELAY, &settings, &["check-config"]);
    let out = outbox_tests::output::succeeded("unreachable addresses", &output);
    assert_within(
        "check-config with unreachable addresses",
        started.elapsed(),
        AT_ONCE,
    );
    let warnings: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("# warning:"))
        .collect();
    assert!(
        warnings.iter().any(|line| line.contains("database.url")
            && line.contains(&format!(":{database_port}/"))
            && line.contains("connection refused")),
        "the database named: {out}"
    );
    assert!(
        warnings.iter().any(|line| line.contains("amqp.url[1]")
            && line.contains(&format!(":{broker_port}/"))
            && line.contains("refused")),
        "the broker entry named: {out}"
    );
    let masked = with_user(&url, &user, Some("***"));
    assert!(
        out.contains(&format!("# broker amqp.url[0] ({masked}): login")),
        "the other entry checked: {out}"
    );

    let started = Instant::now();
    let output = run_binary(crate::RELAY, &settings, &["check-config", "--offline"]);
    let took = started.elapsed();
    let out = outbox_tests::output::succeeded("--offline", &output);
    assert_within("check-config --offline", took, AT_ONCE);
    assert!(
        out.contains("--offline: no database or broker contacted"),
        "{out}"
    );
    for port in [database_port, broker_port] {
        assert!(
            !out.lines()
                .any(|line| line.starts_with("# warning:") && line.contains(&format!(":{port}/"))),
            "nothing contacted: {out}"
        );
    }
    assert!(!out.contains("login and vhost accepted"), "{out}");
    app.teardown().await;
}

/// `url` (one host) with its host list replaced by `hosts` (`host:port,…`), as libpq
/// lists them.
fn with_hosts(url: &str, hosts: &str) -> String {
    outbox_store::hosts::with_hosts_of(&format!("postgres://{hosts}/"), url)
}

/// A host of a multi-host `database.url` that cannot be reached is named, as `host:port`
/// and never with the password: by `check-config` (each host asked, a `# warning:` for it)
/// and by `run` when connecting passes it over for the next.
async fn a_host_of_a_database_url_passed_over_is_named(backend: Backend) {
    const PASSWORD: &str = "Host-list-pw-93f1";
    let app = TestApp::on(backend).build().await;
    let parsed = url::Url::parse(&app.settings.database.url).expect("a URL");
    let server = format!(
        "{}:{}",
        parsed.host_str().expect("a host"),
        parsed.port().unwrap_or(match backend {
            Backend::Postgres => 5432,
            _ => 3306,
        })
    );
    let closed = format!("127.0.0.1:{}", closed_port());
    // The test's PostgreSQL trusts local logins whatever the password: one can be given
    // there to check that it is shown nowhere. MariaDB's root has none.
    let password = match backend {
        Backend::Postgres => PASSWORD,
        _ => "",
    };
    let settings_on = |hosts: &str| {
        app.settings_with(|settings| {
            settings.database.url = with_hosts(&settings.database.url, hosts);
            settings.database.password = password.into();
            settings.log.format = "json".into();
        })
    };

    // check-config: the reachable host and the closed one, each named.
    let settings = settings_on(&format!("{server},{closed}"));
    let output = run_binary(crate::RELAY, &settings, &["check-config"]);
    let out = outbox_tests::output::succeeded("check-config on a host list", &output);
    assert!(
        out.lines().any(|line| line.starts_with("# outbox ")
            && line.ends_with(&format!("database.url host {server} takes writes"))),
        "the first host: {out}"
    );
    assert!(
        out.lines()
            .any(|line| line.starts_with("# warning: outbox ")
                && line.contains(&format!(
                    "database.url host {closed} cannot be used: connection refused"
                ))),
        "the closed host named: {out}"
    );
    assert!(out.contains("fits the mapping"), "the table checked: {out}");
    assert!(
        !out.contains(PASSWORD) && !stderr(&output).contains(PASSWORD),
        "no password: {out}"
    );

    // run: the closed host first, passed over for the reachable one, and said so.
    let relay = outbox_tests::RelayProcess::spawn(
        crate::RELAY,
        &settings_on(&format!("{closed},{server}")),
    );
    let mut passed = Vec::new();
    outbox_tests::eventually(
        "the host passed over in the log",
        Duration::from_secs(30),
        || {
            passed = relay.log_lines("a database host of the URL is passed over");
            std::future::ready(!passed.is_empty())
        },
    )
    .await;
    let line = &passed[0];
    assert_eq!(line["level"], "WARN", "{line}");
    assert_eq!(line["host"], closed.as_str(), "{line}");
    assert_eq!(line["next"], server.as_str(), "{line}");
    assert!(
        line["reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("connection refused")),
        "{line}"
    );
    relay.stop(Duration::from_secs(10)).await;
    // stop() removed the log: the line read above is all there was to check for a password.
    assert!(!line.to_string().contains(PASSWORD), "{line}");
    app.teardown().await;
}
outbox_tests::per_backend!(a_host_of_a_database_url_passed_over_is_named: postgres, mariadb);
