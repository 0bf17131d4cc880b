//! [`Janitor`]: deletes published rows older than `relay.retention`, a bounded batch at a
//! time, beside the pipeline.

use crate::waiters::Waiters;
use actix::prelude::*;
use chrono::{DateTime, Utc};
use outbox_core::options::humanise;
use outbox_core::{OutboxStore, PurgeTarget, StoreError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// Rows per DELETE: the statement's locks cover this many rows and last milliseconds.
pub const PURGE_BATCH: usize = 1_000;

/// Pause between two full batches, so the relay's own writes get their turn (SQLite has
/// one writer at a time; elsewhere it keeps a long first sweep from hogging the database).
pub const PURGE_PAUSE: Duration = Duration::from_millis(10);

/// How often the Janitor sweeps for `retention`: a tenth of it, between 1 s and 5 min. A
/// row thus lives at most about 10% longer than the retention, and a week's retention
/// costs one short query every five minutes when nothing has expired.
pub fn sweep_interval(retention: Duration) -> Duration {
    (retention / 10).clamp(Duration::from_secs(1), Duration::from_secs(300))
}

/// The bound of a sweep: rows published before this have expired. `None` when the
/// retention reaches back before any representable time (nothing is that old).
pub fn expiry_bound(now: DateTime<Utc>, retention: Duration) -> Option<DateTime<Utc>> {
    now.checked_sub_signed(chrono::Duration::from_std(retention).ok()?)
}

/// Delete what has expired by now. Answered when the sweep that does it is over; a
/// request that arrives during a sweep gets a fresh sweep right after it, so rows that
/// expired meanwhile are included.
#[derive(Message, Debug)]
#[rtype(result = "SweepReport")]
pub struct Sweep;

/// What one sweep did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, MessageResponse)]
pub struct SweepReport {
    /// Rows deleted.
    pub deleted: u64,
    /// DELETE statements run.
    pub batches: u32,
    /// False when the sweep was cut short by a database error or by [`StopSweeping`].
    pub complete: bool,
}

/// Finish the batch under way, start no other, then stop. Answered once stopped.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct StopSweeping;

/// How the Janitor sweeps.
#[derive(Debug, Clone)]
pub struct JanitorOptions {
    /// The `worker` log field.
    pub worker: String,
    /// The `outbox` log field.
    pub outbox: String,
    /// The `node_id` log field.
    pub node_id: String,
    /// Published rows older than this are deleted.
    pub retention: Duration,
    /// Time between sweeps (the first runs at start).
    pub interval: Duration,
    /// Rows per DELETE.
    pub batch_size: usize,
    /// Pause between two full batches.
    pub pause: Duration,
}

impl JanitorOptions {
    /// The relay's options for `retention`: [`sweep_interval`], [`PURGE_BATCH`],
    /// [`PURGE_PAUSE`].
    pub fn new(worker: &str, outbox: &str, node_id: &str, retention: Duration) -> Self {
        Self {
            worker: worker.to_owned(),
            outbox: outbox.to_owned(),
            node_id: node_id.to_owned(),
            retention,
            interval: sweep_interval(retention),
            batch_size: PURGE_BATCH,
            pause: PURGE_PAUSE,
        }
    }
}

/// One sweep under way.
struct Sweeping {
    /// Rows published before this are deleted; fixed for the sweep, so it ends.
    older_than: DateTime<Utc>,
    /// For the log line.
    started: Instant,
    /// Progress so far.
    report: SweepReport,
    /// Who asked for this sweep.
    waiting: Waiters<SweepReport>,
}

/// Sweeps at start and every `interval`: deletes `published` rows older than `retention`,
/// `batch_size` rows per [`OutboxStore::purge`], going on while batches come back full,
/// with a pause between them. Pending and dead rows are never touched. A failed statement
/// ends the sweep until the next one: an outage costs one warning and no retry storm.
pub struct Janitor {
    /// The outbox table.
    store: Arc<dyn OutboxStore>,
    /// Retention, cadence, batch size.
    options: JanitorOptions,
    /// The sweep under way, if any.
    sweeping: Option<Sweeping>,
    /// A DELETE is running (a stop waits for it).
    deleting: bool,
    /// Asked for a sweep while one ran: served by the next one.
    queued: Waiters<SweepReport>,
    /// The last sweep failed: log the recovery once.
    failing: bool,
    /// [`StopSweeping`] arrived: no new batch starts.
    stopped: bool,
    /// Answered once stopped.
    stopping: Waiters,
}

impl Janitor {
    /// A janitor sweeping `store`.
    pub fn new(store: Arc<dyn OutboxStore>, options: JanitorOptions) -> Self {
        Self {
            store,
            options,
            sweeping: None,
            deleting: false,
            queued: Waiters::default(),
            failing: false,
            stopped: false,
            stopping: Waiters::default(),
        }
    }

    /// Starts a sweep for `waiting` unless one runs (then they wait for the next one).
    fn sweep(&mut self, mut waiting: Waiters<SweepReport>, ctx: &mut Context<Self>) {
        if self.sweeping.is_some() {
            self.queued.join(waiting);
            return;
        }
        let Some(older_than) = expiry_bound(Utc::now(), self.options.retention) else {
            waiting.answer(SweepReport {
                complete: true,
                ..SweepReport::default()
            });
            return;
        };
        self.sweeping = Some(Sweeping {
            older_than,
            started: Instant::now(),
            report: SweepReport::default(),
            waiting,
        });
        self.delete_batch(ctx);
    }

    fn delete_batch(&mut self, ctx: &mut Context<Self>) {
        let Some(sweeping) = &self.sweeping else {
            return;
        };
        if self.stopped {
            self.finish(false, ctx);
            return;
        }
        self.deleting = true;
        let store = Arc::clone(&self.store);
        let (older_than, limit) = (sweeping.older_than, self.options.batch_size);
        async move { store.purge(PurgeTarget::Published, older_than, limit).await }
            .into_actor(self)
            .map(|result, janitor, ctx| janitor.batch_done(result, ctx))
            .spawn(ctx);
    }

    fn batch_done(&mut self, result: Result<u64, StoreError>, ctx: &mut Context<Self>) {
        self.deleting = false;
        let Some(sweeping) = &mut self.sweeping else {
            return;
        };
        match result {
            Ok(deleted) => {
                sweeping.report.deleted += deleted;
                sweeping.report.batches += 1;
                if self.failing {
                    self.failing = false;
                    info!(
                        worker = %self.options.worker,
                        outbox = %self.options.outbox,
                        node_id = %self.options.node_id,
                        "retention: deleting works again"
                    );
                }
                let full = deleted >= self.options.batch_size as u64;
                if full && !self.stopped {
                    ctx.run_later(self.options.pause, |janitor, ctx| janitor.delete_batch(ctx));
                } else {
                    // A short batch: nothing older is left. A full one cut by a stop: maybe.
                    self.finish(!full, ctx);
                }
            }
            Err(error) => {
                if !self.failing {
                    self.failing = true;
                    warn!(
                        worker = %self.options.worker,
                        outbox = %self.options.outbox,
                        node_id = %self.options.node_id,
                        %error,
                        "retention: deleting expired rows failed; the next sweep tries again"
                    );
                } else {
                    debug!(outbox = %self.options.outbox, %error, "retention: deleting failed again");
                }
                self.finish(false, ctx);
            }
        }
    }

    /// Ends the sweep: logs it, answers who asked, starts the next one if asked meanwhile,
    /// or stops when told to.
    fn finish(&mut self, complete: bool, ctx: &mut Context<Self>) {
        let Some(mut sweeping) = self.sweeping.take() else {
            return;
        };
        sweeping.report.complete = complete;
        let report = sweeping.report;
        let took = sweeping.started.elapsed();
        let (worker, node_id) = (&self.options.worker, &self.options.node_id);
        let outbox = &self.options.outbox;
        if report.deleted > 0 {
            info!(
                %worker,
                %outbox,
                %node_id,
                deleted = report.deleted,
                batches = report.batches,
                older_than = %sweeping.older_than.to_rfc3339(),
                ?took,
                "retention: deleted published rows"
            );
        } else {
            debug!(
                %worker,
                %outbox,
                %node_id,
                older_than = %sweeping.older_than.to_rfc3339(),
                ?took,
                "retention: nothing expired"
            );
        }
        sweeping.waiting.answer(report);
        if self.stopped {
            self.stop(ctx);
        } else if !self.queued.is_empty() {
            let queued = std::mem::take(&mut self.queued);
            self.sweep(queued, ctx);
        }
    }

    fn stop(&mut self, ctx: &mut Context<Self>) {
        self.queued.answer(SweepReport::default());
        self.stopping.answer(());
        ctx.stop();
    }
}

impl Actor for Janitor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        info!(
            worker = %self.options.worker,
            outbox = %self.options.outbox,
            node_id = %self.options.node_id,
            retention = %humanise(self.options.retention),
            every = %humanise(self.options.interval),
            "retention: published rows older than the retention are deleted"
        );
        self.sweep(Waiters::default(), ctx);
        ctx.run_interval(self.options.interval, |janitor, ctx| {
            if !janitor.stopped && janitor.sweeping.is_none() {
                janitor.sweep(Waiters::default(), ctx);
            }
        });
    }

    fn stopping(&mut self, _: &mut Self::Context) -> Running {
        // A DELETE under way reports back before the actor goes.
        if self.deleting {
            Running::Continue
        } else {
            Running::Stop
        }
    }
}

