//! `outbox-relay dead list` and `dead requeue`.

use crate::cli::DeadCommand;
use crate::settings::Config;
use crate::startup::{open_selected, OpenOutbox};
use outbox_store::{DeadFilter, Requeue};
use serde_json::json;
use tracing::info;

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
            room,
            event_type,
            outbox: _,
        } => {
            let filter = DeadFilter { room, event_type };
            let mut any = false;
            for OpenOutbox { config, store } in &outboxes {
                let events = store.dead_events(&filter, limit).await?;
                any |= !events.is_empty();
                list(&config.name, &events, json)?;
            }
            if !json && !any {
                say!("no dead events")?;
            }
        }
        DeadCommand::Requeue {
            event_ids,
            room,
            all,
            outbox: _,
        } => {
            let which = if all {
                Requeue::All
            } else if let Some(room) = room {
                Requeue::Room(room)
            } else {
                Requeue::EventIds(event_ids)
            };
            let who = super::operator();
            let mut requeued = 0;
            for OpenOutbox { config, store } in &outboxes {
                let here = store.requeue_dead(&which).await?;
                info!(outbox = %config.name, requeued = here, by = %who, selection = ?which, "dead events requeued");
                requeued += here;
            }
            say!("requeued {requeued} dead event(s)")?;
        }
    }
    Ok(())
}

/// One outbox's dead events: a JSON object or a tab-separated line each.
fn list(
    outbox: &str,
    events: &[outbox_store::DeadEvent],
    json: bool,
) -> Result<(), super::OutputError> {
    for event in events {
        if json {
            say!(
                "{}",
                json!({
                    "id": event.id,
                    "event_id": event.event_id,
                    "event_type": event.event_type,
                    "room_id": event.room_id,
                    "retry_count": event.retry_count,
                    "last_error": event.last_error,
                    "created_at": event.created_at.to_rfc3339(),
                    "outbox": outbox,
                })
            )?;
        } else {
            say!(
                "{}\t{}\t{}\t{}\t{}\t{outbox}",
                event.event_id,
                event.room_id,
                event.event_type,
                event.retry_count,
                event.last_error.as_deref().unwrap_or("")
            )?;
        }
    }
    Ok(())
}
