//! [`NodeLock`]: one live process per `node_id` and outbox table.
//!
//! Leases name their node (`locked_by`), and a process starting as a node first clears the
//! leases its node holds, since they can only be an earlier, dead run's. That holds only
//! while no other live process runs with the same `node_id`, which a settings file copied
//! to a second host breaks. So a process takes a lock for the node before it clears or
//! claims anything, and holds it for its whole life:
//!
//! - PostgreSQL: a session advisory lock on a connection of its own;
//! - MySQL/MariaDB: `GET_LOCK` on a connection of its own;
//! - SQLite: an exclusive file lock on a file beside the database.
//!
//! The server (or the kernel) drops the lock the moment the holder's connection or process
//! ends, so a process started after a crash takes it at once. A process that finds it held
//! is refused with [`Error::NodeTaken`], naming what is known of the holder. Any other
//! failure keeps the driver's error, so that a caller can tell one a retry fixes (a lost
//! connection, a server starting up) from one it does not.

use crate::dialect::Dialect;
use crate::error::Error;
use crate::sql::TableName;
use sea_orm::sqlx::{self, Connection as _, Row as _};
use sea_orm::{DatabaseConnection, DbErr, RuntimeErr};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tracing::{error, info, warn};

/// How long one wait on the lock's session lasts: a statement that sleeps on the server
/// this long, again and again. It ends at once with an error when the server ends the
/// session (killed, the server shutting down), so the lock's loss is noticed the moment it
/// happens. Short, as the server notices a client gone (a crashed process) only between
/// statements, and frees the lock then.
const HOLD_WAIT: Duration = Duration::from_millis(250);

/// How long a wait may take beyond [`HOLD_WAIT`] before the session is taken for lost (a
/// network that drops packets answers nothing, not an error).
const HOLD_SLACK: Duration = Duration::from_secs(5);

/// How often a session whose waits fail while it still answers (a `statement_timeout`
/// shorter than [`HOLD_WAIT`]) is checked instead.
const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Between two tries to take a lost lock again while the database is away.
const RETAKE_EVERY: Duration = HOLD_WAIT;

/// How long a process starting keeps asking for a lock held by another session before it
/// is refused: a process that crashed holds its lock until its session's current wait ends
/// ([`HOLD_WAIT`]), and a successor started at once must not be refused for that.
const TAKE_GRACE: Duration = Duration::from_secs(1);

/// The lock of one `node_id` on one outbox table, held until dropped.
#[derive(Debug)]
pub struct NodeLock {
    held: Held,
    /// Set once another process holds the lock after this one lost it.
    lost: watch::Receiver<Option<String>>,
    /// Whether the lock stands: false from the moment its session fails until it is
    /// taken again.
    stands: Arc<AtomicBool>,
}

#[derive(Debug)]
enum Held {
    /// The task that owns the lock's connection; aborting it closes the connection.
    Session(tokio::task::JoinHandle<()>),
    /// The locked file: held, never read; closing it unlocks.
    File { _locked: std::fs::File },
    /// An in-memory SQLite database: no other process can reach it.
    Nothing,
}

impl Drop for NodeLock {
    fn drop(&mut self) {
        if let Held::Session(keeper) = &self.held {
            keeper.abort();
        }
    }
}

impl NodeLock {
    /// Takes the lock of `node_id` on `table`, or says who holds it.
    ///
    /// On PostgreSQL the lock's connection comes from `db`'s pool, or is opened to
    /// `session_url` when given: a session connection where `db` goes through a pooler in
    /// transaction mode (PgBouncer), which would hand the lock's server session to another
    /// client and keep it, lock and all, after this process ended (`database.listen_url`).
    pub async fn take(
        db: &DatabaseConnection,
        session_url: Option<&str>,
        table: &TableName,
        node_id: &str,
    ) -> Result<Self, Error> {
        let key = Key::new(table, node_id);
        let (tell, lost) = watch::channel(None);
        let stands = Arc::new(AtomicBool::new(true));
        let keeper = Keeper {
            tell,
            stands: Arc::clone(&stands),
        };
        let held = match Dialect::of(db) {
            Dialect::Postgres => {
                let source = postgres::Source {
                    pool: db.get_postgres_connection_pool().clone(),
                    session_url: session_url.map(crate::connection_url),
                };
                session(
                    move || {
                        let (source, key) = (source.clone(), key.clone());
                        async move { postgres::take(&source, &key).await }
                    },
                    |mut connection| async move {
                        let waited = sqlx::query("SELECT pg_sleep($1)")
                            .bind(HOLD_WAIT.as_secs_f64())
                            .execute(&mut connection)
                            .await;
                        (connection, waited.map(drop))
                    },
                    keeper,
                )
                .await?
            }
            Dialect::MySql => {
                let pool = db.get_mysql_connection_pool().clone();
                session(
                    move || {
                        let (pool, key) = (pool.clone(), key.clone());
                        async move { mysql::take(&pool, &key).await }
                    },
                    |mut connection| async move {
                        let waited = sqlx::query("SELECT SLEEP(?)")
                            .bind(HOLD_WAIT.as_secs_f64())
                            .execute(&mut connection)
                            .await;
                        (connection, waited.map(drop))
                    },
                    keeper,
                )
                .await?
            }
            Dialect::Sqlite => {
                let options = db.get_sqlite_connection_pool().connect_options();
                let database = options.get_filename();
                if database.as_os_str().is_empty() || database == std::path::Path::new(":memory:") {
                    Held::Nothing
                } else {
                    Held::File {
                        _locked: file::take(database.to_path_buf(), &key)?,
                    }
                }
            }
        };
        Ok(Self { held, lost, stands })
    }

