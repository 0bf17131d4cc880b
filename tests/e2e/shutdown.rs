//! SIGTERM on the real binary (`docs/design.md#shutdown`).

use outbox_tests::{room_events, Backend, RelayProcess, TestApp};
use std::collections::HashSet;
use std::time::{Duration, Instant};

#[actix_rt::test]
async fn sigterm_mid_run_exits_cleanly_and_a_second_run_delivers_the_rest() {
    const EVENTS: usize = 20_000;
    let seeded = room_events("sig", EVENTS, 200);
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.relay.publish_timeout = "3s".into();
            settings.log.level = "info".into();
        })
        .seeded(&seeded)
        .build()
        .await;
    let (database, broker) = (&app.database, &app.broker);

    let mut first = RelayProcess::spawn(crate::RELAY, &app.settings);
    broker.wait_for(2_000, Duration::from_secs(60)).await;
    first.signal("TERM");
    let signalled = Instant::now();
    // Exit 0 within publish_timeout (3 s) + 2 s (and the machine's margin).
    let status = first
        .wait(outbox_tests::within(Duration::from_secs(5)))
        .await;
    let took = signalled.elapsed();
    outbox_tests::assert_within("SIGTERM mid-run", took, Duration::from_secs(5));
    assert!(
        status.success(),
        "exit status {status:?}; log:\n{}",
        first.log_text()
    );

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
    // Every row marked published was confirmed, so the broker holds its event; the
    // test's consumer may still be receiving the last of them.
    let marked: Vec<&str> = rows
        .iter()
        .filter(|row| row.status == "published")
        .map(|row| row.event_id.as_str())
        .collect();
    outbox_tests::eventually(
        "every event marked published to reach the consumer",
        Duration::from_secs(10),
        || {
            let received: HashSet<String> = broker
                .received()
                .into_iter()
                .map(|r| r.message_id)
                .collect();
            let all = marked.iter().all(|id| received.contains(*id));
            async move { all }
        },
    )
    .await;

    let second = RelayProcess::spawn(crate::RELAY, &app.settings);
    database.wait_all_published(Duration::from_secs(120)).await;
    second
        .stop(outbox_tests::within(Duration::from_secs(5)))
        .await;

    broker.wait_for_each(&seeded, Duration::from_secs(30)).await;
    let deliveries = broker.drain(Duration::from_secs(30)).await;
    let duplicates = outbox_tests::assert_every_event_delivered(&deliveries, &seeded);
    println!(
        "sigterm test: {published} published before SIGTERM (in {took:?}), {} deliveries for {EVENTS} events, {duplicates} duplicates",
        deliveries.len()
    );
    // The README: "A graceful shutdown produces none."
    assert_eq!(duplicates, 0, "a graceful shutdown produces no duplicates");
    let _ = std::fs::remove_file(&first.log);
    app.teardown().await;
}
