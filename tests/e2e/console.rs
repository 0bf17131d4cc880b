//! The web console (`/` on the admin listener) in headless Chromium, driven through
//! chromedriver's WebDriver protocol: signing in with a wrong and a right token and the
//! pending events' failures grouped with their counts, an operator requeueing a group of
//! dead events after the dry run's count, a viewer's requeue refused on the page, a filter
//! by key finding one event among thousands. Each test ends with a screenshot, written to
//! `docs/images/console-*.png` when `UPDATE_SCREENSHOTS=1`.

use crate::admin::{admin_address, request, TokensFile, DEADLINE, OPERATOR, VIEWER};
use fantoccini::{Client, ClientBuilder, Locator};
use outbox_tests::{event, per_backend, room_events, Backend, RelayProcess, TestApp, TestEvent};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How to get what these tests need, in every failure that says it is missing.
const INSTALL: &str = "the console's browser tests need Chromium and chromedriver: \
     apt-get install -y chromium chromium-driver (scripts/test installs them)";
/// A desktop window; the phone-width test narrows it.
const WINDOW: (u32, u32) = (1280, 900);

/// The first of `names` found on `PATH`.
fn on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|directory| names.iter().map(move |name| directory.join(name)))
        .find(|candidate| candidate.is_file())
}

/// chromedriver on a port of its own, in a process group of its own with the browsers it
/// starts: the whole group is killed on drop, so a failed test leaves no browser behind.
struct ChromeDriver {
    child: Child,
    port: u16,
}

impl ChromeDriver {
    /// Starts chromedriver on a free loopback port and waits until it answers.
    async fn start() -> Self {
        let binary = on_path(&["chromedriver"])
            .unwrap_or_else(|| panic!("chromedriver is not on PATH; {INSTALL}"));
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(binary)
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("chromedriver does not start: {error}; {INSTALL}"));
        let driver = Self { child, port };
        outbox_tests::eventually("chromedriver listening", DEADLINE, || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        })
        .await;
        driver
    }
}

