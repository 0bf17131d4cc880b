//! The claim on PostgreSQL: one `UPDATE … RETURNING` over the candidates, which
//! `FOR UPDATE SKIP LOCKED` takes side by side with other nodes' claims.

use super::{claim_lock_sql, lease_returning};
use crate::dialect::{Dialect, Params, PIN_INDEX_PLAN};
use crate::row::ClaimedRow;
use crate::store::SeaOrmStore;
use chrono::Utc;
use outbox_core::{ClaimRequest, Ordering};
use sea_orm::{ConnectionTrait, DbErr, FromQueryResult, TransactionTrait};

pub(super) async fn claim(
    store: &SeaOrmStore,
    request: &ClaimRequest,
) -> Result<Vec<ClaimedRow>, DbErr> {
    let mut params = Params::new(Dialect::Postgres);
    let sql = lease_returning(
        Dialect::Postgres,
        store.table(),
        &mut params,
        Utc::now(),
        request,
    );
    // One simple-protocol round trip before the claim: the plan walks the pending index
    // in id order and stops at the limit (PIN_INDEX_PLAN, plus no sort), the commit is
    // relaxed (Dialect::relaxed_commit), and per-room claims take the claim lock.
    // SET LOCAL ends with the transaction.
    let mut prelude = format!(
        "{PIN_INDEX_PLAN}, set_config('enable_sort', 'off', true), \
         set_config('synchronous_commit', 'off', true)"
    );
    if request.ordering == Ordering::PerRoom {
        prelude.push_str("; ");
        prelude.push_str(&claim_lock_sql(store.table()));
    }
    let txn = store.connection().begin().await?;
    txn.execute_unprepared(&prelude).await?;
    let rows = ClaimedRow::find_by_statement(params.statement(sql))
        .all(&txn)
        .await?;
    txn.commit().await?;
    Ok(rows)
}
