//! Stalls that on-call sees: an outbox whose events keep failing while none is published
//! (no queue bound for their routing key) is shown by `/readyz`, `outbox_stalled`,
//! `status` and one log line naming the cause and the next step, and stops being shown
//! once its events flow again. The line is said once for the whole stall, not again while
//! the events keep failing. On every backend.

use outbox_tests::output::stdout;
use outbox_tests::{
    eventually, http_get, per_backend, room_events, run_binary, Backend, RelayProcess, TestApp,
};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);

async fn an_outbox_whose_events_all_fail_is_stalled_everywhere_on_call_looks(backend: Backend) {
    // The queue is bound for another routing key: every event comes back unroutable.
    let seeded = room_events("stall", 20, 4);
    let app = TestApp::on(backend)
        .binding("nothing.matches")
        .seeded(&seeded)
        .build()
        .await;
    let settings = app.settings_with(|settings| {
        settings.relay.stall_after = "2s".into();
        settings.relay.retry_interval = "200ms".into();
        // Retries stay frequent, so the events keep failing for the whole stall.
        settings.relay.retry_max_interval = "1s".into();
        settings.metrics.listen = "127.0.0.1:0".into();
        settings.log.format = "json".into();
    });
    let relay = RelayProcess::spawn(crate::RELAY, &settings);
    let address = relay.metrics_address().await;

    eventually("/readyz says stalled", DEADLINE, || async {
        let (code, body) = http_get(address, "/readyz").await;
        code == 503 && body.contains("stalled:") && body.contains("(unroutable)")
    })
    .await;
    let (_, metrics) = http_get(address, "/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|line| line.starts_with("outbox_stalled{")
                && line.contains("reason=\"unroutable\"")
                && line.ends_with(" 1")),
        "{metrics}"
    );
    let said = relay.log_lines("outbox stalled");
    assert_eq!(said.len(), 1, "said once:\n{}", relay.log_text());
    assert_eq!(said[0]["level"], "WARN", "{}", said[0]);
    assert_eq!(said[0]["reason"], "unroutable", "{}", said[0]);
    let next_step = said[0]["next_step"].as_str().unwrap_or_default();
    assert!(next_step.contains("bind"), "{}", said[0]);

    // Once, not once so far: the failures go on until the failure summary (due
    // `SUMMARY_INTERVAL`, 10 s, after the first failure, several times `stall_after`), and
    // the stall is still said by one line.
    eventually("the summary of the failures", DEADLINE, || async {
        relay
            .log_lines("publishes failed for this reason since its last line")
            .iter()
            .any(|line| line["reason"] == "unroutable")
    })
    .await;
    assert_eq!(
        http_get(address, "/readyz").await.0,
        503,
        "still stalled at the summary"
    );
    let said = relay.log_lines("outbox stalled");
    assert_eq!(
        said.len(),
        1,
        "said once for the whole stall:\n{}",
        relay.log_text()
    );

    let status = run_binary(crate::RELAY, &settings, &["status"]);
    let text = stdout(&status);
    assert!(status.status.success(), "{status:?}");
    assert!(
        text.lines()
            .any(|line| line.starts_with("failing") && line.contains("unroutable")),
        "{text}"
    );
    assert!(
        text.lines().any(|line| line.starts_with("oldest failing")),
        "{text}"
    );

    // Bound: the events flow, and the stall ends.
    app.broker.bind("#").await;
    app.database.wait_all_published(DEADLINE).await;
    eventually("/readyz ready again", DEADLINE, || async {
        http_get(address, "/readyz").await.0 == 200
    })
    .await;
    assert_eq!(relay.log_lines("outbox no longer stalled").len(), 1);
    relay.stop(Duration::from_secs(10)).await;
    app.teardown().await;
}

per_backend!(an_outbox_whose_events_all_fail_is_stalled_everywhere_on_call_looks: postgres, sqlite, mariadb);
