//! The ports through which the relay reaches the world. Actors hold them as `Arc<dyn …>`
//! (or own a `Box<dyn …>`); outbox-store and outbox-amqp implement them for real, unit tests
//! fake them. See docs/design/overview.md#the-ports.

use crate::options::Ordering;
use crate::outcome::MarkBatch;
use crate::record::{OutboxRecord, Status};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

/// A database failure, as text: the core knows no driver.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StoreError {
    /// The database could not run a statement (connection lost, constraint, timeout…).
    #[error("database error: {0}")]
    Database(String),
    /// Another live process runs as the same `node_id` on the table (what is known of it).
    #[error("{0}")]
    NodeTaken(String),
}

/// Why a publish did not end in the broker's ack.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PublishError {
    /// `mandatory` publish that no queue was bound for: the broker returned it.
    #[error("unroutable: exchange={exchange} routing_key={routing_key}")]
    Unroutable {
        /// Exchange published to.
        exchange: String,
        /// Routing key published with.
        routing_key: String,
    },
    /// The broker nacked the message.
    #[error("nacked by the broker: exchange={exchange} routing_key={routing_key}")]
    Nacked {
        /// Exchange published to.
        exchange: String,
        /// Routing key published with.
        routing_key: String,
    },
    /// The exchange does not exist: the broker refused it (a passive check, or the channel
    /// closed with NOT_FOUND naming it).
    #[error("exchange {exchange:?} is missing or not usable: {detail}")]
    NoExchange {
        /// Exchange published to.
        exchange: String,
        /// The broker's answer.
        detail: String,
    },
    /// No confirm arrived within `publish_timeout`.
    #[error("no confirm from the broker within {0:?}")]
    Timeout(Duration),
    /// The channel or connection failed (closed, reset, refused, channel error).
    #[error("broker channel error: {0}")]
    Channel(String),
    /// The event can never be published as it is (bad headers, bad routing key,
    /// body over the broker's limit): it goes dead at once.
    #[error("cannot be published: {0}")]
    Invalid(String),
}

impl PublishError {
    /// Every value [`PublishError::reason`] returns, so a metric can register each label
    /// once, up front: a failure counter then reads 0 rather than being absent until the
    /// first failure of its kind, which keeps `rate()` and alert rules simple.
    pub const REASONS: [&'static str; 6] = [
        "unroutable",
        "nacked",
        "no_exchange",
        "timeout",
        "channel",
        "invalid",
    ];

    /// True when retrying cannot help.
    pub fn is_permanent(&self) -> bool {
        matches!(self, PublishError::Invalid(_))
    }

    /// True when the event itself caused the failure, so it costs one of its attempts
    /// (`retry_count`, `relay.max_attempts`): no queue for its routing key, no exchange of
    /// its name, a body or headers the broker cannot take. A timeout or a lost channel or
    /// connection is the broker's outage, and a nack its backpressure (a queue at its
    /// length limit under `reject-publish`, a quorum queue electing a leader): nobody's
    /// fault, so the event keeps its attempts and is published once the broker takes it
    /// again (docs/design/outcomes.md).
    pub fn counts_as_attempt(&self) -> bool {
        match self {
            PublishError::Unroutable { .. }
            | PublishError::NoExchange { .. }
            | PublishError::Invalid(_) => true,
            PublishError::Nacked { .. } | PublishError::Timeout(_) | PublishError::Channel(_) => {
                false
            }
        }
    }

    /// Short label of the failure kind (metrics and logs).
    pub fn reason(&self) -> &'static str {
        match self {
            PublishError::Unroutable { .. } => "unroutable",
            PublishError::Nacked { .. } => "nacked",
            PublishError::NoExchange { .. } => "no_exchange",
            PublishError::Timeout(_) => "timeout",
            PublishError::Channel(_) => "channel",
            PublishError::Invalid(_) => "invalid",
        }
    }
}

