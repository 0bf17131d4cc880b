//! `outbox-relay check-config`.

use crate::settings::{Config, OutboxConfig};
use crate::startup::{check_columns, open_unchecked, ConfigProblem};

/// Prints the effective settings (passwords redacted) as TOML, then each outbox with its
/// blanks filled in, as comments; then checks each outbox's mapping against its table
/// where the database answers ([`check_tables`]).
pub async fn check_config(config: &Config) -> anyhow::Result<()> {
    say!("# configuration is valid; effective settings (secrets redacted):")?;
    for warning in &config.warnings {
        say!("# warning: {warning}")?;
    }
    // The TOML ends its last line; the blank line sets the outboxes apart.
    say!("{}", toml::to_string(&config.effective)?)?;
    say!("# effective outboxes ({}):", config.outboxes.len())?;
    for outbox in &config.outboxes {
        for line in describe(outbox) {
            say!("#   {line}")?;
        }
    }
    check_tables(config).await
}

/// Connects to each outbox's database and checks its mapping: a mapping problem is a
/// [`ConfigProblem`] (exit 2, naming the outbox, the setting and the column); a missing
/// table is a note when `database.migrate_on_start` is on (migrate creates it), else a
/// warning; a database that cannot be reached is a warning, not a failure (it may be
/// reachable only from where the relay runs). A SQLite file that does not exist yet is
/// not created.
pub async fn check_tables(config: &Config) -> anyhow::Result<()> {
    let mut problems = Vec::new();
    for outbox in &config.outboxes {
        let name = &outbox.name;
        if sqlite_file_missing(&outbox.database_url) {
            say!(
                "# note: outbox {name}: database file of {} does not exist yet; not checked",
                outbox.redacted_database_url
            )?;
            continue;
        }
        let mut opened = match open_unchecked(config, Some(name)).await {
            Ok(opened) => opened,
            Err(error) => {
                say!("# warning: outbox {name}: database not checked: {error:#}")?;
                continue;
            }
        };
        let store = &mut opened[0].store;
        match check_columns(name, store).await {
            Ok(()) => say!("# outbox {name}: table {} fits the mapping", outbox.table)?,
            Err(error) if error.downcast_ref::<ConfigProblem>().is_some() => {
                problems.push(error.to_string())
            }
            Err(error) => {
                let migrating = config.database.migrate_on_start;
                match (error.downcast_ref::<outbox_store::Error>(), migrating) {
                    (Some(outbox_store::Error::NoTable(_)), true) => say!(
                        "# note: outbox {name}: table {} does not exist yet; `run` creates it \
                         (database.migrate_on_start)",
                        outbox.table
                    )?,
                    (Some(outbox_store::Error::NoTable(_)), false) => say!(
                        "# warning: outbox {name}: table {} does not exist; run `outbox-relay \
                         migrate` before `run` (database.migrate_on_start is off)",
                        outbox.table
                    )?,
                    (Some(outbox_store::Error::NotMigrated { missing, .. }), true) => say!(
                        "# note: outbox {name}: table {} lacks the relay's columns {}; `run` \
                         adds them (database.migrate_on_start; `migrate --dry-run` shows how)",
                        outbox.table,
                        missing.join(", ")
                    )?,
                    (Some(store_error), _) => say!("# warning: outbox {name}: {store_error}")?,
                    (None, _) => say!("# warning: outbox {name}: table not checked: {error:#}")?,
                }
            }
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(ConfigProblem(problems.join("\n")).into())
}

/// A `sqlite:` URL whose file does not exist (connecting would create it).
fn sqlite_file_missing(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("sqlite:") else {
        return false;
    };
    let path = rest.trim_start_matches("//");
    let path = path.split('?').next().unwrap_or_default();
    !path.is_empty() && !path.contains(":memory:") && !std::path::Path::new(path).exists()
}

/// One outbox as `check-config` shows it: a few lines, the URL redacted.
pub fn describe(outbox: &OutboxConfig) -> Vec<String> {
    let columns = &outbox.columns;
    let routing = &outbox.routing;
    vec![
        format!(
            "outbox {}: table {} on {}",
            outbox.name, outbox.table, outbox.redacted_database_url
        ),
        format!(
            "  columns: position={} event_id={} event_type={} key={} payload={} headers={} created_at={}",
            columns.position,
            columns.event_id,
            columns.event_type,
            columns.key,
            columns.payload,
            columns.headers.as_ref().map_or("(none)", |c| c.as_str()),
            columns.created_at,
        ),
        format!(
            "  exchange {} ({}), {} route(s), key header {}",
            routing.router.exchange,
            routing.exchange_type,
            routing.router.routes.len(),
            routing.key_header,
        ),
        format!(
            "  ordering {}, publishers {}",
            outbox.ordering, outbox.publishers
        ),
    ]
}
