//! Opening the store and the broker and starting the relay: shared by `run`, `demo` and
//! the end-to-end tests.

use crate::settings::Config;
use actix::Recipient;
use anyhow::Context as _;
use outbox_amqp::Broker;
use outbox_core::EventPublisher;
use outbox_relay::{InsertsAnnounced, Relay, Wake};
use outbox_store::{InsertListener, SeaOrmStore};
use sea_orm::{ConnectionTrait, DbBackend};
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, info, warn};

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

/// Opens one confirm channel per publisher and starts the relay's actors.
pub async fn start_relay(
    config: &Config,
    store: &SeaOrmStore,
    broker: &Broker,
) -> anyhow::Result<Relay> {
    let mut ports: Vec<Arc<dyn EventPublisher>> = Vec::with_capacity(config.relay.publishers);
    for _ in 0..config.relay.publishers {
        ports.push(Arc::new(broker.publisher().await?));
    }
    let mut relay = Relay::start(Arc::new(store.clone()), ports, config.relay.clone()).await?;
    if config.database.notify && store.connection().get_database_backend() == DbBackend::Postgres {
        let wake_ups = spawn_wake_ups(config, relay.waker(), relay.announcer());
        relay.attach(wake_ups);
    }
    Ok(relay)
}

/// LISTENs for the insert trigger's NOTIFY and wakes the relay; connects, and reconnects
/// when the listening connection is lost, with backoff (and wakes the relay then, since
/// notifications may have been missed). Tells the relay whether it is listening: while it
/// is not, the relay claims after every written batch of outcomes, as without wake-ups.
/// Polling goes on regardless, so a lost listener only costs latency.
fn spawn_wake_ups(
    config: &Config,
    waker: Recipient<Wake>,
    announcer: Recipient<InsertsAnnounced>,
) -> actix_rt::task::JoinHandle<()> {
    let url = config.database.url.clone();
    let table = config.database.table.clone();
    actix_rt::spawn(async move {
        let mut listener: Option<InsertListener> = None;
        // What the relay was last told; it starts out not knowing of a listener.
        let mut announced = false;
        // Back at FIRST_RETRY: no failure since the last success (or the start).
        const FIRST_RETRY: Duration = Duration::from_millis(100);
        let mut backoff = FIRST_RETRY;
        while waker.connected() {
            let listening = match listener.as_mut() {
                Some(listener) => listener.wait().await,
                None => InsertListener::connect(&url, &table)
                    .await
                    .map(|connected| {
                        debug!(channel = %table, "listening for inserts");
                        listener = Some(connected);
                    }),
            };
            match listening {
                Ok(()) => {
                    if !announced {
                        if backoff > FIRST_RETRY {
                            info!("insert listener connected again");
                        }
                        announcer.do_send(InsertsAnnounced(true));
                        announced = true;
                    }
                    backoff = FIRST_RETRY;
                    waker.do_send(Wake);
                }
                Err(error) => {
                    if backoff == FIRST_RETRY {
                        warn!(%error, "cannot LISTEN for inserts; polling until the listener connects");
                    }
                    if announced {
                        announcer.do_send(InsertsAnnounced(false));
                        announced = false;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
            }
        }
    })
}
