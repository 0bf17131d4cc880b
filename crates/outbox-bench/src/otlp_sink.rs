//! `drain --otlp`: an OpenTelemetry collector that only counts, a child process
//! (`outbox-bench otlp-sink`) so that the CPU time measured in the parent is the relay's
//! alone. It prints `listening <address>`, takes OTLP/HTTP protobuf posts to `/v1/traces`,
//! and on a line on stdin prints `spans <count> requests <count> bytes <count>`.

use anyhow::{bail, Context as _};
use clap::Args;
use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, Command, Stdio};
#[cfg(feature = "otel")]
use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(feature = "otel")]
use std::sync::Arc;

/// `otlp-sink` options (a hidden subcommand: `drain --otlp` starts it).
#[derive(Debug, Args)]
pub struct SinkArgs {}

/// What the sink received.
#[cfg(feature = "otel")]
#[derive(Debug, Default)]
struct Counts {
    spans: AtomicU64,
    requests: AtomicU64,
    bytes: AtomicU64,
}

/// The child's side: serve until stdin has a line, then report.
#[cfg(feature = "otel")]
pub async fn run(_args: SinkArgs) -> anyhow::Result<()> {
    use actix_web::{web, App, HttpResponse, HttpServer};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message as _;

    let counts = Arc::new(Counts::default());
    let shared = web::Data::from(Arc::clone(&counts));
    let server = HttpServer::new(move || {
        App::new()
            .app_data(shared.clone())
            .app_data(web::PayloadConfig::new(64 * 1024 * 1024))
            .route(
                "/v1/traces",
                web::post().to(|counts: web::Data<Counts>, body: web::Bytes| async move {
                    let Ok(request) = ExportTraceServiceRequest::decode(body.as_ref()) else {
                        return HttpResponse::BadRequest().finish();
                    };
                    let spans: usize = request
                        .resource_spans
                        .iter()
                        .flat_map(|resource| &resource.scope_spans)
                        .map(|scope| scope.spans.len())
                        .sum();
                    counts.spans.fetch_add(spans as u64, Ordering::Relaxed);
                    counts.requests.fetch_add(1, Ordering::Relaxed);
                    counts.bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
                    HttpResponse::Ok()
                        .content_type("application/x-protobuf")
                        .finish()
                }),
            )
    })
    .workers(1)
    .disable_signals()
    .bind("127.0.0.1:0")
    .context("cannot listen for OTLP")?;
    let address = server.addrs()[0];
    let server = server.run();
    let handle = server.handle();
    actix_rt::spawn(server);
    println!("listening {address}");
    std::io::stdout().flush()?;
    // Blocking stdin, off the server's runtime.
    tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
    })
    .await?;
    println!(
        "spans {} requests {} bytes {}",
        counts.spans.load(Ordering::Relaxed),
        counts.requests.load(Ordering::Relaxed),
        counts.bytes.load(Ordering::Relaxed)
    );
    handle.stop(false).await;
    Ok(())
}

/// Without OpenTelemetry in this build there is nothing to receive.
#[cfg(not(feature = "otel"))]
pub async fn run(_args: SinkArgs) -> anyhow::Result<()> {
    bail!("this outbox-bench has no OpenTelemetry: build it with --features otel")
}

/// The parent's handle on the sink.
pub struct SinkProcess {
    child: Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
    /// `http://<address>`, for `telemetry.otlp_endpoint`.
    pub endpoint: String,
}

impl SinkProcess {
    /// Starts `outbox-bench otlp-sink` and reads its address.
    pub fn start() -> anyhow::Result<Self> {
        if !cfg!(feature = "otel") {
            bail!("--otlp needs OpenTelemetry in the bench: build it with --features otel");
        }
        let mut child = Command::new(std::env::current_exe()?)
            .arg("otlp-sink")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot start the OTLP sink")?;
        let mut lines = BufReader::new(child.stdout.take().context("sink stdout")?).lines();
        let first = lines.next().context("the OTLP sink exited early")??;
        let address = first
            .strip_prefix("listening ")
            .with_context(|| format!("unexpected line from the OTLP sink: {first:?}"))?;
        Ok(Self {
            endpoint: format!("http://{address}"),
            child,
            lines,
        })
    }

    /// Stops the sink and returns the spans it received and the bytes they took.
    pub fn finish(mut self) -> anyhow::Result<(u64, u64)> {
        let stdin = self.child.stdin.as_mut().context("sink stdin")?;
        stdin.write_all(b"report\n")?;
        stdin.flush()?;
        let report = self
            .lines
            .next()
            .context("no report from the OTLP sink")??;
        let numbers: Vec<u64> = report
            .split(' ')
            .skip(1)
            .step_by(2)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .with_context(|| format!("malformed sink report {report:?}"))?;
        let [spans, _requests, bytes] = numbers[..] else {
            bail!("malformed sink report {report:?}");
        };
        let _ = self.child.wait();
        Ok((spans, bytes))
    }
}

impl Drop for SinkProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
