//! Riding through faults, injected by a TCP proxy between the relay and a service.

use outbox_tests::{
    event, eventually, room_events, Backend, FaultProxy, RelayProcess, TestApp, TestEvent,
};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Once `delivered` events arrived, takes `proxy`'s service away for `outage`.
async fn outage_after(app: &TestApp, delivered: usize, proxy: &FaultProxy, outage: Duration) {
    app.broker
        .wait_for(delivered, Duration::from_secs(120))
        .await;
    proxy.go_down();
    // The outage itself: the relay is without that service meanwhile.
    tokio::time::sleep(outage).await;
    proxy.restore();
}

#[actix_rt::test]
async fn broker_link_cut_three_times_loses_nothing_and_recovers_by_itself() {
    const EVENTS: usize = 20_000;
    let proxy = FaultProxy::start(local(5672)).await;
    let seeded = room_events("bcut", EVENTS, 200);
    let mut app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.amqp.url = format!("amqp://guest:guest@{}/%2f", proxy.addr);
            settings.relay.retry_interval = "200ms".into();
            settings.relay.publish_timeout = "2s".into();
        })
        .seeded(&seeded)
        .spawn()
        .await;

    for cut in 1..=3 {
        outage_after(&app, cut * EVENTS / 5, &proxy, Duration::from_secs(2)).await;
    }
    app.database
        .wait_all_published(Duration::from_secs(180))
        .await;
    app.stop().await;
    assert!(
        proxy.accepted() >= 4,
        "reconnected after each cut ({} connections)",
        proxy.accepted()
    );

    app.expect_every_event("broker cut test", &seeded).await;
    app.teardown().await;
}

#[actix_rt::test]
async fn database_link_cut_for_3s_loses_nothing() {
    const EVENTS: usize = 20_000;
    let proxy = FaultProxy::start(local(5432)).await;
    let seeded = room_events("dbcut", EVENTS, 200);
    let mut app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.database.url = format!("postgres://postgres@{}/test", proxy.addr);
        })
        .seeded(&seeded)
        .spawn()
        .await;

    outage_after(&app, EVENTS / 4, &proxy, Duration::from_secs(3)).await;
    app.database
        .wait_all_published(Duration::from_secs(180))
        .await;
    app.stop().await;

    let duplicates = app.expect_every_event("database cut test", &seeded).await;
    assert_eq!(
        duplicates, 0,
        "leases outlived the outage: nothing published twice"
    );
    app.teardown().await;
}

#[actix_rt::test]
async fn a_stalled_broker_fails_publishes_on_time_and_sigterm_still_exits() {
    let proxy = FaultProxy::start(local(5672)).await;
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.amqp.url = format!("amqp://guest:guest@{}/%2f", proxy.addr);
            settings.relay.publish_timeout = "1s".into();
            settings.relay.retry_interval = "200ms".into();
        })
        .seeded(&room_events("stall", 100, 10))
        .build()
        .await;
    let mut relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    app.broker.wait_for(100, Duration::from_secs(60)).await;

    proxy.stall();
    outbox_tests::seed(&app.database, &room_events("stalled", 20, 5)).await;
    eventually(
        "publishes to fail with a timeout",
        Duration::from_secs(30),
        || async {
            app.database.rows().await.iter().any(|row| {
                row.retry_count > 0
                    && row
                        .last_error
                        .as_deref()
                        .is_some_and(|error| error.contains("no confirm from the broker within 1s"))
            })
        },
    )
    .await;

    relay.signal("TERM");
    let signalled = Instant::now();
    // The shutdown deadline: publish_timeout (1 s) + 2 s; `wait` fails the test after it.
    let status = relay.wait(Duration::from_secs(3)).await;
    assert!(
        status.success(),
        "exit {status:?} after {:?}; log:\n{}",
        signalled.elapsed(),
        relay.log_text()
    );
    proxy.restore();
    for row in app.database.rows().await {
        assert!(row.locked_by.is_none(), "{} still locked", row.event_id);
    }
    app.teardown().await;
}

#[actix_rt::test]
async fn a_channel_error_recreates_that_channel_and_the_rest_flows() {
    let missing = outbox_tests::unique_name("e2e.missing");
    let mut events = vec![event("ghost", "g").of_type("ghost.created")];
    events.extend(room_events("after", 50, 5));
    let mut app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.amqp.declare_exchange = false;
            settings.amqp.routes = vec![outbox_cli::settings::RouteSettings {
                event_type: "ghost.*".into(),
                exchange: missing.clone(),
                routing_key: None,
                ..Default::default()
            }];
            settings.relay.publishers = 1;
            settings.relay.retry_interval = "100ms".into();
        })
        .seeded(&events)
        .spawn()
        .await;

    app.broker.wait_for(50, Duration::from_secs(30)).await;
    eventually(
        "the ghost event to fail twice",
        Duration::from_secs(30),
        || async { app.database.row("ghost").await.retry_count >= 2 },
    )
    .await;
    app.stop().await;
    let ghost = app.database.row("ghost").await;
    assert_eq!(ghost.status, "pending");
    let error = ghost.last_error.unwrap_or_default();
    assert!(
        error.contains("NOT_FOUND") || error.contains("no exchange"),
        "{error}"
    );
    app.teardown().await;
}
