//! `outbox-relay check-config [--offline]`.

use crate::cli::CheckConfigArgs;
use crate::dependency::{classify, Verdict};
use crate::settings::{Config, OutboxConfig};
use crate::startup::{check_columns, check_privileges, ConfigProblem, OpenOutbox};
use outbox_amqp::preflight::{check_broker, ExchangeState};
use outbox_amqp::AmqpError;
use outbox_store::SeaOrmStore;

/// Prints the effective settings (passwords redacted) as TOML, then each outbox with its
/// blanks filled in, as comments; then, unless `--offline`, asks each database
/// ([`check_tables`]) and each broker ([`check_brokers`]) what `run` would. Every refusal
/// found is reported together, as one [`ConfigProblem`] (exit code 2).
pub async fn check_config(config: &Config, args: CheckConfigArgs) -> anyhow::Result<()> {
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
    if args.offline {
        say!("# --offline: no database or broker contacted")?;
        return Ok(());
    }
    let mut problems = check_tables(config).await?;
    problems.extend(check_brokers(config).await?);
    if problems.is_empty() {
        return Ok(());
    }
    Err(ConfigProblem(problems.join("\n")).into())
}

/// The setting that gives outbox `index` its database: `database.url`, or its own
/// `outboxes[i].database_url`.
fn url_setting(config: &Config, index: usize) -> String {
    match config.outboxes[index].database_url == config.database.url {
        true => "database.url".into(),
        false => format!("outboxes[{index}].database_url"),
    }
}

/// Connects to each outbox's database and checks, as `run` would, the role's privileges
/// and the mapping; returns the refusals (each naming the outbox, the setting and the
/// reason). A database that cannot be reached is a warning, not a refusal (it may be
/// reachable only from where the relay runs, or not up yet); a missing table is a note
/// when `database.migrate_on_start` is on (`run` creates it), else a warning. A URL that
/// lists several hosts has each of them asked and named ([`check_hosts`]). A SQLite file
/// that does not exist yet is not created.
pub async fn check_tables(config: &Config) -> anyhow::Result<Vec<String>> {
    let mut problems = Vec::new();
    for (index, outbox) in config.outboxes.iter().enumerate() {
        let name = &outbox.name;
        let setting = url_setting(config, index);
        let url = &outbox.redacted_database_url;
        if sqlite_file_missing(&outbox.database_url) {
            say!("# note: outbox {name}: database file of {url} does not exist yet; not checked")?;
            continue;
        }
        check_hosts(name, &setting, &outbox.database_url).await?;
        let db = match outbox_store::connect(&outbox.database_url, 1).await {
            Ok(db) => db,
            Err(error) => {
                let error = anyhow::Error::new(error);
                match classify(&error) {
                    Verdict::Refused => problems.push(format!(
                        "outbox {name}: {setting} ({url}): the database refuses: {error:#}"
                    )),
                    _ => say!(
                        "# warning: outbox {name}: {setting} ({url}) cannot be reached: \
                         {error:#}; not checked"
                    )?,
                }
                continue;
            }
        };
        let mut opened = OpenOutbox {
            config: outbox.clone(),
            store: SeaOrmStore::new(db, outbox.table.clone())
                .with_columns(outbox.columns.clone())
                .with_published_rows(outbox.published_rows),
        };
        let checked = check_table(config, &mut opened, &mut problems).await;
        let _ = opened.store.connection().clone().close().await;
        checked?;
    }
    Ok(problems)
}

/// A URL naming several hosts: what each answered, as `run` asks them (the first that
/// takes writes is used, the others passed over), so that a host that cannot be reached
/// is named before a failover needs it. Nothing for a URL of one host.
async fn check_hosts(name: &str, setting: &str, url: &str) -> anyhow::Result<()> {
    use outbox_store::hosts::HostProblem;
    for answer in outbox_store::hosts::check_each(url).await {
        let host = &answer.host;
        match &answer.problem {
            None => say!("# outbox {name}: {setting} host {host} takes writes")?,
            Some(HostProblem::ReadOnly(why)) => say!(
                "# note: outbox {name}: {setting} host {host} takes no writes ({why}); `run` \
                 passes it over until a failover makes it writable"
            )?,
            Some(HostProblem::Unusable(why)) => say!(
                "# warning: outbox {name}: {setting} host {host} cannot be used: {why}; `run` \
                 passes it over"
            )?,
        }
    }
    Ok(())
}

