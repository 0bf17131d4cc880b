//! Operator queries: dead events, one event in full, and requeueing dead events.

use crate::dialect::{Dialect, Params};
use crate::error::Error;
use crate::reads::{PayloadDecode, Reads};
use crate::sql::{DEAD, PENDING};
use crate::store::SeaOrmStore;
use chrono::{DateTime, Utc};
use outbox_core::routing::topic_matches;
use sea_orm::{ConnectionTrait, FromQueryResult};

/// A dead event as `dead list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, FromQueryResult)]
pub struct DeadEvent {
    /// Row id.
    pub id: i64,
    /// Event id.
    pub event_id: String,
    /// Event type.
    pub event_type: String,
    /// Ordering key (the mapped key column; selected as `room_id`).
    #[sea_orm(from_alias = "room_id")]
    pub key: String,
    /// Failed attempts.
    pub retry_count: i32,
    /// Why it died.
    pub last_error: Option<String>,
    /// When the producer wrote it.
    pub created_at: DateTime<Utc>,
}

impl DeadEvent {
    /// The select list that reads one, through the table's column mapping.
    pub(crate) fn columns(reads: &Reads) -> String {
        format!(
            "{} AS id, {} AS event_id, {} AS event_type, {} AS room_id, retry_count, \
             last_error, {} AS created_at",
            reads.position_value(&reads.position),
            reads.event_id,
            reads.event_type,
            reads.key_text,
            reads.created_at,
        )
    }
}

/// One row in full, as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventDetail {
    /// Row position.
    pub id: i64,
    /// Event id.
    pub event_id: String,
    /// Event type.
    pub event_type: String,
    /// Ordering key.
    pub key: String,
    /// The message body as text (bytes that are no UTF-8 replaced).
    pub envelope: String,
    /// The headers column's JSON text; `None` when NULL or the table has none.
    pub headers: Option<String>,
    /// `pending`, `published` or `dead`.
    pub status: String,
    /// Failed attempts.
    pub retry_count: i32,
    /// The last failure.
    pub last_error: Option<String>,
    /// When the producer wrote it.
    pub created_at: DateTime<Utc>,
    /// Not published before this.
    pub available_at: DateTime<Utc>,
    /// When the broker confirmed it, if it did.
    pub published_at: Option<DateTime<Utc>>,
}

/// Which dead events `dead list` and `dead requeue` select: every condition given holds
/// (none given: every dead event).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadFilter {
    /// Only these event ids (empty: any).
    pub event_ids: Vec<String>,
    /// Only the rows at these positions (`columns.position`, the `id` of a listing; empty:
    /// any).
    pub positions: Vec<i64>,
    /// Only this ordering key.
    pub key: Option<String>,
    /// Only this event type, or the types an AMQP topic pattern matches (`*` one word, `#`
    /// zero or more, as `[[routes]]` match them).
    pub event_type: Option<String>,
    /// Only events created before this time (no time of death is recorded: a dead row is
    /// as old as its event, as for `purge --dead`).
    pub created_before: Option<DateTime<Utc>>,
}

impl DeadFilter {
    /// The event type is a topic pattern (a word `*` or `#`), matched here rather than by
    /// the database.
    fn type_pattern(&self) -> Option<&str> {
        self.event_type
            .as_deref()
            .filter(|pattern| pattern.split('.').any(|word| word == "*" || word == "#"))
    }

    /// The conditions the database checks (after `WHERE status = 'dead'`); a pattern is
    /// narrowed to the types that start with its words before the first wildcard, and
    /// [`DeadFilter::type_pattern`] decides.
    fn conditions(&self, params: &mut Params, reads: &Reads, dialect: Dialect) -> String {
        let mut conditions = String::new();
        if !self.event_ids.is_empty() {
            let list = self
                .event_ids
                .iter()
                .map(|id| params.bind(id.as_str()))
                .collect::<Vec<_>>()
                .join(", ");
            conditions.push_str(&format!(" AND {} IN ({list})", reads.event_id));
        }
        if !self.positions.is_empty() {
            let any = params.any_of(&self.positions);
            conditions.push_str(&format!(" AND {} {any}", reads.position));
        }
        if let Some(key) = &self.key {
            let key = params.bind(key.as_str());
            conditions.push_str(&format!(" AND {} = {key}", reads.key_text));
        }
        match (self.type_pattern(), &self.event_type) {
            (Some(pattern), _) => {
                let prefix = pattern
                    .split('.')
                    .take_while(|word| *word != "*" && *word != "#")
                    .collect::<Vec<_>>()
                    .join(".");
                if !prefix.is_empty() {
                    // `!` escapes LIKE's wildcards the same way on every backend.
                    let escaped = prefix
                        .replace('!', "!!")
                        .replace('%', "!%")
                        .replace('_', "!_");
                    let like = params.bind(format!("{escaped}%"));
                    conditions
                        .push_str(&format!(" AND {} LIKE {like} ESCAPE '!'", reads.event_type));
                }
            }
            (None, Some(event_type)) => {
                let event_type = params.bind(event_type.as_str());
                conditions.push_str(&format!(" AND {} = {event_type}", reads.event_type));
            }
            (None, None) => {}
        }
        if let Some(bound) = self.created_before {
            let bound = params.bind_time(bound);
            conditions.push_str(&format!(
                " AND {} < {}",
                dialect.time(&reads.created_at),
                dialect.time(&bound)
            ));
        }
        conditions
    }

