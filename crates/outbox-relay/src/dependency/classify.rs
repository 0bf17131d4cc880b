//! Which failures to reach the database or the broker a retry can fix: the one place that
//! decides, from the error kinds and codes of sqlx (through sea-orm and outbox-store) and
//! lapin (through outbox-amqp).
//!
//! - **Transient**: the peer is not there yet or not ready: refused, reset, timed out, a
//!   name that does not resolve yet, PostgreSQL starting up, shutting down or in recovery,
//!   too many connections, a read-only (failing over) server, a SQLite file whose
//!   directory is missing, RabbitMQ closing the connection while it stops; or a statement
//!   lost to another transaction: a deadlock, a serialization failure, a lock not had in
//!   time (PostgreSQL's `lock_timeout` and `statement_timeout`, MySQL/MariaDB's
//!   `innodb_lock_wait_timeout`, SQLite's busy timeout), a statement killed.
//! - **Refused**: the peer answered and the settings are wrong: authentication, an unknown
//!   database or vhost, a rejected certificate, an exchange of another type, a column
//!   mapping that does not fit ([`ConfigProblem`]). Exit code 2, like a bad setting.
//! - **Fatal**: anything else (a missing table, a bug): exit code 1, as before.

use crate::startup::ConfigProblem;
use lapin::protocol::AMQPError;
use outbox_amqp::AmqpError;
use sea_orm::sqlx;
use sea_orm::{ConnAcquireErr, DbErr, RuntimeErr};
use std::error::Error as StdError;
use std::io;

/// What a failure to reach a dependency calls for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Trying again can fix it; the reason, for the log line.
    Transient(String),
    /// The dependency answered and refused the settings: a configuration error (exit 2).
    Refused,
    /// Anything else: a runtime failure (exit 1).
    Fatal,
}

/// Classifies `error` by the first cause in its chain that this module knows.
pub fn classify(error: &anyhow::Error) -> Verdict {
    // Also under a context, which the chain below would not see through.
    if error.downcast_ref::<ConfigProblem>().is_some() {
        return Verdict::Refused;
    }
    error.chain().find_map(cause).unwrap_or(Verdict::Fatal)
}

