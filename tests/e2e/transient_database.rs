//! Statements the database fails for a moment — a deadlock, a lock not had within
//! PostgreSQL's `lock_timeout`, SQLite's busy timeout running out, a connection reset —
//! at start and mid-run: `run` never ends on one, tries the statement again, and delivers
//! every event once, in room order, once the obstruction is gone.

use outbox_tests::{
    eventually, per_backend, room_events, Backend, FaultProxy, RelayProcess, TestApp,
};
use sea_orm::sqlx::{self, Connection as _, Executor as _};
use sea_orm::{ConnectionTrait, DatabaseTransaction, TransactionTrait};
use std::time::{Duration, Instant};

/// How long any one condition is waited for.
const DEADLINE: Duration = Duration::from_secs(30);

/// A graceful stop's bound: `publish_timeout` (3 s in the tests) + 2 s.
const SHUTDOWN: Duration = Duration::from_secs(5);

/// What the Fetcher says, once, when claims (or the release before one) begin to fail and
/// when they work again.
const UNAVAILABLE: &str = "database unavailable: claims fail";
const AVAILABLE: &str = "database available again";

/// `url` whose sessions give up waiting for a lock after 200 ms (PostgreSQL's
/// `lock_timeout`, set through the connection's startup options).
fn with_lock_timeout(url: &str) -> String {
    let mut url = url::Url::parse(url).expect("a URL");
    url.query_pairs_mut()
        .append_pair("options", "-c lock_timeout=200ms");
    url.into()
}

/// The relay's WARN lines that mention `needle` anywhere (message, reason or error).
fn warnings_with(relay: &RelayProcess, needle: &str) -> Vec<serde_json::Value> {
    relay
        .log_lines("")
        .into_iter()
        .filter(|line| line["level"] == "WARN" && line.to_string().contains(needle))
        .collect()
}

/// The relay's lines whose message starts with `message`, at `level`; fails on one at
/// another level.
fn at_level(relay: &RelayProcess, message: &str, level: &str) -> usize {
    let lines = relay.log_lines(message);
    for line in &lines {
        assert_eq!(line["level"], level, "{line}");
    }
    lines.len()
}

