//! `amqp.url` as a list: the nodes of a RabbitMQ cluster, each stood for here by a TCP
//! proxy in front of the one test broker; a node refusing the login is named in a `warn`
//! (its entry, masked URL and reason) at each connection attempt, never lapin's lines.

use outbox_tests::services::{amqp_url, with_user};
use outbox_tests::OutputInTime as _;
use outbox_tests::{room_events, seed, through, Backend, FaultProxy, RelayProcess, TestApp};
use std::net::SocketAddr;
use std::time::Duration;

/// The test broker's address (`OUTBOX_TEST_AMQP_URL`), for a proxy standing for a node.
fn broker() -> SocketAddr {
    outbox_tests::server_of(&amqp_url())
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
    let first = FaultProxy::start(broker()).await;
    let second = FaultProxy::start(broker()).await;
    first.go_down();
    let events = room_events("cluster", EVENTS, 50);
    let (before, after) = events.split_at(EVENTS / 2);
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            // As the environment gives a list: comma-separated.
            settings.amqp.url = format!(
                "{}, {}",
                through(first.addr, &amqp_url()),
                through(second.addr, &amqp_url())
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
    let password = url::Url::parse(&amqp_url())
        .expect("a URL")
        .password()
        .map(str::to_owned);
    assert!(
        password.is_none_or(|password| !connected[0].contains(&format!(":{password}@"))),
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

#[actix_rt::test]
async fn a_node_refusing_the_login_is_named_in_a_warning_and_the_relay_uses_the_other() {
    const WRONG: &str = "Wrong-node-pw-4e1f";
    let good = FaultProxy::start(broker()).await;
    let url = url::Url::parse(&amqp_url()).expect("a URL");
    let (user, at) = (
        url.username().to_owned(),
        format!(
            ":***@{}:{}{})",
            url.host_str().expect("a host"),
            url.port().unwrap_or(5672),
            url.path()
        ),
    );
    let events = room_events("refusing", 200, 10);
    let (before, after) = events.split_at(100);
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            // Entry 0 refuses the login; entry 1 (through the proxy) takes it.
            settings.amqp.url = format!(
                "{}, {}",
                with_user(&amqp_url(), &user, Some(WRONG)),
                through(good.addr, &amqp_url())
            );
            settings.relay.publish_timeout = "2s".into();
            settings.log.format = "json".into();
        })
        .seeded(before)
        .build()
        .await;
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    app.database
        .wait_all_published(Duration::from_secs(60))
        .await;
    // A lost connection: the next round begins after the node connected to, at entry 0.
    good.cut();
    seed(&app.database, after).await;
    app.database
        .wait_all_published(Duration::from_secs(60))
        .await;
    let warned = relay.log_lines("broker not usable; trying the next of amqp.url");
    assert!(!warned.is_empty(), "warned: {}", relay.log_text());
    for line in &warned {
        assert_eq!(line["level"], "WARN", "{line}");
        let error = line["error"].as_str().unwrap_or_default();
        assert!(
            // (`guest`, the other entry's password, is masked wherever it occurs.)
            error.contains("amqp.url[0] (amqp://")
                && error.contains(&at)
                && error.contains("ACCESS_REFUSED"),
            "names the entry and the reason: {line}"
        );
    }
    let log = relay.log_text();
    assert!(!log.contains(WRONG), "password printed: {log}");
    assert!(
        !log.contains("Exponential backoff attempts exhausted"),
        "lapin's lines: {log}"
    );
    relay.stop(Duration::from_secs(5)).await;
    app.expect_every_event("one refusing node", &events).await;
    app.teardown().await;
}

/// A user of the test broker, deleted on drop (also when the test fails first).
struct BrokerUser {
    name: String,
}

impl BrokerUser {
    fn create(password: &str) -> Self {
        let name = outbox_tests::unique_name("relay_mq");
        rabbitmqctl(&["add_user", &name, password]);
        rabbitmqctl(&["set_permissions", "-p", "/", &name, ".*", ".*", ".*"]);
        Self { name }
    }

    fn change_password(&self, password: &str) {
        rabbitmqctl(&["change_password", &self.name, password]);
    }
}

impl Drop for BrokerUser {
    fn drop(&mut self) {
        let _ = outbox_tests::services::rabbitmqctl_command()
            .args(["delete_user", &self.name])
            .output_in_time();
    }
}

fn rabbitmqctl(args: &[&str]) {
    let output = outbox_tests::services::rabbitmqctl_command()
        .args(args)
        .output_in_time()
        .expect("rabbitmqctl runs");
    assert!(output.status.success(), "rabbitmqctl {args:?}: {output:?}");
}

#[actix_rt::test]
async fn a_broker_refusing_a_changed_password_is_a_warning_at_each_attempt() {
    const PASSWORD: &str = "Mq-pw-first-81d0";
    const CHANGED: &str = "Mq-pw-changed-3a7c";
    let user = BrokerUser::create(PASSWORD);
    let proxy = FaultProxy::start(broker()).await;
    let events = room_events("rotated", 100, 10);
    let (before, after) = events.split_at(50);
    let name = user.name.clone();
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.amqp.url = format!("amqp://{name}:{PASSWORD}@{}/%2f", proxy.addr);
            settings.relay.retry_interval = "100ms".into();
            settings.relay.publish_timeout = "2s".into();
            settings.log.format = "json".into();
        })
        .seeded(before)
        .build()
        .await;
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    app.database
        .wait_all_published(Duration::from_secs(60))
        .await;

    // The password changes under the relay; its connection is lost.
    user.change_password(CHANGED);
    proxy.cut();
    seed(&app.database, after).await;
    let refused = || relay.log_lines("broker refuses the connection");
    outbox_tests::eventually(
        "two refused reconnection attempts",
        Duration::from_secs(60),
        || std::future::ready(refused().len() >= 2),
    )
    .await;
    user.change_password(PASSWORD);
    app.database
        .wait_all_published(Duration::from_secs(60))
        .await;
    for line in refused() {
        assert_eq!(line["level"], "WARN", "{line}");
        let error = line["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(&format!(
                "amqp.url (amqp://{}:***@{}/%2f)",
                user.name, proxy.addr
            )) && error.contains("ACCESS_REFUSED"),
            "names the entry and the reason: {line}"
        );
    }
    let log = relay.log_text();
    for secret in [PASSWORD, CHANGED] {
        assert!(!log.contains(secret), "{secret} printed: {log}");
    }
    assert!(!log.contains("Exponential backoff"), "lapin's lines: {log}");
    relay.stop(Duration::from_secs(5)).await;
    app.expect_every_event("a changed broker password", &events)
        .await;
    app.teardown().await;
}

