//! One connection to RabbitMQ, its exchange topology, and confirm channels.

use crate::blocking::Blocking;
use crate::cluster::{BrokerUrl, Rotation};
use crate::handoff::Handoff;
use crate::message::MessageSettings;
use crate::outage::Outage;
use crate::publisher::AmqpPublisher;
use crate::silence::{Silence, DEAD_AFTER};
use lapin::options::{ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::tcp::OwnedTLSConfig;
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use outbox_core::{Backoff, PublishError, Router};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tracing::{info, warn};

/// A failure to set up the broker side.
#[derive(Debug, Error)]
pub enum AmqpError {
    /// The connection could not be opened.
    #[error("cannot connect to RabbitMQ at {url}: {cause}")]
    Connect {
        /// The entry of `amqp.url` and its URL, password redacted ([`entry`]).
        url: String,
        /// lapin's error. Not a `source`: lapin's message already ends with its own cause
        /// (`IO error: invalid peer certificate: UnknownIssuer`), so the cause chain would
        /// print it twice more.
        cause: lapin::Error,
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
    /// The connection did not open in time.
    #[error("cannot connect to RabbitMQ at {url}: no answer within {after:?}")]
    ConnectTimeout {
        /// The entry of `amqp.url` and its URL, password redacted ([`entry`]).
        url: String,
        /// How long we waited.
        after: Duration,
    },
    /// The connection is down and the next reconnection attempt is not due yet.
    #[error("broker unavailable: reconnecting in {retry_in:?}")]
    Unavailable {
        /// Time until the next attempt.
        retry_in: Duration,
    },
}

/// What the broker side needs to know.
#[derive(Clone)]
pub struct AmqpSettings {
    /// `amqp.url`: one broker, or the nodes of a cluster, tried in turn (at least one).
    pub brokers: Vec<BrokerUrl>,
    /// Extra trusted CA certificates (PEM) for `amqps://`, on top of the bundled webpki
    /// roots: `amqp.tls_ca_file`, read at validation.
    pub tls_ca_pem: Option<String>,
    /// `amqp.exchange_type`.
    pub exchange_type: String,
    /// `amqp.declare_exchange`.
    pub declare_exchange: bool,
    /// Exchange and routing key per event.
    pub router: Router,
    /// `amqp.key_header`: the header carrying the record's ordering key.
    pub key_header: String,
    /// The columns `router`, `amqp.header_columns` and `amqp.content_type_column` read
    /// beyond the mapping (the one-outbox case).
    pub extra: outbox_core::ExtraColumns,
    /// The routing of every outbox of the process, whose exchanges [`Broker::connect`]
    /// declares (each with its outbox's type). Empty: only the one of `router`,
    /// `exchange_type` and `key_header` ([`AmqpSettings::routing`]).
    pub topology: Vec<Arc<Routing>>,
    /// Properties shared by every message.
    pub message: MessageSettings,
    /// `relay.publish_timeout`.
    pub publish_timeout: Duration,
}

/// Where one outbox's events go and how they are labelled: its publishers carry it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routing {
    /// Exchange and routing key per event.
    pub router: Router,
    /// The type its exchanges are declared (and checked) with.
    pub exchange_type: String,
    /// The header carrying the record's ordering key.
    pub key_header: String,
    /// The outbox's `content_type` (`None`: `amqp.content_type`, the process's).
    pub content_type: Option<String>,
    /// The columns its routing, header columns and content type read beyond the mapping.
    pub extra: outbox_core::ExtraColumns,
}

impl AmqpSettings {
    /// Every broker's URL, redacted, comma-separated: for messages about the link as a
    /// whole.
    pub fn redacted_urls(&self) -> String {
        let urls: Vec<&str> = self.brokers.iter().map(|b| b.redacted.as_str()).collect();
        urls.join(", ")
    }

    /// The routing of `router`, `exchange_type` and `key_header`: the one-outbox case.
    pub fn routing(&self) -> Routing {
        Routing {
            router: self.router.clone(),
            exchange_type: self.exchange_type.clone(),
            key_header: self.key_header.clone(),
            content_type: None,
            extra: self.extra.clone(),
        }
    }

    /// Every outbox's routing: `topology`, or the default one when it is empty.
    pub fn routings(&self) -> Vec<Arc<Routing>> {
        if self.topology.is_empty() {
            vec![Arc::new(self.routing())]
        } else {
            self.topology.clone()
        }
    }
}

// By hand, so the password in `url` cannot reach a log line through `{:?}`.
impl std::fmt::Debug for AmqpSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpSettings")
            .field("brokers", &self.brokers)
            .field("tls_ca_pem", &self.tls_ca_pem.as_ref().map(|_| "…"))
            .field("exchange_type", &self.exchange_type)
            .field("declare_exchange", &self.declare_exchange)
            .field("router", &self.router)
            .field("key_header", &self.key_header)
            .field("extra", &self.extra)
            .field("topology", &self.topology)
            .field("message", &self.message)
            .field("publish_timeout", &self.publish_timeout)
            .finish()
    }
}

