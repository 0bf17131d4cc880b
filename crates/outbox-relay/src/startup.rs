//! Opening the stores and the broker and starting the relays: shared by `run`, `demo`, the
//! other commands and the end-to-end tests.

use crate::dependency::Verdict;
use crate::settings::{Config, OutboxConfig};
use anyhow::Context as _;
use outbox_amqp::{Broker, Routing};
use outbox_core::{EventPublisher, NodeHold, OutboxStore, PublishedRows, RelayOptions};
use outbox_pipeline::{Relay, Relays};
use outbox_store::{InsertTrigger, SeaOrmStore, WakeUps};
use std::collections::HashMap;
use std::sync::Arc;
use thiserror::Error;
use tracing::{info, warn};

/// A problem of the settings or of the command line that only shows once the databases
/// are asked (a column mapping that does not fit its table) or the outboxes are known (an
/// unknown `--outbox`): exit code 2, like a bad setting.
#[derive(Debug, Error)]
#[error("{0}")]
pub struct ConfigProblem(pub String);

/// One outbox, its store opened and its mapping checked.
#[derive(Debug, Clone)]
pub struct OpenOutbox {
    /// Its settings.
    pub config: OutboxConfig,
    /// Its table, read through its mapping.
    pub store: SeaOrmStore,
}

/// Opens every outbox for relaying ([`open_selected`] with no selector), and checks
/// first that the role has the privileges the relay needs on each table
/// ([`check_privileges`]): a missing one is a [`ConfigProblem`] naming it.
pub async fn open_outboxes(config: &Config, migrate: bool) -> anyhow::Result<Vec<OpenOutbox>> {
    open_checked(config, None, migrate, true).await
}

/// Opens the outboxes `selector` names (`--outbox`; `None`: every one): one pool per
/// distinct database URL, shared; migrates each table first when `migrate` is set; then
/// checks each mapping against its table. A mapping that does not fit, or an unknown
/// name, is a [`ConfigProblem`].
pub async fn open_selected(
    config: &Config,
    selector: Option<&str>,
    migrate: bool,
) -> anyhow::Result<Vec<OpenOutbox>> {
    open_checked(config, selector, migrate, false).await
}

async fn open_checked(
    config: &Config,
    selector: Option<&str>,
    migrate: bool,
    privileges: bool,
) -> anyhow::Result<Vec<OpenOutbox>> {
    let mut opened = open_unchecked(config, selector).await?;
    for outbox in &mut opened {
        if migrate {
            for name in migrate_table(&outbox.store, config.database.notify).await? {
                info!(outbox = %outbox.config.name, migration = name, table = %outbox.config.table, "migration applied");
            }
        }
        // Before the columns: a role that may not read the table would see none of them.
        if privileges {
            check_privileges(config, outbox).await?;
        }
        check_columns(&outbox.config.name, &mut outbox.store)
            .await
            .map_err(|error| unmigrated_hint(error, config.database.migrate_on_start))?;
    }
    Ok(opened)
}

/// A missing table's error, with the setting that would create it when it is off.
fn unmigrated_hint(error: anyhow::Error, migrate_on_start: bool) -> anyhow::Error {
    let missing = matches!(
        error.downcast_ref::<outbox_store::Error>(),
        Some(outbox_store::Error::NoTable(_) | outbox_store::Error::NotMigrated { .. })
    );
    match missing && !migrate_on_start {
        // A message of its own: the kind of error (fatal) stays the same.
        true => anyhow::anyhow!(
            "{error:#}; or set database.migrate_on_start = true for `run` to migrate it"
        ),
        false => error,
    }
}

/// Whether the role may do to the outbox's tables what `run` does
/// ([`outbox_store::missing_privileges`]; deleting only with `relay.retention` or
/// `relay.published_rows = "delete"`): each
/// privilege missing is named with its `GRANT`, as one [`ConfigProblem`].
pub async fn check_privileges(config: &Config, outbox: &OpenOutbox) -> anyhow::Result<()> {
    let name = &outbox.config.name;
    let options = outbox.config.relay_options(&config.relay);
    let deletes = options.retention.is_some() || options.published_rows == PublishedRows::Delete;
    let missing =
        outbox_store::missing_privileges(outbox.store.connection(), outbox.store.table(), deletes)
            .await
            .with_context(|| format!("outbox {name}: cannot read the role's privileges"))?;
    if missing.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = missing
        .iter()
        .map(|missing| format!("outbox {name}: {missing}"))
        .collect();
    Err(ConfigProblem(lines.join("\n")).into())
}

