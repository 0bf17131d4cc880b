//! The claim: lease up to `limit` publishable rows to a node, oldest id first. One file
//! per backend, since the statements differ as a whole (RETURNING, row locks, how plans
//! are kept on the indexes); the conditions that make a row publishable are shared here.
//! The rules: docs/design.md#claims-leases-and-ordering.

mod mysql;
mod postgres;
mod sqlite;

use crate::dialect::{Dialect, Params};
use crate::row::ClaimedRow;
use crate::sql::{Index, TableName, PENDING};
use crate::store::SeaOrmStore;
use chrono::{DateTime, Utc};
use outbox_core::{ClaimRequest, Ordering};
use sea_orm::{ConnectionTrait, DbErr};

impl SeaOrmStore {
    /// Leases rows for `request` on this store's backend; in no particular order.
    pub(crate) async fn claim_rows(
        &self,
        request: &ClaimRequest,
    ) -> Result<Vec<ClaimedRow>, DbErr> {
        match self.dialect() {
            Dialect::Postgres => postgres::claim(self, request).await,
            Dialect::MySql => mysql::claim(self, request).await,
            Dialect::Sqlite => sqlite::claim(self, request).await,
        }
    }
}

/// The columns of [`ClaimedRow`].
const COLUMNS: &str =
    "id, event_id, event_type, room_id, envelope, headers, retry_count, created_at";

/// The conditions that make row alias `c` publishable for `request.node_id` at `now`.
fn claimable(
    dialect: Dialect,
    table: &TableName,
    params: &mut Params,
    now: DateTime<Utc>,
    request: &ClaimRequest,
) -> String {
    let mut sql = format!(
        "c.status = {PENDING} AND {} <= {} AND (c.locked_until IS NULL OR {} < {})",
        dialect.time("c.available_at"),
        params.bind_time_expr(now),
        dialect.time("c.locked_until"),
        params.bind_time_expr(now),
    );
    if request.ordering == Ordering::PerRoom {
        // Claimable only while no earlier pending row of its room waits out a delay or is
        // leased to another node (why that keeps room order:
        // docs/design.md#claims-leases-and-ordering). One probe of the pending-per-room
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
        sql.push_str(&format!(
            " AND NOT EXISTS (SELECT 1 FROM {table} e{hint} WHERE e.room_id = c.room_id \
             AND e.status = {PENDING} AND e.id < c.id \
             AND ({waiting} OR ({leased} AND e.locked_by <> {node})){fence})"
        ));
    }
    sql
}

/// `UPDATE … RETURNING` that leases to `request.node_id` the rows `candidates` selects
/// (PostgreSQL and SQLite; MySQL has no `RETURNING`).
fn lease_returning(
    dialect: Dialect,
    table: &TableName,
    params: &mut Params,
    now: DateTime<Utc>,
    request: &ClaimRequest,
) -> String {
    let node = params.bind(request.node_id.as_str());
    let until = params.bind_time(now + lease(request));
    let claimable = claimable(dialect, table, params, now, request);
    let limit = params.bind(limit(request));
    let hint = dialect.index_hint(table, Index::Pending);
    let lock = dialect.skip_locked();
    let candidates = format!(
        "SELECT c.id FROM {table} c{hint} WHERE {claimable} ORDER BY c.id LIMIT {limit}{lock}"
    );
    let ids = dialect.in_subquery(&candidates);
    format!(
        "UPDATE {table} SET locked_by = {node}, locked_until = {until} WHERE id {ids} \
         RETURNING {COLUMNS}"
    )
}

/// Serialises per-room claims of all nodes on this table: waits for the row lock on
/// `<table>_lock`, held until the claim commits. Two claims at once would each see the
/// other's leases as free (uncommitted), so two nodes could take rows of one room; only
/// the claim statement is serialised (docs/design.md#claims-leases-and-ordering).
fn claim_lock_sql(table: &TableName) -> String {
    format!("SELECT name FROM {table}_lock WHERE name = 'claim' FOR UPDATE")
}

/// Takes the claim lock ([`claim_lock_sql`]) in `txn`.
async fn take_claim_lock<C: ConnectionTrait>(txn: &C, table: &TableName) -> Result<(), DbErr> {
    txn.execute_unprepared(&claim_lock_sql(table)).await?;
    Ok(())
}

fn lease(request: &ClaimRequest) -> chrono::Duration {
    chrono::Duration::from_std(request.lease).unwrap_or(chrono::Duration::seconds(30))
}

fn limit(request: &ClaimRequest) -> i64 {
    i64::try_from(request.limit).unwrap_or(i64::MAX)
}
