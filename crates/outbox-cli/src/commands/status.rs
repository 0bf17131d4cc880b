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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Settings;

    fn two_outboxes() -> crate::settings::Config {
        let mut settings = Settings::default();
        for table in ["a_outbox", "b_outbox"] {
            settings.outboxes.push(crate::settings::OutboxSettings {
                table: table.into(),
                ..Default::default()
            });
        }
        settings.validate().expect("valid")
    }

    fn stats(pending: u64, oldest: Option<f64>, claimed: &[(&str, u64)]) -> OutboxStats {
        OutboxStats {
            pending,
            published: 10,
            dead: 1,
            oldest_pending_age_seconds: oldest,
            claimed: claimed.iter().map(|(n, r)| (n.to_string(), *r)).collect(),
            expired_leases: 2,
        }
    }

    #[test]
    fn one_outbox_prints_the_one_object_with_its_name() {
        let config = two_outboxes();
        let value = as_json(&[(&config.outboxes[0], stats(3, Some(1.5), &[("n1", 3)]))]);
        assert_eq!(value["outbox"], "a_outbox");
        assert_eq!(value["table"], "a_outbox");
        assert_eq!(value["pending"], 3);
        assert_eq!(value["claimed"]["n1"], 3);
        assert!(value.get("outboxes").is_none());
    }

    #[test]
    fn several_outboxes_print_totals_and_each_by_name() {
        let config = two_outboxes();
        let value = as_json(&[
            (&config.outboxes[0], stats(3, Some(1.5), &[("n1", 3)])),
            (
                &config.outboxes[1],
                stats(4, Some(9.0), &[("n1", 1), ("n2", 2)]),
            ),
        ]);
        assert_eq!(value["pending"], 7);
        assert_eq!(value["published"], 20);
        assert_eq!(value["dead"], 2);
        assert_eq!(value["expired_leases"], 4);
        assert_eq!(
            value["oldest_pending_age_seconds"], 9.0,
            "the oldest of all"
        );
        assert_eq!(value["claimed"]["n1"], 4, "claims merged by node");
        assert_eq!(value["claimed"]["n2"], 2);
        assert_eq!(value["outboxes"]["b_outbox"]["pending"], 4);
        assert_eq!(value["outboxes"]["a_outbox"]["outbox"], "a_outbox");
    }
}