/// The verdict on one cause, when its type is one this module knows.
fn cause(cause: &(dyn StdError + 'static)) -> Option<Verdict> {
    if cause.is::<ConfigProblem>() {
        return Some(Verdict::Refused);
    }
    // Another live process runs as this node: a setting to change, not an outage.
    if let Some(outbox_core::StoreError::NodeTaken(_)) = cause.downcast_ref() {
        return Some(Verdict::Refused);
    }
    if let Some(error) = cause.downcast_ref::<outbox_store::Error>() {
        return Some(store_error(error));
    }
    if let Some(error) = cause.downcast_ref::<DbErr>() {
        return Some(db_err(error));
    }
    if let Some(error) = cause.downcast_ref::<sqlx::Error>() {
        return Some(sqlx_error(error));
    }
    if let Some(error) = cause.downcast_ref::<AmqpError>() {
        return Some(amqp_error(error));
    }
    if let Some(error) = cause.downcast_ref::<lapin::Error>() {
        return Some(lapin_error(error));
    }
    cause.downcast_ref::<io::Error>().map(io_error)
}

/// The verdict on an error of outbox-store's own calls.
pub fn store_error(error: &outbox_store::Error) -> Verdict {
    match error {
        outbox_store::Error::Database(error)
        | outbox_store::Error::Connect { cause: error, .. } => db_err(error),
        // A statement that reads the mapped columns failed: the mapping's fault, unless
        // the failure is one a retry fixes (a lock not had in time, a lost connection).
        outbox_store::Error::Unreadable { cause, .. } => match db_err(cause) {
            transient @ Verdict::Transient(_) => transient,
            _ => Verdict::Refused,
        },
        outbox_store::Error::InvalidUrl
        | outbox_store::Error::Mapping { .. }
        | outbox_store::Error::ExtraColumns { .. }
        | outbox_store::Error::NodeTaken(_) => Verdict::Refused,
        // Another node is migrating the table right now.
        error @ outbox_store::Error::MigrationLockTimeout { .. } => {
            Verdict::Transient(error.to_string())
        }
        _ => Verdict::Fatal,
    }
}

fn db_err(error: &DbErr) -> Verdict {
    match error {
        DbErr::ConnectionAcquire(ConnAcquireErr::Timeout) => pool_timed_out(),
        DbErr::ConnectionAcquire(ConnAcquireErr::ConnectionClosed) => {
            Verdict::Transient("the connection was closed".into())
        }
        DbErr::Conn(RuntimeErr::SqlxError(error))
        | DbErr::Exec(RuntimeErr::SqlxError(error))
        | DbErr::Query(RuntimeErr::SqlxError(error)) => sqlx_error(error),
        _ => Verdict::Fatal,
    }
}

fn pool_timed_out() -> Verdict {
    // sqlx retries refused connections and "starting up" answers by itself until its
    // connect timeout, then says only this.
    Verdict::Transient(
        "no connection within the connect timeout (the server refuses, does not answer or \
         is starting up)"
            .into(),
    )
}

fn sqlx_error(error: &sqlx::Error) -> Verdict {
    match error {
        sqlx::Error::Io(error) => io_error(error),
        sqlx::Error::PoolTimedOut => pool_timed_out(),
        sqlx::Error::Database(error) => database_error(error.as_ref()),
        // A TLS handshake cut by the network is transient; a rejected certificate is not.
        sqlx::Error::Tls(error) => {
            let mut source: Option<&(dyn StdError + 'static)> = Some(error.as_ref());
            while let Some(cause) = source {
                if let Some(Verdict::Transient(reason)) = cause.downcast_ref().map(io_error) {
                    return Verdict::Transient(reason);
                }
                source = cause.source();
            }
            Verdict::Refused
        }
        sqlx::Error::Configuration(_) => Verdict::Refused,
        _ => Verdict::Fatal,
    }
}

/// An error the database server sent, by backend.
fn database_error(error: &dyn sqlx::error::DatabaseError) -> Verdict {
    let verdict = if let Some(error) = error.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        postgres(error.code())
    } else if let Some(error) = error.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        mysql(error.number())
    } else if error
        .try_downcast_ref::<outbox_store::failover::ReadOnlyServer>()
        .is_some()
    {
        // Only read-only servers answered (a standby not promoted yet).
        Verdict::Transient(String::new())
    } else if error
        .try_downcast_ref::<sqlx::sqlite::SqliteError>()
        .is_some()
    {
        let code = error.code().and_then(|code| code.parse().ok());
        code.map_or(Verdict::Fatal, sqlite)
    } else {
        Verdict::Fatal
    };
    match verdict {
        Verdict::Transient(_) => {
            let code = error.code().unwrap_or_default();
            Verdict::Transient(format!("{} ({code})", error.message()))
        }
        other => other,
    }
}

/// PostgreSQL, by SQLSTATE (<https://www.postgresql.org/docs/current/errcodes-appendix.html>).
fn postgres(sqlstate: &str) -> Verdict {
    let class = sqlstate.get(..2).unwrap_or_default();
    match (class, sqlstate) {
        // connection_exception; insufficient_resources (too_many_connections, disk full).
        ("08" | "53", _)
        // admin_shutdown, crash_shutdown, cannot_connect_now (starting up, in recovery).
        | (_, "57P01" | "57P02" | "57P03")
        // read_only_sql_transaction: a standby not promoted yet.
        | (_, "25006")
        // serialization_failure, deadlock_detected, lock_not_available (lock_timeout,
        // NOWAIT), query_canceled (statement_timeout, a cancelled statement).
        | (_, "40001" | "40P01" | "55P03" | "57014") => Verdict::Transient(sqlstate.into()),
        // invalid_authorization_specification, invalid_password; invalid_catalog_name (no
        // such database); insufficient_privilege.
        ("28", _) | (_, "3D000" | "42501") => Verdict::Refused,
        _ => Verdict::Fatal,
    }
}

