//! One connection to RabbitMQ, its exchange topology, and confirm channels.

use crate::message::MessageSettings;
use crate::publisher::AmqpPublisher;
use lapin::options::{ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use outbox_core::Router;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

/// A failure to set up the broker side.
#[derive(Debug, Error)]
pub enum AmqpError {
    /// The connection could not be opened.
    #[error("cannot connect to RabbitMQ at {url}: {source}")]
    Connect {
        /// The URL, password redacted.
        url: String,
        /// lapin's error.
        source: lapin::Error,
    },
    /// An exchange could not be declared (for instance it exists with another type).
    #[error("cannot declare exchange {exchange:?} as durable {kind}: {source} (an existing exchange of another type or durability must be deleted or the settings changed)")]
    Declare {
        /// Exchange name.
        exchange: String,
        /// Requested type.
        kind: String,
        /// lapin's error.
        source: lapin::Error,
    },
    /// A channel could not be opened or put in confirm mode.
    #[error("cannot open a confirm channel: {0}")]
    Channel(lapin::Error),
}

/// What the broker side needs to know.
#[derive(Debug, Clone)]
pub struct AmqpSettings {
    /// `amqp.url` (may hold a password).
    pub url: String,
    /// The same URL with the password replaced, for messages.
    pub redacted_url: String,
    /// `amqp.exchange_type`.
    pub exchange_type: String,
    /// `amqp.declare_exchange`.
    pub declare_exchange: bool,
    /// Exchange and routing key per event.
    pub router: Router,
    /// Properties shared by every message.
    pub message: MessageSettings,
    /// `relay.publish_timeout`.
    pub publish_timeout: Duration,
}

/// An open connection with its topology declared.
#[derive(Debug)]
pub struct Broker {
    connection: Connection,
    settings: Arc<AmqpSettings>,
}

/// lapin's name for an exchange type.
pub fn exchange_kind(name: &str) -> ExchangeKind {
    match name {
        "direct" => ExchangeKind::Direct,
        "fanout" => ExchangeKind::Fanout,
        "headers" => ExchangeKind::Headers,
        "topic" => ExchangeKind::Topic,
        custom => ExchangeKind::Custom(custom.to_owned()),
    }
}

impl Broker {
    /// Connects and, when `declare_exchange`, declares every exchange the routes name.
    /// Must run on the runtime that lives as long as the relay: lapin's I/O runs there.
    pub async fn connect(settings: AmqpSettings) -> Result<Self, AmqpError> {
        let properties = ConnectionProperties::default()
            .with_connection_name(format!("outbox-relay {}", settings.message.node_id).into());
        let connection = Connection::connect(&settings.url, properties)
            .await
            .map_err(|source| AmqpError::Connect {
                url: settings.redacted_url.clone(),
                source,
            })?;
        let broker = Self {
            connection,
            settings: Arc::new(settings),
        };
        if broker.settings.declare_exchange {
            broker.declare_topology().await?;
        }
        Ok(broker)
    }

    async fn declare_topology(&self) -> Result<(), AmqpError> {
        let channel = self
            .connection
            .create_channel()
            .await
            .map_err(AmqpError::Channel)?;
        let router = &self.settings.router;
        let mut exchanges: Vec<&str> = vec![router.exchange.as_str()];
        exchanges.extend(router.routes.iter().map(|route| route.exchange.as_str()));
        exchanges.dedup();
        for exchange in exchanges {
            // The default exchange ("") exists and cannot be declared.
            if exchange.is_empty() {
                continue;
            }
            let options = ExchangeDeclareOptions {
                durable: true,
                auto_delete: false,
                ..ExchangeDeclareOptions::default()
            };
            let kind = &self.settings.exchange_type;
            channel
                .exchange_declare(
                    exchange.into(),
                    exchange_kind(kind),
                    options,
                    FieldTable::default(),
                )
                .await
                .map_err(|source| AmqpError::Declare {
                    exchange: exchange.to_owned(),
                    kind: kind.clone(),
                    source,
                })?;
        }
        let _ = channel.close(200, "topology declared".into()).await;
        Ok(())
    }

    /// Opens one channel in confirm mode: the unit a Publisher actor owns.
    pub async fn publisher(&self) -> Result<AmqpPublisher, AmqpError> {
        let channel = self
            .connection
            .create_channel()
            .await
            .map_err(AmqpError::Channel)?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(AmqpError::Channel)?;
        Ok(AmqpPublisher::new(channel, Arc::clone(&self.settings)))
    }

    /// The underlying connection (tests and the demo consume through it).
    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    /// Closes the connection; channels must be closed first (see STACK.md: dropping the
    /// last clone of a channel closes it in the background and races this close).
    pub async fn close(&self) {
        let _ = self
            .connection
            .close(200, "outbox-relay stopping".into())
            .await;
    }
}
