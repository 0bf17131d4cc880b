//! The bare lapin publisher the relay is measured against: the same message size and
//! queue, confirms pipelined with a bounded window.

use crate::consumer::{Consume, ConsumerProcess};
use crate::cost::broker_cpu_seconds;
use anyhow::Context as _;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, PublisherConfirm,
};
use outbox_amqp::tap::{declare_topic_exchange, delete_exchange};
use outbox_amqp::{Tap, TapQueue};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// `OUTBOX_BENCH_AMQP_URL` as given: one broker's URL, or a cluster's nodes comma-separated
/// as `amqp.url` takes them; the relay under test gets all of it.
pub fn amqp_urls() -> String {
    std::env::var("OUTBOX_BENCH_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// The URL of the bench's own connections (the bare publisher, the consumer, its queue's
/// declaration and deletion): the first of [`amqp_urls`].
pub fn amqp_url() -> String {
    let urls = amqp_urls();
    urls.split(',').next().unwrap_or_default().trim().to_owned()
}

/// A connection of the bench's own, to [`amqp_url`].
pub async fn connect() -> anyhow::Result<Connection> {
    Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .context("cannot connect to RabbitMQ (start it with `rabbitmq-server -detached`)")
}

/// The type of the queue the bench's consumer reads and the bare publisher's messages go
/// to: `OUTBOX_BENCH_QUEUE_TYPE`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum QueueType {
    /// A durable classic queue (the default).
    #[default]
    Classic,
    /// A durable quorum queue, replicated over a cluster's nodes.
    Quorum,
}

impl QueueType {
    /// As the variable and the JSON lines spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Classic => "classic",
            Self::Quorum => "quorum",
        }
    }

    /// The durable queue `name` of this type.
    pub fn queue(self, name: String) -> TapQueue {
        match self {
            Self::Classic => TapQueue::Durable(name),
            Self::Quorum => TapQueue::Quorum(name),
        }
    }
}

/// `OUTBOX_BENCH_QUEUE_TYPE`: `classic` (also when unset or empty) or `quorum`.
pub fn queue_type() -> anyhow::Result<QueueType> {
    let value = std::env::var_os("OUTBOX_BENCH_QUEUE_TYPE").unwrap_or_default();
    match value.to_string_lossy().as_ref() {
        "" | "classic" => Ok(QueueType::Classic),
        "quorum" => Ok(QueueType::Quorum),
        other => anyhow::bail!(
            "OUTBOX_BENCH_QUEUE_TYPE={other:?}: expected `classic` (the default) or `quorum`"
        ),
    }
}

/// Best publish rate over the tried windows.
#[derive(Debug, Clone, Copy, Default)]
pub struct Baseline {
    /// Messages per run.
    pub events: usize,
    /// Messages per second of the best window.
    pub rate: f64,
    /// That window.
    pub window: usize,
    /// Channels the messages were spread over.
    pub channels: usize,
    /// CPU time of this process per message in that run: what lapin alone costs, for
    /// comparison with the relay's CPU per event.
    pub cpu_us: f64,
    /// RabbitMQ's CPU per message in that run (its `beam.smp` processes, from /proc);
    /// `None` when the broker is not on this machine.
    pub broker_us: Option<f64>,
    /// The type of the queue the messages went to.
    pub queue_type: QueueType,
}

impl Baseline {
    /// Its own CPU + the broker's per message; `None` when the broker's is unknown.
    pub fn all_in_us(&self) -> Option<f64> {
        Some(self.cpu_us + self.broker_us?)
    }

    /// Prints the table line and the JSON line.
    pub fn print(self) {
        let us = |v: Option<f64>| v.map_or("n/a".to_owned(), |v| format!("{v:.1}"));
        println!(
            "baseline: {} messages, {} queue, {} channel(s), best window {}: {:.0} msg/s, CPU \
             {:.1} µs/message | broker CPU {} µs/message | all in {} µs/message",
            self.events,
            self.queue_type.name(),
            self.channels,
            self.window,
            self.rate,
            self.cpu_us,
            us(self.broker_us),
            us(self.all_in_us())
        );
        let tenth = |v: f64| (v * 10.0).round() / 10.0;
        println!(
            "{}",
            serde_json::json!({"scenario": "baseline", "events": self.events, "window": self.window,
                "channels": self.channels, "queue_type": self.queue_type.name(),
                "events_per_sec": self.rate.round(), "cpu_us_per_event": tenth(self.cpu_us),
                "broker_cpu_us_per_message": self.broker_us.map(tenth),
                "all_in_cpu_us_per_message": self.all_in_us().map(tenth)})
        );
    }
}