    /// The number the lock of `node_id` on `table` is known by on the server: the key of
    /// PostgreSQL's advisory lock (`(classid << 32) | objid` in `pg_locks`), and what the
    /// `GET_LOCK` name of MySQL/MariaDB is derived from (`outbox-relay/` and the first 40
    /// characters of `SHA1(CONCAT(DATABASE(), '/', key))`). For finding a lock's holder.
    pub fn server_key(table: &TableName, node_id: &str) -> i64 {
        Key::new(table, node_id).hash
    }

    /// Whether the lock stands right now: false from the moment the session holding it
    /// fails until it is taken again. A file lock, or nothing held, always stands.
    pub fn stands(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.stands)
    }

    /// Waits until another process holds the node after this one lost its lock (its
    /// connection dropped and someone else took the lock meanwhile); says who. Never
    /// returns while the lock is held.
    pub fn lost(&self) -> impl std::future::Future<Output = String> + Send + 'static {
        let mut lost = self.lost.clone();
        async move {
            let holder = lost
                .wait_for(Option::is_some)
                .await
                .map(|holder| holder.clone().unwrap_or_default());
            match holder {
                Ok(holder) => holder,
                // No keeper (a file lock, nothing held), or it stopped with the lock.
                Err(_) => std::future::pending().await,
            }
        }
    }
}

/// What the lock is known by: the node and the table, and a 62-bit hash of both.
#[derive(Debug, Clone)]
struct Key {
    node_id: String,
    table: String,
    hash: i64,
}

