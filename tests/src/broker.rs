//! A fresh exchange and a queue bound to it per test, with a consumer that records
//! everything it receives.

use crate::unique_name;
use futures_lite::StreamExt;
use lapin::options::{
    BasicConsumeOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
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

/// RabbitMQ with an exchange (topic, durable) and one queue of this test.
pub struct TestBroker {
    /// Connection URL.
    pub url: String,
    /// The test's exchange.
    pub exchange: String,
    /// The test's queue, bound to the exchange.
    pub queue: String,
    connection: Connection,
    channel: Channel,
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
        let queue = unique_name("e2e.queue");
        channel
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("exchange declared");
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions {
                    exclusive: true,
                    auto_delete: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("queue declared");
        let broker = Self {
            url,
            exchange,
            queue,
            connection,
            channel,
            received: Arc::default(),
        };
        broker.bind(binding).await;
        broker.consume().await;
        broker
    }

    /// Binds the test's queue with one more key.
    pub async fn bind(&self, binding: &str) {
        self.channel
            .queue_bind(
                self.queue.as_str().into(),
                self.exchange.as_str().into(),
                binding.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("queue bound");
    }

    async fn consume(&self) {
        let mut consumer = self
            .channel
            .basic_consume(
                self.queue.as_str().into(),
                "e2e".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("consuming");
        let received = Arc::clone(&self.received);
        actix_rt::spawn(async move {
            while let Some(Ok(delivery)) = consumer.next().await {
                let props = &delivery.properties;
                let text = |value: &Option<lapin::types::ShortString>| {
                    value.as_ref().map(ToString::to_string).unwrap_or_default()
                };
                received.lock().unwrap().push(Received {
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
                });
            }
        });
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

    /// Deletes the exchange and closes the connection.
    pub async fn close(self) {
        let _ = self
            .channel
            .exchange_delete(
                self.exchange.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await;
        let _ = self.channel.close(200, "done".into()).await;
        let _ = self.connection.close(200, "done".into()).await;
    }
}
