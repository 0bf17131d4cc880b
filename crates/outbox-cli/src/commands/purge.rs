//! `outbox-relay purge --older-than D [--dead]`.

use crate::cli::PurgeArgs;
use crate::settings::Config;
use crate::startup::open_store;
use anyhow::Context as _;
use chrono::Utc;
use outbox_core::{OutboxStore, PurgeTarget};
use outbox_relay::janitor::{expiry_bound, PURGE_BATCH, PURGE_PAUSE};
use outbox_store::SeaOrmStore;
use tracing::info;

/// Deletes published rows (and with `--dead`, dead rows) older than `--older-than`, in
/// the Janitor's batches, and prints how many.
pub async fn purge(config: Config, args: PurgeArgs) -> anyhow::Result<()> {
    let store = open_store(&config, false).await?;
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
    for (target, status, when) in targets {
        let deleted = purge_all(&store, target, older_than)
            .await
            .with_context(|| format!("deleting {status} rows failed"))?;
        info!(deleted, status, older_than = %older_than.to_rfc3339(), by = %who, "rows purged");
        println!("purged {deleted} {status} row(s) {when} more than {age} ago");
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
