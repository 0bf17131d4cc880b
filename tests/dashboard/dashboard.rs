use outbox_tests::{
    event, eventually, http_get, seed, Backend, ChildGuard, FaultProxy, Load, OutputInTime as _,
    RelayProcess, TestApp, TestEvent,
};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The repository's deploy/ directory.
fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(path)
}

/// Fails, saying how to install it, when Debian's `prometheus` package is missing.
fn require(binary: &str) {
    let found = Command::new(binary)
        .arg("--version")
        .output_in_time()
        .is_ok_and(|output| output.status.success());
    assert!(
        found,
        "this test needs `{binary}` from Debian's prometheus package: \
         apt-get install -y --no-install-recommends prometheus (.ci/run does it where missing)"
    );
}

/// A Prometheus server of the test's own on a free port, scraping `target` every second
/// as job `outbox-relay` and evaluating deploy/prometheus/alerts.yml; killed on drop.
struct Prometheus {
    /// Killed on drop.
    child: ChildGuard,
    address: SocketAddr,
    dir: PathBuf,
}

impl Prometheus {
    async fn start(target: SocketAddr) -> Self {
        require("prometheus");
        let dir = std::env::temp_dir().join(outbox_tests::unique_name("prometheus"));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {rules}\n\
             scrape_configs:\n  - job_name: outbox-relay\n    static_configs:\n      - targets: [\"{target}\"]\n",
            rules = deploy("prometheus/alerts.yml").display()
        );
        std::fs::write(dir.join("prometheus.yml"), config).expect("config written");
        // A free port: taken from the system, given back just before Prometheus binds it.
        let address = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port");
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={address}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("log")).expect("log file"))
            .spawn()
            .expect("prometheus starts");
        let prometheus = Self {
            child: ChildGuard(child),
            address,
            dir,
        };
        eventually(
            "Prometheus to be ready",
            Duration::from_secs(30),
            || async { tcp_open(address).await && http_get(address, "/-/ready").await.0 == 200 },
        )
        .await;
        prometheus
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    /// The `data` of a query API answer, or the error it gave.
    async fn api(&self, path: &str, params: &[(&str, &str)]) -> Result<Value, String> {
        let query = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params)
            .finish();
        let (status, body) = http_get(self.address, &format!("{path}?{query}")).await;
        let answer: Value = serde_json::from_str(&body)
            .map_err(|error| format!("HTTP {status}, not JSON ({error}): {body}"))?;
        match answer["status"].as_str() {
            Some("success") => Ok(answer["data"].clone()),
            _ => Err(format!(
                "HTTP {status}: {} {}",
                answer["errorType"], answer["error"]
            )),
        }
    }

    /// An instant query's series (an empty list when it matched nothing).
    async fn instant(&self, expr: &str) -> Vec<Value> {
        let data = self
            .api("/api/v1/query", &[("query", expr)])
            .await
            .unwrap_or_else(|error| panic!("{expr}: {error}"));
        data["result"].as_array().cloned().unwrap_or_default()
    }

    /// The first series' value now, if any.
    async fn value(&self, expr: &str) -> Option<f64> {
        self.instant(expr).await.first()?["value"][1]
            .as_str()?
            .parse()
            .ok()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.0.kill();
        let _ = self.child.0.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn tcp_open(address: SocketAddr) -> bool {
    tokio::net::TcpStream::connect(address).await.is_ok()
}

/// One query of the dashboard: where it is and its expression.
struct Query {
    panel: String,
    expr: String,
}

/// Every expression of the dashboard: each panel's targets (rows' nested panels too) and
/// each annotation's; the variables' `label_values(metric, label)` as `metric`.
fn queries(dashboard: &Value) -> Vec<Query> {
    let mut out = Vec::new();
    fn walk(panels: &[Value], out: &mut Vec<Query>) {
        for panel in panels {
            let title = panel["title"].as_str().unwrap_or("(untitled)");
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"].as_str().unwrap_or_default();
                out.push(Query {
                    panel: format!("panel {title:?} query {}", target["refId"]),
                    expr: expr.to_owned(),
                });
            }
            walk(panel["panels"].as_array().map_or(&[], Vec::as_slice), out);
        }
    }
    walk(dashboard["panels"].as_array().expect("panels"), &mut out);
    for annotation in dashboard["annotations"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(expr) = annotation["expr"].as_str() {
            out.push(Query {
                panel: format!("annotation {}", annotation["name"]),
                expr: expr.to_owned(),
            });
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if variable["type"] != "query" {
            continue;
        }
        let definition = variable["definition"].as_str().unwrap_or_default();
        let metric = definition
            .strip_prefix("label_values(")
            .and_then(|rest| rest.split(',').next())
            .unwrap_or_else(|| {
                panic!(
                    "variable {}: not label_values(…): {definition}",
                    variable["name"]
                )
            });
        out.push(Query {
            panel: format!("variable {}", variable["name"]),
            expr: metric.trim().to_owned(),
        });
    }
    out
}

/// Grafana's variables in `expr`, as the dashboard would have them for this test's outbox
/// and node (the rate interval for a 1 s scrape).
fn substitute(expr: &str, outbox: &str, node: &str) -> String {
    expr.replace("$__rate_interval", "10s")
        .replace("$outbox", outbox)
        .replace("$node", node)
}

#[actix_rt::test]
async fn every_panel_of_the_dashboard_returns_data_from_a_real_prometheus() {
    require("prometheus");
    let (proxy, amqp_url) = FaultProxy::in_front_of(&outbox_tests::services::amqp_url()).await;
    let app = TestApp::on(Backend::Postgres)
        .binding("room.#")
        .settings(|settings| {
            settings.amqp.url = amqp_url.clone();
            settings.metrics.listen = "127.0.0.1:0".into();
            settings.log.format = "json".into();
            // One event retried twice, then dead.
            settings.relay.max_attempts = 3;
            settings.relay.retry_interval = "500ms".into();
            // The objective the age panel draws.
            settings.relay.max_pending_age = "1h".into();
        })
        .build()
        .await;
    let outbox = app.database.table.to_string();
    let node = app.settings.relay.node_id.clone();
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    let address = relay.metrics_address().await;
    let prometheus = Prometheus::start(address).await;
    let started = chrono::Utc::now().timestamp() - 1;
    eventually(
        "Prometheus to scrape the relay",
        Duration::from_secs(30),
        || async { prometheus.value("up{job=\"outbox-relay\"}").await == Some(1.0) },
    )
    .await;

    let load = Load::start(&app.database, 5, Duration::from_millis(200));
    // Unroutable (the queue binds room.#): a retry, then another, then dead.
    seed(
        &app.database,
        &[event("orphan", "orphan-room").of_type("orphan.created")],
    )
    .await;
    let dead = format!("sum(outbox_events_dead_total{{outbox=\"{outbox}\"}})");
    eventually(
        "the dead event in Prometheus",
        Duration::from_secs(60),
        || async { prometheus.value(&dead).await == Some(1.0) },
    )
    .await;

    // The broker cut: seen by Prometheus, then healed.
    let broker_up = "outbox_up{dependency=\"broker\"}";
    proxy.go_down();
    eventually(
        "the broker down in Prometheus",
        Duration::from_secs(30),
        || async { prometheus.value(broker_up).await == Some(0.0) },
    )
    .await;
    proxy.restore();
    eventually(
        "the broker up again in Prometheus",
        Duration::from_secs(60),
        || async { prometheus.value(broker_up).await == Some(1.0) },
    )
    .await;
    // Published again after the cut, for the rate windows after it.
    let published = format!("sum(outbox_events_published_total{{outbox=\"{outbox}\"}})");
    let before = prometheus.value(&published).await.unwrap_or(0.0);
    eventually(
        "events published after the cut",
        Duration::from_secs(60),
        || async {
            prometheus
                .value(&published)
                .await
                .is_some_and(|now| now >= before + 20.0)
        },
    )
    .await;

    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(deploy("grafana/outbox-relay.json")).expect("the dashboard"),
    )
    .expect("the dashboard is JSON");
    let queries = queries(&dashboard);
    assert!(queries.len() >= 20, "{} queries only", queries.len());
    let end = chrono::Utc::now().timestamp().to_string();
    let start = started.to_string();
    let mut failures = Vec::new();
    for query in &queries {
        let expr = substitute(&query.expr, &outbox, &node);
        assert!(
            !expr.contains('$'),
            "{}: a variable left in {expr}",
            query.panel
        );
        let answer = prometheus
            .api(
                "/api/v1/query_range",
                &[
                    ("query", &expr),
                    ("start", &start),
                    ("end", &end),
                    ("step", "1"),
                ],
            )
            .await;
        let series = match answer {
            Err(error) => {
                failures.push(format!("{}: {error}\n    {expr}", query.panel));
                continue;
            }
            Ok(data) => data["result"].as_array().cloned().unwrap_or_default(),
        };
        // Some number: a quantile of nothing is NaN, which Grafana draws as a gap.
        let numbers = series
            .iter()
            .flat_map(|series| series["values"].as_array().cloned().unwrap_or_default())
            .filter(|point| {
                point[1]
                    .as_str()
                    .and_then(|v| v.parse::<f64>().ok())
                    .is_some_and(f64::is_finite)
            })
            .count();
        if numbers == 0 {
            failures.push(format!(
                "{}: {}\n    {expr}",
                query.panel,
                match series.is_empty() {
                    true => "no series",
                    false => "only NaN",
                }
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} dashboard queries returned no data:\n{}",
        failures.len(),
        queries.len(),
        failures.join("\n")
    );
    // The alert rules load and evaluate on the same data.
    let rules = prometheus.api("/api/v1/rules", &[]).await.expect("rules");
    let loaded = rules["groups"][0]["rules"].as_array().map_or(0, Vec::len);
    assert!(loaded >= 10, "alert rules loaded: {rules}");
    let unhealthy: Vec<&Value> = rules["groups"][0]["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|rule| rule["health"] == "err")
        .collect();
    assert!(
        unhealthy.is_empty(),
        "rules failing to evaluate: {unhealthy:?}"
    );
    let log = prometheus.log();
    assert!(
        !log.contains("level=error"),
        "Prometheus logged errors:\n{log}"
    );

    drop(load);
    relay.stop(Duration::from_secs(5)).await;
    drop(prometheus);
    app.teardown().await;
}

#[test]
fn the_alert_rules_pass_their_unit_tests() {
    require("promtool");
    for args in [
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts.test.yml"],
    ] {
        let output = Command::new("promtool")
            .args(args)
            .current_dir(deploy("prometheus"))
            .output_in_time()
            .expect("promtool runs");
        assert!(
            output.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
