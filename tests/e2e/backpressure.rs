//! The broker's refusals through the binary: a full queue's nacks deferred, never dead,
//! and delivered in room order once a consumer catches up; an event over the broker's
//! `max_message_size` dead at once naming both sizes while every other room goes on; a
//! storm of failing publishes said in a few lines.

use lapin::options::{BasicConsumeOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties};
use outbox_tests::{
    assert_every_event_delivered, assert_within, eventually, http_get, rabbitmqctl, room_events,
    Backend, Received, RelayProcess, TestApp, TestBroker,
};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(60);

/// The sum of `outbox_events_failed_total{reason=…}` on the relay's endpoint.
async fn failed(address: SocketAddr, reason: &str) -> f64 {
    let (_, metrics) = http_get(address, "/metrics").await;
    let label = format!("reason=\"{reason}\"");
    metrics
        .lines()
        .filter(|line| line.starts_with("outbox_events_failed_total{") && line.contains(&label))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// The lines of the relay's JSON log at `level` (`WARN`, `ERROR`).
fn lines_at(relay: &RelayProcess, level: &str) -> Vec<serde_json::Value> {
    relay
        .log_lines("")
        .into_iter()
        .filter(|line| line["level"] == level)
        .collect()
}

/// A queue of at most `length` messages that refuses more (`overflow = reject-publish`:
/// the broker nacks them), bound to the test's exchange, on a connection of its own.
async fn bounded_queue(broker: &TestBroker, length: i64) -> (Connection, Channel, String) {
    let connection = Connection::connect(&broker.url, ConnectionProperties::default())
        .await
        .expect("RabbitMQ reachable");
    let channel = connection.create_channel().await.expect("channel");
    let mut arguments = FieldTable::default();
    arguments.insert("x-max-length".into(), AMQPValue::LongLongInt(length));
    arguments.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish".into()),
    );
    let options = QueueDeclareOptions {
        exclusive: true,
        auto_delete: true,
        ..QueueDeclareOptions::default()
    };
    let queue = channel
        .queue_declare("".into(), options, arguments)
        .await
        .expect("queue declared")
        .name()
        .to_string();
    channel
        .queue_bind(
            queue.as_str().into(),
            broker.exchange.as_str().into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("queue bound");
    (connection, channel, queue)
}

/// Consumes `queue` until each of `events` arrived, at most `deadline`; every delivery.
async fn consume_each(
    channel: &Channel,
    queue: &str,
    events: &[outbox_store::NewEvent],
    deadline: Duration,
) -> Vec<Received> {
    use futures_lite::StreamExt as _;
    let options = BasicConsumeOptions {
        no_ack: true,
        ..BasicConsumeOptions::default()
    };
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "catching-up".into(),
            options,
            FieldTable::default(),
        )
        .await
        .expect("consuming");
    let mut missing: HashSet<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
    let mut received = Vec::new();
    let until = tokio::time::Instant::now() + deadline;
    while !missing.is_empty() {
        let next = tokio::time::timeout_at(until, consumer.next()).await;
        let delivery = match next {
            Ok(Some(Ok(delivery))) => delivery,
            Ok(other) => panic!("the consumer stopped: {other:?}"),
            Err(_) => panic!(
                "{} events not delivered within {deadline:?}, such as {:?}",
                missing.len(),
                missing.iter().next()
            ),
        };
        let message = Received::from(&delivery);
        missing.remove(message.message_id.as_str());
        received.push(message);
    }
    received
}

