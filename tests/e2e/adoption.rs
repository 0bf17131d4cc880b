//! Adopting a live Debezium-shaped table online, through the real binary:
//! `migrate` waits out a lock a long transaction holds without making the producer's
//! inserts queue behind it; it numbers the existing rows while a producer inserts, and
//! the relay then delivers every row in position order per key; `migrate --dry-run` says
//! what each step locks and for how long; the `worker` log field names the outbox.

use outbox_relay::settings::{OutboxSettings, Settings};
use outbox_store::TableName;
use outbox_tests::output::{stderr, succeeded};
use outbox_tests::producer_table::{ProducerTable as Fixture, TableGuard};
use outbox_tests::{
    assert_within, eventually, seed, test_settings, Backend, RelayProcess, SettingsFile,
    TestBroker, TestDatabase,
};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement, TransactionTrait};
use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(60);

/// The longest a producer's insert may take while `migrate` adopts its table: the issue's
/// goal, 200 ms. The 100 ms `lock_timeout` every migration statement runs under on
/// PostgreSQL (docs/producing/adopting.md#a-large-live-table is the longest an insert queues
/// behind a statement waiting for its lock; the rest is the insert's own work and the
/// milliseconds of a catalogue change once the lock is granted.
const INSERT_BOUND: Duration = Duration::from_millis(200);

/// The step that numbers the existing rows and builds the indexes `CONCURRENTLY`.
const FINISH: &str = "m20261204_000006_finish_room_outbox_adoption";

/// The text of every row's `note`: rows of some 500 bytes, 16 to a heap page.
const NOTE: usize = 400;

/// Debezium's outbox table; `rows` rows (`src` = `old`, `n` = 1…rows, 50 keys) in one
/// statement, so their physical order is their insert order. No autovacuum: the free
/// space map stays empty, so the producer's rows go after them (the order the test
/// checks is the physical one the design promises, not a reuse of free space).
async fn create_table(fixture: &Fixture, rows: u64) {
    match fixture.backend() {
        DbBackend::Postgres => {
            fixture
                .execute(
                    "CREATE TABLE {t} (id UUID PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL, \
                     aggregateid VARCHAR(255) NOT NULL, type VARCHAR(255) NOT NULL, \
                     payload JSONB NOT NULL) WITH (autovacuum_enabled = false)",
                )
                .await;
            fixture
                .execute(&format!(
                    "INSERT INTO {{t}} SELECT gen_random_uuid(), 'order', 'k-' || (g % 50), \
                     'OrderCreated', jsonb_build_object('src', 'old', 'n', g, 'note', \
                     repeat('x', {NOTE})) FROM generate_series(1, {rows}) g"
                ))
                .await;
        }
        DbBackend::MySql => {
            fixture
                .execute(
                    "CREATE TABLE {t} (id CHAR(36) NOT NULL PRIMARY KEY, \
                     aggregatetype VARCHAR(255) NOT NULL, aggregateid VARCHAR(255) NOT NULL, \
                     type VARCHAR(255) NOT NULL, payload JSON NOT NULL)",
                )
                .await;
            for n in 1..=rows {
                fixture
                    .execute(&format!(
                        "INSERT INTO {{t}} VALUES (UUID(), 'order', 'k-{}', 'OrderCreated', \
                         JSON_OBJECT('src', 'old', 'n', {n}))",
                        n % 50
                    ))
                    .await;
            }
        }
        DbBackend::Sqlite => panic!("online adoption is about PostgreSQL and MySQL/MariaDB"),
    }
}

/// Settings of the binary on the fixture's table, mapped as Debezium's outbox router
/// reads it, `position = "seq"` (which `migrate` adds); JSON logs.
fn debezium_settings(fixture: &Fixture, broker: &TestBroker) -> Settings {
    fixture.debezium_settings(broker, |settings| settings.log.format = "json".into())
}

/// One insert of the producer: when it started and how long it took.
#[derive(Debug, Clone, Copy)]
struct Insert {
    started: Instant,
    took: Duration,
}

/// A producer inserting into the table on a connection of its own, one row per
/// transaction (`src` = `new`, `n` = 1, 2, …, rows as large as the old ones), one every
/// `period` (or as fast as its commits allow), until stopped.
struct Producer {
    stop: Rc<Cell<bool>>,
    done: Rc<Cell<usize>>,
    task: actix_rt::task::JoinHandle<Vec<Insert>>,
}

