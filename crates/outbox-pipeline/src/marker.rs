//! [`Marker`]: the single writer of outcomes.

use crate::failure_log::{Example, FailureLog, Fate, Summary};
use crate::fetcher::Marked;
use crate::instruments::{OutcomeCounters, StallGauges};
use crate::stall::{Stall, StallChange, StallWatch};
use crate::waiters::Waiters;
use actix::prelude::*;
use chrono::Utc;
use outbox_core::{
    trim_error, Backoff, Failure, FailureDecision, MarkBatch, OutboxRecord, OutboxStore,
    OutcomeKind, RetryPolicy,
};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

/// What became of one claimed record (from a Publisher).
#[derive(Message, Debug, Clone, PartialEq, Eq)]
#[rtype(result = "()")]
pub struct Outcome {
    /// The record.
    pub record: OutboxRecord,
    /// What happened to it.
    pub kind: OutcomeKind,
    /// Its envelope's size as claimed, for the Fetcher's byte budget ([`Marked::bytes`]):
    /// the Publisher lets go of a published envelope once the broker's client has its copy.
    pub bytes: usize,
}

/// Write every outcome that waits or still arrives, then stop (shutdown, once the
/// publishers have drained). Answered once everything is written.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct FlushAndStop;

/// How the Marker batches.
#[derive(Debug, Clone)]
pub struct MarkerOptions {
    /// The `worker` log field.
    pub worker: String,
    /// The `outbox` log field and metric label.
    pub outbox: String,
    /// This node; outcomes only touch rows it still holds (except `published`).
    pub node_id: String,
    /// Retry or dead.
    pub retry: RetryPolicy,
    /// Flush at once when this many outcomes wait.
    pub max_batch: usize,
    /// Otherwise flush this long after the first outcome arrived.
    pub max_delay: Duration,
    /// `relay.stall_after`: failures and no event published for this long stall the
    /// outbox ([`crate::stall`]).
    pub stall_after: Duration,
}

/// What a flush writes for one row. Its log line's `status`: `published`, `pending`,
/// `dead`, and `released` (or `stopped` when released during shutdown).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Resolution {
    /// Confirmed by the broker.
    Published,
    /// Failed; stays pending until its next attempt.
    Retried {
        /// [`outbox_core::PublishError::reason`], for its counter.
        reason: &'static str,
        /// The trimmed error written to `last_error`.
        error: String,
    },
    /// Failed through no fault of its own (the broker away or not answering): stays
    /// pending with its attempts as they were.
    Deferred {
        /// [`outbox_core::PublishError::reason`], for its counter.
        reason: &'static str,
        /// The trimmed error written to `last_error`.
        error: String,
    },
    /// Failed for good.
    Dead {
        /// [`outbox_core::PublishError::reason`], for its counter.
        reason: &'static str,
        /// The trimmed error written to `last_error`.
        error: String,
    },
    /// Not attempted: only the lease is given back.
    Released,
}

/// One decided outcome, kept until its flush is committed and then logged.
#[derive(Debug)]
struct Decided {
    record: OutboxRecord,
    resolution: Resolution,
    /// [`Outcome::bytes`].
    bytes: usize,
}

/// Batches outcomes into one transaction per flush and serialises the flushes. Outcomes
/// keep arriving while a flush runs, so publishers never wait for the database. A failed
/// flush is logged as `batch_failed` and retried with backoff, with the very same batch:
/// an outcome is never dropped. The rows waiting here are bounded by the Fetcher's
/// in-flight limit, since [`Marked`] frees capacity only after a commit.
pub struct Marker {
    /// The outbox table.
    store: Arc<dyn OutboxStore>,
    /// Told how many rows each commit resolved.
    fetcher: Recipient<Marked>,
    /// Batching and retry settings.
    options: MarkerOptions,
    /// Outcomes not yet in a flush.
    waiting: Vec<Outcome>,
    /// The flush under way or waiting to be retried, with what to log once committed.
    flushing: Option<(Arc<MarkBatch>, Vec<Decided>)>,
    /// A delayed flush is scheduled.
    scheduled: bool,
    /// Between retries of a failed flush.
    backoff: Backoff,
    /// Answered once everything is written (shutdown).
    drained: Waiters,
    /// Committed outcomes by kind, and flush sizes.
    counters: OutcomeCounters,
    /// Rows released after the shutdown began: said once, when the Marker stops.
    released_on_shutdown: usize,
    /// Progress and failures, for the stall state.
    stall: StallWatch,
    /// The stall state, for `/readyz` ([`Marker::stall_reports`]).
    stalls: watch::Sender<Option<Stall>>,
    /// `outbox_stalled`.
    stall_gauges: StallGauges,
    /// Which failures were said in full, and what waits for a summary line.
    failures: FailureLog,
}

