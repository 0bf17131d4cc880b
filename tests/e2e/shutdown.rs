//! SIGTERM on the real binary (DESIGN §7).

use outbox_tests::{
    eventually, room_events, seed, settings_env, test_settings, Backend, TestBroker, TestDatabase,
};
use std::collections::HashSet;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

fn spawn_relay(settings: &outbox_cli::settings::Settings, log: &std::path::Path) -> Child {
    Command::new(crate::RELAY)
        .args(["--config", "/dev/null", "run"])
        .envs(settings_env(settings))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log file"))
        .spawn()
        .expect("relay starts")
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
}

async fn wait_exit(child: &mut Child, deadline: Duration, log: &std::path::Path) -> ExitStatus {
    let until = Instant::now() + deadline;
    loop {
        if let Some(status) = child.try_wait().expect("child status") {
            return status;
        }
        if Instant::now() > until {
            let _ = child.kill();
            panic!(
                "relay did not exit within {deadline:?}; its log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[actix_rt::test]
async fn sigterm_mid_run_exits_cleanly_and_a_second_run_delivers_the_rest() {
    const EVENTS: usize = 20_000;
    let database = TestDatabase::new(Backend::Postgres).await;
    let broker = TestBroker::new("#").await;
    let settings = test_settings(&database, &broker, |settings| {
        settings.relay.publish_timeout = "3s".into();
        settings.log.level = "info".into();
    });
    let seeded = room_events("sig", EVENTS, 200);
    seed(&database, &seeded).await;
    let log = std::env::temp_dir().join(format!("{}.log", database.table));

    let mut first = spawn_relay(&settings, &log);
    broker.wait_for(2_000, Duration::from_secs(60)).await;
    signal(&first, "TERM");
    let signalled = Instant::now();
    // DESIGN §7: exit 0 within publish_timeout + 2 s.
    let status = wait_exit(&mut first, Duration::from_secs(5), &log).await;
    let took = signalled.elapsed();
    assert!(
        status.success(),
        "exit status {status:?}; log:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(took <= Duration::from_secs(5), "shutdown took {took:?}");

    let rows = database.rows().await;
    let published = rows.iter().filter(|row| row.status == "published").count();
    for row in &rows {
        assert!(
            row.locked_by.is_none(),
            "{} still locked by {:?}",
            row.event_id,
            row.locked_by
        );
        assert!(
            row.status == "published" || row.status == "pending",
            "{}: {}",
            row.event_id,
            row.status
        );
    }
    assert!(
        published < EVENTS,
        "the run was cut short ({published} published)"
    );
    let received: HashSet<String> = broker
        .received()
        .into_iter()
        .map(|r| r.message_id)
        .collect();
    for row in rows.iter().filter(|row| row.status == "published") {
        assert!(
            received.contains(&row.event_id),
            "{} marked published but never arrived",
            row.event_id
        );
    }

    let mut second = spawn_relay(&settings, &log);
    eventually(
        "every row published by the second run",
        Duration::from_secs(120),
        || async {
            database
                .rows()
                .await
                .iter()
                .all(|row| row.status == "published")
        },
    )
    .await;
    signal(&second, "TERM");
    let status = wait_exit(&mut second, Duration::from_secs(5), &log).await;
    assert!(status.success(), "second run exit status {status:?}");

    let deliveries = broker.wait_for(EVENTS, Duration::from_secs(30)).await;
    let distinct: HashSet<&str> = deliveries.iter().map(|r| r.message_id.as_str()).collect();
    for event in &seeded {
        assert!(
            distinct.contains(event.event_id.as_str()),
            "{} lost",
            event.event_id
        );
    }
    println!(
        "sigterm test: {published} published before SIGTERM (in {took:?}), {} deliveries for {EVENTS} events, {} duplicates",
        deliveries.len(),
        deliveries.len() - distinct.len()
    );
    let _ = std::fs::remove_file(&log);
    broker.close().await;
    database.drop_table().await;
}