/// Waits until the relay logged a WARN line mentioning `needle`; fails at once if it exited.
async fn warned(relay: &mut RelayProcess, needle: &str) -> serde_json::Value {
    let until = Instant::now() + DEADLINE;
    loop {
        if let Some(line) = warnings_with(relay, needle).pop() {
            return line;
        }
        if let Some(status) = relay.exited() {
            panic!(
                "the relay exited ({status}) instead of retrying; its log:\n{}",
                relay.log_text()
            );
        }
        assert!(
            Instant::now() < until,
            "no warning mentioning {needle:?} within {DEADLINE:?}; the log:\n{}",
            relay.log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The relay still runs: it never ended on a statement the database failed.
fn still_running(relay: &mut RelayProcess) {
    if let Some(status) = relay.exited() {
        panic!(
            "the relay exited ({status}); its log:\n{}",
            relay.log_text()
        );
    }
}

/// A transaction of the test's own holding what the relay's statements need: on
/// PostgreSQL the table in ACCESS EXCLUSIVE mode, on SQLite the database's write lock (a
/// first write; in WAL mode, BEGIN EXCLUSIVE takes no more). `insert` goes in with it.
async fn hold_the_table(app: &TestApp, insert: &[outbox_store::NewEvent]) -> DatabaseTransaction {
    let txn = app.database.db().begin().await.expect("begin");
    if app.database.backend() == sea_orm::DbBackend::Postgres {
        let t = &app.database.table;
        txn.execute_unprepared(&format!("LOCK TABLE {t} IN ACCESS EXCLUSIVE MODE"))
            .await
            .expect("the table locked");
    }
    outbox_store::insert_events(&txn, &app.database.table, insert)
        .await
        .expect("events inserted under the lock");
    txn
}

/// A relay started while another transaction holds the table (PostgreSQL: its start-up
/// checks and first claim give up on the lock after `lock_timeout`; SQLite: the release
/// of an earlier run's leases before its first claim is busy past the busy timeout)
/// waits it out and delivers every event once it is released.
async fn a_lock_held_at_start_is_waited_out(backend: Backend) {
    let seeded = room_events("lockedstart", 40, 4);
    let held = room_events("lockedstartheld", 40, 4);
    let app = TestApp::on(backend)
        .settings(|settings| {
            settings.log.format = "json".into();
            if backend == Backend::Postgres {
                settings.database.url = with_lock_timeout(&settings.database.url);
            }
        })
        .seeded(&seeded)
        .build()
        .await;
    let lock = hold_the_table(&app, &held).await;
    let mut relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    let needle = match backend {
        Backend::Postgres => "lock timeout",
        _ => "database is locked",
    };
    let line = warned(&mut relay, needle).await;
    eprintln!("{backend:?}, table locked at start: {line}");
    assert!(
        app.broker.received().is_empty(),
        "nothing before the lock goes"
    );
    lock.commit().await.expect("the lock released");

    let all: Vec<_> = seeded.iter().chain(&held).cloned().collect();
    app.expect_every_event_once(&format!("{backend:?}, locked at start"), &all)
        .await;
    still_running(&mut relay);
    relay.stop(outbox_tests::within(SHUTDOWN)).await;
    app.teardown().await;
}
per_backend!(a_lock_held_at_start_is_waited_out: postgres, sqlite);

/// MariaDB: a genuine deadlock of the start-up release of the leases an earlier run of
/// this node left. A transaction of the test's own, heavier than the release (InnoDB rolls
/// back the lighter one), locks the last leased row; the release locks the rows before it
/// and waits; the test's transaction then asks for the first one: InnoDB picks the
/// release as the deadlock's victim (1213, SQLSTATE 40001). The relay tries the release
/// again, releases every lease and delivers every event.
async fn a_deadlocked_start_up_release_is_retried(backend: Backend) {
    const EVENTS: usize = 20;
    let seeded = room_events("deadlock", EVENTS, 4);
    let app = TestApp::on(backend)
        .settings(|settings| settings.log.format = "json".into())
        .seeded(&seeded)
        .build()
        .await;
    let t = app.database.table.clone();
    let node = app.settings.relay.node_id.clone();
    // Leases an earlier, ended run of this node left (as a crash would).
    app.database
        .execute(&format!(
            "UPDATE {{t}} SET locked_by = '{node}', \
             locked_until = UTC_TIMESTAMP(6) + INTERVAL 1 HOUR"
        ))
        .await;
    app.database
        .execute(&format!("CREATE TABLE {t}_weight (n INT PRIMARY KEY)"))
        .await;
    let url = outbox_tests::services::database_url(backend);
    let mut other = sqlx::MySqlConnection::connect(&url)
        .await
        .expect("the test's connection");
    let (first, last): (i64, i64) = sqlx::query_as(&format!("SELECT MIN(id), MAX(id) FROM {t}"))
        .fetch_one(&mut other)
        .await
        .expect("the ids");
    other.execute("BEGIN").await.expect("begin");
    // Two thousand undo records: far heavier than the release's twenty.
    other
        .execute(format!("INSERT INTO {t}_weight SELECT seq FROM seq_1_to_2000").as_str())
        .await
        .expect("the weight inserted");
    other
        .execute(format!("SELECT id FROM {t} WHERE id = {last} FOR UPDATE").as_str())
        .await
        .expect("the last row locked");

    let mut relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    let waiting = format!(
        "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT' \
         AND trx_query LIKE 'UPDATE {t} SET locked_by = NULL%'"
    );
    // Read at most every 200 ms: InnoDB refreshes the table behind INNODB_TRX only when
    // it was not read for 100 ms, so a faster poll would read the same stale copy forever.
    let until = Instant::now() + DEADLINE;
    loop {
        let statement = sea_orm::Statement::from_string(sea_orm::DbBackend::MySql, &waiting);
        let row = app.database.db().query_one(statement).await;
        let row = row.expect("INNODB_TRX read");
        let waits = row.and_then(|row| row.try_get_by_index::<i64>(0).ok());
        if waits.is_some_and(|n| n > 0) {
            break;
        }
        still_running(&mut relay);
        assert!(
            Instant::now() < until,
            "the release never waited for the last row; the log:\n{}",
            relay.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The cycle: granted once InnoDB rolled the release back.
    other
        .execute(format!("SELECT id FROM {t} WHERE id = {first} FOR UPDATE").as_str())
        .await
        .expect("the release, not the test's transaction, is the deadlock's victim");
    let line = warned(&mut relay, "Deadlock found").await;
    eprintln!("MariaDB, deadlocked release at start: {line}");
    assert_eq!(
        line["message"],
        format!("{UNAVAILABLE}; retrying with backoff")
    );
    other.execute("ROLLBACK").await.expect("rollback");
    let _ = other.close().await;

    app.expect_every_event_once("deadlocked start-up release", &seeded)
        .await;
    let released = relay.log_lines("released leases left by an earlier run of this node");
    assert_eq!(released.len(), 1, "{}", relay.log_text());
    assert_eq!(released[0]["released"], EVENTS, "{}", released[0]);
    assert_eq!(at_level(&relay, UNAVAILABLE, "WARN"), 1, "said once");
    assert_eq!(at_level(&relay, AVAILABLE, "INFO"), 1, "said once");
    still_running(&mut relay);
    relay.stop(outbox_tests::within(SHUTDOWN)).await;
    app.database
        .execute(&format!("DROP TABLE {t}_weight"))
        .await;
    app.teardown().await;
}
per_backend!(a_deadlocked_start_up_release_is_retried: mariadb);

/// Mid-run, claims fail for a while — PostgreSQL: the table locked past `lock_timeout`;
/// SQLite: the database's write lock held past the busy timeout; MariaDB: every
/// connection reset and new ones refused — while events are inserted. The relay says so
/// once, says once that it claims again, and delivers every event.
async fn claims_failing_mid_run_are_retried(backend: Backend) {
    let before = room_events("midrunbefore", 40, 4);
    let during = room_events("midrunduring", 40, 4);
    let (proxy, url) = match backend {
        Backend::MySql => {
            let url = outbox_tests::services::database_url(backend);
            let (proxy, url) = FaultProxy::in_front_of(&url).await;
            (Some(proxy), Some(url))
        }
        _ => (None, None),
    };
    let app = TestApp::on(backend)
        .settings(|settings| {
            settings.log.format = "json".into();
            match (&url, backend) {
                (Some(url), _) => settings.database.url = url.clone(),
                (None, Backend::Postgres) => {
                    settings.database.url = with_lock_timeout(&settings.database.url)
                }
                _ => {}
            }
        })
        .seeded(&before)
        .build()
        .await;
    let mut relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    app.broker.wait_for_each(&before, DEADLINE).await;

    let lock = match &proxy {
        Some(proxy) => {
            proxy.go_down();
            outbox_tests::seed(&app.database, &during).await;
            None
        }
        None => Some(hold_the_table(&app, &during).await),
    };
    let line = warned(&mut relay, UNAVAILABLE).await;
    eprintln!("{backend:?}, claims failing mid-run: {line}");
    let error = line["error"].as_str().unwrap_or_default();
    let cause = match backend {
        Backend::Postgres => "lock timeout",
        Backend::Sqlite => "database is locked",
        Backend::MySql => "",
    };
    assert!(error.contains(cause), "{line}");
    match (lock, &proxy) {
        (Some(lock), _) => lock.commit().await.expect("the lock released"),
        (None, Some(proxy)) => proxy.restore(),
        (None, None) => unreachable!("an obstruction"),
    }

    let all: Vec<_> = before.iter().chain(&during).cloned().collect();
    app.expect_every_event_once(&format!("{backend:?}, claims failing mid-run"), &all)
        .await;
    eventually("the return logged", DEADLINE, || {
        std::future::ready(!relay.log_lines(AVAILABLE).is_empty())
    })
    .await;
    assert_eq!(at_level(&relay, UNAVAILABLE, "WARN"), 1, "said once");
    assert_eq!(at_level(&relay, AVAILABLE, "INFO"), 1, "said once");
    still_running(&mut relay);
    relay.stop(outbox_tests::within(SHUTDOWN)).await;
    app.teardown().await;
}
per_backend!(claims_failing_mid_run_are_retried: postgres, mariadb, sqlite);

/// A transient error the database gives, made on demand: a trigger on the outbox table
/// fails every UPDATE (the start-up release, claims, marks) with exactly the error a
/// deadlock, a serialization failure, a lock timeout or a cancelled statement gives, while
/// the test's switch table holds a row.
struct Injected {
    what: &'static str,
    /// PostgreSQL's SQLSTATE.
    sqlstate: &'static str,
    /// MariaDB's error number and SQLSTATE; `None` where it has no such error.
    mariadb: Option<(u16, &'static str)>,
}

const INJECTED: [Injected; 4] = [
    Injected {
        what: "deadlock",
        sqlstate: "40P01",
        mariadb: Some((1213, "40001")),
    },
    Injected {
        what: "serialization failure",
        sqlstate: "40001",
        mariadb: None,
    },
    Injected {
        what: "lock timeout",
        sqlstate: "55P03",
        mariadb: Some((1205, "HY000")),
    },
    Injected {
        what: "statement cancelled",
        sqlstate: "57014",
        mariadb: Some((1317, "70100")),
    },
];

/// The statements that install `injected`'s trigger on `t`, switched by `{t}_fault`.
fn trigger(backend: Backend, t: &str, injected: &Injected) -> Vec<String> {
    let message = format!("injected {}", injected.what);
    match backend {
        Backend::Postgres => vec![
            format!(
                "CREATE OR REPLACE FUNCTION {t}_fail() RETURNS trigger LANGUAGE plpgsql AS $$ \
                 BEGIN IF EXISTS (SELECT 1 FROM {t}_fault) THEN \
                 RAISE EXCEPTION '{message}' USING ERRCODE = '{}'; END IF; RETURN NULL; END $$",
                injected.sqlstate
            ),
            format!("DROP TRIGGER IF EXISTS {t}_fail ON {t}"),
            format!(
                "CREATE TRIGGER {t}_fail BEFORE UPDATE ON {t} \
                 FOR EACH STATEMENT EXECUTE FUNCTION {t}_fail()"
            ),
        ],
        Backend::MySql => {
            let (number, sqlstate) = injected.mariadb.expect("MariaDB has this error");
            vec![
                format!("DROP TRIGGER IF EXISTS {t}_fail"),
                format!(
                    "CREATE TRIGGER {t}_fail BEFORE UPDATE ON {t} FOR EACH ROW \
                     BEGIN IF (SELECT COUNT(*) FROM {t}_fault) > 0 THEN \
                     SIGNAL SQLSTATE '{sqlstate}' \
                     SET MYSQL_ERRNO = {number}, MESSAGE_TEXT = '{message}'; END IF; END"
                ),
            ]
        }
        Backend::Sqlite => unreachable!("SQLite's transient error is its busy timeout"),
    }
}

/// Runs `statements` through a connection of the test's own (the text protocol: MariaDB
/// does not prepare `CREATE TRIGGER`).
async fn run_sql(backend: Backend, statements: &[String]) {
    let url = outbox_tests::services::database_url(backend);
    match backend {
        Backend::Postgres => {
            let mut connection = sqlx::PgConnection::connect(&url).await.expect("connected");
            for sql in statements {
                (connection.execute(sql.as_str()).await).unwrap_or_else(|e| panic!("{sql}: {e}"));
            }
            let _ = connection.close().await;
        }
        _ => {
            let mut connection = sqlx::MySqlConnection::connect(&url)
                .await
                .expect("connected");
            for sql in statements {
                (connection.execute(sql.as_str()).await).unwrap_or_else(|e| panic!("{sql}: {e}"));
            }
            let _ = connection.close().await;
        }
    }
}

/// Each transient error of the backend, at start (the leases an earlier run left are
/// released first, and that release fails) and mid-run (claims and marks fail while events
/// are inserted): `run` never ends, says once that claims fail and once that they work
/// again, and delivers every event once, in room order.
async fn each_transient_error_at_start_and_mid_run_is_retried(backend: Backend) {
    for injected in INJECTED
        .iter()
        .filter(|injected| backend == Backend::Postgres || injected.mariadb.is_some())
    {
        let what = injected.what;
        let slug = what.replace(' ', "");
        let at_start = room_events(&format!("{slug}start"), 20, 4);
        let mid_run = room_events(&format!("{slug}midrun"), 20, 4);
        let app = TestApp::on(backend)
            .settings(|settings| settings.log.format = "json".into())
            .seeded(&at_start)
            .build()
            .await;
        let t = app.database.table.as_str().to_owned();
        let node = app.settings.relay.node_id.clone();
        let now_plus_an_hour = match backend {
            Backend::Postgres => "now() + interval '1 hour'",
            _ => "UTC_TIMESTAMP(6) + INTERVAL 1 HOUR",
        };
        // Leases an earlier, ended run of this node left (as a crash would).
        app.database
            .execute(&format!(
                "UPDATE {{t}} SET locked_by = '{node}', locked_until = {now_plus_an_hour}"
            ))
            .await;
        let mut setup = vec![format!("CREATE TABLE {t}_fault (on_ INT)")];
        setup.extend(trigger(backend, &t, injected));
        setup.push(format!("INSERT INTO {t}_fault VALUES (1)"));
        run_sql(backend, &setup).await;
        let fault_off = [format!("DELETE FROM {t}_fault")];
        let fault_on = [format!("INSERT INTO {t}_fault VALUES (1)")];

        let mut relay = RelayProcess::spawn(crate::RELAY, &app.settings);
        let message = format!("injected {what}");
        let line = warned(&mut relay, &message).await;
        eprintln!("{backend:?}, {what} at start: {line}");
        assert!(
            line["message"]
                .as_str()
                .unwrap_or_default()
                .starts_with(UNAVAILABLE),
            "{line}"
        );
        run_sql(backend, &fault_off).await;
        app.expect_every_event_once(&format!("{backend:?}, {what} at start"), &at_start)
            .await;

        run_sql(backend, &fault_on).await;
        outbox_tests::seed(&app.database, &mid_run).await;
        eventually("claims failing again", DEADLINE, || {
            std::future::ready(relay.log_lines(UNAVAILABLE).len() >= 2)
        })
        .await;
        still_running(&mut relay);
        run_sql(backend, &fault_off).await;
        let all: Vec<_> = at_start.iter().chain(&mid_run).cloned().collect();
        app.expect_every_event_once(&format!("{backend:?}, {what} mid-run"), &all)
            .await;
        eventually("the return logged twice", DEADLINE, || {
            std::future::ready(relay.log_lines(AVAILABLE).len() >= 2)
        })
        .await;
        assert_eq!(
            at_level(&relay, UNAVAILABLE, "WARN"),
            2,
            "said once each time"
        );
        assert_eq!(
            at_level(&relay, AVAILABLE, "INFO"),
            2,
            "said once each time"
        );
        let released = relay.log_lines("released leases left by an earlier run of this node");
        assert_eq!(released.len(), 1, "{}", relay.log_text());
        still_running(&mut relay);
        relay.stop(outbox_tests::within(SHUTDOWN)).await;
        let mut cleanup = vec![format!("DROP TABLE {t}_fault")];
        if backend == Backend::Postgres {
            cleanup.push(format!("DROP TRIGGER {t}_fail ON {t}"));
            cleanup.push(format!("DROP FUNCTION {t}_fail()"));
        }
        run_sql(backend, &cleanup).await;
        app.teardown().await;
    }
}
per_backend!(each_transient_error_at_start_and_mid_run_is_retried: postgres, mariadb);
