//! [`Relay`]: starts the actors, wired as docs/design/pipeline.md draws them, and stops
//! them in order.

use crate::fetcher::{Fetcher, PublisherHandle, Stop, StopClaiming};
use crate::janitor::{Janitor, JanitorOptions, StopSweeping};
use crate::listener::{Listener, StopListening};
use crate::marker::{FlushAndStop, Marker, MarkerOptions};
use crate::publisher::{Drain, Publisher};
use crate::scheduler::{Scheduler, StopTicking};
use actix::prelude::*;
use outbox_core::{
    ClaimRequest, EventPublisher, InsertFeed, NodeHold, OutboxStore, RelayOptions, StoreError,
};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tracing::{info, warn};

/// The graceful shutdown did not finish in time.
#[derive(Debug, Error)]
#[error("shutdown did not finish within {0:?}; leases of unfinished rows will expire on their own")]
pub struct ShutdownError(pub Duration);

/// How long the Marker lets outcomes gather before a flush.
const MARK_DELAY: Duration = Duration::from_millis(5);

/// Rows in flight (claimed, outcome not yet written), in claim batches. Two were enough
/// while a claim waited for its commit's fsync; four keep claims going back to back when
/// a flush is slow, and bound memory to a few hundred records (measured: no loss at 4,
/// none gained at 8; docs/decisions/0003-in-flight-window.md).
const IN_FLIGHT_BATCHES: usize = 4;

/// Most outcomes in one flush (SQLite allows 32,766 bound values in a statement, MySQL
/// 65,535; a flush binds one per id, a failure three).
const MAX_FLUSH: usize = 5_000;

/// A running relay: one Scheduler, one Fetcher, a Publisher per port, one Marker, a
/// Janitor when `relay.retention` is set, and a Listener when the store announces inserts.
pub struct Relay {
    scheduler: Addr<Scheduler>,
    fetcher: Addr<Fetcher>,
    publishers: Vec<Addr<Publisher>>,
    marker: Addr<Marker>,
    /// Deletes expired published rows; only when `relay.retention` is set.
    janitor: Option<Addr<Janitor>>,
    /// Closed after the publishers drained, before the Marker's last flush.
    ports: Vec<Arc<dyn EventPublisher>>,
    store: Arc<dyn OutboxStore>,
    options: RelayOptions,
    /// Wakes the relay on the database's announcements of inserts; see [`Relay::listen`].
    listener: Option<Addr<Listener>>,
    /// This process's hold on `node_id` for the table: dropped with the relay, after
    /// shutdown cleared its leases; claims and that clearing wait while its lock does not
    /// stand.
    node: NodeHold,
    /// Resolves if the hold was lost and another process took the node.
    node_lost: Option<NodeLost>,
    /// The Marker's stall state.
    stall: tokio::sync::watch::Receiver<Option<crate::Stall>>,
}

/// Resolves, with what is known of the other process, if another process took the node.
pub type NodeLost = std::pin::Pin<Box<dyn std::future::Future<Output = String> + Send>>;

impl Relay {
    /// Starts the actors on the current actix system: one Publisher per port. Takes the
    /// node first ([`OutboxStore::hold_node`]: [`StoreError::NodeTaken`] while another live
    /// process runs as it); the Fetcher's first claim then releases the leases an earlier,
    /// ended process with the same `node_id` left, so none of this node's rows stays
    /// locked by a process that no longer exists. That release is retried with the claim
    /// while the database fails it (a deadlock, a lock timeout, a lost connection): only
    /// taking the node can fail the start.
    pub async fn start(
        store: Arc<dyn OutboxStore>,
        ports: Vec<Arc<dyn EventPublisher>>,
        options: RelayOptions,
    ) -> Result<Self, StoreError> {
        let node = store.hold_node(&options.node_id).await?;
        Ok(Self::start_holding(store, ports, options, node))
    }

