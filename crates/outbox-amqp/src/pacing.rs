//! [`Pacing`]: a Publisher slows down while the broker nacks.
//!
//! A nack is the broker's backpressure, not the event's failure: a queue at its length
//! limit under `overflow = reject-publish`, a quorum queue without a leader. Publishing the
//! next events at full speed into it only turns each into another nack, a retry and a row
//! write. So after a nack the publishes that have not started yet on the channel wait a
//! pause before they start (before their `publish_timeout` starts), doubled at each further
//! nack up to [`LONGEST_PAUSE`], and none at all once the broker acks a publish again
//! (docs/design/broker.md#nacks).
//!
//! Nacks in a row also ask for a new channel, at most once per [`REPLACE_EVERY`]: a
//! channel opened while a quorum queue's leader was being replaced keeps sending to the
//! old leader, and its node nacks every publish until that leader's node is back, while a
//! channel opened after the election publishes at once.
//!
//! A publish that timed out leaves the channel *in doubt*: the broker may take its message
//! late (a hung or cut-off queue leader holds every publish until it answers again), so
//! each copy sent meanwhile is a duplicate to come. Until a confirm arrives again, new
//! publishes go out as probes of whether the broker confirms again, one at a time, or one
//! per [`PROBE_EVERY`] while the last is unanswered, each on a new channel (one opened
//! before an election may keep sending to the old leader), instead of the whole in-flight
//! window once more at every round of timeouts (docs/design/broker.md#publish-timeouts).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// The pause after a first nack.
pub(crate) const FIRST_PAUSE: Duration = Duration::from_millis(20);

/// The longest pause, however many nacks came: short beside an election of a quorum queue's
/// leader (a second or two), so a queue that takes messages again waits at most this long.
pub(crate) const LONGEST_PAUSE: Duration = Duration::from_millis(500);

/// Nacks in a row after which the channel is replaced.
pub(crate) const REPLACE_AFTER: u32 = 3;

/// The least time between two replacements of the channel while nacks go on: an election
/// takes a second or two, and a channel opened during it may still know the old leader.
pub(crate) const REPLACE_EVERY: Duration = Duration::from_secs(1);

/// While a channel is in doubt, how often a new probe starts though the last is still
/// unanswered: how soon after the cluster takes messages again the relay finds out, at the
/// cost of one copy per probe that the broker takes late.
pub(crate) const PROBE_EVERY: Duration = Duration::from_millis(500);

/// One channel's pacing: its nacks in a row and until when new publishes wait.
#[derive(Debug, Default)]
pub(crate) struct Pacing {
    state: Mutex<State>,
    /// Set when nacks in a row or a probe ask for a new channel; taken by the next publish.
    stale: AtomicBool,
    /// Told when a probe ends or the channel is no longer in doubt.
    probes: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// Nacks since the last ack.
    nacks: u32,
    /// New publishes do not start before this.
    resume_at: Option<Instant>,
    /// When nacks last asked for a new channel.
    replaced_at: Option<Instant>,
    /// A publish timed out and no confirm came since: publishes go one at a time.
    in_doubt: bool,
    /// The latest probe, while it is under way: its number and start.
    probing: Option<(u64, Instant)>,
    /// Probes started.
    probes: u64,
}

/// The publish that probes a channel in doubt: the next starts once it ends, or
/// [`PROBE_EVERY`] after it started.
#[derive(Debug)]
pub(crate) struct Probe(Arc<Pacing>, u64);

impl Drop for Probe {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        if state.probing.is_some_and(|(number, _)| number == self.1) {
            state.probing = None;
            drop(state);
            self.0.probes.notify_waiters();
        }
    }
}

impl Pacing {
    /// The broker nacked a publish at `now`: new publishes pause, longer than after the
    /// nack before.
    pub(crate) fn nacked(&self, now: Instant) {
        let mut state = self.lock();
        state.nacks = state.nacks.saturating_add(1);
        let pause = FIRST_PAUSE
            .checked_mul(1 << (state.nacks - 1).min(16))
            .unwrap_or(LONGEST_PAUSE)
            .min(LONGEST_PAUSE);
        let resume_at = now + pause;
        state.resume_at = Some(state.resume_at.map_or(resume_at, |at| at.max(resume_at)));
        let replace = state.nacks >= REPLACE_AFTER
            && state
                .replaced_at
                .is_none_or(|at| now.saturating_duration_since(at) >= REPLACE_EVERY);
        if replace {
            state.replaced_at = Some(now);
            self.stale.store(true, Ordering::Relaxed);
        }
        // The broker answers: no longer in doubt.
        let was_in_doubt = std::mem::take(&mut state.in_doubt);
        drop(state);
        if was_in_doubt {
            self.probes.notify_waiters();
        }
    }

    /// The broker acked a publish: the queue takes messages, publishes start at once.
    pub(crate) fn acked(&self) {
        let mut state = self.lock();
        let was_in_doubt = state.in_doubt;
        *state = State {
            probes: state.probes,
            ..State::default()
        };
        drop(state);
        self.stale.store(false, Ordering::Relaxed);
        if was_in_doubt {
            self.probes.notify_waiters();
        }
    }