/// What the Fetcher asks of the store.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    /// The claiming node (`locked_by`).
    pub node_id: String,
    /// At most this many rows.
    pub limit: usize,
    /// Lease length (`locked_until = now + lease`).
    pub lease: Duration,
    /// Whether a row may be claimed while an earlier row of its key is still unresolved.
    pub ordering: Ordering,
    /// At most this many envelope bytes, counted in id order, except that the first row is
    /// always taken: a claim holds less than `max_bytes` plus its last row. `None`: no bound.
    pub max_bytes: Option<usize>,
    /// Start the candidate scan at this id: a [`Claimed::floor`] of an earlier claim, below
    /// which no pending row was left then, or just past the rows that claim leased. Rows
    /// below it are not claimed, and under `per_room` a pending row below it holds back
    /// the later rows of its key unless it is leased to the claiming node (in flight
    /// there), so a row committed late or skipped below the floor is never overtaken in
    /// its key; it waits for the next claim without a floor. `None`: from the oldest
    /// pending row.
    pub floor: Option<i64>,
}

/// What a claim leased, and where the next one may start.
#[derive(Debug, Default)]
pub struct Claimed {
    /// The leased rows, in id order.
    pub records: Vec<OutboxRecord>,
    /// The lowest id of a pending row (leased or not) at or above the request's floor, in
    /// the claim's snapshot; `None` when the store does not say or no row was leased.
    pub floor: Option<i64>,
}

/// The finished rows a purge deletes. Pending rows are never purged: they are events that
/// have not been delivered yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PurgeTarget {
    /// `published` rows whose `published_at` is older than the bound (`relay.retention`,
    /// `outbox-relay purge`).
    Published,
    /// `dead` rows whose `created_at` is older than the bound (`outbox-relay purge --dead`).
    /// A dead row has no time of death; its age is the event's age.
    Dead,
}

impl PurgeTarget {
    /// The `status` value of the rows it deletes.
    pub const fn status(self) -> Status {
        match self {
            PurgeTarget::Published => Status::Published,
            PurgeTarget::Dead => Status::Dead,
        }
    }
}

/// Counts for `status` and the health of the backlog.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutboxStats {
    /// Rows with `status = 'pending'`.
    pub pending: u64,
    /// Rows with `status = 'published'`.
    pub published: u64,
    /// Rows with `status = 'dead'`.
    pub dead: u64,
    /// Age of the oldest pending row, if any.
    pub oldest_pending_age_seconds: Option<f64>,
    /// Pending rows under a valid lease, by `locked_by`.
    pub claimed: BTreeMap<String, u64>,
    /// Pending rows whose lease has expired without an outcome (a node died or stalled).
    pub expired_leases: u64,
    /// `published` is an estimate (the catalogue's row estimate less the pending and dead
    /// rows), not a count: counting every published row of a large table costs seconds.
    pub published_estimated: bool,
    /// The table's size on disk with its indexes, when the database can tell.
    pub size: Option<TableSize>,
    /// Whether autovacuum looks after the table (PostgreSQL: the server's `autovacuum`
    /// and `track_counts`, and the table's `autovacuum_enabled`); `None` where there is no
    /// such thing. Without it the dead versions of marked rows stay, and so do their index
    /// entries.
    pub autovacuum: Option<bool>,
    /// The most frequent `last_error`s of pending rows that have failed, with their counts,
    /// most first ([`OutboxStats::FAILING_ERRORS`] at most): why the backlog does not move.
    pub failing: Vec<(String, u64)>,
    /// The oldest pending row that has failed: the head a key waits behind.
    pub oldest_failing: Option<FailingEvent>,
}

impl OutboxStats {
    /// How many of the most frequent errors [`OutboxStats::failing`] holds.
    pub const FAILING_ERRORS: usize = 5;
}

/// A pending event whose last attempt failed.
#[derive(Debug, Clone, PartialEq)]
pub struct FailingEvent {
    /// Its event id.
    pub event_id: String,
    /// Its ordering key.
    pub key: String,
    /// Failed attempts that counted.
    pub retry_count: i32,
    /// Its last failure.
    pub last_error: String,
    /// When the producer wrote it.
    pub created_at: DateTime<Utc>,
}

/// How much disk an outbox table takes, indexes included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableSize {
    /// Bytes.
    pub bytes: u64,
    /// How they were measured (`pg_total_relation_size`, `information_schema`, `dbstat`,
    /// `page_count`): the last one is the whole database file, not only the table.
    pub method: &'static str,
}