/// The relay's link to RabbitMQ: one connection, re-established when it is lost.
///
/// While the connection is down, a request for a channel reconnects at most once per
/// [`BACKOFF`] step and otherwise fails at once; publishes wait for the broker before they
/// start ([`Outage`]), so an outage costs no event an attempt. See
/// docs/design/broker.md#broker-outages.
#[derive(Debug)]
pub struct Broker {
    link: Arc<Link>,
}

#[derive(Debug)]
pub(crate) struct Link {
    settings: Arc<AmqpSettings>,
    state: Mutex<LinkState>,
    /// Exchanges known to exist. Publishing to a missing exchange makes the broker close
    /// the channel, failing every other publish in flight on it; checking an unknown
    /// exchange first, on a throwaway channel, keeps that failure to its own event.
    exchanges: std::sync::Mutex<HashSet<String>>,
    /// Whether the broker blocks the current connection's publishers (a resource alarm).
    blocking: Blocking,
    /// Bodies handed to lapin and not yet written, bounded.
    handoff: Handoff,
    /// Whether the broker is away, and what waited for it.
    outage: Outage,
    /// Which connection publishes are on, and its publish timeouts since its last confirm.
    silence: Silence,
}

#[derive(Debug)]
struct LinkState {
    connection: Option<Arc<Connection>>,
    /// The broker of `connection`, redacted, for the log line when it is lost.
    connected_to: String,
    /// Follows the current connection's `connection.blocked`/`unblocked`; aborted when the
    /// connection is dropped.
    follower: Option<tokio::task::JoinHandle<()>>,
    /// No reconnection attempt before this.
    next_attempt: Instant,
    /// Time between reconnection attempts.
    backoff: Backoff,
    /// Which broker of `amqp.url` a connection round tries first.
    rotation: Rotation,
}

