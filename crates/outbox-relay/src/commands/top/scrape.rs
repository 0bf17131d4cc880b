//! One look at a node: `GET /metrics` over HTTP/1.0 and the relay's series in it, by
//! outbox.

use anyhow::{bail, Context as _};
use outbox_pipeline::instruments;
use prometheus_parse::{Scrape, Value};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

/// A scrape that takes longer counts as a failure: the view refreshes every second.
const SCRAPE_TIMEOUT: Duration = Duration::from_millis(900);
/// More than this is not a relay's /metrics.
const MAX_BODY: u64 = 16 * 1024 * 1024;

/// Where a node's metrics are: `http://host:port/path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `host:port`, for connecting and the `Host` header.
    pub authority: String,
    /// The path with its query, `/metrics` by default.
    pub path: String,
    /// As the user gave it, for the view.
    pub shown: String,
}

impl Target {
    /// `http://host:port/path`, `host:port/path` or `host:port` (then `/metrics`).
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let with_scheme = match text.contains("://") {
            true => text.to_owned(),
            false => format!("http://{text}"),
        };
        let url = url::Url::parse(&with_scheme)
            .with_context(|| format!("{text:?} is not a URL such as http://127.0.0.1:9187"))?;
        if url.scheme() != "http" {
            bail!("{text}: only http:// is supported (the relay serves /metrics over plain HTTP)");
        }
        let host = url.host_str().with_context(|| format!("{text}: no host"))?;
        let port = url.port().unwrap_or(80);
        let path = match url.path() {
            "" | "/" => "/metrics".to_owned(),
            path => path.to_owned(),
        };
        let path = match url.query() {
            Some(query) => format!("{path}?{query}"),
            None => path,
        };
        Ok(Self {
            authority: format!("{host}:{port}"),
            path,
            shown: text.to_owned(),
        })
    }
}

/// What one node's `/metrics` said.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeFigures {
    /// Its `node_id` label (absent from a foreign endpoint).
    pub node_id: Option<String>,
    /// `outbox_up{dependency="database"}`.
    pub database_up: Option<bool>,
    /// `outbox_up{dependency="broker"}`.
    pub broker_up: Option<bool>,
    /// `outbox_broker_blocked`.
    pub blocked: Option<bool>,
    /// By outbox name.
    pub outboxes: BTreeMap<String, OutboxFigures>,
}

/// One outbox's series on one node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutboxFigures {
    /// `outbox_events_published_total`.
    pub published: f64,
    /// `outbox_events_failed_total`, every reason.
    pub failed: f64,
    /// `outbox_events_dead_total`.
    pub dead: f64,
    /// `outbox_pending_events`: the table's backlog.
    pub pending: Option<f64>,
    /// `outbox_oldest_pending_age_seconds`.
    pub oldest_age: Option<f64>,
    /// `outbox_commit_to_confirm_seconds` buckets: (upper bound, cumulative count).
    pub latency: Vec<(f64, f64)>,
    /// The reason whose `outbox_stalled` is 1, while the outbox is stalled.
    pub stalled: Option<String>,
}

/// The relay's series in a `/metrics` text.
pub fn figures(text: &str) -> anyhow::Result<NodeFigures> {
    let scrape = Scrape::parse(text.lines().map(|line| Ok(line.to_owned())))
        .context("not the Prometheus text format")?;
    let mut node = NodeFigures::default();
    for sample in scrape.samples {
        if node.node_id.is_none() {
            node.node_id = sample.labels.get("node_id").map(str::to_owned);
        }
        let value = match &sample.value {
            Value::Counter(value) | Value::Gauge(value) | Value::Untyped(value) => *value,
            Value::Histogram(buckets) if sample.metric == instruments::COMMIT_TO_CONFIRM => {
                if let Some(outbox) = sample.labels.get("outbox") {
                    let latency = &mut node.outboxes.entry(outbox.to_owned()).or_default().latency;
                    latency.extend(buckets.iter().map(|b| (b.less_than, b.count)));
                    latency.sort_by(|a, b| a.0.total_cmp(&b.0));
                }
                continue;
            }
            _ => continue,
        };
        let on = value >= 0.5;
        match sample.metric.as_str() {
            instruments::UP => match sample.labels.get("dependency") {
                Some("database") => node.database_up = Some(on),
                Some("broker") => node.broker_up = Some(on),
                _ => {}
            },
            instruments::BROKER_BLOCKED => node.blocked = Some(on),
            metric => {
                let Some(outbox) = sample.labels.get("outbox") else {
                    continue;
                };
                let figures = node.outboxes.entry(outbox.to_owned()).or_default();
                match metric {
                    instruments::EVENTS_PUBLISHED => figures.published += value,
                    instruments::EVENTS_FAILED => figures.failed += value,
                    instruments::EVENTS_DEAD => figures.dead += value,
                    instruments::PENDING_EVENTS => figures.pending = Some(value),
                    instruments::OLDEST_PENDING_AGE => figures.oldest_age = Some(value),
                    instruments::STALLED if on => {
                        figures.stalled = sample.labels.get("reason").map(str::to_owned)
                    }
                    _ => {}
                }
            }
        }
    }
    // Only the relay's own outboxes: any series with an `outbox` label made an entry.
    node.outboxes
        .retain(|_, figures| *figures != OutboxFigures::default());
    Ok(node)
}

