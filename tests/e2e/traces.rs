//! OpenTelemetry (feature `otel`, on in the binary under test): with
//! `telemetry.otlp_endpoint` set, every publish is one producer span at the collector
//! (here an [`OtlpReceiver`] that decodes what arrives), a child of the row's
//! `traceparent` when it has one, and the message carries the span's own context.

use outbox_tests::otlp::{OtlpReceiver, ReceivedSpan};
use outbox_tests::{event, eventually, Backend, Received, RelayProcess, TestApp, TestEvent};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(30);
/// The producer's trace and span, as the room service would write them.
const PRODUCER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";
/// OTLP's `SPAN_KIND_PRODUCER`, and status codes.
const PRODUCER: i32 = 4;
const STATUS_OK: i32 = 1;
const STATUS_ERROR: i32 = 2;

/// The spans of one event, in the order they arrived.
fn spans_of<'a>(spans: &'a [ReceivedSpan], event_id: &str) -> Vec<&'a ReceivedSpan> {
    spans
        .iter()
        .filter(|span| span.attribute("messaging.message.id") == Some(event_id))
        .collect()
}

fn delivery<'a>(received: &'a [Received], event_id: &str) -> &'a Received {
    received
        .iter()
        .find(|message| message.message_id == event_id)
        .unwrap_or_else(|| panic!("{event_id} was delivered"))
}

#[actix_rt::test]
async fn a_producer_span_per_publish_continues_the_rows_trace_and_travels_with_the_message() {
    let receiver = OtlpReceiver::start();
    let traced = event("traced", "room-a").with_headers([
        (
            "traceparent",
            format!("00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01"),
        ),
        ("tracestate", "vendor=1".to_owned()),
        ("tenant", "t1".to_owned()),
    ]);
    let untraced = event("untraced", "room-b");
    // No binding for its type at first: it fails (unroutable) and is retried.
    let orphan = event("orphan", "room-c").of_type("orphan.created");
    let events = [traced, untraced, orphan];
    let app = TestApp::on(Backend::Postgres)
        .binding("room.#")
        .settings(|settings| {
            settings.telemetry.otlp_endpoint = receiver.endpoint();
            settings.relay.retry_interval = "100ms".into();
        })
        .seeded(&events)
        .build()
        .await;
    let node = app.settings.relay.node_id.clone();
    let exchange = app.broker.exchange.clone();
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);

    eventually("orphan to fail twice", DEADLINE, || async {
        app.database.row("orphan").await.retry_count >= 2
    })
    .await;
    app.broker.bind("orphan.#").await;
    // An unroutable publish is not delivered, so its retries are no duplicates.
    app.expect_every_event_once("traces", &events).await;
    // The last spans leave with the shutdown's flush at the latest.
    relay.stop(Duration::from_secs(10)).await;
    let received = app.broker.received();
    let spans = receiver.wait_for(received.len() + 2, DEADLINE).await;

    for span in &spans {
        assert_eq!(span.kind, PRODUCER, "{span:?}");
        assert_eq!(span.name, format!("publish {exchange}"), "{span:?}");
        assert_eq!(span.attribute("messaging.system"), Some("rabbitmq"));
        assert_eq!(span.attribute("messaging.operation.name"), Some("publish"));
        assert_eq!(
            span.attribute("messaging.destination.name"),
            Some(exchange.as_str())
        );
        assert_eq!(
            span.resource.get("service.name").map(String::as_str),
            Some("outbox-relay")
        );
        assert_eq!(
            span.resource.get("service.instance.id"),
            Some(&node),
            "the node id is the instance"
        );
    }

    // The traced row: a child of the producer's span, in the producer's trace; the
    // message's traceparent is the relay's span, the producer's other headers unchanged.
    let traced_spans = spans_of(&spans, "traced");
    assert_eq!(
        traced_spans.len(),
        1,
        "one span per publish: {traced_spans:?}"
    );
    let span = traced_spans[0];
    assert_eq!(span.trace_id, PRODUCER_TRACE);
    assert_eq!(span.parent_span_id, PRODUCER_SPAN);
    assert_ne!(span.span_id, PRODUCER_SPAN);
    assert_eq!(span.status_code, STATUS_OK);
    let message = delivery(&received, "traced");
    assert_eq!(
        message.header("traceparent"),
        Some(format!("00-{PRODUCER_TRACE}-{}-01", span.span_id)),
        "a consumer continues from the relay's span"
    );
    assert_eq!(message.header("tracestate").as_deref(), Some("vendor=1"));
    assert_eq!(message.header("tenant").as_deref(), Some("t1"));
    assert_eq!(
        span.attribute("messaging.rabbitmq.destination.routing_key"),
        Some(message.routing_key.as_str())
    );
    assert_eq!(
        span.attribute("outbox.row_id").map(str::to_owned),
        message.int_header("outbox_id").map(|id| id.to_string()),
        "the outbox row id"
    );
    assert_eq!(span.attribute("outbox.retry_count"), Some("0"));
    assert_eq!(
        span.attribute("messaging.message.body.size"),
        Some(message.body.len().to_string().as_str())
    );

    // A row without a trace: a root span, whose context the message carries.
    let untraced_spans = spans_of(&spans, "untraced");
    assert_eq!(untraced_spans.len(), 1, "{untraced_spans:?}");
    let span = untraced_spans[0];
    assert_eq!(span.parent_span_id, "", "a root span");
    assert_eq!(span.trace_id.len(), 32);
    assert_eq!(
        delivery(&received, "untraced").header("traceparent"),
        Some(format!("00-{}-{}-01", span.trace_id, span.span_id))
    );

    // The retried row: a span per attempt, failed ones with the error, the last one ok
    // with the retry count its message carries.
    let orphan_spans = spans_of(&spans, "orphan");
    let (failed, succeeded): (Vec<&ReceivedSpan>, Vec<&ReceivedSpan>) = orphan_spans
        .iter()
        .partition(|span| span.status_code == STATUS_ERROR);
    assert!(failed.len() >= 2, "{orphan_spans:?}");
    for span in &failed {
        assert_eq!(span.attribute("error.type"), Some("unroutable"), "{span:?}");
    }
    let attempts: Vec<&str> = failed
        .iter()
        .filter_map(|span| span.attribute("outbox.retry_count"))
        .collect();
    assert_eq!(&attempts[..2], ["0", "1"], "{orphan_spans:?}");
    assert_eq!(succeeded.len(), 1, "{orphan_spans:?}");
    let message = delivery(&received, "orphan");
    assert_eq!(
        succeeded[0]
            .attribute("outbox.retry_count")
            .map(str::to_owned),
        message.int_header("retry_count").map(|n| n.to_string())
    );
    app.teardown().await;
}
