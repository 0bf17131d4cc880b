//! The metrics and health endpoint (`metrics.listen`) of the real binary, and the store's
//! backlog query behind its gauges.

use outbox_core::OutboxStore;
use outbox_tests::{
    event, eventually, http_get as get, room_events, seed, Backend, FaultProxy, RelayProcess,
    TestApp, TestDatabase,
};
use std::cell::RefCell;
use std::collections::HashSet;
use std::time::Duration;

/// The sum of every sample of `name` (all label sets) in Prometheus text, or `None` when
/// there is none.
fn total(text: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let metric = series.split('{').next()?;
            (metric == name).then(|| value.parse::<f64>().ok())?
        })
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// The value of the one sample of `name` whose labels include `label` (`key="value"`), or
/// `None` when there is none.
fn sample(text: &str, name: &str, label: &str) -> Option<f64> {
    let mut values = text
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, labels) = series.split_once('{')?;
            let labels = labels.strip_suffix('}')?;
            (metric == name && labels.split(',').any(|pair| pair == label))
                .then(|| value.parse::<f64>().ok())?
        });
    let value = values.next();
    assert!(
        values.next().is_none(),
        "{name}{{{label}}}: one sample:\n{text}"
    );
    value
}

/// The TCP ports on which process `pid` listens (IPv4 and IPv6): its socket inodes,
/// matched against the kernel's tables of listening sockets (state 0A).
pub(crate) fn listening_ports(pid: u32) -> Vec<u16> {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the relay's file descriptors")
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_owned(),
            )
        })
        .collect();
    let mut ports = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(&"0A"), Some(inode)) =
                (fields.get(1), fields.get(3), fields.get(9))
            else {
                continue;
            };
            if inodes.contains(*inode) {
                let port = local
                    .rsplit(':')
                    .next()
                    .and_then(|hex| u16::from_str_radix(hex, 16).ok());
                ports.extend(port);
            }
        }
    }
    ports
}

