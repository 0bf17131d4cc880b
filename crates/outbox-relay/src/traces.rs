//! OpenTelemetry export of the publish spans (docs/design/observability.md#tracing): with the `otel`
//! feature and `telemetry.otlp_endpoint` set, `run` installs a tracer provider that sends
//! batches of spans over OTLP/HTTP (protobuf) and turns on outbox-amqp's publish spans.
//! Without the feature the endpoint must be empty (settings refuse it otherwise), and
//! [`Traces::start`] does nothing.

use std::time::Duration;

/// How long the last batch of spans may take to leave at shutdown.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// The running exporter, flushed and stopped by [`Traces::shutdown`].
#[derive(Debug)]
pub struct Traces {
    #[cfg(feature = "otel")]
    provider: opentelemetry_sdk::trace::SdkTracerProvider,
}

#[cfg(feature = "otel")]
impl Traces {
    /// Starts exporting to `endpoint` (the full `…/v1/traces` URL); `None` when it is
    /// `None`. `node_id` becomes the resource's `service.instance.id`.
    pub fn start(endpoint: Option<&str>, node_id: &str) -> anyhow::Result<Option<Self>> {
        use anyhow::Context as _;
        use opentelemetry::KeyValue;
        use opentelemetry_otlp::WithExportConfig as _;
        use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor};

        let Some(endpoint) = endpoint else {
            return Ok(None);
        };
        // reqwest's rustls without a provider of its own: the process's ring, as for the
        // database and the broker.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(endpoint)
            .with_timeout(FLUSH_TIMEOUT)
            .build()
            .with_context(|| format!("cannot set up the OTLP exporter for {endpoint}"))?;
        // A relay publishes thousands of events per second: a batch leaves as soon as
        // 2,048 spans are queued (or after a second), and the queue holds four batches
        // more while one is in flight. When the collector is slower, spans are dropped
        // (the SDK says so), never the relay slowed down. The queue is allocated whole at
        // start (~0.3 KiB a span): 8,192 keeps it at a few MiB of the relay's memory.
        let batches = BatchConfigBuilder::default()
            .with_max_queue_size(8_192)
            .with_max_export_batch_size(2_048)
            .with_scheduled_delay(Duration::from_secs(1))
            .build();
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(batches)
            .build();
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name("outbox-relay")
            .with_attributes([
                KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
                KeyValue::new("service.instance.id", node_id.to_owned()),
            ])
            .build();
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource)
            .build();
        opentelemetry::global::set_tracer_provider(provider.clone());
        outbox_amqp::span::enable(opentelemetry_sdk::propagation::TraceContextPropagator::new());
        tracing::info!(endpoint, "exporting a span per published event over OTLP");
        Ok(Some(Self { provider }))
    }

    /// Sends the spans still queued (up to [`FLUSH_TIMEOUT`]) and stops the exporter. The
    /// SDK blocks while it flushes, so this runs on a blocking thread.
    pub async fn shutdown(self) {
        let provider = self.provider;
        let flushed =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(FLUSH_TIMEOUT))
                .await;
        match flushed {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "the last spans may not have been exported"),
            Err(error) => tracing::warn!(%error, "the span exporter did not stop cleanly"),
        }
    }
}

#[cfg(not(feature = "otel"))]
impl Traces {
    /// No exporter in this build; the settings made sure `endpoint` is `None`.
    pub fn start(endpoint: Option<&str>, _node_id: &str) -> anyhow::Result<Option<Self>> {
        debug_assert!(endpoint.is_none(), "refused by the settings");
        Ok(None)
    }

    /// Nothing to flush.
    pub async fn shutdown(self) {}
}

/// The URL spans are sent to, from `telemetry.otlp_endpoint`: the collector's base URL
/// gets OTLP/HTTP's `/v1/traces` (as `OTEL_EXPORTER_OTLP_ENDPOINT` does); a URL that
/// already ends with it is used as written.
pub fn traces_url(endpoint: &url::Url) -> String {
    let mut url = endpoint.clone();
    if !url.path().ends_with("/v1/traces") {
        let path = format!("{}/v1/traces", url.path().trim_end_matches('/'));
        url.set_path(&path);
    }
    url.to_string()
}

#[cfg(test)]
mod tests {
    use super::traces_url;

    #[test]
    fn the_traces_path_is_added_to_a_base_url_only() {
        let url = |text: &str| traces_url(&url::Url::parse(text).unwrap());
        assert_eq!(
            url("http://collector:4318"),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            url("http://collector:4318/"),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            url("https://otel.example/tenant-a/"),
            "https://otel.example/tenant-a/v1/traces"
        );
        assert_eq!(
            url("http://collector:4318/v1/traces"),
            "http://collector:4318/v1/traces"
        );
    }
}