impl Producer {
    async fn start(backend: DbBackend, url: &str, table: &TableName, period: Duration) -> Self {
        let db = outbox_store::connect(url, 1)
            .await
            .expect("the producer connects")
            .into_connection();
        let (stop, done) = (Rc::new(Cell::new(false)), Rc::new(Cell::new(0)));
        let t = table.as_str().to_owned();
        let task = actix_rt::spawn({
            let (stop, done) = (stop.clone(), done.clone());
            async move {
                let mut inserts = Vec::new();
                let mut next = tokio::time::Instant::now();
                let mut n = 0u64;
                while !stop.get() {
                    n += 1;
                    let sql = match backend {
                        DbBackend::MySql => format!(
                            "INSERT INTO {t} (id, aggregatetype, aggregateid, type, payload) \
                             VALUES (UUID(), 'order', 'k-{}', 'OrderPlaced', JSON_OBJECT(\
                             'src', 'new', 'n', {n}, 'note', REPEAT('y', {NOTE})))",
                            n % 50
                        ),
                        _ => format!(
                            "INSERT INTO {t} (id, aggregatetype, aggregateid, type, payload) \
                             VALUES (gen_random_uuid(), 'order', 'k-{}', 'OrderPlaced', \
                             jsonb_build_object('src', 'new', 'n', {n}, 'note', \
                             repeat('y', {NOTE})))",
                            n % 50
                        ),
                    };
                    let started = Instant::now();
                    db.execute(Statement::from_string(backend, sql))
                        .await
                        .unwrap_or_else(|error| panic!("producer insert {n}: {error}"));
                    inserts.push(Insert {
                        started,
                        took: started.elapsed(),
                    });
                    done.set(inserts.len());
                    next += period;
                    tokio::time::sleep_until(next).await;
                }
                let _ = db.close().await;
                inserts
            }
        });
        Self { stop, done, task }
    }

    /// Waits until it has inserted `more` rows beyond what it had.
    async fn wait_for_more(&self, more: usize) {
        let target = self.done.get() + more;
        eventually(&format!("{more} more producer inserts"), DEADLINE, || {
            std::future::ready(self.done.get() >= target)
        })
        .await;
    }

    async fn stop(self) -> Vec<Insert> {
        self.stop.set(true);
        self.task.await.expect("the producer ran to its end")
    }
}

/// Runs `migrate` (with `args`) on a thread of its own while the test's runtime serves
/// the producer; its output and when it ended.
async fn migrate(
    file: SettingsFile,
    args: &'static [&'static str],
) -> (std::process::Output, Instant) {
    tokio::task::spawn_blocking(move || {
        let output = file.run(crate::RELAY, args);
        (output, Instant::now())
    })
    .await
    .expect("migrate's thread")
}

async fn number(db: &DatabaseConnection, sql: &str) -> i64 {
    db.query_one(Statement::from_string(
        db.get_database_backend(),
        sql.to_owned(),
    ))
    .await
    .unwrap_or_else(|error| panic!("{sql}: {error}"))
    .expect("a row")
    .try_get_by_index::<i64>(0)
    .unwrap_or_else(|error| panic!("{sql}: {error}"))
}

/// The adoption is complete: every row has a position, no two the same, a valid unique
/// index on it, the finishing step recorded.
async fn assert_adopted(fixture: &Fixture) {
    let db = fixture.database.db();
    let t = &fixture.table;
    let rows = number(db, &format!("SELECT count(*) FROM {t}")).await;
    let numbered = number(db, &format!("SELECT count(seq) FROM {t}")).await;
    let distinct = number(db, &format!("SELECT count(DISTINCT seq) FROM {t}")).await;
    assert_eq!(
        (numbered, distinct),
        (rows, rows),
        "of {rows} rows: {numbered} with a position, {distinct} distinct positions"
    );
    let unique = number(
        db,
        &format!(
            "SELECT count(*) FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid \
             AND a.attnum = i.indkey[0] WHERE i.indrelid = '{t}'::regclass AND i.indisunique \
             AND i.indisvalid AND i.indnatts = 1 AND a.attname = 'seq'"
        ),
    )
    .await;
    assert_eq!(unique, 1, "a valid unique index on the position");
    let recorded = number(
        db,
        &format!("SELECT count(*) FROM {t}_migrations WHERE name = '{FINISH}'"),
    )
    .await;
    assert_eq!(recorded, 1, "{FINISH} recorded");
}