    /// [`Relay::start`] with the node already held ([`OutboxStore::hold_node`]): `run`
    /// takes it as soon as the database answers, before it waits for the broker.
    pub fn start_holding(
        store: Arc<dyn OutboxStore>,
        ports: Vec<Arc<dyn EventPublisher>>,
        options: RelayOptions,
        mut node: NodeHold,
    ) -> Self {
        assert!(
            !ports.is_empty(),
            "the relay needs at least one publisher port"
        );
        // First the node, then its leases (the Fetcher's first claim): held, no other live
        // process can be relaying as this node, so any lease it holds is a dead run's.
        let node_lost = node.take_lost();
        // Scheduler and Fetcher, Fetcher and Marker know each other: take their addresses
        // before starting them.
        let scheduler_ctx = Context::<Scheduler>::new();
        let fetcher_ctx = Context::<Fetcher>::new();
        let max_in_flight = options.batch_size * IN_FLIGHT_BATCHES;
        let marker = Marker::new(
            Arc::clone(&store),
            fetcher_ctx.address().recipient(),
            MarkerOptions {
                worker: options.name.clone(),
                outbox: options.outbox.clone(),
                node_id: options.node_id.clone(),
                retry: options.retry.clone(),
                // A flush takes everything that waits: the batch grows with the load, up to
                // a bound that keeps its id lists within every backend's placeholder limit.
                max_batch: max_in_flight.min(MAX_FLUSH),
                max_delay: MARK_DELAY,
                stall_after: options.stall_after,
            },
        );
        let stall = marker.stall_reports();
        let marker = marker.start();
        let publishers: Vec<Addr<Publisher>> = ports
            .iter()
            .map(|port| {
                Publisher::new(
                    &options.outbox,
                    Arc::clone(port),
                    marker.clone().recipient(),
                    options.ordering,
                )
                // In-flight publishes end within their publish_timeout, except where the
                // broker blocks publishers: the shutdown bound holds there too.
                .with_drain_limit(options.publish_timeout)
                .start()
            })
            .collect();
        let fetcher = fetcher_ctx.run(
            Fetcher::new(
                &options.outbox,
                Arc::clone(&store),
                publishers
                    .iter()
                    .cloned()
                    .map(PublisherHandle::from)
                    .collect(),
                scheduler_ctx.address().recipient(),
                ClaimRequest {
                    node_id: options.node_id.clone(),
                    limit: options.batch_size,
                    lease: options.lease,
                    ordering: options.ordering,
                    // Set per claim by the Fetcher, from what is in flight.
                    max_bytes: None,
                    floor: None,
                },
                max_in_flight,
                options.max_inflight_bytes,
            )
            .with_holding(node.holding()),
        );
        let scheduler = scheduler_ctx.run(Scheduler::new(
            fetcher.clone().recipient(),
            options.poll_interval,
        ));
        let janitor = options.retention.map(|retention| {
            Janitor::new(
                Arc::clone(&store),
                JanitorOptions::new(&options.name, &options.outbox, &options.node_id, retention),
            )
            .start()
        });
        info!(
            worker = %options.name,
            outbox = %options.outbox,
            node_id = %options.node_id,
            publishers = ports.len(),
            batch_size = options.batch_size,
            max_inflight_bytes = options.max_inflight_bytes,
            ordering = %options.ordering,
            "relay started"
        );
        Self {
            scheduler,
            fetcher,
            publishers,
            marker,
            janitor,
            ports,
            store,
            options,
            listener: None,
            node,
            node_lost,
            stall,
        }
    }

    /// Claims at once whenever `feed` announces inserts (PostgreSQL's NOTIFY), besides
    /// polling; while the feed is listening, written outcomes no longer wake claims. The
    /// feed stops with the relay. A second call replaces the first feed.
    pub fn listen(&mut self, feed: Box<dyn InsertFeed>) {
        let listener = Listener::new(
            &self.options.outbox,
            feed,
            self.scheduler.clone().recipient(),
            self.fetcher.clone().recipient(),
        )
        .start();
        if let Some(previous) = self.listener.replace(listener) {
            previous.do_send(StopListening);
        }
    }

    /// Stops in order (docs/design/shutdown.md): no more wake-ups, ticks or claims;
    /// publishers finish what is in flight and release the rest; channels close; the Marker
    /// writes every outcome; the Janitor's last DELETE ends; leases this node still holds
    /// are cleared. Bounded by `shutdown_timeout`.
    pub async fn shutdown(self) -> Result<(), ShutdownError> {
        let limit = self.options.shutdown_timeout;
        tokio::time::timeout(limit, self.drain())
            .await
            .map_err(|_| ShutdownError(limit))
    }

