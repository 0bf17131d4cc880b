//! [`Silence`]: a connection whose broker stopped answering without closing it.
//!
//! A broker node that hangs (a stalled VM, a long pause of its runtime) keeps its TCP
//! connections open and its heartbeats may not fail for a minute, so every publish on it
//! times out and is retried there, while the other nodes of `amqp.url` could take them.
//! Publish timeouts in a row on one connection, with no confirm between, mean that the
//! connection is dead, whatever its heartbeat says: after [`DEAD_AFTER`] of them the link
//! drops it and connects again, to the next broker of `amqp.url` first
//! (docs/design/broker.md#a-broker-that-stops-answering).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Publish timeouts in a row, with no confirm between, that make a connection dead.
pub const DEAD_AFTER: u32 = 3;

/// Which connection publishes are on, and how long it has been silent.
#[derive(Debug, Default)]
pub(crate) struct Silence {
    /// The current connection's number: one more for each connection the link opens.
    generation: AtomicU64,
    /// Publishes on it that timed out since its last confirm.
    timeouts: AtomicU32,
}

impl Silence {
    /// The current connection's number.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The link opened a new connection: its number.
    pub(crate) fn connected(&self) -> u64 {
        self.timeouts.store(0, Ordering::Relaxed);
        self.generation.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// The broker confirmed (acked, nacked or returned) a publish on connection
    /// `generation`: it answers.
    pub(crate) fn confirmed(&self, generation: u64) {
        if generation == self.generation() {
            self.timeouts.store(0, Ordering::Relaxed);
        }
    }

    /// A publish on connection `generation` timed out: whether that makes
    /// [`DEAD_AFTER`] in a row on the current connection (said once: the count starts
    /// again). A timeout on a connection already replaced counts for nothing.
    pub(crate) fn timed_out(&self, generation: u64) -> bool {
        if generation != self.generation() {
            return false;
        }
        let count = self.timeouts.fetch_add(1, Ordering::Relaxed) + 1;
        if count < DEAD_AFTER {
            return false;
        }
        self.timeouts.store(0, Ordering::Relaxed);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_in_a_row_make_a_connection_dead_and_a_confirm_forgives_them() {
        let silence = Silence::default();
        let first = silence.connected();
        assert!(!silence.timed_out(first));
        assert!(!silence.timed_out(first));
        silence.confirmed(first);
        assert!(
            !silence.timed_out(first),
            "a confirm started the count again"
        );
        assert!(!silence.timed_out(first));
        assert!(silence.timed_out(first), "the third in a row");
        assert!(!silence.timed_out(first), "said once");
    }

    #[test]
    fn a_replaced_connection_counts_for_nothing() {
        let silence = Silence::default();
        let old = silence.connected();
        assert!(!silence.timed_out(old));
        let new = silence.connected();
        assert_ne!(old, new);
        for _ in 0..DEAD_AFTER {
            assert!(
                !silence.timed_out(old),
                "late timeouts of the old connection"
            );
        }
        silence.confirmed(old);
        assert!(!silence.timed_out(new));
        assert!(!silence.timed_out(new));
        assert!(silence.timed_out(new));
    }
}
