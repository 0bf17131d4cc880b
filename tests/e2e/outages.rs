//! Outages are nobody's fault: with `relay.max_attempts` set, a broker that is away for
//! seconds under load costs no event an attempt, turns none dead and breaks no room's
//! order; the relay pauses and says so once, and once again when the broker is back,
//! counting the publishes the outage caught in flight and those that waited for it. Two
//! outages in a row are each said and counted on their own.

use outbox_tests::{
    eventually, per_backend, room_events, seed, Backend, FaultProxy, RelayProcess, TestApp,
};
use std::time::Duration;

/// How long the broker is away in the single outage.
const OUTAGE: Duration = Duration::from_secs(8);

/// How long it is away each time in the repeated one.
const SHORT_OUTAGE: Duration = Duration::from_secs(4);

/// Events inserted by a producer during each outage.
const DURING: usize = 1_000;

async fn a_broker_outage_costs_no_attempt_and_no_order(backend: Backend) {
    outages_under_load(backend, 1, OUTAGE).await;
}

async fn two_broker_outages_in_a_row_cost_no_attempt_and_no_order(backend: Backend) {
    outages_under_load(backend, 2, SHORT_OUTAGE).await;
}

/// Cuts the broker `cuts` times for `outage` each, every time while the relay is
/// publishing a backlog and a producer inserts, then checks what the outages cost.
async fn outages_under_load(backend: Backend, cuts: usize, outage: Duration) {
    const EVENTS: usize = 6_000;
    let before = room_events("out-a", EVENTS, 100);
    let during: Vec<_> = (0..cuts)
        .map(|cut| room_events(&format!("out-b{cut}"), DURING, 100))
        .collect();
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
    // The in-flight window: rows claimed and not yet marked, at most 4 × `batch_size`
    // (docs/design/broker.md, "Broker outages").
    let window = 4 * u64::try_from(app.settings.relay.batch_size).expect("a batch size");

    let mut published_before_cut = 1_000;
    for (cut, inserted) in during.iter().enumerate() {
        // Cut while the relay is busy with the backlog, so publishes are in flight.
        eventually("the relay publishes", Duration::from_secs(60), || async {
            app.broker.received().len() >= published_before_cut
        })
        .await;
        assert!(
            app.database
                .rows()
                .await
                .iter()
                .any(|row| row.status == "pending"),
            "the backlog drained before outage {}: nothing could be in flight",
            cut + 1
        );

        // Every connection cut and new ones refused, as a stopped or restarting broker
        // does, while a producer keeps inserting.
        proxy.go_down();
        let down = std::time::Instant::now();
        seed(&app.database, inserted).await;
        eventually("the relay notices the outage", outage * 4, || async {
            relay.log_lines("broker connection lost").len() > cut
        })
        .await;
        // The outage lasts its length: what is under test is what the relay does after.
        tokio::time::sleep(outage.saturating_sub(down.elapsed())).await;
        proxy.restore();
        eventually(
            "the relay says the broker is back",
            Duration::from_secs(60),
            || async { relay.log_lines("broker connection re-established").len() > cut },
        )
        .await;
        published_before_cut = app.broker.received().len() + 500;
    }

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
    let all: Vec<_> = before
        .iter()
        .chain(during.iter().flatten())
        .cloned()
        .collect();
    let duplicates = app.expect_every_event("outage test", &all).await;

    let lost = relay.log_lines("broker connection lost");
    assert_eq!(
        lost.len(),
        cuts,
        "said once per outage:\n{}",
        relay.log_text()
    );
    for line in &lost {
        assert_eq!(line["level"], "WARN", "{line}");
    }
    let back = relay.log_lines("broker connection re-established");
    assert_eq!(
        back.len(),
        cuts,
        "said once per outage:\n{}",
        relay.log_text()
    );
    for line in &back {
        assert!(line["down_for"].is_string(), "{line}");
        // The producer's rows, and those the cut failed, were claimed while the broker
        // was away: they waited for it.
        let waited = line["waited"].as_u64().unwrap_or_default();
        assert!(waited >= 1, "no publish waited for the broker: {line}");
        // The broker went under load: the publishes handed off then lost their
        // connection, and no more than the window can have been in flight.
        let failed = line["failed"].as_u64().unwrap_or_default();
        assert!(
            (1..=window).contains(&failed),
            "{failed} publishes lost with the connection, outside 1..={window}: {line}"
        );
    }
    let failed_lines = relay.log_lines("publish failed").len();
    assert_eq!(failed_lines, 0, "no line per stuck event");
    // A duplicate is a publish whose confirm was lost with the connection: each outage
    // can duplicate at most the window in flight when it began.
    let bound = window * cuts as u64;
    assert!(
        duplicates as u64 <= bound,
        "{duplicates} duplicates after {cuts} outage(s), over the in-flight bound {bound}"
    );
    println!(
        "outage test: {} events, {duplicates} duplicates, the relay said: {back:?}",
        all.len()
    );
    relay.stop(Duration::from_secs(10)).await;
    app.teardown().await;
}

per_backend!(a_broker_outage_costs_no_attempt_and_no_order: postgres, mariadb, sqlite);
per_backend!(two_broker_outages_in_a_row_cost_no_attempt_and_no_order: postgres);
