//! `outbox-relay run`: the service.

use crate::admin::AdminServer;
use crate::commands::status::AUTOVACUUM_OFF;
use crate::dependency::{Dependency, Patience, Wait};
use crate::endpoint::Endpoint;
use crate::settings::Config;
use crate::signals::StopSignals;
use crate::startup::{
    hold_nodes, open_broker, open_outboxes, start_relays_holding, ConfigProblem, OpenOutbox,
};
use crate::traces::Traces;
use anyhow::Context as _;
use outbox_amqp::Broker;
use outbox_core::NodeHold;
use tracing::{info, warn};

/// Waits for the database and the broker while they are unreachable (within
/// `relay.startup_timeout`), then runs until SIGINT or SIGTERM and shuts down gracefully
/// (`docs/design/shutdown.md`); a second signal forces the stop. Serves metrics and health
/// on `metrics.listen` meanwhile, from before the wait, and the admin API on
/// `admin.listen` (when `admin.enabled`) once the databases are open.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let mut signals = StopSignals::install().context("cannot install signal handlers")?;
    // Before the relay starts: its actors take their metric handles when they are built.
    let endpoint = match config.metrics_listen {
        Some(listen) => Some(Endpoint::start(listen, &config.relay.node_id)?),
        None => None,
    };
    // SIGINT or SIGTERM while waiting for the database or the broker ends the wait: there
    // is nothing to drain yet.
    let opened = tokio::select! {
        opened = open_dependencies(&config, endpoint.as_ref()) => Some(opened?),
        signal = signals.next() => {
            info!(signal, "stop requested while waiting for the database or the broker");
            None
        }
    };
    let Some((outboxes, nodes, broker)) = opened else {
        if let Some(endpoint) = endpoint {
            endpoint.stop().await;
        }
        return Ok(());
    };
    for outbox in &outboxes {
        // A reading that fails is not worth holding the start for: the relay works either way.
        if let Ok(Some(false)) = outbox.store.autovacuum().await {
            warn!(outbox = %outbox.config.name, table = %outbox.config.table, "{AUTOVACUUM_OFF}");
        }
    }
    // Before the publishers start, so that every message gets its span.
    let traces = Traces::start(config.otlp_traces_url.as_deref(), &config.relay.node_id)?;
    // Once the stores are open: the admin API reads them. Only when asked for.
    let admin = match &config.admin {
        Some(admin) => Some(AdminServer::start(admin, &outboxes)?),
        None => None,
    };
    let nodes = nodes.into_iter().map(Some).collect();
    let mut relays = start_relays_holding(&config, &outboxes, &broker, nodes).await?;
    // Another process took this node after the lock's connection was lost: stop relaying.
    let node_lost = relays.node_lost();
    tokio::pin!(node_lost);
    let stalls: Vec<_> = relays
        .relays()
        .iter()
        .map(|relay| (relay.options().outbox.clone(), relay.stall()))
        .collect();
    let stores: Vec<(&str, &outbox_store::SeaOrmStore)> = outboxes
        .iter()
        .map(|outbox| (outbox.config.name.as_str(), &outbox.store))
        .collect();
    let mut taken_over = None;
    let signal = match &endpoint {
        // The readiness probe runs until the first signal and is dropped with it, so it
        // cannot reconnect the broker once the shutdown has closed it.
        Some(endpoint) => tokio::select! {
            signal = signals.next() => signal,
            holder = &mut node_lost => { taken_over = Some(holder); "node lost" },
            never = endpoint.probe(&stores, &broker, config.max_pending_age, &stalls) => match never {},
        },
        None => tokio::select! {
            signal = signals.next() => signal,
            holder = &mut node_lost => { taken_over = Some(holder); "node lost" },
        },
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
            return Err(ForcedStop(format!(
                "stopped by a second {signal} before the graceful shutdown finished"
            ))
            .into());
        }
    }
    broker.close().await;
    if let Some(traces) = traces {
        traces.shutdown().await;
    }
    if let Some(endpoint) = endpoint {
        endpoint.stop().await;
    }
    if let Some(admin) = admin {
        admin.stop().await;
    }
    match taken_over {
        Some(holder) => Err(ConfigProblem(holder).into()),
        None => Ok(()),
    }
}

/// A stop forced by a second signal: the process ends right after saying so, without
/// dropping what still runs (pools, publishes, timers), which would otherwise be dropped
/// outside the runtime as it shuts down (a panic in the log); leases expire on their own.
#[derive(Debug)]
pub struct ForcedStop(String);

impl std::fmt::Display for ForcedStop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ForcedStop {}

/// Opens every outbox's database (migrating it when `database.migrate_on_start`), takes
/// the node on each table, then opens the broker, each step tried again while it fails in
/// a way a retry can fix (unreachable, a deadlock, a lock not had in time), within
/// `relay.startup_timeout` altogether (`docs/operations/starting.md`).
async fn open_dependencies(
    config: &Config,
    endpoint: Option<&Endpoint>,
) -> anyhow::Result<(Vec<OpenOutbox>, Vec<NodeHold>, Broker)> {
    let patience = Patience::from_now(config.startup_timeout, "relay.startup_timeout");
    let urls = config.redacted_database_urls(None);
    let waiting = |dependency| {
        if let Some(endpoint) = endpoint {
            endpoint.waiting_for(dependency);
        }
    };
    waiting(Some(Dependency::Database));
    let outboxes = Wait {
        dependency: Dependency::Database,
        url: &urls,
        // The Fetcher's own steps for a database that stopped answering.
        backoff: outbox_pipeline::fetcher::CLAIM_BACKOFF,
        patience,
    }
    .until_up(|| open_outboxes(config, config.database.migrate_on_start))
    .await?;
    // Before waiting for the broker: a second process with this node_id is refused at once;
    // a lock statement the database failed (a lost connection) is tried again.
    let nodes = Wait {
        dependency: Dependency::Database,
        url: &urls,
        backoff: outbox_pipeline::fetcher::CLAIM_BACKOFF,
        patience,
    }
    .until_up(|| hold_nodes(config, &outboxes))
    .await?;
    waiting(Some(Dependency::Broker));
    let brokers = config.amqp.redacted_urls();
    let broker = Wait {
        dependency: Dependency::Broker,
        url: &brokers,
        // The broker link's own reconnection steps.
        backoff: outbox_amqp::broker::BACKOFF,
        patience,
    }
    .until_up(|| async { open_broker(config).await })
    .await?;
    waiting(None);
    Ok((outboxes, nodes, broker))
}
