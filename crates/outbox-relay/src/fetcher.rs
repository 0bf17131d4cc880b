//! [`Fetcher`]: claims batches and hands each record to its room's publisher.

use crate::instruments::ClaimSizes;
use crate::publisher::{Publish, Unhold};
use crate::scheduler::Wake;
use actix::prelude::*;
use outbox_core::{Backoff, ClaimRequest, OutboxStore};
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
    /// Per room, how many of them were failures or releases (which hold their room back
    /// in its Publisher until written).
    pub unheld: Vec<(String, usize)>,
}

/// The two messages the Fetcher sends one publisher of the pool.
#[derive(Clone)]
pub struct PublisherHandle {
    /// Records to publish.
    pub publish: Recipient<Publish>,
    /// Written failures and releases of a held room.
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

/// Claims up to `batch_size` rows per [`Tick`], one claim at a time (the Tick handler is
/// atomic), keeps the rows in flight below `max_in_flight`, and sends each record to the
/// publisher picked by a stable hash of its room: one room always goes through one
/// publisher, which keeps the room's order.
pub struct Fetcher {
    /// The outbox's name: the `outbox` field of its log lines.
    outbox: Arc<str>,
    /// The outbox table.
    store: Arc<dyn OutboxStore>,
    /// The publisher pool, indexed by room hash.
    publishers: Vec<PublisherHandle>,
    /// Told whenever outcomes are written: capacity is free, and rows held back behind
    /// them (same room) may be claimable now.
    scheduler: Recipient<Wake>,
    /// Node, batch size, lease and ordering of every claim.
    request: ClaimRequest,
    /// Claimed rows whose outcome is not written yet.
    in_flight: usize,
    /// Bound on `in_flight`; also bounds the outcomes waiting in the Marker.
    max_in_flight: usize,
    /// Shutdown has begun: no more claims.
    stopped: bool,
    /// After a failed claim: no claim before this instant ([`CLAIM_BACKOFF`]).
    retry_at: Option<Instant>,
    /// A failed claim may have committed with its answer lost, leaving rows leased to this
    /// node that no publisher holds (later rows of their rooms could overtake them). So no
    /// claim starts while rows are in flight, and the next one first releases this node's
    /// leases: with nothing in flight, exactly those. See docs/design.md#claims-leases-and-ordering.
    unsure: bool,
    /// Between claims while they fail.
    backoff: Backoff,
    /// A Tick was turned away, or its claim cut short, until outcomes are written (the
    /// in-flight bound, or orphans of a failed claim): the next [`Marked`] wakes the
    /// Scheduler.
    deferred: bool,
    /// New rows wake the Scheduler themselves ([`InsertsAnnounced`]): then only a
    /// `deferred` claim needs a [`Marked`] to wake it, since a written outcome makes no row
    /// claimable for this node. Without announcements every Marked wakes the Scheduler, so
    /// the relay keeps looking for new events. See docs/design.md#wake-ups-and-backoff.
    announced: bool,
    /// `outbox_claim_batch_size`.
    sizes: ClaimSizes,
}

/// Claims after a failed one: 100 ms doubling to 10 s, jittered.
pub const CLAIM_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(10));

impl Fetcher {
    /// A fetcher of outbox `outbox` claiming `request.limit` rows at a time with at most
    /// `max_in_flight` unresolved rows.
    pub fn new(
        outbox: &str,
        store: Arc<dyn OutboxStore>,
        publishers: Vec<PublisherHandle>,
        scheduler: Recipient<Wake>,
        request: ClaimRequest,
        max_in_flight: usize,
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
            request,
            in_flight: 0,
            max_in_flight: max_in_flight.max(1),
            stopped: false,
            retry_at: None,
            unsure: false,
            backoff: CLAIM_BACKOFF,
            deferred: false,
            announced: false,
            sizes: ClaimSizes::new(outbox),
        }
    }
}

/// FNV-1a: stable across processes and Rust versions, unlike `DefaultHasher`.
pub fn room_hash(room_id: &str) -> u64 {
    room_id.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The publisher index for `room_id` in a pool of `pool` publishers.
pub fn publisher_for(room_id: &str, pool: usize) -> usize {
    (room_hash(room_id) % pool as u64) as usize
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
            let outbox = Arc::clone(&fetcher.outbox);
            ctx.spawn(
                async move {
                    match store.renew(&node_id, lease).await {
                        Ok(renewed) => debug!(%outbox, renewed, "leases renewed"),
                        Err(error) => warn!(%outbox, %error, "renewing leases failed; retrying"),
                    }
                }
                .into_actor(fetcher),
            );
        });
    }
}

impl Handler<Tick> for Fetcher {
    type Result = AtomicResponse<Self, TickReport>;

