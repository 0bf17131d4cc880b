//! The claim on PostgreSQL: one `UPDATE … RETURNING` over the candidates, which
//! `FOR UPDATE SKIP LOCKED` takes side by side with other nodes' claims.

use super::{claim_lock_sql, Claim, Leased};
use crate::dialect::PIN_INDEX_PLAN;
use outbox_core::Ordering;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, Statement, TransactionTrait};

pub(super) async fn claim(db: &DatabaseConnection, claim: &Claim<'_>) -> Result<Leased, DbErr> {
    let statement = claim.lease_returning();
    let txn = db.begin().await?;
    txn.execute_unprepared(&prelude(claim)).await?;
    let rows = txn.query_all(statement).await?;
    let leased = Leased::read_returning(rows, claim.reads)?;
    txn.commit().await?;
    Ok(leased)
}

/// `EXPLAIN (ANALYZE, BUFFERS)` of the claim, run as the relay runs it (same settings,
/// same lock) and rolled back: the plan's lines.
pub(super) async fn explain(db: &DatabaseConnection, claim: &Claim<'_>) -> Result<String, DbErr> {
    let statement = claim.lease_returning();
    let explain = Statement {
        sql: format!("EXPLAIN (ANALYZE, BUFFERS) {}", statement.sql),
        ..statement
    };
    let txn = db.begin().await?;
    txn.execute_unprepared(&prelude(claim)).await?;
    let lines = txn
        .query_all(explain)
        .await?
        .iter()
        .map(|row| row.try_get_by_index::<String>(0))
        .collect::<Result<Vec<_>, _>>()?;
    txn.rollback().await?;
    Ok(lines.join("\n"))
}

/// One simple-protocol round trip before the claim: the plan walks the pending index in
/// id order and stops at the limit (PIN_INDEX_PLAN, plus no sort), the commit is relaxed
/// (Dialect::relaxed_commit), and per-room claims take the claim lock. SET LOCAL ends with
/// the transaction. No JIT: the byte budget's window sorts its hundred candidates, and
/// with sorts "disabled" that plan's cost passes `jit_above_cost`: compiling it took
/// 170 ms of a 0.3 ms claim.
fn prelude(claim: &Claim<'_>) -> String {
    let mut prelude = format!(
        "{PIN_INDEX_PLAN}, set_config('enable_sort', 'off', true), \
         set_config('synchronous_commit', 'off', true), set_config('jit', 'off', true)"
    );
    if claim.request.ordering == Ordering::PerRoom {
        prelude.push_str("; ");
        prelude.push_str(&claim_lock_sql(claim.table));
    }
    prelude
}
