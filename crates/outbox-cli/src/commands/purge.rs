//! `outbox-relay purge --older-than D [--dead]`.

use crate::cli::PurgeArgs;
use crate::settings::Config;
use crate::startup::open_selected;
use anyhow::Context as _;
use chrono::Utc;
use outbox_core::{OutboxStore, PurgeTarget};
use outbox_relay::janitor::{expiry_bound, PURGE_BATCH, PURGE_PAUSE};
use outbox_store::SeaOrmStore;
use tracing::info;

/// Deletes published rows (and with `--dead`, dead rows) older than `--older-than`, in
/// the Janitor's batches, and prints how many.
pub async fn purge(config: Config, args: PurgeArgs) -> anyhow::Result<()> {
    let outboxes = open_selected(&config, args.outbox.as_deref(), false).await?;
    let several = outboxes.len() > 1;
    let age = humantime::format_duration(args.older_than);
    let Some(older_than) = expiry_bound(Utc::now(), args.older_than) else {
        println!("purged 0 published rows older than {age}: nothing is that old");
        return Ok(());
    };
    let mut targets = vec![(PurgeTarget::Published, "published", "confirmed")];
    if args.dead {
        targets.push((PurgeTarget::Dead, "dead", "created"));
    }
    let who = super::operator();
    for outbox in &outboxes {
        let name = &outbox.config.name;
        // Named on each line only when there are several.
        let which = if several {
            format!(" (outbox {name})")
        } else {
            String::new()
        };
        for (target, status, when) in &targets {
            let deleted = purge_all(&outbox.store, *target, older_than)
                .await
                .with_context(|| format!("outbox {name}: deleting {status} rows failed"))?;
            info!(outbox = %name, deleted, status, older_than = %older_than.to_rfc3339(), by = %who, "rows purged");
            println!("purged {deleted} {status} row(s) {when} more than {age} ago{which}");
        }
    }
    Ok(())
}

/// Batch after batch until one comes back short, pausing between them like the Janitor.
async fn purge_all(
    store: &SeaOrmStore,
    target: PurgeTarget,
    older_than: chrono::DateTime<Utc>,
) -> anyhow::Result<u64> {
    let mut total = 0;
    loop {
        let deleted = store.purge(target, older_than, PURGE_BATCH).await?;
        total += deleted;
        if deleted < PURGE_BATCH as u64 {
            return Ok(total);
        }
        tokio::time::sleep(PURGE_PAUSE).await;
    }
}