#[actix_rt::test]
async fn metrics_after_a_1000_event_run_count_every_publish_and_time_the_confirms() {
    const EVENTS: usize = 1_000;
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            // Port 0: the system picks a free one, which the relay logs.
            settings.metrics.listen = "127.0.0.1:0".into();
            settings.log.format = "json".into();
        })
        .seeded(&room_events("metrics", EVENTS, 50))
        .build()
        .await;
    let database = &app.database;
    let node = app.settings.relay.node_id.clone();
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    let address = relay.metrics_address().await;
    assert_eq!(
        listening_ports(relay.pid()),
        vec![address.port()],
        "the relay listens on the logged address, and nowhere else"
    );
    assert_eq!(get(address, "/healthz").await.0, 200);

    database.wait_all_published(Duration::from_secs(120)).await;
    // The counter moves when the Marker's commit is logged, a moment after the rows change.
    let scraped = RefCell::new(String::new());
    eventually(
        "the published counter to reach 1,000",
        Duration::from_secs(30),
        || async {
            let text = get(address, "/metrics").await.1;
            let done =
                total(&text, "outbox_events_published_total").unwrap_or(0.0) >= EVENTS as f64;
            *scraped.borrow_mut() = text;
            done
        },
    )
    .await;
    let text = scraped.into_inner();
    assert_eq!(
        total(&text, "outbox_events_published_total"),
        Some(EVENTS as f64),
        "one count per committed publish:\n{text}"
    );
    for histogram in [
        "outbox_publish_confirm_seconds",
        "outbox_commit_to_confirm_seconds",
    ] {
        assert_eq!(
            total(&text, &format!("{histogram}_count")),
            Some(EVENTS as f64),
            "{histogram}: one sample per ack:\n{text}"
        );
        assert!(
            total(&text, &format!("{histogram}_sum")).is_some_and(|sum| sum > 0.0),
            "{histogram}: latencies recorded:\n{text}"
        );
    }
    assert!(
        total(&text, "outbox_claim_batch_size_count").is_some_and(|claims| claims > 0.0),
        "claims recorded:\n{text}"
    );
    assert!(
        total(&text, "outbox_mark_batch_size_sum").is_some_and(|rows| rows >= EVENTS as f64),
        "every outcome went through a recorded flush:\n{text}"
    );
    assert_eq!(
        total(&text, "outbox_events_dead_total"),
        Some(0.0),
        "registered at start, so it reads 0 rather than being absent"
    );
    for reason in outbox_core::PublishError::REASONS {
        assert_eq!(
            sample(&text, "outbox_events_failed_total", &format!("reason=\"{reason}\"")),
            Some(0.0),
            "outbox_events_failed_total{{reason=\"{reason}\"}} present from the start at 0:\n{text}"
        );
    }
    // Each relay metric also names its outbox (the table, without [[outboxes]]).
    assert!(
        text.contains(&format!(
            "outbox_events_published_total{{node_id=\"{node}\",outbox=\"{}\"}}",
            app.database.table
        )),
        "labelled with the node and the outbox:\n{text}"
    );
    eventually(
        "the pending gauge to show the drained table",
        Duration::from_secs(30),
        || async {
            let text = get(address, "/metrics").await.1;
            total(&text, "outbox_pending_events") == Some(0.0)
                && total(&text, "outbox_oldest_pending_age_seconds") == Some(0.0)
        },
    )
    .await;

    // The process's own series, for alerts that need no external probe.
    let text = get(address, "/metrics").await.1;
    assert_eq!(
        sample(
            &text,
            "outbox_relay_build_info",
            &format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))
        ),
        Some(1.0),
        "the build's version:\n{text}"
    );
    for dependency in ["database", "broker"] {
        assert_eq!(
            sample(&text, "outbox_up", &format!("dependency=\"{dependency}\"")),
            Some(1.0),
            "{dependency} up while relaying:\n{text}"
        );
    }
    // The database server of the failover counter: `host:port`, no URL, no user; and no
    // URL anywhere in the text (the docs: the endpoint serves none).
    let database_url = url::Url::parse(&app.database.url).expect("the test's database URL");
    let server = format!(
        "server=\"{}:{}\"",
        database_url.host_str().expect("a host"),
        database_url.port().unwrap_or(5432)
    );
    assert_eq!(
        sample(&text, "outbox_database_failovers_total", &server),
        Some(0.0),
        "outbox_database_failovers_total{{{server}}} present from the start at 0:\n{text}"
    );
    assert!(!text.contains("://"), "no URL on /metrics:\n{text}");
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    let start_time = total(&text, "process_start_time_seconds");
    assert!(
        start_time.is_some_and(|at| at <= started && at > started - 600.0),
        "started during this test, in seconds since the epoch:\n{text}"
    );
    for (series, at_least) in [
        ("process_resident_memory_bytes", 1_000_000.0),
        // The listener, the database pool, the broker connection at least.
        ("process_open_fds", 3.0),
        // Present (the check is the `Some`): it counts whole seconds (the docs), and a
        // 1,000-event run may take less than one, so no value above 0 can be promised.
        ("process_cpu_seconds_total", 0.0),
        ("process_threads", 2.0),
    ] {
        assert!(
            total(&text, series).is_some_and(|value| value >= at_least),
            "{series} at least {at_least}:\n{text}"
        );
    }

    // A failed attempt counts by its reason: a header AMQP cannot carry is `invalid`, and
    // makes the row dead at once.
    let mut invalid = outbox_tests::event("invalid-header", "metrics-dead");
    invalid.headers = Some(r#"{"big":18446744073709551615}"#.into());
    outbox_tests::seed(database, std::slice::from_ref(&invalid)).await;
    eventually(
        "outbox_events_failed_total{reason=\"invalid\"} and the dead counter at 1",
        Duration::from_secs(30),
        || async {
            let text = get(address, "/metrics").await.1;
            sample(&text, "outbox_events_failed_total", "reason=\"invalid\"") == Some(1.0)
                && total(&text, "outbox_events_dead_total") == Some(1.0)
        },
    )
    .await;
    let text = get(address, "/metrics").await.1;
    assert_eq!(
        total(&text, "outbox_events_failed_total"),
        Some(1.0),
        "no other failure counted:\n{text}"
    );

    // Serving metrics does not slow the shutdown down (publish_timeout + 2 s).
    relay
        .stop(outbox_tests::within(Duration::from_secs(5)))
        .await;
    app.teardown().await;
}

