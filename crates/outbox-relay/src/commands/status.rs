//! `outbox-relay status [--json] [--outbox NAME]`.

use crate::cli::StatusArgs;
use crate::settings::Config;
use crate::startup::open_selected;
use outbox_core::{OutboxStats, OutboxStore};
use serde_json::{json, Map, Value};

/// Prints counts by status, the oldest pending age, claimed rows per node, expired leases,
/// the pending rows' most frequent failures and the oldest failing event, and the table's
/// size, per outbox, and a hint when published rows pile up without
/// `relay.retention`.
pub async fn status(config: Config, args: StatusArgs) -> anyhow::Result<()> {
    let outboxes = open_selected(&config, args.outbox.as_deref(), false).await?;
    let mut all = Vec::with_capacity(outboxes.len());
    for outbox in &outboxes {
        all.push((&outbox.config, outbox.store.stats().await?));
    }
    if args.json {
        say!("{}", as_json(&all))?;
        return Ok(());
    }
    for (index, (outbox, stats)) in all.iter().enumerate() {
        if index > 0 {
            say!()?;
        }
        say!("outbox           {}", outbox.name)?;
        say!("table            {}", outbox.table)?;
        print_stats(stats)?;
        if let Some(hint) = retention_hint(stats, config.relay.retention.is_some()) {
            say!("hint             {hint}")?;
        }
        if stats.autovacuum == Some(false) {
            say!("hint             {AUTOVACUUM_OFF}")?;
        }
    }
    Ok(())
}

fn print_stats(stats: &OutboxStats) -> Result<(), super::OutputError> {
    say!("pending          {}", stats.pending)?;
    match stats.published_estimated {
        true => say!("published        {} (estimate)", stats.published)?,
        false => say!("published        {}", stats.published)?,
    }
    say!("dead             {}", stats.dead)?;
    match stats.oldest_pending_age_seconds {
        Some(age) => say!("oldest pending   {age:.1} s")?,
        None => say!("oldest pending   -")?,
    }
    say!("expired leases   {}", stats.expired_leases)?;
    if stats.claimed.is_empty() {
        say!("claimed          none")?;
    }
    for (node, rows) in &stats.claimed {
        say!("claimed by       {node}: {rows}")?;
    }
    // Why the backlog does not move: the pending rows' most frequent failures.
    for (error, count) in &stats.failing {
        say!("failing          {count} × {error}")?;
    }
    if let Some(event) = &stats.oldest_failing {
        let age = (chrono::Utc::now() - event.created_at).num_milliseconds() as f64 / 1000.0;
        say!(
            "oldest failing   {} (key {}, {:.1} s old, {} attempts counted): {}",
            event.event_id,
            event.key,
            age.max(0.0),
            event.retry_count,
            event.last_error
        )?;
    }
    match stats.size {
        Some(size) => say!(
            "table size       {} ({} bytes, {})",
            human_bytes(size.bytes),
            size.bytes,
            size.method
        )?,
        None => say!("table size       -")?,
    }
    Ok(())
}

/// `status`'s hint, and the relay's warning at start, when autovacuum does not look after
/// the table.
pub const AUTOVACUUM_OFF: &str = "autovacuum is off for this table: the dead versions of \
marked rows and their index entries are never removed, so the table grows and every \
claim from the oldest pending row reads more; turn it on, see \
docs/operations/autovacuum.md#autovacuum-off";

/// Published rows at least this many, and this share of the table, without retention: worth
/// a hint (docs/operations/retention.md#what-history-costs gives the throughput they cost).
const HINT_MIN_PUBLISHED: u64 = 100_000;
const HINT_MIN_SHARE: f64 = 0.9;

/// "5,000,000 published rows kept (4.6 GB); set relay.retention …" when published rows make
/// up most of a large table and nothing deletes them.
fn retention_hint(stats: &OutboxStats, retention_on: bool) -> Option<String> {
    let rows = stats.published + stats.pending + stats.dead;
    let dominate = stats.published as f64 >= HINT_MIN_SHARE * rows as f64;
    if retention_on || stats.published < HINT_MIN_PUBLISHED || !dominate {
        return None;
    }
    let size = match stats.size {
        Some(size) => format!(" ({})", human_bytes(size.bytes)),
        None => String::new(),
    };
    Some(format!(
        "{}{} published rows kept{size}; set relay.retention to delete them, see docs/operations/retention.md",
        if stats.published_estimated { "~" } else { "" },
        thousands(stats.published)
    ))
}

