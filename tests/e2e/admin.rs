//! The admin API (`[admin]`) of the real binary: nothing listens unless it is enabled;
//! bearer tokens, roles and refused attempts; outboxes, dead events by page, one event, a
//! dry run and a requeue that gets the events delivered; the security headers.

use outbox_relay::admin::tokens::{line, Role};
pub(crate) use outbox_tests::http_request as request;
use outbox_tests::{event, per_backend, unique_name, Backend, RelayProcess, TestApp, TestEvent};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::Duration;

pub(crate) const DEADLINE: Duration = Duration::from_secs(60);
pub(crate) const VIEWER: &str = "viewer-token-of-the-admin-tests";
pub(crate) const OPERATOR: &str = "operator-token-of-the-admin-tests";

/// A tokens file with a viewer (`alice`) and an operator (`ops`), removed when dropped.
pub(crate) struct TokensFile(pub(crate) std::path::PathBuf);

impl TokensFile {
    pub(crate) fn new() -> Self {
        let path = std::env::temp_dir().join(unique_name("admin-tokens"));
        let text = format!(
            "# the admin tests' tokens\n{}\n\n{}\n",
            line("alice", Role::Viewer, VIEWER),
            line("ops", Role::Operator, OPERATOR)
        );
        std::fs::write(&path, text).expect("tokens file written");
        Self(path)
    }
}

impl Drop for TokensFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Waits for the admin API's "listening" line in the JSON log; its address.
pub(crate) async fn admin_address(relay: &RelayProcess) -> SocketAddr {
    let mut address = None;
    outbox_tests::eventually("the admin API's address in the log", DEADLINE, || {
        address = relay
            .log_lines("admin API listening")
            .first()
            .and_then(|line| line["address"].as_str())
            .and_then(|text| text.parse().ok());
        std::future::ready(address.is_some())
    })
    .await;
    address.expect("an address")
}

#[actix_rt::test]
async fn with_the_admin_api_disabled_nothing_but_the_metrics_endpoint_listens() {
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.metrics.listen = "127.0.0.1:0".into();
            settings.log.format = "json".into();
            // Inert while disabled: neither read nor bound.
            settings.admin.listen = "127.0.0.1:0".into();
            settings.admin.tokens_file = "/nonexistent/tokens".into();
        })
        .build()
        .await;
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    let metrics = relay.metrics_address().await;
    // The relay is up (its readiness says so) before its listeners are counted.
    outbox_tests::eventually("the relay ready", DEADLINE, || async {
        outbox_tests::http_get(metrics, "/readyz").await.0 == 200
    })
    .await;
    assert_eq!(
        crate::metrics::listening_ports(relay.pid()),
        vec![metrics.port()],
        "only the metrics endpoint listens"
    );
    assert!(relay.log_lines("admin API listening").is_empty());
    relay.stop(DEADLINE).await;
    app.teardown().await;
}

