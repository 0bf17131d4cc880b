//! PostgreSQL's statistics kept in step with a backlog. The planner costs the claim from
//! the statistics of the last ANALYZE; a table that was analyzed while it held no pending
//! rows (a quiet table with history, or one just vacuumed) makes it believe the pending
//! indexes are empty, and it then answers every per-room probe with a walk of the whole
//! pending index instead of the room's entries: measured, one claim of 100 rows over a
//! 100,000-row backlog took 2.9 s on a 5,000,000-row table instead of about 1 ms, until
//! the next ANALYZE (which autovacuum runs only after 10 % of the table changed, and
//! never when it is off). So the store asks the planner how many pending rows it expects
//! before the first claim and after full claims (at once after a slow one), and when it
//! is fewer than a claim takes while the table holds that many, analyzes the table's
//! `status` column from a small sample. A claim that runs past [`CLAIM_TIMEOUT`] is
//! cancelled and checks before it is claimed again. Why:
//! docs/design/claim-plans.md#statistics.

use crate::sql::{TableName, PENDING};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, RuntimeErr, TransactionTrait};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// How long a check that found the statistics right (or refreshed them) stands.
const CHECK_INTERVAL: Duration = Duration::from_secs(60);

/// A full claim that took this long checks at once, whatever [`CHECK_INTERVAL`] says: an
/// ANALYZE that ran while the table held no pending rows (autovacuum's, at the end of a
/// drain) can land after a check found the statistics right, and the plan it gives took
/// 50 ms a claim over a 100,000-row backlog (about 1 ms planned right), for the rest of
/// the interval (measured: one drain at a sixth of its rate). A claim slow for another
/// reason (a busy machine) costs one `EXPLAIN` per [`SLOW_RECHECK`].
const SLOW_CLAIM: Duration = Duration::from_millis(20);

/// Slow claims check at most this often, and not at all until [`CHECK_INTERVAL`] has
/// passed when the last check failed or its refresh left the estimate short (a role that
/// does not own the table, whose ANALYZE PostgreSQL skips with a warning in its log; a
/// backlog too small a share of the table for the sample to see).
const SLOW_RECHECK: Duration = Duration::from_secs(1);

/// A claim running longer than this is cancelled, the statistics are checked, and it is
/// claimed again (without the timeout): the one slow claim a stale plan still costs
/// (measured: 8 s over 100,000 pending rows, the first claim after an autovacuum ANALYZE
/// of the drained table) costs this instead. A claim is about 1 ms planned right and a
/// fraction of a second holding 64 MiB of envelopes; when the statistics were right, the
/// claim was slow for another reason and claims run without a timeout for
/// [`CHECK_INTERVAL`].
const CLAIM_TIMEOUT: Duration = Duration::from_secs(1);

/// The statistics target of the refresh: ANALYZE samples 300 rows per unit.
const SAMPLE_TARGET: u32 = 10;

/// When the next check is due, shared by the clones of one store.
#[derive(Debug)]
pub(crate) struct StatisticsWatch {
    state: Mutex<Watch>,
    /// The claims' statement timeout ([`CLAIM_TIMEOUT`]).
    claim_timeout: Duration,
}

impl Default for StatisticsWatch {
    fn default() -> Self {
        Self::with_claim_timeout(CLAIM_TIMEOUT)
    }
}

#[derive(Debug, Default)]
struct Watch {
    /// The first claim's check ran.
    started: bool,
    /// The next check after a full claim is not before this; `None`: at the next one
    /// (the last check found the planner expecting fewer pending rows than a claim takes,
    /// with no backlog to analyze: the next full claim shows one).
    quiet_until: Option<Instant>,
    /// When the last check ran.
    checked_at: Option<Instant>,
    /// The last check failed, or analyzed without bringing the estimate up.
    stuck: bool,
    /// Claims run without a timeout until then: one ran past it with the statistics right.
    untimed_until: Option<Instant>,
}

impl Watch {
    /// Whether a full claim that took `took`, ending `now`, checks.
    fn due(&self, now: Instant, took: Duration) -> bool {
        let routine = self.quiet_until.is_none_or(|until| now >= until);
        let slow = took >= SLOW_CLAIM
            && !self.stuck
            && self
                .checked_at
                .is_none_or(|at| now.saturating_duration_since(at) >= SLOW_RECHECK);
        routine || slow
    }
}

/// What a check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    /// The planner expects at least a claim's worth of pending rows.
    Right,
    /// It expected `expected`; the table held more: analyzed, after which it expects
    /// `after`.
    Refreshed { expected: u64, after: u64 },
    /// It expects fewer, and the table holds fewer too: nothing to refresh yet.
    Quiet,
}

impl StatisticsWatch {
    pub(crate) fn with_claim_timeout(claim_timeout: Duration) -> Self {
        Self {
            state: Mutex::default(),
            claim_timeout,
        }
    }

