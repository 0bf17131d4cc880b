//! PostgreSQL's insert trigger NOTIFYs only while a relay sleeps
//! (docs/design/wake-ups.md#notify-only-a-sleeping-relay): a producer's insert with no
//! relay asleep NOTIFYs nothing, one while a session holds the table's wake lock does, and
//! a relay cannot fall asleep while a producer's insert is uncommitted. `migrate` carries
//! a trigger of an earlier version over while producers insert, none of them held up, and
//! leaves it disabled unless a relay LISTENs.

use outbox_store::{InsertTrigger, TableName};
use outbox_tests::{event, Backend, TestDatabase};
use sea_orm::sqlx::postgres::{PgConnection, PgListener};
use sea_orm::sqlx::Connection as _;
use sea_orm::{ConnectionTrait as _, DbBackend, Statement};
use std::time::{Duration, Instant};

/// Longer than a notification takes on a local server.
const DEADLINE: Duration = Duration::from_secs(10);

/// A LISTEN connection to `table`'s channel, as a relay's.
async fn listener(database: &TestDatabase) -> PgListener {
    let mut listener = PgListener::connect(&database.url)
        .await
        .expect("a LISTEN connection");
    listener
        .listen(database.table.as_str())
        .await
        .expect("LISTEN");
    listener
}

/// Tries (`take`) or lets go of the table's wake lock on `listener`'s session: whether it
/// was taken, or let go.
async fn wake_lock(listener: &mut PgListener, table: &TableName, take: bool) -> bool {
    let function = match take {
        true => "pg_try_advisory_lock",
        false => "pg_advisory_unlock",
    };
    let sql = format!("SELECT {function}({})", table.wake_lock());
    sea_orm::sqlx::query_scalar::<_, bool>(&sql)
        .fetch_one(&mut *listener)
        .await
        .expect("the wake lock")
}

/// Notifications `listener` holds now: a round trip first, so that every notification the
/// server sent before it has been read.
async fn pending_notifications(listener: &mut PgListener) -> usize {
    sea_orm::sqlx::query("SELECT 1")
        .execute(&mut *listener)
        .await
        .expect("a round trip");
    std::iter::from_fn(|| listener.next_buffered()).count()
}

/// A migrated table whose insert trigger is enabled, as `migrate` leaves it for a relay
/// that LISTENs (`database.notify = true`).
async fn notifying() -> TestDatabase {
    let database = TestDatabase::new(Backend::Postgres).await;
    assert!(
        outbox_store::enable_notify(database.db(), &database.table)
            .await
            .expect("enable the insert trigger"),
        "migrate leaves the trigger disabled"
    );
    database
}

async fn insert(database: &TestDatabase, id: &str) {
    outbox_tests::seed(database, &[event(id, "room")]).await;
}

#[actix_rt::test]
async fn postgres_inserts_notify_only_while_a_relay_sleeps() {
    let database = notifying().await;
    let mut relay = listener(&database).await;

    insert(&database, "awake-1").await;
    assert_eq!(
        pending_notifications(&mut relay).await,
        0,
        "an insert with no relay asleep NOTIFYs nobody"
    );

    assert!(wake_lock(&mut relay, &database.table, true).await);
    insert(&database, "asleep-1").await;
    tokio::time::timeout(DEADLINE, relay.recv())
        .await
        .expect("an insert while the relay sleeps NOTIFYs it")
        .expect("the notification");

    assert!(
        wake_lock(&mut relay, &database.table, false).await,
        "the lock was held, and is let go"
    );
    insert(&database, "awake-2").await;
    assert_eq!(
        pending_notifications(&mut relay).await,
        0,
        "once woken, the relay hears of no insert"
    );
    database.drop_table().await;
}

