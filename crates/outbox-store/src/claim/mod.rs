//! The claim: lease up to `limit` publishable rows to a node, oldest id first. One file
//! per backend, since the statements differ as a whole (RETURNING, row locks, how plans
//! are kept on the indexes); the conditions that make a row publishable are shared here.
//! The rules: docs/design/claims.md.

mod mysql;
mod postgres;
mod sqlite;

use crate::dialect::{Dialect, Params};
use crate::error::Error;
use crate::reads::Reads;
use crate::row::{read_each, ClaimedRow, Cursor};
use crate::sql::{Index, TableName, PENDING};
use crate::store::SeaOrmStore;
use chrono::{DateTime, Utc};
use outbox_core::{ClaimRequest, Ordering};
use sea_orm::{ConnectionTrait, DbErr, Statement, StreamTrait};
use std::time::Duration;

impl SeaOrmStore {
    /// Leases rows for `request` on this store's backend; in no particular order. On
    /// PostgreSQL a claim running past `timeout` is cancelled (SQLSTATE 57014, see
    /// [`crate::planner::cancelled`]).
    pub(crate) async fn claim_rows(
        &self,
        request: &ClaimRequest,
        timeout: Option<Duration>,
    ) -> Result<Leased, DbErr> {
        let claim = Claim {
            timeout,
            ..self.claim_for(request)
        };
        let db = self.connection();
        match claim.dialect {
            Dialect::Postgres => postgres::claim(db, &claim).await,
            Dialect::MySql => mysql::claim(db, &claim).await,
            Dialect::Sqlite => sqlite::claim(db, &claim).await,
        }
    }

    /// The plan of a claim for `request` with `EXPLAIN (ANALYZE, BUFFERS)`: run as the
    /// relay runs it, then rolled back (nothing is leased). PostgreSQL only (`None`
    /// elsewhere): for diagnostics, and for the test that keeps the claim's reads bounded
    /// by the pending rows (docs/design/claim-plans.md#the-scan-floor.
    pub async fn explain_claim(&self, request: &ClaimRequest) -> Result<Option<String>, Error> {
        let claim = self.claim_for(request);
        match claim.dialect {
            Dialect::Postgres => Ok(Some(postgres::explain(self.connection(), &claim).await?)),
            Dialect::MySql | Dialect::Sqlite => Ok(None),
        }
    }

    /// A claim for `request` on this store, now.
    fn claim_for<'a>(&'a self, request: &'a ClaimRequest) -> Claim<'a> {
        Claim {
            dialect: self.dialect(),
            table: self.table(),
            reads: self.reads(),
            request,
            now: Utc::now(),
            timeout: None,
        }
    }
}

/// What a claim leased, and where the next claim may start ([`Claim::next_floor`]).
pub(crate) struct Leased {
    pub(crate) rows: Vec<ClaimedRow>,
    pub(crate) next_floor: Option<i64>,
}

impl Leased {
    /// Runs [`Claim::lease_returning`] on `conn`: its rows, and the next floor that every
    /// row carries (SQLite; PostgreSQL reads large envelopes apart, `postgres.rs`).
    async fn run_returning<C: StreamTrait>(
        conn: &C,
        statement: Statement,
        reads: &Reads,
    ) -> Result<Self, DbErr> {
        let mut next_floor = None;
        let rows = read_each(conn, statement, |row| {
            let mut next = Cursor::new(row);
            let claimed = ClaimedRow::read(&mut next, reads)?;
            next_floor = next.get(NEXT_FLOOR)?;
            Ok(claimed)
        })
        .await?;
        Ok(Self { rows, next_floor })
    }
}

/// One claim: what every backend's statements are built from.
struct Claim<'a> {
    dialect: Dialect,
    table: &'a TableName,
    /// The mapped columns.
    reads: &'a Reads,
    request: &'a ClaimRequest,
    /// The claim's clock: what is publishable, and when the leases end.
    now: DateTime<Utc>,
    /// PostgreSQL: the claim's statement timeout.
    timeout: Option<Duration>,
}

