//! The log lines the docs document, each at its level and once per change: outcomes
//! (`published` debug, `pending` warn, `dead` error), `database unavailable` and `database
//! available again`, `status=batch_failed`, readiness changes.

use outbox_tests::services::{amqp_url, database_url};
use outbox_tests::{
    event, eventually, room_events, seed, Backend, FaultProxy, RelayProcess, TestApp, TestEvent,
};
use std::time::Duration;

const UNAVAILABLE: &str = "database unavailable: claims fail; retrying with backoff";
const AVAILABLE: &str = "database available again; claiming";

/// The lines of `relay`'s log with `message` exactly.
fn lines(relay: &RelayProcess, message: &str) -> Vec<serde_json::Value> {
    relay
        .log_lines(message)
        .into_iter()
        .filter(|line| line["message"] == message)
        .collect()
}

/// Every line of `relay`'s log with `message` at `level`, and at least one.
fn at_level(relay: &RelayProcess, message: &str, level: &str) -> Vec<serde_json::Value> {
    let found = lines(relay, message);
    assert!(
        !found.is_empty(),
        "no {message:?} line:\n{}",
        relay.log_text()
    );
    for line in &found {
        assert_eq!(line["level"], level, "{line}");
    }
    found
}

#[actix_rt::test]
async fn the_documented_log_lines_each_at_its_level_and_once_per_change() {
    let (database, database_proxied) =
        FaultProxy::in_front_of(&database_url(Backend::Postgres)).await;
    let (broker, broker_proxied) = FaultProxy::in_front_of(&amqp_url()).await;
    let mut seeded = room_events("warm", 5, 1);
    // Nothing is bound for it: it fails (warn), then is dead after its second attempt (error).
    seeded.push(event("orphan", "o").of_type("orphan.created"));
    let app = TestApp::on(Backend::Postgres)
        .binding("room.#")
        .settings(|settings| {
            settings.database.url = database_proxied;
            settings.amqp.url = broker_proxied;
            settings.relay.max_attempts = 2;
            settings.relay.retry_interval = "100ms".into();
            settings.relay.publish_timeout = "2s".into();
            settings.metrics.listen = "127.0.0.1:0".into();
            settings.log.format = "json".into();
            settings.log.level = "info,outbox_pipeline=debug".into();
        })
        .seeded(&seeded)
        .build()
        .await;
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    app.database.wait_dead(1, Duration::from_secs(60)).await;
    eventually("the warm-up published", Duration::from_secs(60), || async {
        app.database
            .rows()
            .await
            .iter()
            .filter(|row| row.status == "published")
            .count()
            == 5
    })
    .await;

    // Outcomes, each at its level, with its status.
    eventually("the outcome lines", Duration::from_secs(10), || {
        std::future::ready(lines(&relay, "event published").len() >= 5)
    })
    .await;
    for line in at_level(&relay, "event published", "DEBUG") {
        assert_eq!(line["status"], "published", "{line}");
    }
    let retried = at_level(&relay, "publish failed; will retry", "WARN");
    assert_eq!(
        (
            retried[0]["status"].as_str(),
            retried[0]["event_id"].as_str()
        ),
        (Some("pending"), Some("orphan"))
    );
    let dead = at_level(&relay, "publish failed; event is dead", "ERROR");
    assert_eq!(
        (dead[0]["status"].as_str(), dead[0]["event_id"].as_str()),
        (Some("dead"), Some("orphan"))
    );
    eventually("ready logged", Duration::from_secs(30), || {
        std::future::ready(!lines(&relay, "ready: database and broker usable").is_empty())
    })
    .await;

    // The database goes away from an idle relay: its claims fail again and again (the
    // later ones at debug); the change is logged once, and once when it is back.
    database.go_down();
    eventually("three failed claims", Duration::from_secs(30), || {
        std::future::ready(
            lines(&relay, UNAVAILABLE).len() + lines(&relay, "claim failed again").len() >= 3,
        )
    })
    .await;
    database.restore();
    eventually("available again", Duration::from_secs(30), || {
        std::future::ready(!lines(&relay, AVAILABLE).is_empty())
    })
    .await;
    assert_eq!(
        at_level(&relay, UNAVAILABLE, "WARN").len(),
        1,
        "once for the outage, not per failed claim"
    );

    let (not_ready, ready) = (
        lines(&relay, "not ready; /readyz answers 503").len(),
        lines(&relay, "ready: database and broker usable").len(),
    );
    // Publishes in flight when the database goes away: their outcomes cannot be written.
    broker.stall();
    let held = room_events("held", 10, 2);
    seed(&app.database, &held).await;
    let node = app.settings.relay.node_id.clone();
    eventually("the held rows claimed", Duration::from_secs(30), || async {
        app.database
            .rows()
            .await
            .iter()
            .any(|row| row.locked_by.as_deref() == Some(&node))
    })
    .await;
    database.go_down();
    broker.restore();
    eventually(
        "a failed outcome write and the claims failing",
        Duration::from_secs(30),
        || {
            std::future::ready(
                !lines(&relay, "writing outcomes failed; keeping them and retrying").is_empty()
                    && lines(&relay, "not ready; /readyz answers 503").len() > not_ready,
            )
        },
    )
    .await;
    database.restore();
    eventually(
        "the held rows published",
        Duration::from_secs(60),
        || async {
            let rows = app.database.rows().await;
            held.iter().all(|event| {
                rows.iter()
                    .any(|row| row.event_id == event.event_id && row.status == "published")
            })
        },
    )
    .await;
    eventually(
        "available again and ready, logged",
        Duration::from_secs(30),
        || {
            std::future::ready(
                lines(&relay, AVAILABLE).len() == lines(&relay, UNAVAILABLE).len()
                    && lines(&relay, "ready: database and broker usable").len() > ready,
            )
        },
    )
    .await;

    for line in at_level(
        &relay,
        "writing outcomes failed; keeping them and retrying",
        "WARN",
    ) {
        assert_eq!(line["status"], "batch_failed", "{line}");
    }
    // One line per change, not one per failed attempt: at most once per outage (the
    // second may see no claim fail, its Fetcher waiting for the outcomes in flight), and
    // each loss with its return.
    let lost = at_level(&relay, UNAVAILABLE, "WARN").len();
    assert!(lost <= 2, "{lost} lines for two outages");
    assert_eq!(at_level(&relay, AVAILABLE, "INFO").len(), lost);
    at_level(&relay, "not ready; /readyz answers 503", "WARN");
    at_level(&relay, "ready: database and broker usable", "INFO");
    let readiness: Vec<String> = relay
        .log_lines("")
        .into_iter()
        .filter(|line| {
            line["message"] == "not ready; /readyz answers 503"
                || line["message"] == "ready: database and broker usable"
        })
        .map(|line| format!("{} {}", line["message"], line["problems"]))
        .collect();
    for pair in readiness.windows(2) {
        assert_ne!(
            pair[0], pair[1],
            "a readiness change logged twice: {readiness:?}"
        );
    }
    relay
        .stop(outbox_tests::within(Duration::from_secs(2 + 2)))
        .await;
    app.teardown().await;
}