/// How long the long transaction holds its lock once `migrate` was seen waiting for it:
/// far over the insert bound plus the margin, so an `ALTER` queued without a timeout
/// would make inserts wait visibly longer than the bound; far under the retries' three
/// minutes.
const HOLD: Duration = Duration::from_secs(6);

/// What [`wait_out_a_long_transaction`] saw.
struct WaitedOut {
    /// `migrate`'s log.
    log: String,
    /// The producer's inserts that started while `migrate` ran.
    during: Vec<Insert>,
    /// When the long transaction ended.
    released: Instant,
    /// Its retries after a lock timeout, as logged.
    retries: usize,
}

/// The scenario of both backends: a producer inserts every 20 ms into the fixture's
/// table (`rows` rows to start with); a transaction elsewhere reads the table (a lock
/// the adoption's `ALTER TABLE` must wait for) and stays open for [`HOLD`] once
/// `waiting` (a count) says `migrate`'s statement waits for its lock. `migrate` must
/// succeed, and end after the transaction did.
async fn wait_out_a_long_transaction(fixture: &Fixture, rows: u64, waiting: &str) -> WaitedOut {
    let backend = fixture.backend();
    create_table(fixture, rows).await;
    let broker = TestBroker::new("#").await;
    let settings = debezium_settings(fixture, &broker);
    let url = fixture.database.url.clone();
    let t = fixture.table.clone();

    let producer = Producer::start(backend, &url, &t, Duration::from_millis(20)).await;
    producer.wait_for_more(5).await;
    let holder = outbox_store::connect(&url, 1)
        .await
        .expect("connects")
        .into_connection();
    let long = holder.begin().await.expect("begins");
    long.execute(Statement::from_string(
        backend,
        format!("SELECT * FROM {t} LIMIT 1"),
    ))
    .await
    .expect("the long transaction reads the table");

    let started = Instant::now();
    let migrating = actix_rt::spawn(migrate(SettingsFile::write(&settings), &["migrate"]));
    // Seen once waiting, however long the binary took to start.
    let db = fixture.database.db();
    eventually(
        "migrate's ALTER waiting for the table's lock",
        DEADLINE,
        || async { number(db, &waiting.replace("{t}", t.as_str())).await > 0 },
    )
    .await;
    // The long transaction's length is the scenario: it goes on for HOLD more, whatever
    // `migrate` does meanwhile.
    tokio::time::sleep(HOLD).await;
    long.rollback().await.expect("the long transaction ends");
    let released = Instant::now();
    let (output, ended) = migrating.await.expect("migrate ran");
    producer.wait_for_more(5).await;
    let inserts = producer.stop().await;
    let _ = holder.close().await;
    broker.close().await;

    let log = stderr(&output);
    succeeded("migrate", &output);
    assert!(
        ended > released,
        "migrate ended before the long transaction let its lock go"
    );
    let during: Vec<Insert> = inserts
        .into_iter()
        .filter(|insert| insert.started >= started && insert.started < ended)
        .collect();
    let retries = log
        .lines()
        .filter(|line| line.contains("gave up waiting for a lock on the table"))
        .count();
    eprintln!(
        "{} inserts while migrate ran, the worst {:?}; {retries} retries logged",
        during.len(),
        during.iter().map(|insert| insert.took).max()
    );
    WaitedOut {
        log,
        during,
        released,
        retries,
    }
}

/// The worst insert of `inserts`.
fn worst(inserts: &[Insert]) -> Duration {
    inserts
        .iter()
        .map(|insert| insert.took)
        .max()
        .expect("inserts while migrate ran")
}

