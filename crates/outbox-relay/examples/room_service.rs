//! A tiny room service (`cargo run -p outbox-relay --example room_service`): it renames a
//! room and enqueues `room.renamed` in one transaction, then runs the relay in-process and
//! shows the event arriving. Needs RabbitMQ (`OUTBOX_RELAY__AMQP__URL`); the `rooms` table
//! and the outbox share a temporary SQLite file unless `OUTBOX_RELAY__DATABASE__URL` names
//! another database.

use anyhow::{bail, Context as _};
use futures_lite::StreamExt;
use outbox_amqp::{Tap, TapQueue};
use outbox_relay::settings::Settings;
use outbox_relay::startup::{open_broker, open_store, start_relay};
use outbox_store::{enqueue, NewEvent, TableName};
use sea_orm::{
    ActiveModelTrait, ConnectionTrait, DatabaseConnection, EntityTrait, Schema, Set,
    TransactionTrait,
};
use std::time::Duration;

/// The service's own state: one row per room.
mod room {
    use sea_orm::entity::prelude::*;

    /// A chat room.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "rooms")]
    pub struct Model {
        /// The room id; also the outbox ordering key.
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: String,
        /// What members see.
        pub name: String,
    }

    /// Rooms have no relations here.
    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// The service's command: rename `room_id` and record the event, atomically. Updating the
/// room's row also serialises renames of one room, so the outbox ids follow its history.
async fn rename_room(
    db: &DatabaseConnection,
    outbox: &TableName,
    room_id: &str,
    name: &str,
) -> anyhow::Result<String> {
    let txn = db.begin().await?;
    let Some(room) = room::Entity::find_by_id(room_id).one(&txn).await? else {
        bail!("no room {room_id}");
    };
    let envelope = serde_json::json!({
        "room_id": room_id,
        "old_name": room.name,
        "name": name,
    })
    .to_string();
    let mut renamed: room::ActiveModel = room.into();
    renamed.name = Set(name.to_owned());
    renamed.update(&txn).await?;
    let event_id = enqueue(
        &txn,
        outbox,
        NewEvent::new("room.renamed", room_id, envelope),
    )
    .await?;
    // Both or neither: dropping `txn` instead would roll back the rename and the event.
    txn.commit().await?;
    Ok(event_id)
}

/// Creates the `rooms` table and a room to rename.
async fn create_rooms(db: &DatabaseConnection) -> anyhow::Result<()> {
    let backend = db.get_database_backend();
    let mut create = Schema::new(backend).create_table_from_entity(room::Entity);
    db.execute(backend.build(create.if_not_exists())).await?;
    if room::Entity::find_by_id("room-42").one(db).await?.is_none() {
        room::ActiveModel {
            id: Set("room-42".into()),
            name: Set("Planning".into()),
        }
        .insert(db)
        .await?;
    }
    Ok(())
}

#[actix_rt::main]
async fn main() -> anyhow::Result<()> {
    let mut settings = Settings::default();
    settings.database.url = match std::env::var("OUTBOX_RELAY__DATABASE__URL") {
        Ok(url) => url,
        Err(_) => {
            let file = std::env::temp_dir().join("outbox-room-service.db");
            format!("sqlite://{}?mode=rwc", file.display())
        }
    };
    if let Ok(url) = std::env::var("OUTBOX_RELAY__AMQP__URL") {
        settings.amqp.url = url;
    }
    settings.metrics.listen = "".into();
    let config = settings.validate().map_err(|errors| {
        anyhow::anyhow!(errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; "))
    })?;
    outbox_relay::telemetry::init(&config.log, &config.secrets);

    // The service's side: its table, the outbox (migrated), one transaction.
    let store = open_store(&config, true).await?;
    create_rooms(store.connection()).await?;

    // A consumer, bound before anything is published (the relay publishes `mandatory`).
    let broker = open_broker(&config).await?;
    let tap = Tap::open(
        broker.open_channel().await?,
        TapQueue::Temporary,
        &config.amqp.router.exchange.to_string(),
        "room.renamed",
    )
    .await?;
    let mut consumer = tap.consume("room-service-example").await?;

    let name = format!("Release planning {}", chrono::Utc::now().format("%H:%M:%S"));
    let event_id = rename_room(store.connection(), store.table(), "room-42", &name).await?;
    println!("renamed room-42 to {name:?}; enqueued room.renamed as {event_id}");

    // The relay's side, in the same process.
    let relay = start_relay(&config, &store, &broker).await?;
    let delivered = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(delivery) = consumer.next().await {
            let delivery = delivery?;
            let id = delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.to_string());
            if id.as_deref() == Some(event_id.as_str()) {
                return anyhow::Ok(delivery);
            }
        }
        bail!("the consumer stopped")
    })
    .await
    .context("the event did not arrive within 10 s")??;
    println!(
        "delivered: routing key {}, message_id {}, body {}",
        delivered.routing_key,
        event_id,
        String::from_utf8_lossy(&delivered.data)
    );

    relay.shutdown().await?;
    tap.close().await;
    broker.close().await;
    Ok(())
}