/// A producer between its insert and its commit NOTIFYs nobody (no relay was asleep when
/// it inserted), so no relay may fall asleep before that row is visible: the wake lock is
/// refused until the producer commits.
#[actix_rt::test]
async fn postgres_a_relay_cannot_fall_asleep_over_an_uncommitted_insert() {
    let database = notifying().await;
    let mut relay = listener(&database).await;
    let mut producer = PgConnection::connect(&database.url)
        .await
        .expect("a producer connection");
    let t = &database.table;
    let insert = format!(
        "INSERT INTO {t} (event_id, event_type, room_id, envelope) \
         VALUES ('in-flight', 'room.message.posted', 'room', '{{}}')"
    );
    sea_orm::sqlx::query("BEGIN")
        .execute(&mut producer)
        .await
        .expect("BEGIN");
    sea_orm::sqlx::query(&insert)
        .execute(&mut producer)
        .await
        .expect("the producer's insert");
    assert!(
        !wake_lock(&mut relay, t, true).await,
        "the wake lock is refused while an insert is uncommitted"
    );
    sea_orm::sqlx::query("COMMIT")
        .execute(&mut producer)
        .await
        .expect("COMMIT");
    assert!(
        wake_lock(&mut relay, t, true).await,
        "taken once the producer committed"
    );
    assert_eq!(pending_notifications(&mut relay).await, 0);
    producer.close().await.expect("close");
    database.drop_table().await;
}

/// The trigger `migrate` made before the wake lock existed: enabled, NOTIFY on every
/// insert.
async fn make_trigger_old(database: &TestDatabase) {
    let t = database.table.as_str();
    for sql in [
        format!("DROP TRIGGER {t}_notify ON {t}"),
        format!(
            "CREATE TRIGGER {t}_notify AFTER INSERT ON {t} \
             FOR EACH STATEMENT EXECUTE FUNCTION {t}_notify()"
        ),
        format!(
            "DELETE FROM {t}_migrations WHERE name LIKE '%wake_room_outbox_sleepers' \
             OR name LIKE '%disable_room_outbox_notify'"
        ),
    ] {
        database.execute(&sql).await;
    }
}

/// The insert trigger's definition and state (`O` on, `D` off).
async fn trigger(database: &TestDatabase) -> (String, String) {
    let t = database.table.as_str();
    let row = database
        .db()
        .query_one(Statement::from_string(
            DbBackend::Postgres,
            format!(
                "SELECT pg_get_triggerdef(oid) AS def, tgenabled::text AS state FROM pg_trigger \
                 WHERE tgrelid = '{t}'::regclass AND tgname = '{t}_notify'"
            ),
        ))
        .await
        .expect("pg_trigger")
        .expect("the insert trigger exists");
    (
        row.try_get("", "def").expect("def"),
        row.try_get("", "state").expect("state"),
    )
}

/// The insert trigger's comment.
async fn trigger_comment(database: &TestDatabase) -> Option<String> {
    let t = database.table.as_str();
    database
        .db()
        .query_one(Statement::from_string(
            DbBackend::Postgres,
            format!(
                "SELECT obj_description(oid, 'pg_trigger') AS note FROM pg_trigger \
                 WHERE tgrelid = '{t}'::regclass AND tgname = '{t}_notify'"
            ),
        ))
        .await
        .expect("pg_trigger")
        .expect("the insert trigger exists")
        .try_get("", "note")
        .expect("note")
}

/// Rows in the table.
async fn count(database: &TestDatabase) -> i64 {
    let t = database.table.as_str();
    database
        .db()
        .query_one(Statement::from_string(
            DbBackend::Postgres,
            format!("SELECT count(*) AS n FROM {t}"),
        ))
        .await
        .expect("count")
        .expect("a row")
        .try_get("", "n")
        .expect("n")
}