/// Reconnection attempts: 100 ms doubling to 30 s, jittered.
pub const BACKOFF: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));

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
    /// Fails when the broker cannot be reached now (a clear startup error); later losses
    /// are recovered by themselves. Must run on the runtime that lives as long as the
    /// relay: lapin's I/O runs there.
    pub async fn connect(settings: AmqpSettings) -> Result<Self, AmqpError> {
        let settings = Arc::new(settings);
        let mut rotation = Rotation::new(settings.brokers.len());
        let (connection, broker) = open_any(&settings, &mut rotation).await?;
        info!(url = %broker.redacted, "connected to RabbitMQ");
        let declared = if settings.declare_exchange {
            settings
                .routings()
                .iter()
                .flat_map(|routing| exchanges(&routing.router).into_iter().map(str::to_owned))
                .collect()
        } else {
            HashSet::new()
        };
        let blocking = Blocking::default();
        let follower = blocking.follow(&connection, &broker.redacted);
        let connected_to = broker.redacted.clone();
        let silence = Silence::default();
        silence.connected();
        let link = Link {
            exchanges: std::sync::Mutex::new(declared),
            blocking,
            handoff: Handoff::default(),
            outage: Outage::default(),
            silence,
            settings,
            state: Mutex::new(LinkState {
                connection: Some(Arc::new(connection)),
                connected_to,
                follower: Some(follower),
                next_attempt: Instant::now(),
                backoff: BACKOFF,
                rotation,
            }),
        };
        Ok(Self {
            link: Arc::new(link),
        })
    }

    /// Opens one channel in confirm mode: the unit a Publisher actor owns, routing as the
    /// top-level settings say ([`AmqpSettings::routing`]). Publishers get a new one from
    /// the link by themselves when theirs closes.
    pub async fn publisher(&self) -> Result<AmqpPublisher, AmqpError> {
        self.publisher_for(Arc::new(self.link.settings.routing()))
            .await
    }

    /// [`Broker::publisher`] for one outbox: its messages go and are labelled as `routing`
    /// says, on this one connection.
    pub async fn publisher_for(&self, routing: Arc<Routing>) -> Result<AmqpPublisher, AmqpError> {
        let opened = self.link.confirm_channel().await?;
        Ok(AmqpPublisher::new(opened, Arc::clone(&self.link), routing))
    }

    /// Whether the link is usable: the connection is open, or was down and opened again now
    /// (when the backoff allows, so an idle relay's link comes back by itself). Costs no
    /// traffic while the connection is up; answers false at once while it is down between
    /// attempts. Not to be called after [`Broker::close`], which it would undo.
    pub async fn probe(&self) -> bool {
        self.link.connection().await.is_ok()
    }

    /// The broker's reason while it blocks this relay's publishers (a memory or disk alarm:
    /// `connection.blocked`); `None` otherwise. Publishing is paused meanwhile.
    pub fn blocked(&self) -> Option<String> {
        self.link.blocking.reason()
    }

    /// A plain channel on the current connection (the demo consumes through it).
    pub async fn open_channel(&self) -> Result<Channel, AmqpError> {
        self.link
            .connection()
            .await?
            .create_channel()
            .await
            .map_err(AmqpError::Channel)
    }

    /// Closes the connection; channels must be closed first (dropping the last clone of a
    /// lapin channel closes it in the background, racing this close).
    pub async fn close(&self) {
        let connection = {
            let mut state = self.link.state.lock().await;
            state.drop_follower();
            state.connection.take()
        };
        if let Some(connection) = connection {
            let closing = connection.close(200, "outbox-relay stopping".into());
            let _ = tokio::time::timeout(self.link.close_timeout(), closing).await;
        }
    }
}

/// One connection round: tries the brokers in `rotation`'s order until one connects and
/// takes the topology. A broker that cannot be reached (refused, reset, timed out,
/// refused the login) gives way to the next, with a `warn` naming it; any other failure
/// (an exchange declared with another type) would be the same on every node of a
/// cluster, and ends the round. Fails with the last broker's error when none connects.
async fn open_any<'a>(
    settings: &'a AmqpSettings,
    rotation: &mut Rotation,
) -> Result<(Connection, &'a BrokerUrl), AmqpError> {
    let mut last = None;
    let mut tried = rotation.round().peekable();
    while let Some(index) = tried.next() {
        let broker = &settings.brokers[index];
        match open(settings, index, settings.declare_exchange).await {
            Ok(connection) => {
                rotation.connected(index);
                return Ok((connection, broker));
            }
            Err(error @ (AmqpError::Connect { .. } | AmqpError::ConnectTimeout { .. })) => {
                // The error names the entry; the last one is the caller's to report.
                if tried.peek().is_some() {
                    warn!(%error, "broker not usable; trying the next of amqp.url");
                }
                last = Some(error);
            }
            Err(error) => return Err(error),
        }
    }
    Err(last.expect("amqp.url names at least one broker"))
}

/// Entry `index` of `amqp.url` as messages name it: `amqp.url[1] (amqp://guest:***@mq2:5672/%2f)`,
/// or `amqp.url (…)` when it names one broker.
pub fn entry(settings: &AmqpSettings, index: usize) -> String {
    let redacted = &settings.brokers[index].redacted;
    match settings.brokers.len() {
        1 => format!("amqp.url ({redacted})"),
        _ => format!("amqp.url[{index}] ({redacted})"),
    }
}

