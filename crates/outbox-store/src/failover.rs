//! Following the database through a failover: a pool never keeps working on a server that
//! cannot take writes (docs/operations/failover.md).
//!
//! Patroni, RDS and Aurora move the writer and then the name or address the relay connects
//! to; a pooled connection opened before the move stays on the old server, which is now a
//! read-only standby (or a MySQL/MariaDB replica with `read_only` set). Every write there
//! fails, and sqlx keeps such a connection for its whole lifetime. So, per pool:
//!
//! - each new connection is checked before use (PostgreSQL: `pg_is_in_recovery()` and
//!   `transaction_read_only`; MySQL/MariaDB: `@@global.read_only`) and refused when the
//!   server takes no writes; sqlx then connects again (re-resolving the name) with its own
//!   backoff until the acquire timeout, so the pool follows the address as soon as it
//!   points at a writable server;
//! - a statement that fails because the server is read-only or in recovery
//!   ([`read_only_answer`]) records a *switch*: every connection opened before it is
//!   closed at its next acquire instead of being used, logged once (`warn`) and counted
//!   ([`FAILOVERS`]).
//!
//! The pool's hooks and the stores on it share one [`Failover`], handed to the stores with
//! the pool ([`crate::Pool`]). A URL naming several hosts (libpq's form, [`crate::hosts`]) gives a
//! pool that starts on the first writable host and moves to another when its host fails
//! or answers read-only.

use sea_orm::sqlx::{self, mysql::MySqlConnectOptions, postgres::PgConnectOptions};
use sea_orm::{DbErr, RuntimeErr};
use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// Counter, label `server` (the server's `host:port`, or its socket's path: no URL, no
/// user, no password): switches away from a server that answered read-only or in
/// recovery.
pub const FAILOVERS: &str = "outbox_database_failovers_total";

/// A boxed future as sqlx's pool hooks return it.
pub(crate) type Hook<'c, T> = Pin<Box<dyn Future<Output = Result<T, sqlx::Error>> + Send + 'c>>;

/// The switch state of one pool's server.
#[derive(Debug)]
pub(crate) struct Failover {
    /// The current host: `postgres://user@host:port/db` (no password) for logs, and
    /// `host:port` for the metric's label.
    server: Mutex<Host>,
    /// The pool's hosts as single-host URLs, in the configured order (one for a plain
    /// URL). May hold a password: never logged.
    pub(crate) hosts: Vec<String>,
    /// The one new connections go to.
    pub(crate) current: AtomicUsize,
    /// A search for a writable host is running (one at a time).
    pub(crate) searching: AtomicBool,
    /// sqlx logs statements (`OUTBOX_SQLX_LOG`), also for the hosts switched to.
    pub(crate) log_statements: bool,
    /// When a statement last met a read-only answer: connections opened before are stale.
    switched_at: Mutex<Option<Instant>>,
    /// Since the last switch, no writable connection has been opened yet (logs once).
    read_only: AtomicBool,
    /// Why the last new connection was refused (the server takes no writes), until one
    /// is accepted: what a start that times out reports instead of a bare timeout.
    refused: Mutex<Option<ReadOnlyServer>>,
}

/// A database server as the logs and the metrics name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Host {
    /// `scheme://user@host:port/database`, without the password: for log lines.
    pub(crate) url: String,
    /// `host:port` (or the socket's path): the [`FAILOVERS`] label, which names no user
    /// and is no URL (`/metrics` serves no secret and no URL).
    pub(crate) address: String,
}

impl Host {
    /// The server `options` connect to.
    pub(crate) fn of<DB: Server>(options: &<DB::Connection as sqlx::Connection>::Options) -> Self {
        Self {
            url: DB::describe(options),
            address: DB::address(options),
        }
    }

