//! `outbox-relay run`: the service.

use crate::endpoint::Endpoint;
use crate::settings::Config;
use crate::signals::StopSignals;
use crate::startup::{open_broker, open_outboxes, start_relays};
use crate::traces::Traces;
use anyhow::{bail, Context as _};
use tracing::{info, warn};

/// Runs until SIGINT or SIGTERM, then shuts down gracefully (`docs/design.md#shutdown`); a
/// second signal forces the stop. Serves metrics and health on `metrics.listen` meanwhile.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let mut signals = StopSignals::install().context("cannot install signal handlers")?;
    // Before the relay starts: its actors take their metric handles when they are built.
    let endpoint = match config.metrics_listen {
        Some(listen) => Some(Endpoint::start(listen, &config.relay.node_id)?),
        None => None,
    };
    // Before the publishers start, so that every message gets its span.
    let traces = Traces::start(config.otlp_traces_url.as_deref(), &config.relay.node_id)?;
    let outboxes = open_outboxes(&config, config.database.migrate_on_start).await?;
    let broker = open_broker(&config).await?;
    let relays = start_relays(&config, &outboxes, &broker).await?;
    let stores: Vec<(&str, &outbox_store::SeaOrmStore)> = outboxes
        .iter()
        .map(|outbox| (outbox.config.name.as_str(), &outbox.store))
        .collect();
    let signal = match &endpoint {
        // The readiness probe runs until the first signal and is dropped with it, so it
        // cannot reconnect the broker once the shutdown has closed it.
        Some(endpoint) => tokio::select! {
            signal = signals.next() => signal,
            never = endpoint.probe(&stores, &broker, config.max_pending_age) => match never {},
        },
        None => signals.next().await,
    };
    if let Some(endpoint) = &endpoint {
        endpoint.shutting_down();
    }
    info!(signal, "shutdown requested; finishing in-flight publishes");
    tokio::select! {
        // Every outbox's relay at once, within the one relay.shutdown_timeout.
        result = relays.shutdown(config.relay.shutdown_timeout) => result?,
        signal = signals.next() => {
            warn!(signal, "second signal: forcing the stop; leases will expire on their own");
            bail!("stopped by a second {signal} before the graceful shutdown finished");
        }
    }
    broker.close().await;
    if let Some(traces) = traces {
        traces.shutdown().await;
    }
    if let Some(endpoint) = endpoint {
        endpoint.stop().await;
    }
    Ok(())
}