/// How often the stall state is looked at.
const STALL_CHECK: Duration = Duration::from_secs(1);

/// Retries of a failed flush: 100 ms doubling to 5 s, jittered.
const BACKOFF: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));

impl Marker {
    /// A marker writing to `store` and reporting commits to `fetcher`.
    pub fn new(
        store: Arc<dyn OutboxStore>,
        fetcher: Recipient<Marked>,
        options: MarkerOptions,
    ) -> Self {
        let counters = OutcomeCounters::new(&options.outbox);
        let stall = StallWatch::new(
            options.stall_after,
            options.retry.longest_delay(),
            Instant::now(),
        );
        let stall_gauges = StallGauges::new(&options.outbox);
        Self {
            store,
            fetcher,
            options,
            waiting: Vec::new(),
            flushing: None,
            scheduled: false,
            backoff: BACKOFF,
            drained: Waiters::default(),
            counters,
            released_on_shutdown: 0,
            stall,
            stalls: watch::channel(None).0,
            stall_gauges,
            failures: FailureLog::default(),
        }
    }

    /// The stall state as it changes: `Some` while the outbox is stalled.
    pub fn stall_reports(&self) -> watch::Receiver<Option<Stall>> {
        self.stalls.subscribe()
    }

    /// Writes a line for each failure reason that failed again since its last line, once
    /// that line is [`crate::failure_log::SUMMARY_INTERVAL`] old, or (`all`: stopping) however recent.
    fn sum_up_failures(&mut self, all: bool) {
        let (worker, outbox, node_id) = (
            &self.options.worker,
            &self.options.outbox,
            &self.options.node_id,
        );
        for Summary {
            fate,
            reason,
            failures,
            over,
            example,
        } in self.failures.due(Instant::now(), all)
        {
            macro_rules! summary {
                ($level:ident, $status:literal, $message:literal) => {
                    $level!(
                        worker = %worker,
                        outbox = %outbox,
                        node_id = %node_id,
                        status = $status,
                        reason,
                        failures,
                        over = ?over,
                        event_id = %example.event_id,
                        room_id = %example.key,
                        error = %example.error,
                        $message
                    )
                };
            }
            match fate {
                Fate::Pending => summary!(
                    warn,
                    "pending",
                    "publishes failed for this reason since its last line; they will be retried (each at debug)"
                ),
                Fate::Dead => summary!(
                    error,
                    "dead",
                    "events dead for this reason since its last line (each at debug)"
                ),
            }
        }
    }

    /// Looks whether the outbox stalled or moves again; says so once.
    fn check_stall(&mut self) {
        let Some(change) = self.stall.check(Instant::now()) else {
            return;
        };
        let (worker, outbox) = (&self.options.worker, &self.options.outbox);
        match change {
            StallChange::Began(stall) => {
                warn!(
                    worker = %worker,
                    outbox = %outbox,
                    node_id = %self.options.node_id,
                    reason = stall.reason,
                    failures = stall.failures,
                    stalled_for = ?stall.for_,
                    event_id = %stall.event_id,
                    error = %stall.error,
                    next_step = stall.next_step(),
                    "outbox stalled: events keep failing and none was published"
                );
                self.stall_gauges.set(Some(stall.reason));
                self.stalls.send_replace(Some(stall));
            }
            StallChange::Ended => {
                info!(worker = %worker, outbox = %outbox, node_id = %self.options.node_id, "outbox no longer stalled");
                self.stall_gauges.set(None);
                self.stalls.send_replace(None);
            }
        }
    }