/// Which link a readiness test cuts.
#[derive(Debug, Clone, Copy)]
enum Link {
    Broker,
    Database,
}

/// Runs the binary with `link` through a fault proxy, cuts the link and restores it:
/// `/readyz` must follow, naming that side only, while `/healthz` stays 200; and so must
/// `outbox_up{dependency}`, for alerts without a probe of `/readyz`.
async fn readyz_follows(link: Link) {
    let (target, problem, cut, kept) = match link {
        Link::Broker => (
            outbox_tests::services::amqp_url(),
            "not ready: broker unreachable\n",
            "dependency=\"broker\"",
            "dependency=\"database\"",
        ),
        Link::Database => (
            outbox_tests::services::database_url(Backend::Postgres),
            "not ready: database unreachable\n",
            "dependency=\"database\"",
            "dependency=\"broker\"",
        ),
    };

    let proxy = FaultProxy::start(outbox_tests::server_of(&target)).await;
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            match link {
                Link::Broker => settings.amqp.url = outbox_tests::through(proxy.addr, &target),
                Link::Database => {
                    settings.database.url = outbox_tests::through(proxy.addr, &target)
                }
            }
            settings.metrics.listen = "127.0.0.1:0".into();
            settings.log.format = "json".into();
        })
        .build()
        .await;
    let database = &app.database;
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    let address = relay.metrics_address().await;
    let up = |label: &'static str| async move {
        sample(&get(address, "/metrics").await.1, "outbox_up", label)
    };
    eventually("ready after start", Duration::from_secs(30), || async {
        get(address, "/readyz").await == (200, "ready\n".into())
    })
    .await;
    assert_eq!(up(cut).await, Some(1.0), "ready: {cut} up");
    assert_eq!(up(kept).await, Some(1.0), "ready: {kept} up");

    proxy.go_down();
    let answer = RefCell::new((0, String::new()));
    eventually(
        &format!("/readyz to answer 503 with the {link:?} link cut"),
        Duration::from_secs(15),
        || async {
            let got = get(address, "/readyz").await;
            let done = got.0 == 503;
            *answer.borrow_mut() = got;
            done
        },
    )
    .await;
    assert_eq!(
        answer.into_inner().1,
        problem,
        "names the {link:?}, and only the {link:?}"
    );
    assert_eq!(
        get(address, "/healthz").await.0,
        200,
        "alive all the same: nothing to restart"
    );
    // The same flag: 0 as soon as /readyz says so, the other side still 1.
    assert_eq!(up(cut).await, Some(0.0), "{cut} down with the link cut");
    assert_eq!(up(kept).await, Some(1.0), "{kept} untouched by the cut");

    proxy.restore();
    eventually(
        &format!("ready again once the {link:?} is back"),
        Duration::from_secs(30),
        || async { get(address, "/readyz").await == (200, "ready\n".into()) },
    )
    .await;
    assert_eq!(up(cut).await, Some(1.0), "{cut} up again");
    // Ready means usable: events inserted now are delivered.
    seed(database, &room_events("ready", 20, 4)).await;
    database.wait_all_published(Duration::from_secs(60)).await;

    relay.stop(Duration::from_secs(5)).await;
    app.teardown().await;
}

#[actix_rt::test]
async fn readyz_turns_unready_when_the_broker_link_is_cut_and_ready_again_after() {
    readyz_follows(Link::Broker).await;
}

#[actix_rt::test]
async fn readyz_turns_unready_when_the_database_link_is_cut_and_ready_again_after() {
    readyz_follows(Link::Database).await;
}

#[actix_rt::test]
async fn an_empty_metrics_listen_serves_nothing() {
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.metrics.listen = "".into();
            settings.log.format = "json".into();
        })
        .build()
        .await;
    let database = &app.database;
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    seed(database, &room_events("nolisten", 10, 2)).await;
    // Relaying proves the process is fully up, past the point where it would listen.
    database.wait_all_published(Duration::from_secs(60)).await;
    assert_eq!(
        listening_ports(relay.pid()),
        Vec::<u16>::new(),
        "no listening socket at all"
    );
    assert!(
        relay.listening_line().is_none(),
        "no endpoint announced:\n{}",
        relay.log_text()
    );
    relay.stop(Duration::from_secs(5)).await;
    app.teardown().await;
}