    /// The statement timeout of a claim starting `now`.
    pub(crate) fn claim_timeout(&self, now: Instant) -> Option<Duration> {
        let untimed = self.lock().untimed_until.is_some_and(|until| now < until);
        (!untimed).then_some(self.claim_timeout)
    }

    /// After a claim of `limit` rows was cancelled at its timeout: checks the statistics
    /// (refreshing them when stale, as before a first claim); when they were right, the
    /// claim was slow for another reason, and claims run without a timeout for a while.
    /// Never fails.
    pub(crate) async fn after_timeout(
        &self,
        db: &DatabaseConnection,
        table: &TableName,
        limit: usize,
    ) {
        let now = Instant::now();
        let found = check(db, table, limit, None).await;
        let (refreshed, right) = match found {
            Ok(Found::Refreshed { .. }) => (true, false),
            Ok(Found::Right | Found::Quiet) => (false, true),
            Err(_) => (false, false),
        };
        self.after_check(found, table, limit, now);
        let mut watch = self.lock();
        // A refresh that did not take, or a failed check, has warned already (after_check).
        if refreshed && !watch.stuck {
            return;
        }
        watch.untimed_until = Some(now + CHECK_INTERVAL);
        if right {
            info!(
                table = %table,
                timeout_ms = self.claim_timeout.as_millis() as u64,
                "a claim ran past its timeout with the planner's statistics right; claims run \
                 without a timeout for a minute"
            );
        }
    }

    /// Before the store's first claim of `limit` rows: refreshes the statistics when the
    /// planner expects fewer pending rows than that and the table holds at least that
    /// many (a relay started on a backlog). Never fails the claim.
    pub(crate) async fn before_claim(
        &self,
        db: &DatabaseConnection,
        table: &TableName,
        limit: usize,
    ) {
        {
            let mut watch = self.lock();
            if watch.started {
                return;
            }
            watch.started = true;
        }
        let found = check(db, table, limit, None).await;
        self.after_check(found, table, limit, Instant::now());
    }

    /// After a claim that leased `leased` rows, a full one (a backlog), in `took`:
    /// refreshes the statistics when the planner expects fewer pending rows than that.
    /// Never fails the claim.
    pub(crate) async fn after_full_claim(
        &self,
        db: &DatabaseConnection,
        table: &TableName,
        leased: usize,
        took: Duration,
    ) {
        let now = Instant::now();
        if !self.lock().due(now, took) {
            return;
        }
        let found = check(db, table, leased, Some(leased)).await;
        self.after_check(found, table, leased, now);
    }

