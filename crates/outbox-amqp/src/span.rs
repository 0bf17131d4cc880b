//! [`PublishSpan`]: the OpenTelemetry producer span of one published event
//! (docs/design/observability.md#tracing), when the `otel` feature is on and [`enable`] was called.
//!
//! The span follows OTel's messaging conventions (a `PRODUCER` span named
//! `publish <exchange>`), is parented to the row's `traceparent`/`tracestate` when its
//! headers carry one, and its own context replaces them in the message's headers, so a
//! consumer continues from the relay's span and the producer's stays its parent. It ends
//! when the broker confirms or the publish fails. Without the feature, or before
//! [`enable`], a [`PublishSpan`] is nothing and costs nothing.

use lapin::BasicProperties;
use outbox_core::{OutboxRecord, PublishError};

#[cfg(feature = "otel")]
pub use enabled::{enable, PublishSpan};

#[cfg(not(feature = "otel"))]
pub use disabled::PublishSpan;

#[cfg(not(feature = "otel"))]
mod disabled {
    use super::*;

    /// No span: this build has no OpenTelemetry.
    #[derive(Debug)]
    pub struct PublishSpan;

    impl PublishSpan {
        /// `properties` unchanged, and no span.
        pub fn start(
            _record: &OutboxRecord,
            _exchange: &str,
            _routing_key: &str,
            properties: BasicProperties,
        ) -> (BasicProperties, Self) {
            (properties, Self)
        }

        /// Nothing to record.
        pub fn end(self, _outcome: Result<(), &PublishError>) {}
    }
}

#[cfg(feature = "otel")]
mod enabled {
    use super::*;
    use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
    use opentelemetry::global::{self, BoxedTracer};
    use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
    use opentelemetry::trace::{SpanKind, Status, TraceContextExt as _, Tracer as _};
    use opentelemetry::{Context, KeyValue};
    use outbox_core::trace::TRACEPARENT;
    use std::sync::OnceLock;

    /// The tracer of every publish span and the propagator that reads and writes trace
    /// context in headers; unset (no spans) until [`enable`].
    static TRACING: OnceLock<(BoxedTracer, Box<dyn TextMapPropagator + Send + Sync>)> =
        OnceLock::new();

    /// Makes every publisher of this process start a span per message, from the global
    /// tracer provider (which the caller has installed), reading and writing trace
    /// context with `propagator` (W3C trace context). Later calls change nothing.
    pub fn enable(propagator: impl TextMapPropagator + Send + Sync + 'static) {
        let _ = TRACING.get_or_init(|| (global::tracer("outbox-relay"), Box::new(propagator)));
    }

    /// The span of one message, from hand-off to confirm, in the context that holds it;
    /// `None` when spans are off.
    #[derive(Debug)]
    pub struct PublishSpan(Option<Context>);

    impl PublishSpan {
        /// Starts the span of `record` and returns `properties` with its context in the
        /// headers (`traceparent`, and `tracestate` when there is one).
        pub fn start(
            record: &OutboxRecord,
            exchange: &str,
            routing_key: &str,
            properties: BasicProperties,
        ) -> (BasicProperties, Self) {
            let Some((tracer, propagator)) = TRACING.get() else {
                return (properties, Self(None));
            };
            let mut headers = properties.headers().clone().unwrap_or_default();
            // Most rows carry no trace context: no parse for them.
            let parent = match headers.contains_key(TRACEPARENT) {
                true => propagator.extract(&HeaderReader(&headers)),
                false => Context::new(),
            };
            // The default exchange has no name; the conventions call it `amq.default`.
            let destination = if exchange.is_empty() {
                "amq.default"
            } else {
                exchange
            };
            let span = tracer
                .span_builder(format!("publish {destination}"))
                .with_kind(SpanKind::Producer)
                .with_attributes([
                    KeyValue::new("messaging.system", "rabbitmq"),
                    KeyValue::new("messaging.operation.name", "publish"),
                    KeyValue::new("messaging.operation.type", "send"),
                    KeyValue::new("messaging.destination.name", destination.to_owned()),
                    KeyValue::new(
                        "messaging.rabbitmq.destination.routing_key",
                        routing_key.to_owned(),
                    ),
                    KeyValue::new("messaging.message.id", record.event_id.clone()),
                    KeyValue::new(
                        "messaging.message.body.size",
                        i64::try_from(record.envelope.len()).unwrap_or(i64::MAX),
                    ),
                    KeyValue::new("outbox.row_id", record.id),
                    KeyValue::new("outbox.retry_count", i64::from(record.retry_count)),
                    KeyValue::new("outbox.event_type", record.event_type.clone()),
                ])
                .start_with_context(tracer, &parent);
            let context = parent.with_span(span);
            propagator.inject_context(&context, &mut HeaderWriter(&mut headers));
            (properties.with_headers(headers), Self(Some(context)))
        }

        /// Ends the span: `Ok` when the broker confirmed, else the error's kind and text.
        pub fn end(self, outcome: Result<(), &PublishError>) {
            let Some(context) = self.0 else { return };
            let span = context.span();
            match outcome {
                Ok(()) => span.set_status(Status::Ok),
                Err(error) => {
                    span.set_attribute(KeyValue::new("error.type", error_type(error)));
                    span.set_status(Status::error(error.to_string()));
                }
            }
            span.end();
        }
    }

    /// `error.type` of a failed publish (low cardinality).
    fn error_type(error: &PublishError) -> &'static str {
        error.reason()
    }

    /// A message's headers, read as the propagator's carrier (string values only).
    struct HeaderReader<'a>(&'a FieldTable);

    impl Extractor for HeaderReader<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            match self.0.inner().get(key)? {
                AMQPValue::LongString(value) => std::str::from_utf8(value.as_bytes()).ok(),
                _ => None,
            }
        }

        fn keys(&self) -> Vec<&str> {
            self.0.inner().keys().map(ShortString::as_str).collect()
        }
    }

    /// A message's headers, written by the propagator.
    struct HeaderWriter<'a>(&'a mut FieldTable);

    impl Injector for HeaderWriter<'_> {
        fn set(&mut self, key: &str, value: String) {
            self.0
                .insert(key.into(), AMQPValue::LongString(LongString::from(value)));
        }
    }
}
