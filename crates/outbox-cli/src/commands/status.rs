//! `outbox-relay status [--json] [--outbox NAME]`.

use crate::cli::StatusArgs;
use crate::settings::Config;
use crate::startup::open_selected;
use outbox_core::{OutboxStats, OutboxStore};
use serde_json::{json, Map, Value};

/// Prints counts by status, the oldest pending age, claimed rows per node and expired
/// leases, per outbox.
pub async fn status(config: Config, args: StatusArgs) -> anyhow::Result<()> {
    let outboxes = open_selected(&config, args.outbox.as_deref(), false).await?;
    let mut all = Vec::with_capacity(outboxes.len());
    for outbox in &outboxes {
        all.push((&outbox.config, outbox.store.stats().await?));
    }
    if args.json {
        println!("{}", as_json(&all));
        return Ok(());
    }
    for (index, (outbox, stats)) in all.iter().enumerate() {
        if index > 0 {
            println!();
        }
        println!("outbox           {}", outbox.name);
        println!("table            {}", outbox.table);
        print_stats(stats);
    }
    Ok(())
}

fn print_stats(stats: &OutboxStats) {
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
}

/// One outbox: today's object plus `outbox`. Several: the totals at top level (the oldest
/// age is the largest, claims merged by node) and `outboxes` by name.
fn as_json(all: &[(&crate::settings::OutboxConfig, OutboxStats)]) -> Value {
    let one = |outbox: &crate::settings::OutboxConfig, stats: &OutboxStats| {
        json!({
            "outbox": outbox.name,
            "table": outbox.table.as_str(),
            "pending": stats.pending,
            "published": stats.published,
            "dead": stats.dead,
            "oldest_pending_age_seconds": stats.oldest_pending_age_seconds,
            "claimed": stats.claimed,
            "expired_leases": stats.expired_leases,
        })
    };
    if let [(outbox, stats)] = all {
        return one(outbox, stats);
    }
    let mut total = OutboxStats::default();
    let mut each = Map::new();
    for (outbox, stats) in all {
        total.pending += stats.pending;
        total.published += stats.published;
        total.dead += stats.dead;
        total.expired_leases += stats.expired_leases;
        total.oldest_pending_age_seconds = match (
            total.oldest_pending_age_seconds,
            stats.oldest_pending_age_seconds,
        ) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        for (node, rows) in &stats.claimed {
            *total.claimed.entry(node.clone()).or_default() += rows;
        }
        each.insert(outbox.name.clone(), one(outbox, stats));
    }
    json!({
        "pending": total.pending,
        "published": total.published,
        "dead": total.dead,
        "oldest_pending_age_seconds": total.oldest_pending_age_seconds,
        "claimed": total.claimed,
        "expired_leases": total.expired_leases,
        "outboxes": each,
    })
}
