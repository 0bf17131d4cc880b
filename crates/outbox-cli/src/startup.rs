//! Opening the store and the broker and starting the relay: shared by `run`, `demo` and
//! the end-to-end tests.

use crate::settings::Config;
use anyhow::Context as _;
use outbox_amqp::Broker;
use outbox_core::EventPublisher;
use outbox_relay::Relay;
use outbox_store::{SeaOrmStore, WakeUps};
use std::sync::Arc;
use tracing::info;

/// Connects to the database; migrates first when `migrate` is set.
pub async fn open_store(config: &Config, migrate: bool) -> anyhow::Result<SeaOrmStore> {
    let database = &config.database;
    let db = outbox_store::connect(&database.url, database.max_connections)
        .await
        .with_context(|| {
            format!(
                "cannot connect to the database at {}",
                database.redacted_url
            )
        })?;
    let store = SeaOrmStore::new(db, database.table.clone());
    if migrate {
        for name in migrate_table(&store).await? {
            info!(migration = name, table = %database.table, "migration applied");
        }
    }
    Ok(store)
}

/// Creates or upgrades the store's table; returns the migrations applied now.
pub async fn migrate_table(store: &SeaOrmStore) -> anyhow::Result<Vec<&'static str>> {
    outbox_store::migrate(store.connection(), store.table())
        .await
        .with_context(|| format!("cannot migrate table {}", store.table()))
}

/// Connects to RabbitMQ and declares the topology.
pub async fn open_broker(config: &Config) -> anyhow::Result<Broker> {
    Ok(Broker::connect(config.amqp.clone()).await?)
}

/// Opens one confirm channel per publisher and starts the relay's actors, with the insert
/// wake-ups the settings allow: LISTEN on PostgreSQL (`database.notify`), else a probe
/// (`database.probe`).
pub async fn start_relay(
    config: &Config,
    store: &SeaOrmStore,
    broker: &Broker,
) -> anyhow::Result<Relay> {
    let mut ports: Vec<Arc<dyn EventPublisher>> = Vec::with_capacity(config.relay.publishers);
    let routing = &config.outboxes[0].routing;
    for _ in 0..config.relay.publishers {
        ports.push(Arc::new(broker.publisher_for(Arc::clone(routing)).await?));
    }
    let mut relay = Relay::start(Arc::new(store.clone()), ports, config.relay.clone()).await?;
    let database = &config.database;
    let wake_ups = WakeUps {
        listen_url: database.notify.then(|| {
            database
                .listen_url
                .as_ref()
                .unwrap_or(&database.url)
                .clone()
        }),
        probe_interval: database.probe_interval,
        url: database.url.clone(),
    };
    match store.insert_feed(&wake_ups) {
        Some(feed) => {
            info!(feed = feed.kind(), "new rows wake the relay");
            relay.listen(feed);
        }
        None => {
            info!(poll_interval = ?config.relay.poll_interval, "no insert wake-ups: the relay polls")
        }
    }
    Ok(relay)
}