/// The outboxes `selector` names, connected (one pool per distinct URL) but their tables
/// neither migrated nor checked: for `migrate` and `check-config`, which check afterwards.
pub async fn open_unchecked(
    config: &Config,
    selector: Option<&str>,
) -> anyhow::Result<Vec<OpenOutbox>> {
    let selected = config.select_outboxes(selector).map_err(ConfigProblem)?;
    // A store per distinct URL, whose pool the other outboxes there share.
    let mut pools: HashMap<&str, SeaOrmStore> = HashMap::new();
    let mut opened = Vec::with_capacity(selected.len());
    for outbox in selected {
        let db = match pools.get(outbox.database_url.as_str()) {
            Some(store) => store.pool(),
            None => {
                let db = outbox_store::connect_with(&outbox.database_url, &config.database.pool())
                    .await
                    .with_context(|| {
                        format!(
                            "outbox {}: cannot connect to the database at {}",
                            outbox.name, outbox.redacted_database_url
                        )
                    })?;
                warn_if_plain_text(outbox, db.connection()).await;
                db
            }
        };
        // `database.listen_url` is a session connection to `database.url`'s server (for a
        // pooler in transaction mode): the node lock needs one there too.
        let session_url = (outbox.database_url == config.database.url)
            .then(|| config.database.listen_url.clone())
            .flatten();
        let store = SeaOrmStore::new(db, outbox.table.clone())
            .with_columns(outbox.columns.clone())
            .with_published_rows(outbox.published_rows)
            .with_session_url(session_url);
        pools
            .entry(&outbox.database_url)
            .or_insert_with(|| store.clone());
        opened.push(OpenOutbox {
            config: outbox.clone(),
            store,
        });
    }
    Ok(opened)
}

/// Checks the store's mapping against its table: a mapping problem is a
/// [`ConfigProblem`] (`outbox orders: table orders_outbox: columns.key: column "x" does
/// not exist in table orders_outbox`), a missing or unmigrated table a runtime error, and
/// so is a failure a retry fixes (a lock not had in time, a lost connection).
pub async fn check_columns(outbox: &str, store: &mut SeaOrmStore) -> anyhow::Result<()> {
    match store.check_columns().await {
        Ok(()) => Ok(()),
        // Their text names the table, each setting and column: the outbox's name first.
        Err(
            error @ (outbox_store::Error::Mapping { .. }
            | outbox_store::Error::ExtraColumns { .. }
            | outbox_store::Error::Unreadable { .. }),
        ) if crate::dependency::classify::store_error(&error) == Verdict::Refused => {
            Err(ConfigProblem(format!("outbox {outbox}: {error}")).into())
        }
        Err(error) => Err(anyhow::Error::new(error).context(format!("outbox {outbox}"))),
    }
}

/// Connects to the database of the first outbox (the one-outbox case: demo, bench,
/// tests) and checks its mapping; migrates first when `migrate` is set.
pub async fn open_store(config: &Config, migrate: bool) -> anyhow::Result<SeaOrmStore> {
    let first = config.outboxes[0].name.clone();
    let mut opened = open_selected(config, Some(&first), migrate).await?;
    Ok(opened.remove(0).store)
}

/// Creates or upgrades the store's table for its mapping, and on PostgreSQL with `notify`
/// (`database.notify`) enables the insert trigger a LISTEN needs; returns the migrations
/// applied now. A database that refuses (a role without the privileges to create or alter
/// the table) is a [`ConfigProblem`] saying who may migrate; one that refuses to enable
/// the trigger is a warning, since the relay then probes for new rows instead.
pub async fn migrate_table(store: &SeaOrmStore, notify: bool) -> anyhow::Result<Vec<&'static str>> {
    let mut applied = migrate_schema(store).await?;
    if !notify {
        return Ok(applied);
    }
    let table = store.table();
    match outbox_store::enable_notify(store.connection(), table).await {
        Ok(true) => applied.push(outbox_store::ENABLE_NOTIFY),
        Ok(false) => {}
        Err(error) => {
            let text = server_message(&error);
            warn!(
                %table,
                "cannot enable the table's insert trigger ({trigger}) that database.notify = true needs: {text}; the relay probes for new rows instead. Enabling it needs the table's owner: run `outbox-relay migrate` as that role (docs/operations/wake-ups.md)",
                trigger = table.notify_trigger(),
            );
        }
    }
    Ok(applied)
}

/// A migration's failure as one line: the server's message once, not at every layer of
/// the driver's chain.
fn server_message(error: &outbox_store::Error) -> String {
    match error {
        outbox_store::Error::Database(cause) => outbox_store::error::describe(cause),
        other => other.to_string(),
    }
}

