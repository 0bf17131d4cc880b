//! In-memory fakes of the two ports, and a collector actor, for unit tests of actor logic.

use actix::prelude::*;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use outbox_core::{
    ClaimRequest, Confirm, EventPublisher, InsertFeed, MarkBatch, OutboxRecord, OutboxStats,
    OutboxStore, OutcomeKind, PublishError, PurgeTarget, StoreError,
};
use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{oneshot, Notify, Semaphore};

use crate::marker::Outcome;

/// A record named `<key><id>` in tests, e.g. `a1`.
pub fn record(id: i64, key: &str) -> OutboxRecord {
    OutboxRecord {
        id,
        event_id: format!("{key}{id}"),
        event_type: "room.test".into(),
        key: key.into(),
        envelope: b"{}".to_vec(),
        headers: None,
        retry_count: 0,
        created_at: Utc::now(),
        columns: Vec::new(),
    }
}

/// Polls `condition` until it holds or `deadline` passes (then panics with `what`).
pub async fn eventually(what: &str, deadline: Duration, mut condition: impl FnMut() -> bool) {
    let until = tokio::time::Instant::now() + deadline;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < until,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A broker that acks, returns (unroutable) the events named in `failing`, or holds confirms until told.
#[derive(Default)]
pub struct FakePublisher {
    failing: HashSet<String>,
    held: bool,
    attempted: Mutex<Vec<String>>,
    waiting: Mutex<Vec<oneshot::Sender<Result<(), PublishError>>>>,
}

impl FakePublisher {
    /// Returns the named events as unroutable, acks the rest at once.
    pub fn failing(event_ids: &[&str]) -> Arc<Self> {
        Arc::new(Self {
            failing: event_ids.iter().map(|id| (*id).to_owned()).collect(),
            ..Self::default()
        })
    }

    /// Holds every confirm until [`FakePublisher::confirm_all`].
    pub fn held() -> Arc<Self> {
        Arc::new(Self {
            held: true,
            ..Self::default()
        })
    }

    /// Event ids handed to the broker, in order.
    pub fn attempted(&self) -> Vec<String> {
        self.attempted.lock().unwrap().clone()
    }

    /// Waits until `count` publishes were attempted.
    pub async fn wait_for_attempts(&self, count: usize, deadline: Duration) {
        eventually("publish attempts", deadline, || {
            self.attempted.lock().unwrap().len() >= count
        })
        .await;
    }

    /// Acks every held confirm.
    pub fn confirm_all(&self) {
        for confirm in self.waiting.lock().unwrap().drain(..) {
            let _ = confirm.send(Ok(()));
        }
    }
}

#[async_trait]
impl EventPublisher for FakePublisher {
    async fn publish(&self, record: &OutboxRecord) -> Result<Confirm, PublishError> {
        self.attempted.lock().unwrap().push(record.event_id.clone());
        if self.failing.contains(&record.event_id) {
            return Ok(Box::pin(async {
                Err(PublishError::Unroutable {
                    exchange: "x".into(),
                    routing_key: "k".into(),
                })
            }));
        }
        if self.held {
            let (confirm, confirmed) = oneshot::channel();
            self.waiting.lock().unwrap().push(confirm);
            return Ok(Box::pin(async move {
                confirmed
                    .await
                    .unwrap_or_else(|_| Err(PublishError::Channel("fake channel dropped".into())))
            }));
        }
        Ok(Box::pin(async { Ok(()) }))
    }

    async fn close(&self) {}
}

/// A store that records mark batches and can fail the next few of them.
#[derive(Default)]
pub struct FakeStore {
    /// Records the next claim returns.
    pub claimable: Mutex<Vec<OutboxRecord>>,
    /// Lease renewals so far.
    pub renewals: AtomicUsize,
    /// The `up_to` of each renewal so far.
    pub renewed_up_to: Mutex<Vec<Option<i64>>>,
    /// Claims to fail before succeeding again.
    pub failing_claims: AtomicUsize,
    /// Calls of `release_node` so far.
    pub node_releases: AtomicUsize,
    /// Releases to fail before succeeding again.
    pub failing_releases: AtomicUsize,
    /// Claims that reached the table (not failed by `failing_claims`).
    pub claims: AtomicUsize,
    /// Marks to fail before succeeding again.
    pub failing_marks: AtomicUsize,
    /// Failed mark attempts so far.
    pub failed_marks: AtomicUsize,
    /// Committed batches.
    pub marks: Mutex<Vec<MarkBatch>>,
    /// Finished rows a purge may delete: id, kind, and the time a purge compares.
    pub finished: Mutex<Vec<(i64, PurgeTarget, DateTime<Utc>)>>,
    /// Purges started (before the gate).
    pub purge_calls: AtomicUsize,
    /// Purges to fail before succeeding again.
    pub failing_purges: AtomicUsize,
    /// Failed purges so far.
    pub failed_purges: AtomicUsize,
    /// Rows each successful purge deleted, in call order.
    pub purges: Mutex<Vec<u64>>,
    /// When set, each purge waits for one permit.
    pub purge_gate: Mutex<Option<Arc<Semaphore>>>,
}

impl FakeStore {
    /// Committed batches so far.
    pub fn committed(&self) -> Vec<MarkBatch> {
        self.marks.lock().unwrap().clone()
    }

    /// Adds finished rows `ids` of `target`, published (or created) `at`.
    pub fn add_finished(
        &self,
        ids: impl IntoIterator<Item = i64>,
        target: PurgeTarget,
        at: DateTime<Utc>,
    ) {
        let mut finished = self.finished.lock().unwrap();
        finished.extend(ids.into_iter().map(|id| (id, target, at)));
    }

    /// Ids of the finished rows still there.
    pub fn finished_ids(&self) -> Vec<i64> {
        self.finished
            .lock()
            .unwrap()
            .iter()
            .map(|row| row.0)
            .collect()
    }

    /// Rows each successful purge deleted.
    pub fn purged(&self) -> Vec<u64> {
        self.purges.lock().unwrap().clone()
    }

    /// Makes every purge wait for a permit of the returned semaphore (none yet).
    pub fn gate_purges(&self) -> Arc<Semaphore> {
        let gate = Arc::new(Semaphore::new(0));
        *self.purge_gate.lock().unwrap() = Some(Arc::clone(&gate));
        gate
    }
}

#[async_trait]
impl OutboxStore for FakeStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<Vec<OutboxRecord>, StoreError> {
        if countdown(&self.failing_claims) {
            return Err(StoreError::Database("connection reset".into()));
        }
        self.claims.fetch_add(1, Ordering::SeqCst);
        let mut claimable = self.claimable.lock().unwrap();
        let mut take = request.limit.min(claimable.len());
        if let Some(max_bytes) = request.max_bytes {
            // The real claim's rule: each row whose earlier rows sum to less than the budget.
            let mut before = 0;
            take = claimable[..take]
                .iter()
                .take_while(|record| {
                    let fits = before < max_bytes;
                    before += record.envelope.len();
                    fits
                })
                .count();
        }
        Ok(claimable.drain(..take).collect())
    }

    async fn mark(&self, _: &str, batch: &MarkBatch) -> Result<(), StoreError> {
        let fail = self
            .failing_marks
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if fail {
            self.failed_marks.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::Database("connection refused".into()));
        }
        self.marks.lock().unwrap().push(batch.clone());
        Ok(())
    }

    async fn release_node(&self, _: &str) -> Result<u64, StoreError> {
        self.node_releases.fetch_add(1, Ordering::SeqCst);
        if countdown(&self.failing_releases) {
            return Err(StoreError::Database("deadlock found".into()));
        }
        Ok(0)
    }

    async fn renew(&self, _: &str, _: Duration, up_to: Option<i64>) -> Result<u64, StoreError> {
        self.renewed_up_to.lock().unwrap().push(up_to);
        self.renewals.fetch_add(1, Ordering::SeqCst);
        Ok(1)
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        Ok(OutboxStats::default())
    }

    async fn purge(
        &self,
        target: PurgeTarget,
        older_than: DateTime<Utc>,
        limit: usize,
    ) -> Result<u64, StoreError> {
        self.purge_calls.fetch_add(1, Ordering::SeqCst);
        let gate = self.purge_gate.lock().unwrap().clone();
        if let Some(gate) = gate {
            gate.acquire().await.expect("gate open").forget();
        }
        let fail = self
            .failing_purges
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if fail {
            self.failed_purges.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::Database("connection refused".into()));
        }
        let mut finished = self.finished.lock().unwrap();
        let mut deleted = 0;
        finished.retain(|(_, kind, at)| {
            let expired = *kind == target && *at < older_than && deleted < limit;
            deleted += usize::from(expired);
            !expired
        });
        let deleted = deleted as u64;
        self.purges.lock().unwrap().push(deleted);
        Ok(deleted)
    }
}

