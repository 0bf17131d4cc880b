//! Riding through faults, injected by a TCP proxy between the relay and a service.

use outbox_tests::services::{amqp_url, database_url};
use outbox_tests::{
    assert_within, event, eventually, room_events, server_of, through, within, Backend, FaultProxy,
    RelayProcess, TestApp, TestEvent,
};
use std::time::{Duration, Instant};

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
    let proxy = FaultProxy::start(server_of(&amqp_url())).await;
    let seeded = room_events("bcut", EVENTS, 200);
    let mut app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.amqp.url = through(proxy.addr, &settings.amqp.url);
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
    let proxy = FaultProxy::start(server_of(&database_url(Backend::Postgres))).await;
    let seeded = room_events("dbcut", EVENTS, 200);
    let mut app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.database.url = through(proxy.addr, &settings.database.url);
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
    let proxy = FaultProxy::start(server_of(&amqp_url())).await;
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.amqp.url = through(proxy.addr, &settings.amqp.url);
            settings.relay.publish_timeout = "1s".into();
            settings.relay.retry_interval = "200ms".into();
        })
        .seeded(&room_events("stall", 100, 10))
        .build()
        .await;
    let mut relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    app.broker.wait_for(100, Duration::from_secs(60)).await;

    proxy.stall();
    let stalled = Instant::now();
    outbox_tests::seed(&app.database, &room_events("stalled", 20, 5)).await;
    eventually(
        "publishes to fail with a timeout",
        Duration::from_secs(30),
        || async {
            app.database.rows().await.iter().any(|row| {
                row.last_error
                    .as_deref()
                    .is_some_and(|error| error.contains("no confirm from the broker within 1s"))
            })
        },
    )
    .await;
    // A broker that does not answer is not the event's fault: no attempt counted.
    for row in app.database.rows().await {
        assert_eq!(row.retry_count, 0, "{}: {:?}", row.event_id, row.last_error);
    }
    // On time: the first failure is seen within publish_timeout (1 s) of the stall, plus a
    // poll (100 ms) to claim the rows.
    assert_within(
        "a publish to a stalled broker failing",
        stalled.elapsed(),
        Duration::from_millis(1_100),
    );

    let signalled = Instant::now();
    relay.signal("TERM");
    // The shutdown deadline: publish_timeout (1 s) + 2 s, and the machine's margin.
    let status = relay.wait(within(Duration::from_secs(3))).await;
    assert_within(
        "SIGTERM with a stalled broker",
        signalled.elapsed(),
        Duration::from_secs(3),
    );
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

/// The numbers of the confirm-mode channels `user` has open on the broker: the relay's
/// publishers' channels (its other channels are not in confirm mode).
fn confirm_channels(user: &str) -> Vec<u64> {
    let listing = outbox_tests::rabbitmqctl(&[
        "list_channels",
        "user",
        "number",
        "confirm",
        "--formatter",
        "json",
        "-s",
    ]);
    let channels: Vec<serde_json::Value> =
        serde_json::from_str(&listing).expect("rabbitmqctl's JSON");
    (channels.iter())
        .filter(|channel| channel["user"] == user && channel["confirm"] == true)
        .filter_map(|channel| channel["number"].as_u64())
        .collect()
}

#[actix_rt::test]
async fn a_channel_error_recreates_that_channel_and_the_rest_flows() {
    // The broker closes the publisher's own channel when it publishes to an exchange that
    // exists but that the relay's user may not write to (ACCESS_REFUSED).
    let refused = outbox_tests::TestBroker::new("#").await;
    let refused_exchange = refused.exchange.clone();
    // Through a proxy that counts connections: a channel error must cost a channel, not
    // the connection.
    let proxy = FaultProxy::start(server_of(&amqp_url())).await;
    let mut app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.amqp.routes = vec![outbox_relay::settings::RouteSettings {
                event_type: "ghost.*".into(),
                exchange: refused_exchange,
                routing_key: None,
                ..Default::default()
            }];
            settings.relay.publishers = 1;
            settings.relay.retry_interval = "100ms".into();
        })
        .seeded(&room_events("before", 50, 5))
        .build()
        .await;
    let user = outbox_tests::BrokerUser::writing_only_to("s3cret", &app.broker.exchange);
    app.settings.amqp.url = through(proxy.addr, &user.url_with_password(&app.broker));
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    app.broker.wait_for(50, Duration::from_secs(30)).await;
    let before = confirm_channels(&user.name);
    assert_eq!(
        before.len(),
        1,
        "one publisher, one confirm channel: {before:?}"
    );
    let connections = proxy.accepted();

    outbox_tests::seed(
        &app.database,
        &[event("ghost", "g").of_type("ghost.created")],
    )
    .await;
    eventually(
        "the ghost event to fail twice",
        Duration::from_secs(30),
        || async { app.database.row("ghost").await.retry_count >= 2 },
    )
    .await;
    // Each failure closed the publisher's channel: events inserted after the second still
    // flow, on a channel opened again on the same connection.
    let later = room_events("later", 20, 5);
    outbox_tests::seed(&app.database, &later).await;
    let received = app
        .broker
        .wait_for_each(&later, Duration::from_secs(30))
        .await;
    outbox_tests::assert_every_event_delivered(&received, &later);
    let after = confirm_channels(&user.name);
    assert_eq!(after.len(), 1, "still one confirm channel: {after:?}");
    assert_ne!(after, before, "the publisher's channel was replaced");
    assert_eq!(
        proxy.accepted(),
        connections,
        "the connection was kept: only the channel was recreated"
    );
    relay.stop(Duration::from_secs(30)).await;
    let ghost = app.database.row("ghost").await;
    let error = ghost.last_error.unwrap_or_default();
    assert!(error.contains("ACCESS_REFUSED"), "{error}");
    assert!(
        refused.drain(Duration::from_secs(10)).await.is_empty(),
        "nothing reached the refused exchange"
    );
    refused.close().await;
    app.teardown().await;
}