    /// Its [`FAILOVERS`] counter, registered (at 0) if new.
    fn failovers(&self) -> metrics::Counter {
        metrics::counter!(FAILOVERS, "server" => self.address.clone())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Failover {
    /// The state of a pool on `hosts` (single-host URLs), starting on `hosts[current]`,
    /// which is `server`.
    pub(crate) fn new(
        server: Host,
        hosts: Vec<String>,
        current: usize,
        log_statements: bool,
    ) -> Arc<Self> {
        // The series is there from the start, at 0: a rate over it sees the first switch.
        let _ = server.failovers();
        Arc::new(Self {
            server: Mutex::new(server),
            hosts,
            current: AtomicUsize::new(current),
            searching: AtomicBool::new(false),
            log_statements,
            switched_at: Mutex::new(None),
            read_only: AtomicBool::new(false),
            refused: Mutex::new(None),
        })
    }

    /// The current host as log lines name it (a URL without its password).
    pub(crate) fn server(&self) -> String {
        lock(&self.server).url.clone()
    }

    /// New connections go to host `index`, which is `server`, from now on; those opened
    /// so far are retired.
    pub(crate) fn moved_to(&self, index: usize, server: Host) {
        self.current.store(index, Ordering::Relaxed);
        let _ = server.failovers();
        *lock(&self.server) = server;
        *lock(&self.switched_at) = Some(Instant::now());
    }

    /// A connection `age` old was opened before the last switch: close it, do not use it.
    pub(crate) fn stale(&self, age: Duration) -> bool {
        lock(&self.switched_at).is_some_and(|at| at.elapsed() < age)
    }

    /// A new connection reached a server that takes writes.
    pub(crate) fn writable(&self) {
        *lock(&self.refused) = None;
        if self.read_only.swap(false, Ordering::Relaxed) {
            info!(server = %self.server(), "connected to a writable database server again");
        }
    }

    /// A new connection reached a server that takes no writes: refused.
    pub(crate) fn refuse(&self, answer: ReadOnlyServer) {
        self.read_only_seen(&answer.message);
        *lock(&self.refused) = Some(answer);
    }

    /// The last refusal while no writable connection was opened since.
    pub(crate) fn refused(&self) -> Option<ReadOnlyServer> {
        lock(&self.refused).clone()
    }

    /// A statement failed with `error`: when the server answered read-only or in
    /// recovery, every connection opened so far is stale, and the switch is logged and
    /// counted once (until a writable connection is opened). True when it was such an
    /// answer.
    pub(crate) fn notice(&self, error: &DbErr) -> bool {
        let Some(answer) = read_only_answer(error) else {
            return false;
        };
        *lock(&self.switched_at) = Some(Instant::now());
        self.read_only_seen(&answer);
        true
    }

    /// The server answered that it takes no writes: logged and counted once, until a
    /// writable connection is opened again.
    fn read_only_seen(&self, answer: &str) {
        if !self.read_only.swap(true, Ordering::Relaxed) {
            // Counted for the server that answered: the current one.
            let server = lock(&self.server).clone();
            server.failovers().increment(1);
            warn!(
                server = %self.server(),
                %answer,
                "the database server takes no writes (a standby or read-only replica: a \
                 failover?); closing the pool's connections to it and connecting again until \
                 a writable server answers"
            );
        }
    }
}

/// Why a statement failed, when the server said it takes no writes: PostgreSQL's
/// read_only_sql_transaction (25006: a standby, or `default_transaction_read_only`) or
/// "… during recovery"; MySQL/MariaDB's `--read-only`/`--super-read-only` (1290),
/// read-only transaction (1792), read-only mode (1836), and Galera's non-primary node
/// (1047); and a new connection this crate refused ([`ReadOnlyServer`]).
pub fn read_only_answer(error: &DbErr) -> Option<String> {
    let (DbErr::Conn(RuntimeErr::SqlxError(error))
    | DbErr::Exec(RuntimeErr::SqlxError(error))
    | DbErr::Query(RuntimeErr::SqlxError(error))) = error
    else {
        return None;
    };
    let sqlx::Error::Database(error) = error else {
        return None;
    };
    let message = error.message();
    if error.try_downcast_ref::<ReadOnlyServer>().is_some() {
        return Some(message.to_owned());
    }
    let code = error.code().unwrap_or_default();
    let read_only = if error
        .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
        .is_some()
    {
        code == "25006" || message.contains("during recovery")
    } else if let Some(error) = error.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        match error.number() {
            1290 => message.contains("read-only") || message.contains("read_only"),
            1792 | 1836 | 1047 => true,
            _ => false,
        }
    } else {
        false
    };
    read_only.then(|| format!("{message} ({code})"))
}

/// A new connection's server takes no writes (a standby, a replica): the relay's own check
/// refused the connection. It travels through sqlx's pool hook as a
/// `sqlx::Error::Database`, the one variant that carries an error of ours as its own type
/// (found again by downcasting), but it has no SQLSTATE or error number: no server sent it.
#[derive(Debug, Clone)]
pub struct ReadOnlyServer {
    message: String,
}

impl ReadOnlyServer {
    /// A refusal saying `message` (what the server's state is).
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: format!(
                "connection refused by the relay's check: {}",
                message.into()
            ),
        }
    }
}

