//! RabbitMQ's resource alarms: while the broker blocks publishers (`connection.blocked`),
//! the relay pauses instead of timing publishes out and publishing them again.
//!
//! The alarm is the real one: `rabbitmqctl set_vm_memory_high_watermark absolute 1`,
//! restored to the value read before (even when the test fails). Where `rabbitmqctl`
//! (`OUTBOX_TEST_RABBITMQCTL`, by default the one on the PATH) cannot reach the test broker
//! the test says it is skipped and how to enable it, and returns; where `CI` is set such a
//! skip fails the test.

use outbox_tests::services::rabbitmqctl_command;
use outbox_tests::OutputInTime as _;
use outbox_tests::{
    eventually, http_get as get, room_events, seed, Backend, RelayProcess, TestApp,
};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How long the first alarm lasts: the measurement.
const ALARM: Duration = Duration::from_secs(8);

/// The memory high watermark of the local broker, as `rabbitmqctl` sets it.
struct Watermark {
    /// The arguments of `set_vm_memory_high_watermark` that put it back.
    restore: Vec<String>,
}

impl Watermark {
    /// Reads the current watermark, or says why the alarm test cannot run here.
    fn read() -> Result<Self, String> {
        if let Ok(url) = std::env::var("OUTBOX_TEST_AMQP_URL") {
            if !(url.contains("@127.0.0.1") || url.contains("@localhost")) {
                return Err(format!("the test broker ({url}) is not the local node"));
            }
        }
        let output = rabbitmqctl_command()
            .args(["eval", "vm_memory_monitor:get_vm_memory_high_watermark()."])
            .output_in_time()
            .map_err(|error| format!("rabbitmqctl does not run: {error}"))?;
        if !output.status.success() {
            return Err(format!(
                "rabbitmqctl cannot reach the broker: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        let value = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        // `0.4` (a fraction of the memory) or `{absolute,1073741824}` (bytes).
        let restore = match value
            .strip_prefix("{absolute,")
            .and_then(|rest| rest.strip_suffix('}'))
        {
            Some(bytes) => {
                let bytes: u64 = bytes
                    .parse()
                    .map_err(|_| format!("unexpected watermark {value:?}"))?;
                assert!(
                    bytes > 64 * 1024 * 1024,
                    "the broker's memory watermark is {bytes} bytes: an earlier alarm test was \
                     not restored; run `rabbitmqctl set_vm_memory_high_watermark 0.4` (0.6 on \
                     RabbitMQ 4, its default)"
                );
                vec!["absolute".to_owned(), bytes.to_string()]
            }
            None => {
                value
                    .parse::<f64>()
                    .map_err(|_| format!("unexpected watermark {value:?}"))?;
                vec![value]
            }
        };
        Ok(Self { restore })
    }

    /// Raises the memory alarm until the returned guard is dropped.
    fn raise_alarm(&self) -> MemoryAlarm<'_> {
        set_watermark(&["absolute", "1"]).unwrap_or_else(|error| panic!("{error}"));
        MemoryAlarm { watermark: self }
    }
}

/// A raised memory alarm; dropping it (also while a failed test unwinds) restores the
/// watermark read before.
struct MemoryAlarm<'a> {
    watermark: &'a Watermark,
}

impl Drop for MemoryAlarm<'_> {
    /// Restores the watermark; a failure is logged, never a panic (which, while a failed
    /// test unwinds, would abort the binary and lose the test's own message).
    fn drop(&mut self) {
        let restore: Vec<&str> = self.watermark.restore.iter().map(String::as_str).collect();
        if let Err(error) = set_watermark(&restore) {
            eprintln!(
                "{error}: the broker's memory alarm is still raised; restore it with \
                 `rabbitmqctl set_vm_memory_high_watermark {}`",
                restore.join(" ")
            );
        }
    }
}

