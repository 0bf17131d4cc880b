//! `outbox-relay status`.

use crate::settings::Config;
use crate::startup::open_store;
use outbox_core::OutboxStore;
use serde_json::json;

/// Prints counts by status, the oldest pending age, claimed rows per node and expired leases.
pub async fn status(config: Config, as_json: bool) -> anyhow::Result<()> {
    let store = open_store(&config, false).await?;
    let stats = store.stats().await?;
    if as_json {
        println!(
            "{}",
            json!({
                "table": config.database.table.as_str(),
                "pending": stats.pending,
                "published": stats.published,
                "dead": stats.dead,
                "oldest_pending_age_seconds": stats.oldest_pending_age_seconds,
                "claimed": stats.claimed,
                "expired_leases": stats.expired_leases,
            })
        );
        return Ok(());
    }
    println!("table            {}", config.database.table);
    println!("pending          {}", stats.pending);
    println!("published        {}", stats.published);
    println!("dead             {}", stats.dead);
    match stats.oldest_pending_age_seconds {
        Some(age) => println!("oldest pending   {age:.1} s"),
        None => println!("oldest pending   -"),
    }
    println!("expired leases   {}", stats.expired_leases);
    if stats.claimed.is_empty() {
        println!("claimed          none");
    }
    for (node, rows) in &stats.claimed {
        println!("claimed by       {node}: {rows}");
    }
    Ok(())
}
