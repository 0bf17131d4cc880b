//! `outbox-relay dead list` and `dead requeue`.

use crate::cli::{DeadCommand, DeadFilters};
use crate::settings::Config;
use crate::startup::{open_selected, OpenOutbox};
use anyhow::bail;
use outbox_store::{DeadEvent, DeadFilter};
use serde_json::json;
use tracing::info;

/// The header row of the text listing.
const HEADER: &str = "event_id\troom_id\tevent_type\tretry_count\tlast_error\toutbox";

/// Lists or requeues dead events of the selected outboxes (`--outbox`; default: all).
pub async fn dead(config: Config, command: DeadCommand) -> anyhow::Result<()> {
    let selector = match &command {
        DeadCommand::List { outbox, .. } | DeadCommand::Requeue { outbox, .. } => outbox.clone(),
    };
    let outboxes = open_selected(&config, selector.as_deref(), false).await?;
    match command {
        DeadCommand::List {
            json,
            limit,
            filters,
            outbox: _,
        } => {
            let filter = filter(Vec::new(), filters);
            // 0: no limit (documented in --help).
            let limit = (limit > 0).then_some(limit);
            let mut listing = Listing::new(json);
            for OpenOutbox { config, store } in &outboxes {
                let events = store.dead_events(&filter, limit).await?;
                listing.show(&config.name, &events)?;
            }
            if !json && listing.shown == 0 {
                say!("no dead events")?;
            }
        }
        DeadCommand::Requeue {
            event_ids,
            filters,
            all: _,
            dry_run,
            outbox: _,
        } => requeue(&outboxes, filter(event_ids, filters), dry_run).await?,
    }
    Ok(())
}

/// The store's filter for the command line's selection (`--all`: none).
fn filter(event_ids: Vec<String>, filters: DeadFilters) -> DeadFilter {
    // An age reaching before year 1 selects no event: the bound is year 1, which every
    // backend can compare with.
    let year_one = chrono::DateTime::from_timestamp(-62_135_596_800, 0).unwrap_or_default();
    let created_before = filters.older_than.map(|age| {
        chrono::Duration::from_std(age)
            .ok()
            .and_then(|age| chrono::Utc::now().checked_sub_signed(age))
            .map_or(year_one, |bound| bound.max(year_one))
    });
    DeadFilter {
        event_ids,
        room: filters.room,
        event_type: filters.event_type,
        created_before,
    }
}

/// `dead requeue`: requeues (or with `dry_run` lists) the selected dead events in each
/// outbox; an error naming the `--event-id`s that selected nothing.
async fn requeue(outboxes: &[OpenOutbox], filter: DeadFilter, dry_run: bool) -> anyhow::Result<()> {
    let who = super::operator();
    let mut listing = Listing::new(false);
    let mut found_ids = Vec::new();
    let mut requeued = 0;
    for OpenOutbox { config, store } in outboxes {
        if dry_run || !filter.event_ids.is_empty() {
            let events = store.dead_events(&filter, None).await?;
            found_ids.extend(events.iter().map(|event| event.event_id.clone()));
            if dry_run {
                listing.show(&config.name, &events)?;
                continue;
            }
            if events.is_empty() {
                // None of the ids is a dead event of this outbox.
                continue;
            }
        }
        let here = store.requeue_dead(&filter).await?;
        info!(outbox = %config.name, requeued = here, by = %who, selection = ?filter, "dead events requeued");
        requeued += here;
    }
    if dry_run {
        say!(
            "would requeue {} dead event(s); nothing changed (--dry-run)",
            listing.shown
        )?;
    } else {
        say!("requeued {requeued} dead event(s)")?;
    }
    let missing: Vec<&str> = filter
        .event_ids
        .iter()
        .filter(|id| !found_ids.contains(id))
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        bail!(
            "no dead event has event id {} (not in the table, not dead, or outside the other \
             filters); {}",
            missing.join(", "),
            match (dry_run, missing.len() < filter.event_ids.len()) {
                (true, _) => "nothing changed (--dry-run)",
                (false, true) => "the other ids were requeued",
                (false, false) => "nothing was requeued",
            }
        );
    }
    Ok(())
}

/// Dead events printed outbox after outbox: JSON lines, or text under one header row.
struct Listing {
    json: bool,
    shown: usize,
}

impl Listing {
    fn new(json: bool) -> Self {
        Self { json, shown: 0 }
    }

    /// One outbox's dead events: a JSON object or a tab-separated line each.
    fn show(&mut self, outbox: &str, events: &[DeadEvent]) -> Result<(), super::OutputError> {
        for event in events {
            self.shown += 1;
            if self.json {
                say!(
                    "{}",
                    json!({
                        "id": event.id,
                        "event_id": event.event_id,
                        "event_type": event.event_type,
                        "key": event.room_id,
                        "room_id": event.room_id,
                        "retry_count": event.retry_count,
                        "last_error": event.last_error,
                        "created_at": event.created_at.to_rfc3339(),
                        "outbox": outbox,
                    })
                )?;
                continue;
            }
            if self.shown == 1 {
                say!("{HEADER}")?;
            }
            say!(
                "{}\t{}\t{}\t{}\t{}\t{outbox}",
                event.event_id,
                event.room_id,
                event.event_type,
                event.retry_count,
                event.last_error.as_deref().unwrap_or("")
            )?;
        }
        Ok(())
    }
}