/// [`migrate_table`]'s migrations, without the trigger.
async fn migrate_schema(store: &SeaOrmStore) -> anyhow::Result<Vec<&'static str>> {
    let table = store.table();
    // Nothing to apply (read first, as `migrate --dry-run` does): nothing to lock or
    // create either, so a role that may only read and write rows starts with
    // `database.migrate_on_start` on a table its owner migrated. A plan that fails says
    // nothing; migrating reports the problem.
    let planned = outbox_store::plan(store.connection(), table, store.columns()).await;
    if planned.is_ok_and(|steps| steps.is_empty()) {
        return Ok(Vec::new());
    }
    let error =
        match outbox_store::migrate_columns(store.connection(), table, store.columns()).await {
            Ok(applied) => return Ok(applied),
            Err(error) => error,
        };
    let text = server_message(&error);
    let error = anyhow::Error::new(error);
    if crate::dependency::classify(&error) != crate::dependency::Verdict::Refused {
        return Err(error.context(format!("cannot migrate table {table}")));
    }
    Err(ConfigProblem(format!(
        "cannot migrate table {table}: {text}; migrating needs a role that may create and \
         alter the table (on PostgreSQL its owner): run `outbox-relay migrate` as that role, \
         and set database.migrate_on_start = false for a role that only relays \
         (docs/security.md#database-privileges)"
    ))
    .into())
}

/// Warns once when the pool of `outbox`'s database reaches a host that is not loopback in
/// plain text (docs/security.md#tls). A server that cannot say is passed over: the check
/// only informs.
async fn warn_if_plain_text(outbox: &OutboxConfig, db: &sea_orm::DatabaseConnection) {
    let remote = outbox_store::hosts::split(&outbox.database_url)
        .iter()
        .filter_map(|host| url::Url::parse(host).ok())
        .any(|url| !outbox_store::is_local(&url));
    if remote
        && matches!(
            outbox_store::transport(db).await,
            Ok(outbox_store::Transport::Plain)
        )
    {
        warn!(
            outbox = %outbox.name,
            url = %outbox.redacted_database_url,
            "the database connection is plain text to a host that is not loopback: anyone on \
             the network path can read events and credentials; ask for TLS in the URL \
             (PostgreSQL: sslmode=verify-full, MySQL/MariaDB: ssl-mode=verify_identity) or \
             PGSSLMODE"
        );
    }
}

/// Warns once for each broker of `amqp.url` that is reached in plain text (`amqp://`) on a
/// host that is not loopback.
fn warn_of_plain_brokers(config: &Config) {
    for broker in &config.amqp.brokers {
        let Ok(url) = url::Url::parse(&broker.url) else {
            continue;
        };
        if url.scheme() == "amqp" && !outbox_store::is_local(&url) {
            warn!(
                url = %broker.redacted,
                "the broker connection is plain text (amqp://) to a host that is not loopback: \
                 anyone on the network path can read events and credentials; use amqps://"
            );
        }
    }
}

/// Connects to RabbitMQ and declares every outbox's exchanges.
pub async fn open_broker(config: &Config) -> anyhow::Result<Broker> {
    warn_of_plain_brokers(config);
    Ok(Broker::connect(config.amqp.clone()).await?)
}

/// Starts the relay of the first outbox on `store` ([`Config::relay`] and the first
/// outbox's routing): the one-outbox callers (demo, bench, tests).
pub async fn start_relay(
    config: &Config,
    store: &SeaOrmStore,
    broker: &Broker,
) -> anyhow::Result<Relay> {
    let outbox = &config.outboxes[0];
    start_one(
        config,
        config.relay.clone(),
        &outbox.routing,
        &outbox.database_url,
        store,
        broker,
        None,
    )
    .await
}

/// Starts one relay per opened outbox, each with its own actors and publisher channels on
/// the one broker connection.
pub async fn start_relays(
    config: &Config,
    outboxes: &[OpenOutbox],
    broker: &Broker,
) -> anyhow::Result<Relays> {
    let nodes = outboxes.iter().map(|_| None).collect();
    start_relays_holding(config, outboxes, broker, nodes).await
}

/// Takes this process's node on every outbox's table ([`SeaOrmStore::take_node`]), in
/// the order of `outboxes`: a live process running as the same `node_id` on one of them
/// refuses the start ([`outbox_store::Error::NodeTaken`], exit code 2); a failure of the
/// database keeps the driver's error, which [`crate::dependency::classify`] reads.
pub async fn hold_nodes(config: &Config, outboxes: &[OpenOutbox]) -> anyhow::Result<Vec<NodeHold>> {
    let mut nodes = Vec::with_capacity(outboxes.len());
    for outbox in outboxes {
        let node_id = outbox.config.relay_options(&config.relay).node_id;
        let node = match outbox.store.take_node(&node_id).await {
            Ok(node) => node,
            // Its text says which node, on which table, and what to do.
            Err(error @ outbox_store::Error::NodeTaken(_)) => return Err(error.into()),
            Err(error) => {
                let outbox = &outbox.config.name;
                let context =
                    format!("outbox {outbox}: cannot take the lock of node_id {node_id:?}");
                return Err(anyhow::Error::new(error).context(context));
            }
        };
        nodes.push(node);
    }
    Ok(nodes)
}

