//! The relay under test: in this test's actix system, or as the real binary in a process
//! of its own (signals, exit codes, logs, the metrics endpoint).

use crate::unique_name;
use outbox_relay::settings::{Config, Settings};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The settings as `OUTBOX_RELAY__…` variables, for running the binary: one variable per
/// key, nested sections (`[database.columns]`) as `OUTBOX_RELAY__DATABASE__COLUMNS__KEY`.
/// A list (`[[amqp.routes]]`) is one variable holding its JSON.
pub fn settings_env(settings: &Settings) -> Vec<(String, String)> {
    let value = serde_json::to_value(settings).expect("settings serialise");
    let mut env = Vec::new();
    push_env(&mut env, "OUTBOX_RELAY", &value);
    env
}

fn push_env(env: &mut Vec<(String, String)>, prefix: &str, value: &serde_json::Value) {
    match value {
        serde_json::Value::Object(keys) => {
            for (key, value) in keys {
                push_env(env, &format!("{prefix}__{}", key.to_uppercase()), value);
            }
        }
        serde_json::Value::Array(items) if items.is_empty() => {}
        serde_json::Value::String(text) => env.push((prefix.to_owned(), text.clone())),
        serde_json::Value::Null => {}
        other => env.push((prefix.to_owned(), other.to_string())),
    }
}

/// A relay running in the test's own actix system, as `outbox-relay run` would run it.
pub struct InProcessRelay {
    relay: outbox_pipeline::Relay,
    broker: outbox_amqp::Broker,
}

impl InProcessRelay {
    /// Connects and starts the relay described by `config`.
    pub async fn start(config: &Config) -> Self {
        let store = outbox_relay::startup::open_store(config, false)
            .await
            .expect("store opens");
        let broker = outbox_relay::startup::open_broker(config)
            .await
            .expect("broker connects");
        let relay = outbox_relay::startup::start_relay(config, &store, &broker)
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

/// The longest a one-shot command of the binary (`status`, `migrate`, `run` expected to
/// fail, …) may take before the test kills it and fails: a misclassified refusal that
/// waits forever fails the test instead of hanging the suite.
pub const CHILD_DEADLINE: Duration = Duration::from_secs(120);

/// Runs the relay `binary` with `settings` in its environment (no config file) and waits,
/// at most [`CHILD_DEADLINE`].
pub fn run_binary(binary: &str, settings: &Settings, args: &[&str]) -> std::process::Output {
    let mut command = std::process::Command::new(binary);
    command
        .args(["--config", "/dev/null"])
        .args(args)
        .envs(settings_env(settings));
    output_within(&mut command, CHILD_DEADLINE)
}

/// [`run_binary`] with `env` added to the environment (`PGSSLMODE`, …).
pub fn run_binary_with_env(
    binary: &str,
    settings: &Settings,
    env: &[(&str, &str)],
    args: &[&str],
) -> std::process::Output {
    let mut command = std::process::Command::new(binary);
    command
        .args(["--config", "/dev/null"])
        .args(args)
        .envs(settings_env(settings))
        .envs(env.iter().copied());
    output_within(&mut command, CHILD_DEADLINE)
}

/// `command.output()`, but killed (and the test failed, showing what it printed) if it
/// has not exited within `deadline`. Blocking: call it off a runtime thread that serves a
/// proxy the command needs (`spawn_blocking`).
pub fn output_within(
    command: &mut std::process::Command,
    deadline: Duration,
) -> std::process::Output {
    let child = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("{command:?} does not start: {error}"));
    finish_within(child, &format!("{command:?}"), deadline)
}

/// Waits for `child` (reading the pipes it has), at most `deadline`; past it, kills it and
/// fails the test with its stderr.
pub fn finish_within(
    mut child: std::process::Child,
    what: &str,
    deadline: Duration,
) -> std::process::Output {
    use std::io::Read;
    fn read(stream: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut stream) = stream {
                let _ = stream.read_to_end(&mut bytes);
            }
            bytes
        })
    }
    let stdout = read(child.stdout.take());
    let stderr = read(child.stderr.take());
    let until = std::time::Instant::now() + deadline;
    let status = loop {
        if let Some(status) = child.try_wait().expect("child status") {
            break status;
        }
        if std::time::Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = String::from_utf8_lossy(&stderr.join().unwrap_or_default()).into_owned();
            panic!("{what} did not exit within {deadline:?}; killed. Its stderr:\n{stderr}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

/// `Command::output` with a deadline ([`CHILD_DEADLINE`]): every child a test runs ends.
pub trait OutputInTime {
    /// Runs the command to its end, stdout and stderr captured; kills it and fails the
    /// test past [`CHILD_DEADLINE`].
    fn output_in_time(&mut self) -> std::io::Result<std::process::Output>;

    /// Runs the command as [`OutputInTime::output_in_time`]; its standard output. Fails the
    /// test, with its standard error, unless it ran and succeeded; `needs` says what it
    /// takes (a package, a privilege).
    fn succeeds(&mut self, needs: &str) -> String
    where
        Self: std::fmt::Debug,
    {
        let what = format!("{self:?}");
        let output = (self.output_in_time())
            .unwrap_or_else(|error| panic!("{what} does not run ({needs}): {error}"));
        assert!(
            output.status.success(),
            "{what} ({needs}): {}",
            crate::output::stderr(&output)
        );
        crate::output::stdout(&output)
    }
}

impl OutputInTime for std::process::Command {
    fn output_in_time(&mut self) -> std::io::Result<std::process::Output> {
        let child = self
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        Ok(finish_within(child, &format!("{self:?}"), CHILD_DEADLINE))
    }
}

/// For teardown (a `Drop`, perhaps while a failed test unwinds, where a panic would abort):
/// runs `command` (its output discarded) to its end, killed past `deadline`; never
/// panics. Whether it ran and exited successfully in time.
pub fn succeeds_quietly_within(command: &mut std::process::Command, deadline: Duration) -> bool {
    let Ok(child) = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
    else {
        return false;
    };
    // Killed and reaped on every way out.
    let mut child = ChildGuard(child);
    let until = std::time::Instant::now() + deadline;
    loop {
        match child.0.try_wait() {
            Ok(Some(status)) => return status.success(),
            Ok(None) if std::time::Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(10));
            }
            _ => return false,
        }
    }
}

