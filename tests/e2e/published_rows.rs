//! `relay.published_rows = "delete"`: a confirmed event's row is deleted, not marked; the
//! rows still to send and the dead stay; room order and at-least-once hold as with `keep`.

use outbox_tests::{
    assert_every_event_delivered, eventually, own_room_events as events, per_backend, seed,
    Backend, TestApp,
};
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(60);

async fn delete_leaves_only_the_rows_still_to_send_and_the_dead(backend: Backend) {
    let mut app = TestApp::on(backend)
        .binding("room.#")
        .settings(|settings| {
            settings.relay.published_rows = "delete".into();
        })
        .build()
        .await;
    let live = events("live", 300, 30);
    seed(&app.database, &live).await;
    // Headers that are no JSON object: invalid, so dead at once — and kept. (Not an
    // unroutable event: RabbitMQ's return of one is at times attached by the client to
    // another message's confirm.)
    let mut orphan = events("orphan", 1, 1);
    orphan[0].headers = Some("not json".into());
    seed(&app.database, &orphan).await;
    // Not publishable for a day: stays pending, and stays.
    let held = events("held", 3, 3);
    seed(&app.database, &held).await;
    app.database
        .execute(&format!(
            "UPDATE {{t}} SET available_at = {} WHERE event_id LIKE 'held-%'",
            app.database.minutes_ago(-1440)
        ))
        .await;

    app.start().await;
    let later = events("later", 100, 10);
    seed(&app.database, &later).await;
    let database = &app.database;
    // By hand rather than `eventually`: a timeout says what the table still holds.
    let until = Instant::now() + DEADLINE;
    loop {
        let rows = database.rows().await;
        if rows.len() == 4 && rows.iter().any(|row| row.status == "dead") {
            break;
        }
        if Instant::now() > until {
            let mut left = BTreeMap::new();
            for row in &rows {
                let group = row.event_id.split('-').next().unwrap_or("").to_owned();
                let leased = row.locked_by.is_some();
                *left.entry((group, row.status.clone(), leased)).or_insert(0) += 1;
            }
            panic!(
                "after {DEADLINE:?} the table still holds (group, status, leased) → rows: \
                 {left:?}; received {} messages, of which not live or later: {:?}",
                app.broker.received().len(),
                app.broker
                    .received()
                    .iter()
                    .filter(|m| !m.message_id.starts_with("live-")
                        && !m.message_id.starts_with("later-"))
                    .map(|m| (m.message_id.clone(), m.routing_key.clone()))
                    .collect::<Vec<_>>()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A row is deleted once the broker confirmed its message, which the test's consumer
    // may read a moment later: wait for the deliveries before judging them.
    let every: Vec<_> = live.iter().chain(&later).cloned().collect();
    eventually("every live and later event delivered", DEADLINE, || {
        let received = app.broker.received();
        let ids: HashSet<&str> = received.iter().map(|m| m.message_id.as_str()).collect();
        std::future::ready(
            every
                .iter()
                .all(|event| ids.contains(event.event_id.as_str())),
        )
    })
    .await;
    app.stop().await;

    let received = app.broker.received();
    assert_every_event_delivered(&received, &every);
    assert!(
        received
            .iter()
            .all(|message| !message.message_id.starts_with("held-")),
        "a held row is not published"
    );
    let mut left: Vec<(String, String)> = app
        .database
        .rows()
        .await
        .into_iter()
        .map(|row| (row.event_id, row.status))
        .collect();
    left.sort();
    let expected: Vec<(String, String)> = [
        ("held-000000", "pending"),
        ("held-000001", "pending"),
        ("held-000002", "pending"),
        ("orphan-000000", "dead"),
    ]
    .iter()
    .map(|(id, status)| (id.to_string(), status.to_string()))
    .collect();
    assert_eq!(left, expected, "only the held and the dead rows are left");
    app.teardown().await;
}

per_backend!(delete_leaves_only_the_rows_still_to_send_and_the_dead: postgres, sqlite, mariadb);
