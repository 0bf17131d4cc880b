//! Writing outcomes and leases: [`SeaOrmStore::mark_batch`] (the Marker's flush), and
//! releasing and renewing a node's leases. The outcome rules: docs/design/outcomes.md.

use crate::dialect::{Dialect, Params};
use crate::sql::Index;
use crate::sql::{DEAD, PENDING, PUBLISHED};
use crate::store::SeaOrmStore;
use chrono::Utc;
use outbox_core::{MarkBatch, PublishedRows};
use sea_orm::{ConnectionTrait, DbErr, IsolationLevel, TransactionTrait};
use std::time::Duration;

impl SeaOrmStore {
    /// One statement per kind of outcome. A batch of one kind (the common case: all
    /// published) is a single statement, atomic by itself, so it runs without BEGIN and
    /// COMMIT round trips; a mixed batch runs in one transaction. Either way the commit
    /// is relaxed ([`crate::dialect::Dialect::relaxed_commit`]).
    pub(crate) async fn mark_batch(&self, node_id: &str, batch: &MarkBatch) -> Result<(), DbErr> {
        let dialect = self.dialect();
        let t = self.table();
        let p = &self.reads().position;
        let now = Utc::now();
        let mut statements: Vec<(Params, String)> = Vec::with_capacity(4);
        if !batch.published.is_empty() {
            // The broker confirmed: `published` wins even if the lease was lost meanwhile
            // (and a deleted row is gone whatever another node made of it).
            let mut params = Params::new(dialect);
            let sql = match self.published_rows() {
                PublishedRows::Keep => {
                    let at = params.bind_time(now);
                    let ids = params.any_of(&batch.published);
                    format!(
                        "UPDATE {t} SET status = {PUBLISHED}, published_at = {at}, locked_by = NULL, \
                         locked_until = NULL WHERE {p} {ids} AND status <> {PUBLISHED}"
                    )
                }
                PublishedRows::Delete => {
                    let ids = params.any_of(&batch.published);
                    format!("DELETE FROM {t} WHERE {p} {ids}")
                }
            };
            statements.push((params, sql));
        }
        for (rows, counted) in [(&batch.retried, true), (&batch.deferred, false)] {
            if rows.is_empty() {
                continue;
            }
            let mut params = Params::new(dialect);
            let mut errors = format!("CASE {p}");
            for (failure, _) in rows {
                let id = params.bind(failure.id);
                let error = params.bind(failure.error.as_str());
                errors.push_str(&format!(" WHEN {id} THEN {error}"));
            }
            errors.push_str(" END");
            let mut available = format!("CASE {p}");
            for (failure, at) in rows {
                let id = params.bind(failure.id);
                let at = params.bind_time(*at);
                available.push_str(&format!(" WHEN {id} THEN {at}"));
            }
            available.push_str(" END");
            let ids: Vec<i64> = rows.iter().map(|(failure, _)| failure.id).collect();
            let ids = params.any_of(&ids);
            let node = params.bind(node_id);
            // A deferred row keeps its attempts: the broker's outage was not its doing.
            let attempt = if counted {
                "retry_count = retry_count + 1, "
            } else {
                ""
            };
            let sql = format!(
                "UPDATE {t} SET {attempt}last_error = {errors}, \
                 available_at = {available}, locked_by = NULL, locked_until = NULL \
                 WHERE {p} {ids} AND status = {PENDING} AND locked_by = {node}"
            );
            statements.push((params, sql));
        }
        if !batch.dead.is_empty() {
            let mut params = Params::new(dialect);
            let mut errors = format!("CASE {p}");
            for failure in &batch.dead {
                let id = params.bind(failure.id);
                let error = params.bind(failure.error.as_str());
                errors.push_str(&format!(" WHEN {id} THEN {error}"));
            }
            errors.push_str(" END");
            let ids: Vec<i64> = batch.dead.iter().map(|failure| failure.id).collect();
            let ids = params.any_of(&ids);
            let node = params.bind(node_id);
            let sql = format!(
                "UPDATE {t} SET status = {DEAD}, retry_count = retry_count + 1, \
                 last_error = {errors}, locked_by = NULL, locked_until = NULL \
                 WHERE {p} {ids} AND status = {PENDING} AND locked_by = {node}"
            );
            statements.push((params, sql));
        }
        if !batch.released.is_empty() {
            let mut params = Params::new(dialect);
            let ids = params.any_of(&batch.released);
            let node = params.bind(node_id);
            let sql = format!(
                "UPDATE {t} SET locked_by = NULL, locked_until = NULL \
                 WHERE {p} {ids} AND status = {PENDING} AND locked_by = {node}"
            );
            statements.push((params, sql));
        }
        if statements.len() == 1 {
            let (params, sql) = statements.remove(0);
            let sql = dialect.relax_commit_of(sql);
            self.connection().execute(params.statement(sql)).await?;
            return Ok(());
        }
        let txn = self.connection().begin().await?;
        if let Some(relaxed) = dialect.relaxed_commit() {
            txn.execute_unprepared(relaxed).await?;
        }
        for (params, sql) in statements {
            txn.execute(params.statement(sql)).await?;
        }
        txn.commit().await
    }