/// A node that accepts the TCP connection but never answers (a hung node) gives way to the
/// next after `publish_timeout` (at least 1 s), as docs/operations/rabbitmq-cluster.md says.
#[actix_rt::test]
async fn a_node_that_accepts_but_never_answers_gives_way_to_the_next() {
    let hung = FaultProxy::start(broker()).await;
    let other = FaultProxy::start(broker()).await;
    hung.stall();
    other.stall();
    let events = room_events("hung", 50, 5);
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.amqp.url = format!(
                "{}, {}",
                through(hung.addr, &amqp_url()),
                through(other.addr, &amqp_url())
            );
            settings.relay.publish_timeout = "1s".into();
            settings.log.format = "json".into();
        })
        .seeded(&events)
        .build()
        .await;
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    // Both hang: whichever node it began at, it gave way to the other.
    outbox_tests::eventually(
        "both hung nodes tried in turn",
        Duration::from_secs(30),
        || std::future::ready(hung.accepted() >= 1 && other.accepted() >= 1),
    )
    .await;
    assert!(
        app.broker.received().is_empty(),
        "nothing delivered through a node that does not answer"
    );
    // One answers again: the relay gets past the hung one to it.
    other.restore();
    let received = app
        .broker
        .wait_for_each(&events, Duration::from_secs(60))
        .await;
    outbox_tests::assert_every_event_delivered(&received, &events);
    relay
        .stop(outbox_tests::within(Duration::from_secs(3)))
        .await;
    app.teardown().await;
}