/// `5000000` as `5,000,000`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// Decimal units, one decimal: `4.6 GB`.
fn human_bytes(bytes: u64) -> String {
    let units = ["bytes", "kB", "MB", "GB", "TB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < units.len() {
        value /= 1000.0;
        unit += 1;
    }
    match unit {
        0 => format!("{bytes} bytes"),
        _ => format!("{value:.1} {}", units[unit]),
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
            "published_estimated": stats.published_estimated,
            "table_bytes": stats.size.map(|size| size.bytes),
            "table_bytes_method": stats.size.map(|size| size.method),
            "autovacuum": stats.autovacuum,
            "failing": stats.failing.iter().map(|(error, count)| json!({"error": error, "count": count})).collect::<Vec<_>>(),
            "oldest_failing": stats.oldest_failing.as_ref().map(|event| json!({
                "event_id": event.event_id,
                "key": event.key,
                "retry_count": event.retry_count,
                "last_error": event.last_error,
                "created_at": event.created_at.to_rfc3339(),
            })),
        })
    };
    if let [(outbox, stats)] = all {
        return one(outbox, stats);
    }
    let mut total = OutboxStats::default();
    let mut each = Map::new();
    // Tables whose size is known, summed: the same database file may hold several
    // (SQLite's page_count), so the total is an upper bound there.
    let mut table_bytes: Option<u64> = None;
    for (outbox, stats) in all {
        total.published_estimated |= stats.published_estimated;
        if let Some(size) = stats.size {
            *table_bytes.get_or_insert(0) += size.bytes;
        }
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
        "published_estimated": total.published_estimated,
        "table_bytes": table_bytes,
        "outboxes": each,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Settings;
    use outbox_core::TableSize;

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
            autovacuum: Some(true),
            published_estimated: false,
            size: Some(TableSize {
                bytes: 4_600_000_000,
                method: "pg_total_relation_size",
            }),
            failing: Vec::new(),
            oldest_failing: None,
        }
    }

    #[test]
    fn a_large_history_without_retention_gets_a_hint() {
        let mut large = stats(10, None, &[]);
        large.published = 5_000_000;
        assert_eq!(
            retention_hint(&large, false).as_deref(),
            Some("5,000,000 published rows kept (4.6 GB); set relay.retention to delete them, see docs/operations/retention.md")
        );
        assert_eq!(retention_hint(&large, true), None, "retention is on");
        large.published_estimated = true;
        assert!(retention_hint(&large, false)
            .unwrap()
            .starts_with("~5,000,000 "));
        let few = stats(10, None, &[]);
        assert_eq!(retention_hint(&few, false), None, "10 published rows");
        let mut backlog = stats(2_000_000, None, &[]);
        backlog.published = 1_000_000;
        assert_eq!(
            retention_hint(&backlog, false),
            None,
            "pending rows dominate"
        );
    }

    #[test]
    fn sizes_and_counts_read_easily() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(12_345_678), "12,345,678");
        assert_eq!(human_bytes(512), "512 bytes");
        assert_eq!(human_bytes(1_500), "1.5 kB");
        assert_eq!(human_bytes(4_600_000_000), "4.6 GB");
    }

    #[test]
    fn one_outbox_prints_the_one_object_with_its_name() {
        let config = two_outboxes();
        let value = as_json(&[(&config.outboxes[0], stats(3, Some(1.5), &[("n1", 3)]))]);
        assert_eq!(value["outbox"], "a_outbox");
        assert_eq!(value["table"], "a_outbox");
        assert_eq!(value["pending"], 3);
        assert_eq!(value["claimed"]["n1"], 3);
        assert_eq!(value["published_estimated"], false);
        assert_eq!(value["table_bytes"], 4_600_000_000u64);
        assert_eq!(value["table_bytes_method"], "pg_total_relation_size");
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
        assert_eq!(value["table_bytes"], 9_200_000_000u64, "sizes summed");
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
