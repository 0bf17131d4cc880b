//! The relay under test: in this test's actix system, or as the real binary in a process
//! of its own (signals, exit codes, logs, the metrics endpoint).

use crate::unique_name;
use outbox_cli::settings::{Config, Settings};
use std::time::Duration;

/// The settings as `OUTBOX_RELAY__…` variables, for running the binary.
pub fn settings_env(settings: &Settings) -> Vec<(String, String)> {
    let value = serde_json::to_value(settings).expect("settings serialise");
    let mut env = Vec::new();
    for (section, keys) in value.as_object().expect("an object") {
        for (key, value) in keys.as_object().expect("sections are objects") {
            let name = format!(
                "OUTBOX_RELAY__{}__{}",
                section.to_uppercase(),
                key.to_uppercase()
            );
            // A table inside a section (`[database.columns]`): a variable per key.
            if let serde_json::Value::Object(inner) = value {
                for (inner_key, value) in inner {
                    env.push((
                        format!("{name}__{}", inner_key.to_uppercase()),
                        env_text(value),
                    ));
                }
                continue;
            }
            if matches!(value, serde_json::Value::Array(items) if items.is_empty()) {
                continue;
            }
            env.push((name, env_text(value)));
        }
    }
    env
}

/// A setting's value as an `OUTBOX_RELAY__…` variable spells it.
fn env_text(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(text) => text.clone(),
        other => other.to_string(),
    }
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
