//! [`Blocking`]: whether the broker blocks this connection's publishers.
//!
//! RabbitMQ sends `connection.blocked` (with a reason such as `low on memory`) when a
//! resource alarm makes it stop reading from publishing connections, and
//! `connection.unblocked` when the alarm clears. A publish sent meanwhile is not lost, only
//! held: timing it out and publishing it again would deliver it twice once the alarm ends.
//! So publishes wait while the broker blocks, and their `publish_timeout` runs only while
//! it does not ([`Blocking::clock`]). See docs/design/broker.md#broker-alarms.

use futures_lite::StreamExt;
use lapin::{Connection, Event};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

/// How often a follower looks whether its connection is still open.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// The broker's reason while it blocks publishers on the current connection, shared by the
/// link (which follows each connection's events) and its publishers (which wait on it).
#[derive(Debug, Clone)]
pub(crate) struct Blocking {
    state: Arc<watch::Sender<State>>,
}

/// Whether the broker blocks publishers now, and for how long it has blocked them in all.
#[derive(Debug, Default)]
struct State {
    /// The broker's reason, while it blocks.
    reason: Option<String>,
    /// Since when, while it blocks.
    since: Option<Instant>,
    /// Blocked time of the blocks that ended.
    ended: Duration,
}

impl State {
    /// Time the broker blocked publishers, in all, up to `now`.
    fn held(&self, now: Instant) -> Duration {
        self.ended + self.since.map_or(Duration::ZERO, |since| now - since)
    }
}

impl Default for Blocking {
    fn default() -> Self {
        Self {
            state: Arc::new(watch::channel(State::default()).0),
        }
    }
}

impl Blocking {
    /// The broker's reason, while it blocks publishers.
    pub(crate) fn reason(&self) -> Option<String> {
        self.state.borrow().reason.clone()
    }

    /// Follows `connection`'s `connection.blocked` and `connection.unblocked` until the
    /// connection fails or the returned task is aborted (the link aborts it when it drops
    /// the connection). Logs one `warn` when a block begins and one `info` when it ends.
    pub(crate) fn follow(&self, connection: &Connection, url: &str) -> JoinHandle<()> {
        let mut events = connection.events_listener();
        let status = connection.status().clone();
        let state = Arc::clone(&self.state);
        let url = url.to_owned();
        // lapin sends an event only to listeners that exist: a block announced before
        // this one did shows only in the status flag.
        if status.blocked() {
            block(&state, &url, "blocked before the relay listened".into());
        }
        tokio::spawn(async move {
            // A lost connection ends a block too (its publishes fail), even while nothing
            // asks the link for a connection because every publish waits for the unblock.
            let mut look = tokio::time::interval(LOOK_EVERY);
            loop {
                let event = tokio::select! {
                    event = events.next() => event,
                    _ = look.tick() => None,
                };
                match event {
                    Some(Event::ConnectionBlocked(why)) => block(&state, &url, why),
                    Some(Event::ConnectionUnblocked) => {
                        unblock(&state, &url, "the broker unblocked")
                    }
                    _ if !status.connected() => {
                        unblock(&state, &url, "the connection closed");
                        return;
                    }
                    _ => {}
                }
            }
        })
    }

    /// The connection is gone: a new one starts unblocked (the broker blocks it again at
    /// its first publish if the alarm lasts).
    pub(crate) fn forget(&self, url: &str) {
        unblock(&self.state, url, "the connection closed");
    }

    /// Waits until the broker does not block publishers.
    pub(crate) async fn unblocked(&self) {
        if self.state.borrow().reason.is_none() {
            return;
        }
        let mut watching = self.state.subscribe();
        // Only fails when the sender is gone, which `self` holds.
        let _ = watching.wait_for(|state| state.reason.is_none()).await;
    }

