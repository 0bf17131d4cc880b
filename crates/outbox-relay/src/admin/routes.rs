//! The admin API's endpoints, JSON under `/api/v1`. Every error is `{"error": "…"}`.

use super::auth::authorize;
use super::tokens::Role;
use super::{Shared, ACTIONS};
use actix_web::{web, HttpRequest, HttpResponse, HttpResponseBuilder};
use outbox_core::OutboxStore;
use outbox_store::{DeadEvent, DeadFilter, DeadOrder, EventDetail};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use tracing::{info, warn};

/// `limit` of a dead listing when none is given, and its largest value.
const DEFAULT_LIMIT: u64 = 50;
const MAX_LIMIT: u64 = 500;
/// The most ids one requeue takes: a page of a listing. Each is one bound value (MySQL
/// takes 65,535 per statement).
const MAX_IDS: usize = 500;

/// The routes, for the server's `App`.
pub(super) fn configure(config: &mut web::ServiceConfig) {
    config
        .route("/api/v1/outboxes", web::get().to(outboxes))
        .route("/api/v1/outboxes/{outbox}/dead", web::get().to(dead))
        .route(
            "/api/v1/outboxes/{outbox}/events/{id}",
            web::get().to(event),
        )
        .route("/api/v1/outboxes/{outbox}/requeue", web::post().to(requeue))
        .default_service(web::to(|| async {
            error(HttpResponse::NotFound(), "no such endpoint")
        }));
}

/// A JSON error response.
pub(super) fn error(mut status: HttpResponseBuilder, message: &str) -> HttpResponse {
    status.json(json!({ "error": message }))
}

/// A database statement failed: 500, logged with the outbox.
fn failed(outbox: &str, why: impl std::fmt::Display) -> HttpResponse {
    warn!(outbox, error = %why, "admin API: a database statement failed");
    error(
        HttpResponse::InternalServerError(),
        &format!("the database failed: {why}"),
    )
}

/// The relay's thread is gone: the process is stopping.
fn stopping() -> HttpResponse {
    error(HttpResponse::ServiceUnavailable(), "the relay is stopping")
}

/// 404 for an outbox this process does not relay.
fn unknown_outbox(name: &str) -> HttpResponse {
    error(
        HttpResponse::NotFound(),
        &format!("no outbox named {name:?}"),
    )
}

/// `GET /api/v1/outboxes`: each outbox's backlog, dead events and top failures.
async fn outboxes(request: HttpRequest, shared: web::Data<Shared>) -> HttpResponse {
    if let Err(refused) = authorize(&request, &shared.tokens, &shared.limiter, Role::Viewer) {
        return refused.response();
    }
    let mut each = Vec::new();
    for outbox in &shared.outboxes {
        let store = outbox.store.clone();
        let stats = match shared.on_relay(async move { store.stats().await }).await {
            Some(Ok(stats)) => stats,
            Some(Err(why)) => return failed(&outbox.config.name, why),
            None => return stopping(),
        };
        each.push(json!({
            "name": outbox.config.name,
            "table": outbox.config.table.as_str(),
            "pending": stats.pending,
            "dead": stats.dead,
            "oldest_pending_age_seconds": stats.oldest_pending_age_seconds,
            "failing": stats.failing.iter()
                .map(|(error, count)| json!({"error": error, "count": count}))
                .collect::<Vec<_>>(),
        }));
    }
    HttpResponse::Ok().json(json!({ "outboxes": each }))
}

/// A dead listing as its query parameters ask for it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DeadQuery {
    /// `key` and `event_type`.
    filter: DeadFilter,
    /// `order`: `oldest` (the default) or `newest`.
    order: DeadOrder,
    /// `limit`.
    limit: u64,
    /// `cursor`: the last position of the previous page.
    cursor: Option<i64>,
}

/// The parameters a dead listing takes.
const DEAD_PARAMETERS: [&str; 5] = ["key", "event_type", "order", "limit", "cursor"];