/// One outbox's table on its open database: privileges first (a role that may not read
/// the table would see none of its columns), then the mapping.
async fn check_table(
    config: &Config,
    outbox: &mut OpenOutbox,
    problems: &mut Vec<String>,
) -> anyhow::Result<()> {
    let name = outbox.config.name.clone();
    let table = &outbox.config.table;
    match check_privileges(config, outbox).await {
        Ok(()) => {}
        Err(error) if error.is::<ConfigProblem>() => {
            problems.push(error.to_string());
            return Ok(());
        }
        Err(error) => say!("# warning: outbox {name}: privileges not checked: {error:#}")?,
    }
    let error = match check_columns(&name, &mut outbox.store).await {
        Ok(()) => {
            say!("# outbox {name}: table {table} fits the mapping and the role's privileges")?;
            return Ok(());
        }
        Err(error) if error.is::<ConfigProblem>() => {
            problems.push(error.to_string());
            return Ok(());
        }
        Err(error) => error,
    };
    let migrating = config.database.migrate_on_start;
    match (error.downcast_ref::<outbox_store::Error>(), migrating) {
        (Some(outbox_store::Error::NoTable(_)), true) => say!(
            "# note: outbox {name}: table {table} does not exist yet; `run` creates it \
             (database.migrate_on_start)"
        )?,
        (Some(outbox_store::Error::NoTable(_)), false) => say!(
            "# warning: outbox {name}: table {table} does not exist (or the role may not see \
             it); run `outbox-relay migrate` before `run` (database.migrate_on_start is off)"
        )?,
        (Some(outbox_store::Error::NotMigrated { missing, .. }), true) => say!(
            "# note: outbox {name}: table {table} lacks the relay's columns {}; `run` adds \
             them (database.migrate_on_start; `migrate --dry-run` shows how)",
            missing.join(", ")
        )?,
        (Some(store_error), _) => say!("# warning: outbox {name}: {store_error}")?,
        (None, _) => say!("# warning: outbox {name}: table not checked: {error:#}")?,
    }
    Ok(())
}

/// Connects to each broker of `amqp.url` as `run` would and checks the exchanges the
/// routes name ([`check_broker`]), creating nothing; returns the refusals (the login, the
/// vhost, an exchange of another type), each naming the entry. A broker that cannot be
/// reached is a warning.
pub async fn check_brokers(config: &Config) -> anyhow::Result<Vec<String>> {
    let amqp = &config.amqp;
    let mut problems = Vec::new();
    for index in 0..amqp.brokers.len() {
        let entry = outbox_amqp::broker::entry(amqp, index);
        let exchanges = match check_broker(amqp, index).await {
            Ok(exchanges) => exchanges,
            Err(error) => {
                // A connect error names the entry itself; a declaration's does not.
                let text = match &error {
                    AmqpError::Declare { .. } => format!("{entry}: {error}"),
                    _ => error.to_string(),
                };
                match classify(&anyhow::Error::new(error)) {
                    Verdict::Refused => problems.push(text),
                    _ => say!("# warning: {text}; not checked")?,
                }
                continue;
            }
        };
        say!("# broker {entry}: login and vhost accepted")?;
        for checked in exchanges {
            let (exchange, kind) = (&checked.exchange, &checked.kind);
            match checked.state {
                ExchangeState::Fits => say!("#   exchange {exchange:?} ({kind}) fits")?,
                // A typo in amqp.exchange is the usual reason: said plainly, since the
                // exchange `run` creates has no queue bound and every event comes back
                // unroutable.
                ExchangeState::Declared => say!(
                    "# warning: exchange {exchange:?} does not exist yet: `run` will create \
                     it ({kind}, amqp.declare_exchange), with no queue bound, so its events \
                     come back unroutable until one is; if it should exist, check \
                     amqp.exchange for a typo"
                )?,
                ExchangeState::Missing => say!(
                    "# warning: exchange {exchange:?} does not exist and \
                     amqp.declare_exchange is off: events routed to it fail until it is \
                     created"
                )?,
            }
        }
    }
    Ok(problems)
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
