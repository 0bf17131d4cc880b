//! [`Fetcher`]: claims batches and hands each record to its key's publisher.

use crate::floor::ScanFloor;
use crate::instruments::ClaimSizes;
use crate::publisher::{Publish, Unhold};
use crate::scheduler::Wake;
use actix::prelude::*;
use outbox_core::{Backoff, ClaimRequest, Holding, OutboxStore};
use std::sync::Arc;
use std::time::Duration;
// tokio's clock, so unit tests can move it (`tokio::time::pause`).
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// "Claim now" (from the Scheduler).
#[derive(Message, Debug)]
#[rtype(result = "TickReport")]
pub struct Tick;

/// What a [`Tick`] came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, MessageResponse)]
pub struct TickReport {
    /// Rows claimed.
    pub claimed: usize,
    /// The claim returned as many rows as asked: more are probably waiting (drain mode).
    pub full: bool,
}

/// Rows whose outcomes the Marker has written: capacity for new claims.
#[derive(Message, Debug, Clone, PartialEq, Eq)]
#[rtype(result = "()")]
pub struct Marked {
    /// How many rows.
    pub count: usize,
    /// Their envelopes' bytes: budget for new claims (`relay.max_inflight_bytes`).
    pub bytes: usize,
    /// Per key, how many of them were failures or releases (which hold their key back
    /// in its Publisher until written).
    pub unheld: Vec<(String, usize)>,
}

/// The two messages the Fetcher sends one publisher of the pool.
#[derive(Clone)]
pub struct PublisherHandle {
    /// Records to publish.
    pub publish: Recipient<Publish>,
    /// Written failures and releases of a held key.
    pub unhold: Recipient<Unhold>,
}

impl<A> From<Addr<A>> for PublisherHandle
where
    A: Actor + Handler<Publish> + Handler<Unhold>,
    A::Context: actix::dev::ToEnvelope<A, Publish> + actix::dev::ToEnvelope<A, Unhold>,
{
    fn from(addr: Addr<A>) -> Self {
        Self {
            publish: addr.clone().recipient(),
            unhold: addr.recipient(),
        }
    }
}

/// Whether new rows wake the relay on their own (`true` while PostgreSQL's NOTIFY feeds
/// the Scheduler): if so, a written outcome need not make the Fetcher look for them.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct InsertsAnnounced(pub bool);

/// Claim nothing more; answered once any claim under way has been dispatched.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct StopClaiming;

/// The relay has drained: stop. The Fetcher's lease-renewal interval would otherwise keep
/// it — and the store's connection pool it holds — alive after the relay is gone.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct Stop;