/// Publishes `events` persistent messages of `body_bytes` bytes to a durable topic exchange
/// bound to one durable queue (of [`queue_type`]), with 256 and then 1024 confirms in
/// flight; returns the better run. The messages go over `channels` confirm channels of one
/// connection, each room's to one channel (1: the plain bare publisher; the relay has one
/// per Publisher).
/// A consumer process reads the queue as `drain`'s does (`consume`: while the messages
/// are published, or only after each window), so that the broker's work per
/// message, and so "all in ÷ bare", compare like with like: RabbitMQ confirms a persistent
/// message nobody consumes only once it is on disk, and delivering costs it CPU too.
pub async fn run(
    events: usize,
    body_bytes: usize,
    consume: Consume,
    channels: usize,
) -> anyhow::Result<Baseline> {
    let queue_type = queue_type()?;
    let connection = connect().await?;
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let name = format!("bench.baseline.{}", std::process::id());
    declare_topic_exchange(&channel, &name).await?;
    let tap = Tap::open(channel, queue_type.queue(name.clone()), &name, "#").await?;
    let channel = tap.channel();
    let mut publishers = vec![channel.clone()];
    while publishers.len() < channels {
        let more = connection.create_channel().await?;
        more.confirm_select(ConfirmSelectOptions::default()).await?;
        publishers.push(more);
    }
    let body = vec![b'x'; body_bytes];
    let mut best = Baseline {
        events,
        channels: publishers.len(),
        queue_type,
        ..Baseline::default()
    };
    for window in [256, 1024] {
        // Message ids `baseline-{n:08}`, room header `room-{n % 1000}`: what the consumer
        // checks (every message there, each room's in order).
        let mut consumer = ConsumerProcess::start(&name, events, 1000, false, consume).await?;
        let broker_before = broker_cpu_seconds(&crate::process::all());
        let cpu_before = crate::process::cpu_seconds();
        let started = Instant::now();
        let mut in_flight = VecDeque::with_capacity(window);
        for n in (0..events).map(|n| n as i64) {
            if in_flight.len() == window {
                expect_ack(in_flight.pop_front()).await?;
            }
            // By room, as the relay's Fetcher picks a room's Publisher.
            let channel = &publishers[(n % 1000) as usize % publishers.len()];
            let confirm = publish(channel, &name, &body, n).await?;
            in_flight.push_back(confirm);
        }
        while let Some(confirm) = in_flight.pop_front() {
            expect_ack(Some(confirm)).await?;
        }
        let rate = events as f64 / started.elapsed().as_secs_f64();
        let broker_after = broker_cpu_seconds(&crate::process::all());
        let cpu_us = (crate::process::cpu_seconds() - cpu_before) / events.max(1) as f64 * 1e6;
        let broker_us = broker_after
            .zip(broker_before)
            .map(|(now, then)| (now - then) / events.max(1) as f64 * 1e6);
        println!(
            "  baseline window {window}: {rate:.0} msg/s, CPU {cpu_us:.1} µs/message, broker CPU {} µs/message",
            broker_us.map_or("n/a".to_owned(), |v| format!("{v:.1}"))
        );
        if rate > best.rate {
            best = Baseline {
                events,
                channels: publishers.len(),
                rate,
                window,
                cpu_us,
                broker_us,
                queue_type,
            };
        }
        if consume == Consume::Later {
            consumer.release()?;
        }
        let report = consumer.finish(Duration::from_secs(120)).await?;
        if report.delivered < events {
            anyhow::bail!(
                "baseline: only {} of {events} messages arrived",
                report.delivered
            );
        }
    }
    tap.delete().await?;
    delete_exchange(channel, &name).await?;
    tap.close().await;
    let _ = connection.close(200, "done".into()).await;
    Ok(best)
}

/// Publishes event `n` of the bare publisher's sequence to `exchange` (mandatory, with
/// [`message_properties`]): its confirm.
pub(crate) async fn publish(
    channel: &Channel,
    exchange: &str,
    body: &[u8],
    n: i64,
) -> Result<PublisherConfirm, lapin::Error> {
    channel
        .basic_publish(
            exchange.into(),
            "bench.event".into(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            body,
            message_properties(n),
        )
        .await
}

/// The properties and headers a relayed event carries (`docs/design/publishing.md`), so
/// that the broker does the same work per message for the baseline as for the relay.
fn message_properties(n: i64) -> BasicProperties {
    let mut headers = FieldTable::default();
    let text = |value: String| AMQPValue::LongString(value.into());
    headers.insert("room_id".into(), text(format!("room-{}", n % 1000)));
    headers.insert("outbox_id".into(), AMQPValue::LongLongInt(n));
    headers.insert("retry_count".into(), AMQPValue::LongInt(0));
    headers.insert("node_id".into(), text("outbox-bench-baseline".into()));
    BasicProperties::default()
        .with_message_id(format!("baseline-{n:08}").into())
        .with_type("room.message.posted".into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_timestamp(u64::try_from(chrono::Utc::now().timestamp()).unwrap_or(0))
        .with_app_id("outbox-relay".into())
        .with_headers(headers)
}

pub(crate) async fn expect_ack(confirm: Option<PublisherConfirm>) -> anyhow::Result<()> {
    if let Some(confirm) = confirm {
        match confirm.await? {
            Confirmation::Ack(None) => {}
            other => anyhow::bail!("baseline publish not acked: {other:?}"),
        }
    }
    Ok(())
}