    /// A future that completes once `budget` has passed while the broker did not block
    /// publishers: a `publish_timeout` that stands still during an alarm. It sleeps
    /// through the budget and then counts the blocked time that fell inside it (one timer
    /// per publish, nothing to wake it when the broker blocks or unblocks).
    pub(crate) fn clock(&self, budget: Duration) -> impl Future<Output = ()> + Send + 'static {
        let blocking = self.clone();
        async move {
            let started = Instant::now();
            let held_before = blocking.state.borrow().held(started);
            let mut until = started + budget;
            loop {
                tokio::time::sleep_until(until).await;
                blocking.unblocked().await;
                let now = Instant::now();
                let held = blocking.state.borrow().held(now) - held_before;
                until = started + budget + held;
                if until <= now {
                    return;
                }
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn set(&self, reason: Option<&str>) {
        match reason {
            Some(why) => block(&self.state, "amqp://test", why.to_owned()),
            None => unblock(&self.state, "amqp://test", "test"),
        }
    }
}

fn block(state: &watch::Sender<State>, url: &str, why: String) {
    let mut began = false;
    state.send_modify(|state| {
        if state.reason.is_none() {
            state.since = Some(Instant::now());
            began = true;
        }
        state.reason = Some(why.clone());
    });
    if began {
        warn!(%url, reason = %why, "the broker blocks publishers (resource alarm); publishing paused, publish_timeout stands still");
    }
}

fn unblock(state: &watch::Sender<State>, url: &str, how: &str) {
    let mut ended = None;
    state.send_if_modified(|state| {
        ended = state.reason.take();
        if let Some(since) = state.since.take() {
            state.ended += since.elapsed();
        }
        ended.is_some()
    });
    if let Some(why) = ended {
        info!(%url, reason = %why, ended = how, "the broker no longer blocks publishers; publishing resumes");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_clock_runs_only_while_unblocked() {
        let blocking = Blocking::default();
        let started = Instant::now();
        let mut clock = Box::pin(blocking.clock(Duration::from_secs(3)));
        // 1 s unblocked, then blocked for 10 s.
        assert!(
            tokio::time::timeout(Duration::from_secs(1), &mut clock)
                .await
                .is_err(),
            "1 s of 3 s"
        );
        blocking.set(Some("low on memory"));
        assert!(
            tokio::time::timeout(Duration::from_secs(10), &mut clock)
                .await
                .is_err(),
            "blocked: the clock stands still"
        );
        blocking.set(None);
        clock.await;
        let took = started.elapsed();
        assert!(
            took >= Duration::from_secs(13) && took < Duration::from_millis(13_100),
            "3 s unblocked plus 10 s blocked, took {took:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_block_under_way_counts_only_from_the_clocks_start() {
        let blocking = Blocking::default();
        blocking.set(Some("low on memory"));
        tokio::time::sleep(Duration::from_secs(5)).await;
        let started = Instant::now();
        let clock = blocking.clock(Duration::from_secs(3));
        tokio::pin!(clock);
        assert!(
            tokio::time::timeout(Duration::from_secs(2), &mut clock)
                .await
                .is_err(),
            "blocked: the clock stands still"
        );
        blocking.set(None);
        // Two more blocks inside the budget, 1 s each.
        for _ in 0..2 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            blocking.set(Some("low on disk"));
            tokio::time::sleep(Duration::from_secs(1)).await;
            blocking.set(None);
        }
        clock.await;
        let took = started.elapsed();
        assert!(
            took >= Duration::from_secs(7) && took < Duration::from_millis(7_100),
            "3 s unblocked plus 2 s and 2 × 1 s blocked, took {took:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn unblocked_waits_for_the_end_of_a_block() {
        let blocking = Blocking::default();
        blocking.unblocked().await;
        blocking.set(Some("low on disk"));
        assert_eq!(blocking.reason().as_deref(), Some("low on disk"));
        let waiting = blocking.unblocked();
        tokio::pin!(waiting);
        assert!(
            tokio::time::timeout(Duration::from_secs(60), &mut waiting)
                .await
                .is_err(),
            "still blocked"
        );
        blocking.forget("amqp://broker");
        waiting.await;
        assert_eq!(blocking.reason(), None);
    }
}