/// Claims up to `batch_size` rows per [`Tick`] (more while claims come back full, up to
/// the in-flight bound), one claim at a time (the Tick handler is atomic), keeps the rows
/// in flight below `max_in_flight` and their envelope bytes below `max_in_flight_bytes`
/// (plus one row: a claim always takes at least one), and sends each record to the
/// publisher picked by a stable hash of its ordering key: one key always goes through one
/// publisher, which keeps the key's order.
pub struct Fetcher {
    /// The outbox's name: the `outbox` field of its log lines.
    outbox: Arc<str>,
    /// The outbox table.
    store: Arc<dyn OutboxStore>,
    /// The publisher pool, indexed by key hash.
    publishers: Vec<PublisherHandle>,
    /// Told whenever outcomes are written: capacity is free, and rows held back behind
    /// them (same key) may be claimable now.
    scheduler: Recipient<Wake>,
    /// Node, batch size, lease and ordering of every claim.
    request: ClaimRequest,
    /// Rows the next claim asks for. While claims come back full (a backlog drains), each
    /// asks for twice the rows of the last, up to the in-flight bound (4 × `batch_size`),
    /// and never for more than the bound leaves: a claim's fixed costs (its transaction,
    /// round trips and lock) are paid per claim, not per row. The first claim that comes
    /// back short asks for `batch_size` again.
    next_limit: usize,
    /// Claimed rows whose outcome is not written yet.
    in_flight: usize,
    /// Bound on `in_flight`; also bounds the outcomes waiting in the Marker.
    max_in_flight: usize,
    /// Envelope bytes of the rows in `in_flight`.
    in_flight_bytes: usize,
    /// Bound on `in_flight_bytes`, give or take the last row of a claim: what the relay's
    /// memory follows when rows are large (`relay.max_inflight_bytes`).
    max_in_flight_bytes: usize,
    /// Shutdown has begun: no more claims.
    stopped: bool,
    /// After a failed claim: no claim before this instant ([`CLAIM_BACKOFF`]).
    retry_at: Option<Instant>,
    /// The next claim first releases this node's leases, which with nothing in flight are
    /// rows no publisher holds: at start, those an earlier, ended run of this node left
    /// (the node is held, so no live process relays as it); after a failed claim, those
    /// it may have committed with its answer lost (later rows of their keys could overtake
    /// them), so no claim starts while rows are in flight. A release that fails is retried
    /// with the claim, with backoff. See docs/design/claims.md#releases.
    release_first: Option<Release>,
    /// Whether this node's lock stands: no claim while it does not (its session failed and
    /// another process may be taking the node), as the claim would race that process's.
    holding: Holding,
    /// Between claims while they fail.
    backoff: Backoff,
    /// The last lease renewal failed (its recovery is logged once).
    renewals_failing: bool,
    /// A Tick was turned away, or its claim cut short, until outcomes are written (the
    /// in-flight bound, or orphans of a failed claim): the next [`Marked`] wakes the
    /// Scheduler.
    deferred: bool,
    /// New rows wake the Scheduler themselves ([`InsertsAnnounced`]): then only a
    /// `deferred` claim needs a [`Marked`] to wake it, since a written outcome makes no row
    /// claimable for this node. Without announcements every Marked wakes the Scheduler, so
    /// the relay keeps looking for new events. See docs/design/wake-ups.md#outcome-wake-ups.
    announced: bool,
    /// `outbox_claim_batch_size`.
    sizes: ClaimSizes,
    /// Where the next claim starts its scan while a backlog drains.
    floor: ScanFloor,
    /// The highest position this Fetcher has claimed: every row it holds is at or below
    /// it, so a renewal reads no further (the backlog behind stays unread).
    last_claimed: Option<i64>,
}

/// Whose leases the next claim releases first ([`Fetcher`]'s `release_first`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Release {
    /// An earlier, ended run's: this node's first claim.
    EarlierRun,
    /// A failed claim's, committed with its answer lost.
    FailedClaim,
}

/// Claims after a failed one: 100 ms doubling to 10 s, jittered.
pub const CLAIM_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(10));

impl Fetcher {
    /// A fetcher of outbox `outbox` claiming `request.limit` rows at a time with at most
    /// `max_in_flight` unresolved rows of at most `max_in_flight_bytes` envelope bytes
    /// (exceeded by one row at most). `request.max_bytes` is set per claim.
    pub fn new(
        outbox: &str,
        store: Arc<dyn OutboxStore>,
        publishers: Vec<PublisherHandle>,
        scheduler: Recipient<Wake>,
        request: ClaimRequest,
        max_in_flight: usize,
        max_in_flight_bytes: usize,
    ) -> Self {
        assert!(
            !publishers.is_empty(),
            "the relay needs at least one publisher"
        );
        Self {
            outbox: outbox.into(),
            store,
            publishers,
            scheduler,
            next_limit: request.limit,
            request,
            in_flight: 0,
            max_in_flight: max_in_flight.max(1),
            in_flight_bytes: 0,
            max_in_flight_bytes: max_in_flight_bytes.max(1),
            stopped: false,
            retry_at: None,
            release_first: Some(Release::EarlierRun),
            holding: Holding::default(),
            backoff: CLAIM_BACKOFF,
            renewals_failing: false,
            deferred: false,
            announced: false,
            sizes: ClaimSizes::new(outbox),
            floor: ScanFloor::default(),
            last_claimed: None,
        }
    }

    /// The same fetcher, claiming only while `holding` says this node's lock stands.
    pub fn with_holding(mut self, holding: Holding) -> Self {
        self.holding = holding;
        self
    }
}