    /// Turns outcomes into one batch of row updates, deciding retry or dead for failures.
    fn decide(&self, outcomes: Vec<Outcome>) -> (MarkBatch, Vec<Decided>) {
        let now = Utc::now();
        let mut batch = MarkBatch::default();
        let mut decided = Vec::with_capacity(outcomes.len());
        for Outcome {
            record,
            kind,
            bytes,
        } in outcomes
        {
            let resolution = match kind {
                OutcomeKind::Published => {
                    batch.published.push(record.id);
                    Resolution::Published
                }
                OutcomeKind::Released => {
                    batch.released.push(record.id);
                    Resolution::Released
                }
                OutcomeKind::Failed(failure) => {
                    let reason = failure.reason();
                    let error = trim_error(&failure.to_string());
                    let row = Failure {
                        id: record.id,
                        error: error.clone(),
                    };
                    let at = |delay: Duration| {
                        let delay =
                            chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX);
                        now.checked_add_signed(delay).unwrap_or(now)
                    };
                    match self.options.retry.decide_failure(
                        record.retry_count,
                        failure.is_permanent(),
                        failure.counts_as_attempt(),
                    ) {
                        FailureDecision::Retry { delay } => {
                            batch.retried.push((row, at(delay)));
                            Resolution::Retried { reason, error }
                        }
                        FailureDecision::Defer { delay } => {
                            batch.deferred.push((row, at(delay)));
                            Resolution::Deferred { reason, error }
                        }
                        FailureDecision::Dead => {
                            batch.dead.push(row);
                            Resolution::Dead { reason, error }
                        }
                    }
                }
            };
            decided.push(Decided {
                record,
                resolution,
                bytes,
            });
        }
        (batch, decided)
    }

    fn schedule(&mut self, ctx: &mut Context<Self>) {
        if self.waiting.len() >= self.options.max_batch || !self.drained.is_empty() {
            self.flush(ctx);
        } else if !self.scheduled && !self.waiting.is_empty() {
            self.scheduled = true;
            ctx.run_later(self.options.max_delay, |marker, ctx| {
                marker.scheduled = false;
                marker.flush(ctx);
            });
        }
    }

    /// Starts a flush of what waits, unless one is under way (its completion schedules the
    /// next).
    fn flush(&mut self, ctx: &mut Context<Self>) {
        if self.flushing.is_some() {
            return;
        }
        if self.waiting.is_empty() {
            self.stop_if_drained(ctx);
            return;
        }
        let take = self.waiting.len().min(self.options.max_batch);
        let outcomes: Vec<Outcome> = self.waiting.drain(..take).collect();
        let (batch, decided) = self.decide(outcomes);
        self.flushing = Some((Arc::new(batch), decided));
        self.write(ctx);
    }

    /// Writes the batch in `flushing`; on failure, keeps it and tries again later.
    fn write(&mut self, ctx: &mut Context<Self>) {
        let Some((batch, _)) = &self.flushing else {
            return;
        };
        let batch = Arc::clone(batch);
        let store = Arc::clone(&self.store);
        let node_id = self.options.node_id.clone();
        async move {
            let started = std::time::Instant::now();
            let result = store.mark(&node_id, &batch).await;
            debug!(rows = batch.len(), took = ?started.elapsed(), "outcomes written");
            result
        }
        .into_actor(self)
        .map(|result, marker, ctx| match result {
            Ok(()) => {
                if !marker.backoff.is_reset() {
                    info!(
                        worker = %marker.options.worker,
                        outbox = %marker.options.outbox,
                        node_id = %marker.options.node_id,
                        "writing outcomes works again"
                    );
                }
                marker.backoff.reset();
                if let Some((_, decided)) = marker.flushing.take() {
                    marker.log_committed(&decided);
                    marker.fetcher.do_send(Marked {
                        count: decided.len(),
                        bytes: decided.iter().map(|d| d.bytes).sum(),
                        unheld: unheld_keys(&decided),
                    });
                }
                // What arrived meanwhile waits for a full batch or its delay, as the first
                // outcome did: flushing it at once made many small flushes while a backlog
                // drains (a statement, a commit and a ping of the connection each).
                marker.schedule(ctx);
            }
            Err(error) => {
                let rows = marker.flushing.as_ref().map_or(0, |(batch, _)| batch.len());
                // Said once when the failures begin (and once when they end), not at
                // every retry.
                let first = marker.backoff.is_reset();
                let retry_in = marker.backoff.next_delay();
                if first {
                    warn!(
                        worker = %marker.options.worker,
                        outbox = %marker.options.outbox,
                        node_id = %marker.options.node_id,
                        status = "batch_failed",
                        rows,
                        ?retry_in,
                        %error,
                        "writing outcomes failed; keeping them and retrying"
                    );
                } else {
                    debug!(outbox = %marker.options.outbox, rows, ?retry_in, %error, "writing outcomes failed again");
                }
                ctx.run_later(retry_in, |marker, ctx| marker.write(ctx));
            }
        })
        .spawn(ctx);
    }

    fn log_committed(&mut self, decided: &[Decided]) {
        let now = Instant::now();
        for done in decided {
            match &done.resolution {
                Resolution::Published => self.stall.published(now),
                Resolution::Retried { reason, error }
                | Resolution::Deferred { reason, error }
                | Resolution::Dead { reason, error } => {
                    self.stall.failed(now, reason, error, &done.record.event_id)
                }
                Resolution::Released => {}
            }
        }
        if !self.drained.is_empty() {
            self.released_on_shutdown += decided
                .iter()
                .filter(|done| done.resolution == Resolution::Released)
                .count();
        }
        // Counted here, with the log lines: the counters say what the table says.
        self.counters
            .committed(decided.iter().map(|done| &done.resolution));
        let worker = self.options.worker.as_str();
        let outbox = self.options.outbox.as_str();
        let node_id = self.options.node_id.as_str();
        let stopping = !self.drained.is_empty();
        for Decided {
            record, resolution, ..
        } in decided
        {
            let error = match resolution {
                Resolution::Retried { error, .. }
                | Resolution::Deferred { error, .. }
                | Resolution::Dead { error, .. } => error.as_str(),
                Resolution::Published | Resolution::Released => "",
            };
            // The first failure of a reason is said at its level, the rest at debug and in
            // a summary every SUMMARY_INTERVAL (failure_log.rs). A broker outage (timeout,
            // lost channel) is the link's to tell, in one line when it begins.
            let fate = match resolution {
                Resolution::Retried { reason, .. } => Some((Fate::Pending, *reason)),
                Resolution::Deferred { reason, .. }
                    if !matches!(*reason, "timeout" | "channel") =>
                {
                    Some((Fate::Pending, *reason))
                }
                Resolution::Dead { reason, .. } => Some((Fate::Dead, *reason)),
                _ => None,
            };
            let in_full = fate.is_some_and(|(fate, reason)| {
                self.failures.note(now, fate, reason, || Example {
                    event_id: record.event_id.clone(),
                    key: record.key.clone(),
                    error: error.to_owned(),
                })
            });
            macro_rules! outcome {
                ($level:ident, $status:expr, $retry_count:expr, $message:literal) => {
                    $level!(
                        worker,
                        outbox,
                        node_id,
                        event_id = %record.event_id,
                        event_type = %record.event_type,
                        key = %record.key,
                        room_id = %record.key,
                        retry_count = $retry_count,
                        status = $status,
                        error,
                        // The producer's W3C trace context, when its row carries one: log
                        // tools join this line to the producer's trace. Read only when the
                        // line is emitted; absent from the line when the row has none.
                        traceparent = outbox_core::traceparent(record.headers.as_deref()).as_deref(),
                        $message
                    )
                };
            }
            match resolution {
                Resolution::Published => {
                    outcome!(debug, "published", record.retry_count, "event published")
                }
                Resolution::Retried { .. } if in_full => outcome!(
                    warn,
                    "pending",
                    record.retry_count + 1,
                    "publish failed; will retry"
                ),
                Resolution::Retried { .. } => outcome!(
                    debug,
                    "pending",
                    record.retry_count + 1,
                    "publish failed; will retry"
                ),
                Resolution::Deferred { .. } if in_full => outcome!(
                    warn,
                    "pending",
                    record.retry_count,
                    "publish refused by the broker; will retry, attempts kept"
                ),
                Resolution::Deferred { .. } => outcome!(
                    debug,
                    "pending",
                    record.retry_count,
                    "publish failed through no fault of the event; will retry, attempts kept"
                ),
                Resolution::Dead { .. } if in_full => outcome!(
                    error,
                    "dead",
                    record.retry_count + 1,
                    "publish failed; event is dead"
                ),
                Resolution::Dead { .. } => outcome!(
                    debug,
                    "dead",
                    record.retry_count + 1,
                    "publish failed; event is dead"
                ),
                // Summed up in one line when the Marker stops.
                Resolution::Released if stopping => {
                    outcome!(debug, "stopped", record.retry_count, "released on shutdown")
                }
                Resolution::Released => outcome!(
                    debug,
                    "released",
                    record.retry_count,
                    "held back behind its room"
                ),
            }
        }
    }

    fn stop_if_drained(&mut self, ctx: &mut Context<Self>) {
        if !self.drained.is_empty() && self.waiting.is_empty() && self.flushing.is_none() {
            self.sum_up_failures(true);
            if self.released_on_shutdown > 0 {
                info!(
                    worker = %self.options.worker,
                    outbox = %self.options.outbox,
                    node_id = %self.options.node_id,
                    status = "stopped",
                    released = self.released_on_shutdown,
                    "events claimed but not started were released on shutdown; the next claim takes them"
                );
            }
            self.drained.answer(());
            ctx.stop();
        }
    }
}

