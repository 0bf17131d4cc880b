//! Several database hosts in one URL, as libpq takes them:
//! `postgres://relay@db-1,db-2,db-3/rooms`, each host with its own port or the default
//! (`db-1:5432,db-2:6432`). The pool connects to the first host, in
//! order, that takes writes (libpq's `target_session_attrs=read-write`, pgjdbc's
//! `targetServerType=primary`, always), and searches again, in the same order, when its
//! host fails or answers read-only. The same for MySQL/MariaDB URLs.

use crate::failover::{Failover, Host, ReadOnlyServer, Server};
use sea_orm::sqlx::{self, ConnectOptions as _};
use sea_orm::{DatabaseConnection, DbErr, RuntimeErr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{info, warn};

/// One try to reach a host while searching: a host that does not answer within it is
/// passed over (the start-up wait and the next search try again).
const HOST_TIMEOUT: Duration = Duration::from_secs(5);
/// At most one search per this long: every statement failing meanwhile would start one.
const SEARCH_EVERY: Duration = Duration::from_secs(1);
/// A search that finds no writable host tries again every [`SEARCH_EVERY`] for this long
/// (a standby being promoted): the pool moves within a second of a host taking writes,
/// not at its next acquire timeout. The next failed statement starts another.
const SEARCH_FOR: Duration = Duration::from_secs(30);

/// `url` as scheme, `user[:password]@` (or empty), host list and the rest (`/db?…`).
fn parts(url: &str) -> Option<(&str, &str, &str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, hosts) = match authority.rfind('@') {
        Some(at) => authority.split_at(at + 1),
        None => ("", authority),
    };
    Some((scheme, user, hosts, tail))
}

/// The single-host URLs `url` names, in order: one per host of a comma-separated host
/// list, each with the URL's user, password, database and parameters; `url` alone when it
/// names one host.
pub fn split(url: &str) -> Vec<String> {
    match parts(url) {
        Some((scheme, user, hosts, tail)) if hosts.contains(',') => hosts
            .split(',')
            .map(|host| format!("{scheme}://{user}{host}{tail}"))
            .collect(),
        _ => vec![url.to_owned()],
    }
}

/// `url` with its first host only, when it names several: a URL any URL parser takes
/// (`db-1:5432,db-2:5432` is no host and port to one), for checking and for changing its
/// user, password or parameters, after which [`with_hosts_of`] puts the list back.
pub fn first_host(url: &str) -> Option<String> {
    let hosts = split(url);
    (hosts.len() > 1).then(|| hosts[0].clone())
}

/// `single` (a URL naming one host, made from [`first_host`] of `url`) with `url`'s host
/// list in place of its host.
pub fn with_hosts_of(url: &str, single: &str) -> String {
    match (parts(url), parts(single)) {
        (Some((_, _, hosts, _)), Some((scheme, user, _, tail))) => {
            format!("{scheme}://{user}{hosts}{tail}")
        }
        _ => single.to_owned(),
    }
}

/// The connect options of `url`, statements logged by sqlx only when `log_statements`.
pub(crate) fn options<DB: Server>(
    url: &str,
    log_statements: bool,
) -> Result<<DB::Connection as sqlx::Connection>::Options, sqlx::Error> {
    let options: <DB::Connection as sqlx::Connection>::Options = url.parse()?;
    Ok(match log_statements {
        true => options,
        false => options.disable_statement_logging(),
    })
}

/// The first of `hosts` that answers and takes writes: its index and connect options;
/// else the last host's failure (a [`crate::failover::ReadOnlyServer`] when it answered
/// read-only). With `warn_passed_over`, each host passed over for the next is logged
/// (`warn`): its `host:port` and why, never the URL's password.
pub(crate) async fn first_writable<DB: Server>(
    hosts: &[String],
    log_statements: bool,
    warn_passed_over: bool,
) -> Result<(usize, <DB::Connection as sqlx::Connection>::Options), sqlx::Error> {
    let mut failure = sqlx::Error::PoolTimedOut;
    for (index, host) in hosts.iter().enumerate() {
        let connect = options::<DB>(host, log_statements)?;
        let error = match try_host::<DB>(&connect).await {
            Ok(()) => return Ok((index, connect)),
            Err(error) => error,
        };
        if warn_passed_over && index + 1 < hosts.len() {
            let next = options::<DB>(&hosts[index + 1], log_statements)
                .map(|next| DB::address(&next))
                .unwrap_or_default();
            warn!(
                host = %DB::address(&connect),
                reason = %reason(&error),
                next = %next,
                hosts = hosts.len(),
                "a database host of the URL is passed over: it cannot be reached or takes no \
                 writes; trying the next"
            );
        }
        failure = error;
    }
    Err(failure)
}

