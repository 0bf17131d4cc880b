//! `outbox-relay migrate`.

use crate::settings::Config;
use crate::startup::{migrate_table, open_store};

/// Creates or upgrades the outbox table and its indexes.
pub async fn migrate(config: Config) -> anyhow::Result<()> {
    let store = open_store(&config, false).await?;
    let applied = migrate_table(&store).await?;
    let table = store.table();
    if applied.is_empty() {
        println!("table {table} is up to date");
    }
    for name in applied {
        println!("applied {name} to table {table}");
    }
    Ok(())
}
