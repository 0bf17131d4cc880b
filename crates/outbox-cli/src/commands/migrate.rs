//! `outbox-relay migrate`.

use crate::settings::Config;
use anyhow::Context as _;

/// Creates or upgrades the outbox table and its indexes.
pub async fn migrate(config: Config) -> anyhow::Result<()> {
    let database = &config.database;
    let db = outbox_store::connect(&database.url, 1)
        .await
        .with_context(|| {
            format!(
                "cannot connect to the database at {}",
                database.redacted_url
            )
        })?;
    let applied = outbox_store::migrate(&db, &database.table)
        .await
        .with_context(|| format!("cannot migrate table {}", database.table))?;
    if applied.is_empty() {
        println!("table {} is up to date", database.table);
    }
    for name in applied {
        println!("applied {name} to table {}", database.table);
    }
    Ok(())
}