    fn after_check(
        &self,
        found: Result<Found, DbErr>,
        table: &TableName,
        rows: usize,
        now: Instant,
    ) {
        let stuck = match found {
            Ok(Found::Refreshed { after, .. }) => after < rows as u64,
            Ok(Found::Quiet | Found::Right) => false,
            Err(_) => true,
        };
        let quiet_until = match found {
            Ok(Found::Quiet) => None,
            Ok(Found::Right) => Some(now + CHECK_INTERVAL),
            Ok(Found::Refreshed { expected, .. }) if !stuck => {
                info!(
                    table = %table,
                    expected_pending = expected,
                    pending_at_least = rows,
                    "the planner's statistics were stale (the table holds more pending rows \
                     than it expected): analyzed the table's status column"
                );
                Some(now + CHECK_INTERVAL)
            }
            Ok(Found::Refreshed { expected, after }) => {
                warn!(
                    table = %table,
                    expected_pending = expected,
                    expected_after = after,
                    pending_at_least = rows,
                    "the planner's statistics are stale and analyzing the table's status \
                     column did not refresh them (does the relay's role own the table? is the \
                     backlog too small a share of the table for the sample?); claims may be \
                     slow until the table is analyzed (docs/operations/autovacuum.md#statistics)"
                );
                Some(now + CHECK_INTERVAL)
            }
            Err(error) => {
                warn!(
                    table = %table,
                    error = %error,
                    "could not check or refresh the planner's statistics; claims may be slow \
                     until the table is analyzed (docs/operations/autovacuum.md#statistics)"
                );
                Some(now + CHECK_INTERVAL)
            }
        };
        let mut watch = self.lock();
        watch.quiet_until = quiet_until;
        watch.checked_at = Some(now);
        watch.stuck = stuck;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Watch> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Compares the pending rows the planner expects (`EXPLAIN` of a count of them) with
/// `rows`; when fewer, and the table holds at least `rows` pending rows (`seen`, or a
/// count that stops there), analyzes the `status` column.
async fn check(
    db: &DatabaseConnection,
    table: &TableName,
    rows: usize,
    seen: Option<usize>,
) -> Result<Found, DbErr> {
    let one = |sql: String| async move {
        db.query_one(sea_orm::Statement::from_string(
            db.get_database_backend(),
            sql,
        ))
        .await?
        .ok_or_else(|| DbErr::Custom("no answer".to_owned()))
    };
    let planned = || async {
        let plan = one(format!(
            "EXPLAIN SELECT 1 FROM {table} WHERE status = {PENDING}"
        ))
        .await?
        .try_get_by_index::<String>(0)?;
        planned_rows(&plan)
            .ok_or_else(|| DbErr::Custom(format!("no row estimate in the plan line {plan:?}")))
    };
    let expected = planned().await?;
    if expected >= rows as u64 {
        return Ok(Found::Right);
    }
    let pending = match seen {
        Some(seen) => seen as i64,
        None => one(format!(
            "SELECT count(*) AS n FROM (SELECT 1 FROM {table} WHERE status = {PENDING} \
             LIMIT {rows}) p"
        ))
        .await?
        .try_get::<i64>("", "n")?,
    };
    if pending < rows as i64 {
        return Ok(Found::Quiet);
    }
    // The status column only, from a sample of 3,000 rows (`default_statistics_target`
    // 10, this transaction only) instead of 30,000: about a tenth of the reads, and the
    // other columns keep the statistics of the last full ANALYZE. The row counts of the
    // table and its indexes are refreshed with it.
    let txn = db.begin().await?;
    txn.execute_unprepared(&format!(
        "SET LOCAL default_statistics_target = {SAMPLE_TARGET}; ANALYZE {table} (status)"
    ))
    .await?;
    txn.commit().await?;
    Ok(Found::Refreshed {
        expected,
        after: planned().await?,
    })
}

/// Whether `error` is PostgreSQL cancelling a statement (SQLSTATE 57014), as it does at
/// the statement timeout.
pub(crate) fn cancelled(error: &DbErr) -> bool {
    match error {
        DbErr::Exec(RuntimeErr::SqlxError(error))
        | DbErr::Query(RuntimeErr::SqlxError(error))
        | DbErr::Conn(RuntimeErr::SqlxError(error)) => error
            .as_database_error()
            .and_then(|error| error.code())
            .is_some_and(|code| code == "57014"),
        _ => false,
    }
}

/// The `rows=` estimate of a plan line such as
/// `Index Only Scan using t_pending_idx on t  (cost=0.29..4.30 rows=1 width=4)`.
fn planned_rows(line: &str) -> Option<u64> {
    let (_, after) = line.split_once(" rows=")?;
    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_is_read_from_the_top_plan_line() {
        let line = "Index Only Scan using t_pending_idx on t  (cost=0.29..4.30 rows=1 width=0)";
        assert_eq!(planned_rows(line), Some(1));
        let line = "Seq Scan on t  (cost=0.00..155.00 rows=92996 width=4)";
        assert_eq!(planned_rows(line), Some(92_996));
        assert_eq!(planned_rows("Result  (cost=0.00..0.01 width=4)"), None);
    }

    #[test]
    fn a_check_that_finds_no_backlog_leaves_the_next_full_claim_to_check() {
        let watch = StatisticsWatch::default();
        let table = TableName::parse("room_outbox").unwrap();
        let now = Instant::now();
        watch.after_check(Ok(Found::Quiet), &table, 100, now);
        assert_eq!(watch.lock().quiet_until, None);
        watch.after_check(Ok(Found::Right), &table, 100, now);
        assert_eq!(watch.lock().quiet_until, Some(now + CHECK_INTERVAL));
        let refreshed = Found::Refreshed {
            expected: 1,
            after: 900,
        };
        watch.after_check(Ok(refreshed), &table, 100, now);
        assert_eq!(watch.lock().quiet_until, Some(now + CHECK_INTERVAL));
    }

    #[test]
    fn a_refresh_that_left_the_estimate_short_stops_the_slow_claim_checks_for_a_while() {
        let watch = StatisticsWatch::default();
        let table = TableName::parse("room_outbox").unwrap();
        let now = Instant::now();
        let short = Found::Refreshed {
            expected: 1,
            after: 1,
        };
        watch.after_check(Ok(short), &table, 100, now);
        assert!(!watch.lock().due(now + SLOW_RECHECK, SLOW_CLAIM));
        assert!(watch.lock().due(now + CHECK_INTERVAL, SLOW_CLAIM));
        let failed = Err(DbErr::Custom("permission denied".into()));
        watch.after_check(failed, &table, 100, now);
        assert!(!watch.lock().due(now + SLOW_RECHECK, SLOW_CLAIM));
        watch.after_check(Ok(Found::Right), &table, 100, now);
        assert!(watch.lock().due(now + SLOW_RECHECK, SLOW_CLAIM));
    }

    #[test]
    fn a_slow_full_claim_checks_within_the_interval_at_most_once_a_second() {
        let watch = StatisticsWatch::default();
        let table = TableName::parse("room_outbox").unwrap();
        let now = Instant::now();
        let fast = Duration::from_millis(2);
        watch.after_check(Ok(Found::Right), &table, 100, now);
        let state = watch.lock();
        assert!(!state.due(now + Duration::from_secs(5), fast));
        assert!(!state.due(now + Duration::from_millis(500), SLOW_CLAIM));
        assert!(state.due(now + SLOW_RECHECK, SLOW_CLAIM));
        assert!(state.due(now + CHECK_INTERVAL, fast));
    }
}