impl std::fmt::Display for ReadOnlyServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ReadOnlyServer {}

impl sqlx::error::DatabaseError for ReadOnlyServer {
    fn message(&self) -> &str {
        &self.message
    }

    fn code(&self) -> Option<Cow<'_, str>> {
        None
    }

    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }

    fn kind(&self) -> sqlx::error::ErrorKind {
        sqlx::error::ErrorKind::Other
    }
}

/// A backend whose servers can be read-only: how to name one and how to ask.
pub(crate) trait Server: sqlx::Database {
    /// The server `options` connect to, without the password.
    fn describe(options: &<Self::Connection as sqlx::Connection>::Options) -> String;

    /// The server `options` connect to as `host:port` (or its socket's path): no user, no
    /// password, no URL.
    fn address(options: &<Self::Connection as sqlx::Connection>::Options) -> String;

    /// `Some(refusal)` when the server of `connection` takes no writes.
    fn read_only(connection: &mut Self::Connection) -> Hook<'_, Option<ReadOnlyServer>>;
}

/// `scheme://user@host:port/database` (or `@socket/database`): a server as the logs name
/// it, without a password.
fn server_url(
    scheme: &str,
    user: &str,
    socket: Option<&std::path::Path>,
    (host, port): (&str, u16),
    database: &str,
) -> String {
    match socket {
        Some(socket) => format!("{scheme}://{user}@{}/{database}", socket.display()),
        None => format!("{scheme}://{user}@{host}:{port}/{database}"),
    }
}

/// `host:port`, or the socket's path: a server as the metrics name it.
fn address(socket: Option<&std::path::Path>, (host, port): (&str, u16)) -> String {
    match socket {
        Some(socket) => socket.display().to_string(),
        // An IPv6 address in brackets, as in a URL, so that the port stands apart.
        None if host.contains(':') && !host.starts_with('[') => format!("[{host}]:{port}"),
        None => format!("{host}:{port}"),
    }
}

/// PostgreSQL.
pub(crate) type Postgres = sqlx::Postgres;
/// MySQL and MariaDB.
pub(crate) type MySql = sqlx::MySql;

impl Server for Postgres {
    fn describe(options: &PgConnectOptions) -> String {
        server_url(
            "postgres",
            options.get_username(),
            options.get_socket().map(|socket| socket.as_path()),
            (options.get_host(), options.get_port()),
            options.get_database().unwrap_or_default(),
        )
    }

    fn address(options: &PgConnectOptions) -> String {
        address(
            options.get_socket().map(|socket| socket.as_path()),
            (options.get_host(), options.get_port()),
        )
    }

    fn read_only(connection: &mut sqlx::PgConnection) -> Hook<'_, Option<ReadOnlyServer>> {
        Box::pin(async move {
            // A standby is in recovery; a primary can also refuse writes by
            // `default_transaction_read_only` (a managed database out of storage, say).
            let (recovery, read_only): (bool, bool) = sqlx::query_as(
                "SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'",
            )
            .fetch_one(connection)
            .await?;
            let why = match (recovery, read_only) {
                (true, _) => "the server is in recovery (a standby)",
                (false, true) => "the server's transactions are read-only",
                (false, false) => return Ok(None),
            };
            Ok(Some(ReadOnlyServer::new(format!(
                "{why}: it takes no writes"
            ))))
        })
    }
}

impl Server for MySql {
    fn describe(options: &MySqlConnectOptions) -> String {
        server_url(
            "mysql",
            options.get_username(),
            options.get_socket().map(|socket| socket.as_path()),
            (options.get_host(), options.get_port()),
            options.get_database().unwrap_or_default(),
        )
    }

    fn address(options: &MySqlConnectOptions) -> String {
        address(
            options.get_socket().map(|socket| socket.as_path()),
            (options.get_host(), options.get_port()),
        )
    }