impl Drop for ChromeDriver {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Headless Chromium on the console of the relay at `address`.
struct Browser {
    client: Client,
    address: SocketAddr,
    /// Last: the session ends before its driver.
    _driver: ChromeDriver,
}

impl Browser {
    async fn open(address: SocketAddr) -> Self {
        let chromium = on_path(&["chromium", "chromium-browser", "google-chrome"])
            .unwrap_or_else(|| panic!("Chromium is not on PATH; {INSTALL}"));
        let driver = ChromeDriver::start().await;
        let (width, height) = WINDOW;
        let capabilities = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    format!("--window-size={width},{height}"),
                ],
            },
        });
        let Value::Object(capabilities) = capabilities else {
            unreachable!("an object")
        };
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{}", driver.port))
            .await
            .unwrap_or_else(|error| panic!("no browser session: {error}; {INSTALL}"));
        let browser = Self {
            client,
            address,
            _driver: driver,
        };
        browser.goto("/").await;
        browser
    }

    async fn goto(&self, path: &str) {
        let url = format!("http://{}{path}", self.address);
        self.client.goto(&url).await.expect("the page loads");
    }

    async fn find(&self, css: &str) -> fantoccini::elements::Element {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|error| panic!("{css}: {error}"))
    }

    async fn click(&self, css: &str) {
        self.find(css)
            .await
            .click()
            .await
            .unwrap_or_else(|error| panic!("click {css}: {error}"));
    }

    /// Replaces the text of the input `css` with `text`.
    async fn fill(&self, css: &str, text: &str) {
        let input = self.find(css).await;
        input.clear().await.expect("cleared");
        input
            .send_keys(text)
            .await
            .unwrap_or_else(|error| panic!("typing into {css}: {error}"));
    }

    /// The text of `css` as shown (empty while hidden), `None` while there is no such element.
    async fn text(&self, css: &str) -> Option<String> {
        let element = self.client.find(Locator::Css(css)).await.ok()?;
        element.text().await.ok()
    }

    /// Waits until the shown text of `css` satisfies `holds`; that text.
    async fn wait_text(&self, css: &str, what: &str, holds: impl Fn(&str) -> bool) -> String {
        let until = Instant::now() + DEADLINE;
        loop {
            let text = self.text(css).await;
            if let Some(text) = text.as_deref().filter(|text| holds(text)) {
                return text.to_owned();
            }
            assert!(
                Instant::now() < until,
                "timed out after {DEADLINE:?} waiting for {css} to show {what}; it shows {text:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Runs `script` (a function body) in the page; what it returns.
    async fn run(&self, script: &str) -> Value {
        self.client
            .execute(script, Vec::new())
            .await
            .unwrap_or_else(|error| panic!("{script}: {error}"))
    }

    /// Waits until the dead-events table shows `count` rows; their ids.
    async fn wait_rows(&self, count: usize) -> Vec<i64> {
        let until = Instant::now() + DEADLINE;
        loop {
            let ids = self
                .run(
                    "return Array.from(document.querySelectorAll('#dead-rows tr'))\
                     .map((row) => Number(row.dataset.id));",
                )
                .await;
            let ids: Vec<i64> = serde_json::from_value(ids).expect("ids");
            if ids.len() == count {
                return ids;
            }
            assert!(
                Instant::now() < until,
                "timed out after {DEADLINE:?} waiting for {count} rows; there are {}",
                ids.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn sign_in(&self, token: &str) {
        self.fill("#token", token).await;
        self.click("#sign-in-button").await;
    }

    /// Signs in with `token` and opens the dead events of `outbox`.
    async fn open_dead(&self, token: &str, outbox: &str) {
        self.sign_in(token).await;
        let card = format!("article.card[data-outbox=\"{outbox}\"] .open-dead");
        self.wait_text(&card, "the outbox's card", |text| {
            text.starts_with("Dead events")
        })
        .await;
        self.click(&card).await;
        self.wait_text("#dead-outbox", "the outbox's name", |text| text == outbox)
            .await;
    }

    /// The page as it is, written to `docs/images/console-<name>.png` when
    /// `UPDATE_SCREENSHOTS=1`.
    async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.expect("a screenshot");
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        if std::env::var("UPDATE_SCREENSHOTS").as_deref() == Ok("1") {
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../docs/images")
                .join(format!("console-{name}.png"));
            std::fs::write(&path, png)
                .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
        }
    }

    async fn close(self) {
        let _ = self.client.close().await;
    }
}

/// A relay whose events die at their first attempt (nothing is bound), with the admin API
/// and the tokens of the admin tests.
async fn relay_with_dead_events(
    backend: Backend,
    tokens: &TokensFile,
    events: &[outbox_store::NewEvent],
) -> (TestApp, RelayProcess, SocketAddr) {
    relay_with_failing_events(backend, tokens, events, 1).await
}

/// A relay whose events fail (nothing is bound), dead after `max_attempts` (0: never),
/// with the admin API and the tokens of the admin tests.
async fn relay_with_failing_events(
    backend: Backend,
    tokens: &TokensFile,
    events: &[outbox_store::NewEvent],
    max_attempts: i64,
) -> (TestApp, RelayProcess, SocketAddr) {
    let app = TestApp::on(backend)
        .binding("nothing.bound")
        .settings(|settings| {
            settings.relay.max_attempts = max_attempts;
            settings.log.format = "json".into();
            settings.metrics.listen = "127.0.0.1:0".into();
            settings.admin.enabled = true;
            settings.admin.listen = "127.0.0.1:0".into();
            settings.admin.tokens_file = tokens.0.display().to_string();
        })
        .seeded(events)
        .build()
        .await;
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    let address = admin_address(&relay).await;
    (app, relay, address)
}

#[actix_rt::test]
async fn the_page_loads_without_a_token_under_its_own_policy() {
    let tokens = TokensFile::new();
    let (app, relay, address) = relay_with_dead_events(Backend::Postgres, &tokens, &[]).await;
    for (path, media_type) in [
        ("/", "text/html"),
        ("/console/app.js", "text/javascript"),
        ("/console/app.css", "text/css"),
    ] {
        let answer = request(address, "GET", path, None, None).await;
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
        let header = |name: &str| answer.headers.get(name).cloned().unwrap_or_default();
        assert!(header("content-type").starts_with(media_type), "{path}");
        assert_eq!(
            header("content-security-policy"),
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
             img-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
            "{path}"
        );
        assert_eq!(header("cache-control"), "no-store", "{path}");
        assert_eq!(header("x-content-type-options"), "nosniff", "{path}");
    }
    // The API keeps its own, stricter policy.
    let api = request(address, "GET", "/api/v1/outboxes", None, None).await;
    assert_eq!(api.status, 401);
    assert_eq!(
        api.headers
            .get("content-security-policy")
            .map(String::as_str),
        Some("default-src 'none'; frame-ancestors 'none'")
    );
    relay.stop(DEADLINE).await;
    app.teardown().await;
}

#[actix_rt::test]
async fn signing_in_refuses_a_wrong_token_and_takes_a_right_one() {
    let tokens = TokensFile::new();
    // Failing and retried, never dead: the pending events' failures show as a group.
    let events = [
        event("s1", "a").of_type("order.created"),
        event("s2", "b").of_type("order.created"),
    ];
    let (app, relay, address) =
        relay_with_failing_events(Backend::Postgres, &tokens, &events, 0).await;
    let outbox = app.database.table.as_str().to_owned();
    let browser = Browser::open(address).await;

    browser.sign_in("not-a-token-we-know").await;
    browser
        .wait_text("#sign-in-error", "the refusal", |text| {
            text.contains("not accepted")
        })
        .await;
    assert_eq!(
        browser.text("#console").await.as_deref(),
        Some(""),
        "hidden"
    );

    browser.sign_in(VIEWER).await;
    let card = format!("article.card[data-outbox=\"{outbox}\"]");
    let failing = format!("{card} .failing li");
    let group = browser
        .wait_text(&failing, "a group of failures", |text| {
            text.starts_with("2\nunroutable")
        })
        .await;
    assert!(group.contains("routing_key=order.created"), "{group}");
    let shown = browser.text(&card).await.unwrap_or_default();
    assert!(
        shown.contains("Pending\n2") && shown.contains("Dead\n0"),
        "{shown}"
    );
    assert_eq!(browser.text("#sign-in-error").await.as_deref(), Some(""));
    let kept = browser
        .run("return sessionStorage.getItem('outbox-relay-admin-token');")
        .await;
    assert_eq!(kept, json!(VIEWER), "kept for the tab");
    // A reload keeps the tab signed in.
    browser.goto("/").await;
    browser
        .wait_text(&card, "the outbox after a reload", |text| {
            text.contains(&outbox)
        })
        .await;
    browser.screenshot("outboxes").await;

    browser.click("#sign-out").await;
    browser
        .wait_text("#sign-in", "the sign-in form", |text| {
            text.contains("Sign in")
        })
        .await;
    let kept = browser
        .run("return sessionStorage.getItem('outbox-relay-admin-token');")
        .await;
    assert_eq!(kept, Value::Null, "forgotten at sign-out");
    browser.close().await;
    relay.stop(DEADLINE).await;
    app.teardown().await;
}

/// A body that would run script if the page ever set it as markup.
const HOSTILE: &str = r#"{"note":"<img src=x id=injected onerror=\"document.title='injected'\">"}"#;

async fn an_operator_requeues_a_group_after_confirming_its_count(backend: Backend) {
    let tokens = TokensFile::new();
    let events = [
        event("o1", "a").of_type("order.created"),
        event("o2", "b").of_type("order.paid"),
        event("o3", "a").of_type("order.shipped"),
        event("x1", "a")
            .of_type("invoice.created")
            .with_envelope(HOSTILE),
        event("x2", "c").of_type("invoice.paid"),
    ];
    let (app, relay, address) = relay_with_dead_events(backend, &tokens, &events).await;
    let outbox = app.database.table.as_str().to_owned();
    app.database.wait_dead(5, DEADLINE).await;
    let browser = Browser::open(address).await;
    browser.open_dead(OPERATOR, &outbox).await;
    browser.wait_rows(5).await;

    // The filter narrows the listing, and "requeue all matching" asks with the dry run's count.
    browser.fill("#filter-type", "order.*").await;
    browser.click("#filter-apply").await;
    browser.wait_rows(3).await;
    app.broker.bind("order.#").await;
    browser.click("#requeue-filter").await;
    browser
        .wait_text("#confirm-text", "the confirmation", |text| {
            text == "Requeue 3 events?"
        })
        .await;
    assert!(
        app.broker.received().is_empty(),
        "nothing before confirming"
    );
    browser.click("#confirm-yes").await;
    browser
        .wait_text("#action-result", "the result", |text| {
            text == "Requeued 3 events."
        })
        .await;
    let received = app.broker.wait_for(3, DEADLINE).await;
    let mut delivered: Vec<&str> = received.iter().map(|r| r.message_id.as_str()).collect();
    delivered.sort();
    assert_eq!(delivered, ["o1", "o2", "o3"]);
    browser.wait_rows(0).await;

    // The hostile body is shown as text, and runs nothing.
    browser.click("#filter-clear").await;
    let ids = browser.wait_rows(2).await;
    browser
        .click(&format!("#dead-rows tr[data-id=\"{}\"] td.key", ids[0]))
        .await;
    let envelope = browser
        .wait_text("#event-envelope", "the envelope", |text| {
            text.contains("\"note\"")
        })
        .await;
    assert!(envelope.contains("<img src=x id=injected"), "{envelope}");
    assert!(
        envelope.starts_with("{\n  \"note\""),
        "pretty-printed: {envelope}"
    );
    assert_eq!(
        browser
            .run("return document.getElementById('injected');")
            .await,
        Value::Null
    );
    assert_ne!(browser.client.title().await.expect("a title"), "injected");
    if backend == Backend::Postgres {
        browser.screenshot("requeue").await;
    }
    browser.close().await;
    relay.stop(DEADLINE).await;
    app.teardown().await;
}

per_backend!(an_operator_requeues_a_group_after_confirming_its_count: postgres, sqlite, mariadb);

#[actix_rt::test]
async fn a_viewers_requeue_is_refused_and_the_page_says_so() {
    let tokens = TokensFile::new();
    let events = [event("v1", "a"), event("v2", "b")];
    let (app, relay, address) = relay_with_dead_events(Backend::Postgres, &tokens, &events).await;
    let outbox = app.database.table.as_str().to_owned();
    app.database.wait_dead(2, DEADLINE).await;
    let browser = Browser::open(address).await;
    browser.open_dead(VIEWER, &outbox).await;
    let ids = browser.wait_rows(2).await;
    browser
        .click(&format!("#dead-rows tr[data-id=\"{}\"] .pick", ids[0]))
        .await;
    browser
        .wait_text("#requeue-selected", "one selected", |text| {
            text.ends_with("(1)")
        })
        .await;
    browser.click("#requeue-selected").await;
    let said = browser
        .wait_text("#action-result", "the refusal", |text| !text.is_empty())
        .await;
    assert!(
        said.starts_with("Refused: this token is a viewer's") && said.contains("operator token"),
        "{said}"
    );
    assert_eq!(
        browser.text("#confirm").await.as_deref(),
        Some(""),
        "no confirmation"
    );
    let dead = app.database.rows().await;
    assert!(
        dead.iter().all(|row| row.status == "dead"),
        "nothing requeued"
    );
    browser.screenshot("viewer-refused").await;
    browser.close().await;
    relay.stop(DEADLINE).await;
    app.teardown().await;
}

/// Dead rows of the filter test: each in a room (key) of its own.
const MANY: usize = 10_000;

#[actix_rt::test]
async fn a_filter_by_key_finds_one_event_among_many() {
    let tokens = TokensFile::new();
    let seeding = Instant::now();
    // Seeded dead: the relay's own attempts would only slow the test down.
    let events = room_events("many", MANY, MANY);
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.log.format = "json".into();
            settings.metrics.listen = "127.0.0.1:0".into();
            settings.admin.enabled = true;
            settings.admin.listen = "127.0.0.1:0".into();
            settings.admin.tokens_file = tokens.0.display().to_string();
        })
        .seeded(&events)
        .build()
        .await;
    app.database
        .execute(
            "UPDATE {t} SET status = 'dead', retry_count = 1, last_error = 'unroutable: NO_ROUTE'",
        )
        .await;
    eprintln!("{MANY} dead rows seeded in {:?}", seeding.elapsed());
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    let address = admin_address(&relay).await;
    let outbox = app.database.table.as_str().to_owned();
    let browser = Browser::open(address).await;
    browser.open_dead(VIEWER, &outbox).await;

    // A page at a time, by the API's cursor.
    let first = browser.wait_rows(50).await;
    browser.click("#page-next").await;
    browser
        .wait_text("#page-number", "the second page", |text| text == "Page 2")
        .await;
    let second = browser.wait_rows(50).await;
    assert!(second[0] > first[49], "{first:?} then {second:?}");

    let key = "room-4321";
    browser.fill("#filter-key", key).await;
    browser.click("#filter-apply").await;
    browser.wait_rows(1).await;
    let shown = browser
        .wait_text("#dead-rows td.key", "the key", |text| text == key)
        .await;
    assert_eq!(shown, key);
    assert_eq!(
        browser.text("#page-number").await.as_deref(),
        Some("Page 1")
    );
    assert!(
        !browser
            .find("#page-next")
            .await
            .is_enabled()
            .await
            .expect("enabled?"),
        "one page"
    );

    // At a phone's width the page keeps to the screen.
    browser
        .client
        .set_window_size(390, 844)
        .await
        .expect("a phone's width");
    let overflow = browser
        .run("return document.documentElement.scrollWidth - document.documentElement.clientWidth;")
        .await;
    assert_eq!(overflow, json!(0), "no sideways scrolling");
    browser.screenshot("filter-phone").await;
    browser.close().await;
    relay.stop(DEADLINE).await;
    app.teardown().await;
}