/// Takes one from `counter` if it is above zero: true when it did (fail this call).
fn countdown(counter: &AtomicUsize) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

/// A feed of inserts that answers as scripted (`true`: an announcement, `false`: cannot
/// connect), then waits for [`FakeFeed::answer`]. Clones share the script.
#[derive(Clone, Default)]
pub struct FakeFeed {
    inner: Arc<FeedScript>,
}

#[derive(Default)]
struct FeedScript {
    answers: Mutex<VecDeque<bool>>,
    more: Notify,
    /// When each wait began (tokio's clock, which tests may pause).
    calls: Mutex<Vec<tokio::time::Instant>>,
}

impl FakeFeed {
    /// A feed giving `answers` in order.
    pub fn answering(answers: &[bool]) -> Self {
        let feed = Self::default();
        feed.inner.answers.lock().unwrap().extend(answers);
        feed
    }

    /// One more answer.
    pub fn answer(&self, listening: bool) {
        self.inner.answers.lock().unwrap().push_back(listening);
        self.inner.more.notify_one();
    }

    /// When each wait began.
    pub fn calls(&self) -> Vec<tokio::time::Instant> {
        self.inner.calls.lock().unwrap().clone()
    }

    /// True once every other clone (the one the listener owns) is dropped.
    pub fn dropped(&self) -> bool {
        Arc::strong_count(&self.inner) == 1
    }
}

