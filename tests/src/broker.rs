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
    tap: Option<Tap>,
    received: Arc<Mutex<Vec<Received>>>,
    /// Why the consumer stopped, if it did: every read of [`TestBroker::received`] fails
    /// with it, so a dead consumer never reads as "nothing arrived".
    failed: Arc<Mutex<Option<String>>>,
    /// Set once [`TestBroker::close`] ran; until then, dropping deletes the exchange.
    closed: bool,
}

/// How long the queue must stay quiet before [`TestBroker::drain`] calls it settled: well
/// above the time a confirmed message takes to reach the test's consumer.
pub const SETTLE: Duration = Duration::from_secs(1);

impl TestBroker {
    /// Declares the exchange and a queue bound with `binding` (e.g. `"#"`), and starts
    /// consuming.
    pub async fn new(binding: &str) -> Self {
        let url = crate::services::amqp_url();
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
        let failed: Arc<Mutex<Option<String>>> = Arc::default();
        let (recording, failing) = (Arc::clone(&received), Arc::clone(&failed));
        actix_rt::spawn(async move {
            let why = loop {
                match consumer.next().await {
                    Some(Ok(delivery)) => {
                        recording.lock().unwrap().push(Received::from(&delivery));
                    }
                    Some(Err(error)) => break format!("the test's consumer failed: {error}"),
                    None => break "the test's consumer stopped (its channel closed)".to_owned(),
                }
            };
            *failing.lock().unwrap() = Some(why);
        });
        Self {
            url,
            exchange,
            connection,
            tap: Some(tap),
            received,
            failed,
            closed: false,
        }
    }

    /// Binds the test's queue with one more key.
    pub async fn bind(&self, binding: &str) {
        self.tap()
            .bind(&self.exchange, binding)
            .await
            .expect("queue bound");
    }

    fn tap(&self) -> &Tap {
        self.tap.as_ref().expect("the broker is open")
    }

    /// Deletes the test's exchange (its bindings go with it), as an operator might.
    pub async fn delete_exchange(&self) {
        delete_exchange(self.tap().channel(), &self.exchange)
            .await
            .expect("exchange deleted");
    }

    /// Whether the test's exchange exists (a passive declare on a channel of its own, since
    /// a failed one closes its channel).
    pub async fn exchange_exists(&self) -> bool {
        let channel = self.connection.create_channel().await.expect("channel");
        let options = lapin::options::ExchangeDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let exists = channel
            .exchange_declare(
                self.exchange.as_str().into(),
                lapin::ExchangeKind::Topic,
                options,
                Default::default(),
            )
            .await
            .is_ok();
        if exists {
            let _ = channel.close(200, "done".into()).await;
        }
        exists
    }

    /// Everything received so far, in arrival order; panics if the consumer failed.
    pub fn received(&self) -> Vec<Received> {
        if let Some(why) = self.failed.lock().unwrap().as_ref() {
            panic!(
                "{why}; after {} deliveries",
                self.received.lock().unwrap().len()
            );
        }
        self.received.lock().unwrap().clone()
    }

    /// Waits until at least `count` messages arrived.
    pub async fn wait_for(&self, count: usize, deadline: Duration) -> Vec<Received> {
        crate::eventually(&format!("{count} deliveries"), deadline, || async {
            self.received().len() >= count
        })
        .await;
        self.received()
    }

    /// Waits until nothing more arrives for [`SETTLE`] (at most `deadline`), and returns
    /// every delivery: what a count of duplicates must look at, since a duplicate can
    /// arrive after the count reached the number of events.
    pub async fn drain(&self, deadline: Duration) -> Vec<Received> {
        let until = tokio::time::Instant::now() + deadline;
        let mut seen = self.received().len();
        let mut quiet_since = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let now = self.received().len();
            if now != seen {
                seen = now;
                quiet_since = tokio::time::Instant::now();
            } else if quiet_since.elapsed() >= SETTLE {
                return self.received();
            }
            assert!(
                tokio::time::Instant::now() < until,
                "the queue did not settle within {deadline:?} ({seen} deliveries)"
            );
        }
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
    pub async fn close(mut self) {
        let tap = self.tap.take().expect("the broker is open");
        let _ = delete_exchange(tap.channel(), &self.exchange).await;
        tap.close().await;
        let _ = self.connection.close(200, "done".into()).await;
        self.closed = true;
    }
}

impl Drop for TestBroker {
    /// Teardown after a failed test: deletes the exchange on a connection of its own, off
    /// the test's runtime, bounded; logs instead of panicking.
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        let (url, exchange) = (self.url.clone(), self.exchange.clone());
        crate::services::cleanup_off_runtime(format!("exchange {exchange}"), move || async move {
            let connection = Connection::connect(&url, ConnectionProperties::default())
                .await
                .map_err(|error| error.to_string())?;
            let channel = connection
                .create_channel()
                .await
                .map_err(|error| error.to_string())?;
            delete_exchange(&channel, &exchange)
                .await
                .map_err(|error| error.to_string())?;
            connection
                .close(200, "teardown".into())
                .await
                .map_err(|error| error.to_string())
        });
    }
}

/// A RabbitMQ user of its own on `/`, deleted on drop: for what the broker's permissions
/// allow a relay (set with [`rabbitmqctl`]).
pub struct BrokerUser {
    /// Its name.
    pub name: String,
    password: String,
}

impl BrokerUser {
    /// A user with `password` that may configure, write and read what the three patterns
    /// match (`set_permissions`: `".*"` is everything).
    pub fn with_permissions(password: &str, configure: &str, write: &str, read: &str) -> Self {
        let name = unique_name("e2e_user");
        rabbitmqctl(&["add_user", &name, password]);
        rabbitmqctl(&["set_permissions", "-p", "/", &name, configure, write, read]);
        Self {
            name,
            password: password.to_owned(),
        }
    }

    /// A user with `password` that may configure and read everything on `/` and write to
    /// `exchange` only.
    pub fn writing_only_to(password: &str, exchange: &str) -> Self {
        let write = format!("^{}$", exchange.replace('.', "\\."));
        Self::with_permissions(password, ".*", &write, ".*")
    }

    /// A user with `password` allowed everything on `/`.
    pub fn new(password: &str) -> Self {
        Self::with_permissions(password, ".*", ".*", ".*")
    }

    /// `broker`'s URL with this user and no password.
    pub fn url(&self, broker: &TestBroker) -> String {
        let mut url = url::Url::parse(&broker.url).expect("a URL");
        url.set_password(None).expect("a host");
        url.set_username(&self.name).expect("a host");
        url.into()
    }

    /// `broker`'s URL with this user and its password.
    pub fn url_with_password(&self, broker: &TestBroker) -> String {
        let mut url = url::Url::parse(&self.url(broker)).expect("a URL");
        url.set_password(Some(&self.password)).expect("a host");
        url.into()
    }
}

impl Drop for BrokerUser {
    fn drop(&mut self) {
        rabbitmqctl(&["delete_user", &self.name]);
    }
}

/// Runs `rabbitmqctl` with `args` on the test broker
/// ([`crate::services::rabbitmqctl_command`]); its standard output. Fails the test, with
/// its output, when it fails.
pub fn rabbitmqctl(args: &[&str]) -> String {
    use crate::OutputInTime as _;
    crate::services::rabbitmqctl_command()
        .args(args)
        .succeeds("RabbitMQ's tools on the PATH, or OUTBOX_TEST_RABBITMQCTL")
}