/// The failure table's broker row: a lost connection is re-established and the exchanges declared
/// again (here the exchange was deleted meanwhile), one `broker connection lost` warning
/// and one `broker connection re-established` line.
#[actix_rt::test]
async fn a_reconnect_declares_a_deleted_exchange_again_and_says_so_once() {
    let (proxy, amqp) = FaultProxy::in_front_of(&amqp_url()).await;
    let before = room_events("before", 10, 2);
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.amqp.url = amqp;
            settings.relay.retry_interval = "100ms".into();
            settings.log.format = "json".into();
        })
        .seeded(&before)
        .build()
        .await;
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    app.database
        .wait_all_published(Duration::from_secs(60))
        .await;

    app.broker.delete_exchange().await;
    assert!(!app.broker.exchange_exists().await, "deleted");
    proxy.cut();
    // The next publish finds the connection lost and reconnects.
    let after = room_events("after", 10, 2);
    outbox_tests::seed(&app.database, &after).await;
    eventually(
        "the exchange declared again after the reconnect",
        Duration::from_secs(30),
        || app.broker.exchange_exists(),
    )
    .await;
    // Deleting the exchange took the test queue's binding with it; what was published
    // before it is bound again came back unroutable and is retried.
    app.broker.bind("#").await;
    app.database
        .wait_all_published(Duration::from_secs(60))
        .await;
    let received = app
        .broker
        .wait_for_each(&after, Duration::from_secs(30))
        .await;
    outbox_tests::assert_every_event_delivered(&received, &after);

    let lost = relay.log_lines("broker connection lost");
    assert_eq!(lost.len(), 1, "one warning:\n{}", relay.log_text());
    assert_eq!(lost[0]["level"], "WARN", "{}", lost[0]);
    let back = relay.log_lines("broker connection re-established");
    assert_eq!(back.len(), 1, "one line:\n{}", relay.log_text());
    assert_eq!(back[0]["level"], "INFO", "{}", back[0]);
    relay.stop(within(Duration::from_secs(5))).await;
    app.teardown().await;
}

/// A broker that stops answering without closing its connections (a hung node: a stalled
/// VM, a paused runtime), with another in `amqp.url`: after three publishes in a row time
/// out, the connection is taken for dead and publishing goes on through the other.
#[actix_rt::test]
async fn a_broker_that_stops_answering_gives_way_to_the_next_in_the_list() {
    let first = FaultProxy::start(server_of(&amqp_url())).await;
    let second = FaultProxy::start(server_of(&amqp_url())).await;
    let publish_timeout = Duration::from_secs(1);
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            let urls = [
                through(first.addr, &settings.amqp.url),
                through(second.addr, &settings.amqp.url),
            ];
            settings.amqp.url = urls.join(",");
            settings.relay.publish_timeout = "1s".into();
            settings.relay.retry_interval = "200ms".into();
            settings.log.format = "json".into();
        })
        .seeded(&room_events("before", 100, 10))
        .build()
        .await;
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    app.broker.wait_for(100, Duration::from_secs(60)).await;
    // The relay starts on either (a random one per process): hang that one.
    let (hung, other) = match first.accepted() > 0 {
        true => (&first, &second),
        false => (&second, &first),
    };
    assert!(
        hung.accepted() > 0,
        "the relay is connected through a proxy"
    );
    let before = other.accepted();
    hung.stall();
    let stalled = Instant::now();
    let during = room_events("during", 40, 10);
    outbox_tests::seed(&app.database, &during).await;
    let received = app
        .broker
        .wait_for_each(&during, Duration::from_secs(60))
        .await;
    // Three timeouts (publish_timeout each, in flight together), then a connection to the
    // other broker and the retries after retry_interval.
    assert_within(
        "publishing through the other broker after one stopped answering",
        stalled.elapsed(),
        publish_timeout * 2 + Duration::from_millis(500),
    );
    outbox_tests::assert_every_event_delivered(&received, &during);
    assert!(other.accepted() > before, "connected to the other broker");
    let lost = relay.log_lines("broker connection lost");
    assert_eq!(lost.len(), 1, "{lost:?}");
    let reason = lost[0]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("no confirm within 1s") && reason.contains("taken for dead"),
        "{reason}"
    );
    assert_eq!(relay.log_lines("broker connection re-established").len(), 1);
    for row in app.database.rows().await {
        assert_eq!(
            row.retry_count, 0,
            "a hung broker costs no attempt: {}",
            row.event_id
        );
    }
    hung.restore();
    relay.stop(within(Duration::from_secs(3))).await;
    app.teardown().await;
}
