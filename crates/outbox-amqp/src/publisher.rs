//! [`AmqpPublisher`]: the [`EventPublisher`] port on one confirm channel.

use crate::broker::{Link, Routing};
use crate::message::{check_body, outbox_properties, OutboxLabels};
use crate::span::PublishSpan;
use async_trait::async_trait;
use lapin::options::BasicPublishOptions;
use lapin::{Channel, Confirmation};
use outbox_core::routing::EventFields;
use outbox_core::{Confirm, EventPublisher, OutboxRecord, PublishError};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::Mutex;

/// How long closing a channel may take before it is abandoned.
pub(crate) const CLOSE_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(500);

/// One confirm-mode channel. Publishes are pipelined: [`EventPublisher::publish`] returns
/// once the message is handed to the channel, and the returned future awaits the confirm.
/// A channel that closed (a channel error, or the connection lost) is replaced by a new
/// one from the link on the next publish; only this publisher's channel is affected.
#[derive(Debug)]
pub struct AmqpPublisher {
    channel: Mutex<Option<Channel>>,
    link: Arc<Link>,
    /// Where its outbox's messages go, and the header of their ordering key.
    routing: Arc<Routing>,
    /// The message ids of returned (unroutable) messages whose own confirm has not been
    /// seen yet ([`Returns`]).
    returns: Arc<Returns>,
}

/// Returned messages, matched to their publishes by message id (the event id).
///
/// With `mandatory`, RabbitMQ sends a message's `basic.return` before its `basic.ack`, but
/// one ack may confirm several messages (`multiple`), and a return carries no delivery
/// tag: lapin (4.12) hands the waiting return to the first confirm it resolves, and it
/// resolves an ack's confirms in no particular order (a hash map's), so the return often
/// comes with another message's confirm. Taken as it came, that message failed as
/// unroutable (and went out again, or dead with `max_attempts`). So every return is noted
/// here by its message id, and a publish is unroutable only when its own id was returned:
/// a routable message is never failed for another's return. Still open: the unroutable
/// message's own bare ack may be read before the confirm that carries its return, and then
/// it counts as published (docs/design.md#publishing, "Returns").
#[derive(Debug, Default)]
struct Returns {
    ids: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Returns {
    /// Most returns noted at once; beyond, the oldest notes are dropped (a note whose
    /// publish had already been decided would otherwise stay for good).
    const MAX: usize = 10_000;

    /// Notes `returned` (if any) and says whether `own` was returned.
    fn returned(&self, own: &str, returned: Option<&lapin::message::BasicReturnMessage>) -> bool {
        let mut ids = self
            .ids
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(message) = returned {
            match message.delivery.properties.message_id() {
                Some(id) => {
                    if ids.len() >= Self::MAX {
                        ids.clear();
                    }
                    ids.insert(id.to_string());
                }
                // Not one of ours (every relayed message has an id): as lapin says.
                None => return true,
            }
        }
        ids.remove(own)
    }
}

impl AmqpPublisher {
    pub(crate) fn new(channel: Channel, link: Arc<Link>, routing: Arc<Routing>) -> Self {
        Self {
            channel: Mutex::new(Some(channel)),
            link,
            routing,
            returns: Arc::default(),
        }
    }

