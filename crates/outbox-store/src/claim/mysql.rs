//! The claim on MySQL/MariaDB, which has neither `UPDATE … RETURNING` nor `LIMIT` in an
//! `IN` subquery of the updated table: select, then update, in one transaction.

use super::{
    take_claim_lock, within_budget, Claim, Leased, BUDGET_POSITION, BUDGET_SIZE, NEXT_FLOOR,
};
use crate::dialect::Params;
use crate::row::{read_each, ClaimedRow, Cursor};
use crate::sql::{Index, PENDING};
use outbox_core::Ordering;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, IsolationLevel, TransactionTrait};
use std::collections::HashSet;

pub(super) async fn claim(db: &DatabaseConnection, claim: &Claim<'_>) -> Result<Leased, DbErr> {
    let Claim {
        dialect,
        table: t,
        reads,
        request,
        ..
    } = *claim;
    let position = &reads.position;
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
            (txn, dialect.skip_locked())
        }
    };
    let mut params = Params::new(dialect);
    let claimable = claim.claimable(&mut params);
    let limit = params.bind(claim.limit());
    let hint = dialect.index_hint(t, Index::Pending);
    let sql = match request.max_bytes {
        None => format!(
            "SELECT {} FROM {t} c{hint} WHERE {claimable} ORDER BY c.{position} \
             LIMIT {limit}{lock}",
            reads.claimed_columns()
        ),
        // The budget picks positions from sizes alone; only the kept rows' columns are read.
        Some(max_bytes) => {
            let sized = format!(
                "SELECT c.{position} AS {BUDGET_POSITION}, {} AS {BUDGET_SIZE} \
                 FROM {t} c{hint} WHERE {claimable} ORDER BY c.{position} LIMIT {limit}{lock}",
                dialect.octet_length(reads.payload())
            );
            let kept = within_budget(&sized, max_bytes, &mut params);
            format!(
                "SELECT {} FROM {t} JOIN ({kept}) b ON {t}.{position} = b.{BUDGET_POSITION}",
                reads.claimed_columns()
            )
        }
    };
    let mut rows = read_each(&txn, params.statement(sql), |row| {
        ClaimedRow::read(&mut Cursor::new(row), reads)
    })
    .await?;
    if !rows.is_empty() {
        let ids: Vec<i64> = rows.iter().map(|row| row.id).collect();
        let mut params = Params::new(dialect);
        let node = params.bind(request.node_id.as_str());
        let until = params.bind_time(claim.lease_end());
        let list = params.bind_ids(&ids);
        // Still pending? A row read without a lock may have been marked published
        // meanwhile, by a node whose lease on it had expired.
        let sql = format!(
            "UPDATE {t} SET locked_by = {node}, locked_until = {until} \
             WHERE {position} IN ({list}) AND status = {PENDING}"
        );
        let updated = txn.execute(params.statement(sql)).await?.rows_affected();
        if updated < rows.len() as u64 {
            // Rare: keep only the rows this claim leased.
            let mut params = Params::new(dialect);
            let list = params.bind_ids(&ids);
            let node = params.bind(request.node_id.as_str());
            let leased: HashSet<i64> = txn
                .query_all(params.statement(format!(
                    "SELECT {} AS id FROM {t} WHERE {position} IN ({list}) \
                     AND locked_by = {node} AND status = {PENDING}",
                    reads.position_value(position)
                )))
                .await?
                .iter()
                .map(|row| row.try_get::<i64>("", "id"))
                .collect::<Result<_, _>>()?;
            rows.retain(|row| leased.contains(&row.id));
        }
    }
    let next_floor = match rows.is_empty() {
        true => None,
        false => {
            let mut params = Params::new(dialect);
            let floor = claim.next_floor(&mut params);
            txn.query_one(params.statement(format!("SELECT ({floor}) AS {NEXT_FLOOR}")))
                .await?
                .map(|row| row.try_get::<Option<i64>>("", NEXT_FLOOR))
                .transpose()?
                .flatten()
        }
    };
    txn.commit().await?;
    Ok(Leased { rows, next_floor })
}