/// [`start_relays`], each relay with its node already held ([`hold_nodes`], in the same
/// order; `None`: taken at its start).
pub async fn start_relays_holding(
    config: &Config,
    outboxes: &[OpenOutbox],
    broker: &Broker,
    nodes: Vec<Option<NodeHold>>,
) -> anyhow::Result<Relays> {
    let mut relays = Vec::with_capacity(outboxes.len());
    for (outbox, node) in outboxes.iter().zip(nodes) {
        let options = outbox.config.relay_options(&config.relay);
        let relay = start_one(
            config,
            options,
            &outbox.config.routing,
            &outbox.config.database_url,
            &outbox.store,
            broker,
            node,
        )
        .await?;
        relays.push(relay);
    }
    Ok(Relays::new(relays))
}

/// Opens one confirm channel per publisher and starts a relay's actors, with the insert
/// wake-ups the settings allow: LISTEN on PostgreSQL (`database.notify`), else a probe
/// (`database.probe`).
async fn start_one(
    config: &Config,
    options: RelayOptions,
    routing: &Arc<Routing>,
    url: &str,
    store: &SeaOrmStore,
    broker: &Broker,
    node: Option<NodeHold>,
) -> anyhow::Result<Relay> {
    let mut ports: Vec<Arc<dyn EventPublisher>> = Vec::with_capacity(options.publishers);
    for _ in 0..options.publishers {
        ports.push(Arc::new(broker.publisher_for(Arc::clone(routing)).await?));
    }
    let outbox = options.outbox.clone();
    let poll_interval = options.poll_interval;
    let store_port: Arc<dyn OutboxStore> = Arc::new(store.clone());
    let mut relay = match node {
        Some(node) => Relay::start_holding(store_port, ports, options, node),
        None => Relay::start(store_port, ports, options).await?,
    };
    let database = &config.database;
    // `database.listen_url` is for `database.url`; an outbox elsewhere listens on its own.
    let listen_url = match &database.listen_url {
        Some(listen_url) if url == database.url => listen_url.clone(),
        _ => url.to_owned(),
    };
    // A LISTEN hears nothing when the trigger was turned off (to spare the producers its
    // NOTIFY): the probe instead, whatever `notify` says.
    let mut notify = database.notify;
    if notify {
        match store
            .insert_trigger()
            .await
            .unwrap_or(InsertTrigger::NotNeeded)
        {
            InsertTrigger::Off => {
                warn!(
                    %outbox,
                    table = %store.table(),
                    "the table's insert trigger ({}) is missing, disabled or made for another table name, so no NOTIFY announces new rows: probing for them instead. `outbox-relay migrate` with database.notify = true enables it (as the table's owner); database.notify = false probes without this warning",
                    store.table().notify_trigger()
                );
                notify = false;
            }
            InsertTrigger::EveryInsert => warn!(
                %outbox,
                table = %store.table(),
                "the table's insert trigger ({}) NOTIFYs on every insert, so producers' commits take turns at the NOTIFY lock: run `outbox-relay migrate` to make it NOTIFY only a sleeping relay",
                store.table().notify_trigger()
            ),
            InsertTrigger::WhileAsleep | InsertTrigger::NotNeeded => {}
        }
    } else if let Ok(InsertTrigger::WhileAsleep | InsertTrigger::EveryInsert) =
        store.insert_trigger().await
    {
        // Nobody may LISTEN, yet every insert pays for the trigger's statement (another
        // node on the table may LISTEN, hence not a warning).
        info!(
            %outbox,
            table = %store.table(),
            "the table's insert trigger ({trigger}) is enabled, but this relay does not LISTEN (database.notify = false), and every producer's insert still pays for the trigger: where no relay on the table LISTENs, disable it (ALTER TABLE {t} DISABLE TRIGGER {trigger})",
            trigger = store.table().notify_trigger(),
            t = store.table(),
        );
    }
    let wake_ups = WakeUps {
        listen_url: notify.then_some(listen_url),
        probe_interval: database.probe_interval,
        url: url.to_owned(),
    };
    match store.insert_feed(&wake_ups) {
        Some(feed) => {
            info!(%outbox, feed = feed.kind(), "new rows wake the relay");
            relay.listen(feed);
        }
        None => {
            info!(%outbox, ?poll_interval, "no insert wake-ups: the relay polls")
        }
    }
    Ok(relay)
}
