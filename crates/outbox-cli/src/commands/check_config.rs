//! `outbox-relay check-config`.

use crate::settings::{Config, OutboxConfig};

/// Prints the effective settings (passwords redacted) as TOML, then each outbox with its
/// blanks filled in, as comments.
pub fn check_config(config: &Config) -> anyhow::Result<()> {
    println!("# configuration is valid; effective settings (secrets redacted):");
    for warning in &config.warnings {
        println!("# warning: {warning}");
    }
    print!("{}", toml::to_string(&config.effective)?);
    println!();
    println!("# effective outboxes ({}):", config.outboxes.len());
    for outbox in &config.outboxes {
        for line in describe(outbox) {
            println!("#   {line}");
        }
    }
    Ok(())
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
