//! [`Listener`]: wakes the relay when the database announces inserts.

use crate::fetcher::InsertsAnnounced;
use crate::scheduler::Wake;
use actix::prelude::*;
use outbox_core::{Backoff, InsertFeed, StoreError};
use std::time::Duration;
use tracing::{info, warn};

/// Stop listening (first step of a shutdown); the feed's connection closes with the actor.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct StopListening;

/// Reconnection attempts of the feed: 100 ms doubling to 10 s, jittered.
pub const BACKOFF: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(10));

/// Waits on an [`InsertFeed`] and sends [`Wake`] whenever it answers: new rows, a fresh
/// connection, or one re-established after a loss (notifications may have been missed).
/// A feed that cannot connect is retried with [`BACKOFF`], and the Fetcher is told
/// ([`InsertsAnnounced`]) whether the feed is listening. Polling goes on regardless, so a
/// lost feed only costs latency. See docs/design/wake-ups.md#insert-feeds.
pub struct Listener {
    /// The feed; taken out while a wait is under way.
    feed: Option<Box<dyn InsertFeed>>,
    /// Claims at once on each answer of the feed.
    scheduler: Recipient<Wake>,
    /// Told whether inserts wake the relay.
    fetcher: Recipient<InsertsAnnounced>,
    /// What the Fetcher was last told; it starts out knowing of no feed.
    announced: bool,
    /// Between attempts while the feed cannot connect.
    backoff: Backoff,
    /// The feed's mechanism, for log lines.
    kind: &'static str,
    /// The outbox whose inserts it hears of: the `outbox` field of its log lines.
    outbox: String,
}

impl Listener {
    /// A listener of outbox `outbox` waking `scheduler` on each answer of `feed`.
    pub fn new(
        outbox: &str,
        feed: Box<dyn InsertFeed>,
        scheduler: Recipient<Wake>,
        fetcher: Recipient<InsertsAnnounced>,
    ) -> Self {
        Self {
            kind: feed.kind(),
            outbox: outbox.to_owned(),
            feed: Some(feed),
            scheduler,
            fetcher,
            announced: false,
            backoff: BACKOFF,
        }
    }

    /// Waits for the feed's next answer, unless the relay is gone.
    fn wait(&mut self, ctx: &mut Context<Self>) {
        if !self.scheduler.connected() {
            ctx.stop();
            return;
        }
        let Some(mut feed) = self.feed.take() else {
            return;
        };
        async move {
            let answer = feed.wait().await;
            (feed, answer)
        }
        .into_actor(self)
        .map(|(feed, answer), listener, ctx| {
            listener.feed = Some(feed);
            listener.answered(answer, ctx);
        })
        .spawn(ctx);
    }

    fn answered(&mut self, answer: Result<(), StoreError>, ctx: &mut Context<Self>) {
        match answer {
            Ok(()) => {
                if !self.announced {
                    if !self.backoff.is_reset() {
                        info!(outbox = %self.outbox, feed = self.kind, "insert wake-ups available again");
                    }
                    self.fetcher.do_send(InsertsAnnounced(true));
                    self.announced = true;
                }
                self.backoff.reset();
                self.scheduler.do_send(Wake);
                self.wait(ctx);
            }
            Err(error) => {
                if self.backoff.is_reset() {
                    warn!(outbox = %self.outbox, feed = self.kind, %error, "insert wake-ups unavailable; polling until they are back");
                }
                if self.announced {
                    self.fetcher.do_send(InsertsAnnounced(false));
                    self.announced = false;
                }
                ctx.run_later(self.backoff.next_delay(), |listener, ctx| {
                    listener.wait(ctx)
                });
            }
        }
    }
}

impl Actor for Listener {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.wait(ctx);
    }
}

impl Handler<StopListening> for Listener {
    type Result = ();

    fn handle(&mut self, _: StopListening, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::{eventually, Collector, FakeFeed};

    const DEADLINE: Duration = Duration::from_secs(5);

    struct Rig {
        listener: Addr<Listener>,
        feed: FakeFeed,
        wakes: crate::fakes::Seen<Wake>,
        announced: crate::fakes::Seen<InsertsAnnounced>,
    }

    fn rig(answers: &[bool]) -> Rig {
        let feed = FakeFeed::answering(answers);
        let (scheduler, wakes) = Collector::<Wake>::start();
        let (fetcher, announced) = Collector::<InsertsAnnounced>::start();
        let listener = Listener::new(
            "room_outbox",
            Box::new(feed.clone()),
            scheduler.recipient(),
            fetcher.recipient(),
        )
        .start();
        Rig {
            listener,
            feed,
            wakes,
            announced,
        }
    }

    fn told(announced: &[InsertsAnnounced]) -> Vec<bool> {
        announced.iter().map(|told| told.0).collect()
    }

    #[actix_rt::test]
    async fn a_feed_that_cannot_connect_is_retried_with_backoff_and_announced_once_it_does() {
        // The clock moves by itself whenever every task waits on it.
        tokio::time::pause();
        let rig = rig(&[false, false, true]);
        rig.wakes.wait_for(1, DEADLINE).await;
        let calls = rig.feed.calls();
        assert!(calls.len() >= 3, "{calls:?}");
        let (first, second) = (calls[1] - calls[0], calls[2] - calls[1]);
        let ms = Duration::from_millis;
        assert!(
            first >= ms(50) && first <= ms(100),
            "first retry after {first:?}"
        );
        assert!(
            second >= ms(100) && second <= ms(200),
            "second after {second:?}"
        );
        let announced = rig.announced.wait_for(1, DEADLINE).await;
        assert_eq!(
            told(&announced),
            [true],
            "never said to listen before it did"
        );
    }

    #[actix_rt::test]
    async fn each_answer_wakes_the_relay_and_a_lost_connection_is_announced_until_back() {
        tokio::time::pause();
        // Connected, an insert, the connection lost and not re-established at once, back.
        let rig = rig(&[true, true, false, true]);
        let wakes = rig.wakes.wait_for(3, DEADLINE).await;
        assert_eq!(wakes.len(), 3);
        let announced = rig.announced.wait_for(3, DEADLINE).await;
        assert_eq!(told(&announced), [true, false, true]);
        // Still listening: the next insert wakes it too, and nothing new is announced.
        rig.feed.answer(true);
        rig.wakes.wait_for(4, DEADLINE).await;
        assert_eq!(rig.announced.wait_for(3, DEADLINE).await.len(), 3);
    }

    #[actix_rt::test]
    async fn stopping_the_listener_closes_the_feed() {
        let rig = rig(&[true]);
        rig.wakes.wait_for(1, DEADLINE).await;
        rig.listener.send(StopListening).await.unwrap();
        eventually("the feed to be dropped", DEADLINE, || rig.feed.dropped()).await;
        assert!(!rig.listener.connected());
    }
}
