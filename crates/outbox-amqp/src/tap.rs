//! A queue of one's own bound to the relay's exchanges, for reading what it publishes: the
//! demo, the room service example, the benchmark's consumer and the end-to-end tests.

use lapin::options::{
    BasicConsumeOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Consumer, ExchangeKind};

/// Which queue a [`Tap`] declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TapQueue {
    /// A server-named, exclusive, auto-deleted queue: it goes away with its connection.
    Temporary,
    /// A durable queue of this name, for a reader that needs to know the name or that
    /// binds in one process and reads in another; [`Tap::delete`] removes it.
    Durable(String),
    /// A durable quorum queue of this name (`x-queue-type: quorum`), replicated over a
    /// cluster's nodes; otherwise as [`TapQueue::Durable`]. Its name must be new or already
    /// a quorum queue's: RabbitMQ refuses to declare a queue again as another type.
    Quorum(String),
}

/// A queue bound to exchanges on a channel of its own, read without acknowledgements.
#[derive(Debug)]
pub struct Tap {
    /// Owned, so that [`Tap::close`] closes it before its connection is closed.
    channel: Channel,
    /// The declared (possibly server-chosen) queue name.
    queue: String,
}

impl Tap {
    /// Declares `queue` on `channel` and binds it to `exchange` with `pattern` (`"#"`:
    /// everything a topic exchange routes).
    pub async fn open(
        channel: Channel,
        queue: TapQueue,
        exchange: &str,
        pattern: &str,
    ) -> Result<Self, lapin::Error> {
        let tap = Self::declare(channel, queue).await?;
        tap.bind(exchange, pattern).await?;
        Ok(tap)
    }

    /// Declares `queue` on `channel`, bound to nothing yet.
    pub async fn declare(channel: Channel, queue: TapQueue) -> Result<Self, lapin::Error> {
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        let mut arguments = FieldTable::default();
        let (name, options) = match queue {
            TapQueue::Temporary => (
                String::new(),
                QueueDeclareOptions {
                    exclusive: true,
                    auto_delete: true,
                    ..QueueDeclareOptions::default()
                },
            ),
            TapQueue::Durable(name) => (name, durable),
            // Never exclusive nor auto-deleted: RabbitMQ refuses both for a quorum queue.
            TapQueue::Quorum(name) => {
                arguments.insert(
                    "x-queue-type".into(),
                    AMQPValue::LongString("quorum".into()),
                );
                (name, durable)
            }
        };
        let declared = channel
            .queue_declare(name.into(), options, arguments)
            .await?;
        Ok(Self {
            queue: declared.name().to_string(),
            channel,
        })
    }

    /// Binds the queue to `exchange` with one more `pattern`.
    pub async fn bind(&self, exchange: &str, pattern: &str) -> Result<(), lapin::Error> {
        self.channel
            .queue_bind(
                self.queue.as_str().into(),
                exchange.into(),
                pattern.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
    }

    /// Starts reading the queue: every delivery is acknowledged on arrival (`no_ack`).
    pub async fn consume(&self, tag: &str) -> Result<Consumer, lapin::Error> {
        self.channel
            .basic_consume(
                self.queue.as_str().into(),
                tag.into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.queue
    }

    /// The channel the queue was declared on.
    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    /// Deletes the queue (a durable or quorum one outlives its connection otherwise).
    pub async fn delete(&self) -> Result<(), lapin::Error> {
        delete_queue(&self.channel, &self.queue).await
    }

    /// Closes the tap's channel; call it before closing the connection, which a channel
    /// dropped last would otherwise race with its own background close.
    pub async fn close(self) {
        let _ = self.channel.close(200, "done".into()).await;
    }
}

/// Declares `name` as a durable topic exchange, as the relay does with its defaults, so
/// that a [`Tap`] can be bound before the relay starts and miss nothing.
pub async fn declare_topic_exchange(channel: &Channel, name: &str) -> Result<(), lapin::Error> {
    channel
        .exchange_declare(
            name.into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
}

/// Deletes the queue `name`, e.g. the durable queue of a [`Tap`] in another process.
pub async fn delete_queue(channel: &Channel, name: &str) -> Result<(), lapin::Error> {
    channel
        .queue_delete(name.into(), QueueDeleteOptions::default())
        .await
        .map(drop)
}

/// Deletes the exchange `name`; a test's or a benchmark's exchange is its own.
pub async fn delete_exchange(channel: &Channel, name: &str) -> Result<(), lapin::Error> {
    channel
        .exchange_delete(name.into(), ExchangeDeleteOptions::default())
        .await
}