/// Per key, the committed outcomes that held it back in its Publisher: everything but
/// `published`.
fn unheld_keys(decided: &[Decided]) -> Vec<(String, usize)> {
    let mut keys: Vec<(String, usize)> = Vec::new();
    for Decided {
        record, resolution, ..
    } in decided
    {
        if *resolution == Resolution::Published {
            continue;
        }
        match keys.iter_mut().find(|(key, _)| *key == record.key) {
            Some((_, count)) => *count += 1,
            None => keys.push((record.key.clone(), 1)),
        }
    }
    keys
}

impl Actor for Marker {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(STALL_CHECK, |marker, _| {
            marker.check_stall();
            marker.sum_up_failures(false);
        });
    }

    fn stopping(&mut self, _: &mut Self::Context) -> Running {
        if self.waiting.is_empty() && self.flushing.is_none() {
            Running::Stop
        } else {
            Running::Continue
        }
    }
}

impl Handler<Outcome> for Marker {
    type Result = ();

    fn handle(&mut self, outcome: Outcome, ctx: &mut Self::Context) {
        self.waiting.push(outcome);
        self.schedule(ctx);
    }
}

impl Handler<FlushAndStop> for Marker {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: FlushAndStop, ctx: &mut Self::Context) -> Self::Result {
        let drained = self.drained.wait();
        self.flush(ctx);
        drained
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::{eventually, record, Collector, FakeStore};
    use outbox_core::{PublishError, RetryStrategy};
    use std::sync::atomic::Ordering as AtomicOrdering;

