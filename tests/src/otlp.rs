//! [`OtlpReceiver`]: a small OpenTelemetry collector for the tests. It accepts OTLP/HTTP
//! protobuf posts to `/v1/traces` (HTTP/1.1, keep-alive), decodes them and keeps every
//! span, with its resource's attributes, for the test to look at.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use prost::Message as _;
use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One span as received, ids in lowercase hex (empty when absent), attribute values as
/// text.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    /// 16 hex digits, or empty for a root span.
    pub parent_span_id: String,
    /// The span's name.
    pub name: String,
    /// OTLP's `SpanKind` number (4: producer).
    pub kind: i32,
    /// The span's attributes.
    pub attributes: BTreeMap<String, String>,
    /// OTLP's status code (0 unset, 1 ok, 2 error).
    pub status_code: i32,
    /// The attributes of the resource that sent it (`service.name`, …).
    pub resource: BTreeMap<String, String>,
}

impl ReceivedSpan {
    /// An attribute's value as text.
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// The receiver; it stops when the test process ends.
#[derive(Debug)]
pub struct OtlpReceiver {
    address: SocketAddr,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
}

impl OtlpReceiver {
    /// Listens on a free loopback port.
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free port for the receiver");
        let address = listener.local_addr().expect("its address");
        let spans: Arc<Mutex<Vec<ReceivedSpan>>> = Arc::default();
        let kept = Arc::clone(&spans);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let kept = Arc::clone(&kept);
                std::thread::spawn(move || serve(stream, &kept));
            }
        });
        Self { address, spans }
    }

    /// The base URL to configure as `telemetry.otlp_endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits (at most `deadline`) until at least `count` spans arrived; returns them all.
    pub async fn wait_for(&self, count: usize, deadline: Duration) -> Vec<ReceivedSpan> {
        crate::eventually(
            &format!("{count} spans at the OTLP receiver"),
            deadline,
            || async { self.spans.lock().unwrap().len() >= count },
        )
        .await;
        self.spans()
    }
}

/// Answers the requests of one connection until it closes.
fn serve(stream: TcpStream, spans: &Mutex<Vec<ReceivedSpan>>) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = None;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse::<usize>().ok();
                }
            }
        }
        let mut body = vec![0; length.expect("the exporter sends a Content-Length")];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let status = match (request_line.starts_with("POST /v1/traces "), decode(&body)) {
            (true, Some(received)) => {
                spans.lock().unwrap().extend(received);
                "200 OK"
            }
            (true, None) => "400 Bad Request",
            (false, _) => "404 Not Found",
        };
        let answer = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n"
        );
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

fn decode(body: &[u8]) -> Option<Vec<ReceivedSpan>> {
    let request = ExportTraceServiceRequest::decode(body).ok()?;
    let mut spans = Vec::new();
    for resource_spans in request.resource_spans {
        let resource = resource_spans
            .resource
            .map(|resource| attributes(&resource.attributes))
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                spans.push(ReceivedSpan {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    name: span.name,
                    kind: span.kind,
                    attributes: attributes(&span.attributes),
                    status_code: span.status.map_or(0, |status| status.code),
                    resource: resource.clone(),
                });
            }
        }
    }
    Some(spans)
}

fn attributes(pairs: &[KeyValue]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|pair| {
            let value = match pair.value.as_ref().and_then(|value| value.value.as_ref()) {
                Some(any_value::Value::StringValue(text)) => text.clone(),
                Some(any_value::Value::IntValue(n)) => n.to_string(),
                Some(any_value::Value::BoolValue(b)) => b.to_string(),
                Some(any_value::Value::DoubleValue(x)) => x.to_string(),
                other => format!("{other:?}"),
            };
            (pair.key.clone(), value)
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}
