//! The claim on MySQL/MariaDB, which has neither `UPDATE … RETURNING` nor `LIMIT` in an
//! `IN` subquery of the updated table: select, then update, in one transaction.

use super::{claimable, lease, limit, take_claim_lock, COLUMNS};
use crate::dialect::{Dialect, Params};
use crate::row::ClaimedRow;
use crate::sql::{Index, PENDING};
use crate::store::SeaOrmStore;
use chrono::Utc;
use outbox_core::{ClaimRequest, Ordering};
use sea_orm::{ConnectionTrait, DbErr, FromQueryResult, IsolationLevel, TransactionTrait};
use std::collections::HashSet;

const MYSQL: Dialect = Dialect::MySql;

pub(super) async fn claim(
    store: &SeaOrmStore,
    request: &ClaimRequest,
) -> Result<Vec<ClaimedRow>, DbErr> {
    let t = store.table();
    let db = store.connection();
    let now = Utc::now();
    // Per-room claims: serialised by the claim lock, candidates read without row locks
    // (InnoDB's snapshot starts at the first plain read, after the lock, so it holds every
    // earlier claim). Locking reads were the slow part, and MariaDB's `SKIP LOCKED` also
    // hid earlier rows inside the per-room probe. Without ordering: no claim lock, and
    // `SKIP LOCKED` under READ COMMITTED, so no gap lock holds up producers' inserts.
    let (txn, lock) = match request.ordering {
        Ordering::PerRoom => {
            let txn = db.begin().await?;
            take_claim_lock(&txn, t).await?;
            (txn, "")
        }
        Ordering::None => {
            let txn = db
                .begin_with_config(Some(IsolationLevel::ReadCommitted), None)
                .await?;
            (txn, MYSQL.skip_locked())
        }
    };
    let mut params = Params::new(MYSQL);
    let claimable = claimable(MYSQL, t, &mut params, now, request);
    let limit = params.bind(limit(request));
    let hint = MYSQL.index_hint(t, Index::Pending);
    let sql = format!(
        "SELECT {COLUMNS} FROM {t} c{hint} WHERE {claimable} ORDER BY c.id LIMIT {limit}{lock}"
    );
    let mut rows = ClaimedRow::find_by_statement(params.statement(sql))
        .all(&txn)
        .await?;
    if !rows.is_empty() {
        let ids: Vec<i64> = rows.iter().map(|row| row.id).collect();
        let mut params = Params::new(MYSQL);
        let node = params.bind(request.node_id.as_str());
        let until = params.bind_time(now + lease(request));
        let list = params.bind_ids(&ids);
        // Still pending? A row read without a lock may have been marked published
        // meanwhile, by a node whose lease on it had expired.
        let sql = format!(
            "UPDATE {t} SET locked_by = {node}, locked_until = {until} \
             WHERE id IN ({list}) AND status = {PENDING}"
        );
        let updated = txn.execute(params.statement(sql)).await?.rows_affected();
        if updated < rows.len() as u64 {
            // Rare: keep only the rows this claim leased.
            let mut params = Params::new(MYSQL);
            let list = params.bind_ids(&ids);
            let node = params.bind(request.node_id.as_str());
            let leased: HashSet<i64> = txn
                .query_all(params.statement(format!(
                    "SELECT id FROM {t} WHERE id IN ({list}) AND locked_by = {node} \
                     AND status = {PENDING}"
                )))
                .await?
                .iter()
                .map(|row| row.try_get::<i64>("", "id"))
                .collect::<Result<_, _>>()?;
            rows.retain(|row| leased.contains(&row.id));
        }
    }
    txn.commit().await?;
    Ok(rows)
}