/// The part of [`OutboxStats`] that is cheap to read often (the metrics' gauges).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Backlog {
    /// Rows with `status = 'pending'`.
    pub pending: u64,
    /// Age of the oldest pending row, if any.
    pub oldest_pending_age_seconds: Option<f64>,
}

/// The outbox table.
#[async_trait]
pub trait OutboxStore: Send + Sync + 'static {
    /// Atomically leases up to `limit` publishable rows to `node_id`, oldest id first,
    /// and returns them in id order.
    async fn claim(&self, request: &ClaimRequest) -> Result<Vec<OutboxRecord>, StoreError>;

    /// [`OutboxStore::claim`], also saying where the next claim may start its scan
    /// ([`ClaimRequest::floor`]). A store whose index reads do not grow with the dead
    /// versions at its head may keep this default, which does not say.
    async fn claim_with_floor(&self, request: &ClaimRequest) -> Result<Claimed, StoreError> {
        Ok(Claimed {
            records: self.claim(request).await?,
            floor: None,
        })
    }

    /// Writes one batch of outcomes in one transaction. Rows no longer leased by
    /// `node_id` keep their state, except that `published` always wins.
    async fn mark(&self, node_id: &str, batch: &MarkBatch) -> Result<(), StoreError>;

    /// Takes `node_id` for this process until the returned hold is dropped, so that no
    /// other live process relays as the same node; [`StoreError::NodeTaken`] when one
    /// does. Leases a node holds can then only be its own or a dead run's. The default
    /// takes nothing (stores no other process can reach).
    async fn hold_node(&self, node_id: &str) -> Result<NodeHold, StoreError> {
        let _ = node_id;
        Ok(NodeHold::default())
    }

    /// Clears every lease `node_id` holds on pending rows; returns how many.
    async fn release_node(&self, node_id: &str) -> Result<u64, StoreError>;

    /// Extends every lease `node_id` still holds on pending rows to `now + lease`, so rows
    /// that stay in flight longer than a lease (a slow broker, a Marker waiting for the
    /// database) are not claimed by another node meanwhile. With `up_to`, only rows at or
    /// below that position (the highest the node has claimed): the renewal then reads the
    /// pending rows up to the node's own, not the whole backlog behind them. Returns how
    /// many.
    async fn renew(
        &self,
        node_id: &str,
        lease: Duration,
        up_to: Option<i64>,
    ) -> Result<u64, StoreError>;

    /// Counts by status and lease.
    async fn stats(&self) -> Result<OutboxStats, StoreError>;

    /// Pending rows and the oldest one's age, read every few seconds for the metrics.
    /// [`OutboxStore::stats`] also counts every published row, a scan of the whole table
    /// that grows with the retention; a store should answer this from pending rows only.
    /// The default asks `stats` (fine for small tables and fakes).
    async fn backlog(&self) -> Result<Backlog, StoreError> {
        let stats = self.stats().await?;
        Ok(Backlog {
            pending: stats.pending,
            oldest_pending_age_seconds: stats.oldest_pending_age_seconds,
        })
    }

    /// Rows with `status = 'dead'`: what the `outbox_dead_events` gauge shows. A store
    /// overrides it with a query of that count alone.
    async fn dead_count(&self) -> Result<u64, StoreError> {
        Ok(self.stats().await?.dead)
    }

    /// Deletes at most `limit` rows of `target` older than `older_than`, in one short
    /// statement, and returns how many. One call never deletes more than `limit` rows, so
    /// its locks last milliseconds; callers repeat while a call deletes `limit` rows.
    async fn purge(
        &self,
        target: PurgeTarget,
        older_than: DateTime<Utc>,
        limit: usize,
    ) -> Result<u64, StoreError>;
}

/// A store's hold on a `node_id` ([`OutboxStore::hold_node`]): released when dropped.
#[derive(Default)]
pub struct NodeHold {
    /// What holds the lock (a connection, a locked file).
    guard: Option<Box<dyn std::any::Any + Send + Sync>>,
    /// Resolves, with what is known of the other process, if the lock was lost and another
    /// process took the node meanwhile.
    lost: Option<Pin<Box<dyn Future<Output = String> + Send>>>,
    /// Whether the lock stands right now.
    holding: Holding,
}