/// An installation from before the wake lock is carried over by `migrate` while a
/// producer inserts without pause: no insert waits 200 ms, the trigger now NOTIFYs only a
/// sleeping relay and is left disabled, so that no insert pays for it; enabled for a relay
/// that LISTENs, it is the trigger that relay needs. A trigger the operator disabled stays
/// disabled, and keeps its comment.
#[actix_rt::test]
async fn postgres_migrate_carries_an_old_trigger_over_while_producers_insert() {
    let database = TestDatabase::new(Backend::Postgres).await;
    make_trigger_old(&database).await;
    assert!(!trigger(&database).await.0.contains("WHEN"));
    assert_eq!(
        database.store.insert_trigger().await.expect("the trigger"),
        InsertTrigger::EveryInsert
    );

    let (db, table) = (database.db().clone(), database.table.clone());
    let stop = std::rc::Rc::new(std::cell::Cell::new(false));
    let stopping = std::rc::Rc::clone(&stop);
    let producer = actix_rt::spawn(async move {
        let (mut worst, mut inserted) = (Duration::ZERO, 0);
        while !stopping.get() {
            let started = Instant::now();
            let row = event(&format!("load-{inserted:06}"), "room");
            outbox_store::insert_events(&db, &table, &[row])
                .await
                .expect("the producer's insert");
            worst = worst.max(started.elapsed());
            inserted += 1;
        }
        (worst, inserted)
    });
    outbox_tests::eventually("the producer to insert", DEADLINE, || async {
        count(&database).await >= 50
    })
    .await;
    let applied = outbox_store::migrate(database.db(), &database.table)
        .await
        .expect("migrate");
    let rows_then = count(&database).await;
    outbox_tests::eventually("more inserts after migrate", DEADLINE, || async {
        count(&database).await > rows_then + 50
    })
    .await;
    stop.set(true);
    let (worst, inserted) = producer.await.expect("the producer");
    println!("carry-over: {inserted} inserts meanwhile, the slowest {worst:?}");
    assert_eq!(
        applied,
        [
            "m20261206_000009_wake_room_outbox_sleepers",
            "m20261206_000010_disable_room_outbox_notify"
        ]
    );
    let (def, state) = trigger(&database).await;
    assert!(
        def.contains("WHEN ((NOT pg_try_advisory_xact_lock_shared("),
        "{def}"
    );
    assert_eq!(state, "D", "no insert pays for a trigger nobody asked for");
    let note = trigger_comment(&database).await;
    assert!(
        note.as_deref()
            .is_some_and(|note| note.contains("database.notify = true")),
        "a DBA who finds it disabled reads why: {note:?}"
    );
    assert_eq!(
        database.store.insert_trigger().await.expect("the trigger"),
        InsertTrigger::Off
    );
    outbox_tests::assert_within("the slowest insert", worst, Duration::from_millis(200));
    assert!(outbox_store::enable_notify(database.db(), &database.table)
        .await
        .expect("enable"));
    assert_eq!(trigger(&database).await.1, "O");
    assert_eq!(trigger_comment(&database).await, None);
    assert_eq!(
        database.store.insert_trigger().await.expect("the trigger"),
        InsertTrigger::WhileAsleep,
        "a relay recognises the trigger it needs: {def}"
    );
    assert!(
        !outbox_store::enable_notify(database.db(), &database.table)
            .await
            .expect("enable again"),
        "enabled once"
    );

    // Disabled by its operator: carried over, and still disabled.
    let t = database.table.as_str();
    make_trigger_old(&database).await;
    database
        .execute(&format!("ALTER TABLE {t} DISABLE TRIGGER {t}_notify"))
        .await;
    database
        .execute(&format!(
            "COMMENT ON TRIGGER {t}_notify ON {t} IS 'paused: see ticket'"
        ))
        .await;
    outbox_store::migrate(database.db(), &database.table)
        .await
        .expect("migrate");
    let (def, state) = trigger(&database).await;
    assert!(def.contains("pg_try_advisory_xact_lock_shared"), "{def}");
    assert_eq!(state, "D", "the operator's DISABLE stays");
    assert_eq!(
        trigger_comment(&database).await.as_deref(),
        Some("paused: see ticket")
    );
    database.drop_table().await;
}

