//! `amqp.url` as a list: the nodes of a RabbitMQ cluster, each stood for here by a TCP
//! proxy in front of the one test broker.

use outbox_tests::{room_events, seed, Backend, FaultProxy, RelayProcess, TestApp};
use std::net::SocketAddr;
use std::time::Duration;

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// The JSON log lines of `relay` whose message starts with `message`: their `url` fields.
fn urls_logged(relay: &RelayProcess, message: &str) -> Vec<String> {
    relay
        .log_lines(message)
        .iter()
        .filter_map(|line| line["url"].as_str().map(str::to_owned))
        .collect()
}

#[actix_rt::test]
async fn with_two_brokers_the_relay_starts_on_the_one_that_answers_and_fails_over() {
    const EVENTS: usize = 2_000;
    let first = FaultProxy::start(local(5672)).await;
    let second = FaultProxy::start(local(5672)).await;
    first.go_down();
    let events = room_events("cluster", EVENTS, 50);
    let (before, after) = events.split_at(EVENTS / 2);
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            // As the environment gives a list: comma-separated.
            settings.amqp.url = format!(
                "amqp://guest:guest@{}/%2f, amqp://guest:guest@{}/%2f",
                first.addr, second.addr
            );
            settings.relay.retry_interval = "200ms".into();
            settings.relay.publish_timeout = "2s".into();
            settings.log.format = "json".into();
        })
        .seeded(before)
        .build()
        .await;
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);

    // The first refuses: the relay starts on the second and delivers through it.
    app.database
        .wait_all_published(Duration::from_secs(60))
        .await;
    assert_eq!(first.accepted(), 0, "the first refuses");
    assert!(second.accepted() >= 1, "delivered through the second");
    let connected = urls_logged(&relay, "connected to RabbitMQ");
    assert_eq!(connected.len(), 1, "{}", relay.log_text());
    assert!(
        connected[0].contains(&second.addr.to_string()),
        "logs the broker it connected to: {connected:?}"
    );
    assert!(
        !connected[0].contains("guest:guest"),
        "masked: {connected:?}"
    );

    // The second goes away for good while the first accepts again.
    first.restore();
    second.go_down();
    seed(&app.database, after).await;
    app.database
        .wait_all_published(Duration::from_secs(120))
        .await;
    assert!(first.accepted() >= 1, "moved to the first");
    let reconnected = urls_logged(&relay, "broker connection re-established");
    assert!(
        reconnected
            .last()
            .is_some_and(|url| url.contains(&first.addr.to_string())),
        "logs the broker it moved to: {reconnected:?}\n{}",
        relay.log_text()
    );
    relay.stop(Duration::from_secs(5)).await;

    app.expect_every_event("failover between two brokers", &events)
        .await;
    second.restore();
    app.teardown().await;
}
