//! The claim on PostgreSQL: one `UPDATE … RETURNING` over the candidates, which
//! `FOR UPDATE SKIP LOCKED` takes side by side with other nodes' claims.

use super::{claim_lock_sql, Claim};
use crate::dialect::PIN_INDEX_PLAN;
use crate::row::ClaimedRow;
use outbox_core::Ordering;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, TransactionTrait};

pub(super) async fn claim(
    db: &DatabaseConnection,
    claim: &Claim<'_>,
) -> Result<Vec<ClaimedRow>, DbErr> {
    let statement = claim.lease_returning();
    // One simple-protocol round trip before the claim: the plan walks the pending index
    // in id order and stops at the limit (PIN_INDEX_PLAN, plus no sort), the commit is
    // relaxed (Dialect::relaxed_commit), and per-room claims take the claim lock.
    // SET LOCAL ends with the transaction. No JIT: the byte budget's window sorts its
    // hundred candidates, and with sorts "disabled" that plan's cost passes
    // `jit_above_cost`: compiling it took 170 ms of a 0.3 ms claim.
    let mut prelude = format!(
        "{PIN_INDEX_PLAN}, set_config('enable_sort', 'off', true), \
         set_config('synchronous_commit', 'off', true), set_config('jit', 'off', true)"
    );
    if claim.request.ordering == Ordering::PerRoom {
        prelude.push_str("; ");
        prelude.push_str(&claim_lock_sql(claim.table));
    }
    let txn = db.begin().await?;
    txn.execute_unprepared(&prelude).await?;
    let rows = txn.query_all(statement).await?;
    let rows = ClaimedRow::read_all(rows, claim.reads)?;
    txn.commit().await?;
    Ok(rows)
}