    fn handle(&mut self, _: Tick, _: &mut Self::Context) -> Self::Result {
        let room = self.max_in_flight.saturating_sub(self.in_flight);
        let backing_off = self.retry_at.is_some_and(|at| Instant::now() < at);
        let waiting_for_orphans = self.unsure && self.in_flight > 0;
        if room == 0 || waiting_for_orphans {
            self.deferred = true;
        }
        if self.stopped || room == 0 || backing_off || waiting_for_orphans {
            return AtomicResponse::new(Box::pin(fut::ready(TickReport::default())));
        }
        let mut request = self.request.clone();
        if room < request.limit {
            request.limit = room;
            self.deferred = true;
        }
        let store = Arc::clone(&self.store);
        let release_first = self.unsure;
        AtomicResponse::new(Box::pin(
            async move {
                let started = std::time::Instant::now();
                let claimed = match release_first {
                    true => match store.release_node(&request.node_id).await {
                        Ok(_) => store.claim(&request).await,
                        Err(error) => Err(error),
                    },
                    false => store.claim(&request).await,
                };
                (request.limit, claimed, started.elapsed())
            }
            .into_actor(self)
            .map(|(limit, claimed, took), fetcher, ctx| match claimed {
                Ok(records) => {
                    fetcher.unsure = false;
                    if fetcher.retry_at.take().is_some() {
                        info!(outbox = %fetcher.outbox, "database available again; claiming");
                    }
                    fetcher.backoff.reset();
                    let claimed = records.len();
                    fetcher.sizes.claimed(claimed);
                    fetcher.in_flight += claimed;
                    let pool = fetcher.publishers.len();
                    for record in records {
                        let index = publisher_for(&record.room_id, pool);
                        fetcher.publishers[index].publish.do_send(Publish(record));
                    }
                    if claimed > 0 {
                        debug!(outbox = %fetcher.outbox, claimed, in_flight = fetcher.in_flight, ?took, "claimed");
                    }
                    TickReport {
                        claimed,
                        full: claimed == limit,
                    }
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
                    fetcher.unsure = true;
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
        // Forwarded from here, not sent by the Marker directly: Tick is atomic, so no claim
        // is under way now, and every row claimed before this commit has already been sent
        // to its publisher ahead of this Unhold. A claim that starts later sees the commit.
        let pool = self.publishers.len();
        for (room_id, count) in marked.unheld {
            let index = publisher_for(&room_id, pool);
            self.publishers[index]
                .unhold
                .do_send(Unhold { room_id, count });
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
    use outbox_core::Ordering;
    use std::sync::atomic::Ordering as AtomicOrdering;

    /// A fetcher with a pool of one collecting publisher, and the Scheduler's view.
    struct Rig {
        fetcher: Addr<Fetcher>,
        published: crate::fakes::Seen<Publish>,
        scheduler: Addr<Collector<Wake>>,
        wakes: crate::fakes::Seen<Wake>,
    }

    fn rig(store: Arc<FakeStore>, lease: Duration) -> Rig {
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
        };
        let fetcher = Fetcher::new(
            "room_outbox",
            store,
            vec![handle],
            scheduler.clone().recipient(),
            request,
            20,
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
    async fn in_flight_rows_keep_their_leases_renewed() {
        let store = Arc::new(FakeStore::default());
        store.claimable.lock().unwrap().push(record(1, "a"));
        let (fetcher, published) = fetcher(Arc::clone(&store), Duration::from_millis(300));
        let report = fetcher.send(Tick).await.unwrap();
        assert_eq!(
            report,
            TickReport {
                claimed: 1,
                full: false
            }
        );
        published.wait_for(1, Duration::from_secs(5)).await;
        eventually("two renewals", Duration::from_secs(5), || {
            store.renewals.load(AtomicOrdering::SeqCst) >= 2
        })
        .await;
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
            unheld: Vec::new(),
        });
        assert_eq!(fetcher.send(Tick).await.unwrap().claimed, 5);
        fetcher.do_send(StopClaiming);
        fetcher.do_send(Marked {
            count: 25,
            unheld: Vec::new(),
        });
        assert_eq!(
            fetcher.send(Tick).await.unwrap().claimed,
            0,
            "stopped: no more claims"
        );
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
            unheld: Vec::new(),
        });
        rig.fetcher.do_send(Marked {
            count: 1,
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
            unheld: Vec::new(),
        });
        rig.wakes.wait_for(1, Duration::from_secs(5)).await;
        // The listener came and went (a lost connection): back to waking on outcomes.
        rig.fetcher.do_send(InsertsAnnounced(true));
        rig.fetcher.do_send(InsertsAnnounced(false));
        rig.fetcher.do_send(Marked {
            count: 1,
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
        assert_eq!(store.node_releases.load(AtomicOrdering::SeqCst), 0);
        fetcher.do_send(Marked {
            count: 10,
            unheld: Vec::new(),
        });
        assert_eq!(fetcher.send(Tick).await.unwrap().claimed, 5);
        assert_eq!(
            store.node_releases.load(AtomicOrdering::SeqCst),
            1,
            "nothing in flight: this node's leases were released first"
        );
        assert_eq!(
            fetcher.send(Tick).await.unwrap().claimed,
            0,
            "the table is drained"
        );
        assert_eq!(
            store.node_releases.load(AtomicOrdering::SeqCst),
            1,
            "released once, not on every claim"
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
    fn a_room_maps_to_its_publisher_by_a_hash_stable_across_processes() {
        // Published FNV-1a test vectors: any other hash (say `DefaultHasher`) fails here.
        assert_eq!(room_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(room_hash("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(room_hash("foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(publisher_for("foobar", 7), 6, "the hash modulo the pool");
    }

    #[test]
    fn rooms_spread_over_the_pool() {
        let mut used = [0usize; 4];
        for room in 0..400 {
            used[publisher_for(&format!("room-{room}"), 4)] += 1;
        }
        assert!(used.iter().all(|&n| n > 50), "{used:?}");
    }
}