    async fn drain(&self) {
        if let Some(listener) = &self.listener {
            listener.do_send(StopListening);
        }
        self.scheduler.do_send(StopTicking);
        // Enqueued now, awaited last: a DELETE under way finishes meanwhile.
        let janitor_stopped = self
            .janitor
            .as_ref()
            .map(|janitor| janitor.send(StopSweeping));
        let _ = self.fetcher.send(StopClaiming).await;
        // `send` enqueues at once: every publisher drains concurrently.
        let drains: Vec<_> = self.publishers.iter().map(|p| p.send(Drain)).collect();
        for drained in drains {
            let _ = drained.await;
        }
        // Close every channel at once: each close is bounded, but a stalled broker would
        // otherwise cost that bound once per publisher.
        let closes: Vec<_> = self
            .ports
            .iter()
            .map(|port| {
                let port = Arc::clone(port);
                actix_rt::spawn(async move { port.close().await })
            })
            .collect();
        for closed in closes {
            let _ = closed.await;
        }
        let _ = self.marker.send(FlushAndStop).await;
        if let Some(stopped) = janitor_stopped {
            let _ = stopped.await;
        }
        // A lock that does not stand may be another process's by now, and the node's leases
        // with it: they are left to that process, or to expire.
        let released = match self.node.holding().stands() {
            true => self.store.release_node(&self.options.node_id).await,
            false => Ok(0),
        };
        match released {
            Ok(0) => {}
            Ok(released) => warn!(
                outbox = %self.options.outbox,
                released,
                "leases still held after the last flush were released"
            ),
            Err(error) => {
                warn!(outbox = %self.options.outbox, %error, "could not release leases; they will expire on their own")
            }
        }
        let _ = self.fetcher.send(Stop).await;
        info!(worker = %self.options.name, outbox = %self.options.outbox, node_id = %self.options.node_id, "relay stopped");
    }

    /// The options it runs with.
    pub fn options(&self) -> &RelayOptions {
        &self.options
    }

    /// Whether the outbox is stalled ([`crate::stall`]), as it changes.
    pub fn stall(&self) -> tokio::sync::watch::Receiver<Option<crate::Stall>> {
        self.stall.clone()
    }

    /// Takes the future that resolves if this process lost its hold on the node and
    /// another process took it: this process must then stop relaying. `None` once taken,
    /// or where the store holds nothing.
    pub fn take_node_lost(&mut self) -> Option<NodeLost> {
        self.node_lost.take()
    }
}

/// Several relays in one process, one per outbox, each with its own actors and publisher
/// channels; shut down together.
pub struct Relays {
    relays: Vec<Relay>,
}

impl Relays {
    /// The group of `relays`.
    pub fn new(relays: Vec<Relay>) -> Self {
        Self { relays }
    }

    /// The relays, in the order given.
    pub fn relays(&self) -> &[Relay] {
        &self.relays
    }

    /// Resolves, with what is known of the other process, once any relay's node was taken
    /// by another process after this one lost its hold ([`Relay::take_node_lost`]); never
    /// while every hold stands. Takes the relays' futures: call once.
    pub fn node_lost(&mut self) -> impl std::future::Future<Output = String> + Send + 'static {
        let mut lost: Vec<NodeLost> = self
            .relays
            .iter_mut()
            .filter_map(Relay::take_node_lost)
            .collect();
        std::future::poll_fn(move |cx| {
            for future in lost.iter_mut() {
                if let std::task::Poll::Ready(holder) = future.as_mut().poll(cx) {
                    return std::task::Poll::Ready(holder);
                }
            }
            std::task::Poll::Pending
        })
    }

    /// Stops every relay as [`Relay::shutdown`] does, all at once, within one
    /// `shutdown_limit` for the whole group (each relay's drain runs concurrently).
    pub async fn shutdown(self, shutdown_limit: Duration) -> Result<(), ShutdownError> {
        let mut drains: Vec<_> = self
            .relays
            .into_iter()
            .map(|relay| actix_rt::spawn(async move { relay.drain().await }))
            .collect();
        let all = async {
            for drain in drains.iter_mut() {
                let _ = drain.await;
            }
        };
        let result = tokio::time::timeout(shutdown_limit, all).await;
        if result.is_err() {
            for drain in &drains {
                drain.abort();
            }
            return Err(ShutdownError(shutdown_limit));
        }
        Ok(())
    }
}
