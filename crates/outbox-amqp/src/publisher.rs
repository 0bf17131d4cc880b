//! [`AmqpPublisher`]: the [`EventPublisher`] port on one confirm channel.

use crate::broker::{ConfirmChannel, Link, Routing};
use crate::confirms::Confirms;
use crate::message::{check_body, check_header_frame, outbox_properties, oversized, OutboxLabels};
use crate::pacing::Pacing;
use crate::span::PublishSpan;
use async_trait::async_trait;
use lapin::options::BasicPublishOptions;
use lapin::{Channel, Confirmation};
use outbox_core::routing::EventFields;
use outbox_core::{Confirm, EventPublisher, OutboxRecord, PublishError};
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::Poll;
use tokio::sync::Mutex;

/// How long closing a channel may take before it is abandoned.
pub(crate) const CLOSE_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(500);

/// One confirm-mode channel. Publishes are pipelined: [`EventPublisher::publish`] returns
/// once the message is handed to the channel, and the returned future awaits the confirm.
/// A channel that closed (a channel error, or the connection lost) is replaced by a new
/// one from the link on the next publish; only this publisher's channel is affected.
/// Confirms are read through the channel's [`Confirms`], which matches each
/// `basic.return` to its own message (docs/design/publishing.md#returns.
#[derive(Debug)]
pub struct AmqpPublisher {
    channel: Mutex<Option<Arc<Open>>>,
    link: Arc<Link>,
    /// Where its outbox's messages go, and the header of their ordering key.
    routing: Arc<Routing>,
    /// Slower while the broker nacks.
    pacing: Arc<Pacing>,
}

/// An open confirm channel and its confirms, shared by the publishes on it (one `Arc`
/// to clone per publish: a lapin `Channel`'s clone is a dozen).
#[derive(Debug)]
struct Open {
    channel: Channel,
    confirms: Confirms,
    /// Its connection's `frame_max`, which a message's properties must fit in.
    frame_max: u32,
    /// Its connection's number: a channel on a connection the link dropped as dead is
    /// replaced even while it still looks open.
    generation: u64,
}

impl From<ConfirmChannel> for Open {
    fn from(opened: ConfirmChannel) -> Self {
        Self {
            channel: opened.channel,
            confirms: Confirms::default(),
            frame_max: opened.frame_max,
            generation: opened.generation,
        }
    }
}

impl AmqpPublisher {
    pub(crate) fn new(opened: ConfirmChannel, link: Arc<Link>, routing: Arc<Routing>) -> Self {
        Self {
            channel: Mutex::new(Some(Arc::new(Open::from(opened)))),
            link,
            routing,
            pacing: Arc::default(),
        }
    }

    /// The open channel and its confirms, or a new one.
    async fn channel(&self) -> Result<Arc<Open>, PublishError> {
        let mut slot = self.channel.lock().await;
        // Nacks in a row: a new channel, the old one closed once its publishes settle.
        if self.pacing.take_stale() {
            if let Some(old) = slot.take() {
                retire(
                    old,
                    self.link.settings().publish_timeout,
                    self.link.close_timeout(),
                );
            }
        }
        if let Some(open) = slot.as_ref().filter(|open| {
            open.channel.status().connected() && open.generation == self.link.generation()
        }) {
            return Ok(Arc::clone(open));
        }
        *slot = None;
        // Boxed, as rare: its futures would otherwise add their size to every publish's.
        let opened = Box::pin(self.link.confirm_channel())
            .await
            .map_err(|error| PublishError::Channel(error.to_string()))?;
        let open = Arc::new(Open::from(opened));
        *slot = Some(Arc::clone(&open));
        Ok(open)
    }
}

