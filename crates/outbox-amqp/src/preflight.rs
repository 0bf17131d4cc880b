//! What `check-config` asks of each broker of `amqp.url`: does it take the login and the
//! vhost, and do the exchanges the routes name fit them — without creating anything.

use crate::broker::{exchange_kind, exchanges, open, AmqpError, AmqpSettings};
use lapin::options::ExchangeDeclareOptions;
use lapin::types::FieldTable;
use lapin::Connection;

/// One exchange the routes name, as the broker has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExchangeState {
    /// It exists with the type (and durability) `run` declares it with.
    Fits,
    /// It does not exist; `run` declares it (`amqp.declare_exchange`).
    Declared,
    /// It does not exist and `amqp.declare_exchange` is off: events routed to it fail.
    Missing,
}

/// One exchange checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedExchange {
    /// Its name.
    pub exchange: String,
    /// The type its outbox declares it with.
    pub kind: String,
    /// What the broker has.
    pub state: ExchangeState,
}

/// Connects to entry `index` of `amqp.url` as `run` would (credentials, vhost, TLS) and
/// checks every exchange the routes name: one that exists is declared again with the
/// type and durability `run` uses, which the broker refuses (`PRECONDITION_FAILED`, an
/// [`AmqpError::Declare`]) when it has another; one that does not exist is left so. The
/// connection is closed afterwards.
pub async fn check_broker(
    settings: &AmqpSettings,
    index: usize,
) -> Result<Vec<CheckedExchange>, AmqpError> {
    let connection = open(settings, index, false).await?;
    let checked = check_exchanges(&connection, settings).await;
    let _ = connection
        .close(200, "outbox-relay check-config".into())
        .await;
    checked
}

async fn check_exchanges(
    connection: &Connection,
    settings: &AmqpSettings,
) -> Result<Vec<CheckedExchange>, AmqpError> {
    let mut checked: Vec<CheckedExchange> = Vec::new();
    for routing in settings.routings() {
        for exchange in exchanges(&routing.router) {
            let kind = routing.exchange_type.clone();
            // The default exchange ("") exists and cannot be declared.
            let seen = checked
                .iter()
                .any(|c| c.exchange == exchange && c.kind == kind);
            if exchange.is_empty() || seen {
                continue;
            }
            let state = check_exchange(connection, exchange, &kind, settings).await?;
            checked.push(CheckedExchange {
                exchange: exchange.to_owned(),
                kind,
                state,
            });
        }
    }
    Ok(checked)
}

/// A passive declaration (does it exist?), then, when it does, the declaration `run`
/// makes, which changes nothing on an exchange that fits. Each on a channel of its own:
/// a refusal closes the channel.
async fn check_exchange(
    connection: &Connection,
    exchange: &str,
    kind: &str,
    settings: &AmqpSettings,
) -> Result<ExchangeState, AmqpError> {
    let channel = connection
        .create_channel()
        .await
        .map_err(AmqpError::Channel)?;
    let passive = ExchangeDeclareOptions {
        passive: true,
        ..ExchangeDeclareOptions::default()
    };
    let found = channel
        .exchange_declare(
            exchange.into(),
            exchange_kind(kind),
            passive,
            FieldTable::default(),
        )
        .await;
    if let Err(error) = found {
        return match error.kind() {
            // NOT_FOUND: the broker closed the channel; nothing else to ask of it.
            lapin::ErrorKind::ProtocolError(protocol) if protocol.get_id() == 404 => {
                Ok(match settings.declare_exchange {
                    true => ExchangeState::Declared,
                    false => ExchangeState::Missing,
                })
            }
            _ => Err(declare_error(exchange, kind, error)),
        };
    }
    if !settings.declare_exchange {
        let _ = channel.close(200, "exchange checked".into()).await;
        return Ok(ExchangeState::Fits);
    }
    let declare = ExchangeDeclareOptions {
        durable: true,
        auto_delete: false,
        ..ExchangeDeclareOptions::default()
    };
    channel
        .exchange_declare(
            exchange.into(),
            exchange_kind(kind),
            declare,
            FieldTable::default(),
        )
        .await
        .map_err(|error| declare_error(exchange, kind, error))?;
    let _ = channel.close(200, "exchange checked".into()).await;
    Ok(ExchangeState::Fits)
}

fn declare_error(exchange: &str, kind: &str, source: lapin::Error) -> AmqpError {
    AmqpError::Declare {
        exchange: exchange.to_owned(),
        kind: kind.to_owned(),
        source,
    }
}