impl Handler<Sweep> for Janitor {
    type Result = ResponseFuture<SweepReport>;

    fn handle(&mut self, _: Sweep, ctx: &mut Self::Context) -> Self::Result {
        let mut waiting = Waiters::default();
        let report = waiting.wait();
        if self.stopped {
            waiting.answer(SweepReport::default());
        } else {
            self.sweep(waiting, ctx);
        }
        report
    }
}

impl Handler<StopSweeping> for Janitor {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: StopSweeping, ctx: &mut Self::Context) -> Self::Result {
        self.stopped = true;
        let stopped = self.stopping.wait();
        if !self.deleting {
            // Between batches (or idle): nothing to wait for.
            if self.sweeping.is_some() {
                self.finish(false, ctx);
            } else {
                self.stop(ctx);
            }
        }
        stopped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::{eventually, FakeStore};
    use std::sync::atomic::Ordering as AtomicOrdering;

    const DEADLINE: Duration = Duration::from_secs(5);

    /// A janitor whose only timed sweep is the one at start.
    fn janitor(store: &Arc<FakeStore>, batch_size: usize) -> Addr<Janitor> {
        let store: Arc<dyn OutboxStore> = store.clone();
        Janitor::new(
            store,
            JanitorOptions {
                worker: "room_outbox".into(),
                outbox: "room_outbox".into(),
                node_id: "node-a".into(),
                retention: Duration::from_secs(3600),
                interval: Duration::from_secs(3600),
                batch_size,
                pause: Duration::ZERO,
            },
        )
        .start()
    }