#[async_trait]
impl InsertFeed for FakeFeed {
    fn kind(&self) -> &'static str {
        "fake"
    }

    async fn wait(&mut self) -> Result<(), StoreError> {
        self.inner
            .calls
            .lock()
            .unwrap()
            .push(tokio::time::Instant::now());
        loop {
            let next = self.inner.answers.lock().unwrap().pop_front();
            match next {
                Some(true) => return Ok(()),
                Some(false) => return Err(StoreError::Database("connection refused".into())),
                None => self.inner.more.notified().await,
            }
        }
    }
}

/// Collects every message of type `M` it receives.
pub struct Collector<M> {
    seen: Arc<Mutex<Vec<M>>>,
}

/// The shared view of what a [`Collector`] received.
pub struct Seen<M> {
    seen: Arc<Mutex<Vec<M>>>,
}

/// What a publisher reported, by event id.
pub type Outcomes = Seen<Outcome>;

impl<M: Message<Result = ()> + Send + Unpin + 'static> Collector<M> {
    /// Starts a collector; returns its address and the view of what it receives.
    pub fn start() -> (Addr<Self>, Seen<M>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let addr = Collector {
            seen: Arc::clone(&seen),
        }
        .start();
        (addr, Seen { seen })
    }
}

impl<M: Message<Result = ()> + Unpin + 'static> Actor for Collector<M> {
    type Context = Context<Self>;
}

impl<M: Message<Result = ()> + Unpin + 'static> Handler<M> for Collector<M> {
    type Result = ();

    fn handle(&mut self, message: M, _: &mut Self::Context) {
        self.seen.lock().unwrap().push(message);
    }
}

/// Answered by a [`Collector`] once every message queued before it is handled: a barrier
/// for "nothing more arrived", where waiting for a count could return at once.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct Barrier;

impl<M: Message<Result = ()> + Unpin + 'static> Handler<Barrier> for Collector<M> {
    type Result = bool;

    fn handle(&mut self, _: Barrier, _: &mut Self::Context) -> bool {
        true
    }
}

impl<M: Clone> Seen<M> {
    /// Everything received so far.
    pub fn now(&self) -> Vec<M> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits until at least `count` messages arrived; returns them.
    pub async fn wait_for(&self, count: usize, deadline: Duration) -> Vec<M> {
        eventually("collected messages", deadline, || {
            self.seen.lock().unwrap().len() >= count
        })
        .await;
        self.seen.lock().unwrap().clone()
    }
}

/// Reading a list of outcomes in tests.
pub trait OutcomeList {
    /// `published`, `failed` or `released` for `event_id`.
    fn kind_of(&self, event_id: &str) -> &'static str;
    /// Event ids with that kind, in arrival order.
    fn ids_with(&self, kind: &str) -> Vec<String>;
}

fn kind_name(kind: &OutcomeKind) -> &'static str {
    match kind {
        OutcomeKind::Published => "published",
        OutcomeKind::Failed(_) => "failed",
        OutcomeKind::Released => "released",
    }
}

impl OutcomeList for Vec<Outcome> {
    fn kind_of(&self, event_id: &str) -> &'static str {
        self.iter()
            .find(|outcome| outcome.record.event_id == event_id)
            .map_or("missing", |outcome| kind_name(&outcome.kind))
    }

    fn ids_with(&self, kind: &str) -> Vec<String> {
        self.iter()
            .filter(|outcome| kind_name(&outcome.kind) == kind)
            .map(|outcome| outcome.record.event_id.clone())
            .collect()
    }
}