/// `GET` the target's metrics: the body of a 200 answer.
pub async fn fetch(target: &Target) -> anyhow::Result<String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(&target.authority).await?;
        let request = format!(
            "GET {} HTTP/1.0\r\nHost: {}\r\nAccept: text/plain\r\n\r\n",
            target.path, target.authority
        );
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        // HTTP/1.0: the server closes the connection after the body.
        (&mut stream)
            .take(MAX_BODY)
            .read_to_end(&mut response)
            .await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = tokio::time::timeout(SCRAPE_TIMEOUT, exchange)
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {SCRAPE_TIMEOUT:?}"))??;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .context("not an HTTP answer")?;
    let status = head.split(' ').nth(1).unwrap_or("?");
    if status != "200" {
        let line = head.lines().next().unwrap_or_default();
        bail!("{line}");
    }
    Ok(body.to_owned())
}

/// One scrape of a target: when, and what it found or why not.
#[derive(Debug, Clone)]
pub struct Look {
    /// When the answer came.
    pub at: Instant,
    /// Its figures, or why there are none.
    pub figures: Result<NodeFigures, String>,
}

/// Scrapes `target` once.
pub async fn look(target: &Target) -> Look {
    let figures = match fetch(target).await {
        Ok(body) => figures(&body).map_err(|error| format!("{error:#}")),
        Err(error) => Err(format!("{error:#}")),
    };
    Look {
        at: Instant::now(),
        figures,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# TYPE outbox_events_published_total counter
outbox_events_published_total{node_id="n1",outbox="orders"} 120
outbox_events_published_total{node_id="n1",outbox="audit"} 3
# TYPE outbox_events_failed_total counter
outbox_events_failed_total{node_id="n1",reason="timeout",outbox="orders"} 2
outbox_events_failed_total{node_id="n1",reason="unroutable",outbox="orders"} 5
# TYPE outbox_events_dead_total counter
outbox_events_dead_total{node_id="n1",outbox="orders"} 1
# TYPE outbox_pending_events gauge
outbox_pending_events{node_id="n1",outbox="orders"} 42
# TYPE outbox_oldest_pending_age_seconds gauge
outbox_oldest_pending_age_seconds{node_id="n1",outbox="orders"} 7.5
# TYPE outbox_up gauge
outbox_up{node_id="n1",dependency="database"} 1
outbox_up{node_id="n1",dependency="broker"} 0
# TYPE outbox_broker_blocked gauge
outbox_broker_blocked{node_id="n1"} 0
# TYPE outbox_stalled gauge
outbox_stalled{node_id="n1",outbox="orders",reason="timeout"} 0
outbox_stalled{node_id="n1",outbox="orders",reason="unroutable"} 1
# TYPE outbox_commit_to_confirm_seconds histogram
outbox_commit_to_confirm_seconds_bucket{node_id="n1",outbox="orders",le="0.01"} 100
outbox_commit_to_confirm_seconds_bucket{node_id="n1",outbox="orders",le="0.1"} 110
outbox_commit_to_confirm_seconds_bucket{node_id="n1",outbox="orders",le="+Inf"} 120
outbox_commit_to_confirm_seconds_sum{node_id="n1",outbox="orders"} 3.2
outbox_commit_to_confirm_seconds_count{node_id="n1",outbox="orders"} 120
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total{node_id="n1"} 4
"#;

    #[test]
    fn the_relays_series_are_read_by_outbox() {
        let node = figures(TEXT).expect("parses");
        assert_eq!(node.node_id.as_deref(), Some("n1"));
        assert_eq!(node.database_up, Some(true));
        assert_eq!(node.broker_up, Some(false));
        assert_eq!(node.blocked, Some(false));
        let orders = &node.outboxes["orders"];
        assert_eq!(orders.published, 120.0);
        assert_eq!(orders.failed, 7.0, "every reason");
        assert_eq!(orders.dead, 1.0);
        assert_eq!(orders.pending, Some(42.0));
        assert_eq!(orders.oldest_age, Some(7.5));
        assert_eq!(orders.stalled.as_deref(), Some("unroutable"));
        assert_eq!(
            orders.latency,
            [(0.01, 100.0), (0.1, 110.0), (f64::INFINITY, 120.0)]
        );
        let audit = &node.outboxes["audit"];
        assert_eq!((audit.published, audit.pending), (3.0, None));
        assert_eq!(node.outboxes.len(), 2);
    }

    #[test]
    fn targets_default_to_http_and_the_metrics_path() {
        let target = Target::parse("127.0.0.1:9187").expect("valid");
        assert_eq!(target.authority, "127.0.0.1:9187");
        assert_eq!(target.path, "/metrics");
        let target = Target::parse("http://relay-1:80/other?x=1").expect("valid");
        assert_eq!(
            (target.authority.as_str(), target.path.as_str()),
            ("relay-1:80", "/other?x=1")
        );
        assert_eq!(
            Target::parse("http://[::1]:9187").unwrap().authority,
            "[::1]:9187"
        );
        let error = Target::parse("https://relay:9187").unwrap_err().to_string();
        assert!(error.contains("only http://"), "{error}");
    }
}