/// FNV-1a: stable across processes and Rust versions, unlike `DefaultHasher`.
pub fn key_hash(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The publisher index for `key` in a pool of `pool` publishers.
pub fn publisher_for(key: &str, pool: usize) -> usize {
    (key_hash(key) % pool as u64) as usize
}

impl Actor for Fetcher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Renew this node's leases well before they expire: rows may stay in flight longer
        // than a lease when the broker or the database is slow.
        let every = (self.request.lease / 3).max(Duration::from_millis(100));
        ctx.run_interval(every, |fetcher, ctx| {
            if fetcher.stopped || fetcher.in_flight == 0 {
                return;
            }
            let store = Arc::clone(&fetcher.store);
            let node_id = fetcher.request.node_id.clone();
            let lease = fetcher.request.lease;
            let up_to = fetcher.last_claimed;
            ctx.spawn(
                async move { store.renew(&node_id, lease, up_to).await }
                    .into_actor(fetcher)
                    .map(|renewed, fetcher, _| {
                        let outbox = &fetcher.outbox;
                        // Said once when renewals begin to fail and once when they work
                        // again; the next interval retries.
                        match (renewed, fetcher.renewals_failing) {
                            (Ok(renewed), failing) => {
                                if failing {
                                    info!(%outbox, renewed, "renewing leases works again");
                                }
                                debug!(%outbox, renewed, "leases renewed");
                                fetcher.renewals_failing = false;
                            }
                            (Err(error), false) => {
                                warn!(%outbox, %error, "renewing leases failed; retrying at each renewal");
                                fetcher.renewals_failing = true;
                            }
                            (Err(error), true) => {
                                debug!(%outbox, %error, "renewing leases failed again");
                            }
                        }
                    }),
            );
        });
    }
}

impl Handler<Tick> for Fetcher {
    type Result = AtomicResponse<Self, TickReport>;