async fn a_viewer_reads_and_an_operator_requeues(backend: Backend) {
    let tokens = TokensFile::new();
    let app = TestApp::on(backend)
        // Nothing is bound at first: each event dies after its one attempt.
        .binding("nothing.bound")
        .settings(|settings| {
            settings.relay.max_attempts = 1;
            settings.log.format = "json".into();
            settings.metrics.listen = "127.0.0.1:0".into();
            settings.admin.enabled = true;
            settings.admin.listen = "127.0.0.1:0".into();
            settings.admin.tokens_file = tokens.0.display().to_string();
        })
        .seeded(&[
            event("o1", "a").of_type("order.created"),
            event("o2", "b").of_type("order.paid"),
            event("x1", "a").of_type("invoice.created"),
        ])
        .build()
        .await;
    let outbox = app.database.table.as_str().to_owned();
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    let address = admin_address(&relay).await;
    app.database.wait_dead(3, DEADLINE).await;
    let get = |path: String, token: Option<&'static str>| async move {
        request(address, "GET", &path, token, None).await
    };
    let post = |path: String, token: &'static str, body: Value| async move {
        request(address, "POST", &path, Some(token), Some(&body)).await
    };

    // No token, a wrong one: 401 asking for a bearer token, logged without the token.
    let none = get("/api/v1/outboxes".into(), None).await;
    assert_eq!(none.status, 401, "{}", none.body);
    assert_eq!(
        none.headers.get("www-authenticate").map(String::as_str),
        Some("Bearer")
    );
    let wrong = get("/api/v1/outboxes".into(), Some("not-a-token-we-know")).await;
    assert_eq!(wrong.status, 401);
    assert!(wrong.json()["error"].is_string(), "{}", wrong.body);
    let log = relay.log_text();
    assert!(log.contains("admin API: authentication failed"), "{log}");
    assert!(
        !log.contains("not-a-token-we-know"),
        "the token is never logged"
    );

    // A viewer lists the outboxes, with every answer's security headers.
    let listed = get("/api/v1/outboxes".into(), Some(VIEWER)).await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    for (name, value) in [
        ("cache-control", "no-store"),
        ("x-content-type-options", "nosniff"),
        (
            "content-security-policy",
            "default-src 'none'; frame-ancestors 'none'",
        ),
        ("referrer-policy", "no-referrer"),
    ] {
        assert_eq!(
            listed.headers.get(name).map(String::as_str),
            Some(value),
            "{name}"
        );
        assert!(none.headers.contains_key(name), "{name} on a refusal too");
    }
    let outboxes = listed.json()["outboxes"].clone();
    assert_eq!(outboxes[0]["name"], json!(outbox), "{outboxes}");
    assert_eq!(outboxes[0]["dead"], json!(3), "{outboxes}");
    assert_eq!(outboxes[0]["pending"], json!(0), "{outboxes}");

    // Dead events a page at a time, by id, the cursor resuming after the page.
    let dead = format!("/api/v1/outboxes/{outbox}/dead");
    let first = get(format!("{dead}?limit=2"), Some(VIEWER)).await.json();
    let ids = |page: &Value| -> Vec<String> {
        page["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|item| item["event_id"].as_str().expect("event_id").to_owned())
            .collect()
    };
    assert_eq!(ids(&first), ["o1", "o2"], "{first}");
    assert_eq!(first["items"][0]["key"], json!("a"));
    assert_eq!(first["items"][0]["attempts"], json!(1));
    let cursor = first["next_cursor"].as_str().expect("a cursor").to_owned();
    let second = get(format!("{dead}?limit=2&cursor={cursor}"), Some(VIEWER))
        .await
        .json();
    assert_eq!(ids(&second), ["x1"], "{second}");
    assert_eq!(second["next_cursor"], Value::Null);
    let newest = get(format!("{dead}?order=newest&limit=2"), Some(VIEWER))
        .await
        .json();
    assert_eq!(ids(&newest), ["x1", "o2"], "{newest}");
    let cursor = newest["next_cursor"].as_str().expect("a cursor").to_owned();
    let older = get(
        format!("{dead}?order=newest&limit=2&cursor={cursor}"),
        Some(VIEWER),
    )
    .await
    .json();
    assert_eq!(ids(&older), ["o1"], "{older}");
    let by_type = get(format!("{dead}?event_type=order.*"), Some(VIEWER))
        .await
        .json();
    assert_eq!(ids(&by_type), ["o1", "o2"], "{by_type}");

    // One event in full.
    let id = first["items"][0]["id"].as_i64().expect("an id");
    let one = get(
        format!("/api/v1/outboxes/{outbox}/events/{id}"),
        Some(VIEWER),
    )
    .await;
    assert_eq!(one.status, 200, "{}", one.body);
    let one = one.json();
    assert_eq!(one["status"], json!("dead"), "{one}");
    assert_eq!(one["envelope"], json!(r#"{"id":"o1"}"#), "{one}");
    assert!(
        one["last_error"].as_str().is_some_and(|e| !e.is_empty()),
        "{one}"
    );

    // Bad parameters name themselves; an unknown outbox is 404.
    for query in [
        "limit=0",
        "limit=501",
        "limit=ten",
        "cursor=x",
        "order=up",
        "room=a",
    ] {
        let bad = get(format!("{dead}?{query}"), Some(VIEWER)).await;
        assert_eq!(bad.status, 400, "{query}: {}", bad.body);
        let name = query.split('=').next().unwrap();
        assert!(
            bad.json()["error"].as_str().unwrap().contains(name),
            "{}",
            bad.body
        );
    }
    let unknown = get("/api/v1/outboxes/nope/dead".into(), Some(VIEWER)).await;
    assert_eq!(unknown.status, 404, "{}", unknown.body);

    // A viewer may not act; an operator's dry run counts and changes nothing.
    let requeue = format!("/api/v1/outboxes/{outbox}/requeue");
    let order = json!({"event_type": "order.*"});
    let refused = post(requeue.clone(), VIEWER, order.clone()).await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    let dry = post(
        requeue.clone(),
        OPERATOR,
        json!({"event_type": "order.*", "dry_run": true}),
    )
    .await;
    assert_eq!(dry.status, 200, "{}", dry.body);
    assert_eq!(dry.json()["count"], json!(2), "{}", dry.body);
    let everything = post(requeue.clone(), OPERATOR, json!({"dry_run": true})).await;
    assert_eq!(everything.status, 400, "no selection: {}", everything.body);
    let many: Vec<i64> = (1..=501).collect();
    let too_many = post(requeue.clone(), OPERATOR, json!({"ids": many})).await;
    assert_eq!(too_many.status, 400, "{}", too_many.body);
    assert!(too_many.json()["error"]
        .as_str()
        .unwrap()
        .starts_with("ids"));
    app.database.wait_dead(3, DEADLINE).await;

    // The requeue gets the events delivered once a queue is bound.
    app.broker.bind("order.#").await;
    let done = post(requeue.clone(), OPERATOR, order).await;
    assert_eq!(done.status, 200, "{}", done.body);
    assert_eq!(done.json()["count"], json!(2), "{}", done.body);
    let received = app.broker.wait_for(2, DEADLINE).await;
    let mut delivered: Vec<&str> = received.iter().map(|r| r.message_id.as_str()).collect();
    delivered.sort();
    assert_eq!(delivered, ["o1", "o2"]);
    let audit = relay.log_lines("admin action");
    let last = audit.last().expect("an audit line");
    let fields = &last["fields"];
    let field = |name: &str| fields.get(name).or_else(|| last.get(name)).cloned();
    assert_eq!(field("admin_token"), Some(json!("ops")), "{last}");
    assert_eq!(field("action"), Some(json!("requeue")), "{last}");
    assert_eq!(field("count"), Some(json!(2)), "{last}");
    assert!(
        field("selection").is_some_and(|s| s.as_str().unwrap().contains("order.*")),
        "{last}"
    );

    // Each action counted on /metrics, the dry run apart.
    let metrics = outbox_tests::http_get(relay.metrics_address().await, "/metrics")
        .await
        .1;
    for action in ["requeue", "requeue_dry_run"] {
        let label = format!("action=\"{action}\"");
        assert!(
            metrics
                .lines()
                .any(|line| line.starts_with("outbox_admin_actions_total{")
                    && line.contains(&label)
                    && line.ends_with(" 1")),
            "{action}:\n{metrics}"
        );
    }

    // Failed attempts from one address: refused with 429 after 10, the right token too.
    for _ in 0..10 {
        let _ = get("/api/v1/outboxes".into(), Some("wrong")).await;
    }
    let limited = get("/api/v1/outboxes".into(), Some(VIEWER)).await;
    assert_eq!(limited.status, 429, "{}", limited.body);

    relay.stop(DEADLINE).await;
    app.teardown().await;
}

per_backend!(a_viewer_reads_and_an_operator_requeues: postgres, sqlite, mariadb);

#[actix_rt::test]
async fn enabled_without_a_usable_tokens_file_check_config_and_run_exit_2_naming_it() {
    // Refused before anything connects: the defaults name no server the test needs.
    let mut settings = outbox_relay::settings::Settings::default();
    settings.admin.enabled = true;
    for args in [&["check-config", "--offline"][..], &["run"]] {
        let output = outbox_tests::run_binary(crate::RELAY, &settings, args);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
        let error = outbox_tests::output::stderr(&output);
        assert!(error.contains("admin.tokens_file"), "{args:?}: {error}");
    }
    let path = std::env::temp_dir().join(unique_name("admin-tokens-bad"));
    std::fs::write(&path, "# tokens\n\nalice:root:sha256:00\n").expect("written");
    settings.admin.tokens_file = path.display().to_string();
    let output = outbox_tests::run_binary(crate::RELAY, &settings, &["check-config", "--offline"]);
    let _ = std::fs::remove_file(&path);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let error = outbox_tests::output::stderr(&output);
    assert!(
        error.contains(&path.display().to_string()) && error.contains("line 3"),
        "{error}"
    );
}

#[actix_rt::test]
async fn admin_token_prints_a_token_and_the_line_that_admits_it() {
    let settings = outbox_relay::settings::Settings::default();
    let output = outbox_tests::run_binary(
        crate::RELAY,
        &settings,
        &["admin-token", "--name", "ops", "--role", "operator"],
    );
    let text = outbox_tests::output::succeeded("admin-token", &output);
    let token = text
        .lines()
        .find_map(|line| line.strip_prefix("token: "))
        .expect("a token line");
    let line = text
        .lines()
        .find_map(|line| line.strip_prefix("line for admin.tokens_file: "))
        .expect("a file line");
    assert_eq!(token.len(), 64, "{text}");
    let tokens = outbox_relay::admin::Tokens::parse(line).expect("the line parses");
    let admitted = tokens.find(token).expect("the token is admitted");
    assert_eq!(
        (admitted.name.as_str(), admitted.role),
        ("ops", Role::Operator)
    );
    assert!(
        !line.contains(token),
        "the line holds the hash, not the token"
    );
}