impl Key {
    fn new(table: &TableName, node_id: &str) -> Self {
        // FNV-1a: stable across builds and platforms, unlike std's hasher.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in table
            .as_str()
            .bytes()
            .chain(std::iter::once(0))
            .chain(node_id.bytes())
        {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        Self {
            node_id: node_id.to_owned(),
            table: table.as_str().to_owned(),
            hash: (hash & 0x3fff_ffff_ffff_ffff) as i64,
        }
    }

    /// The refusal, with what is known of the holder.
    fn taken(&self, holder: &str) -> Error {
        Error::NodeTaken(format!(
            "node_id {:?} is in use on table {}: another live process holds it ({holder}); \
             give each process its own relay.node_id (or leave it unset: hostname-pid), or \
             stop the other process first",
            self.node_id, self.table
        ))
    }

    /// What this process says of itself where the database can show it.
    fn me() -> String {
        let host = gethostname::gethostname();
        let host = host.to_string_lossy();
        format!("outbox-relay pid {} on {host}", std::process::id())
    }
}

/// A statement's failure, the driver's error kept.
fn database(error: sqlx::Error) -> Error {
    Error::Database(DbErr::Query(RuntimeErr::SqlxError(error)))
}

/// No connection for the lock, the driver's error kept.
fn connecting(error: sqlx::Error) -> Error {
    Error::Database(DbErr::Conn(RuntimeErr::SqlxError(error)))
}

/// What the keeper of a lock held on a session tells the process.
struct Keeper {
    /// Who holds the node, once another process took it.
    tell: watch::Sender<Option<String>>,
    /// Whether the lock stands.
    stands: Arc<AtomicBool>,
}

/// The lock held on a session of its own: taken once by `take` now, then kept ([`keep`]),
/// taken again by `take` whenever its connection was lost.
async fn session<C, T, F, W, V>(mut take: T, wait: W, keeper: Keeper) -> Result<Held, Error>
where
    C: sqlx::Connection + 'static,
    T: FnMut() -> F + Send + 'static,
    F: std::future::Future<Output = Result<C, Error>> + Send + 'static,
    W: FnMut(C) -> V + Send + 'static,
    V: std::future::Future<Output = (C, Result<(), sqlx::Error>)> + Send + 'static,
{
    let until = tokio::time::Instant::now() + TAKE_GRACE;
    let connection = loop {
        match take().await {
            Err(Error::NodeTaken(_)) if tokio::time::Instant::now() < until => {
                tokio::time::sleep(HOLD_WAIT / 2).await;
            }
            taken => break taken?,
        }
    };
    Ok(Held::Session(tokio::spawn(keep(
        connection, take, wait, keeper,
    ))))
}

/// Keeps the lock's session busy with `wait` (a statement sleeping on the server), which
/// ends with an error the moment the session does. Then the lock no longer stands, and is
/// taken again on a new connection; if another process holds it by then, says so through
/// the keeper and logs it. While the database does not answer, the lock counts as standing
/// (claims fail as the retake does) and the retake is tried again every [`RETAKE_EVERY`].
///
/// A wait that fails on a session that still answers (a `statement_timeout` shorter than
/// the wait) is not a loss: the session is then checked every [`CHECK_INTERVAL`] instead.
async fn keep<C, T, F, W, V>(connection: C, mut take: T, mut wait: W, keeper: Keeper)
where
    C: sqlx::Connection,
    T: FnMut() -> F,
    F: std::future::Future<Output = Result<C, Error>>,
    W: FnMut(C) -> V,
    V: std::future::Future<Output = (C, Result<(), sqlx::Error>)>,
{
    let mut connection = Some(connection);
    loop {
        if let Some(held) = connection.take() {
            match tokio::time::timeout(HOLD_WAIT + HOLD_SLACK, wait(held)).await {
                Ok((held, Ok(()))) => {
                    connection = Some(held);
                    continue;
                }
                Ok((mut held, Err(_))) => {
                    if held.ping().await.is_ok() {
                        connection = Some(held);
                        tokio::time::sleep(CHECK_INTERVAL).await;
                        continue;
                    }
                }
                // Silent: dropping it closes it, and the server frees the lock.
                Err(_) => {}
            }
            keeper.stands.store(false, Ordering::SeqCst);
            warn!("the connection holding this node's lock was lost; claims wait until the lock is taken again");
        }
        match take().await {
            Ok(taken) => {
                keeper.stands.store(true, Ordering::SeqCst);
                info!("this node's lock is held again; claiming");
                connection = Some(taken);
            }
            Err(Error::NodeTaken(holder)) => {
                error!(%holder, "another process took this node's lock while its connection was lost");
                let _ = keeper.tell.send(Some(holder));
                return;
            }
            // The database is away. Claims go on, and fail as the lock did, which is how
            // an outage shows and how a failover finds the next server; no other process
            // can take the lock meanwhile either. Try again shortly.
            Err(_) => {
                keeper.stands.store(true, Ordering::SeqCst);
                tokio::time::sleep(RETAKE_EVERY).await;
            }
        }
    }
}

mod postgres {
    use super::*;
    use sea_orm::sqlx::{PgConnection, PgPool};

    /// Where the lock's connection comes from.
    #[derive(Clone)]
    pub(super) struct Source {
        /// The store's pool: a connection detached from it, so that the pool's lifetime
        /// rules do not close it.
        pub(super) pool: PgPool,
        /// A session connection of its own instead, when given.
        pub(super) session_url: Option<String>,
    }

    /// A connection of its own holding the session advisory lock of `key`.
    pub(super) async fn take(source: &Source, key: &Key) -> Result<PgConnection, Error> {
        let session = match &source.session_url {
            Some(url) => match PgConnection::connect(url).await {
                Ok(connection) => Some(connection),
                // As the LISTEN falls back to polling, the lock falls back to the pool: a
                // relay whose session URL is down still runs.
                Err(error) => {
                    warn!(
                        %error,
                        "the node lock cannot reach database.listen_url; taking it on a connection of database.url's pool instead (behind a pooler in transaction mode the lock may then outlive this process)"
                    );
                    None
                }
            },
            None => None,
        };
        let mut connection = match session {
            Some(connection) => connection,
            None => source.pool.acquire().await.map_err(connecting)?.detach(),
        };
        // Shown in pg_stat_activity, where a refused process reads who holds the lock.
        let name: String = Key::me().chars().take(63).collect();
        sqlx::query("SELECT set_config('application_name', $1, false)")
            .bind(&name)
            .execute(&mut connection)
            .await
            .map_err(database)?;
        let taken: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(key.hash)
            .fetch_one(&mut connection)
            .await
            .map_err(database)?;
        if taken {
            return Ok(connection);
        }
        let holder = sqlx::query(
            "SELECT a.application_name, host(a.client_addr) AS client, \
             to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') AS since \
             FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
             AND ((l.classid::bigint << 32) | l.objid::bigint) = $1",
        )
        .bind(key.hash)
        .fetch_optional(&mut connection)
        .await
        .map_err(database)?;
        let _ = connection.close().await;
        let described = match holder {
            Some(row) => {
                let mut text = String::new();
                let name: Option<String> = row.try_get("application_name").ok();
                let client: Option<String> = row.try_get("client").ok().flatten();
                let since: Option<String> = row.try_get("since").ok().flatten();
                text.push_str(
                    name.as_deref()
                        .filter(|n| !n.is_empty())
                        .unwrap_or("a session"),
                );
                if let Some(client) = client {
                    let _ = write!(text, ", connected from {client}");
                }
                if let Some(since) = since {
                    let _ = write!(text, ", since {since}");
                }
                text
            }
            None => "a session this role cannot see".into(),
        };
        Err(key.taken(&described))
    }
}

mod mysql {
    use super::*;
    use sea_orm::sqlx::{MySqlConnection, MySqlPool};

