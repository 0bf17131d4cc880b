//! `outbox-relay migrate [--dry-run] [--outbox NAME] [--wait DURATION]`.

use crate::cli::MigrateArgs;
use crate::dependency::{Dependency, Patience, Wait};
use crate::settings::Config;
use crate::startup::{check_columns, migrate_table, open_unchecked};
use anyhow::Context as _;

/// Creates or upgrades each selected outbox's table and its indexes (on PostgreSQL with
/// `database.notify`, enables its insert trigger), then checks its mapping; with
/// `--dry-run`, prints what it would do and changes nothing. Waits up to `--wait` for a
/// database that cannot be reached yet (as an init container must, started beside the
/// database).
pub async fn migrate(config: Config, args: MigrateArgs) -> anyhow::Result<()> {
    let patience = match args.wait {
        wait if wait.is_zero() => Patience::None,
        wait => Patience::from_now(Some(wait), "migrate --wait"),
    };
    let outboxes = Wait {
        dependency: Dependency::Database,
        url: &config.redacted_database_urls(args.outbox.as_deref()),
        backoff: outbox_pipeline::fetcher::CLAIM_BACKOFF,
        patience,
    }
    .until_up(|| open_unchecked(&config, args.outbox.as_deref()))
    .await?;
    for mut outbox in outboxes {
        let (name, table) = (&outbox.config.name, &outbox.config.table);
        if args.dry_run {
            let store = &outbox.store;
            let planning = || format!("outbox {name}: cannot plan the migration of {table}");
            let mut steps = outbox_store::plan(store.connection(), store.table(), store.columns())
                .await
                .with_context(planning)?;
            if config.database.notify {
                let enable =
                    outbox_store::plan_enable_notify(store.connection(), store.table(), &steps)
                        .await
                        .with_context(planning)?;
                steps.extend(enable);
            }
            if steps.is_empty() {
                say!("outbox {name}: table {table} is up to date; nothing to do")?;
            } else {
                say!(
                    "outbox {name}: table {table}: {} step(s) would run:",
                    steps.len()
                )?;
            }
            for step in steps {
                say!("-- {}", step.name)?;
                say!("-- locks: {}", step.locks)?;
                for statement in step.statements {
                    say!("{};", statement.trim_end().trim_end_matches(';'))?;
                }
            }
            continue;
        }
        let applied = migrate_table(&outbox.store, config.database.notify)
            .await
            .with_context(|| format!("outbox {name}"))?;
        if applied.is_empty() {
            say!("table {table} is up to date")?;
        }
        for migration in applied {
            say!("applied {migration} to table {table}")?;
        }
        let name = name.clone();
        check_columns(&name, &mut outbox.store).await?;
    }
    Ok(())
}