/// Opens a connection to entry `index` of `amqp.url` and, when `declare`, declares the
/// topology.
pub(crate) async fn open(
    settings: &AmqpSettings,
    index: usize,
    declare: bool,
) -> Result<Connection, AmqpError> {
    let broker = &settings.brokers[index];
    let properties = ConnectionProperties::default()
        .with_connection_name(format!("outbox-relay {}", settings.message.node_id).into());
    install_crypto_provider();
    // The CA certificates are added to the webpki roots; plain `amqp://` ignores them.
    let tls = OwnedTLSConfig {
        identity: None,
        cert_chain: settings.tls_ca_pem.clone(),
    };
    let url = entry(settings, index);
    let runtime = lapin::runtime::default_runtime().map_err(|cause| AmqpError::Connect {
        url: url.clone(),
        cause,
    })?;
    let connecting = Connection::connect_with_config(&broker.url, properties, tls, runtime);
    let connect_timeout = settings.publish_timeout.max(Duration::from_secs(1));
    let connection = match tokio::time::timeout(connect_timeout, connecting).await {
        Ok(result) => result.map_err(|cause| AmqpError::Connect { url, cause })?,
        Err(_) => {
            return Err(AmqpError::ConnectTimeout {
                url,
                after: connect_timeout,
            })
        }
    };
    if declare {
        declare_topology(&connection, settings).await?;
    }
    Ok(connection)
}

/// Installs ring as the process's rustls crypto provider, once. ring is the only backend
/// compiled in (lapin and sqlx are both built on it), and rustls-connector would install
/// it by itself; doing it here keeps every TLS user in the process working even if a
/// later dependency enabled a second backend, where rustls cannot choose and panics.
fn install_crypto_provider() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        // An error only means another provider is installed already, which is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

impl LinkState {
    /// Stops following the blocks of a connection being dropped.
    fn drop_follower(&mut self) {
        if let Some(follower) = self.follower.take() {
            follower.abort();
        }
    }
}

impl Link {
    pub(crate) fn settings(&self) -> &AmqpSettings {
        &self.settings
    }

    pub(crate) fn blocking(&self) -> &Blocking {
        &self.blocking
    }

    pub(crate) fn handoff(&self) -> &Handoff {
        &self.handoff
    }

    pub(crate) fn outage(&self) -> &Outage {
        &self.outage
    }

    /// Returns at once while the broker is reachable; while it is away, waits until the
    /// link has a connection again, trying to reconnect as the backoff allows.
    pub(crate) async fn reachable(&self) {
        if !self.outage.is_away() {
            return;
        }
        self.outage.waiting();
        loop {
            match self.connection().await {
                Ok(_) => return,
                Err(AmqpError::Unavailable { retry_in }) => tokio::time::sleep(retry_in).await,
                // That attempt failed and set the next one: asked again, the link says when.
                Err(_) => {}
            }
        }
    }

    /// How long a close may wait for the broker's answer: none while the broker blocks
    /// the connection, since lapin writes nothing then and the close could only time out.
    pub(crate) fn close_timeout(&self) -> Duration {
        if self.blocking.reason().is_some() {
            Duration::ZERO
        } else {
            crate::publisher::CLOSE_TIMEOUT
        }
    }

    /// The current connection, reconnecting when it is gone and the backoff allows.
    async fn connection(&self) -> Result<Arc<Connection>, AmqpError> {
        Ok(self.current().await?.0)
    }