    fn handle(&mut self, _: Tick, _: &mut Self::Context) -> Self::Result {
        // Bytes are a bound only once something is in flight: with nothing in flight one
        // row is always claimed, however large, so every row the broker takes flows.
        let byte_room = match self.in_flight {
            0 => self.max_in_flight_bytes,
            _ => self
                .max_in_flight_bytes
                .saturating_sub(self.in_flight_bytes),
        };
        let room = match byte_room {
            0 => 0,
            _ => self.max_in_flight.saturating_sub(self.in_flight),
        };
        let backing_off =
            self.retry_at.is_some_and(|at| Instant::now() < at) || !self.holding.stands();
        let waiting_for_orphans = self.release_first.is_some() && self.in_flight > 0;
        if room == 0 || waiting_for_orphans {
            self.deferred = true;
        }
        if self.stopped || room == 0 || backing_off || waiting_for_orphans {
            return AtomicResponse::new(Box::pin(fut::ready(TickReport::default())));
        }
        let mut request = self.request.clone();
        request.limit = self.next_limit;
        if room < request.limit {
            request.limit = room;
            self.deferred = true;
        }
        request.max_bytes = Some(byte_room);
        let now = Instant::now();
        request.floor = self.floor.next(now);
        let store = Arc::clone(&self.store);
        let release_first = self.release_first;
        let outbox = Arc::clone(&self.outbox);
        AtomicResponse::new(Box::pin(
            async move {
                let started = std::time::Instant::now();
                let mut released = None;
                let claimed = match release_first {
                    Some(_) => match store.release_node(&request.node_id).await {
                        Ok(count) => {
                            released = Some(count);
                            if release_first == Some(Release::EarlierRun) && count > 0 {
                                let node_id = &request.node_id;
                                info!(%outbox, released = count, %node_id, "released leases left by an earlier run of this node, which has ended");
                            }
                            store.claim_with_floor(&request).await
                        }
                        Err(error) => Err(error),
                    },
                    None => store.claim_with_floor(&request).await,
                };
                (request.limit, request.floor, claimed, started.elapsed(), released)
            }
            .into_actor(self)
            .map(move |(limit, asked, claimed, took, released), fetcher, ctx| match claimed {
                Ok(claimed) => {
                    fetcher.release_first = None;
                    if fetcher.retry_at.take().is_some() {
                        info!(outbox = %fetcher.outbox, "database available again; claiming");
                    }
                    fetcher.backoff.reset();
                    let records = &claimed.records;
                    let bytes: usize = records.iter().map(|record| record.envelope.len()).sum();
                    let cut_by_bytes = bytes >= byte_room;
                    let full = records.len() == limit;
                    fetcher.floor.claimed(now, asked, &claimed, full || cut_by_bytes);
                    fetcher.next_limit = match full && !cut_by_bytes {
                        true => (fetcher.next_limit * 2).min(fetcher.max_in_flight),
                        false => fetcher.request.limit,
                    };
                    let records = claimed.records;
                    let highest = records.iter().map(|record| record.id).max();
                    fetcher.last_claimed = fetcher.last_claimed.max(highest);
                    let claimed = records.len();
                    fetcher.sizes.claimed(claimed, took);
                    fetcher.in_flight += claimed;
                    fetcher.in_flight_bytes += bytes;
                    if cut_by_bytes {
                        // Cut short by the byte budget: claim again once outcomes free some.
                        fetcher.deferred = true;
                    }
                    let pool = fetcher.publishers.len();
                    for record in records {
                        let index = publisher_for(&record.key, pool);
                        fetcher.publishers[index].publish.do_send(Publish(record));
                    }
                    if claimed > 0 {
                        debug!(outbox = %fetcher.outbox, claimed, bytes, in_flight = fetcher.in_flight, in_flight_bytes = fetcher.in_flight_bytes, floor = asked, ?took, "claimed");
                    }
                    TickReport { claimed, full }
                }
                Err(error) => {
                    // The rows stay pending and unclaimed; the Scheduler is woken once the
                    // backoff has passed, so the retry does not wait for a poll that wake-ups
                    // made rare. The transition is logged once, not every retry.
                    let retry_in = fetcher.backoff.next_delay();
                    ctx.run_later(retry_in, |fetcher, _| fetcher.scheduler.do_send(Wake));
                    if fetcher.retry_at.is_none() {
                        warn!(outbox = %fetcher.outbox, %error, "database unavailable: claims fail; retrying with backoff");
                    } else {
                        debug!(outbox = %fetcher.outbox, %error, ?retry_in, "claim failed again");
                    }
                    // A claim that fails may have committed; a release that fails has
                    // released nothing yet.
                    fetcher.release_first = match (released, release_first) {
                        (None, Some(earlier)) => Some(earlier),
                        _ => Some(Release::FailedClaim),
                    };
                    fetcher.next_limit = fetcher.request.limit;
                    fetcher.floor.forget();
                    fetcher.retry_at = Some(Instant::now() + retry_in);
                    TickReport::default()
                }
            }),
        ))
    }
}

impl Handler<Marked> for Fetcher {
    type Result = ();

    fn handle(&mut self, marked: Marked, _: &mut Self::Context) {
        self.in_flight = self.in_flight.saturating_sub(marked.count);
        self.in_flight_bytes = match self.in_flight {
            0 => 0,
            _ => self.in_flight_bytes.saturating_sub(marked.bytes),
        };
        // Forwarded from here, not sent by the Marker directly: Tick is atomic, so no claim
        // is under way now, and every row claimed before this commit has already been sent
        // to its publisher ahead of this Unhold. A claim that starts later sees the commit.
        let pool = self.publishers.len();
        for (key, count) in marked.unheld {
            let index = publisher_for(&key, pool);
            self.publishers[index].unhold.do_send(Unhold { key, count });
        }
        // Claim again now rather than at the next poll. With inserts announced, only if a
        // claim waited for this capacity: waking on every Marked as well kept claims
        // running back to back under a steady trickle, each new event already having
        // woken one.
        if (self.deferred || !self.announced) && !self.stopped {
            self.deferred = false;
            self.scheduler.do_send(Wake);
        }
    }
}

impl Handler<Stop> for Fetcher {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Self::Context) {
        self.stopped = true;
        ctx.stop();
    }
}

impl Handler<InsertsAnnounced> for Fetcher {
    type Result = ();