#[actix_rt::test]
async fn a_full_queue_nacks_without_spending_attempts_and_all_goes_out_once_consumers_catch_up() {
    let events = room_events("full", 1_000, 10);
    let app = TestApp::on(Backend::Postgres)
        .binding("nothing.matches")
        .seeded(&events)
        .build()
        .await;
    let (connection, channel, queue) = bounded_queue(&app.broker, 100).await;
    let settings = app.settings_with(|settings| {
        settings.relay.max_attempts = 3;
        settings.relay.retry_interval = "100ms".into();
        settings.metrics.listen = "127.0.0.1:0".into();
        settings.log.format = "json".into();
    });
    let relay = RelayProcess::spawn(crate::RELAY, &settings);
    let address = relay.metrics_address().await;

    // Ten rooms' heads nacked 100 times: many times the three attempts allowed.
    eventually("100 nacks", DEADLINE, || async {
        failed(address, "nacked").await >= 100.0
    })
    .await;
    let rows = app.database.rows().await;
    let dead: Vec<&str> = (rows.iter())
        .filter(|row| row.status == "dead")
        .map(|row| row.event_id.as_str())
        .collect();
    assert!(dead.is_empty(), "nacked events went dead: {dead:?}");
    let counted: Vec<(&str, i32)> = (rows.iter())
        .filter(|row| row.retry_count > 0)
        .map(|row| (row.event_id.as_str(), row.retry_count))
        .collect();
    assert!(counted.is_empty(), "nacks cost attempts: {counted:?}");
    assert!(
        rows.iter().any(|row| row
            .last_error
            .as_deref()
            .is_some_and(|error| error.starts_with("nacked"))),
        "the refusal is each row's last error"
    );

    // The consumers catch up: everything goes out, in room order.
    let received = consume_each(&channel, &queue, &events, DEADLINE).await;
    assert_every_event_delivered(&received, &events);
    app.database.wait_all_published(DEADLINE).await;
    let warnings = lines_at(&relay, "WARN");
    eprintln!(
        "a full queue: {} nacks, 0 dead, 0 attempts counted, {} events delivered, {} WARN lines",
        failed(address, "nacked").await,
        events.len(),
        warnings.len()
    );
    assert!(
        warnings.len() <= 10,
        "{} WARN lines for one full queue:\n{}",
        warnings.len(),
        relay.log_text()
    );
    assert!(lines_at(&relay, "ERROR").is_empty(), "{}", relay.log_text());
    relay.stop(Duration::from_secs(10)).await;
    let _ = connection.close(200, "done".into()).await;
    app.teardown().await;
}