impl Claim<'_> {
    /// The conditions that make row alias `c` publishable for the claiming node now.
    fn claimable(&self, params: &mut Params) -> String {
        let Self {
            dialect,
            table,
            reads,
            request,
            now,
            ..
        } = *self;
        let (key, position) = (&reads.key, &reads.position);
        let mut sql = format!(
            "c.status = {PENDING} AND {} <= {} AND (c.locked_until IS NULL OR {} < {})",
            dialect.time("c.available_at"),
            params.bind_time_expr(now),
            dialect.time("c.locked_until"),
            params.bind_time_expr(now),
        );
        if let Some(floor) = request.floor {
            // The scan starts at the floor instead of the pending index's head, whose
            // entries the last minutes' marks left dead (docs/design/claim-plans.md#the-scan-floor.
            sql.push_str(&format!(" AND c.{position} >= {}", params.bind(floor)));
        }
        if request.ordering == Ordering::PerRoom {
            // Claimable only while no earlier pending row of its room waits out a delay or
            // is leased to another node (why that keeps room order:
            // docs/design/claim-plans.md#the-per-room-checks-index). One probe of the pending-per-room
            // index per candidate; `?` placeholders are positional: bind in text order.
            let waiting = format!(
                "{} > {}",
                dialect.time("e.available_at"),
                params.bind_time_expr(now)
            );
            let leased = format!(
                "{} >= {}",
                dialect.time("e.locked_until"),
                params.bind_time_expr(now)
            );
            let node = params.bind(request.node_id.as_str());
            let hint = dialect.index_hint(table, Index::PendingRoom);
            let fence = dialect.probe_fence();
            // Written as two conditions, not as the row comparison `(e.room_id, e.id) <
            // (c.room_id, c.id)` that PostgreSQL once had: a B-tree scan ends at a row
            // comparison's bound only on its first column, so that probe read every
            // pending entry of the room after the candidate too, a whole hot room's
            // backlog per candidate (docs/design/claim-plans.md#the-per-room-checks-index).
            let earlier = format!("e.{position} < c.{position}");
            // Below the floor, a pending row is one this claim cannot take (committed
            // late, skipped by the claim that set the floor, or made pending again): it
            // holds its room back like a leased one, unless it is this node's own, leased
            // and in flight, which the Publisher keeps ahead of its room's later rows.
            let below_floor = match request.floor {
                Some(floor) => format!(
                    " OR (e.{position} < {} AND (e.locked_until IS NULL OR {} < {}))",
                    params.bind(floor),
                    dialect.time("e.locked_until"),
                    params.bind_time_expr(now)
                ),
                None => String::new(),
            };
            sql.push_str(&format!(
                " AND NOT EXISTS (SELECT 1 FROM {table} e{hint} WHERE e.{key} = c.{key} \
                 AND e.status = {PENDING} AND {earlier} \
                 AND ({waiting} OR ({leased} AND e.locked_by <> {node}){below_floor}){fence})"
            ));
        }
        sql
    }

    /// `UPDATE … RETURNING` that leases the claimable rows to the claiming node
    /// (PostgreSQL and SQLite; MySQL has no `RETURNING`).
    fn lease_returning(&self) -> Statement {
        let Self {
            dialect,
            table,
            reads,
            ..
        } = *self;
        let position = &reads.position;
        let mut params = Params::new(dialect);
        let node = params.bind(self.request.node_id.as_str());
        let until = params.bind_time(self.lease_end());
        let claimable = self.claimable(&mut params);
        let limit = params.bind(self.limit());
        let hint = dialect.index_hint(table, Index::Pending);
        let lock = dialect.skip_locked();
        let candidates = match self.request.max_bytes {
            None => format!(
                "SELECT c.{position} FROM {table} c{hint} WHERE {claimable} \
                 ORDER BY c.{position} LIMIT {limit}{lock}"
            ),
            Some(max_bytes) => {
                let sized = format!(
                    "SELECT c.{position} AS {BUDGET_POSITION}, {} AS {BUDGET_SIZE} \
                     FROM {table} c{hint} WHERE {claimable} ORDER BY c.{position} \
                     LIMIT {limit}{lock}",
                    dialect.octet_length(reads.payload())
                );
                within_budget(&sized, max_bytes, &mut params)
            }
        };
        let ids = dialect.in_subquery(&candidates);
        let floor = self.next_floor(&mut params);
        // PostgreSQL leaves large envelopes out, to read them in pieces (postgres.rs).
        let columns = match dialect {
            Dialect::Postgres => reads.claimed_columns_inline(postgres::INLINE_BYTES),
            Dialect::MySql | Dialect::Sqlite => reads.claimed_columns(),
        };
        let sql = format!(
            "UPDATE {table} SET locked_by = {node}, locked_until = {until} WHERE {position} {ids} \
             RETURNING {columns}, ({floor}) AS {NEXT_FLOOR}"
        );
        params.statement(sql)
    }

    /// The lowest position of a pending row, leased or not, at or above the request's
    /// floor: where the next claim may start ([`outbox_core::Claimed::floor`]). One walk
    /// of the pending index from the floor to the first live entry. In `RETURNING` it is
    /// evaluated once, and only when a row was leased.
    fn next_floor(&self, params: &mut Params) -> String {
        let Self {
            dialect,
            table,
            reads,
            request,
            ..
        } = *self;
        let position = &reads.position;
        let hint = dialect.index_hint(table, Index::Pending);
        let from = match request.floor {
            Some(floor) => format!(" AND f.{position} >= {}", params.bind(floor)),
            None => String::new(),
        };
        format!(
            "SELECT {} FROM {table} f{hint} WHERE f.status = {PENDING}{from}",
            reads.position_value(&format!("MIN(f.{position})"))
        )
    }

    /// When the leases this claim takes end.
    fn lease_end(&self) -> DateTime<Utc> {
        lease_until(self.now, self.request.lease)
    }

    fn limit(&self) -> i64 {
        i64::try_from(self.request.limit).unwrap_or(i64::MAX)
    }
}

