//! The claim on PostgreSQL: one `UPDATE … RETURNING` over the candidates, which
//! `FOR UPDATE SKIP LOCKED` takes side by side with other nodes' claims.

use super::{claim_lock_sql, Claim, Leased, NEXT_FLOOR};
use crate::dialect::{Dialect, Params, PIN_INDEX_PLAN};
use crate::reads::PayloadDecode;
use crate::row::{read_each, ClaimedRow, Cursor};
use outbox_core::Ordering;
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr, Statement, TransactionTrait,
};

/// Envelopes up to this size come with the claim's answer; larger ones are read in pieces
/// of this size ([`read_in_pieces`]).
pub(super) const INLINE_BYTES: usize = 1024 * 1024;

pub(super) async fn claim(db: &DatabaseConnection, claim: &Claim<'_>) -> Result<Leased, DbErr> {
    let statement = claim.lease_returning();
    let txn = db.begin().await?;
    txn.execute_unprepared(&prelude(claim)).await?;
    let mut next_floor = None;
    let rows = read_each(&txn, statement, |row| {
        let mut next = Cursor::new(row);
        let claimed = ClaimedRow::read_inline(&mut next, claim.reads)?;
        next_floor = next.get(NEXT_FLOOR)?;
        Ok(claimed)
    })
    .await?;
    let mut leased = Leased {
        rows: Vec::with_capacity(rows.len()),
        next_floor,
    };
    for (mut row, left_out) in rows {
        if let Some(size) = left_out {
            row.envelope = read_in_pieces(&txn, claim, row.id, size).await?;
        }
        leased.rows.push(row);
    }
    txn.commit().await?;
    Ok(leased)
}

/// The envelope of row `id` (`size` bytes), read as pieces of [`INLINE_BYTES`], each
/// copied into place as it arrives. sqlx reads a message into a buffer that grows to
/// about three times the message's size (its read buffer doubles while it copies the
/// socket's chunks in) and keeps it until the connection reads again: a 25 MiB envelope
/// in one row took 78 MB of driver buffers beside the envelope itself (measured). In
/// pieces the driver holds about three pieces. The server converts the payload once (the
/// subquery is kept apart by `OFFSET 0`, so the pieces slice one value; text is sent as
/// its UTF-8 bytes, which is what the client would have received).
async fn read_in_pieces(
    txn: &DatabaseTransaction,
    claim: &Claim<'_>,
    id: i64,
    size: usize,
) -> Result<Vec<u8>, DbErr> {
    let Claim { table, reads, .. } = *claim;
    let position = &reads.position;
    let payload = match reads.payload_decode {
        PayloadDecode::Text => format!("convert_to({}, 'UTF8')", reads.payload()),
        PayloadDecode::Bytes => reads.payload().to_owned(),
    };
    let mut params = Params::new(Dialect::Postgres);
    let row = params.bind(id);
    let piece = params.bind(i32::try_from(INLINE_BYTES).unwrap_or(i32::MAX));
    let sql = format!(
        "SELECT i AS piece, substring(b.v FROM i * {piece} + 1 FOR {piece}) AS bytes \
         FROM (SELECT {payload} AS v FROM {table} c WHERE c.{position} = {row} OFFSET 0) b \
         CROSS JOIN LATERAL generate_series(0, (octet_length(b.v) - 1) / {piece}) AS i"
    );
    // `size` counts the server encoding's bytes: UTF-8's are as many, another encoding's
    // may be more, so the envelope grows when a piece reaches past it.
    let mut envelope = vec![0; size];
    let mut copied = 0;
    read_each(txn, params.statement(sql), |row| {
        let index = usize::try_from(row.try_get::<i32>("", "piece")?).unwrap_or(0);
        let bytes = row.try_get::<Vec<u8>>("", "bytes")?;
        let start = index * INLINE_BYTES;
        let end = start + bytes.len();
        if envelope.len() < end {
            envelope.resize(end, 0);
        }
        envelope[start..end].copy_from_slice(&bytes);
        copied += bytes.len();
        Ok(())
    })
    .await?;
    if copied != envelope.len() {
        return Err(DbErr::Custom(format!(
            "row {id}: {copied} of its envelope's {} bytes read",
            envelope.len()
        )));
    }
    Ok(envelope)
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
/// (Dialect::relaxed_commit), the claim's statements get its timeout, and per-room claims
/// take the claim lock. SET LOCAL ends with the transaction. No JIT: the byte budget's
/// window sorts its hundred candidates, and with sorts "disabled" that plan's cost passes
/// `jit_above_cost`: compiling it took 170 ms of a 0.3 ms claim.
fn prelude(claim: &Claim<'_>) -> String {
    let mut prelude = format!(
        "{PIN_INDEX_PLAN}, set_config('enable_sort', 'off', true), \
         set_config('synchronous_commit', 'off', true), set_config('jit', 'off', true)"
    );
    if let Some(timeout) = claim.timeout {
        prelude.push_str(&format!(
            ", set_config('statement_timeout', '{}', true)",
            timeout.as_millis().max(1)
        ));
    }
    if claim.request.ordering == Ordering::PerRoom {
        prelude.push_str("; ");
        prelude.push_str(&claim_lock_sql(claim.table));
    }
    prelude
}