    /// `event_type` passes the type condition the database could not check.
    fn admits(&self, event_type: &str) -> bool {
        self.type_pattern()
            .is_none_or(|pattern| topic_matches(pattern, event_type))
    }
}

/// The order of a dead listing, by position (`columns.position`: insertion order).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DeadOrder {
    /// Lowest position first: the oldest events first.
    #[default]
    Oldest,
    /// Highest position first: the newest events first.
    Newest,
}

/// Rows read per query while looking for dead events a pattern matches, and rows requeued
/// per statement by position.
const PAGE: usize = 500;

impl SeaOrmStore {
    /// Dead events matching `filter`, oldest first; at most `limit` of them (`None`: all).
    pub async fn dead_events(
        &self,
        filter: &DeadFilter,
        limit: Option<u64>,
    ) -> Result<Vec<DeadEvent>, Error> {
        self.dead_events_after(filter, DeadOrder::Oldest, None, limit)
            .await
    }

    /// Dead events matching `filter` in `order`, past position `after` in that order
    /// (`None`: from the start); at most `limit` of them (`None`: all). A page of a
    /// listing that resumes after the last position the previous page showed.
    pub async fn dead_events_after(
        &self,
        filter: &DeadFilter,
        order: DeadOrder,
        after: Option<i64>,
        limit: Option<u64>,
    ) -> Result<Vec<DeadEvent>, Error> {
        let limit = limit.map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
        let mut found = Vec::new();
        let mut after = after;
        while found.len() < limit {
            let page = self.dead_page(filter, order, after, PAGE).await?;
            let last_page = page.len() < PAGE;
            after = page.last().map(|event| event.id);
            found.extend(
                page.into_iter()
                    .filter(|event| filter.admits(&event.event_type))
                    .take(limit - found.len()),
            );
            if last_page {
                break;
            }
        }
        Ok(found)
    }