/// Whether a [`NodeHold`]'s lock stands right now: false from the moment the session
/// holding it fails until it is taken again, while another process may be taking the node.
/// Nothing is claimed meanwhile. Always true for a hold that cannot be lost.
#[derive(Debug, Clone, Default)]
pub struct Holding(Option<Arc<AtomicBool>>);

impl Holding {
    /// Follows `flag`, which the hold's keeper sets.
    pub fn new(flag: Arc<AtomicBool>) -> Self {
        Self(Some(flag))
    }

    /// Whether the lock stands.
    pub fn stands(&self) -> bool {
        self.0
            .as_ref()
            .is_none_or(|flag| flag.load(AtomicOrdering::SeqCst))
    }
}

impl NodeHold {
    /// A hold kept by `guard`; `lost` resolves if another process takes the node.
    pub fn new(
        guard: Box<dyn std::any::Any + Send + Sync>,
        lost: Pin<Box<dyn Future<Output = String> + Send>>,
    ) -> Self {
        Self {
            guard: Some(guard),
            lost: Some(lost),
            holding: Holding::default(),
        }
    }

    /// The same hold, telling through `holding` whether its lock stands.
    pub fn with_holding(mut self, holding: Holding) -> Self {
        self.holding = holding;
        self
    }

    /// Whether its lock stands right now ([`Holding`]).
    pub fn holding(&self) -> Holding {
        self.holding.clone()
    }

    /// Whether anything is held.
    pub fn is_held(&self) -> bool {
        self.guard.is_some()
    }

    /// Takes the future that resolves when another process took the node; `None` for a
    /// hold of nothing, or once taken.
    pub fn take_lost(&mut self) -> Option<Pin<Box<dyn Future<Output = String> + Send>>> {
        self.lost.take()
    }
}

impl std::fmt::Debug for NodeHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeHold")
            .field("held", &self.is_held())
            .finish()
    }
}

/// How the database tells of new rows (PostgreSQL's NOTIFY, or a cheap probe where nothing
/// announces them): the relay claims when the feed answers instead of at the next poll.
#[async_trait]
pub trait InsertFeed: Send + 'static {
    /// The mechanism, for logs and figures: `notify`, `probe` or `data_version`.
    fn kind(&self) -> &'static str;

    /// Waits for a reason to claim: the feed has just connected, rows were inserted, or the
    /// connection was lost and re-established (rows may have come meanwhile). An error
    /// means the feed is not working (it cannot connect); calling again retries.
    async fn wait(&mut self) -> Result<(), StoreError>;
}

/// The broker's answer to one publish, awaited separately so many can be in flight.
pub type Confirm = Pin<Box<dyn Future<Output = Result<(), PublishError>> + Send>>;

/// One confirm-mode channel to the broker.
#[async_trait]
pub trait EventPublisher: Send + Sync + 'static {
    /// Hands `record` to the broker and returns the future of its confirm. An error here
    /// means the message never left (bad event, closed channel).
    async fn publish(&self, record: &OutboxRecord) -> Result<Confirm, PublishError>;

    /// Closes the channel; further publishes fail.
    async fn close(&self);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_failure_reason_is_listed() {
        let failures = [
            PublishError::Unroutable {
                exchange: "x".into(),
                routing_key: "k".into(),
            },
            PublishError::Nacked {
                exchange: "x".into(),
                routing_key: "k".into(),
            },
            PublishError::NoExchange {
                exchange: "x".into(),
                detail: "NOT_FOUND".into(),
            },
            PublishError::Timeout(Duration::from_secs(3)),
            PublishError::Channel("closed".into()),
            PublishError::Invalid("bad headers".into()),
        ];
        let reasons: Vec<&str> = failures.iter().map(PublishError::reason).collect();
        assert_eq!(reasons, PublishError::REASONS);
        let counted: Vec<&str> = failures
            .iter()
            .filter(|failure| failure.counts_as_attempt())
            .map(PublishError::reason)
            .collect();
        assert_eq!(
            counted,
            ["unroutable", "no_exchange", "invalid"],
            "only what the event caused costs an attempt"
        );
    }
}