    fn handle(&mut self, InsertsAnnounced(announced): InsertsAnnounced, _: &mut Self::Context) {
        self.announced = announced;
    }
}

impl Handler<StopClaiming> for Fetcher {
    type Result = ();

    fn handle(&mut self, _: StopClaiming, _: &mut Self::Context) {
        // The Tick handler is atomic, so any claim under way has been dispatched by now.
        self.stopped = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::{eventually, record, Collector, FakeStore};
    use outbox_core::{Ordering, OutboxRecord};
    use std::sync::atomic::Ordering as AtomicOrdering;

    /// A fetcher with a pool of one collecting publisher, and the Scheduler's view.
    struct Rig {
        fetcher: Addr<Fetcher>,
        published: crate::fakes::Seen<Publish>,
        scheduler: Addr<Collector<Wake>>,
        wakes: crate::fakes::Seen<Wake>,
    }

    fn rig(store: Arc<FakeStore>, lease: Duration) -> Rig {
        budgeted_rig(store, lease, usize::MAX)
    }

    fn budgeted_rig(store: Arc<FakeStore>, lease: Duration, max_bytes: usize) -> Rig {
        let (publish, published) = Collector::<Publish>::start();
        let (unhold, _) = Collector::<Unhold>::start();
        let (scheduler, wakes) = Collector::<Wake>::start();
        let handle = PublisherHandle {
            publish: publish.recipient(),
            unhold: unhold.recipient(),
        };
        let request = ClaimRequest {
            node_id: "n1".into(),
            limit: 10,
            lease,
            ordering: Ordering::PerRoom,
            max_bytes: None,
            floor: None,
        };
        let fetcher = Fetcher::new(
            "room_outbox",
            store,
            vec![handle],
            scheduler.clone().recipient(),
            request,
            20,
            max_bytes,
        )
        .start();
        Rig {
            fetcher,
            published,
            scheduler,
            wakes,
        }
    }

    fn fetcher(
        store: Arc<FakeStore>,
        lease: Duration,
    ) -> (Addr<Fetcher>, crate::fakes::Seen<Publish>) {
        let rig = rig(store, lease);
        (rig.fetcher, rig.published)
    }

    #[actix_rt::test]
    async fn in_flight_rows_keep_their_leases_renewed_up_to_the_highest_claimed() {
        let store = Arc::new(FakeStore::default());
        store
            .claimable
            .lock()
            .unwrap()
            .extend([record(7, "a"), record(3, "b")]);
        let (fetcher, published) = fetcher(Arc::clone(&store), Duration::from_millis(300));
        let report = fetcher.send(Tick).await.unwrap();
        assert_eq!(
            report,
            TickReport {
                claimed: 2,
                full: false
            }
        );
        published.wait_for(2, Duration::from_secs(5)).await;
        eventually("two renewals", Duration::from_secs(5), || {
            store.renewals.load(AtomicOrdering::SeqCst) >= 2
        })
        .await;
        let up_to = store.renewed_up_to.lock().unwrap().clone();
        assert!(up_to.iter().all(|up_to| *up_to == Some(7)), "{up_to:?}");
    }

    #[actix_rt::test]
    async fn claims_stop_at_the_in_flight_bound_until_outcomes_are_written() {
        let store = Arc::new(FakeStore::default());
        store
            .claimable
            .lock()
            .unwrap()
            .extend((1..=30).map(|id| record(id, "a")));
        let (fetcher, _published) = fetcher(Arc::clone(&store), Duration::from_secs(30));
        assert_eq!(fetcher.send(Tick).await.unwrap().claimed, 10);
        assert_eq!(fetcher.send(Tick).await.unwrap().claimed, 10);
        assert_eq!(
            fetcher.send(Tick).await.unwrap().claimed,
            0,
            "20 rows in flight: the bound"
        );
        fetcher.do_send(Marked {
            count: 5,
            bytes: 0,
            unheld: Vec::new(),
        });
        assert_eq!(fetcher.send(Tick).await.unwrap().claimed, 5);
        fetcher.do_send(StopClaiming);
        fetcher.do_send(Marked {
            count: 25,
            bytes: 0,
            unheld: Vec::new(),
        });
        assert_eq!(
            fetcher.send(Tick).await.unwrap().claimed,
            0,
            "stopped: no more claims"
        );
    }

    #[actix_rt::test]
    async fn claims_grow_while_a_backlog_drains_and_shrink_when_one_comes_back_short() {
        let store = Arc::new(FakeStore::default());
        let add = |ids: std::ops::RangeInclusive<i64>| {
            let mut claimable = store.claimable.lock().unwrap();
            claimable.extend(ids.map(|id| record(id, "a")));
        };
        add(1..=50);
        let (fetcher, _published) = fetcher(Arc::clone(&store), Duration::from_secs(30));
        let mut claims = Vec::new();
        for _ in 0..4 {
            let claimed = fetcher.send(Tick).await.unwrap().claimed;
            claims.push(claimed);
            // Every claimed row's outcome written: the whole window is free again.
            fetcher.do_send(marked(claimed, 0));
        }
        // batch_size 10 and an in-flight bound of 20: 10, full, then twice that (the
        // bound), and nothing left to claim.
        assert_eq!(claims, [10, 20, 20, 0]);
        add(51..=80);
        assert_eq!(
            fetcher.send(Tick).await.unwrap().claimed,
            10,
            "after a short claim, batch_size again"
        );
    }

    /// A record of key `key` whose envelope is `bytes` long.
    fn sized(id: i64, key: &str, bytes: usize) -> OutboxRecord {
        let mut record = record(id, key);
        record.envelope = vec![b'x'; bytes];
        record
    }

    fn marked(count: usize, bytes: usize) -> Marked {
        Marked {
            count,
            bytes,
            unheld: Vec::new(),
        }
    }

    #[actix_rt::test]
    async fn large_rows_are_claimed_within_the_byte_budget() {
        let store = Arc::new(FakeStore::default());
        store
            .claimable
            .lock()
            .unwrap()
            .extend((1..=12).map(|id| sized(id, if id % 2 == 0 { "a" } else { "b" }, 1_000)));
        let rig = budgeted_rig(Arc::clone(&store), Duration::from_secs(30), 2_500);
        // 0, 1,000 and 2,000 bytes before: three rows, 3,000 bytes (the budget plus one row).
        assert_eq!(rig.fetcher.send(Tick).await.unwrap().claimed, 3);
        assert_eq!(
            rig.fetcher.send(Tick).await.unwrap().claimed,
            0,
            "the budget is spent"
        );
        // 2,000 bytes in flight: 500 left, so one more row, however large.
        rig.fetcher.do_send(marked(1, 1_000));
        assert_eq!(rig.fetcher.send(Tick).await.unwrap().claimed, 1);
        assert_eq!(rig.fetcher.send(Tick).await.unwrap().claimed, 0);
        rig.fetcher.do_send(marked(3, 3_000));
        assert_eq!(rig.fetcher.send(Tick).await.unwrap().claimed, 3);
        let ids: Vec<i64> = rig
            .published
            .wait_for(7, Duration::from_secs(5))
            .await
            .iter()
            .map(|Publish(record)| record.id)
            .collect();
        assert_eq!(ids, (1..=7).collect::<Vec<_>>(), "claimed in id order");
    }

    #[actix_rt::test]
    async fn a_row_larger_than_the_byte_budget_still_flows_one_at_a_time() {
        let store = Arc::new(FakeStore::default());
        store
            .claimable
            .lock()
            .unwrap()
            .extend((1..=3).map(|id| sized(id, "a", 10_000)));
        let rig = budgeted_rig(Arc::clone(&store), Duration::from_secs(30), 100);
        for _ in 0..3 {
            assert_eq!(rig.fetcher.send(Tick).await.unwrap().claimed, 1);
            assert_eq!(
                rig.fetcher.send(Tick).await.unwrap().claimed,
                0,
                "one row at a time"
            );
            rig.fetcher.do_send(marked(1, 10_000));
        }
        rig.published.wait_for(3, Duration::from_secs(5)).await;
    }

    #[actix_rt::test]
    async fn a_claim_cut_by_the_byte_budget_is_woken_by_the_next_written_outcome() {
        let store = Arc::new(FakeStore::default());
        store
            .claimable
            .lock()
            .unwrap()
            .extend((1..=4).map(|id| sized(id, "a", 1_000)));
        let rig = budgeted_rig(Arc::clone(&store), Duration::from_secs(30), 1_500);
        rig.fetcher.do_send(InsertsAnnounced(true));
        assert_eq!(rig.fetcher.send(Tick).await.unwrap().claimed, 2);
        // Announced inserts wake the Scheduler only for a claim that waited: this one did.
        rig.fetcher.do_send(marked(2, 2_000));
        rig.wakes.wait_for(1, Duration::from_secs(5)).await;
    }

    #[actix_rt::test]
    async fn with_announced_inserts_outcomes_wake_the_scheduler_only_when_a_claim_waited() {
        let store = Arc::new(FakeStore::default());
        store
            .claimable
            .lock()
            .unwrap()
            .extend((1..=25).map(|id| record(id, "a")));
        let rig = rig(Arc::clone(&store), Duration::from_secs(30));
        rig.fetcher.do_send(InsertsAnnounced(true));
        // How many Wakes the Fetcher has sent: once the collector has answered the test's
        // own Wake, every Wake queued ahead of it has been handled.
        let mine = std::cell::Cell::new(0);
        let fetchers_wakes = || async {
            rig.scheduler.send(Wake).await.unwrap();
            mine.set(mine.get() + 1);
            rig.wakes.wait_for(0, Duration::ZERO).await.len() - mine.get()
        };
        assert_eq!(rig.fetcher.send(Tick).await.unwrap().claimed, 10);
        rig.fetcher.do_send(Marked {
            count: 5,
            bytes: 0,
            unheld: Vec::new(),
        });
        rig.fetcher.send(Tick).await.unwrap();
        assert_eq!(
            fetchers_wakes().await,
            0,
            "no claim waited for that capacity"
        );
        // 15 rows in flight: this claim is cut short at the bound of 20.
        rig.fetcher.send(Tick).await.unwrap();
        rig.fetcher.do_send(Marked {
            count: 1,
            bytes: 0,
            unheld: Vec::new(),
        });
        rig.fetcher.do_send(Marked {
            count: 1,
            bytes: 0,
            unheld: Vec::new(),
        });
        rig.fetcher.send(Tick).await.unwrap();
        assert_eq!(
            fetchers_wakes().await,
            1,
            "one wake for the claim that waited"
        );
    }

    #[actix_rt::test]
    async fn without_announced_inserts_every_written_outcome_wakes_the_scheduler() {
        let store = Arc::new(FakeStore::default());
        store
            .claimable
            .lock()
            .unwrap()
            .extend([record(1, "a"), record(2, "b")]);
        let rig = rig(Arc::clone(&store), Duration::from_secs(30));
        assert_eq!(rig.fetcher.send(Tick).await.unwrap().claimed, 2);
        rig.fetcher.do_send(Marked {
            count: 1,
            bytes: 0,
            unheld: Vec::new(),
        });
        rig.wakes.wait_for(1, Duration::from_secs(5)).await;
        // The listener came and went (a lost connection): back to waking on outcomes.
        rig.fetcher.do_send(InsertsAnnounced(true));
        rig.fetcher.do_send(InsertsAnnounced(false));
        rig.fetcher.do_send(Marked {
            count: 1,
            bytes: 0,
            unheld: Vec::new(),
        });
        rig.wakes.wait_for(2, Duration::from_secs(5)).await;
    }

    #[actix_rt::test]
    async fn after_a_failed_claim_orphaned_leases_are_released_before_claiming_again() {
        let store = Arc::new(FakeStore::default());
        store
            .claimable
            .lock()
            .unwrap()
            .extend((1..=15).map(|id| record(id, "a")));
        let (fetcher, _published) = fetcher(Arc::clone(&store), Duration::from_secs(30));
        assert_eq!(fetcher.send(Tick).await.unwrap().claimed, 10);
        let releases = || store.node_releases.load(AtomicOrdering::SeqCst);
        assert_eq!(releases(), 1, "the first claim released an earlier run's");
        store.failing_claims.store(1, AtomicOrdering::SeqCst);
        assert_eq!(
            fetcher.send(Tick).await.unwrap().claimed,
            0,
            "the claim failed"
        );
        // Past the claim backoff (the clock is moved, not waited for; a first wait is at
        // most 100 ms), but ten rows are still in flight: no claim, since an orphan of the
        // failed claim could be overtaken.
        tokio::time::pause();
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(fetcher.send(Tick).await.unwrap().claimed, 0);
        assert_eq!(releases(), 1);
        fetcher.do_send(Marked {
            count: 10,
            bytes: 0,
            unheld: Vec::new(),
        });
        assert_eq!(fetcher.send(Tick).await.unwrap().claimed, 5);
        assert_eq!(
            releases(),
            2,
            "nothing in flight: this node's leases were released first"
        );
        assert_eq!(
            fetcher.send(Tick).await.unwrap().claimed,
            0,
            "the table is drained"
        );
        assert_eq!(releases(), 2, "released once, not on every claim");
    }

    #[actix_rt::test]
    async fn a_failed_release_of_an_earlier_runs_leases_is_retried_before_the_first_claim() {
        let store = Arc::new(FakeStore::default());
        store.claimable.lock().unwrap().push(record(1, "a"));
        store.failing_releases.store(2, AtomicOrdering::SeqCst);
        let rig = rig(Arc::clone(&store), Duration::from_secs(30));
        assert_eq!(rig.fetcher.send(Tick).await.unwrap().claimed, 0);
        // The backoff's own wakes, not waited for: the clock is moved past each delay.
        tokio::time::pause();
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(rig.fetcher.send(Tick).await.unwrap().claimed, 0);
        tokio::time::advance(Duration::from_millis(200)).await;
        assert_eq!(rig.fetcher.send(Tick).await.unwrap().claimed, 1);
        assert_eq!(store.node_releases.load(AtomicOrdering::SeqCst), 3);
        assert_eq!(
            store.claims.load(AtomicOrdering::SeqCst),
            1,
            "no claim before the release went through"
        );
    }

    #[actix_rt::test]
    async fn a_failed_claim_wakes_the_scheduler_once_its_backoff_has_passed() {
        let store = Arc::new(FakeStore::default());
        store.failing_claims.store(1, AtomicOrdering::SeqCst);
        let rig = rig(Arc::clone(&store), Duration::from_secs(30));
        assert_eq!(rig.fetcher.send(Tick).await.unwrap().claimed, 0);
        // No tick comes from anywhere else here: the retry is the Fetcher's own doing.
        rig.wakes.wait_for(1, Duration::from_secs(5)).await;
        store.claimable.lock().unwrap().push(record(1, "a"));
        assert_eq!(rig.fetcher.send(Tick).await.unwrap().claimed, 1);
    }

    #[actix_rt::test]
    async fn stop_ends_the_fetcher_and_lets_go_of_the_store() {
        let store = Arc::new(FakeStore::default());
        let (fetcher, _published) = fetcher(Arc::clone(&store), Duration::from_millis(300));
        assert_eq!(Arc::strong_count(&store), 2, "the fetcher holds the store");
        fetcher.send(Stop).await.expect("stop answered");
        eventually(
            "the fetcher to drop the store",
            Duration::from_secs(5),
            || Arc::strong_count(&store) == 1,
        )
        .await;
        assert!(!fetcher.connected());
    }

    #[test]
    fn a_key_maps_to_its_publisher_by_a_hash_stable_across_processes() {
        // Published FNV-1a test vectors: any other hash (say `DefaultHasher`) fails here.
        assert_eq!(key_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(key_hash("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(key_hash("foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(publisher_for("foobar", 7), 6, "the hash modulo the pool");
    }

    #[test]
    fn keys_spread_over_the_pool() {
        let mut used = [0usize; 4];
        for key in 0..400 {
            used[publisher_for(&format!("room-{key}"), 4)] += 1;
        }
        assert!(used.iter().all(|&n| n > 50), "{used:?}");
    }
}