/// A listing's query parameters, checked; the error starts with the parameter's name.
fn dead_query(query: &HashMap<String, String>) -> Result<DeadQuery, String> {
    if let Some(unknown) = query
        .keys()
        .find(|name| !DEAD_PARAMETERS.contains(&name.as_str()))
    {
        return Err(format!(
            "{unknown}: unknown parameter; accepted: {}",
            DEAD_PARAMETERS.join(", ")
        ));
    }
    let order = match query.get("order").map(String::as_str) {
        None | Some("oldest") => DeadOrder::Oldest,
        Some("newest") => DeadOrder::Newest,
        Some(other) => return Err(format!("order: {other:?} is neither oldest nor newest")),
    };
    let limit = match query.get("limit") {
        None => DEFAULT_LIMIT,
        Some(text) => match text.parse::<u64>() {
            Ok(limit) if (1..=MAX_LIMIT).contains(&limit) => limit,
            _ => {
                return Err(format!(
                    "limit: {text:?} is not a whole number from 1 to {MAX_LIMIT}"
                ))
            }
        },
    };
    let cursor = match query.get("cursor") {
        None => None,
        Some(text) => match text.parse::<i64>() {
            Ok(cursor) => Some(cursor),
            Err(_) => return Err("cursor: not a cursor this API returned".into()),
        },
    };
    let text = |name: &str| query.get(name).filter(|value| !value.is_empty()).cloned();
    let filter = DeadFilter {
        key: text("key"),
        event_type: text("event_type"),
        ..DeadFilter::default()
    };
    Ok(DeadQuery {
        filter,
        order,
        limit,
        cursor,
    })
}

fn dead_item(event: &DeadEvent) -> Value {
    json!({
        "id": event.id,
        "event_id": event.event_id,
        "key": event.key,
        "event_type": event.event_type,
        "attempts": event.retry_count,
        "last_error": event.last_error,
        "created_at": event.created_at.to_rfc3339(),
    })
}

/// `GET /api/v1/outboxes/{outbox}/dead`: dead events by position, oldest or newest first,
/// a page at a time; `next_cursor` resumes after the page (null: it was the last).
async fn dead(
    request: HttpRequest,
    shared: web::Data<Shared>,
    path: web::Path<String>,
    query: web::Query<HashMap<String, String>>,
) -> HttpResponse {
    if let Err(refused) = authorize(&request, &shared.tokens, &shared.limiter, Role::Viewer) {
        return refused.response();
    }
    let name = path.into_inner();
    let Some(outbox) = shared.outbox(&name) else {
        return unknown_outbox(&name);
    };
    let DeadQuery {
        filter,
        order,
        limit,
        cursor,
    } = match dead_query(&query) {
        Ok(parsed) => parsed,
        Err(why) => return error(HttpResponse::BadRequest(), &why),
    };
    let store = outbox.store.clone();
    // One more than the page: whether another follows.
    let work = async move {
        store
            .dead_events_after(&filter, order, cursor, Some(limit + 1))
            .await
    };
    let mut events = match shared.on_relay(work).await {
        Some(Ok(events)) => events,
        Some(Err(why)) => return failed(&name, why),
        None => return stopping(),
    };
    let more = events.len() as u64 > limit;
    events.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    let next_cursor = more
        .then(|| events.last().map(|event| event.id.to_string()))
        .flatten();
    HttpResponse::Ok().json(json!({
        "outbox": name,
        "items": events.iter().map(dead_item).collect::<Vec<_>>(),
        "next_cursor": next_cursor,
    }))
}

fn event_json(event: &EventDetail) -> Value {
    json!({
        "id": event.id,
        "event_id": event.event_id,
        "key": event.key,
        "event_type": event.event_type,
        "envelope": event.envelope,
        "headers": event.headers,
        "status": event.status,
        "attempts": event.retry_count,
        "last_error": event.last_error,
        "created_at": event.created_at.to_rfc3339(),
        "available_at": event.available_at.to_rfc3339(),
        "published_at": event.published_at.map(|at| at.to_rfc3339()),
    })
}

/// `GET /api/v1/outboxes/{outbox}/events/{id}`: one row in full, whatever its status.
async fn event(
    request: HttpRequest,
    shared: web::Data<Shared>,
    path: web::Path<(String, String)>,
) -> HttpResponse {
    if let Err(refused) = authorize(&request, &shared.tokens, &shared.limiter, Role::Viewer) {
        return refused.response();
    }
    let (name, id) = path.into_inner();
    let Some(outbox) = shared.outbox(&name) else {
        return unknown_outbox(&name);
    };
    let Ok(id) = id.parse::<i64>() else {
        return error(HttpResponse::BadRequest(), "id: not a whole number");
    };
    let store = outbox.store.clone();
    match shared.on_relay(async move { store.event(id).await }).await {
        Some(Ok(Some(event))) => HttpResponse::Ok().json(event_json(&event)),
        Some(Ok(None)) => error(
            HttpResponse::NotFound(),
            &format!("outbox {name:?} has no event with id {id}"),
        ),
        Some(Err(why)) => failed(&name, why),
        None => stopping(),
    }
}