/// On PostgreSQL ([`wait_out_a_long_transaction`]: the transaction holds `ACCESS SHARE`,
/// which the adoption's `ALTER TABLE … ADD COLUMN` and its `ACCESS EXCLUSIVE` must wait
/// for): `migrate` gives up after the lock timeout and tries again (logging each retry)
/// instead of queueing: no producer insert takes more than [`INSERT_BOUND`] (plus
/// [`outbox_tests::MARGIN`] for a loaded machine; an `ALTER` queued without a timeout
/// holds inserts up for the whole [`HOLD`]); the table ends adopted.
#[actix_rt::test]
async fn migrate_waits_out_a_long_transaction_without_holding_up_inserts() {
    let fixture = Fixture::new(Backend::Postgres, "adopt_lock").await;
    let seen = wait_out_a_long_transaction(
        &fixture,
        2_000,
        "SELECT count(*) FROM pg_locks WHERE relation = '{t}'::regclass \
         AND mode = 'AccessExclusiveLock' AND NOT granted",
    )
    .await;
    assert_within(
        "the worst producer insert while migrate waited out a long transaction",
        worst(&seen.during),
        INSERT_BOUND,
    );
    let while_held = seen
        .during
        .iter()
        .filter(|insert| insert.started < seen.released)
        .count();
    // One every 20 ms for 6 s is 300; a loaded machine may manage fewer, but an insert
    // blocked for the whole hold would leave a handful.
    assert!(
        while_held >= 50,
        "{while_held} inserts while the lock was held: the producer was held up"
    );
    assert!(
        seen.retries >= 1,
        "migrate logged no retry, so it never waited for the lock:\n{}",
        seen.log
    );
    assert_adopted(&fixture).await;
    fixture.finish().await;
}

/// The same on MariaDB (the transaction holds a shared metadata lock, which the
/// adoption's `ALTER TABLE` must wait for): each DDL statement of `migrate` waits at most
/// `lock_wait_timeout` (1 s, the server's least) and is retried, logging each retry,
/// instead of queueing every insert behind it for the server's default of a year: no
/// insert waits much more than that second; every row ends with its position.
#[actix_rt::test]
async fn mariadb_migrate_waits_out_a_long_transaction_a_second_at_a_time() {
    /// The metadata-lock wait plus the insert's own work.
    const MARIADB_INSERT_BOUND: Duration = Duration::from_millis(1_500);
    let fixture = Fixture::new(Backend::MySql, "adopt_lock").await;
    let seen = wait_out_a_long_transaction(
        &fixture,
        200,
        "SELECT count(*) FROM information_schema.processlist \
         WHERE state = 'Waiting for table metadata lock' AND info LIKE 'ALTER TABLE%'",
    )
    .await;
    assert_within(
        "the worst producer insert while migrate waited out a long transaction on MariaDB",
        worst(&seen.during),
        MARIADB_INSERT_BOUND,
    );
    assert!(
        seen.retries >= 2,
        "migrate logged {} retries, so it did not give up after a second:\n{}",
        seen.retries,
        seen.log
    );
    let (db, t) = (fixture.database.db(), &fixture.table);
    let numbered = number(db, &format!("SELECT count(seq) FROM {t}")).await;
    let rows = number(db, &format!("SELECT count(*) FROM {t}")).await;
    assert_eq!(numbered, rows, "every row has its position");
    fixture.finish().await;
}