    /// The open channel, or a new one.
    async fn channel(&self) -> Result<Channel, PublishError> {
        let mut slot = self.channel.lock().await;
        if let Some(channel) = slot.as_ref().filter(|channel| channel.status().connected()) {
            return Ok(channel.clone());
        }
        *slot = None;
        let channel = self
            .link
            .confirm_channel()
            .await
            .map_err(|error| PublishError::Channel(error.to_string()))?;
        *slot = Some(channel.clone());
        Ok(channel)
    }
}

/// A publish's `publish_timeout`, running only while the broker does not block publishers.
type Clock = Pin<Box<dyn Future<Output = ()> + Send>>;

/// `step`'s output, or a timeout when `clock` runs out first.
async fn within<T>(
    clock: &mut Clock,
    timeout: std::time::Duration,
    step: impl Future<Output = T>,
) -> Result<T, PublishError> {
    tokio::select! {
        biased;
        done = step => Ok(done),
        () = clock => Err(PublishError::Timeout(timeout)),
    }
}

fn channel_error(error: lapin::Error) -> PublishError {
    PublishError::Channel(error.to_string())
}

#[async_trait]
impl EventPublisher for AmqpPublisher {
    async fn publish(&self, record: &OutboxRecord) -> Result<Confirm, PublishError> {
        let settings = self.link.settings();
        let timeout = settings.publish_timeout;
        let routing = Arc::clone(&self.routing);
        let (exchange, routing_key) = {
            let column = |name: &str| routing.extra.text(record, name);
            let fields = EventFields {
                event_type: &record.event_type,
                key: &record.room_id,
                column: &column,
            };
            routing
                .router
                .route_fields(&fields)
                .map_err(|error| PublishError::Invalid(error.to_string()))?
        };
        let exchange = exchange.as_str();
        check_body(record.envelope.len(), settings.message.max_body_bytes)?;
        // Nothing new goes to a broker that blocks publishers (a resource alarm): it would
        // only be held there. Then one clock for hand-off and confirm, standing still while
        // the broker blocks, so a held publish is neither timed out nor published twice;
        // a broker that stops answering otherwise fails the publish as before.
        self.link.blocking().unblocked().await;
        let mut clock: Clock = Box::pin(self.link.blocking().clock(timeout));
        within(
            &mut clock,
            timeout,
            self.link.verify_exchange(exchange, &routing.exchange_type),
        )
        .await?
        .map_err(PublishError::Channel)?;
        let labels = OutboxLabels {
            key_header: &routing.key_header,
            content_type: routing.content_type.as_deref(),
            extra: &routing.extra,
        };
        let properties = outbox_properties(record, &settings.message, &labels)?;
        let (properties, span) = PublishSpan::start(record, exchange, &routing_key, properties);
        let handed_off = async {
            let channel = within(&mut clock, timeout, self.channel()).await??;
            // Held until lapin wrote the body: at most HANDOFF_BYTES queued there, so a
            // large body is not held twice for every record in flight (handoff.rs).
            let _queued = within(
                &mut clock,
                timeout,
                self.link.handoff().room_for(record.envelope.len()),
            )
            .await?;
            let options = BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            };
            let handed_off = channel.basic_publish(
                exchange.into(),
                routing_key.as_str().into(),
                options,
                &record.envelope,
                properties,
            );
            within(&mut clock, timeout, handed_off)
                .await?
                .map_err(channel_error)
        };
        let confirm = match handed_off.await {
            Ok(confirm) => confirm,
            Err(error) => {
                span.end(Err(&error));
                return Err(error);
            }
        };
        let exchange = exchange.to_owned();
        let link = Arc::clone(&self.link);
        let returns = Arc::clone(&self.returns);
        let event_id = record.event_id.clone();
        Ok(Box::pin(async move {
            let outcome = match within(&mut clock, timeout, confirm).await {
                Err(timed_out) => Err(timed_out),
                Ok(Err(error)) => {
                    if error.to_string().contains("NOT_FOUND") {
                        link.forget_exchange(&exchange);
                    }
                    Err(channel_error(error))
                }
                // With `mandatory`, an unroutable message comes back before its ack; the
                // return may arrive with another message's confirm ([`Returns`]).
                Ok(Ok(Confirmation::Ack(returned))) => {
                    if returned.is_none() {
                        // Let the confirms this ack resolved beside ours be read first: one
                        // of them may carry our return.
                        tokio::task::yield_now().await;
                    }
                    match returns.returned(&event_id, returned.as_ref()) {
                        false => Ok(()),
                        true => Err(PublishError::Unroutable {
                            exchange,
                            routing_key,
                        }),
                    }
                }
                Ok(Ok(Confirmation::Nack(_))) => Err(PublishError::Nacked {
                    exchange,
                    routing_key,
                }),
                Ok(Ok(Confirmation::NotRequested)) => Err(PublishError::Channel(
                    "the channel is not in confirm mode".into(),
                )),
            };
            span.end(outcome.as_ref().map(|_| ()));
            outcome
        }))
    }

    async fn close(&self) {
        if let Some(channel) = self.channel.lock().await.take() {
            // A stalled broker never answers the close: do not let it hold up shutdown.
            let closing = channel.close(200, "publisher stopping".into());
            let _ = tokio::time::timeout(self.link.close_timeout(), closing).await;
        }
    }
}