#[actix_rt::test]
async fn ten_thousand_failing_publishes_say_a_few_lines() {
    // No queue for their routing key: every publish comes back unroutable.
    let events = room_events("storm", 1_000, 100);
    let app = TestApp::on(Backend::Postgres)
        .binding("nothing.matches")
        .seeded(&events)
        .build()
        .await;
    let settings = app.settings_with(|settings| {
        settings.relay.retry_interval = "20ms".into();
        settings.metrics.listen = "127.0.0.1:0".into();
        settings.log.format = "json".into();
    });
    let relay = RelayProcess::spawn(crate::RELAY, &settings);
    let address = relay.metrics_address().await;
    let started = Instant::now();
    eventually("10,000 failed publishes", DEADLINE, || async {
        failed(address, "unroutable").await >= 10_000.0
    })
    .await;
    let took = started.elapsed();
    eventually("a summary line", DEADLINE, || {
        std::future::ready(
            !relay
                .log_lines("publishes failed for this reason")
                .is_empty(),
        )
    })
    .await;
    let summary = &relay.log_lines("publishes failed for this reason")[0];
    assert_eq!(summary["level"], "WARN", "{summary}");
    assert_eq!(summary["reason"], "unroutable", "{summary}");
    assert!(
        summary["failures"].as_u64().is_some_and(|n| n > 100),
        "counts what it stands for: {summary}"
    );
    assert!(
        summary["event_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("storm-")),
        "an example: {summary}"
    );
    let warnings = lines_at(&relay, "WARN");
    eprintln!(
        "a storm: 10,000 failed publishes in {took:?}, {} WARN lines by the first summary",
        warnings.len()
    );
    assert!(
        warnings.len() <= 100,
        "{} WARN lines for 10,000 failures",
        warnings.len()
    );
    let said_in_full = relay.log_lines("publish failed; will retry");
    assert_eq!(
        said_in_full.len(),
        1,
        "the first failure in full, the rest summed up"
    );
    relay.stop(Duration::from_secs(10)).await;
    app.teardown().await;
}

/// The broker's `max_message_size` while a test runs: lowered to 1 MiB on a broker whose
/// limit is larger (3.x: 128 MiB), where an event over it is cheap to insert; put back when
/// dropped. RabbitMQ 4's default, 16 MiB, is kept as it is.
struct BrokerLimit {
    /// In force during the test.
    bytes: usize,
    /// What `application:set_env` puts back; `None`: nothing was changed.
    restore: Option<String>,
}

impl BrokerLimit {
    const LOWERED: usize = 1024 * 1024;

    fn at_most_16_mib() -> Self {
        let value = rabbitmqctl(&["eval", "application:get_env(rabbit, max_message_size)."]);
        let bytes = value
            .trim()
            .strip_prefix("{ok,")
            .and_then(|rest| rest.strip_suffix('}'))
            .and_then(|bytes| bytes.parse::<usize>().ok())
            .unwrap_or(128 * 1024 * 1024);
        if bytes <= 16 * 1024 * 1024 {
            return Self {
                bytes,
                restore: None,
            };
        }
        let restore = match value.trim() {
            "undefined" => "application:unset_env(rabbit, max_message_size).".to_owned(),
            _ => format!("application:set_env(rabbit, max_message_size, {bytes})."),
        };
        rabbitmqctl(&[
            "eval",
            &format!(
                "application:set_env(rabbit, max_message_size, {}).",
                Self::LOWERED
            ),
        ]);
        Self {
            bytes: Self::LOWERED,
            restore: Some(restore),
        }
    }
}

impl Drop for BrokerLimit {
    fn drop(&mut self) {
        if let Some(restore) = &self.restore {
            let put_back = outbox_tests::services::rabbitmqctl_command()
                .args(["eval", restore])
                .output();
            if !put_back.is_ok_and(|output| output.status.success()) {
                eprintln!("the broker's max_message_size was not restored: run `rabbitmqctl eval '{restore}'`");
            }
        }
    }
}

#[actix_rt::test]
async fn an_event_over_the_brokers_size_limit_is_dead_at_once_and_no_other_room_waits() {
    let limit = BrokerLimit::at_most_16_mib();
    let mut events = room_events("size", 3_000, 60);
    let big = &mut events[1_000];
    big.envelope = format!(r#"{{"blob":"{}"}}"#, "x".repeat(limit.bytes + 1024 * 1024));
    let (big_id, big_room) = (big.event_id.clone(), big.room_id.clone());
    let app = TestApp::on(Backend::Postgres)
        .binding("#")
        .seeded(&events)
        .build()
        .await;
    let settings = app.settings_with(|settings| {
        // A relay not told the broker's limit: the broker's refusal is what it meets.
        settings.amqp.max_message_size = 512 * 1024 * 1024;
        settings.relay.max_attempts = 3;
        settings.relay.retry_interval = "100ms".into();
        settings.log.format = "json".into();
    });
    let started = Instant::now();
    let relay = RelayProcess::spawn(crate::RELAY, &settings);
    eventually("the big event dead", DEADLINE, || async {
        app.database.row(&big_id).await.status == "dead"
    })
    .await;
    let took = started.elapsed();
    assert_within(
        "an event over the broker's limit dead",
        took,
        Duration::from_secs(5),
    );
    let row = app.database.row(&big_id).await;
    let error = row.last_error.unwrap_or_default();
    let size = (limit.bytes + 1024 * 1024 + 11).to_string();
    assert!(
        error.contains(&size) && error.contains(&limit.bytes.to_string()),
        "names both sizes: {error}"
    );
    assert_eq!(row.retry_count, 1, "dead at its first attempt");

    let others: Vec<_> = events
        .iter()
        .filter(|e| e.event_id != big_id)
        .cloned()
        .collect();
    let received = app.broker.wait_for_each(&others, DEADLINE).await;
    let duplicates = assert_every_event_delivered(&received, &others);
    eprintln!(
        "over the broker's limit of {} bytes: dead {took:?} after the relay started, {} other \
         events delivered in room order, {duplicates} duplicates",
        limit.bytes,
        others.len()
    );
    assert!(
        duplicates <= 400,
        "{duplicates} duplicates: at most what was in flight on the channel"
    );
    let after: Vec<&Received> = (received.iter())
        .filter(|r| r.header("room_id").as_deref() == Some(big_room.as_str()))
        .collect();
    assert!(!after.is_empty(), "its room's next events followed it");
    assert!(received.iter().all(|r| r.message_id != big_id));
    relay.stop(Duration::from_secs(10)).await;
    app.teardown().await;
}