/// The column of a claim's answer that holds [`Claim::next_floor`].
const NEXT_FLOOR: &str = "claim_next_floor";

/// The candidate position's alias in a budgeted claim ([`within_budget`]).
const BUDGET_POSITION: &str = "claim_position";
/// The candidate envelope's size in bytes, aliased, in a budgeted claim.
const BUDGET_SIZE: &str = "claim_bytes";

/// The positions of `sized` (candidates with [`BUDGET_POSITION`] and [`BUDGET_SIZE`], in
/// position order, limited and locked) that fit in `max_bytes`: each candidate whose
/// earlier candidates sum to less than the budget. So the first is always kept (a row
/// larger than the budget still flows), the claim holds less than the budget plus its last
/// row, and what is cut is a tail in position order: for every room, rows after each row
/// it keeps, so room order holds. A running sum over the limited candidates, not over the
/// table, and the sizes come from the row headers (`octet_length`), not the envelopes:
/// the envelopes of cut rows are never read. Rows cut here stay unleased; where the
/// candidates were locked (`SKIP LOCKED`), only until the claim commits.
fn within_budget(sized: &str, max_bytes: usize, params: &mut Params) -> String {
    let budget = params.bind(i64::try_from(max_bytes).unwrap_or(i64::MAX));
    format!(
        "SELECT w.{BUDGET_POSITION} FROM (SELECT k.{BUDGET_POSITION}, \
         SUM(k.{BUDGET_SIZE}) OVER (ORDER BY k.{BUDGET_POSITION}) - k.{BUDGET_SIZE} AS bytes_before \
         FROM ({sized}) k) w WHERE w.bytes_before < {budget}"
    )
}

/// Serialises per-room claims of all nodes on this table: waits for the row lock on
/// `<table>_lock`, held until the claim commits. Two claims at once would each see the
/// other's leases as free (uncommitted), so two nodes could take rows of one room; only
/// the claim statement is serialised (docs/design/claims.md#the-claim-lock).
fn claim_lock_sql(table: &TableName) -> String {
    format!("SELECT name FROM {table}_lock WHERE name = 'claim' FOR UPDATE")
}

/// Takes the claim lock ([`claim_lock_sql`]) in `txn`.
async fn take_claim_lock<C: ConnectionTrait>(txn: &C, table: &TableName) -> Result<(), DbErr> {
    txn.execute_unprepared(&claim_lock_sql(table)).await?;
    Ok(())
}

/// When a lease of `lease` taken at `now` ends: never a panic, however long the lease (the
/// settings bound it; a lease beyond what a timestamp holds ends at the last one).
pub(crate) fn lease_until(now: DateTime<Utc>, lease: Duration) -> DateTime<Utc> {
    let lease = chrono::Duration::from_std(lease).unwrap_or(chrono::Duration::seconds(30));
    now.checked_add_signed(lease)
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_too_long_for_a_timestamp_ends_at_the_last_one_without_a_panic() {
        let now = Utc::now();
        assert_eq!(
            lease_until(now, Duration::from_secs(30)),
            now + chrono::Duration::seconds(30)
        );
        let million_years = Duration::from_secs(1_000_000 * 31_557_600);
        assert_eq!(lease_until(now, million_years), DateTime::<Utc>::MAX_UTC);
    }
}