/// A table of 20,000 rows (some 1,300 heap pages: several backfill batches) adopted
/// while a producer inserts as fast as its commits go: every row, old and new, ends with
/// a distinct position; the old rows in their physical (here insert) order, the rows the
/// producer inserted after them above them, in its order (docs/producing/adopting.md#a-large-live-table. The relay then delivers every row, each key's in position order.
#[actix_rt::test]
async fn rows_are_numbered_while_a_producer_inserts_and_relayed_in_position_order() {
    const OLD: i64 = 20_000;
    let fixture = Fixture::new(Backend::Postgres, "adopt_fill").await;
    create_table(&fixture, OLD as u64).await;
    let broker = TestBroker::new("#").await;
    let settings = debezium_settings(&fixture, &broker);
    let t = fixture.table.clone();
    let db = fixture.database.db().clone();

    let producer = Producer::start(
        DbBackend::Postgres,
        &fixture.database.url,
        &t,
        Duration::from_millis(2),
    )
    .await;
    producer.wait_for_more(20).await;
    let before = producer.done.get();
    let (output, _) = migrate(SettingsFile::write(&settings), &["migrate"]).await;
    let during = producer.done.get() - before;
    producer.wait_for_more(20).await;
    let inserted = producer.stop().await.len() as i64;
    succeeded("migrate", &output);
    assert!(
        during > 0,
        "the producer inserted nothing while migrate ran"
    );
    assert_adopted(&fixture).await;

    // Position order: the old rows by n, then the producer's by n.
    let rows = db
        .query_all(Statement::from_string(
            DbBackend::Postgres,
            format!(
                "SELECT id::text AS id, aggregateid, seq, payload->>'src' AS src, \
                 (payload->>'n')::bigint AS n FROM {t} ORDER BY seq"
            ),
        ))
        .await
        .expect("rows");
    assert_eq!(rows.len() as i64, OLD + inserted, "every row is there");
    let mut expected = (1..=OLD)
        .map(|n| ("old".to_owned(), n))
        .chain((1..=inserted).map(|n| ("new".to_owned(), n)));
    let mut position = HashMap::new();
    let mut keys = HashMap::new();
    for row in &rows {
        let (id, key, seq, src, n): (String, String, i64, String, i64) = (
            row.try_get("", "id").unwrap(),
            row.try_get("", "aggregateid").unwrap(),
            row.try_get("", "seq").unwrap(),
            row.try_get("", "src").unwrap(),
            row.try_get("", "n").unwrap(),
        );
        assert_eq!(
            Some((src.clone(), n)),
            expected.next(),
            "in position order, {src} row {n} (position {seq}) is out of place"
        );
        position.insert(id.clone(), seq);
        keys.insert(id, key);
    }
    eprintln!("{OLD} old rows, {inserted} inserted by the producer ({during} while migrate ran)");

    // The relay delivers every one of them, each key's in position order.
    let file = SettingsFile::write(&settings);
    let relay = file.spawn(crate::RELAY, "adopt-fill");
    let received = broker.wait_for(rows.len(), Duration::from_secs(180)).await;
    relay.stop(DEADLINE).await;
    let mut seen = HashSet::new();
    let mut last: HashMap<String, i64> = HashMap::new();
    for message in &received {
        if !seen.insert(message.message_id.clone()) {
            continue;
        }
        let seq = position[&message.message_id];
        assert_eq!(message.int_header("outbox_id"), Some(seq), "{message:?}");
        let key = message.header("aggregate_id").expect("the key header");
        assert_eq!(key, keys[&message.message_id]);
        if let Some(previous) = last.insert(key.clone(), seq) {
            assert!(
                previous < seq,
                "key {key}: position {seq} delivered after {previous}"
            );
        }
    }
    assert_eq!(seen.len(), rows.len(), "every row delivered");
    broker.close().await;
    fixture.finish().await;
}

/// The `-- locks:` line of each step of `migrate --dry-run`; fails unless every step has
/// one, right after its name.
fn locks_of(plan: &str) -> HashMap<String, String> {
    let lines: Vec<&str> = plan.lines().collect();
    let mut locks = HashMap::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(step) = line.strip_prefix("-- ") else {
            continue;
        };
        if step.starts_with("locks: ") || step.starts_with("in batches of ") {
            continue;
        }
        let next = lines.get(i + 1).copied().unwrap_or_default();
        let lock = next
            .strip_prefix("-- locks: ")
            .unwrap_or_else(|| panic!("step {step} has no `-- locks:` line:\n{plan}"));
        locks.insert(step.to_owned(), lock.to_owned());
    }
    locks
}

/// Asserts that `step`'s lock line says each of `phrases`.
fn says(locks: &HashMap<String, String>, step: &str, phrases: &[&str]) {
    let lock = locks
        .get(step)
        .unwrap_or_else(|| panic!("no step {step} in the plan: {locks:#?}"));
    for phrase in phrases {
        assert!(lock.contains(phrase), "{step}: {phrase:?} not in {lock:?}");
    }
}