/// Two relays' feeds on one table: once both are asleep (one holds the wake lock, the other
/// waits for it), an insert wakes both, and neither answers before it.
#[actix_rt::test]
async fn postgres_two_sleeping_relays_both_wake_on_an_insert() {
    use outbox_core::InsertFeed;
    use outbox_store::wake::listen::PgInsertFeed;
    let database = notifying().await;
    let feed = || {
        PgInsertFeed::new(
            &database.url,
            database.table.clone(),
            Duration::from_millis(5),
        )
    };
    let (mut first, mut second) = (feed(), feed());
    // Each answers once on connecting, and the first once more on taking the lock (a
    // claim for the rows committed before it was taken).
    for feed in [&mut first, &mut second] {
        tokio::time::timeout(DEADLINE, feed.wait())
            .await
            .expect("connected")
            .expect("the feed");
    }
    tokio::time::timeout(DEADLINE, first.wait())
        .await
        .expect("the lock taken")
        .expect("the feed");
    let first_wakes = actix_rt::spawn(async move {
        first.wait().await.expect("the first feed");
        Instant::now()
    });
    let second_wakes = actix_rt::spawn(async move {
        second.wait().await.expect("the second feed");
        Instant::now()
    });
    // Asleep, both: the first holds the lock, the second waits for it; nothing answers
    // before the insert (the producer's commit is timed after its own round trip).
    let mut listener = listener(&database).await;
    assert!(
        !wake_lock(&mut listener, &database.table, true).await,
        "a relay holds the wake lock"
    );
    let inserted = Instant::now();
    insert(&database, "both").await;
    for woken in [first_wakes, second_wakes] {
        let at = tokio::time::timeout(DEADLINE, woken)
            .await
            .expect("woken by the insert")
            .expect("the feed's task");
        assert!(at >= inserted, "answered before the insert");
    }
    database.drop_table().await;
}

/// The feed's next answer, within [`DEADLINE`].
async fn answer(feed: &mut dyn outbox_core::InsertFeed) {
    tokio::time::timeout(DEADLINE, feed.wait())
        .await
        .expect("the feed answers")
        .expect("the feed");
}

/// A relay woken by an insert stays awake while rows keep coming: it notices them by the
/// table's highest id, and the inserts meanwhile NOTIFY nobody. Once rows stop, it falls
/// asleep again and the next insert NOTIFYs.
#[actix_rt::test]
async fn postgres_a_woken_relay_stays_awake_while_rows_keep_coming() {
    use outbox_store::wake::WakeUps;
    let database = notifying().await;
    let store = outbox_store::SeaOrmStore::new(database.db().clone(), database.table.clone());
    let wake_ups = WakeUps {
        listen_url: Some(database.url.clone()),
        probe_interval: Some(Duration::from_millis(5)),
        url: database.url.clone(),
    };
    let mut feed = store.insert_feed(&wake_ups).expect("a feed on PostgreSQL");
    let feed = feed.as_mut();
    // Once on connecting, once on taking the wake lock: asleep.
    answer(feed).await;
    answer(feed).await;
    let mut others = listener(&database).await;

    insert(&database, "wakes").await;
    answer(feed).await;
    tokio::time::timeout(DEADLINE, others.recv())
        .await
        .expect("the insert that woke the relay NOTIFYed")
        .expect("the notification");
    for n in 0..5 {
        insert(&database, &format!("while-awake-{n}")).await;
        answer(feed).await;
    }
    assert_eq!(
        pending_notifications(&mut others).await,
        0,
        "inserts while the woken relay stays awake NOTIFY nobody"
    );

    // No more rows: it falls asleep, answering once more for the claim after the lock.
    answer(feed).await;
    insert(&database, "asleep-again").await;
    answer(feed).await;
    tokio::time::timeout(DEADLINE, others.recv())
        .await
        .expect("an insert after it fell asleep NOTIFYs again")
        .expect("the notification");
    database.drop_table().await;
}
