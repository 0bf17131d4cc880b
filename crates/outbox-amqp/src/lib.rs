//! RabbitMQ through lapin.
//!
//! Layout:
//! - [`broker`]: [`Broker`], one connection, the exchange topology, and confirm channels.
//! - [`cluster`]: the brokers of `amqp.url` and the order the link tries them in.
//! - `blocking`: whether the broker blocks publishers (a resource alarm); publishes wait
//!   and their timeout stands still meanwhile.
//! - `pacing`: a Publisher slows down while the broker nacks (its backpressure).
//! - `handoff`: how many body bytes may wait in lapin to be written (a large body goes
//!   alone, so it is not held twice for every record in flight).
//! - [`preflight`]: what `check-config` asks of each broker (login, vhost, exchanges),
//!   creating nothing.
//! - [`message`]: how an [`outbox_core::OutboxRecord`] becomes an AMQP message.
//! - [`publisher`]: [`AmqpPublisher`], the [`outbox_core::EventPublisher`] port on one
//!   confirm channel.
//! - [`span`]: the OpenTelemetry span of a published message (feature `otel`).

mod blocking;
pub mod broker;
pub mod cluster;
mod confirms;
mod handoff;
pub mod message;
mod outage;
mod pacing;
pub mod preflight;
pub mod publisher;
mod silence;
pub mod span;
pub mod tap;

pub use broker::{AmqpError, AmqpSettings, Broker, Routing};
pub use cluster::BrokerUrl;
pub use message::MessageSettings;
pub use publisher::AmqpPublisher;
pub use tap::{Tap, TapQueue};

/// `app_id` of every message.
pub const APP_ID: &str = "outbox-relay";
