//! Outages are nobody's fault: with `relay.max_attempts` set, a broker that is away for
//! seconds under load costs no event an attempt, turns none dead and breaks no room's
//! order; the relay pauses and says so once, and once again when the broker is back.

use outbox_tests::{
    eventually, per_backend, room_events, seed, Backend, FaultProxy, RelayProcess, TestApp,
};
use std::time::Duration;

/// How long the broker is away.
const OUTAGE: Duration = Duration::from_secs(8);

async fn a_broker_outage_costs_no_attempt_and_no_order(backend: Backend) {
    const EVENTS: usize = 6_000;
    let before = room_events("out-a", EVENTS, 100);
    let during = room_events("out-b", 1_000, 100);
    let app = TestApp::on(backend).seeded(&before).build().await;
    let (proxy, amqp) = FaultProxy::in_front_of(&app.broker.url).await;
    let relay = RelayProcess::spawn(
        crate::RELAY,
        &app.settings_with(|settings| {
            settings.amqp.url = amqp;
            settings.relay.max_attempts = 3;
            settings.relay.retry_interval = "100ms".into();
            settings.log.format = "json".into();
        }),
    );
    eventually("the relay publishes", Duration::from_secs(60), || async {
        app.broker.received().len() >= 1_000
    })
    .await;

    // Every connection cut and new ones refused, as a stopped or restarting broker does,
    // while a producer keeps inserting.
    proxy.go_down();
    let down = std::time::Instant::now();
    seed(&app.database, &during).await;
    let rest = OUTAGE.saturating_sub(down.elapsed());
    tokio::time::sleep(rest).await; // the outage itself: what is under test is after it
    proxy.restore();

    app.database
        .wait_all_published(Duration::from_secs(180))
        .await;
    let rows = app.database.rows().await;
    let dead: Vec<_> = rows.iter().filter(|row| row.status == "dead").collect();
    assert!(
        dead.is_empty(),
        "{} dead, e.g. {:?}",
        dead.len(),
        dead.first()
    );
    let counted: Vec<_> = rows.iter().filter(|row| row.retry_count > 0).collect();
    assert!(
        counted.is_empty(),
        "{} rows lost an attempt to the outage, e.g. {:?}",
        counted.len(),
        counted.first()
    );
    let all: Vec<_> = before.iter().chain(&during).cloned().collect();
    let duplicates = app.expect_every_event("outage test", &all).await;

    let lost = relay.log_lines("broker connection lost");
    assert_eq!(lost.len(), 1, "said once:\n{}", relay.log_text());
    assert_eq!(lost[0]["level"], "WARN", "{}", lost[0]);
    let back = relay.log_lines("broker connection re-established");
    assert_eq!(back.len(), 1, "said once:\n{}", relay.log_text());
    assert!(back[0]["down_for"].is_string(), "{}", back[0]);
    assert!(back[0]["waited"].is_u64(), "{}", back[0]);
    let failed_lines = relay.log_lines("publish failed").len();
    assert_eq!(failed_lines, 0, "no line per stuck event");
    println!(
        "outage test: {} events, {duplicates} duplicates, the relay said: {}",
        all.len(),
        back[0]
    );
    relay.stop(Duration::from_secs(10)).await;
    app.teardown().await;
}

per_backend!(a_broker_outage_costs_no_attempt_and_no_order: postgres, mariadb, sqlite);