fn set_watermark(args: &[&str]) -> Result<(), String> {
    let output = rabbitmqctl_command()
        .arg("set_vm_memory_high_watermark")
        .args(args)
        .output_in_time()
        .map_err(|error| format!("rabbitmqctl does not run: {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "rabbitmqctl set_vm_memory_high_watermark {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// `outbox_broker_blocked` in Prometheus text.
fn blocked_gauge(metrics: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|line| line.starts_with("outbox_broker_blocked{"))
        .and_then(|line| line.rsplit_once(' '))
        .and_then(|(_, value)| value.parse().ok())
}

/// Waits until `/readyz` and the gauge both show the alarm (`blocked`) or both do not.
async fn shows_alarm(address: SocketAddr, blocked: bool, deadline: Duration) {
    eventually(
        &format!("/readyz and outbox_broker_blocked to show blocked = {blocked}"),
        deadline,
        || async {
            let readyz = get(address, "/readyz").await;
            let gauge = blocked_gauge(&get(address, "/metrics").await.1);
            if blocked {
                readyz.0 == 503
                    && readyz.1.contains("broker blocks publishers")
                    && gauge == Some(1.0)
            } else {
                readyz == (200, "ready\n".into()) && gauge == Some(0.0)
            }
        },
    )
    .await;
}

#[actix_rt::test]
async fn a_memory_alarm_pauses_publishing_without_duplicates_and_sigterm_still_exits() {
    let watermark = match Watermark::read() {
        Ok(watermark) => watermark,
        Err(why) => {
            outbox_tests::skip(
                "a_memory_alarm_pauses_publishing_without_duplicates_and_sigterm_still_exits",
                &why,
                "run it on the broker's machine, as a user whose `rabbitmqctl` reaches the \
                 broker (OUTBOX_TEST_AMQP_URL on 127.0.0.1 or localhost)",
            );
            return;
        }
    };
    const EVENTS: usize = 5_000;
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.metrics.listen = "127.0.0.1:0".into();
            settings.log.format = "json".into();
            settings.relay.retry_interval = "200ms".into();
        })
        .build()
        .await;
    let mut relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    let address = relay.metrics_address().await;
    shows_alarm(address, false, Duration::from_secs(30)).await;
    // RabbitMQ blocks connections that publish: this one has.
    let warm_up = room_events("warm", 1, 1);
    seed(&app.database, &warm_up).await;
    app.broker.wait_for(1, Duration::from_secs(30)).await;

    // Raised before the events are inserted, so a fast relay cannot finish first.
    let events = room_events("alarm", EVENTS, 100);
    {
        let _alarm = watermark.raise_alarm();
        let raised = Instant::now();
        seed(&app.database, &events).await;
        shows_alarm(address, true, ALARM).await;
        // What the broker took before it blocked reaches the queue; then nothing more.
        let held = app.broker.drain(ALARM).await.len();
        assert!(
            held < 1 + EVENTS,
            "the alarm held publishing back: {held} of {} delivered",
            1 + EVENTS
        );
        // The alarm's length is the scenario itself (as an outage's is in faults.rs).
        tokio::time::sleep(ALARM.saturating_sub(raised.elapsed())).await;
        assert_eq!(
            app.broker.received().len(),
            held,
            "nothing delivered while the broker blocked publishers"
        );
    }
    shows_alarm(address, false, Duration::from_secs(30)).await;
    app.database
        .wait_all_published(Duration::from_secs(120))
        .await;
    let duplicates = app
        .expect_every_event("8-second memory alarm, 5,000 events", &events)
        .await;
    assert_eq!(
        duplicates, 0,
        "a held publish is neither timed out nor published again"
    );
    let after = app.broker.drain(Duration::from_secs(30)).await;
    assert_eq!(
        outbox_tests::assert_room_order(&after),
        0,
        "no duplicate arrives later either"
    );
    // "No failures": a held publish never counted as a failed attempt.
    for row in app.database.rows().await {
        assert_eq!(
            (row.retry_count, row.last_error.as_deref()),
            (0, None),
            "{}: failed during the alarm",
            row.event_id
        );
    }
    let log = relay.log_text();
    let lines = |message: &str| log.lines().filter(|line| line.contains(message)).count();
    assert_eq!(lines("the broker blocks publishers"), 1, "one warn:\n{log}");
    assert_eq!(
        lines("the broker no longer blocks publishers"),
        1,
        "one info:\n{log}"
    );

    // A second alarm, and SIGTERM while publishes are held.
    let later = room_events("later", 200, 20);
    {
        let _alarm = watermark.raise_alarm();
        seed(&app.database, &later).await;
        shows_alarm(address, true, Duration::from_secs(10)).await;
        let signalled = Instant::now();
        relay.signal("TERM");
        // The shutdown bound: publish_timeout (3 s) + 2 s, with the machine's margin.
        let status = relay
            .wait(outbox_tests::within(Duration::from_secs(5)))
            .await;
        assert!(
            status.success(),
            "exit {status:?} after {:?}; log:\n{}",
            signalled.elapsed(),
            relay.log_text()
        );
        outbox_tests::assert_within(
            "SIGTERM during an alarm",
            signalled.elapsed(),
            Duration::from_secs(5),
        );
    }
    for row in app.database.rows().await {
        assert!(row.locked_by.is_none(), "{} still locked", row.event_id);
    }
    // Nothing lost: a new run delivers what the stopped one gave back.
    let rerun = RelayProcess::spawn(crate::RELAY, &app.settings);
    app.database
        .wait_all_published(Duration::from_secs(60))
        .await;
    rerun.stop(Duration::from_secs(5)).await;
    // A graceful stop during an alarm gives the held rows back unchanged and the rerun
    // publishes them; the broker still routes the publishes it held once the alarm ends,
    // so those arrive twice: at most one per room, as `per_room` ordering has one publish
    // of a room in flight at a time (docs/operations/failures.md).
    let duplicates = app
        .expect_every_event("after SIGTERM during an alarm", &later)
        .await;
    assert!(
        duplicates <= 20,
        "{duplicates} duplicates: more than the publishes held, one per room of 20"
    );
    app.teardown().await;
}