    /// [`Link::connection`], and its number (`silence.rs`).
    async fn current(&self) -> Result<(Arc<Connection>, u64), AmqpError> {
        let mut state = self.state.lock().await;
        if let Some(connection) = &state.connection {
            if connection.status().connected() {
                return Ok((Arc::clone(connection), self.silence.generation()));
            }
            state.connection = None;
            state.drop_follower();
            self.blocking.forget(&state.connected_to);
            self.outage.begin(&state.connected_to, "connection lost");
        }
        let now = Instant::now();
        if now < state.next_attempt {
            return Err(AmqpError::Unavailable {
                retry_in: state.next_attempt - now,
            });
        }
        match open_any(&self.settings, &mut state.rotation).await {
            Ok((connection, broker)) => {
                state.follower = Some(self.blocking.follow(&connection, &broker.redacted));
                let connection = Arc::new(connection);
                state.connection = Some(Arc::clone(&connection));
                state.connected_to = broker.redacted.clone();
                state.backoff.reset();
                let generation = self.silence.connected();
                self.outage.end(&broker.redacted);
                Ok((connection, generation))
            }
            Err(error) => {
                state.next_attempt = Instant::now() + state.backoff.next_delay();
                if refuses(&error) {
                    // Not an outage that ends by itself: said at every attempt.
                    warn!(%error, "broker refuses the connection (credentials or vhost); trying again with backoff");
                }
                self.outage.begin(&state.connected_to, &error.to_string());
                Err(error)
            }
        }
    }

    /// The number of the connection publishes are on now (`silence.rs`).
    pub(crate) fn generation(&self) -> u64 {
        self.silence.generation()
    }

    /// The broker confirmed a publish on connection `generation`.
    pub(crate) fn confirmed(&self, generation: u64) {
        self.silence.confirmed(generation);
    }

    /// A publish on connection `generation` timed out. The [`DEAD_AFTER`]th in a row
    /// there drops that connection as dead and an outage begins: the next publish
    /// connects again, to the next broker of `amqp.url` first. The old connection is
    /// closed in the background, as a broker that stopped answering may never confirm the
    /// close.
    pub(crate) async fn timed_out(&self, generation: u64) {
        if !self.silence.timed_out(generation) {
            return;
        }
        let mut state = self.state.lock().await;
        if self.silence.generation() != generation {
            return;
        }
        let Some(connection) = state.connection.take() else {
            return;
        };
        state.drop_follower();
        self.blocking.forget(&state.connected_to);
        let why = format!(
            "{DEAD_AFTER} publishes in a row got no confirm within {:?}: the broker stopped \
             answering, its connection is taken for dead",
            self.settings.publish_timeout
        );
        self.outage.begin(&state.connected_to, &why);
        tokio::spawn(async move {
            let closing = connection.close(320, "no confirms: taken for dead".into());
            let _ = tokio::time::timeout(crate::publisher::CLOSE_TIMEOUT, closing).await;
        });
    }

    /// Checks once that `exchange` (of type `exchange_type`) exists (a passive declare on a
    /// throwaway channel).
    pub(crate) async fn verify_exchange(
        &self,
        exchange: &str,
        exchange_type: &str,
    ) -> Result<(), PublishError> {
        if exchange.is_empty() || self.exchanges.lock().unwrap().contains(exchange) {
            return Ok(());
        }
        // Boxed: the check's futures are large, and every publish's future would carry
        // their size (and its copies) for a path taken once per exchange.
        Box::pin(self.check_exchange(exchange, exchange_type)).await
    }

