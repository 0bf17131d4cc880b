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
                // One more than the limit: whether the limit cut the list.
                let mut events = store.dead_events(&filter, limit.map(|n| n + 1)).await?;
                let cut = limit.filter(|&n| events.len() as u64 > n);
                if let Some(n) = cut {
                    events.truncate(usize::try_from(n).unwrap_or(usize::MAX));
                }
                listing.show(&config.name, &events)?;
                if let Some(n) = cut {
                    // Counted after the listing: never fewer than it found.
                    let total = store.count_dead(&filter).await?.max(n + 1);
                    // On stderr: stdout stays the listing alone (TSV or JSON lines).
                    note(&cut_note(&config.name, n, total));
                }
            }
            if !json && listing.shown == 0 {
                say!("no dead events")?;
            }
        }
        DeadCommand::Requeue {
            event_ids,
            filters,
            all,
            dry_run,
            outbox: _,
        } => {
            let older_than = filters.older_than;
            let filter = filter(event_ids, filters);
            let audit = Audit::of(&filter, older_than, all);
            requeue(&outboxes, filter, &audit, dry_run).await?
        }
    }
    Ok(())
}

/// What `dead list` says when `--limit` cut an outbox's list.
fn cut_note(outbox: &str, shown: u64, total: u64) -> String {
    format!(
        "outbox {outbox}: showing the first {shown} of {total} dead events; --limit N for \
         more, --limit 0 for every one"
    )
}

/// One line on standard error, for the reader rather than for a program reading stdout.
/// A failed write is no reason to fail the command.
fn note(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
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
        positions: Vec::new(),
        key: filters.room,
        event_type: filters.event_type,
        created_before,
    }
}

/// The selection of `dead requeue` as its audit line carries it: one plain field per
/// option given (an option not given is left out), for a person and a log tool alike.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Audit {
    /// `--event-id`s, comma-separated.
    event_ids: Option<String>,
    /// `--key` (or `--room`).
    key: Option<String>,
    /// `--event-type`, an exact type or a topic pattern.
    event_type: Option<String>,
    /// `--older-than`, as a duration ("12h").
    older_than: Option<String>,
    /// The creation time `--older-than` came to (RFC 3339): the bound the rows were
    /// selected by.
    created_before: Option<String>,
    /// `--all`.
    all: bool,
}

impl Audit {
    fn of(filter: &DeadFilter, older_than: Option<std::time::Duration>, all: bool) -> Self {
        Self {
            event_ids: (!filter.event_ids.is_empty()).then(|| filter.event_ids.join(",")),
            key: filter.key.clone(),
            event_type: filter.event_type.clone(),
            older_than: older_than.map(|age| humantime::format_duration(age).to_string()),
            created_before: filter
                .created_before
                .map(|bound| bound.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
            all,
        }
    }
}

/// `dead requeue`: requeues (or with `dry_run` lists) the selected dead events in each
/// outbox, logging each outbox's requeue with who asked and `audit`; an error naming the
/// `--event-id`s that selected nothing.
async fn requeue(
    outboxes: &[OpenOutbox],
    filter: DeadFilter,
    audit: &Audit,
    dry_run: bool,
) -> anyhow::Result<()> {
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
        info!(
            outbox = %config.name,
            requeued = here,
            by = %who,
            event_ids = audit.event_ids.as_deref(),
            key = audit.key.as_deref(),
            event_type = audit.event_type.as_deref(),
            older_than = audit.older_than.as_deref(),
            created_before = audit.created_before.as_deref(),
            all = audit.all,
            "dead events requeued"
        );
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
                        "key": event.key,
                        "room_id": event.key,
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
                event.key,
                event.event_type,
                event.retry_count,
                event.last_error.as_deref().unwrap_or("")
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn filters(key: Option<&str>, older_than: Option<Duration>) -> DeadFilters {
        DeadFilters {
            event_type: Some("order.*".into()),
            room: key.map(Into::into),
            older_than,
        }
    }

    #[test]
    fn the_audit_carries_each_option_given_as_a_plain_field() {
        let twelve_hours = Duration::from_secs(12 * 3600);
        let ids = vec!["e1".to_owned(), "e2".to_owned()];
        let selected = filter(ids, filters(Some("room-7"), Some(twelve_hours)));
        let audit = Audit::of(&selected, Some(twelve_hours), false);
        assert_eq!(audit.event_ids.as_deref(), Some("e1,e2"));
        assert_eq!(audit.key.as_deref(), Some("room-7"));
        assert_eq!(audit.event_type.as_deref(), Some("order.*"));
        assert_eq!(audit.older_than.as_deref(), Some("12h"));
        let bound = audit
            .created_before
            .expect("the bound --older-than came to");
        assert!(
            chrono::DateTime::parse_from_rfc3339(&bound).is_ok(),
            "RFC 3339: {bound}"
        );
        assert!(!audit.all);

        let everything = Audit::of(&DeadFilter::default(), None, true);
        assert_eq!(
            everything,
            Audit {
                event_ids: None,
                key: None,
                event_type: None,
                older_than: None,
                created_before: None,
                all: true,
            },
            "options not given are left out"
        );
    }

    #[test]
    fn a_cut_list_says_how_many_the_outbox_has() {
        assert_eq!(
            cut_note("orders", 100, 153),
            "outbox orders: showing the first 100 of 153 dead events; --limit N for more, \
             --limit 0 for every one"
        );
    }
}