/// Closes a channel replaced after nacks in a row once the publishes in flight on it have
/// their confirms (at most `settle`), so that none of them is failed by the close.
fn retire(old: Arc<Open>, settle: std::time::Duration, close_timeout: std::time::Duration) {
    tokio::spawn(async move {
        let until = tokio::time::Instant::now() + settle;
        while Arc::strong_count(&old) > 1 && tokio::time::Instant::now() < until {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let closing = old
            .channel
            .close(200, "replaced after nacks in a row".into());
        let _ = tokio::time::timeout(close_timeout, closing).await;
    });
}

/// A publish's `publish_timeout`, running only while the broker does not block publishers.
type Clock = Pin<Box<dyn Future<Output = ()> + Send>>;

/// `step`'s output, or a timeout when `clock` runs out first (`step` is polled first).
/// `step` stays where its caller pinned it: a step moved into a future of its own was
/// copied each time, and lapin's hand-off future alone is about a kilobyte.
fn within<'a, F: Future + ?Sized>(
    clock: &'a mut Clock,
    timeout: std::time::Duration,
    mut step: Pin<&'a mut F>,
) -> impl Future<Output = Result<F::Output, PublishError>> + 'a {
    std::future::poll_fn(move |cx| {
        if let Poll::Ready(done) = step.as_mut().poll(cx) {
            return Poll::Ready(Ok(done));
        }
        clock
            .as_mut()
            .poll(cx)
            .map(|()| Err(PublishError::Timeout(timeout)))
    })
}

fn channel_error(error: lapin::Error) -> PublishError {
    PublishError::Channel(error.to_string())
}