/// `outbox_dead_events` shows the dead rows in the table (the alert on dead events left
/// over reads it), counted at start and then once a minute.
#[actix_rt::test]
async fn the_dead_gauge_counts_the_dead_rows_in_the_table() {
    let events = room_events("deadgauge", 5, 1);
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.metrics.listen = "127.0.0.1:0".into();
            settings.log.format = "json".into();
        })
        .seeded(&events)
        .build()
        .await;
    app.database
        .execute("UPDATE {t} SET status = 'dead' WHERE event_id <= 'deadgauge-000001'")
        .await;
    let label = format!("outbox=\"{}\"", app.database.table);
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    let address = relay.metrics_address().await;
    eventually(
        "outbox_dead_events at the table's 2 dead rows",
        Duration::from_secs(30),
        || async {
            sample(
                &get(address, "/metrics").await.1,
                "outbox_dead_events",
                &label,
            ) == Some(2.0)
        },
    )
    .await;
    relay.stop(Duration::from_secs(10)).await;
    app.teardown().await;
}

#[actix_rt::test]
async fn the_backlog_counts_pending_rows_only_on_every_backend() {
    for backend in [Backend::Postgres, Backend::Sqlite, Backend::MySql] {
        let database = TestDatabase::new(backend).await;
        let empty = database.store.backlog().await.expect("backlog readable");
        assert_eq!(empty.pending, 0, "{backend:?}");
        assert_eq!(empty.oldest_pending_age_seconds, None, "{backend:?}");

        seed(&database, &room_events("backlog", 10, 2)).await;
        database
            .execute(&format!(
                "UPDATE {} SET status = 'published' WHERE event_id <= 'backlog-000003'",
                database.table
            ))
            .await;
        database
            .execute(&format!(
                "UPDATE {} SET status = 'dead' WHERE event_id = 'backlog-000009'",
                database.table
            ))
            .await;
        let backlog = database.store.backlog().await.expect("backlog readable");
        let stats = database.store.stats().await.expect("stats readable");
        assert_eq!(backlog.pending, 5, "{backend:?}: 10 - 4 published - 1 dead");
        assert_eq!(backlog.pending, stats.pending, "{backend:?}");
        let dead = database
            .store
            .dead_count()
            .await
            .expect("dead rows counted");
        assert_eq!(dead, 1, "{backend:?}: the dead gauge's count");
        let (Some(age), Some(expected)) = (
            backlog.oldest_pending_age_seconds,
            stats.oldest_pending_age_seconds,
        ) else {
            panic!("{backend:?}: no oldest age in {backlog:?} or {stats:?}");
        };
        assert!(
            (age - expected).abs() < 2.0,
            "{backend:?}: {age} vs {expected}"
        );
        database.drop_table().await;
    }
}

/// Log lines (JSON) whose message is `message`.
fn lines_saying(log: &str, message: &str) -> Vec<serde_json::Value> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| line["message"] == message)
        .collect()
}