    const DEADLINE: Duration = Duration::from_secs(5);

    fn options(max_batch: usize, max_attempts: u32) -> MarkerOptions {
        MarkerOptions {
            worker: "room_outbox".into(),
            outbox: "room_outbox".into(),
            node_id: "node-a".into(),
            retry: RetryPolicy {
                strategy: RetryStrategy::FixedInterval,
                interval: Duration::from_secs(1),
                max_interval: Duration::from_secs(60),
                max_attempts,
            },
            max_batch,
            // Long enough that only the batch size or a drain triggers a flush.
            max_delay: Duration::from_secs(3600),
            stall_after: Duration::from_secs(60),
        }
    }

    fn failed(id: i64, retry_count: i32) -> Outcome {
        let mut record = record(id, "a");
        record.retry_count = retry_count;
        Outcome {
            record,
            kind: OutcomeKind::Failed(PublishError::Unroutable {
                exchange: "x".into(),
                routing_key: "k".into(),
            }),
            bytes: 2,
        }
    }

    /// A publish the broker nacked (its backpressure, not the event's doing).
    fn nacked(id: i64, retry_count: i32) -> Outcome {
        Outcome {
            kind: OutcomeKind::Failed(PublishError::Nacked {
                exchange: "x".into(),
                routing_key: "k".into(),
            }),
            ..failed(id, retry_count)
        }
    }

