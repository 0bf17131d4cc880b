//! `outbox-relay top`: the live view in a pseudo-terminal (tmux), and `--once` against
//! `status`.

use outbox_tests::output::succeeded;
use outbox_tests::{
    assert_within, event, eventually, http_get, run_binary, seed, unique_name, within, Backend,
    Load, OutputInTime as _, RelayProcess, TestApp, TestEvent,
};
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

/// When the live view shows its first published/s: the first figures a second after start,
/// on a screen refreshed every second (docs/metrics.md, "Watching it live").
const FIRST_FIGURES: Duration = Duration::from_secs(2);
/// How far apart `top --once` and `status` may see the oldest pending age: the relay
/// samples it every 5 s (docs/metrics.md), `--once` takes two looks a second apart, and
/// `status` reads the table itself.
const AGE_SAMPLES_APART: Duration = Duration::from_secs(5 + 1);

/// Fails, saying how to install it, without tmux.
fn require_tmux() {
    assert!(
        Command::new("tmux").arg("-V").output_in_time().is_ok(),
        "this test needs tmux for a pseudo-terminal: apt-get install -y tmux"
    );
}

/// A tmux server of the test's own (its socket name), killed on drop.
struct Tmux(String);

impl Tmux {
    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .args(["-L", &self.0])
            .args(args)
            .output_in_time()
            .expect("tmux runs")
    }

    /// The screen, as text.
    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
    }

    fn running(&self) -> bool {
        self.run(&["has-session", "-t", "top"]).status.success()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// The sum of every sample of `name` in Prometheus text.
fn total(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            (series.split('{').next()? == name).then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

/// The cells of `outbox`'s row in a table of `top` (the screen or `--once`).
fn row_of(table: &str, outbox: &str) -> Option<Vec<String>> {
    table
        .lines()
        .map(|line| {
            line.split_whitespace()
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .find(|cells| cells.first().is_some_and(|first| first == outbox))
}

fn number(cell: &str) -> Option<f64> {
    cell.parse().ok()
}

/// A cell of seconds as `top` writes them: `7.5s`, or `151ms` under a second.
fn seconds(cell: &str) -> Option<f64> {
    match cell.strip_suffix("ms") {
        Some(millis) => number(millis).map(|millis| millis / 1000.0),
        None => number(cell.strip_suffix('s')?),
    }
}

#[actix_rt::test]
async fn top_shows_a_running_relays_published_rate_and_backlog_within_2_s_and_q_quits() {
    require_tmux();
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.metrics.listen = "127.0.0.1:0".into();
            settings.log.format = "json".into();
        })
        .build()
        .await;
    let outbox = app.database.table.to_string();
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    let address = relay.metrics_address().await;
    let load = Load::start(&app.database, 5, Duration::from_millis(100));
    eventually("the relay publishing", Duration::from_secs(30), || async {
        total(
            &http_get(address, "/metrics").await.1,
            "outbox_events_published_total",
        ) > 0.0
    })
    .await;

    let tmux = Tmux(unique_name("top"));
    let command = format!(
        "{} --config /dev/null top http://{address}/metrics",
        crate::RELAY
    );
    let started = Instant::now();
    let output = tmux.run(&[
        "new-session",
        "-d",
        "-x",
        "160",
        "-y",
        "40",
        "-s",
        "top",
        &command,
    ]);
    assert!(output.status.success(), "tmux new-session: {output:?}");
    let mut screen = String::new();
    let mut row = None;
    while started.elapsed() < within(FIRST_FIGURES) {
        screen = tmux.screen();
        row = row_of(&screen, &outbox).filter(|cells| {
            // published/s above 0, a backlog figure.
            cells.len() >= 9
                && number(&cells[2]).is_some_and(|rate| rate > 0.0)
                && number(&cells[4]).is_some()
        });
        if row.is_some() {
            break;
        }
        // Not a thread sleep: the load inserts on this thread meanwhile.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let row = row.unwrap_or_else(|| {
        panic!(
            "no published/s and backlog within {FIRST_FIGURES:?} (+ the margin) of start; the \
             screen:\n{screen}"
        )
    });
    println!("top after {:?}: {row:?}", started.elapsed());
    assert_within(
        "top's first published/s and backlog",
        started.elapsed(),
        FIRST_FIGURES,
    );
    assert_eq!(
        row[1], app.settings.relay.node_id,
        "the node's id:\n{screen}"
    );
    assert!(row[8..].join(" ") == "up", "state up:\n{screen}");
    assert!(
        screen.contains("PUBLISHED/S") && screen.contains("BACKLOG"),
        "{screen}"
    );
    assert!(screen.contains("1 of 1 node(s) answering"), "{screen}");

    let output = tmux.run(&["send-keys", "-t", "top", "q"]);
    assert!(output.status.success(), "tmux send-keys: {output:?}");
    eventually("top to quit on q", Duration::from_secs(5), || {
        std::future::ready(!tmux.running())
    })
    .await;

    drop(load);
    relay.stop(Duration::from_secs(5)).await;
    app.teardown().await;
}

#[actix_rt::test]
async fn top_once_prints_the_backlog_oldest_age_and_dead_that_status_prints() {
    let app = TestApp::on(Backend::Postgres)
        .binding("room.#")
        .settings(|settings| {
            settings.metrics.listen = "127.0.0.1:0".into();
            settings.log.format = "json".into();
            settings.relay.max_attempts = 1;
        })
        .build()
        .await;
    let outbox = app.database.table.to_string();
    let mut events = outbox_tests::room_events("once", 30, 3);
    // Dead at its first failure: unroutable, the queue binds room.#.
    events.push(event("orphan", "orphan-room").of_type("orphan.created"));
    // Pending for an hour: a backlog of one, ageing.
    events.push(
        event("later", "later-room").available_at(chrono::Utc::now() + chrono::Duration::hours(1)),
    );
    seed(&app.database, &events).await;
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    let address = relay.metrics_address().await;
    app.database.wait_dead(1, Duration::from_secs(30)).await;
    // The counters after the Marker's commit, the gauges at their next sample (5 s).
    eventually(
        "the metrics to show the table",
        Duration::from_secs(30),
        || async {
            let text = http_get(address, "/metrics").await.1;
            total(&text, "outbox_events_published_total") == 30.0
                && total(&text, "outbox_events_dead_total") == 1.0
                && total(&text, "outbox_pending_events") == 1.0
                && total(&text, "outbox_oldest_pending_age_seconds") > 0.0
        },
    )
    .await;

    let url = format!("http://{address}/metrics");
    let unreachable: SocketAddr = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        listener.local_addr().expect("its address")
    };
    let top = succeeded(
        "top --once",
        &run_binary(
            crate::RELAY,
            &app.settings,
            &["top", "--once", &url, &unreachable.to_string()],
        ),
    );
    let status = succeeded(
        "status --json",
        &run_binary(crate::RELAY, &app.settings, &["status", "--json"]),
    );
    let status: serde_json::Value = serde_json::from_str(&status).expect("status --json is JSON");

    let lines: Vec<&str> = top.lines().collect();
    assert!(
        lines[0].starts_with("OUTBOX") && lines[0].contains("PUBLISHED/S"),
        "{top}"
    );
    assert!(
        lines[1].contains(&unreachable.to_string()) && lines[1].contains("unreachable"),
        "the node that does not answer comes first:\n{top}"
    );
    let row = row_of(&top, &outbox).unwrap_or_else(|| panic!("no row for {outbox}:\n{top}"));
    assert_eq!(row[1], app.settings.relay.node_id, "{top}");
    // The same figures as status: the backlog, the dead events, the oldest pending age
    // (the relay samples it every 5 s, status reads it now).
    assert_eq!(
        number(&row[4]),
        status["pending"].as_f64(),
        "backlog:\n{top}\n{status}"
    );
    assert_eq!(
        number(&row[6]),
        status["dead"].as_f64(),
        "dead:\n{top}\n{status}"
    );
    let oldest = seconds(&row[5]).unwrap_or_else(|| panic!("oldest age:\n{top}"));
    let expected = status["oldest_pending_age_seconds"]
        .as_f64()
        .expect("an oldest age");
    assert_within(
        &format!("oldest age {oldest} s against status's {expected} s:\n{top}\n"),
        Duration::from_secs_f64((oldest - expected).abs()),
        AGE_SAMPLES_APART,
    );
    assert_eq!(row[8..].join(" "), "up", "{top}");

    // Without URLs: the node of this host, metrics.listen of the settings.
    let local = app.settings_with(|settings| settings.metrics.listen = address.to_string().into());
    let top = succeeded(
        "top --once (local)",
        &run_binary(crate::RELAY, &local, &["top", "--once"]),
    );
    let row = row_of(&top, &outbox).unwrap_or_else(|| panic!("no row for {outbox}:\n{top}"));
    assert_eq!(number(&row[4]), status["pending"].as_f64(), "{top}");
    assert_eq!(number(&row[6]), status["dead"].as_f64(), "{top}");

    // Only nodes that do not answer: the table, and exit code 1.
    let output = run_binary(
        crate::RELAY,
        &app.settings,
        &["top", "--once", &unreachable.to_string()],
    );
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("unreachable"),
        "{output:?}"
    );
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("no node answered (1 asked)"),
        "{output:?}"
    );

    // The live view off a terminal: a usage error pointing at --once.
    let output = run_binary(crate::RELAY, &app.settings, &["top", &url]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("top --once"),
        "{output:?}"
    );

    // No URL and no metrics.listen: a usage error naming the setting.
    let output = run_binary(
        crate::RELAY,
        &app.settings_with(|s| s.metrics.listen = "".into()),
        &["top", "--once"],
    );
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("metrics.listen is empty"),
        "{output:?}"
    );

    relay.stop(Duration::from_secs(5)).await;
    app.teardown().await;
}
