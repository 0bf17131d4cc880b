//! [`AmqpPublisher`]: the [`EventPublisher`] port on one confirm channel.

use crate::broker::AmqpSettings;
use crate::message::properties;
use async_trait::async_trait;
use lapin::options::BasicPublishOptions;
use lapin::{Channel, Confirmation};
use outbox_core::{Confirm, EventPublisher, OutboxRecord, PublishError};
use std::sync::Arc;
use tokio::time::{timeout_at, Instant};

/// One confirm-mode channel. Publishes are pipelined: [`EventPublisher::publish`] returns
/// once the message is handed to the channel, and the returned future awaits the confirm.
#[derive(Debug)]
pub struct AmqpPublisher {
    channel: Channel,
    settings: Arc<AmqpSettings>,
}

impl AmqpPublisher {
    pub(crate) fn new(channel: Channel, settings: Arc<AmqpSettings>) -> Self {
        Self { channel, settings }
    }
}

fn channel_error(error: lapin::Error) -> PublishError {
    PublishError::Channel(error.to_string())
}

#[async_trait]
impl EventPublisher for AmqpPublisher {
    async fn publish(&self, record: &OutboxRecord) -> Result<Confirm, PublishError> {
        let timeout = self.settings.publish_timeout;
        // One deadline for hand-off and confirm: a broker that blocks publishers
        // (flow control) fails the publish as surely as one that never confirms.
        let deadline = Instant::now() + timeout;
        let (exchange, routing_key) = self
            .settings
            .router
            .route(&record.event_type, &record.room_id)
            .map_err(|error| PublishError::Invalid(error.to_string()))?;
        let properties = properties(record, &self.settings.message)?;
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let handed_off = self.channel.basic_publish(
            exchange.into(),
            routing_key.as_str().into(),
            options,
            record.envelope.as_bytes(),
            properties,
        );
        let confirm = timeout_at(deadline, handed_off)
            .await
            .map_err(|_| PublishError::Timeout(timeout))?
            .map_err(channel_error)?;
        let exchange = exchange.to_owned();
        Ok(Box::pin(async move {
            match timeout_at(deadline, confirm).await {
                Err(_) => Err(PublishError::Timeout(timeout)),
                Ok(Err(error)) => Err(channel_error(error)),
                // With `mandatory`, an unroutable message comes back as an ack that
                // carries the returned message: only a bare ack is a success.
                Ok(Ok(Confirmation::Ack(None))) => Ok(()),
                Ok(Ok(Confirmation::Ack(Some(_)))) => Err(PublishError::Unroutable {
                    exchange,
                    routing_key,
                }),
                Ok(Ok(Confirmation::Nack(_))) => Err(PublishError::Nacked {
                    exchange,
                    routing_key,
                }),
                Ok(Ok(Confirmation::NotRequested)) => Err(PublishError::Channel(
                    "the channel is not in confirm mode".into(),
                )),
            }
        }))
    }

    async fn close(&self) {
        let _ = self.channel.close(200, "publisher stopping".into()).await;
    }
}