/// MySQL and MariaDB, by error number.
fn mysql(number: u16) -> Verdict {
    match number {
        // too many connections, server shutdown in progress, lock wait timeout, deadlock,
        // --read-only (1290, 1792, 1836: a replica not promoted yet), connection killed;
        // a statement interrupted (KILL QUERY), over MariaDB's max_statement_time or
        // MySQL's max_execution_time; a lock not had at once (NOWAIT).
        1040 | 1053 | 1205 | 1213 | 1290 | 1792 | 1836 | 1927 | 1317 | 1969 | 3024 | 3572 => {
            Verdict::Transient(number.to_string())
        }
        // access denied (to the database, for the user, with or without a password),
        // unknown database, a privilege missing.
        1044 | 1045 | 1049 | 1698 | 1142 | 1227 => Verdict::Refused,
        _ => Verdict::Fatal,
    }
}

/// SQLite, by (extended) result code.
fn sqlite(code: i32) -> Verdict {
    match code & 0xff {
        // SQLITE_BUSY, SQLITE_LOCKED: another process holds the database; SQLITE_CANTOPEN:
        // the file's directory does not exist (yet), e.g. a volume not mounted.
        5 | 6 | 14 => Verdict::Transient(code.to_string()),
        // SQLITE_AUTH; SQLITE_NOTADB: the URL names a file that is not a database.
        23 | 26 => Verdict::Refused,
        _ => Verdict::Fatal,
    }
}

fn amqp_error(error: &AmqpError) -> Verdict {
    match error {
        AmqpError::Connect { cause, .. } | AmqpError::Channel(cause) => lapin_error(cause),
        AmqpError::Declare { source, .. } => lapin_error(source),
        error @ (AmqpError::ConnectTimeout { .. } | AmqpError::Unavailable { .. }) => {
            Verdict::Transient(error.to_string())
        }
    }
}

fn lapin_error(error: &lapin::Error) -> Verdict {
    use lapin::ErrorKind;
    match error.kind() {
        ErrorKind::IOError(error) => io_error(error),
        ErrorKind::ProtocolError(error) => amqp_protocol(error),
        // The connection closed under a handshake or declaration in progress.
        ErrorKind::InvalidConnectionState(_)
        | ErrorKind::InvalidChannelState(..)
        | ErrorKind::MissingHeartbeatError => Verdict::Transient(error.to_string()),
        ErrorKind::AuthProviderError(_) | ErrorKind::InvalidProtocolVersion(_) => Verdict::Refused,
        _ => Verdict::Fatal,
    }
}

/// RabbitMQ's reply codes (AMQP 0-9-1 constants).
fn amqp_protocol(error: &AMQPError) -> Verdict {
    match error.get_id() {
        // CONNECTION_FORCED (the broker stops, or is in maintenance), RESOURCE_ERROR,
        // INTERNAL_ERROR.
        320 | 506 | 541 => Verdict::Transient(error.get_message().to_string()),
        // ACCESS_REFUSED (credentials, permissions), NOT_FOUND, PRECONDITION_FAILED (an
        // exchange of another type), INVALID_PATH, NOT_ALLOWED (unknown vhost).
        403 | 404 | 406 | 402 | 530 => Verdict::Refused,
        _ => Verdict::Fatal,
    }
}

