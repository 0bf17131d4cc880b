//! Support for the end-to-end tests: real services, a fresh table and exchange per test,
//! seeding, consuming, and waiting for conditions with deadlines.
//!
//! Services are found through `OUTBOX_TEST_DATABASE_URL` (PostgreSQL),
//! `OUTBOX_TEST_MYSQL_URL` (MySQL/MariaDB) and `OUTBOX_TEST_AMQP_URL` (RabbitMQ), which
//! default to the local services. A service that is missing fails the test with a message
//! saying how to start it.

pub mod broker;
pub mod database;
pub mod events;
pub mod proxy;
pub mod tls_proxy;

pub use broker::{Received, TestBroker};
pub use database::{Backend, TestDatabase};
pub use events::{room_events, seed};
pub use proxy::FaultProxy;
pub use tls_proxy::{TestCa, TlsProxy};

use outbox_cli::settings::{Config, Settings};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// A name no other test (or earlier run) uses: `prefix_<pid>_<n>_<millis>`.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let millis = chrono::Utc::now().timestamp_millis() % 100_000_000;
    format!("{prefix}_{}_{n}_{millis}", std::process::id())
}

/// Waits until `condition` returns true, polling; panics with `what` after `deadline`.
pub async fn eventually<F, Fut>(what: &str, deadline: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = tokio::time::Instant::now() + deadline;
    loop {
        if condition().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "timed out after {deadline:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Settings for a relay on `database` and `broker`, fast enough for tests, adjusted by
/// `adjust`, then validated as the binary would.
pub fn test_settings(
    database: &TestDatabase,
    broker: &TestBroker,
    adjust: impl FnOnce(&mut Settings),
) -> Settings {
    let mut settings = Settings::default();
    settings.database.url = database.url.clone();
    settings.database.table = database.table.as_str().to_owned();
    settings.database.migrate_on_start = false;
    settings.amqp.url = broker.url.clone();
    settings.amqp.exchange = broker.exchange.clone();
    settings.relay.node_id = unique_name("node");
    settings.relay.poll_interval = "100ms".into();
    settings.relay.publish_timeout = "3s".into();
    settings.metrics.listen = "".into();
    adjust(&mut settings);
    settings
}

/// [`test_settings`], validated.
pub fn test_config(
    database: &TestDatabase,
    broker: &TestBroker,
    adjust: impl FnOnce(&mut Settings),
) -> Config {
    test_settings(database, broker, adjust)
        .validate()
        .unwrap_or_else(|errors| panic!("test settings are invalid: {errors:?}"))
}

/// The settings as `OUTBOX_RELAY__…` variables, for running the binary.
pub fn settings_env(settings: &Settings) -> Vec<(String, String)> {
    let value = serde_json::to_value(settings).expect("settings serialise");
    let mut env = Vec::new();
    for (section, keys) in value.as_object().expect("an object") {
        for (key, value) in keys.as_object().expect("sections are objects") {
            let text = match value {
                serde_json::Value::String(text) => text.clone(),
                serde_json::Value::Array(items) if items.is_empty() => continue,
                other => other.to_string(),
            };
            env.push((
                format!(
                    "OUTBOX_RELAY__{}__{}",
                    section.to_uppercase(),
                    key.to_uppercase()
                ),
                text,
            ));
        }
    }
    env
}

/// A relay running in the test's own actix system, as `outbox-relay run` would run it.
pub struct InProcessRelay {
    relay: outbox_relay::Relay,
    broker: outbox_amqp::Broker,
}

impl InProcessRelay {
    /// Connects and starts the relay described by `config`.
    pub async fn start(config: &Config) -> Self {
        let store = outbox_cli::startup::open_store(config, false)
            .await
            .expect("store opens");
        let broker = outbox_cli::startup::open_broker(config)
            .await
            .expect("broker connects");
        let relay = outbox_cli::startup::start_relay(config, &store, &broker)
            .await
            .expect("relay starts");
        Self { relay, broker }
    }

    /// Graceful shutdown, as on SIGTERM.
    pub async fn stop(self) {
        self.relay.shutdown().await.expect("graceful shutdown");
        self.broker.close().await;
    }
}

/// Runs the relay `binary` with `settings` in its environment (no config file) and waits.
pub fn run_binary(binary: &str, settings: &Settings, args: &[&str]) -> std::process::Output {
    std::process::Command::new(binary)
        .args(["--config", "/dev/null"])
        .args(args)
        .envs(settings_env(settings))
        .output()
        .expect("the relay binary runs")
}

/// An `outbox-relay run` process, its log in a temporary file.
pub struct RelayProcess {
    child: std::process::Child,
    /// Where its stderr goes.
    pub log: std::path::PathBuf,
}

impl RelayProcess {
    /// Starts `binary run` with `settings` in its environment.
    pub fn spawn(binary: &str, settings: &Settings) -> Self {
        let log =
            std::env::temp_dir().join(format!("{}.log", unique_name(&settings.relay.node_id)));
        let child = std::process::Command::new(binary)
            .args(["--config", "/dev/null", "run"])
            .envs(settings_env(settings))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("relay starts");
        Self { child, log }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (`TERM`, `KILL`, …).
    pub fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Waits for the exit, at most `deadline`; panics with the log otherwise.
    pub async fn wait(&mut self, deadline: Duration) -> std::process::ExitStatus {
        let until = std::time::Instant::now() + deadline;
        loop {
            if let Some(status) = self.child.try_wait().expect("child status") {
                return status;
            }
            if std::time::Instant::now() > until {
                let _ = self.child.kill();
                panic!(
                    "relay did not exit within {deadline:?}; its log:\n{}",
                    self.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// SIGTERM, then expects exit code 0 within `deadline`.
    pub async fn stop(mut self, deadline: Duration) {
        self.signal("TERM");
        let status = self.wait(deadline).await;
        assert!(
            status.success(),
            "exit status {status:?}; log:\n{}",
            self.log_text()
        );
        let _ = std::fs::remove_file(&self.log);
    }

    /// What it logged.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Checks that, per room, the first delivery of each event arrives in id order; returns
/// the number of duplicate deliveries.
pub fn assert_room_order(received: &[Received]) -> usize {
    let mut seen = std::collections::HashSet::new();
    let mut last: std::collections::HashMap<String, (i64, String)> =
        std::collections::HashMap::new();
    let mut duplicates = 0;
    for message in received {
        if !seen.insert(message.message_id.clone()) {
            duplicates += 1;
            continue;
        }
        let room = message.header("room_id").expect("room_id header");
        let id = message.int_header("outbox_id").expect("outbox_id header");
        let node = message.header("node_id").unwrap_or_default();
        if let Some((previous, by)) = last.insert(room.clone(), (id, node.clone())) {
            assert!(
                previous < id,
                "room {room}: event {id} (from {node}) arrived after {previous} (from {by})"
            );
        }
    }
    duplicates
}

/// Checks that every one of `events` was delivered at least once and that each room's
/// first deliveries came in id order; returns the number of duplicate deliveries.
pub fn assert_every_event_delivered(
    received: &[Received],
    events: &[outbox_store::NewEvent],
) -> usize {
    let duplicates = assert_room_order(received);
    let distinct: std::collections::HashSet<&str> =
        received.iter().map(|r| r.message_id.as_str()).collect();
    for event in events {
        assert!(
            distinct.contains(event.event_id.as_str()),
            "{} lost",
            event.event_id
        );
    }
    duplicates
}