/// `migrate --dry-run` on a Debezium-shaped table: each step says what it locks and for
/// how long; the steps that touch the table the way the docs say (PostgreSQL: catalogue
/// changes under a 100 ms lock timeout, a backfill by batches, indexes `CONCURRENTLY`;
/// MariaDB: instant columns, the `AUTO_INCREMENT` position's table copy, indexes built
/// without a lock). Again after the mapping changed.
async fn dry_run_says_what_each_step_locks(backend: Backend) {
    let fixture = Fixture::new(backend, "adopt_plan").await;
    create_table(&fixture, 3).await;
    let broker = TestBroker::new("#").await;
    let mut settings = debezium_settings(&fixture, &broker);
    let file = SettingsFile::write(&settings);
    let plan = succeeded(
        "migrate --dry-run",
        &file.run(crate::RELAY, &["migrate", "--dry-run"]),
    );
    let locks = locks_of(&plan);
    let t = fixture.table.as_str();
    let adopt = "m20261202_000001_create_room_outbox";
    match backend {
        Backend::Postgres => {
            assert_eq!(locks.len(), 10, "nine migrations and the finish:\n{plan}");
            says(
                &locks,
                adopt,
                &[
                    "ACCESS EXCLUSIVE",
                    "catalogue changes only (no rewrite, no index build): milliseconds",
                    "at most 100 ms for the lock (lock_timeout)",
                    "retried",
                ],
            );
            says(
                &locks,
                "m20261202_000003_create_room_outbox_notify",
                &["SHARE ROW EXCLUSIVE", "at most 100 ms"],
            );
            says(
                &locks,
                "m20261204_000008_drop_room_outbox_room_index",
                &["ACCESS EXCLUSIVE", "at most 100 ms"],
            );
            says(
                &locks,
                "m20261206_000009_wake_room_outbox_sleepers",
                &["ACCESS EXCLUSIVE", "milliseconds", "at most 100 ms"],
            );
            says(
                &locks,
                FINISH,
                &[
                    "no table lock that stops inserts",
                    "one batch of pages at a time (tens of milliseconds each)",
                    "CONCURRENTLY (SHARE UPDATE EXCLUSIVE: inserts and updates go on",
                ],
            );
            says(
                &locks,
                "m20261206_000010_disable_room_outbox_notify",
                &["SHARE ROW EXCLUSIVE", "DISABLE TRIGGER", "at most 100 ms"],
            );
            says(
                &locks,
                "m20261202_000003_create_room_outbox_notify",
                &["created disabled until the finishing step ends"],
            );
            assert!(
                plan.contains(&format!("ALTER TABLE {t} DISABLE TRIGGER {t}_notify;"))
                    && !plan.contains(&format!("ALTER TABLE {t} ENABLE TRIGGER {t}_notify;"))
                    && plan.contains("backend_flush_after = '256kB'"),
                "the trigger off, the backfill's writes flushed as they go:\n{plan}"
            );
            // A relay that LISTENs: the trigger enabled last, once the adoption finished.
            let mut listening = settings.clone();
            listening.database.notify = true;
            let plan = succeeded(
                "migrate --dry-run, notify = true",
                &SettingsFile::write(&listening).run(crate::RELAY, &["migrate", "--dry-run"]),
            );
            let steps = locks_of(&plan);
            assert_eq!(steps.len(), 11, "and the trigger enabled:\n{plan}");
            let at = |step: &str| plan.find(&format!("-- {step}\n")).unwrap_or(usize::MAX);
            assert!(
                at(FINISH) < at("enable_room_outbox_notify"),
                "enabled after the finish:\n{plan}"
            );
            says(
                &steps,
                "enable_room_outbox_notify",
                &["SHARE ROW EXCLUSIVE", "ENABLE TRIGGER", "at most 100 ms"],
            );
            assert!(
                plan.contains(&format!("ALTER TABLE {t} ENABLE TRIGGER {t}_notify;")),
                "{plan}"
            );
            assert!(
                plan.contains(&format!("ALTER TABLE {t} ADD COLUMN seq BIGINT NULL;"))
                    && !plan.contains("BIGSERIAL"),
                "a position without a rewrite:\n{plan}"
            );
            assert!(
                plan.contains(&format!(
                    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {t}_position_idx ON {t} (seq);"
                )),
                "the unique index built concurrently:\n{plan}"
            );
        }
        Backend::MySql => {
            assert_eq!(locks.len(), 9, "nine migrations:\n{plan}");
            says(
                &locks,
                adopt,
                &[
                    "a metadata lock for an instant change where the server allows",
                    "an AUTO_INCREMENT position copies the table, blocking writes for as long",
                    "ALGORITHM=INPLACE LOCK=NONE: writes go on while it builds",
                    "waits at most 1 s for the metadata lock behind a transaction open on \
                     the table (lock_wait_timeout; inserts queue behind it meanwhile), then \
                     gives up and is retried",
                ],
            );
            for (step, lock) in &locks {
                if step != adopt {
                    assert_eq!(
                        lock, "a metadata lock: milliseconds; at most 1 s waiting for it, retried",
                        "{step}"
                    );
                }
            }
            assert!(
                plan.contains("ALGORITHM=INPLACE LOCK=NONE;"),
                "indexes built in place:\n{plan}"
            );
        }
        Backend::Sqlite => unreachable!(),
    }

    // Adopted, then a mapped column the table lacks: the step that adds it.
    succeeded("migrate", &file.run(crate::RELAY, &["migrate"]));
    settings.database.columns.headers = "hdrs".into();
    let file = SettingsFile::write(&settings);
    let plan = succeeded(
        "migrate --dry-run",
        &file.run(crate::RELAY, &["migrate", "--dry-run"]),
    );
    let locks = locks_of(&plan);
    match backend {
        Backend::Postgres => {
            says(
                &locks,
                "add_mapped_columns",
                &["ACCESS EXCLUSIVE", "catalogue changes only", "100 ms"],
            );
            says(&locks, FINISH, &["CONCURRENTLY"]);
        }
        Backend::MySql => says(&locks, "add_mapped_columns", &["instant change"]),
        Backend::Sqlite => unreachable!(),
    }
    broker.close().await;
    fixture.finish().await;
}