    /// How many dead events match `filter`: what `dead list` says it left out when its
    /// limit cut the list. One `COUNT(*)`, except for a topic pattern, whose rows are read
    /// and matched here as [`SeaOrmStore::dead_events`] does.
    pub async fn count_dead(&self, filter: &DeadFilter) -> Result<u64, Error> {
        if filter.type_pattern().is_some() {
            let events = self.dead_events(filter, None).await?;
            return Ok(u64::try_from(events.len()).unwrap_or(u64::MAX));
        }
        let t = self.table();
        let mut params = Params::new(self.dialect());
        let conditions = filter.conditions(&mut params, self.reads(), self.dialect());
        let row = self
            .connection()
            .query_one(params.statement(format!(
                "SELECT COUNT(*) AS n FROM {t} WHERE status = {DEAD}{conditions}"
            )))
            .await?;
        let n: i64 = match row {
            Some(row) => row.try_get("", "n")?,
            None => 0,
        };
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Up to `size` dead events that the database's conditions of `filter` select, past
    /// position `after` in `order`.
    async fn dead_page(
        &self,
        filter: &DeadFilter,
        order: DeadOrder,
        after: Option<i64>,
        size: usize,
    ) -> Result<Vec<DeadEvent>, Error> {
        let t = self.table();
        let reads = self.reads();
        let mut params = Params::new(self.dialect());
        let mut conditions = filter.conditions(&mut params, reads, self.dialect());
        if let Some(after) = after {
            let after = params.bind(after);
            let past = match order {
                DeadOrder::Oldest => ">",
                DeadOrder::Newest => "<",
            };
            conditions.push_str(&format!(" AND {} {past} {after}", reads.position));
        }
        let direction = match order {
            DeadOrder::Oldest => "ASC",
            DeadOrder::Newest => "DESC",
        };
        let size = params.bind(i64::try_from(size).unwrap_or(i64::MAX));
        DeadEvent::find_by_statement(params.statement(format!(
            "SELECT {} FROM {t} WHERE status = {DEAD}{conditions} ORDER BY {} {direction} \
             LIMIT {size}",
            DeadEvent::columns(reads),
            reads.position,
        )))
        .all(self.connection())
        .await
        .map_err(Error::from)
    }

    /// The row at `position` in full, whatever its status; `None` when there is none.
    pub async fn event(&self, position: i64) -> Result<Option<EventDetail>, Error> {
        let t = self.table();
        let reads = self.reads();
        let mut params = Params::new(self.dialect());
        let at = params.bind(position);
        let headers = reads.headers().unwrap_or("NULL");
        let row = self
            .connection()
            .query_one(params.statement(format!(
                "SELECT {} AS id, {} AS event_id, {} AS event_type, {} AS room_id, \
                 {} AS envelope, {headers} AS headers, status, retry_count, last_error, \
                 {} AS created_at, available_at, published_at \
                 FROM {t} WHERE {} = {at}",
                reads.position_value(&reads.position),
                reads.event_id,
                reads.event_type,
                reads.key_text,
                reads.payload(),
                reads.created_at,
                reads.position,
            )))
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let envelope = match reads.payload_decode {
            PayloadDecode::Text => row.try_get::<String>("", "envelope")?,
            PayloadDecode::Bytes => {
                String::from_utf8_lossy(&row.try_get::<Vec<u8>>("", "envelope")?).into_owned()
            }
        };
        let headers = match reads.headers() {
            Some(_) => row.try_get::<Option<String>>("", "headers")?,
            None => None,
        };
        Ok(Some(EventDetail {
            id: row.try_get("", "id")?,
            event_id: row.try_get("", "event_id")?,
            event_type: row.try_get("", "event_type")?,
            key: row.try_get("", "room_id")?,
            envelope,
            headers,
            status: row.try_get("", "status")?,
            retry_count: row.try_get("", "retry_count")?,
            last_error: row.try_get("", "last_error")?,
            created_at: row.try_get("", "created_at")?,
            available_at: row.try_get("", "available_at")?,
            published_at: row.try_get("", "published_at")?,
        }))
    }

    /// Makes the dead events `filter` selects pending again: `retry_count = 0`, available
    /// now, `last_error` kept for the record. Returns how many rows changed.
    pub async fn requeue_dead(&self, filter: &DeadFilter) -> Result<u64, Error> {
        if filter.type_pattern().is_none() {
            return self
                .requeue_where(|params| filter.conditions(params, self.reads(), self.dialect()))
                .await;
        }
        // A pattern is matched here: requeue the rows it matched, by position.
        let positions: Vec<i64> = self
            .dead_events(filter, None)
            .await?
            .iter()
            .map(|event| event.id)
            .collect();
        let mut requeued = 0;
        for chunk in positions.chunks(PAGE) {
            requeued += self
                .requeue_where(|params| {
                    format!(" AND {} {}", self.reads().position, params.any_of(chunk))
                })
                .await?;
        }
        Ok(requeued)
    }

    /// Requeues the dead rows that also meet the conditions `conditions` binds (after the
    /// time: `?` placeholders bind in the order of the statement's text).
    async fn requeue_where(
        &self,
        conditions: impl FnOnce(&mut Params) -> String,
    ) -> Result<u64, Error> {
        let t = self.table();
        let mut params = Params::new(self.dialect());
        let now = params.bind_time(Utc::now());
        let conditions = conditions(&mut params);
        let result = self
            .connection()
            .execute(params.statement(format!(
                "UPDATE {t} SET status = {PENDING}, retry_count = 0, available_at = {now}, \
                 locked_by = NULL, locked_until = NULL WHERE status = {DEAD}{conditions}"
            )))
            .await?;
        Ok(result.rows_affected())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::columns::Columns;

    fn by_type(event_type: &str) -> DeadFilter {
        DeadFilter {
            event_type: Some(event_type.into()),
            ..DeadFilter::default()
        }
    }

    #[test]
    fn a_type_with_a_wildcard_word_is_a_pattern_matched_as_routes_match() {
        assert_eq!(by_type("order.*").type_pattern(), Some("order.*"));
        assert_eq!(by_type("#").type_pattern(), Some("#"));
        assert_eq!(by_type("order.created").type_pattern(), None);
        assert_eq!(by_type("order*").type_pattern(), None, "only whole words");
        let pattern = by_type("order.*");
        assert!(pattern.admits("order.created"));
        assert!(!pattern.admits("order.created.late"));
        assert!(!pattern.admits("invoice.created"));
        assert!(
            by_type("order.created").admits("anything"),
            "an exact type is the database's to compare"
        );
    }

    #[test]
    fn a_pattern_is_narrowed_by_its_literal_words_with_like_escaped() {
        let reads = Reads::plain(Dialect::Postgres, &Columns::default());
        let mut params = Params::new(Dialect::Postgres);
        let sql = by_type("a_b.100%.*.x").conditions(&mut params, &reads, Dialect::Postgres);
        assert_eq!(sql, " AND event_type LIKE $1 ESCAPE '!'");
        let statement = params.statement(String::new());
        let bound = format!("{:?}", statement.values);
        assert!(bound.contains(r"a!_b.100!%%"), "{bound}");
        let mut params = Params::new(Dialect::Postgres);
        assert_eq!(
            by_type("#.created").conditions(&mut params, &reads, Dialect::Postgres),
            "",
            "no literal prefix: every dead row is read and matched here"
        );
    }
}