/// One connection to the host of `options`, closed again: `Ok` when it takes writes; a
/// [`ReadOnlyServer`] when it answered but takes none; a host that does not answer within
/// [`HOST_TIMEOUT`] fails as `PoolTimedOut`.
async fn try_host<DB: Server>(
    options: &<DB::Connection as sqlx::Connection>::Options,
) -> Result<(), sqlx::Error> {
    let answer = tokio::time::timeout(HOST_TIMEOUT, async {
        let mut connection = options.connect().await?;
        let read_only = DB::read_only(&mut connection).await;
        let _ = sqlx::Connection::close(connection).await;
        read_only
    })
    .await;
    match answer {
        Ok(Ok(None)) => Ok(()),
        Ok(Ok(Some(refusal))) => Err(sqlx::Error::Database(Box::new(refusal))),
        Ok(Err(error)) => Err(error),
        Err(_) => Err(sqlx::Error::PoolTimedOut),
    }
}

/// Why a host failed [`try_host`], in a few words ([`crate::error::describe`]).
fn reason(error: &sqlx::Error) -> String {
    match error {
        // Its own words; "(code 25006)" would suggest the server said so to a statement.
        sqlx::Error::Database(refusal)
            if refusal.try_downcast_ref::<ReadOnlyServer>().is_some() =>
        {
            refusal.message().to_owned()
        }
        error => crate::error::describe_sqlx(error),
    }
}

/// What one host of a database URL answered ([`check_each`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostAnswer {
    /// `host:port` (or a socket's path): no user, no password.
    pub host: String,
    /// Why `run` would pass it over (it cannot be reached, or takes no writes); `None`
    /// when it takes writes.
    pub problem: Option<HostProblem>,
}

/// Why a host of a database URL is passed over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostProblem {
    /// It answered, but takes no writes (a standby, a read-only replica): `run` moves to
    /// it once a failover makes it writable.
    ReadOnly(String),
    /// It could not be reached or refused the connection.
    Unusable(String),
}

/// Each host of `url` asked as the pool would ask it: connected to, and whether it takes
/// writes (`check-config`). Empty for a URL naming one host, or no PostgreSQL or MySQL
/// URL.
pub async fn check_each(url: &str) -> Vec<HostAnswer> {
    let hosts = split(url);
    if hosts.len() < 2 {
        return Vec::new();
    }
    let mut answers = Vec::new();
    for host in hosts {
        let host = crate::connection_url(&host);
        let answer = if host.starts_with("postgres") {
            check_host::<sqlx::Postgres>(&host).await
        } else if host.starts_with("mysql") {
            check_host::<sqlx::MySql>(&host).await
        } else {
            return Vec::new();
        };
        answers.push(answer);
    }
    answers
}

/// [`check_each`] for one single-host URL.
async fn check_host<DB: Server>(url: &str) -> HostAnswer {
    let options = match options::<DB>(url, false) {
        Ok(options) => options,
        Err(error) => {
            return HostAnswer {
                host: "(unparsable)".into(),
                problem: Some(HostProblem::Unusable(crate::error::describe_sqlx(&error))),
            }
        }
    };
    let problem = match try_host::<DB>(&options).await {
        Ok(()) => None,
        Err(sqlx::Error::Database(error))
            if error.try_downcast_ref::<ReadOnlyServer>().is_some() =>
        {
            Some(HostProblem::ReadOnly(error.message().to_owned()))
        }
        Err(error) => Some(HostProblem::Unusable(reason(&error))),
    };
    HostAnswer {
        host: DB::address(&options),
        problem,
    }
}

/// `error` says the server is gone or going rather than that the statement failed: the
/// connection broke or could not be made, or the server is shutting down or starting
/// (PostgreSQL class 08, 57P01–57P03; MySQL/MariaDB 1053, 1927, 2013).
pub(crate) fn server_unusable(error: &DbErr) -> bool {
    let error = match error {
        DbErr::ConnectionAcquire(_) => return true,
        DbErr::Conn(RuntimeErr::SqlxError(error))
        | DbErr::Exec(RuntimeErr::SqlxError(error))
        | DbErr::Query(RuntimeErr::SqlxError(error)) => error,
        _ => return false,
    };
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(error) => {
            let code = error.code().unwrap_or_default();
            if error
                .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                .is_some()
            {
                code.starts_with("08") || matches!(&*code, "57P01" | "57P02" | "57P03")
            } else {
                matches!(&*code, "1053" | "1927" | "2013")
            }
        }
        _ => false,
    }
}

