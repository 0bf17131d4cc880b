//! Where the test services are (`OUTBOX_TEST_*_URL`, by default the local ones), how to
//! reach them through a proxy, the one margin a loaded machine gets on a documented time
//! bound, and what a test does when its environment cannot run it.

use crate::Backend;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

/// The slack a loaded machine gets on top of a documented time bound (the tests run in
/// parallel, beside 10k–30k-event drains, on two shared cores). Used by every test that
/// asserts a bound, never chosen per test: a test asserts `bound + MARGIN` and says so
/// when it needed the margin ([`assert_within`]).
pub const MARGIN: Duration = Duration::from_secs(3);

/// The bound the tests read into the docs' "at once" for a command that fails or answers
/// without waiting (a refused login, a port nobody listens on, `--offline`): a process
/// start, a connection and an answer. Asserted with [`assert_within`], as any bound.
pub const AT_ONCE: Duration = Duration::from_secs(2);

/// `bound + MARGIN`: the longest a test waits for something the docs promise within `bound`.
pub fn within(bound: Duration) -> Duration {
    bound + MARGIN
}

/// Asserts that `took` is within the documented `bound` plus [`MARGIN`]; notes on stderr
/// when it needed the margin, so a slow trend shows in the output before it fails.
pub fn assert_within(what: &str, took: Duration, bound: Duration) {
    assert!(
        took <= within(bound),
        "{what}: took {took:?}, the documented bound is {bound:?} (+ {MARGIN:?} for a loaded machine)"
    );
    if took > bound {
        eprintln!(
            "note: {what}: took {took:?}, over the documented {bound:?} but within the margin"
        );
    }
}