    fn hours_ago(hours: i64) -> DateTime<Utc> {
        Utc::now() - chrono::Duration::hours(hours)
    }

    #[actix_rt::test]
    async fn sweeps_delete_expired_published_rows_in_batches_until_one_comes_back_short() {
        let store = Arc::new(FakeStore::default());
        store.add_finished(1..=5, PurgeTarget::Published, hours_ago(2));
        store.add_finished(6..=6, PurgeTarget::Published, hours_ago(0));
        store.add_finished(7..=8, PurgeTarget::Dead, hours_ago(2));
        let janitor = janitor(&store, 2);
        // Asked during the sweep at start or after it, this sweep runs after that one.
        let report = janitor.send(Sweep).await.unwrap();
        assert_eq!(
            store.purged(),
            vec![2, 2, 1, 0],
            "full batches go on, the short one ends the sweep; then the requested sweep"
        );
        assert_eq!(
            report,
            SweepReport {
                deleted: 0,
                batches: 1,
                complete: true
            }
        );
        assert_eq!(
            store.finished_ids(),
            vec![6, 7, 8],
            "recent published and dead rows stay"
        );

        store.add_finished(9..=11, PurgeTarget::Published, hours_ago(3));
        let report = janitor.send(Sweep).await.unwrap();
        assert_eq!(
            report,
            SweepReport {
                deleted: 3,
                batches: 2,
                complete: true
            }
        );
        assert_eq!(store.finished_ids(), vec![6, 7, 8]);
    }

    #[actix_rt::test]
    async fn stop_lets_the_batch_under_way_finish_and_starts_no_other() {
        let store = Arc::new(FakeStore::default());
        store.add_finished(1..=5, PurgeTarget::Published, hours_ago(2));
        let gate = store.gate_purges();
        let janitor = janitor(&store, 2);
        eventually("the first delete to start", DEADLINE, || {
            store.purge_calls.load(AtomicOrdering::SeqCst) == 1
        })
        .await;
        let stopped = janitor.send(StopSweeping);
        // Answered at once once stopping: proves the stop was handled before the delete ends.
        let late = janitor.send(Sweep).await.unwrap();
        assert_eq!(late, SweepReport::default(), "no sweep after a stop");
        gate.add_permits(10);
        stopped.await.expect("stop answered");
        assert_eq!(
            store.purged(),
            vec![2],
            "the full batch finished; no other started"
        );
        assert_eq!(store.finished_ids(), vec![3, 4, 5]);
        eventually("the janitor to stop", DEADLINE, || !janitor.connected()).await;
    }

    #[actix_rt::test]
    async fn a_failed_delete_ends_the_sweep_and_the_next_sweep_deletes() {
        let store = Arc::new(FakeStore::default());
        store.add_finished(1..=3, PurgeTarget::Published, hours_ago(2));
        store.failing_purges.store(1, AtomicOrdering::SeqCst);
        let janitor = janitor(&store, 10);
        // Waits for the failed sweep at start, then sweeps again.
        let report = janitor.send(Sweep).await.unwrap();
        assert_eq!(store.failed_purges.load(AtomicOrdering::SeqCst), 1);
        assert_eq!(report.deleted, 3);
        assert!(report.complete);
        assert!(store.finished_ids().is_empty());
    }

    #[test]
    fn sweeps_run_every_tenth_of_the_retention_within_bounds() {
        assert_eq!(
            sweep_interval(Duration::from_secs(7 * 86_400)),
            Duration::from_secs(300)
        );
        assert_eq!(
            sweep_interval(Duration::from_secs(600)),
            Duration::from_secs(60)
        );
        assert_eq!(
            sweep_interval(Duration::from_secs(2)),
            Duration::from_secs(1)
        );
        assert_eq!(
            expiry_bound(Utc::now(), Duration::MAX),
            None,
            "nothing is that old"
        );
    }
}