    /// Declares `exchange` passively on a channel of its own; remembered once it exists.
    /// The broker's refusal is [`PublishError::NoExchange`]; a lost link, a channel error.
    async fn check_exchange(
        &self,
        exchange: &str,
        exchange_type: &str,
    ) -> Result<(), PublishError> {
        let link_error = |error: String| PublishError::Channel(error);
        let connection = self
            .connection()
            .await
            .map_err(|error| link_error(error.to_string()))?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|error| link_error(error.to_string()))?;
        let options = ExchangeDeclareOptions {
            passive: true,
            ..ExchangeDeclareOptions::default()
        };
        let kind = exchange_kind(exchange_type);
        match channel
            .exchange_declare(exchange.into(), kind, options, FieldTable::default())
            .await
        {
            Ok(()) => {
                let _ = channel.close(200, "exchange checked".into()).await;
                self.exchanges.lock().unwrap().insert(exchange.to_owned());
                Ok(())
            }
            // The broker answered: no such exchange (a passive declare checks the name only;
            // an exchange of another type is refused at start, by the declaration).
            Err(error) if matches!(error.kind(), lapin::ErrorKind::ProtocolError(_)) => {
                Err(PublishError::NoExchange {
                    exchange: exchange.to_owned(),
                    detail: error.to_string(),
                })
            }
            Err(error) => Err(link_error(error.to_string())),
        }
    }

    /// Forgets that `exchange` exists (it was deleted under us).
    pub(crate) fn forget_exchange(&self, exchange: &str) {
        self.exchanges.lock().unwrap().remove(exchange);
    }

    /// A new channel in confirm mode on the current connection.
    pub(crate) async fn confirm_channel(&self) -> Result<ConfirmChannel, AmqpError> {
        let (connection, generation) = self.current().await?;
        let channel = connection
            .create_channel()
            .await
            .map_err(AmqpError::Channel)?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(AmqpError::Channel)?;
        Ok(ConfirmChannel {
            channel,
            frame_max: connection.configuration().frame_max(),
            generation,
        })
    }
}

/// A confirm-mode channel and what a publisher needs to know of its connection.
pub(crate) struct ConfirmChannel {
    pub(crate) channel: Channel,
    /// The connection's negotiated `frame_max`.
    pub(crate) frame_max: u32,
    /// The connection's number (`silence.rs`).
    pub(crate) generation: u64,
}

/// Whether the broker answered and refused the connection: the login (`ACCESS_REFUSED`),
/// the vhost (`NOT_ALLOWED`), or the authentication mechanism.
fn refuses(error: &AmqpError) -> bool {
    let AmqpError::Connect { cause, .. } = error else {
        return false;
    };
    match cause.kind() {
        lapin::ErrorKind::ProtocolError(error) => matches!(error.get_id(), 403 | 530),
        lapin::ErrorKind::AuthProviderError(_) => true,
        _ => false,
    }
}

/// Every fixed exchange the routes name, the default first, each once. An exchange made
/// from a column (`"outbox.{aggregatetype}"`) is known only per event: it is checked when
/// first used, not declared.
pub fn exchanges(router: &Router) -> Vec<&str> {
    let mut exchanges: Vec<&str> = Vec::new();
    let fixed = std::iter::once(&router.exchange)
        .chain(router.routes.iter().map(|route| &route.exchange))
        .filter_map(|template| template.fixed());
    for exchange in fixed {
        if !exchanges.contains(&exchange) {
            exchanges.push(exchange);
        }
    }
    exchanges
}

async fn declare_topology(
    connection: &Connection,
    settings: &AmqpSettings,
) -> Result<(), AmqpError> {
    let channel = connection
        .create_channel()
        .await
        .map_err(AmqpError::Channel)?;
    // Every outbox's exchanges, each with its outbox's type (two outboxes naming one
    // exchange with two types fail here, as the broker refuses the second).
    let routings = settings.routings();
    // Collected first: closures held across the awaits below would make this future
    // (part of every publish's reconnection) lose `Send`.
    let mut declared: Vec<(String, String)> = Vec::new();
    for routing in &routings {
        for exchange in exchanges(&routing.router) {
            // The default exchange ("") exists and cannot be declared.
            let pair = (exchange.to_owned(), routing.exchange_type.clone());
            if !exchange.is_empty() && !declared.contains(&pair) {
                declared.push(pair);
            }
        }
    }
    for (exchange, kind) in declared {
        let options = ExchangeDeclareOptions {
            durable: true,
            auto_delete: false,
            ..ExchangeDeclareOptions::default()
        };
        channel
            .exchange_declare(
                exchange.as_str().into(),
                exchange_kind(&kind),
                options,
                FieldTable::default(),
            )
            .await
            .map_err(|source| AmqpError::Declare {
                exchange,
                kind,
                source,
            })?;
    }
    let _ = channel.close(200, "topology declared".into()).await;
    Ok(())
}
