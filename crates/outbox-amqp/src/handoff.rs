//! [`Handoff`]: how many body bytes the link's publishes may have handed to lapin but not
//! yet written to the socket.
//!
//! lapin copies a body into its frames when a publish starts and drops each frame once
//! written; the relay keeps its own copy until the hand-off completes. Without a bound
//! every record in flight could sit in lapin's queue at once, so memory held each large
//! body twice (measured: three 25 MiB bodies queued side by side, 79 MB of frames beside
//! the 79 MB of records). The socket writes one frame at a time anyway: queueing
//! [`HANDOFF_BYTES`] ahead keeps it busy. A body larger than that waits until nothing
//! else is queued and goes alone.

use tokio::sync::{Semaphore, SemaphorePermit};

/// Bytes of bodies queued in lapin at most (a larger body goes alone).
pub(crate) const HANDOFF_BYTES: usize = 8 * 1024 * 1024;

/// Permits count KiB of body.
const UNIT: usize = 1024;

/// The link's hand-off bound: one per connection to the broker.
#[derive(Debug)]
pub(crate) struct Handoff {
    permits: Semaphore,
}

impl Default for Handoff {
    fn default() -> Self {
        Self {
            permits: Semaphore::new(HANDOFF_BYTES / UNIT),
        }
    }
}

impl Handoff {
    /// Waits until a body of `bytes` may be handed off; hold the permit until lapin wrote
    /// it. Small bodies take one KiB-permit each and never wait in practice.
    pub(crate) async fn room_for(&self, bytes: usize) -> Option<SemaphorePermit<'_>> {
        let units = bytes.div_ceil(UNIT).clamp(1, HANDOFF_BYTES / UNIT);
        // The semaphore is never closed; were it, the publish would go unbounded.
        self.permits
            .acquire_many(u32::try_from(units).unwrap_or(u32::MAX))
            .await
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_large_body_waits_until_the_queue_is_empty_and_then_goes_alone() {
        let handoff = Handoff::default();
        let small = handoff.room_for(512).await;
        let large = handoff.room_for(25 * 1024 * 1024);
        tokio::pin!(large);
        let waited = tokio::time::timeout(Duration::from_millis(50), &mut large).await;
        assert!(waited.is_err(), "a 25 MiB body went beside a queued one");
        drop(small);
        let large = large.await;
        let next = tokio::time::timeout(Duration::from_millis(50), handoff.room_for(1)).await;
        assert!(next.is_err(), "a body went beside a large one");
        drop(large);
        assert!(handoff.room_for(1).await.is_some());
    }

    #[tokio::test]
    async fn bodies_up_to_the_bound_go_side_by_side() {
        let handoff = Handoff::default();
        let mut held = Vec::new();
        for _ in 0..8 {
            held.push(handoff.room_for(1024 * 1024).await);
        }
        let ninth = tokio::time::timeout(Duration::from_millis(50), handoff.room_for(1)).await;
        assert!(ninth.is_err(), "more than HANDOFF_BYTES queued");
        held.pop();
        assert!(handoff.room_for(1024 * 1024).await.is_some());
    }
}
