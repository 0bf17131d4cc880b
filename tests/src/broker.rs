//! A fresh exchange per test, read through a temporary queue (an [`outbox_amqp::Tap`])
//! by a consumer that records everything it receives.

use crate::unique_name;
use futures_lite::StreamExt;
use lapin::types::AMQPValue;
use lapin::{Connection, ConnectionProperties};
use outbox_amqp::tap::{declare_topic_exchange, delete_exchange};
use outbox_amqp::{Tap, TapQueue};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One delivered message, as the tests look at it.
#[derive(Debug, Clone)]
pub struct Received {
    /// `message_id`.
    pub message_id: String,
    /// `type`.
    pub kind: String,
    /// `content_type`.
    pub content_type: String,
    /// `delivery_mode`.
    pub delivery_mode: u8,
    /// `timestamp`.
    pub timestamp: u64,
    /// `app_id`.
    pub app_id: String,
    /// Headers, as text (`LongString`) or numbers.
    pub headers: BTreeMap<String, AMQPValue>,
    /// The body.
    pub body: Vec<u8>,
    /// Routing key it was published with.
    pub routing_key: String,
    /// When the test's consumer got it (for latencies measured from a commit).
    pub arrived: std::time::Instant,
}

impl Received {
    /// A string header.
    pub fn header(&self, name: &str) -> Option<String> {
        match self.headers.get(name)? {
            AMQPValue::LongString(text) => Some(text.to_string()),
            AMQPValue::ShortString(text) => Some(text.to_string()),
            _ => None,
        }
    }

    /// An integer header.
    pub fn int_header(&self, name: &str) -> Option<i64> {
        match self.headers.get(name)? {
            AMQPValue::LongLongInt(n) => Some(*n),
            AMQPValue::LongInt(n) => Some(i64::from(*n)),
            AMQPValue::ShortInt(n) => Some(i64::from(*n)),
            _ => None,
        }
    }
}

impl From<&lapin::message::Delivery> for Received {
    fn from(delivery: &lapin::message::Delivery) -> Self {
        let props = &delivery.properties;
        let text = |value: &Option<lapin::types::ShortString>| {
            value.as_ref().map(ToString::to_string).unwrap_or_default()
        };
        Self {
            message_id: text(props.message_id()),
            kind: text(props.kind()),
            content_type: text(props.content_type()),
            delivery_mode: props.delivery_mode().unwrap_or(0),
            timestamp: props.timestamp().unwrap_or(0),
            app_id: text(props.app_id()),
            headers: props
                .headers()
                .as_ref()
                .map(|table| {
                    table
                        .inner()
                        .iter()
                        .map(|(key, value)| (key.to_string(), value.clone()))
                        .collect()
                })
                .unwrap_or_default(),
            body: delivery.data.clone(),
            routing_key: delivery.routing_key.to_string(),
            arrived: std::time::Instant::now(),
        }
    }
}

/// RabbitMQ with an exchange (topic, durable) of this test and a temporary queue bound to
/// it, consumed from the start.
pub struct TestBroker {
    /// Connection URL.
    pub url: String,
    /// The test's exchange.
    pub exchange: String,
    connection: Connection,
    tap: Tap,
    received: Arc<Mutex<Vec<Received>>>,
}

impl TestBroker {
    /// Declares the exchange and a queue bound with `binding` (e.g. `"#"`), and starts
    /// consuming.
    pub async fn new(binding: &str) -> Self {
        let url = std::env::var("OUTBOX_TEST_AMQP_URL")
            .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
        let connection = Connection::connect(&url, ConnectionProperties::default())
            .await
            .unwrap_or_else(|error| {
                panic!(
                    "RabbitMQ is not reachable at {url}: {error}; start it with \
                     `rabbitmq-server -detached` or point OUTBOX_TEST_AMQP_URL at one"
                )
            });
        let channel = connection.create_channel().await.expect("channel");
        let exchange = unique_name("e2e.exchange");
        declare_topic_exchange(&channel, &exchange)
            .await
            .expect("exchange declared");
        let tap = Tap::open(channel, TapQueue::Temporary, &exchange, binding)
            .await
            .expect("queue declared and bound");
        let mut consumer = tap.consume("e2e").await.expect("consuming");
        let received: Arc<Mutex<Vec<Received>>> = Arc::default();
        let recording = Arc::clone(&received);
        actix_rt::spawn(async move {
            while let Some(Ok(delivery)) = consumer.next().await {
                recording.lock().unwrap().push(Received::from(&delivery));
            }
        });
        Self {
            url,
            exchange,
            connection,
            tap,
            received,
        }
    }

    /// Binds the test's queue with one more key.
    pub async fn bind(&self, binding: &str) {
        self.tap
            .bind(&self.exchange, binding)
            .await
            .expect("queue bound");
    }

    /// Everything received so far, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// Waits until at least `count` messages arrived.
    pub async fn wait_for(&self, count: usize, deadline: Duration) -> Vec<Received> {
        crate::eventually(&format!("{count} deliveries"), deadline, || async {
            self.received.lock().unwrap().len() >= count
        })
        .await;
        self.received()
    }

    /// Waits (at most `deadline`) until each of `events` has arrived at least once, and
    /// returns every delivery so far; on time-out it returns what arrived, so the caller's
    /// check names what is missing. Not a count of deliveries: duplicates (after a crash or
    /// a retry) could make up a count while the last events are still on their way.
    pub async fn wait_for_each(
        &self,
        events: &[outbox_store::NewEvent],
        deadline: Duration,
    ) -> Vec<Received> {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            let received = self.received();
            let arrived: std::collections::HashSet<&str> =
                received.iter().map(|r| r.message_id.as_str()).collect();
            let all = events.iter().all(|e| arrived.contains(e.event_id.as_str()));
            if all || tokio::time::Instant::now() >= until {
                return received;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Deletes the exchange (the queue goes with the connection) and closes the connection.
    pub async fn close(self) {
        let _ = delete_exchange(self.tap.channel(), &self.exchange).await;
        self.tap.close().await;
        let _ = self.connection.close(200, "done".into()).await;
    }
}