    /// A lock name of at most 64 characters, the server's limit; locks are server-wide, so
    /// the database's name is part of it.
    const NAME: &str = "CONCAT('outbox-relay/', LEFT(SHA1(CONCAT(DATABASE(), '/', ?)), 40))";

    /// A connection of its own holding `GET_LOCK` of `key`.
    pub(super) async fn take(pool: &MySqlPool, key: &Key) -> Result<MySqlConnection, Error> {
        let mut connection = pool.acquire().await.map_err(connecting)?.detach();
        let taken: Option<i64> = sqlx::query_scalar(&format!("SELECT GET_LOCK({NAME}, 0)"))
            .bind(key.hash.to_string())
            .fetch_one(&mut connection)
            .await
            .map_err(database)?;
        if taken == Some(1) {
            return Ok(connection);
        }
        let holder = sqlx::query(&format!(
            "SELECT CAST(p.ID AS UNSIGNED) AS id, p.HOST AS host, p.TIME AS idle FROM information_schema.PROCESSLIST p \
             WHERE p.ID = IS_USED_LOCK({NAME})"
        ))
        .bind(key.hash.to_string())
        .fetch_optional(&mut connection)
        .await
        .map_err(database)?;
        let _ = connection.close().await;
        let described = match holder {
            Some(row) => {
                let id: u64 = row.try_get("id").unwrap_or_default();
                let host: String = row.try_get("host").unwrap_or_default();
                format!("MySQL connection {id} from {host}")
            }
            None => "a connection this user cannot see".into(),
        };
        Err(key.taken(&described))
    }
}

mod file {
    use super::*;
    use std::io::{Read as _, Seek as _, Write as _};

    /// `<database>.outbox-relay-<hash>.lock`, locked exclusively; it says who holds it.
    pub(super) fn take(database: PathBuf, key: &Key) -> Result<std::fs::File, Error> {
        let mut path = database.into_os_string();
        path.push(format!(".outbox-relay-{:016x}.lock", key.hash));
        let path = PathBuf::from(path);
        let cannot = |source: std::io::Error| Error::NodeLockFile {
            path: path.display().to_string(),
            source,
        };
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(cannot)?;
        match file.try_lock() {
            Ok(()) => {
                let since = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ");
                let said = format!("{}, since {since}\n", Key::me());
                file.set_len(0).map_err(cannot)?;
                file.rewind().map_err(cannot)?;
                file.write_all(said.as_bytes()).map_err(cannot)?;
                Ok(file)
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                let holder = if holder.is_empty() {
                    "a process"
                } else {
                    holder
                };
                Err(key.taken(&format!("{holder}; lock file {}", path.display())))
            }
            Err(std::fs::TryLockError::Error(error)) => Err(cannot(error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_stable_and_tells_tables_and_nodes_apart() {
        let table = TableName::parse("outbox").unwrap();
        let other = TableName::parse("orders_outbox").unwrap();
        let a = Key::new(&table, "n1");
        assert_eq!(a.hash, Key::new(&table, "n1").hash);
        assert_ne!(a.hash, Key::new(&table, "n2").hash);
        assert_ne!(a.hash, Key::new(&other, "n1").hash);
        assert!(a.hash >= 0, "a positive 62-bit key");
    }

    #[tokio::test]
    async fn a_second_file_lock_is_refused_and_names_the_holder() {
        let dir = std::env::temp_dir().join(format!("node-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let database = dir.join("relay.db");
        let key = Key::new(&TableName::parse("outbox").unwrap(), "n1");
        let held = file::take(database.clone(), &key).unwrap();
        let refused = file::take(database.clone(), &key).unwrap_err();
        let Error::NodeTaken(text) = refused else {
            panic!("expected NodeTaken, got {refused:?}");
        };
        assert!(text.contains("\"n1\""), "{text}");
        assert!(
            text.contains(&format!("pid {}", std::process::id())),
            "{text}"
        );
        drop(held);
        file::take(database, &key).expect("free again once the holder closed it");
        let _ = std::fs::remove_dir_all(dir);
    }
}