/// With `relay.max_pending_age = "3s"`: a delayed event (`available_at` an hour ahead)
/// ages past the bound, which the relay logs once, shows in
/// `outbox_max_pending_age_exceeded` and, when `readiness` counts it
/// (`relay.max_pending_age_readiness`), in `/readyz`; once the event is released and
/// published, all of that ends.
async fn max_pending_age_follows_the_oldest_row(readiness: bool) {
    const BREACH: &str = "the oldest pending event is older than relay.max_pending_age";
    const BACK: &str = "every pending event is within relay.max_pending_age again";
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.relay.max_pending_age = "3s".into();
            settings.relay.max_pending_age_readiness = readiness;
            settings.metrics.listen = "127.0.0.1:0".into();
            settings.log.format = "json".into();
        })
        .build()
        .await;
    let database = &app.database;
    let outbox = database.table.to_string();
    let exceeded_label = format!("outbox=\"{outbox}\"");
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    let address = relay.metrics_address().await;
    let exceeded = || async {
        sample(
            &get(address, "/metrics").await.1,
            "outbox_max_pending_age_exceeded",
            &exceeded_label,
        )
    };
    eventually(
        "ready, within the bound, on an empty table",
        Duration::from_secs(30),
        || async {
            get(address, "/readyz").await == (200, "ready\n".into())
                && exceeded().await == Some(0.0)
        },
    )
    .await;

    let delayed =
        event("late-1", "late-room").available_at(chrono::Utc::now() + chrono::Duration::hours(1));
    seed(database, &[delayed]).await;
    // Sampled every 5 s: past 3 s, then at most one sample later.
    eventually(
        "the breach in the gauge",
        Duration::from_secs(20),
        || async { exceeded().await == Some(1.0) },
    )
    .await;
    let late = (
        503,
        format!("not ready: backlog older than 3s ({outbox})\n"),
    );
    if readiness {
        assert_eq!(
            get(address, "/readyz").await,
            late,
            "the breach makes it unready"
        );
    } else {
        assert_eq!(
            get(address, "/readyz").await,
            (200, "ready\n".into()),
            "max_pending_age_readiness = false keeps readiness out of it"
        );
    }
    // One more sample while late (the age gauge moves 5 s on): the breach is logged once.
    eventually(
        "a second look at the late row",
        Duration::from_secs(20),
        || async {
            total(
                &get(address, "/metrics").await.1,
                "outbox_oldest_pending_age_seconds",
            )
            .is_some_and(|age| age > 8.0)
        },
    )
    .await;
    let log = relay.log_text();
    let breaches = lines_saying(&log, BREACH);
    assert_eq!(breaches.len(), 1, "logged once:\n{log}");
    assert_eq!(breaches[0]["outbox"], outbox.as_str(), "{log}");
    assert_eq!(breaches[0]["max_pending_age"], "3s", "{log}");
    assert_eq!(breaches[0]["level"], "WARN", "{log}");
    if readiness {
        assert_eq!(get(address, "/readyz").await, late, "still unready");
    }

    // Released and published: the oldest pending row is gone.
    database
        .execute(&format!(
            "UPDATE {} SET available_at = now() WHERE event_id = 'late-1'",
            database.table
        ))
        .await;
    database.wait_all_published(Duration::from_secs(30)).await;
    eventually(
        "ready and within the bound once published",
        Duration::from_secs(20),
        || async {
            get(address, "/readyz").await == (200, "ready\n".into())
                && exceeded().await == Some(0.0)
        },
    )
    .await;
    let log = relay.log_text();
    assert_eq!(
        lines_saying(&log, BACK).len(),
        1,
        "the end logged once:\n{log}"
    );
    assert_eq!(lines_saying(&log, BREACH).len(), 1, "{log}");

    relay.stop(Duration::from_secs(5)).await;
    app.teardown().await;
}

#[actix_rt::test]
async fn max_pending_age_makes_readyz_unready_while_the_oldest_row_is_older() {
    max_pending_age_follows_the_oldest_row(true).await;
}

#[actix_rt::test]
async fn max_pending_age_readiness_off_shows_the_breach_but_stays_ready() {
    max_pending_age_follows_the_oldest_row(false).await;
}

/// A `metrics.listen` another process holds is a settings error (exit code 2, naming the
/// address and the setting), not a runtime failure a supervisor would restart forever.
#[actix_rt::test]
async fn a_metrics_port_in_use_is_exit_code_2() {
    let app = TestApp::on(Backend::Sqlite).build().await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let address = taken.local_addr().expect("its address");
    let mut settings = app.settings.clone();
    settings.metrics.listen = address.to_string().into();
    let mut relay = RelayProcess::spawn(crate::RELAY, &settings);
    let status = relay.wait(Duration::from_secs(30)).await;
    let log = relay.log_text();
    assert_eq!(status.code(), Some(2), "{log}");
    let error = log
        .lines()
        .find(|line| line.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line:\n{log}"));
    assert!(
        error.contains(&format!("metrics.listen = \"{address}\"")) && error.contains("in use"),
        "{error}"
    );
    drop(taken);
    app.teardown().await;
}