    /// Clears every lease `node_id` holds on pending rows; returns how many.
    ///
    /// MySQL/MariaDB: under READ COMMITTED, so that the statement keeps locks only on the
    /// rows it changes (this node's), not on every pending row and gap it reads: under
    /// REPEATABLE READ it locked the whole backlog, and a producer's transaction locking
    /// rows of it in another order made a deadlock of it.
    pub(crate) async fn release_leases(&self, node_id: &str) -> Result<u64, DbErr> {
        let t = self.table();
        let mut params = Params::new(self.dialect());
        let node = params.bind(node_id);
        let statement = params.statement(format!(
            "UPDATE {t} SET locked_by = NULL, locked_until = NULL \
             WHERE locked_by = {node} AND status = {PENDING}"
        ));
        if self.dialect() == Dialect::MySql {
            let txn = self
                .connection()
                .begin_with_config(Some(IsolationLevel::ReadCommitted), None)
                .await?;
            let released = txn.execute(statement).await?.rows_affected();
            txn.commit().await?;
            return Ok(released);
        }
        self.execute_on_indexes(statement).await
    }

    /// Extends every lease `node_id` holds on pending rows (at or below position `up_to`,
    /// if given) to now + `lease`.
    pub(crate) async fn renew_leases(
        &self,
        node_id: &str,
        lease: Duration,
        up_to: Option<i64>,
    ) -> Result<u64, DbErr> {
        let dialect = self.dialect();
        let t = self.table();
        let p = &self.reads().position;
        let until = crate::claim::lease_until(Utc::now(), lease);
        let mut params = Params::new(dialect);
        let until = params.bind_time(until);
        let node = params.bind(node_id);
        // Bound at the node's highest claimed row, the pending index's walk ends there.
        let up_to = match up_to {
            Some(position) => format!(" AND {p} <= {}", params.bind(position)),
            None => String::new(),
        };
        let sql = match dialect {
            // MySQL cannot select from the table it updates, and a read-then-update
            // transaction would hold its locking read's locks (every pending row it scanned,
            // under REPEATABLE READ) while the Fetcher, whose future this runs in, is busy
            // with a claim that waits for them: one statement. InnoDB detects a deadlock
            // with the Marker at once and the Marker retries.
            Dialect::MySql => format!(
                "UPDATE {t} SET locked_until = {until} WHERE locked_by = {node} AND status = {PENDING}{up_to}"
            ),
            // The rows come from the pending index and are locked with SKIP LOCKED: a
            // renewal never waits for a row lock, so it cannot deadlock with the Marker,
            // whose update of the same rows locks them in another order (seen: PostgreSQL's
            // `deadlock detected` failing a Marker flush). A row skipped is being marked; if
            // that rolls back, the next renewal (every lease / 3) extends it.
            Dialect::Postgres | Dialect::Sqlite => {
                let held = format!(
                    "SELECT {} AS id FROM {t}{} WHERE status = {PENDING} AND locked_by = {node}{up_to}{}",
                    self.reads().position_value(p),
                    dialect.index_hint(t, Index::Pending),
                    dialect.skip_locked(),
                );
                format!("UPDATE {t} SET locked_until = {until} WHERE {p} {}", dialect.in_subquery(&held))
            }
        };
        self.execute_on_indexes(params.statement(sql)).await
    }
}
