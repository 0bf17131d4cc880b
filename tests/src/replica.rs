//! Database servers a test owns, for failovers: a PostgreSQL 15 primary with a streaming
//! standby ([`PgPair`]), and a MariaDB server of its own ([`MariaServer`]), whose global
//! `read_only` the test may flip. Each lives in a temporary directory on free loopback
//! ports and is stopped and removed on drop, also when the test fails.

use crate::relay::{succeeds_quietly_within, ChildGuard, OutputInTime as _};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// The longest a server's stop may take in teardown (`pg_ctl -m immediate`, a kill).
const STOP_DEADLINE: Duration = Duration::from_secs(30);

/// A loopback port free right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// Runs `program args` as `user` (PostgreSQL and MariaDB refuse to run as root); panics
/// with its output when it fails.
fn run_as(user: &str, program: &str, args: &[&str]) {
    let output = Command::new("runuser")
        .args(["-u", user, "--", program])
        .args(args)
        .stdin(Stdio::null())
        .output_in_time()
        .unwrap_or_else(|error| panic!("{program}: {error}"));
    assert!(
        output.status.success(),
        "{program} {args:?}: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A fresh directory owned by `user`.
fn owned_dir(prefix: &str, user: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(crate::unique_name(prefix));
    std::fs::create_dir_all(&dir).expect("temporary directory");
    let output = Command::new("chown")
        .args([user, &dir.display().to_string()])
        .output_in_time()
        .expect("chown runs");
    assert!(
        output.status.success(),
        "chown {user} {}: {}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    dir
}

/// A PostgreSQL 15 primary and its streaming standby (`pg_basebackup -R`), trust
/// authentication for `postgres` on the loopback network.
pub struct PgPair {
    dir: PathBuf,
    /// The primary's address (the writable server, until a promotion).
    pub primary: SocketAddr,
    /// The standby's address (read-only, in recovery, until promoted).
    pub standby: SocketAddr,
}

impl PgPair {
    /// Creates and starts both on 127.0.0.1, on free ports (about two seconds).
    pub fn start() -> Self {
        let at = |port| SocketAddr::from(([127, 0, 0, 1], port));
        Self::start_at(at(free_port()), at(free_port()))
    }

    /// Both on PostgreSQL's default port, the primary on 127.0.0.2 and the standby on
    /// 127.0.0.3: two hosts of a URL's host list (`postgres://h1,h2/db`).
    pub fn start_apart() -> Self {
        Self::start_at(
            SocketAddr::from(([127, 0, 0, 2], 5432)),
            SocketAddr::from(([127, 0, 0, 3], 5432)),
        )
    }

    fn start_at(primary: SocketAddr, standby: SocketAddr) -> Self {
        let dir = owned_dir("pg_pair", "postgres");
        let pair = Self {
            primary,
            standby,
            dir,
        };
        let primary = pair.data("primary");
        run_as(
            "postgres",
            &format!("{PG_BIN}/initdb"),
            &[
                "-D",
                &primary,
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
                "-E",
                "UTF8",
            ],
        );
        // Clients and the standby may come from any loopback address.
        let hba = format!("{primary}/pg_hba.conf");
        let mut rules = std::fs::read_to_string(&hba).expect("pg_hba.conf");
        rules.push_str("host all all 127.0.0.0/8 trust\nhost replication all 127.0.0.0/8 trust\n");
        std::fs::write(&hba, rules).expect("pg_hba.conf written");
        pair.pg_ctl_start("primary", pair.primary);
        run_as(
            "postgres",
            &format!("{PG_BIN}/pg_basebackup"),
            &[
                "-h",
                &pair.primary.ip().to_string(),
                "-p",
                &pair.primary.port().to_string(),
                "-U",
                "postgres",
                "-D",
                &pair.data("standby"),
                "-R",
                "-X",
                "stream",
            ],
        );
        pair.pg_ctl_start("standby", pair.standby);
        pair
    }

    fn data(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    fn pg_ctl_start(&self, name: &str, at: SocketAddr) {
        // A socket directory of its own (not the data directory, which the standby's
        // base backup copies with its lock files): both may listen on the same port.
        let sockets = self
            .dir
            .join(format!("{name}-sockets"))
            .display()
            .to_string();
        run_as("postgres", "mkdir", &["-p", &sockets]);
        let options = format!(
            "-p {} -c listen_addresses={} -c unix_socket_directories={} -c fsync=off \
             -c synchronous_commit=off",
            at.port(),
            at.ip(),
            sockets
        );
        let log = self.dir.join(format!("{name}.log")).display().to_string();
        run_as(
            "postgres",
            &format!("{PG_BIN}/pg_ctl"),
            &[
                "-D",
                &self.data(name),
                "-l",
                &log,
                "-o",
                &options,
                "-w",
                "start",
            ],
        );
    }

    /// The URL of the server at `at` (database `postgres`).
    pub fn url(at: SocketAddr) -> String {
        format!("postgres://postgres@{at}/postgres")
    }

    /// Runs each of `statements` (own transactions, one session) as `postgres` on the
    /// server at `at`, with `psql`; panics when one fails.
    pub fn sql(at: SocketAddr, statements: &[&str]) {
        let mut psql = Command::new(format!("{PG_BIN}/psql"));
        psql.args(["-h", &at.ip().to_string(), "-p", &at.port().to_string()])
            .args(["-U", "postgres"])
            .args(["-d", "postgres", "-v", "ON_ERROR_STOP=1", "-q"]);
        for statement in statements {
            psql.args(["-c", statement]);
        }
        let output = psql.output_in_time().expect("psql runs");
        assert!(
            output.status.success(),
            "{statements:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Creates `role` on the primary, allowed to log in there from the loopback network
    /// with `password` only (scram-sha-256, ahead of the trust rules; other roles keep
    /// trust), and reloads the configuration. The standby is left as it is.
    pub fn require_password(&self, role: &str, password: &str) {
        let quoted = password.replace('\'', "''");
        Self::sql(
            self.primary,
            &[
                "SET password_encryption = 'scram-sha-256'",
                &format!("CREATE ROLE {role} LOGIN PASSWORD '{quoted}'"),
            ],
        );
        let hba = format!("{}/pg_hba.conf", self.data("primary"));
        let rules = std::fs::read_to_string(&hba).expect("pg_hba.conf");
        let rule = format!("host all {role} 127.0.0.0/8 scram-sha-256\n");
        std::fs::write(&hba, rule + &rules).expect("pg_hba.conf written");
        Self::sql(self.primary, &["SELECT pg_reload_conf()"]);
    }

    /// Stops the primary (`fast`: its last WAL reaches the standby first).
    pub fn stop_primary(&self) {
        run_as(
            "postgres",
            &format!("{PG_BIN}/pg_ctl"),
            &["-D", &self.data("primary"), "-m", "fast", "-w", "stop"],
        );
    }

    /// Promotes the standby and waits until it takes writes.
    pub fn promote_standby(&self) {
        run_as(
            "postgres",
            &format!("{PG_BIN}/pg_ctl"),
            &["-D", &self.data("standby"), "-w", "promote"],
        );
    }
}

impl Drop for PgPair {
    fn drop(&mut self) {
        for name in ["standby", "primary"] {
            succeeds_quietly_within(
                Command::new("runuser")
                    .args(["-u", "postgres", "--", &format!("{PG_BIN}/pg_ctl")])
                    .args(["-D", &self.data(name), "-m", "immediate", "-w", "stop"]),
                STOP_DEADLINE,
            );
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A MariaDB server of the test's own (its own datadir, port and socket), with a database
/// `relay`, a user `relay` (password `relay`) without SUPER or READ_ONLY ADMIN, as an
/// application's user is (`read_only` applies to it), and a user `admin` (password
/// `admin`) with every privilege.
pub struct MariaServer {
    dir: PathBuf,
    /// Its port.
    pub port: u16,
    /// `runuser … mariadbd`, killed on drop.
    child: ChildGuard,
}

impl MariaServer {
    /// Initialises and starts it (a few seconds); waits until it answers.
    pub fn start() -> Self {
        let dir = owned_dir("mariadb", "mysql");
        let data = dir.join("data").display().to_string();
        run_as(
            "mysql",
            "mariadb-install-db",
            &[
                &format!("--datadir={data}"),
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
            ],
        );
        let port = free_port();
        let socket = dir.join("mysqld.sock").display().to_string();
        let child = Command::new("runuser")
            .args(["-u", "mysql", "--", "mariadbd", "--no-defaults"])
            .arg(format!("--datadir={data}"))
            .arg(format!("--port={port}"))
            .arg(format!("--socket={socket}"))
            .arg(format!("--pid-file={}", dir.join("mysqld.pid").display()))
            .args([
                "--bind-address=127.0.0.1",
                "--skip-name-resolve",
                "--innodb-flush-log-at-trx-commit=0",
                "--innodb-buffer-pool-size=32M",
                "--skip-log-bin",
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("mysqld.log")).expect("log file"))
            .spawn()
            .expect("mariadbd starts");
        let server = Self {
            dir,
            port,
            child: ChildGuard(child),
        };
        let until = std::time::Instant::now() + Duration::from_secs(30);
        while !server.sql_ok("SELECT 1") {
            assert!(
                std::time::Instant::now() < until,
                "mariadbd did not answer within 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server.sql(
            "CREATE DATABASE relay; CREATE USER relay@'127.0.0.1' IDENTIFIED BY 'relay'; \
             GRANT ALL ON relay.* TO relay@'127.0.0.1'; \
             CREATE USER admin@'127.0.0.1' IDENTIFIED BY 'admin'; \
             GRANT ALL ON *.* TO admin@'127.0.0.1'",
        );
        server
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("mysqld.sock")
    }

    fn sql_ok(&self, sql: &str) -> bool {
        Command::new("mariadb")
            .args(["--no-defaults", "-uroot", "-S"])
            .arg(self.socket())
            .args(["-e", sql])
            .output_in_time()
            .is_ok_and(|output| output.status.success())
    }

    /// Runs `sql` as root; panics when it fails.
    pub fn sql(&self, sql: &str) {
        assert!(self.sql_ok(sql), "{sql}");
    }

    /// The relay user's URL.
    pub fn url(&self) -> String {
        format!("mysql://relay:relay@127.0.0.1:{}/relay", self.port)
    }

    /// An administrator's URL (all privileges: writes even while `read_only` is set).
    pub fn admin_url(&self) -> String {
        format!("mysql://admin:admin@127.0.0.1:{}/relay", self.port)
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }
}

impl Drop for MariaServer {
    fn drop(&mut self) {
        let _ = self.child.0.kill();
        let _ = self.child.0.wait();
        // runuser's child, mariadbd, may outlive runuser: stop it by its pid file.
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("mysqld.pid")) {
            succeeds_quietly_within(
                Command::new("kill").arg("-9").arg(pid.trim()),
                STOP_DEADLINE,
            );
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