outbox_tests::per_backend!(dry_run_says_what_each_step_locks: postgres, mariadb);

/// The insert trigger's state in `pg_trigger` (`O` on, `D` off) and its comment.
async fn trigger_state(fixture: &Fixture) -> (String, Option<String>) {
    let t = &fixture.table;
    let sql = format!(
        "SELECT tgenabled::text, obj_description(oid, 'pg_trigger') FROM pg_trigger \
         WHERE tgrelid = '{t}'::regclass AND tgname = '{t}_notify'"
    );
    let row = fixture
        .database
        .db()
        .query_one(Statement::from_string(DbBackend::Postgres, sql.clone()))
        .await
        .unwrap_or_else(|error| panic!("{sql}: {error}"))
        .expect("the insert trigger exists");
    (
        row.try_get_by_index(0).expect("tgenabled"),
        row.try_get_by_index(1).expect("the comment"),
    )
}

/// PostgreSQL, `database.notify = true`: while `migrate` adopts a table, its insert trigger
/// is off (no relay claims before the indexes exist, and NOTIFYing commits take turns);
/// the run that finishes the adoption turns it on. Here the first run fails in its
/// finishing step (the producer's own position column has a duplicate, so its unique
/// index cannot be built): the trigger stays off; once the duplicate is mended, the next
/// run finishes and turns it on. With `notify = false`, a trigger the operator turned off
/// (docs/operations/wake-ups.md#what-each-wake-up-costs) stays off through a later
/// finishing step.
#[actix_rt::test]
async fn the_insert_trigger_is_on_once_the_adoption_finishes() {
    let fixture = Fixture::new(Backend::Postgres, "adopt_trigger").await;
    fixture
        .execute(
            "CREATE TABLE {t} (id UUID PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL, \
             aggregateid VARCHAR(255) NOT NULL, type VARCHAR(255) NOT NULL, \
             payload JSONB NOT NULL, seq BIGINT NOT NULL)",
        )
        .await;
    fixture
        .execute(
            "INSERT INTO {t} SELECT gen_random_uuid(), 'order', 'k-' || (g % 5), \
             'OrderCreated', jsonb_build_object('n', g), least(g, 99) \
             FROM generate_series(1, 100) g",
        )
        .await;
    let broker = TestBroker::new("#").await;
    let mut settings = debezium_settings(&fixture, &broker);
    settings.database.notify = true;
    let file = SettingsFile::write(&settings);

    let failed = file.run(crate::RELAY, &["migrate"]);
    let log = stderr(&failed);
    assert!(
        !failed.status.success(),
        "migrate succeeded over a duplicate position:\n{log}"
    );
    assert!(log.contains("could not create unique index"), "{log}");
    let (enabled, comment) = trigger_state(&fixture).await;
    assert_eq!(
        enabled, "D",
        "the trigger is off while the adoption is unfinished"
    );
    assert!(
        comment
            .as_deref()
            .is_some_and(|c| c.contains("database.notify = true")),
        "{comment:?}"
    );

    fixture
        .execute("UPDATE {t} SET seq = 100 WHERE seq = 99 AND (payload->>'n')::int = 100")
        .await;
    let done = succeeded("migrate", &file.run(crate::RELAY, &["migrate"]));
    assert!(
        done.contains(&format!("applied {FINISH}"))
            && done.contains("applied enable_room_outbox_notify"),
        "{done}"
    );
    assert_eq!(
        trigger_state(&fixture).await,
        ("O".to_owned(), None),
        "the trigger is on, its comment gone, once the adoption finished"
    );

    // The operator's way out of NOTIFY; then a mapping change, after which `migrate` runs
    // the finishing step again (for a newly mapped position's numbers and index).
    fixture
        .execute("ALTER TABLE {t} DISABLE TRIGGER {t}_notify")
        .await;
    settings.database.notify = false;
    settings.database.columns.headers = "hdrs".into();
    let file = SettingsFile::write(&settings);
    let again = succeeded("migrate", &file.run(crate::RELAY, &["migrate"]));
    assert!(again.contains("applied add_mapped_columns"), "{again}");
    assert_eq!(
        trigger_state(&fixture).await.0,
        "D",
        "the operator's DISABLE stays"
    );
    broker.close().await;
    fixture.finish().await;
}