/// A child process killed (and reaped) when dropped, so a failing test leaves none behind.
pub struct ChildGuard(pub std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The settings written as a TOML file for `--config`, removed on drop: what the
/// environment cannot say (`[[outboxes]]`).
pub struct SettingsFile {
    /// Where the file is.
    pub path: std::path::PathBuf,
}

impl SettingsFile {
    /// Writes `settings` to a fresh file in the temporary directory.
    pub fn write(settings: &Settings) -> Self {
        let text = toml::to_string(settings).expect("settings serialise as TOML");
        let path = std::env::temp_dir().join(format!("{}.toml", unique_name("settings")));
        std::fs::write(&path, text).expect("settings file written");
        Self { path }
    }

    /// Runs the relay `binary` with this file (nothing in the environment) and waits, at
    /// most [`CHILD_DEADLINE`].
    pub fn run(&self, binary: &str, args: &[&str]) -> std::process::Output {
        let mut command = std::process::Command::new(binary);
        command.arg("--config").arg(&self.path).args(args);
        output_within(&mut command, CHILD_DEADLINE)
    }

    /// Starts `binary run` with this file; `name` names its log file.
    pub fn spawn(&self, binary: &str, name: &str) -> RelayProcess {
        RelayProcess::start(binary, &self.path, &[], name)
    }

    /// Starts `binary run` with this file and `env` (secrets, `OUTBOX_RELAY__…` overrides).
    pub fn spawn_with_env(&self, binary: &str, name: &str, env: &[(&str, &str)]) -> RelayProcess {
        let env: Vec<(String, String)> = (env.iter())
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect();
        RelayProcess::start(binary, &self.path, &env, name)
    }
}

impl Drop for SettingsFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
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
        Self::start(
            binary,
            std::path::Path::new("/dev/null"),
            &settings_env(settings),
            &settings.relay.node_id,
        )
    }

    /// [`RelayProcess::spawn`] with `env` added to the environment (`PGSSLMODE`, …).
    pub fn spawn_with_env(binary: &str, settings: &Settings, env: &[(&str, &str)]) -> Self {
        let mut all = settings_env(settings);
        all.extend(
            env.iter()
                .map(|(key, value)| (key.to_string(), value.to_string())),
        );
        Self::start(
            binary,
            std::path::Path::new("/dev/null"),
            &all,
            &settings.relay.node_id,
        )
    }

    /// Starts `binary --config config run` with `env`; `name` names its log file.
    fn start(binary: &str, config: &std::path::Path, env: &[(String, String)], name: &str) -> Self {
        let log = std::env::temp_dir().join(format!("{}.log", unique_name(name)));
        let child = std::process::Command::new(binary)
            .arg("--config")
            .arg(config)
            .arg("run")
            .envs(env.iter().map(|(key, value)| (key, value)))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("relay starts");
        Self { child, log }
    }

    /// The lines of its JSON log whose message starts with `prefix`, in order. Fails on a
    /// line that is not JSON (a relay run with `log.format = "json"` writes no other), so a
    /// check that something was not logged cannot pass because the format changed.
    pub fn log_lines(&self, prefix: &str) -> Vec<serde_json::Value> {
        self.log_text()
            .lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| {
                serde_json::from_str::<serde_json::Value>(line)
                    .unwrap_or_else(|error| panic!("a log line that is not JSON ({error}): {line}"))
            })
            .filter(|line| {
                line["message"]
                    .as_str()
                    .is_some_and(|message| message.starts_with(prefix))
            })
            .collect()
    }

    /// The metrics endpoint's "listening" log line (JSON log), if it wrote one.
    pub fn listening_line(&self) -> Option<serde_json::Value> {
        self.log_lines("metrics and health endpoint listening")
            .into_iter()
            .next()
    }

    /// Waits for the metrics endpoint's "listening" line in the JSON log; its address.
    pub async fn metrics_address(&self) -> std::net::SocketAddr {
        let mut address = None;
        crate::eventually(
            "the endpoint's address in the log",
            Duration::from_secs(30),
            || {
                address = self
                    .listening_line()
                    .and_then(|line| line["address"].as_str().and_then(|text| text.parse().ok()));
                std::future::ready(address.is_some())
            },
        )
        .await;
        address.expect("an address")
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (`TERM`, `KILL`, …).
    pub fn signal(&self, signal: &str) {
        let output = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .output_in_time()
            .expect("kill runs");
        assert!(
            output.status.success(),
            "kill -{signal} failed: {}",
            crate::output::stderr(&output)
        );
    }

    /// Its exit status if it has exited, without waiting.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("child status")
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
                let _ = self.child.wait();
                panic!(
                    "relay did not exit within {deadline:?}; its log:\n{}",
                    self.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// SIGTERM, then expects exit code 0 within `deadline`.
    pub async fn stop(self, deadline: Duration) {
        self.stop_and_log(deadline).await;
    }

    /// [`RelayProcess::stop`], and everything it logged, its shutdown lines included.
    pub async fn stop_and_log(mut self, deadline: Duration) -> String {
        self.signal("TERM");
        let status = self.wait(deadline).await;
        let log = self.log_text();
        assert!(status.success(), "exit status {status:?}; log:\n{log}");
        let _ = std::fs::remove_file(&self.log);
        log
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

/// `GET path` over HTTP/1.0 (the server closes the connection after the answer): the
/// status code and the body. No HTTP client needed.
pub async fn http_get(address: SocketAddr, path: &str) -> (u16, String) {
    let answer = http_request(address, "GET", path, None, None).await;
    (answer.status, answer.body)
}

/// An HTTP answer: status, headers (names in lowercase), body.
pub struct HttpAnswer {
    /// The status code.
    pub status: u16,
    /// The headers, by lowercase name.
    pub headers: std::collections::HashMap<String, String>,
    /// The body, as text.
    pub body: String,
}

impl HttpAnswer {
    /// The body as JSON; panics naming it when it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|error| panic!("not JSON ({error}): {}", self.body))
    }
}

/// One HTTP/1.0 request (the server closes the connection after the answer).
pub async fn http_request(
    address: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&serde_json::Value>,
) -> HttpAnswer {
    let mut head = format!("{method} {path} HTTP/1.0\r\nHost: {address}\r\n");
    if let Some(token) = token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    let body = body.map(serde_json::Value::to_string).unwrap_or_default();
    if method == "POST" {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address).await?;
        stream
            .write_all(format!("{head}\r\n{body}").as_bytes())
            .await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no answer within 10 s"))
        .unwrap_or_else(|error| panic!("{method} {path}: {error}"));
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("{method} {path}: not HTTP: {response:?}"));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("{method} {path}: no status in {head:?}"));
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    HttpAnswer {
        status,
        headers,
        body: body.to_owned(),
    }
}