/// The PostgreSQL or MySQL/MariaDB server of the tests: `OUTBOX_TEST_DATABASE_URL` or
/// `OUTBOX_TEST_MYSQL_URL`, by default the local one.
pub fn database_url(backend: Backend) -> String {
    match backend {
        Backend::Postgres => std::env::var("OUTBOX_TEST_DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into()),
        Backend::MySql => std::env::var("OUTBOX_TEST_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into()),
        Backend::Sqlite => panic!("SQLite has no server: a test makes its own file"),
    }
}

/// The RabbitMQ of the tests: `OUTBOX_TEST_AMQP_URL`, by default the local one.
pub fn amqp_url() -> String {
    std::env::var("OUTBOX_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// A command named by the environment variable `variable` (a program and its first
/// arguments, split at whitespace), or `default` where it is unset or empty.
fn command_from_env(variable: &str, default: &str) -> std::process::Command {
    let named = std::env::var(variable).unwrap_or_default();
    let mut words = named.split_whitespace();
    match words.next() {
        Some(program) => {
            let mut command = std::process::Command::new(program);
            command.args(words);
            command
        }
        None => std::process::Command::new(default),
    }
}

/// `rabbitmqctl` for the test broker, arguments to follow: `OUTBOX_TEST_RABBITMQCTL`
/// (`scripts/rabbitmq4 ctl` for the RabbitMQ 4 node of `scripts/rabbitmq4`), by default
/// the `rabbitmqctl` on the PATH, which the machine's broker answers. Users, permissions
/// and alarms must be set on the broker the tests publish to.
pub fn rabbitmqctl_command() -> std::process::Command {
    command_from_env("OUTBOX_TEST_RABBITMQCTL", "rabbitmqctl")
}

/// `rabbitmq-server` for the nodes a test starts of its own ([`crate::rabbit_cluster`]),
/// arguments and `RABBITMQ_*` variables to follow: `OUTBOX_TEST_RABBITMQ_SERVER`
/// (`scripts/rabbitmq4 server`), run as is; `None` where it is unset, for the machine's
/// own. Its nodes must share the Erlang cookie of [`rabbitmqctl_command`].
pub fn rabbitmq_server_command() -> Option<std::process::Command> {
    std::env::var("OUTBOX_TEST_RABBITMQ_SERVER")
        .is_ok_and(|named| !named.trim().is_empty())
        .then(|| command_from_env("OUTBOX_TEST_RABBITMQ_SERVER", "rabbitmq-server"))
}

/// The address of the server `url` names (its host resolved, its port or the scheme's).
pub fn server_of(url: &str) -> SocketAddr {
    let parsed = url::Url::parse(url).unwrap_or_else(|error| panic!("{url}: {error}"));
    let host = parsed.host_str().expect("a URL with a host").to_owned();
    let port = parsed.port().unwrap_or(match parsed.scheme() {
        "postgres" | "postgresql" => 5432,
        "mysql" | "mariadb" => 3306,
        "amqps" => 5671,
        _ => 5672,
    });
    (host.trim_matches(['[', ']']), port)
        .to_socket_addrs()
        .unwrap_or_else(|error| panic!("{url}: cannot resolve {host}: {error}"))
        .next()
        .unwrap_or_else(|| panic!("{url}: {host} has no address"))
}

/// `url` pointed at `address` (a proxy in front of its server) instead of its server.
pub fn through(address: SocketAddr, url: &str) -> String {
    let mut url = url::Url::parse(url).expect("a URL");
    url.set_ip_host(address.ip()).expect("a host");
    url.set_port(Some(address.port())).expect("a port");
    url.into()
}

/// `url` with its user (and password) replaced, for a login the server refuses.
pub fn with_user(url: &str, user: &str, password: Option<&str>) -> String {
    let mut url = url::Url::parse(url).expect("a URL");
    url.set_username(user).expect("a user");
    url.set_password(password).expect("a password");
    url.into()
}

/// `url` with its path (the database, or the vhost) replaced.
pub fn with_path(url: &str, path: &str) -> String {
    let mut url = url::Url::parse(url).expect("a URL");
    url.set_path(path);
    url.into()
}

/// A test the environment cannot run (a tool missing, a remote broker): outside CI it
/// says it is skipped and how to enable it; where `CI` is set, a skip fails the test, so
/// CI never passes a test that did not run.
pub fn skip(test: &str, why: &str, how_to_enable: &str) {
    if std::env::var_os("CI").is_some_and(|ci| !ci.is_empty()) {
        panic!("{test} cannot run ({why}), and CI (the CI variable is set) runs every test: {how_to_enable}");
    }
    eprintln!("SKIPPED {test}: {why}; to run it: {how_to_enable}");
}

/// Teardown after a failed test: runs `work` (deleting what `what` names) on a thread and
/// runtime of its own, off the test's runtime (which may be unwinding), bounded by 10 s;
/// logs a failure instead of panicking, so the failed test keeps its own message.
pub fn cleanup_off_runtime<F>(what: String, work: impl FnOnce() -> F + Send + 'static)
where
    F: std::future::Future<Output = Result<(), String>>,
{
    let label = what.clone();
    let cleanup = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            match tokio::time::timeout(Duration::from_secs(10), work()).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => eprintln!("teardown: {what} not removed: {error}"),
                Err(_) => eprintln!("teardown: {what} not removed within 10 s"),
            }
        });
    });
    if cleanup.join().is_err() {
        eprintln!("teardown: removing {label} of a failed test panicked");
    }
}

/// An address of this machine that is not loopback (the one it would send from), for a
/// proxy that a relay must take for another host. Fails, saying why, on a machine with
/// none.
pub fn non_loopback_address() -> std::net::IpAddr {
    // Connecting a UDP socket sends nothing: it only picks the outgoing interface.
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").expect("a UDP socket binds");
    let address = socket
        .connect("192.0.2.1:9")
        .and_then(|()| socket.local_addr())
        .map(|address| address.ip());
    match address {
        Ok(address) if !address.is_loopback() && !address.is_unspecified() => address,
        other => panic!(
            "this test needs a network interface besides loopback (found {other:?}): run it \
             on a machine with one"
        ),
    }
}