/// `POST /api/v1/outboxes/{outbox}/requeue`'s body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Requeue {
    /// Positions (`id` of a listing).
    #[serde(default)]
    ids: Vec<i64>,
    /// An ordering key.
    key: Option<String>,
    /// An event type, or a topic pattern over event types.
    event_type: Option<String>,
    /// Count only.
    #[serde(default)]
    dry_run: bool,
}

impl Requeue {
    /// The selection as its audit line shows it.
    fn selection(&self) -> String {
        let mut parts = Vec::new();
        if !self.ids.is_empty() {
            let ids: Vec<String> = self.ids.iter().map(i64::to_string).collect();
            parts.push(format!("ids={}", ids.join(",")));
        }
        if let Some(key) = &self.key {
            parts.push(format!("key={key}"));
        }
        if let Some(event_type) = &self.event_type {
            parts.push(format!("event_type={event_type}"));
        }
        parts.join(" ")
    }
}

/// `POST /api/v1/outboxes/{outbox}/requeue` (operators): makes the selected dead events
/// pending again, as `outbox-relay dead requeue` does, or with `dry_run` counts them.
async fn requeue(
    request: HttpRequest,
    shared: web::Data<Shared>,
    path: web::Path<String>,
    body: web::Bytes,
) -> HttpResponse {
    let token = match authorize(&request, &shared.tokens, &shared.limiter, Role::Operator) {
        Ok(token) => token,
        Err(refused) => return refused.response(),
    };
    let name = path.into_inner();
    let Some(outbox) = shared.outbox(&name) else {
        return unknown_outbox(&name);
    };
    let asked: Requeue = match serde_json::from_slice(&body) {
        Ok(asked) => asked,
        Err(why) => {
            return error(
                HttpResponse::BadRequest(),
                &format!("body: {why}; expected {{\"ids\": [...]}} or {{\"key\": …, \"event_type\": …}}, and \"dry_run\""),
            )
        }
    };
    if asked.ids.len() > MAX_IDS {
        return error(
            HttpResponse::BadRequest(),
            &format!("ids: at most {MAX_IDS} at a time"),
        );
    }
    let blank = |value: &Option<String>| value.as_deref().is_none_or(str::is_empty);
    if asked.ids.is_empty() && blank(&asked.key) && blank(&asked.event_type) {
        return error(
            HttpResponse::BadRequest(),
            "ids, key or event_type: give at least one (this API never requeues every dead \
             event at once)",
        );
    }
    let filter = DeadFilter {
        positions: asked.ids.clone(),
        key: asked.key.clone().filter(|key| !key.is_empty()),
        event_type: asked.event_type.clone().filter(|t| !t.is_empty()),
        ..DeadFilter::default()
    };
    let store = outbox.store.clone();
    let dry_run = asked.dry_run;
    let work = async move {
        match dry_run {
            true => store.count_dead(&filter).await,
            false => store.requeue_dead(&filter).await,
        }
    };
    let count = match shared.on_relay(work).await {
        Some(Ok(count)) => count,
        Some(Err(why)) => return failed(&name, why),
        None => return stopping(),
    };
    let action = if dry_run {
        "requeue_dry_run"
    } else {
        "requeue"
    };
    info!(
        admin_token = %token.name,
        action,
        outbox = %name,
        selection = %asked.selection(),
        count,
        "admin action"
    );
    metrics::counter!(ACTIONS, "action" => action).increment(1);
    HttpResponse::Ok().json(json!({
        "outbox": name,
        "dry_run": dry_run,
        "count": count,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_listing_takes_a_limit_from_1_to_500_and_names_a_bad_parameter() {
        let asked = dead_query(&query(&[])).unwrap();
        assert_eq!((asked.limit, asked.cursor), (DEFAULT_LIMIT, None));
        assert_eq!(asked.order, DeadOrder::Oldest);
        let asked = dead_query(&query(&[
            ("limit", "500"),
            ("cursor", "7"),
            ("key", "r"),
            ("order", "newest"),
        ]))
        .unwrap();
        assert_eq!(
            (asked.limit, asked.cursor, asked.filter.key.as_deref()),
            (500, Some(7), Some("r"))
        );
        assert_eq!(asked.order, DeadOrder::Newest);
        for (name, value) in [
            ("limit", "0"),
            ("limit", "501"),
            ("limit", "x"),
            ("cursor", "x"),
            ("order", "up"),
            ("room", "r"),
        ] {
            let why = dead_query(&query(&[(name, value)])).unwrap_err();
            assert!(why.starts_with(name), "{why}");
        }
    }
}
