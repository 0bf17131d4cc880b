//! `outbox-relay purge --older-than D [--dead] [--dry-run] [--json]`.

use crate::cli::PurgeArgs;
use crate::settings::Config;
use crate::startup::open_selected;
use anyhow::Context as _;
use chrono::{DateTime, Utc};
use outbox_core::{OutboxStore, PurgeTarget};
use outbox_pipeline::janitor::{expiry_bound, PURGE_BATCH, PURGE_PAUSE};
use outbox_store::SeaOrmStore;
use serde_json::{json, Map, Value};
use tracing::info;

/// Deletes published rows (and with `--dead`, dead rows) older than `--older-than`, in
/// the Janitor's batches, and prints how many; with `--dry-run`, counts them instead.
pub async fn purge(config: Config, args: PurgeArgs) -> anyhow::Result<()> {
    let outboxes = open_selected(&config, args.outbox.as_deref(), false).await?;
    let several = outboxes.len() > 1;
    let age = humantime::format_duration(args.older_than);
    let mut targets = vec![(PurgeTarget::Published, "published", "confirmed")];
    if args.dead {
        targets.push((PurgeTarget::Dead, "dead", "created"));
    }
    let verb = if args.dry_run {
        "would purge"
    } else {
        "purged"
    };
    let Some(older_than) = expiry_bound(Utc::now(), args.older_than) else {
        if args.json {
            let counts: Vec<_> = targets.iter().map(|(_, status, _)| (*status, 0)).collect();
            let each = outboxes
                .iter()
                .map(|outbox| (outbox.config.name.clone(), counts.clone()))
                .collect::<Vec<_>>();
            say!("{}", as_json(args.dry_run, None, &each))?;
        } else {
            say!("{verb} 0 published rows older than {age}: nothing is that old")?;
        }
        return Ok(());
    };
    let who = super::operator();
    let mut each = Vec::with_capacity(outboxes.len());
    for outbox in &outboxes {
        let name = &outbox.config.name;
        // Named on each line only when there are several.
        let which = if several {
            format!(" (outbox {name})")
        } else {
            String::new()
        };
        let mut counts = Vec::with_capacity(targets.len());
        for (target, status, when) in &targets {
            let rows = if args.dry_run {
                outbox
                    .store
                    .count_purgeable(*target, older_than)
                    .await
                    .with_context(|| format!("outbox {name}: counting {status} rows failed"))?
            } else {
                let deleted = purge_all(&outbox.store, *target, older_than)
                    .await
                    .with_context(|| format!("outbox {name}: deleting {status} rows failed"))?;
                info!(outbox = %name, deleted, status, older_than = %older_than.to_rfc3339(), by = %who, "rows purged");
                deleted
            };
            if !args.json {
                say!("{verb} {rows} {status} row(s) {when} more than {age} ago{which}")?;
            }
            counts.push((*status, rows));
        }
        each.push((name.clone(), counts));
    }
    if args.json {
        say!("{}", as_json(args.dry_run, Some(older_than), &each))?;
    }
    Ok(())
}

/// Rows per status (`published`, and `dead` with `--dead`) of each outbox, by name.
type Counts = Vec<(String, Vec<(&'static str, u64)>)>;

/// `--json`: `dry_run`, `older_than` (the bound; null when nothing can be that old), the
/// totals per status, and `outboxes` with each outbox's counts by name.
fn as_json(dry_run: bool, older_than: Option<DateTime<Utc>>, each: &Counts) -> Value {
    let mut top = Map::new();
    top.insert("dry_run".into(), dry_run.into());
    top.insert(
        "older_than".into(),
        older_than.map(|bound| bound.to_rfc3339()).into(),
    );
    let mut outboxes = Map::new();
    for (name, counts) in each {
        let mut one = Map::new();
        for (status, rows) in counts {
            one.insert((*status).into(), (*rows).into());
            let total = top.entry(*status).or_insert_with(|| json!(0));
            *total = json!(total.as_u64().unwrap_or(0) + rows);
        }
        outboxes.insert(name.clone(), Value::Object(one));
    }
    top.insert("outboxes".into(), Value::Object(outboxes));
    Value::Object(top)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_the_totals_and_each_outbox() {
        let bound = DateTime::parse_from_rfc3339("2026-01-02T03:04:05Z")
            .unwrap()
            .with_timezone(&Utc);
        let each = vec![
            ("a".to_owned(), vec![("published", 3), ("dead", 1)]),
            ("b".to_owned(), vec![("published", 4), ("dead", 0)]),
        ];
        let value = as_json(true, Some(bound), &each);
        assert_eq!(value["dry_run"], true);
        assert_eq!(value["older_than"], "2026-01-02T03:04:05+00:00");
        assert_eq!(value["published"], 7);
        assert_eq!(value["dead"], 1);
        assert_eq!(value["outboxes"]["b"]["published"], 4);
        assert_eq!(value["outboxes"]["a"]["dead"], 1);

        let value = as_json(
            false,
            None,
            &[("a".to_owned(), vec![("published", 0)])].to_vec(),
        );
        assert_eq!(value["dry_run"], false);
        assert!(value["older_than"].is_null());
        assert_eq!(value["published"], 0);
        assert!(value.get("dead").is_none(), "dead only with --dead");
    }
}