/// The broker closed the channel over `exchange` itself, naming it: it is missing
/// (NOT_FOUND: deleted since it was checked) or this user may not write to it
/// (ACCESS_REFUSED: the broker's permissions). The event's own failure, counted as an
/// attempt (`no_exchange`), since retrying it as an outage would keep it pending for ever
/// while its channel is closed again at every try. `None` for any other channel error:
/// the other publishes on a channel lose it through no fault of theirs.
fn refused_exchange(text: &str, exchange: &str) -> Option<PublishError> {
    let refusal = text.contains("NOT_FOUND") || text.contains("ACCESS_REFUSED");
    (refusal && text.contains(&format!("exchange '{exchange}'"))).then(|| {
        PublishError::NoExchange {
            exchange: exchange.to_owned(),
            detail: text.to_owned(),
        }
    })
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
                key: &record.key,
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
        // Nor to a broker that is away: the publish waits for it before its clock starts,
        // so an outage fails no event and costs none an attempt (outage.rs).
        self.link.reachable().await;
        // Nor at full speed into a broker that nacks (its backpressure): the publish waits
        // out the channel's pause, before its clock starts too; nor many at once into a
        // broker that let a publish time out and has confirmed nothing since (pacing.rs).
        let probe = self.pacing.ready().await;
        let generation = self.link.generation();
        let mut clock: Clock = Box::pin(self.link.blocking().clock(timeout));
        within(
            &mut clock,
            timeout,
            pin!(self.link.verify_exchange(exchange, &routing.exchange_type)),
        )
        .await??;
        let labels = OutboxLabels {
            key_header: &routing.key_header,
            content_type: routing.content_type.as_deref(),
            extra: &routing.extra,
        };
        let properties = outbox_properties(record, &settings.message, &labels)?;
        let (properties, span) = PublishSpan::start(record, exchange, &routing_key, properties);
        let handed_off = async {
            let open = within(&mut clock, timeout, pin!(self.channel())).await??;
            // Refused before anything is written: the broker would close the connection.
            check_header_frame(&properties, open.frame_max)?;
            // Held until lapin wrote the body: at most HANDOFF_BYTES queued there, so a
            // large body is not held twice for every record in flight (handoff.rs).
            let _queued = within(
                &mut clock,
                timeout,
                pin!(self.link.handoff().room_for(record.envelope.len())),
            )
            .await?;
            let options = BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            };
            let ticket = open.confirms.begin();
            let confirm = {
                let handed_off = pin!(open.channel.basic_publish(
                    exchange.into(),
                    routing_key.as_str().into(),
                    options,
                    &record.envelope,
                    properties,
                ));
                within(&mut clock, timeout, handed_off)
                    .await?
                    .map_err(channel_error)?
            };
            Ok((ticket.handed(confirm, &record.event_id), open))
        };
        let (confirm, open) = match handed_off.await {
            Ok(handed) => handed,
            Err(error) => {
                // Refused over its size while still being handed off: its own failure.
                let error = match &error {
                    PublishError::Channel(text) => {
                        oversized(text, record.envelope.len()).unwrap_or(error)
                    }
                    _ => error,
                };
                if matches!(error, PublishError::Channel(_)) {
                    self.link.outage().lost_one();
                }
                // Not even handed to the connection in time: it may have stopped answering.
                if matches!(error, PublishError::Timeout(_)) {
                    self.pacing.timed_out();
                    self.link.timed_out(generation).await;
                }
                span.end(Err(&error));
                return Err(error);
            }
        };
        let exchange = exchange.to_owned();
        let link = Arc::clone(&self.link);
        let pacing = Arc::clone(&self.pacing);
        let event_id = record.event_id.clone();
        let body_bytes = record.envelope.len();
        Ok(Box::pin(async move {
            let outcome = match within(&mut clock, timeout, pin!(confirm)).await {
                Err(timed_out) => Err(timed_out),
                Ok(Err(error)) => {
                    let text = error.to_string();
                    // A missing exchange is checked again at its next publish.
                    if text.contains("NOT_FOUND") {
                        link.forget_exchange(&exchange);
                    }
                    match refused_exchange(&text, &exchange)
                        .or_else(|| oversized(&text, body_bytes))
                    {
                        Some(refused) => Err(refused),
                        None => {
                            link.outage().lost_one();
                            Err(channel_error(error))
                        }
                    }
                }
                // With `mandatory`, an unroutable message comes back before its ack,
                // perhaps with another message's confirm: decided once every confirm that
                // could carry it has been read ([`Confirms::settle`]).
                Ok(Ok(Confirmation::Ack(_))) => {
                    let settled = open.confirms.settle(&open.channel, &event_id);
                    match within(&mut clock, timeout, pin!(settled)).await {
                        Err(timed_out) => Err(timed_out),
                        Ok(false) => Ok(()),
                        Ok(true) => Err(PublishError::Unroutable {
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
            match &outcome {
                Err(PublishError::Timeout(_)) => {
                    pacing.timed_out();
                    link.timed_out(open.generation).await
                }
                Err(PublishError::Nacked { .. }) => {
                    pacing.nacked(tokio::time::Instant::now());
                    link.confirmed(open.generation)
                }
                Ok(()) | Err(PublishError::Unroutable { .. }) => {
                    pacing.acked();
                    link.confirmed(open.generation)
                }
                Err(_) => {}
            }
            span.end(outcome.as_ref().map(|_| ()));
            // A probe of a channel in doubt ends with its outcome, not before.
            drop(probe);
            outcome
        }))
    }

    async fn close(&self) {
        if let Some(open) = self.channel.lock().await.take() {
            // A stalled broker never answers the close: do not let it hold up shutdown.
            let closing = open.channel.close(200, "publisher stopping".into());
            let _ = tokio::time::timeout(self.link.close_timeout(), closing).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::refused_exchange;
    use outbox_core::PublishError;

    #[test]
    fn a_channel_closed_over_the_exchange_itself_is_the_events_failure() {
        for text in [
            "protocol error: AMQPError { kind: Soft(NOTFOUND), message: \"NOT_FOUND - no exchange 'rooms.x' in vhost '/'\" }",
            "protocol error: AMQPError { kind: Soft(ACCESSREFUSED), message: \"ACCESS_REFUSED - write access to exchange 'rooms.x' in vhost '/' refused for user 'relay'\" }",
        ] {
            let refused = refused_exchange(text, "rooms.x");
            assert!(
                matches!(&refused, Some(PublishError::NoExchange { exchange, detail })
                    if exchange == "rooms.x" && detail == text),
                "{refused:?}"
            );
            assert!(refused.is_some_and(|error| error.counts_as_attempt()));
        }
    }

    #[test]
    fn another_channel_error_is_nobodys_fault() {
        for (text, exchange) in [
            (
                "ACCESS_REFUSED - write access to exchange 'other' in vhost '/' refused",
                "rooms.x",
            ),
            ("connection reset by peer", "rooms.x"),
            ("PRECONDITION_FAILED - unknown delivery tag 7", "rooms.x"),
        ] {
            assert!(refused_exchange(text, exchange).is_none(), "{text}");
        }
    }
}