    fn read_only(connection: &mut sqlx::MySqlConnection) -> Hook<'_, Option<ReadOnlyServer>> {
        Box::pin(async move {
            // As text: an integer on MySQL and MariaDB 10, an enum (OFF, ON, NO_LOCK, …) on
            // MariaDB 11. `super_read_only` sets `read_only` too; a user with SUPER could
            // still write there, but a replica is no place for the relay's writes. An
            // Aurora MySQL reader says so by `innodb_read_only` instead.
            let (read_only, innodb): (String, String) = sqlx::query_as(
                "SELECT CAST(@@global.read_only AS CHAR), CAST(@@global.innodb_read_only AS CHAR)",
            )
            .fetch_one(connection)
            .await?;
            let set = |value: &str| !matches!(value.to_ascii_uppercase().as_str(), "0" | "OFF");
            let variable = match (set(&read_only), set(&innodb)) {
                (true, _) => format!("read_only = {read_only}"),
                (false, true) => format!("innodb_read_only = {innodb}"),
                (false, false) => return Ok(None),
            };
            Ok(Some(ReadOnlyServer::new(format!(
                "the server is read-only ({variable}): it takes no writes"
            ))))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str) -> Host {
        Host {
            url: format!("postgres://relay@{name}:5432/app"),
            address: format!("{name}:5432"),
        }
    }

    fn state() -> Arc<Failover> {
        Failover::new(host("db"), Vec::new(), 0, false)
    }

    #[test]
    fn connections_opened_before_a_switch_are_stale() {
        let failover = state();
        assert!(!failover.stale(Duration::from_secs(3600)), "no switch yet");
        *lock(&failover.switched_at) = Some(Instant::now() - Duration::from_secs(2));
        assert!(failover.stale(Duration::from_secs(3)), "opened before");
        assert!(!failover.stale(Duration::from_secs(1)), "opened after");
    }

    #[test]
    fn a_move_retires_every_connection_and_names_the_new_host() {
        let failover = state();
        failover.moved_to(1, host("db-2"));
        assert_eq!(failover.current.load(Ordering::Relaxed), 1);
        assert_eq!(failover.server(), "postgres://relay@db-2:5432/app");
        assert!(failover.stale(Duration::from_millis(100)));
    }

    #[test]
    fn a_refused_connection_reads_as_a_read_only_answer() {
        let refused =
            ReadOnlyServer::new("the server is in recovery (a standby): it takes no writes");
        let error = DbErr::Conn(RuntimeErr::SqlxError(sqlx::Error::Database(Box::new(
            refused,
        ))));
        let answer = read_only_answer(&error).expect("read-only");
        assert!(
            answer.contains("recovery") && answer.contains("the relay's check"),
            "{answer}"
        );
        assert!(
            !answer.contains("25006"),
            "no code no server sent: {answer}"
        );
        let other = DbErr::Conn(RuntimeErr::SqlxError(sqlx::Error::PoolTimedOut));
        assert_eq!(read_only_answer(&other), None);
    }

    #[test]
    fn the_metric_names_a_server_by_host_and_port_without_user_or_url() {
        for (url, expected) in [
            ("postgres://relay:s3cret@db-1:6432/rooms", "db-1:6432"),
            ("postgres://relay@10.0.0.5/rooms", "10.0.0.5:5432"),
            ("postgres://relay@[::1]:5433/rooms", "[::1]:5433"),
            (
                "postgres://relay@%2Fvar%2Frun%2Fpostgresql/rooms",
                "/var/run/postgresql",
            ),
        ] {
            let options: PgConnectOptions = url.parse().expect("a URL");
            let label = Postgres::address(&options);
            assert_eq!(label, expected, "{url}");
            assert!(
                !label.contains("relay") && !label.contains("://"),
                "{label}"
            );
        }
        let options: MySqlConnectOptions = "mysql://app:pw@maria:3307/x".parse().expect("a URL");
        assert_eq!(MySql::address(&options), "maria:3307");
        let described = Host::of::<Postgres>(&"postgres://relay:pw@db:5432/app".parse().unwrap());
        assert_eq!(
            described.url, "postgres://relay@db:5432/app",
            "logs keep the user"
        );
        assert_eq!(described.address, "db:5432");
    }
}