/// The JSON log lines of `relay` with `message`, by their `field`.
fn by_field(
    relay: &RelayProcess,
    message: &str,
    field: &str,
) -> HashMap<String, serde_json::Value> {
    relay
        .log_lines(message)
        .into_iter()
        .filter(|line| line["message"] == message)
        .map(|line| (line[field].as_str().unwrap_or_default().to_owned(), line))
        .collect()
}

/// Waits until `relay` logged `event published` for each of `ids`; those lines by event id.
async fn published_lines(relay: &RelayProcess, ids: &[&str]) -> HashMap<String, serde_json::Value> {
    eventually("the published lines", DEADLINE, || {
        let lines = by_field(relay, "event published", "event_id");
        std::future::ready(ids.iter().all(|id| lines.contains_key(*id)))
    })
    .await;
    by_field(relay, "event published", "event_id")
}

/// `relay.name` blank (the default): the `worker` field of a running relay's log lines
/// names its outbox: the table's name for the outbox of `database.table`, each
/// `[[outboxes]]` entry's own name beside another's.
#[actix_rt::test]
async fn the_worker_field_names_the_outbox() {
    let database = TestDatabase::new(Backend::Postgres).await;
    let broker = TestBroker::new("#").await;
    let table = database.table.as_str().to_owned();
    seed(&database, &[outbox_tests::event("alone-1", "a")]).await;
    let mut settings = test_settings(&database, &broker, |settings| {
        settings.log.format = "json".into();
        settings.log.level = "info,outbox_pipeline=debug".into();
    });
    assert_eq!(settings.relay.name, "", "relay.name blank by default");
    let file = SettingsFile::write(&settings);
    let relay = file.spawn(crate::RELAY, "worker-one");
    let published = published_lines(&relay, &["alone-1"]).await;
    let started = by_field(&relay, "relay started", "outbox");
    relay.stop(DEADLINE).await;
    assert_eq!(started.len(), 1, "{started:?}");
    assert_eq!(started[&table]["worker"], table.as_str(), "{started:?}");
    assert_eq!(published["alone-1"]["worker"], table.as_str());
    assert_eq!(published["alone-1"]["outbox"], table.as_str());

    // Two outboxes: each its own worker.
    let orders = TableName::parse(&outbox_tests::unique_name("e2e_orders")).unwrap();
    let orders_guard = TableGuard::new(&database, &orders);
    outbox_store::migrate(database.db(), &orders)
        .await
        .expect("migrated");
    outbox_store::insert_events(
        database.db(),
        &orders,
        &[outbox_tests::event("orders-1", "o")],
    )
    .await
    .expect("inserted");
    seed(&database, &[outbox_tests::event("rooms-1", "r")]).await;
    settings.outboxes = vec![
        OutboxSettings {
            name: "rooms".into(),
            table: table.clone(),
            ..OutboxSettings::default()
        },
        OutboxSettings {
            name: "orders".into(),
            table: orders.as_str().into(),
            ..OutboxSettings::default()
        },
    ];
    let file = SettingsFile::write(&settings);
    let relay = file.spawn(crate::RELAY, "worker-two");
    let published = published_lines(&relay, &["rooms-1", "orders-1"]).await;
    let started = by_field(&relay, "relay started", "outbox");
    relay.stop(DEADLINE).await;
    for (id, outbox) in [("rooms-1", "rooms"), ("orders-1", "orders")] {
        assert_eq!(started[outbox]["worker"], outbox, "{started:?}");
        assert_eq!(published[id]["worker"], outbox, "{id}: {:?}", published[id]);
        assert_eq!(published[id]["outbox"], outbox, "{id}: {:?}", published[id]);
    }
    broker.close().await;
    database.drop_outbox(&orders).await;
    orders_guard.disarm();
    database.drop_table().await;
}
