//! [`ScanFloor`]: where the Fetcher's claims start their scan of the pending rows while it
//! drains a backlog, so that a claim's reads follow the pending work and not the dead index
//! entries the last minutes' marks left at the head
//! (docs/design/claim-plans.md#the-scan-floor.

use outbox_core::Claimed;
use std::time::Duration;
use tokio::time::Instant;

/// How long claims may start at a floor before one starts from the oldest pending row
/// again: the longest a row committed late below the floor (or made pending again by an
/// operator) waits, and only while a backlog drains.
pub const FLOOR_REFRESH: Duration = Duration::from_secs(1);

/// The floor of the next claim ([`outbox_core::ClaimRequest::floor`]).
///
/// A claim from the head says where the pending rows begin ([`Claimed::floor`]); the
/// claims that follow start there, and each moves it up to the lowest pending row it saw
/// at or above it. Only while claims come back full (a backlog: the next claim follows at
/// once) and for at most [`FLOOR_REFRESH`]: when the work is light, every claim starts
/// from the head, so a late commit waits for nothing.
#[derive(Debug, Default)]
pub struct ScanFloor {
    /// The lowest pending id the last claim saw at or above its own floor.
    floor: Option<i64>,
    /// When the last claim without a floor ran.
    from_head_at: Option<Instant>,
    /// The last claim was full: more rows are waiting.
    draining: bool,
}

impl ScanFloor {
    /// The floor for a claim made at `now`.
    pub fn next(&self, now: Instant) -> Option<i64> {
        let fresh = self
            .from_head_at
            .is_some_and(|at| now.saturating_duration_since(at) < FLOOR_REFRESH);
        match (self.draining, fresh) {
            (true, true) => self.floor,
            _ => None,
        }
    }

    /// A claim made at `now` with floor `asked` came back with `claimed`; `full`: it
    /// returned as many rows as it could take (more are probably waiting).
    ///
    /// The next floor is the lowest pending row the claim saw, or just past the last row
    /// it leased if that is higher: the rows between are this node's own, in flight (which
    /// the next claim would otherwise walk past, one heap visit each), or rows this claim
    /// skipped, which wait for the next claim from the head like a late commit.
    pub fn claimed(&mut self, now: Instant, asked: Option<i64>, claimed: &Claimed, full: bool) {
        if asked.is_none() {
            self.from_head_at = Some(now);
        }
        let past_leased = claimed
            .records
            .iter()
            .map(|record| record.id.saturating_add(1))
            .max();
        // No answer (nothing leased): nothing seen moves the floor; keep where it was.
        self.floor = claimed.floor.or(asked).max(past_leased);
        self.draining = full;
    }

    /// After a failed claim: start from the head next time.
    pub fn forget(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::record;

    fn answer(floor: Option<i64>) -> Claimed {
        Claimed {
            records: Vec::new(),
            floor,
        }
    }

    #[test]
    fn the_first_claim_and_claims_after_a_partial_one_start_from_the_head() {
        let now = Instant::now();
        let mut floor = ScanFloor::default();
        assert_eq!(floor.next(now), None);
        floor.claimed(now, None, &answer(Some(40)), false);
        assert_eq!(floor.next(now), None, "not draining: from the head");
        floor.claimed(now, None, &answer(Some(40)), true);
        assert_eq!(floor.next(now), Some(40), "draining: from the floor");
        floor.claimed(now, Some(40), &answer(Some(55)), true);
        assert_eq!(floor.next(now), Some(55), "each full claim moves it up");
        floor.claimed(now, Some(55), &answer(None), false);
        assert_eq!(
            floor.next(now),
            None,
            "a partial claim: from the head again"
        );
    }

    #[test]
    fn a_claim_from_the_head_comes_at_least_every_refresh() {
        let start = Instant::now();
        let mut floor = ScanFloor::default();
        floor.claimed(start, None, &answer(Some(10)), true);
        let later = start + FLOOR_REFRESH / 2;
        assert_eq!(floor.next(later), Some(10));
        floor.claimed(later, Some(10), &answer(Some(20)), true);
        assert_eq!(
            floor.next(start + FLOOR_REFRESH),
            None,
            "a refresh's time after the last claim from the head"
        );
        floor.claimed(start + FLOOR_REFRESH, None, &answer(Some(15)), true);
        assert_eq!(floor.next(start + FLOOR_REFRESH), Some(15));
    }

    #[test]
    fn a_full_claim_moves_the_floor_past_the_rows_it_leased() {
        let now = Instant::now();
        let mut floor = ScanFloor::default();
        let leased = |ids: &[i64], floor: Option<i64>| Claimed {
            records: ids.iter().map(|&id| record(id, "room")).collect(),
            floor,
        };
        floor.claimed(now, None, &leased(&[10, 11, 14], Some(10)), true);
        assert_eq!(
            floor.next(now),
            Some(15),
            "the node's own rows in flight are not walked again"
        );
        floor.claimed(now, Some(15), &leased(&[], None), true);
        assert_eq!(floor.next(now), Some(15), "nothing leased: kept");
        floor.claimed(now, Some(15), &leased(&[16], Some(40)), true);
        assert_eq!(
            floor.next(now),
            Some(40),
            "the lowest pending row when it is higher"
        );
    }

    #[test]
    fn an_empty_answer_keeps_the_floor_and_a_failure_forgets_it() {
        let now = Instant::now();
        let mut floor = ScanFloor::default();
        floor.claimed(now, None, &answer(Some(7)), true);
        floor.claimed(now, Some(7), &answer(None), true);
        assert_eq!(floor.next(now), Some(7));
        floor.forget();
        assert_eq!(floor.next(now), None);
    }
}