    /// A publish got no confirm within its `publish_timeout`: publishes go one at a time
    /// until a confirm comes.
    pub(crate) fn timed_out(&self) {
        self.lock().in_doubt = true;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether nacks in a row or a probe asked for a new channel since the last call.
    pub(crate) fn take_stale(&self) -> bool {
        self.stale.load(Ordering::Relaxed) && self.stale.swap(false, Ordering::Relaxed)
    }

    /// How long a publish starting at `now` waits; `None`: not at all.
    fn pause_at(&self, now: Instant) -> Option<Duration> {
        let state = self.lock();
        state
            .resume_at
            .filter(|at| *at > now)
            .map(|at| at.duration_since(now))
    }

    /// Waits until a new publish may start: at once unless nacks came since the last ack,
    /// or a publish timed out since the last confirm; then it is a probe, kept until the
    /// publish ends, and asks for a new channel.
    pub(crate) async fn ready(self: &Arc<Self>) -> Option<Probe> {
        while let Some(pause) = self.pause_at(Instant::now()) {
            tokio::time::sleep(pause).await;
        }
        loop {
            // Registered before the state is read, so no wake-up falls in between.
            let told = self.probes.notified();
            let next_at = {
                let mut state = self.lock();
                if !state.in_doubt {
                    return None;
                }
                let now = Instant::now();
                match state.probing.map(|(_, started)| started + PROBE_EVERY) {
                    Some(next_at) if next_at > now => next_at,
                    _ => {
                        state.probes += 1;
                        state.probing = Some((state.probes, now));
                        self.stale.store(true, Ordering::Relaxed);
                        return Some(Probe(Arc::clone(self), state.probes));
                    }
                }
            };
            tokio::select! {
                () = told => {}
                () = tokio::time::sleep_until(next_at) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_waits_until_a_nack() {
        let pacing = Pacing::default();
        assert_eq!(pacing.pause_at(Instant::now()), None);
    }

    #[test]
    fn nacks_in_a_row_pause_longer_up_to_the_longest_pause() {
        let pacing = Pacing::default();
        let now = Instant::now();
        pacing.nacked(now);
        assert_eq!(pacing.pause_at(now), Some(FIRST_PAUSE));
        pacing.nacked(now);
        assert_eq!(pacing.pause_at(now), Some(FIRST_PAUSE * 2));
        for _ in 0..40 {
            pacing.nacked(now);
        }
        assert_eq!(pacing.pause_at(now), Some(LONGEST_PAUSE));
        assert_eq!(
            pacing.pause_at(now + LONGEST_PAUSE),
            None,
            "over once it passed"
        );
    }

    #[test]
    fn an_ack_ends_the_pause_and_the_count() {
        let pacing = Pacing::default();
        let now = Instant::now();
        for _ in 0..10 {
            pacing.nacked(now);
        }
        pacing.acked();
        assert_eq!(pacing.pause_at(now), None);
        pacing.nacked(now);
        assert_eq!(
            pacing.pause_at(now),
            Some(FIRST_PAUSE),
            "counted from the first nack again"
        );
    }

    #[test]
    fn nacks_in_a_row_ask_for_a_new_channel_at_most_once_a_second() {
        let pacing = Pacing::default();
        let now = Instant::now();
        for _ in 1..REPLACE_AFTER {
            pacing.nacked(now);
        }
        assert!(!pacing.take_stale(), "not yet");
        pacing.nacked(now);
        assert!(pacing.take_stale());
        assert!(!pacing.take_stale(), "taken once");
        pacing.nacked(now + REPLACE_EVERY / 2);
        assert!(!pacing.take_stale(), "replaced moments ago");
        pacing.nacked(now + REPLACE_EVERY);
        assert!(pacing.take_stale(), "nacks go on a second later");
        pacing.nacked(now + REPLACE_EVERY * 3);
        pacing.acked();
        assert!(!pacing.take_stale(), "an ack: the channel is fine");
    }

    #[tokio::test(start_paused = true)]
    async fn a_publish_waits_out_the_pause() {
        let pacing = Arc::new(Pacing::default());
        let start = Instant::now();
        pacing.nacked(start);
        assert!(pacing.ready().await.is_none(), "no probe: not in doubt");
        assert_eq!(start.elapsed(), FIRST_PAUSE);
    }

    /// Whether `ready` lets a publish start within a few polls.
    async fn starts(pacing: &Arc<Pacing>) -> Option<Option<Probe>> {
        tokio::time::timeout(PROBE_EVERY / 2, pacing.ready())
            .await
            .ok()
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_timeout_publishes_go_one_at_a_time_until_a_confirm() {
        let pacing = Arc::new(Pacing::default());
        assert!(matches!(starts(&pacing).await, Some(None)), "not in doubt");
        pacing.timed_out();
        let probe = starts(&pacing).await.expect("the first starts");
        assert!(probe.is_some(), "as the probe");
        assert!(pacing.take_stale(), "on a new channel");
        assert!(starts(&pacing).await.is_none(), "the next waits for it");
        let unanswered = starts(&pacing)
            .await
            .expect("or not longer than PROBE_EVERY");
        assert!(unanswered.is_some(), "as the next probe");
        drop(probe);
        assert!(
            starts(&pacing).await.is_none(),
            "the end of an earlier probe lets none start"
        );
        drop(unanswered);
        let probe = starts(&pacing)
            .await
            .expect("the next starts once it ended");
        assert!(probe.is_some(), "as the probe: still no confirm");
        pacing.acked();
        assert!(
            matches!(starts(&pacing).await, Some(None)),
            "a confirm: everything starts, with the last probe still under way"
        );
        drop(probe);
        pacing.timed_out();
        let probe = starts(&pacing).await.expect("a probe again");
        assert!(starts(&pacing).await.is_none(), "the next waits for it");
        pacing.nacked(Instant::now());
        assert!(
            matches!(starts(&pacing).await, Some(None)),
            "a nack is an answer too: the queue is there, full or electing"
        );
        drop(probe);
    }
}