fn io_error(error: &io::Error) -> Verdict {
    use io::ErrorKind::*;
    let transient = match error.kind() {
        ConnectionRefused | ConnectionReset | ConnectionAborted | NotConnected | BrokenPipe
        | TimedOut | UnexpectedEof | AddrNotAvailable | HostUnreachable | NetworkUnreachable
        | NetworkDown | Interrupted | WouldBlock => true,
        // rustls reports a rejected certificate as invalid data.
        InvalidData => return Verdict::Refused,
        // The standard library's resolver (getaddrinfo): the name does not resolve yet,
        // as in a container whose peer's name appears once that peer started.
        _ => error
            .to_string()
            .contains("failed to lookup address information"),
    };
    if transient {
        Verdict::Transient(error.to_string())
    } else {
        Verdict::Fatal
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};

    /// `cause` as `outbox_store::connect` returns it, with the context `startup` adds.
    fn connect_error(cause: sqlx::Error) -> anyhow::Error {
        anyhow::Error::new(outbox_store::Error::Database(DbErr::Conn(
            RuntimeErr::SqlxError(cause),
        )))
        .context("outbox room_outbox: cannot connect to the database at postgres://db/app")
    }

    fn io(kind: io::ErrorKind) -> io::Error {
        io::Error::from(kind)
    }

    fn transient(verdict: Verdict) -> String {
        match verdict {
            Verdict::Transient(reason) => reason,
            other => panic!("expected transient, got {other:?}"),
        }
    }

    #[test]
    fn a_database_that_refuses_resets_or_is_not_resolvable_yet_is_waited_for() {
        for kind in [
            io::ErrorKind::ConnectionRefused,
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::UnexpectedEof,
            io::ErrorKind::TimedOut,
        ] {
            let reason = transient(classify(&connect_error(sqlx::Error::Io(io(kind)))));
            assert_eq!(reason, io(kind).to_string());
        }
        // std's text when getaddrinfo fails (its kind cannot be named on stable Rust).
        let dns = io::Error::other(
            "failed to lookup address information: Temporary failure in name resolution",
        );
        let reason = transient(classify(&connect_error(sqlx::Error::Io(dns))));
        assert!(reason.contains("name resolution"), "{reason}");
    }

    #[test]
    fn sqlx_giving_up_on_a_refusing_server_is_waited_for() {
        let reason = transient(classify(&connect_error(sqlx::Error::PoolTimedOut)));
        assert!(reason.contains("connect timeout"), "{reason}");
        let acquire = anyhow::Error::new(outbox_store::Error::Database(DbErr::ConnectionAcquire(
            ConnAcquireErr::Timeout,
        )));
        transient(classify(&acquire));
    }

    #[test]
    fn postgres_starting_up_in_recovery_or_full_is_waited_for_and_a_bad_login_is_refused() {
        for sqlstate in ["57P03", "57P01", "53300", "08006", "25006", "40001"] {
            transient(postgres(sqlstate));
        }
        // 28P01 invalid_password, 28000 no pg_hba entry / no such role, 3D000 no database.
        for sqlstate in ["28P01", "28000", "3D000", "42501"] {
            assert_eq!(postgres(sqlstate), Verdict::Refused, "{sqlstate}");
        }
        assert_eq!(postgres("42P01"), Verdict::Fatal, "undefined_table");
    }

    #[test]
    fn a_pool_that_found_only_read_only_servers_is_waited_for() {
        let refused = outbox_store::failover::ReadOnlyServer::new(
            "the server is in recovery (a standby): it takes no writes",
        );
        let error = connect_error(sqlx::Error::Database(Box::new(refused)));
        let reason = transient(classify(&error));
        assert!(
            reason.contains("standby") && !reason.contains("25006"),
            "{reason}"
        );
    }

    #[test]
    fn mysql_busy_or_read_only_is_waited_for_and_access_denied_is_refused() {
        for number in [1040, 1053, 1205, 1213, 1290, 1836] {
            transient(mysql(number));
        }
        for number in [1045, 1044, 1049, 1698] {
            assert_eq!(mysql(number), Verdict::Refused, "{number}");
        }
        assert_eq!(mysql(1146), Verdict::Fatal, "no such table");
    }

    #[test]
    fn sqlite_locked_or_without_its_directory_is_waited_for() {
        // SQLITE_BUSY, SQLITE_BUSY_RECOVERY, SQLITE_LOCKED, SQLITE_CANTOPEN.
        for code in [5, 261, 6, 14] {
            transient(sqlite(code));
        }
        assert_eq!(sqlite(26), Verdict::Refused, "not a database");
        assert_eq!(sqlite(1), Verdict::Fatal);
    }

    fn broker_error(kind: lapin::ErrorKind) -> anyhow::Error {
        anyhow::Error::new(AmqpError::Connect {
            url: "amqp://guest:***@mq:5672/%2f".into(),
            cause: kind.into(),
        })
    }

    fn protocol(kind: AMQPErrorKind, message: &str) -> lapin::ErrorKind {
        lapin::ErrorKind::ProtocolError(AMQPError::new(kind, message.into()))
    }

    #[test]
    fn a_broker_that_refuses_or_stops_is_waited_for() {
        let refused = lapin::ErrorKind::IOError(io(io::ErrorKind::ConnectionRefused).into());
        transient(classify(&broker_error(refused)));
        let aborted = lapin::ErrorKind::IOError(io(io::ErrorKind::ConnectionAborted).into());
        transient(classify(&broker_error(aborted)));
        let stopping = protocol(
            AMQPErrorKind::Hard(AMQPHardError::CONNECTIONFORCED),
            "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'",
        );
        let reason = transient(classify(&broker_error(stopping)));
        assert!(reason.contains("shutdown"), "{reason}");
        let timeout = anyhow::Error::new(AmqpError::ConnectTimeout {
            url: "amqp://mq".into(),
            after: std::time::Duration::from_secs(3),
        });
        transient(classify(&timeout));
    }

    #[test]
    fn a_broker_refusing_the_login_the_vhost_the_certificate_or_the_exchange_is_refused() {
        let login = protocol(
            AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED),
            "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For \
             details see the broker logfile.",
        );
        let vhost = protocol(
            AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED),
            "NOT_ALLOWED - vhost nowhere not found",
        );
        let certificate = lapin::ErrorKind::IOError(
            io::Error::new(
                io::ErrorKind::InvalidData,
                "invalid peer certificate: UnknownIssuer",
            )
            .into(),
        );
        for kind in [login, vhost, certificate] {
            assert_eq!(classify(&broker_error(kind)), Verdict::Refused);
        }
        let declare = anyhow::Error::new(AmqpError::Declare {
            exchange: "room.events".into(),
            kind: "direct".into(),
            source: protocol(
                AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED),
                "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'room.events' in \
                 vhost '/': received 'direct' but current is 'topic'",
            )
            .into(),
        });
        assert_eq!(classify(&declare), Verdict::Refused);
    }

    #[test]
    fn postgres_deadlocks_serialization_failures_and_lock_or_statement_timeouts_are_retried() {
        // serialization_failure, deadlock_detected, lock_not_available (lock_timeout),
        // query_canceled (statement_timeout), connection_failure, admin_shutdown.
        for sqlstate in [
            "40001", "40P01", "55P03", "57014", "08006", "08003", "57P01",
        ] {
            assert_eq!(transient(postgres(sqlstate)), sqlstate);
        }
        // unique_violation, syntax_error, undefined_column: a retry changes nothing.
        for sqlstate in ["23505", "42601", "42703"] {
            assert_eq!(postgres(sqlstate), Verdict::Fatal, "{sqlstate}");
        }
    }

    #[test]
    fn mysql_deadlocks_lock_wait_timeouts_and_interrupted_statements_are_retried() {
        // deadlock (SQLSTATE 40001), lock wait timeout, interrupted (KILL QUERY), MariaDB's
        // max_statement_time, MySQL's max_execution_time, NOWAIT, connection killed.
        for number in [1213, 1205, 1317, 1969, 3024, 3572, 1927] {
            assert_eq!(transient(mysql(number)), number.to_string());
        }
        // duplicate entry, syntax error, unknown column.
        for number in [1062, 1064, 1054] {
            assert_eq!(mysql(number), Verdict::Fatal, "{number}");
        }
    }

    #[test]
    fn sqlite_busy_and_locked_are_retried_with_their_extended_codes() {
        // SQLITE_BUSY, SQLITE_BUSY_RECOVERY, SQLITE_BUSY_SNAPSHOT, SQLITE_BUSY_TIMEOUT,
        // SQLITE_LOCKED, SQLITE_LOCKED_SHAREDCACHE.
        for code in [5, 261, 517, 773, 6, 262] {
            assert_eq!(transient(sqlite(code)), code.to_string());
        }
        // SQLITE_CONSTRAINT_UNIQUE, SQLITE_READONLY: not a lock.
        for code in [2067, 8] {
            assert_eq!(sqlite(code), Verdict::Fatal, "{code}");
        }
    }

    /// A real SQLITE_BUSY from sqlx: a write while another connection holds the database
    /// in an exclusive transaction, with no busy timeout to wait it out.
    #[actix_rt::test]
    async fn a_busy_sqlite_database_as_sqlx_reports_it_is_retried() {
        use sea_orm::sqlx::sqlite::SqliteConnectOptions;
        use sea_orm::sqlx::{ConnectOptions as _, Executor as _};
        let dir = std::env::temp_dir().join(format!("classify-busy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let options = SqliteConnectOptions::new()
            .filename(dir.join("busy.db"))
            .create_if_missing(true)
            .busy_timeout(std::time::Duration::ZERO);
        let mut holder = options.connect().await.unwrap();
        let mut writer = options.connect().await.unwrap();
        holder
            .execute("CREATE TABLE IF NOT EXISTS t (id INTEGER)")
            .await
            .unwrap();
        holder.execute("BEGIN EXCLUSIVE").await.unwrap();
        let busy = writer
            .execute("INSERT INTO t (id) VALUES (1)")
            .await
            .unwrap_err();
        let error = anyhow::Error::new(outbox_store::Error::Database(DbErr::Exec(
            RuntimeErr::SqlxError(busy),
        )))
        .context("outbox room_outbox");
        let reason = transient(classify(&error));
        assert!(reason.contains("(5)"), "{reason}");
        holder.execute("ROLLBACK").await.unwrap();
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_lost_connection_mid_statement_is_retried() {
        for kind in [
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::ConnectionAborted,
            io::ErrorKind::BrokenPipe,
            io::ErrorKind::UnexpectedEof,
        ] {
            let error = anyhow::Error::new(outbox_store::Error::Database(DbErr::Query(
                RuntimeErr::SqlxError(sqlx::Error::Io(io(kind))),
            )));
            transient(classify(&error));
        }
        let closed = anyhow::Error::new(outbox_store::Error::Database(DbErr::ConnectionAcquire(
            ConnAcquireErr::ConnectionClosed,
        )));
        transient(classify(&closed));
    }

    #[test]
    fn the_node_lock_taken_is_refused_and_its_lost_connection_retried() {
        let taken = anyhow::Error::new(outbox_store::Error::NodeTaken(
            "node_id \"n1\" is in use on table outbox".into(),
        ));
        assert_eq!(classify(&taken), Verdict::Refused);
        let reset = anyhow::Error::new(outbox_store::Error::Database(DbErr::Conn(
            RuntimeErr::SqlxError(sqlx::Error::Io(io(io::ErrorKind::ConnectionReset))),
        )))
        .context("outbox orders: cannot take the lock of node_id \"n1\"");
        transient(classify(&reset));
    }

    #[test]
    fn columns_that_cannot_be_read_are_refused_unless_a_retry_can_fix_the_read() {
        let table = outbox_store::TableName::parse("room_outbox").unwrap();
        let unreadable = |cause: DbErr| outbox_store::Error::Unreadable {
            table: table.clone(),
            reason: cause.to_string(),
            cause,
        };
        let syntax = unreadable(DbErr::Custom("syntax error at or near \"key\"".into()));
        assert_eq!(store_error(&syntax), Verdict::Refused);
        let reset = unreadable(DbErr::Query(RuntimeErr::SqlxError(sqlx::Error::Io(io(
            io::ErrorKind::ConnectionReset,
        )))));
        transient(store_error(&reset));
    }

    #[test]
    fn a_mapping_problem_is_refused_and_a_missing_table_is_fatal() {
        let mapping = anyhow::Error::new(ConfigProblem("outbox orders: columns.key".into()));
        assert_eq!(classify(&mapping), Verdict::Refused);
        let table = outbox_store::TableName::parse("room_outbox").unwrap();
        let missing = anyhow::Error::new(outbox_store::Error::NoTable(table));
        assert_eq!(classify(&missing), Verdict::Fatal);
        assert_eq!(classify(&anyhow::anyhow!("something else")), Verdict::Fatal);
    }
}
