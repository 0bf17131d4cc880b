//! The admin API of `outbox-relay run` (`docs/operations/admin-api.md`), on `admin.listen`
//! when `admin.enabled`: JSON under `/api/v1` about every outbox of the process, its dead
//! and failing events, and requeueing dead events.
//!
//! - [`tokens`]: the tokens file, its roles, and new tokens (`outbox-relay admin-token`).
//! - `auth`: bearer tokens checked in constant time, roles, failed attempts bounded per
//!   client address.
//! - `routes`: the endpoints.
//! - `console`: the web console at `/`, a page calling the endpoints, embedded in the
//!   binary.
//!
//! The server runs on a worker thread of its own, as the metrics endpoint does; every
//! database statement it needs runs on the relay's own thread (the arbiter that opened
//! the pools), so a pool's connections are only ever driven by the runtime that made them.

mod auth;
mod console;
mod routes;
pub mod tokens;

pub use tokens::{Role, Tokens};

use crate::settings::AdminConfig;
use crate::startup::{ConfigProblem, OpenOutbox};
use actix_web::dev::ServerHandle;
use actix_web::{middleware, web, App, HttpServer};
use anyhow::Context as _;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tracing::info;

/// Stopping the server may take this long at most (it drops open connections at once).
const STOP_TIMEOUT: Duration = Duration::from_millis(500);

/// The counter of admin actions, labelled `action`.
pub const ACTIONS: &str = "outbox_admin_actions_total";

/// Registers the admin API's metrics with the installed recorder.
pub fn describe_metrics() {
    metrics::describe_counter!(
        ACTIONS,
        metrics::Unit::Count,
        "Actions taken through the admin API, by `action` (`requeue`; a dry run is \
         `requeue_dry_run`)."
    );
}

/// What the handlers share.
struct Shared {
    /// Every outbox of the process, by settings order.
    outboxes: Vec<OpenOutbox>,
    /// Who may call.
    tokens: Arc<Tokens>,
    /// Failed attempts by client address.
    limiter: auth::Limiter,
    /// The relay's arbiter, where the statements run.
    relay: actix_rt::ArbiterHandle,
}

impl Shared {
    /// The outbox named `name`.
    fn outbox(&self, name: &str) -> Option<&OpenOutbox> {
        self.outboxes
            .iter()
            .find(|outbox| outbox.config.name == name)
    }

    /// Runs `work` on the relay's thread and waits for its result; `None` when that thread
    /// is gone (the process is stopping).
    async fn on_relay<T: Send + 'static>(
        &self,
        work: impl Future<Output = T> + Send + 'static,
    ) -> Option<T> {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        self.relay.spawn(async move {
            let _ = sender.send(work.await);
        });
        receiver.await.ok()
    }
}

/// The running admin API.
pub struct AdminServer {
    /// Where it listens (with the port chosen by the system when `admin.listen` said 0).
    pub address: SocketAddr,
    server: ServerHandle,
}

impl AdminServer {
    /// Starts serving `outboxes` on `config.listen`. Call it on the relay's thread: the
    /// handlers' statements run there. An address that cannot be bound (in use, not of
    /// this host, privileged) is a [`ConfigProblem`] naming `admin.listen`.
    pub fn start(config: &AdminConfig, outboxes: &[OpenOutbox]) -> anyhow::Result<Self> {
        let listen = config.listen;
        let listener = std::net::TcpListener::bind(listen).map_err(|error| {
            anyhow::Error::new(ConfigProblem(format!(
                "admin.listen = \"{listen}\": cannot listen there: {error}; choose another \
                 address or port, or set admin.enabled = false"
            )))
        })?;
        let address = listener.local_addr()?;
        let shared = web::Data::new(Shared {
            outboxes: outboxes.to_vec(),
            tokens: Arc::clone(&config.tokens),
            limiter: auth::Limiter::default(),
            relay: actix_rt::Arbiter::current(),
        });
        let server = HttpServer::new(move || {
            App::new()
                .app_data(shared.clone())
                .wrap(security_headers())
                .configure(console::configure)
                .configure(routes::configure)
        })
        .workers(1)
        // SIGINT and SIGTERM are the relay's: the server stops when `run` says so.
        .disable_signals()
        .shutdown_timeout(0)
        .max_connections(64)
        .listen(listener)
        .with_context(|| format!("cannot serve on {address} (admin.listen)"))?
        .run();
        let handle = server.handle();
        actix_rt::spawn(server);
        info!(
            %address,
            tokens = config.tokens.len(),
            "admin API listening (/api/v1, the console at /)"
        );
        Ok(Self {
            address,
            server: handle,
        })
    }

    /// Stops serving; open connections are dropped. Bounded by a fraction of a second.
    pub async fn stop(self) {
        let _ = tokio::time::timeout(STOP_TIMEOUT, self.server.stop(false)).await;
    }
}

/// The headers of every response: nothing cached, sniffed, framed or referred. The
/// console's page, script and style sheet set a policy of their own (`console::POLICY`),
/// which these defaults do not replace.
fn security_headers() -> middleware::DefaultHeaders {
    middleware::DefaultHeaders::new()
        .add(("Cache-Control", "no-store"))
        .add(("X-Content-Type-Options", "nosniff"))
        .add((
            "Content-Security-Policy",
            "default-src 'none'; frame-ancestors 'none'",
        ))
        .add(("Referrer-Policy", "no-referrer"))
}