    /// A publish that timed out (the broker's doing, not the event's).
    fn timed_out(id: i64, retry_count: i32) -> Outcome {
        Outcome {
            kind: OutcomeKind::Failed(PublishError::Timeout(Duration::from_secs(3))),
            ..failed(id, retry_count)
        }
    }

    fn published(id: i64) -> Outcome {
        Outcome {
            record: record(id, "b"),
            kind: OutcomeKind::Published,
            bytes: 2,
        }
    }

    #[actix_rt::test]
    async fn outcomes_are_written_in_one_batch() {
        let store = Arc::new(FakeStore::default());
        let (fetcher, marked) = Collector::<Marked>::start();
        let marker = Marker::new(store.clone(), fetcher.recipient(), options(3, 0)).start();
        marker.do_send(published(1));
        marker.do_send(published(2));
        marker.do_send(failed(3, 0));
        eventually("a committed batch", DEADLINE, || {
            !store.committed().is_empty()
        })
        .await;
        let batches = store.committed();
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].published, vec![1, 2]);
        assert_eq!(batches[0].retried.len(), 1);
        assert!(
            batches[0].retried[0].0.error.contains("unroutable"),
            "{:?}",
            batches[0].retried
        );
        let marked = marked.wait_for(1, DEADLINE).await;
        assert_eq!(
            marked[0].count, 3,
            "capacity for three rows goes back to the fetcher"
        );
    }

    #[actix_rt::test]
    async fn a_failed_flush_is_retried_and_nothing_is_dropped() {
        let store = Arc::new(FakeStore::default());
        store.failing_marks.store(2, AtomicOrdering::SeqCst);
        let (fetcher, marked) = Collector::<Marked>::start();
        let marker = Marker::new(store.clone(), fetcher.recipient(), options(2, 0)).start();
        marker.do_send(published(1));
        marker.do_send(published(2));
        let marked = marked.wait_for(1, DEADLINE).await;
        assert_eq!(store.failed_marks.load(AtomicOrdering::SeqCst), 2);
        let batches = store.committed();
        assert_eq!(batches.len(), 1, "the same batch, written once");
        assert_eq!(batches[0].published, vec![1, 2]);
        assert_eq!(marked[0].count, 2);
    }

    #[actix_rt::test]
    async fn max_attempts_turns_an_event_dead() {
        let store = Arc::new(FakeStore::default());
        let (fetcher, _marked) = Collector::<Marked>::start();
        let marker = Marker::new(store.clone(), fetcher.recipient(), options(2, 3)).start();
        marker.do_send(failed(1, 1));
        marker.do_send(failed(2, 2));
        eventually("a committed batch", DEADLINE, || {
            !store.committed().is_empty()
        })
        .await;
        let batch = &store.committed()[0];
        assert_eq!(
            batch.retried.iter().map(|(f, _)| f.id).collect::<Vec<_>>(),
            vec![1]
        );
        assert_eq!(batch.dead.iter().map(|f| f.id).collect::<Vec<_>>(), vec![2]);
    }

    #[actix_rt::test]
    async fn an_outage_or_a_nack_never_turns_an_event_dead_nor_costs_it_an_attempt() {
        for (failure, reason) in [
            (timed_out as fn(i64, i32) -> Outcome, "no confirm"),
            (nacked, "nacked"),
        ] {
            let store = Arc::new(FakeStore::default());
            let (fetcher, _marked) = Collector::<Marked>::start();
            let marker = Marker::new(store.clone(), fetcher.recipient(), options(2, 3)).start();
            // The second at what would be its last allowed attempt.
            marker.do_send(failure(1, 0));
            marker.do_send(failure(2, 2));
            eventually("a committed batch", DEADLINE, || {
                !store.committed().is_empty()
            })
            .await;
            let batch = &store.committed()[0];
            assert!(
                batch.dead.is_empty() && batch.retried.is_empty(),
                "{batch:?}"
            );
            assert_eq!(
                batch.deferred.iter().map(|(f, _)| f.id).collect::<Vec<_>>(),
                vec![1, 2],
                "deferred, attempts kept"
            );
            assert!(batch.deferred[0].0.error.contains(reason), "{batch:?}");
        }
    }

    #[actix_rt::test]
    async fn failures_with_nothing_published_stall_the_outbox_and_a_publish_ends_it() {
        let store = Arc::new(FakeStore::default());
        let (fetcher, _marked) = Collector::<Marked>::start();
        let mut options = options(1, 0);
        options.stall_after = Duration::ZERO;
        // A failure counts for the stall until a retry is overdue.
        options.retry.interval = Duration::from_secs(60);
        let marker = Marker::new(store.clone(), fetcher.recipient(), options);
        let mut stalls = marker.stall_reports();
        let marker = marker.start();
        marker.do_send(failed(1, 0));
        let stalled = tokio::time::timeout(DEADLINE, stalls.wait_for(Option::is_some))
            .await
            .expect("stalled within the deadline")
            .unwrap()
            .clone()
            .unwrap();
        assert_eq!(stalled.reason, "unroutable");
        assert_eq!(stalled.failures, 1);
        assert!(stalled.error.contains("unroutable"), "{stalled:?}");
        marker.do_send(published(2));
        tokio::time::timeout(DEADLINE, stalls.wait_for(Option::is_none))
            .await
            .expect("moving again within the deadline")
            .unwrap();
    }

    /// Log output of the current thread, as JSON lines.
    #[derive(Clone, Default)]
    struct CapturedLog(Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for CapturedLog {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl CapturedLog {
        fn line_of(&self, event_id: &str) -> String {
            let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
            let needle = format!("\"event_id\":\"{event_id}\"");
            text.lines()
                .find(|line| line.contains(&needle))
                .unwrap_or_else(|| panic!("no line for {event_id} in:\n{text}"))
                .to_owned()
        }
    }

    #[actix_rt::test]
    async fn outcome_lines_carry_the_rows_traceparent() {
        let log = CapturedLog::default();
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .json()
            .flatten_event(true)
            .with_writer(move || writer.clone())
            .finish();
        // The actors run on this thread (actix_rt::test), so a thread default captures them.
        let _guard = tracing::subscriber::set_default(subscriber);
        let store = Arc::new(FakeStore::default());
        let (fetcher, marked) = Collector::<Marked>::start();
        let marker = Marker::new(store.clone(), fetcher.recipient(), options(3, 0)).start();
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut traced = published(1);
        traced.record.headers = Some(format!(
            r#"{{"tenant":"t1","traceparent":"{parent}","tracestate":"k=v"}}"#
        ));
        let mut failed_traced = failed(2, 0);
        failed_traced.record.headers = Some(format!(r#"{{"traceparent":"{parent}"}}"#));
        marker.do_send(traced);
        marker.do_send(failed_traced);
        marker.do_send(published(3));
        marked.wait_for(1, DEADLINE).await;
        let expected = format!("\"traceparent\":\"{parent}\"");
        let line = log.line_of("b1");
        assert!(line.contains(&expected), "{line}");
        assert!(line.contains("\"status\":\"published\""), "{line}");
        let line = log.line_of("a2");
        assert!(line.contains(&expected), "failures too: {line}");
        let line = log.line_of("b3");
        assert!(
            !line.contains("traceparent"),
            "no field without one: {line}"
        );
    }

    #[actix_rt::test]
    async fn drain_writes_what_waits_then_stops() {
        let store = Arc::new(FakeStore::default());
        let (fetcher, _marked) = Collector::<Marked>::start();
        let marker = Marker::new(store.clone(), fetcher.recipient(), options(100, 0)).start();
        // `send` returns once the Marker has handled the outcome.
        marker.send(published(1)).await.unwrap();
        let released = Outcome {
            record: record(2, "c"),
            kind: OutcomeKind::Released,
            bytes: 2,
        };
        marker.send(released).await.unwrap();
        assert!(
            store.committed().is_empty(),
            "below the batch size nothing is written yet"
        );
        marker.send(FlushAndStop).await.expect("drain answered");
        let batches = store.committed();
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].published, vec![1]);
        assert_eq!(batches[0].released, vec![2]);
        eventually("the marker to stop", DEADLINE, || !marker.connected()).await;
    }
}
