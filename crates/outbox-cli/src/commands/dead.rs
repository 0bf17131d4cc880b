//! `outbox-relay dead list` and `dead requeue`.

use crate::cli::DeadCommand;
use crate::settings::Config;
use crate::startup::open_store;
use outbox_store::{DeadFilter, Requeue};
use serde_json::json;
use tracing::info;

/// Lists or requeues dead events.
pub async fn dead(config: Config, command: DeadCommand) -> anyhow::Result<()> {
    let store = open_store(&config, false).await?;
    match command {
        DeadCommand::List {
            json,
            limit,
            room,
            event_type,
        } => {
            let filter = DeadFilter { room, event_type };
            let events = store.dead_events(&filter, limit).await?;
            for event in &events {
                if json {
                    println!(
                        "{}",
                        json!({
                            "id": event.id,
                            "event_id": event.event_id,
                            "event_type": event.event_type,
                            "room_id": event.room_id,
                            "retry_count": event.retry_count,
                            "last_error": event.last_error,
                            "created_at": event.created_at.to_rfc3339(),
                        })
                    );
                } else {
                    println!(
                        "{}\t{}\t{}\t{}\t{}",
                        event.event_id,
                        event.room_id,
                        event.event_type,
                        event.retry_count,
                        event.last_error.as_deref().unwrap_or("")
                    );
                }
            }
            if !json && events.is_empty() {
                println!("no dead events");
            }
        }
        DeadCommand::Requeue {
            event_ids,
            room,
            all,
        } => {
            let which = if all {
                Requeue::All
            } else if let Some(room) = room {
                Requeue::Room(room)
            } else {
                Requeue::EventIds(event_ids)
            };
            let requeued = store.requeue_dead(&which).await?;
            let who = super::operator();
            info!(requeued, by = %who, selection = ?which, "dead events requeued");
            println!("requeued {requeued} dead event(s)");
        }
    }
    Ok(())
}