impl Failover {
    /// A statement on `db` failed for want of a usable server: when the pool has several
    /// hosts, look for a writable one in the background (one search at a time, at most one
    /// a second, again for up to [`SEARCH_FOR`] while none is found) and send new
    /// connections there.
    pub(crate) fn follow(self: &Arc<Self>, db: &DatabaseConnection) {
        if self.hosts.len() < 2 || self.searching.swap(true, Ordering::AcqRel) {
            return;
        }
        let failover = Arc::clone(self);
        let db = db.clone();
        tokio::spawn(async move {
            let until = Instant::now() + SEARCH_FOR;
            for attempt in 0.. {
                let started = Instant::now();
                let found = match &db {
                    DatabaseConnection::SqlxPostgresPoolConnection(_) => {
                        let pool = db.get_postgres_connection_pool();
                        search::<sqlx::Postgres>(&failover, pool, attempt).await
                    }
                    DatabaseConnection::SqlxMySqlPoolConnection(_) => {
                        let pool = db.get_mysql_connection_pool();
                        search::<sqlx::MySql>(&failover, pool, attempt).await
                    }
                    _ => true,
                };
                tokio::time::sleep_until(started + SEARCH_EVERY).await;
                if found || Instant::now() >= until {
                    break;
                }
            }
            failover.searching.store(false, Ordering::Release);
        });
    }
}

/// One look for a writable host, the `attempt`th of a search; true when one was found.
async fn search<DB: Server>(failover: &Failover, pool: &sqlx::Pool<DB>, attempt: u32) -> bool {
    // The hosts passed over are named once per search, at its first look.
    let warn = attempt == 0;
    match first_writable::<DB>(&failover.hosts, failover.log_statements, warn).await {
        Ok((index, _)) if index == failover.current.load(Ordering::Relaxed) => true,
        Ok((index, options)) => {
            let server = Host::of::<DB>(&options);
            info!(
                from = %failover.server(),
                to = %server.url,
                "the database pool connects to another host, the first that takes writes"
            );
            pool.set_connect_options(options);
            failover.moved_to(index, server);
            true
        }
        Err(error) => {
            if attempt == 0 {
                warn!(%error, hosts = failover.hosts.len(), "no database host takes writes yet; looking again every second");
            }
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{server_unusable, split};
    use sea_orm::{ConnAcquireErr, DbErr, RuntimeErr};

    #[test]
    fn a_lost_or_refused_connection_means_the_server_and_a_bad_statement_does_not() {
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        for error in [
            DbErr::ConnectionAcquire(ConnAcquireErr::Timeout),
            DbErr::Exec(RuntimeErr::SqlxError(sea_orm::sqlx::Error::Io(io))),
            DbErr::Conn(RuntimeErr::SqlxError(sea_orm::sqlx::Error::PoolTimedOut)),
        ] {
            assert!(server_unusable(&error), "{error}");
        }
        assert!(!server_unusable(&DbErr::Custom("no such column".into())));
        let decode = sea_orm::sqlx::Error::ColumnNotFound("id".into());
        assert!(!server_unusable(&DbErr::Query(RuntimeErr::SqlxError(
            decode
        ))));
    }

    #[test]
    fn a_host_list_gives_one_url_per_host() {
        assert_eq!(
            split("postgres://relay:pw@db-1,db-2:6432,db-3/rooms?sslmode=disable"),
            [
                "postgres://relay:pw@db-1/rooms?sslmode=disable",
                "postgres://relay:pw@db-2:6432/rooms?sslmode=disable",
                "postgres://relay:pw@db-3/rooms?sslmode=disable",
            ]
        );
        assert_eq!(
            split("mysql://10.0.0.1:3306,10.0.0.2:3306/app"),
            ["mysql://10.0.0.1:3306/app", "mysql://10.0.0.2:3306/app"]
        );
    }

    #[test]
    fn the_first_host_stands_in_for_the_list_and_the_list_comes_back() {
        use super::{first_host, with_hosts_of};
        let url = "postgres://relay@db-1:5432,db-2:6432/rooms?sslmode=disable";
        let first = first_host(url).expect("several hosts");
        assert_eq!(first, "postgres://relay@db-1:5432/rooms?sslmode=disable");
        let changed = "postgres://relay:s3cret@db-1:5432/rooms?sslmode=disable";
        assert_eq!(
            with_hosts_of(url, changed),
            "postgres://relay:s3cret@db-1:5432,db-2:6432/rooms?sslmode=disable"
        );
        assert_eq!(first_host("postgres://relay@db/rooms"), None);
    }

    #[test]
    fn one_host_is_the_url_itself() {
        for url in [
            "postgres://relay:p,w@db/rooms",
            "mysql://root@db:3306/app?ssl-mode=disabled",
            "sqlite://outbox.db?mode=rwc",
        ] {
            assert_eq!(split(url), [url]);
        }
    }
}
