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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;
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

/// One channel's pacing: its nacks in a row and until when new publishes wait.
#[derive(Debug, Default)]
pub(crate) struct Pacing {
    state: Mutex<State>,
    /// Set when nacks in a row ask for a new channel; taken by the next publish.
    stale: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    /// Nacks since the last ack.
    nacks: u32,
    /// New publishes do not start before this.
    resume_at: Option<Instant>,
    /// When nacks last asked for a new channel.
    replaced_at: Option<Instant>,
}

impl Pacing {
    /// The broker nacked a publish at `now`: new publishes pause, longer than after the
    /// nack before.
    pub(crate) fn nacked(&self, now: Instant) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
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
    }

    /// The broker acked a publish: the queue takes messages, publishes start at once.
    pub(crate) fn acked(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        *state = State::default();
        self.stale.store(false, Ordering::Relaxed);
    }

    /// Whether nacks in a row asked for a new channel since the last call.
    pub(crate) fn take_stale(&self) -> bool {
        self.stale.load(Ordering::Relaxed) && self.stale.swap(false, Ordering::Relaxed)
    }

    /// How long a publish starting at `now` waits; `None`: not at all.
    fn pause_at(&self, now: Instant) -> Option<Duration> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state
            .resume_at
            .filter(|at| *at > now)
            .map(|at| at.duration_since(now))
    }

    /// Waits until a new publish may start: at once unless nacks came since the last ack.
    pub(crate) async fn ready(&self) {
        while let Some(pause) = self.pause_at(Instant::now()) {
            tokio::time::sleep(pause).await;
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
        let pacing = Pacing::default();
        let start = Instant::now();
        pacing.nacked(start);
        pacing.ready().await;
        assert_eq!(start.elapsed(), FIRST_PAUSE);
    }
}
