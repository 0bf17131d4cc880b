//! Thousands of hostile rows through the real relay binary, on every backend: headers of
//! any JSON shape (integers at and past the 64-bit bounds, doubles of every magnitude,
//! deep nesting, long keys, invalid JSON), envelopes of any bytes and length, event types,
//! rooms and event ids at and past the limits of their columns and of AMQP, with a control
//! room of ordinary events among them. Each row is either published byte for byte with the
//! headers docs/producing/events.md promises for its JSON, or dead at once with a reason
//! naming the problem; none is lost, left pending or delivered twice, the relay never exits,
//! the control room arrives complete and in order, and what remains of every other room
//! arrives in order around its dead rows. Whether a row's properties fit in one frame is
//! worked out from lapin's encoding of them, not from the relay's own count.
//!
//! The rows come from proptest strategies drawn with a fixed seed, the same on every
//! backend and every run: `OUTBOX_HOSTILE_SEED=<u64>` draws others, and
//! `OUTBOX_HOSTILE_ROWS=<n>` draws more (8,000 by default, so that more than 5,000 reach
//! the table on every backend). A row the database itself
//! refuses (too long for its column, a NUL PostgreSQL cannot store, bytes that are not
//! UTF-8) is no case for the relay: it is skipped at insert and counted apart.

use deliveries::{check_message, out_of_order};
use frame::Fits;
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString};
use outbox_store::NewEvent;
use outbox_tests::{per_backend, within, Backend, Received, RelayProcess, TestApp};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use sea_orm::{ConnectionTrait, DbBackend, FromQueryResult, Statement, Value};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};
use strategies::{drawn, Drawn, Headers, Json};

mod deliveries;
mod frame;
mod strategies;

/// Hostile rows per backend unless `OUTBOX_HOSTILE_ROWS` says otherwise: PostgreSQL and
/// MariaDB refuse about a third at insert, and more than 5,000 remain.
const DEFAULT_ROWS: usize = 8_000;
/// The seed unless `OUTBOX_HOSTILE_SEED` says otherwise.
const DEFAULT_SEED: u64 = 0x005e_ed0f_b055;
/// Ordinary events of the control room, interleaved with the hostile rows.
const CONTROL_EVENTS: usize = 300;
/// Event types matching this route's pattern are routed by `{event_type}.{key}`, so the
/// room counts towards the routing key's 255 bytes; the others by `{event_type}`.
const KEYED: &str = "keyed.#";
/// How deep the relay lets objects and arrays nest (`outbox_amqp::message::MAX_HEADER_DEPTH`).
const MAX_DEPTH: usize = 16;

/// One row to insert and what must become of it.
struct Planned {
    event_id: String,
    event_type: String,
    room: String,
    envelope: Vec<u8>,
    /// The `headers` column as drawn, and as written.
    drawn_headers: Headers,
    headers: Option<String>,
    /// `Ok`: published, its routing key and the row's own headers; `Err`: dead, and the
    /// problems any of which its `last_error` must name.
    expect: Result<(String, FieldTable), Vec<String>>,
    /// Its place in the control room.
    control: Option<usize>,
    /// Whether its message's properties fit in one frame ([`Planned::check_frame`]).
    fits: Fits,
}

impl Planned {
    fn new(
        event_id: String,
        event_type: String,
        room: String,
        envelope: Vec<u8>,
        headers: Headers,
    ) -> Self {
        let text = match &headers {
            Headers::Null => None,
            Headers::Raw(text, _) => Some(text.to_string()),
            Headers::Json(json) => {
                let mut text = String::new();
                json.render(&mut text);
                Some(text)
            }
        };
        let mut planned = Self {
            event_id,
            event_type,
            room,
            envelope,
            drawn_headers: headers,
            headers: text,
            expect: Err(Vec::new()),
            control: None,
            fits: Fits::Yes,
        };
        planned.expect = planned.expected();
        planned
    }

    /// What docs/producing/events.md promises for the row as it stands.
    fn expected(&self) -> Result<(String, FieldTable), Vec<String>> {
        let mut problems = Vec::new();
        let table = match &self.drawn_headers {
            Headers::Null => FieldTable::default(),
            Headers::Raw(_, why) => {
                problems.extend(why.map(str::to_owned));
                FieldTable::default()
            }
            Headers::Json(json) => match expected_value(json, "", 1, &mut problems) {
                Some(AMQPValue::FieldTable(table)) => table,
                _ => FieldTable::default(),
            },
        };
        let routing_key = match self.event_type.split('.').next() == Some("keyed") {
            true => format!("{}.{}", self.event_type, self.room),
            false => self.event_type.clone(),
        };
        if routing_key.len() > 255 {
            problems.push(format!(
                "routing key of {} bytes exceeds the AMQP limit of 255",
                routing_key.len()
            ));
        }
        for (field, value) in [
            ("event_id", &self.event_id),
            ("event_type", &self.event_type),
        ] {
            if value.len() > 255 {
                problems.push(format!("{field} is {} bytes; AMQP allows 255", value.len()));
            }
        }
        match problems.is_empty() {
            true => Ok((routing_key, table)),
            false => Err(problems),
        }
    }
}

/// The part of an event id that numbers its row: the database keeps it whatever it cuts.
fn tag(event_id: &str) -> String {
    let chars = match event_id.starts_with('h') || event_id.starts_with("control-") {
        true => 13,
        false => 6,
    };
    event_id.chars().take(chars).collect()
}

/// Event id number `n`: ASCII or, to reach 256 bytes within 64 characters, 4-byte
/// characters only, filled to the drawn length.
fn event_id(n: usize, drawn: &Drawn) -> String {
    let emoji = drawn.id_in_emoji && drawn.id_chars >= 60;
    let tag = match emoji {
        false => format!("h{n:07}-"),
        true => (0..6)
            .rev()
            .map(|digit| char::from_u32(0x1F600 + ((n >> (4 * digit)) & 0xF) as u32).unwrap())
            .collect(),
    };
    let filler = if emoji { "😀" } else { drawn.id_filler };
    let fill = drawn.id_chars.saturating_sub(tag.chars().count());
    format!("{tag}{}", filler.repeat(fill))
}

fn plan(n: usize, drawn: Drawn) -> Planned {
    Planned::new(
        event_id(n, &drawn),
        drawn.event_type,
        drawn.room,
        drawn.envelope,
        drawn.headers,
    )
}

fn control_event(index: usize) -> Planned {
    let envelope = format!(r#"{{"n":{index}}}"#).into_bytes();
    let mut planned = Planned::new(
        format!("control-{index:04}"),
        "room.message.posted".into(),
        "control".into(),
        envelope,
        Headers::Null,
    );
    planned.control = Some(index);
    planned
}

/// The first 40 characters of a header's path or literal, as the relay names it.
fn preview(text: &str) -> String {
    match text.char_indices().nth(40) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// The AMQP value docs/producing/events.md#headers promises for `json` at `path`, `depth`
/// levels deep (the top-level object is 1); `None` for `null`. Each problem that makes the
/// row dead is added to `problems`, as the relay's reason must name it.
fn expected_value(
    json: &Json,
    path: &str,
    depth: usize,
    problems: &mut Vec<String>,
) -> Option<AMQPValue> {
    let too_deep = |what: &str, problems: &mut Vec<String>| {
        let deep = depth > MAX_DEPTH;
        if deep {
            problems.push(format!(
                "header {} nests {what} deeper than {MAX_DEPTH} levels",
                preview(path)
            ));
        }
        deep
    };
    Some(match json {
        Json::Null => return None,
        Json::Bool(flag) => AMQPValue::Boolean(*flag),
        Json::Text(text) => AMQPValue::LongString(LongString::from(text.clone())),
        // From -2^63 to 2^63-1 a long-long-int; past either bound dead: "send it as a string".
        Json::Int(literal) => match literal.parse::<i64>() {
            Ok(integer) => AMQPValue::LongLongInt(integer),
            Err(_) => {
                let (side, bound) = match literal.starts_with('-') {
                    true => ("below the smallest", i64::MIN),
                    false => ("above the largest", i64::MAX),
                };
                problems.push(format!(
                    "header {} is {}, {side} AMQP integer ({bound}, a signed 64-bit \
                     long-long-int); send it as a string",
                    preview(path),
                    preview(literal)
                ));
                return None;
            }
        },
        // The double nearest the digits; dead beyond a double's range.
        Json::Float(literal) => match literal.parse::<f64>() {
            Ok(float) if float.is_finite() => AMQPValue::Double(float),
            _ => {
                problems.push(format!(
                    "header {} is {}, beyond the range of an AMQP double",
                    preview(path),
                    preview(literal)
                ));
                return None;
            }
        },
        Json::List(items) => {
            if too_deep("arrays", problems) {
                return None;
            }
            let mut array = FieldArray::default();
            for (index, item) in items.iter().enumerate() {
                let here = format!("{path}[{index}]");
                let value = expected_value(item, &here, depth + 1, problems);
                array.push(value.unwrap_or(AMQPValue::Void));
            }
            AMQPValue::FieldArray(array)
        }
        Json::Object(entries) => {
            if too_deep("objects", problems) {
                return None;
            }
            let mut table = FieldTable::default();
            for (key, value) in entries {
                let here = match path.is_empty() {
                    true => format!("{key:?}"),
                    false => format!("{path}.{key:?}"),
                };
                if key.len() > 255 {
                    problems.push(format!(
                        "header key {} is {} bytes; AMQP allows 255",
                        preview(&here),
                        key.len()
                    ));
                }
                let value = expected_value(value, &here, depth + 1, problems);
                if let (Some(value), true) = (value, key.len() <= 255) {
                    table.insert(key.as_str().into(), value);
                }
            }
            AMQPValue::FieldTable(table)
        }
    })
}

/// The short name of what a dead row's `last_error` names, for the counts.
fn dead_reason(last_error: &str) -> &'static str {
    [
        ("routing key of", "routing key over 255 bytes"),
        ("frame_max", "properties over frame_max"),
        ("event_id is", "event_id over 255 bytes"),
        ("event_type is", "event_type over 255 bytes"),
        ("AMQP integer", "integer outside 64 bits"),
        ("AMQP double", "number beyond a double"),
        ("header key", "header key over 255 bytes"),
        ("deeper than", "nested too deep"),
        ("not a JSON object", "not a JSON object"),
        ("not valid JSON", "not valid JSON"),
    ]
    .into_iter()
    .find(|(says, _)| last_error.contains(says))
    .map_or("other", |(_, reason)| reason)
}

/// Why the database refused a row, in short.
fn refusal(error: &str) -> String {
    let lower = error.to_lowercase();
    let reason = [
        ("too long", "too long for its column"),
        ("0x00", "NUL in text"),
        ("invalid byte sequence", "not UTF-8"),
        ("incorrect string value", "not UTF-8"),
        ("bytea", "bytes for a text column"),
        ("duplicate", "duplicate under the column's collation"),
    ]
    .into_iter()
    .find(|(says, _)| lower.contains(says))
    .map(|(_, reason)| reason.to_owned());
    reason.unwrap_or_else(|| preview(error))
}

/// Rows drawn with the seed, the control room's events among them (one every
/// `rows / CONTROL_EVENTS` rows).
fn draw(rows: usize, seed: u64) -> Vec<Planned> {
    let mut bytes = [0x5a_u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &bytes);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    let strategy = drawn();
    let every = (rows / CONTROL_EVENTS).max(1);
    let mut planned = Vec::with_capacity(rows + CONTROL_EVENTS);
    for n in 0..rows {
        if n % every == 0 && n / every < CONTROL_EVENTS {
            planned.push(control_event(n / every));
        }
        let drawn = strategy.new_tree(&mut runner).expect("a row").current();
        planned.push(plan(n, drawn));
    }
    planned
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |value| {
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value}: a number"))
    })
}

/// Inserts `rows` as producers do, in multi-row statements of up to 2 MB; a statement the
/// database refuses is retried row by row, and the rows it refuses alone are skipped.
/// Returns the refusals by event id. Envelopes that are not UTF-8 go in one by one as
/// bytes (SQLite keeps them, as a BLOB; the others refuse them).
async fn insert(app: &TestApp, rows: &[Planned]) -> HashMap<String, String> {
    let db = app.database.db();
    let table = &app.database.table;
    let mut refused = HashMap::new();
    let mut start = 0;
    while start < rows.len() {
        let mut end = start;
        let mut bytes = 0;
        while end < rows.len() && end - start < 100 && bytes < 2_000_000 {
            bytes += rows[end].envelope.len() + rows[end].headers.as_ref().map_or(0, String::len);
            end += 1;
        }
        let chunk = &rows[start..end];
        start = end;
        let events: Option<Vec<NewEvent>> = chunk.iter().map(new_event).collect();
        if let Some(events) = &events {
            if outbox_store::insert_events(db, table, events).await.is_ok() {
                continue;
            }
        }
        for row in chunk {
            let result = match new_event(row) {
                Some(event) => outbox_store::insert_events(db, table, &[event])
                    .await
                    .map_err(|error| error.to_string()),
                None => insert_bytes(app, row).await,
            };
            if let Err(error) = result {
                refused.insert(row.event_id.clone(), refusal(&error));
            }
        }
    }
    refused
}

fn new_event(row: &Planned) -> Option<NewEvent> {
    Some(NewEvent {
        event_id: row.event_id.clone(),
        event_type: row.event_type.clone(),
        room_id: row.room.clone(),
        envelope: String::from_utf8(row.envelope.clone()).ok()?,
        headers: row.headers.clone(),
        available_at: None,
    })
}

async fn insert_bytes(app: &TestApp, row: &Planned) -> Result<(), String> {
    let backend = app.database.backend();
    let marks = match backend {
        // Bytes would be stored as their `\x…` text: the database decodes them instead.
        DbBackend::Postgres => "$1, $2, $3, convert_from($4, 'UTF8'), $5",
        _ => "?, ?, ?, ?, ?",
    };
    let sql = format!(
        "INSERT INTO {} (event_id, event_type, room_id, envelope, headers) VALUES ({marks})",
        app.database.table
    );
    let values: Vec<Value> = vec![
        row.event_id.clone().into(),
        row.event_type.clone().into(),
        row.room.clone().into(),
        row.envelope.clone().into(),
        row.headers.clone().into(),
    ];
    app.database
        .db()
        .execute(Statement::from_sql_and_values(backend, sql, values))
        .await
        .map(|_| ())
        .map_err(|error| error.to_string())
}

#[derive(Debug, FromQueryResult)]
struct Stored {
    event_id: String,
    event_type: String,
    room_id: String,
}

/// Takes the values the database stored where it changed them without refusing the row
/// (PostgreSQL and MariaDB cut spaces past a VARCHAR's length, as SQL says), and what is
/// expected of them; returns how many rows it changed.
async fn as_stored(app: &TestApp, planned: &mut [Planned]) -> usize {
    let sql = format!(
        "SELECT event_id, event_type, room_id FROM {} ORDER BY id",
        app.database.table
    );
    let stored = Stored::find_by_statement(Statement::from_string(app.database.backend(), sql))
        .all(app.database.db())
        .await
        .expect("rows readable");
    let by_tag: HashMap<String, usize> = (planned.iter().enumerate())
        .map(|(index, row)| (tag(&row.event_id), index))
        .collect();
    let mut changed = 0;
    for stored in stored {
        let row = &mut planned[by_tag[&tag(&stored.event_id)]];
        let now = (&stored.event_id, &stored.event_type, &stored.room_id);
        if (&row.event_id, &row.event_type, &row.room) != now {
            changed += 1;
            row.event_id = stored.event_id;
            row.event_type = stored.event_type;
            row.room = stored.room_id;
            row.expect = row.expected();
        }
    }
    changed
}

/// Polls until no row is pending, at most `deadline`; whether none is (the rows still
/// pending are then named with the others that are not as promised).
async fn settled(app: &TestApp, deadline: Duration) -> bool {
    let sql = format!(
        "SELECT COUNT(*) AS n FROM {} WHERE status = 'pending'",
        app.database.table
    );
    let until = Instant::now() + deadline;
    loop {
        let statement = Statement::from_string(app.database.backend(), sql.clone());
        let row = app
            .database
            .db()
            .query_one(statement)
            .await
            .expect("a count");
        if row
            .expect("one row")
            .try_get::<i64>("", "n")
            .expect("a number")
            == 0
        {
            return true;
        }
        if Instant::now() > until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[derive(Debug, FromQueryResult)]
struct Outcome {
    id: i64,
    event_id: String,
    status: String,
    retry_count: i32,
    last_error: Option<String>,
}

async fn outcomes(app: &TestApp) -> Vec<Outcome> {
    let sql = format!(
        "SELECT id, event_id, status, retry_count, last_error FROM {} ORDER BY id",
        app.database.table
    );
    Outcome::find_by_statement(Statement::from_string(app.database.backend(), sql))
        .all(app.database.db())
        .await
        .expect("outcomes readable")
}

async fn every_hostile_row_is_published_intact_or_dead_naming_why(backend: Backend) {
    let started = Instant::now();
    let rows = env_number("OUTBOX_HOSTILE_ROWS", DEFAULT_ROWS as u64) as usize;
    let seed = env_number("OUTBOX_HOSTILE_SEED", DEFAULT_SEED);
    let mut planned = draw(rows, seed);
    let drawn_in = started.elapsed();
    let app = TestApp::on(backend)
        .settings(|settings| {
            settings.amqp.routes = vec![outbox_relay::settings::RouteSettings {
                event_type: KEYED.into(),
                exchange: settings.amqp.exchange.clone(),
                routing_key: Some("{event_type}.{key}".into()),
                ..Default::default()
            }];
        })
        .build()
        .await;
    let mut relay = RelayProcess::spawn(crate::RELAY, &app.settings);
    let refused = insert(&app, &planned).await;
    planned.retain(|row| !refused.contains_key(&row.event_id));
    let cut = as_stored(&app, &mut planned).await;
    for row in &mut planned {
        row.check_frame(&app.settings.relay.node_id);
    }
    let inserted: Vec<&Planned> = planned.iter().collect();
    // A deadline for a relay that stopped resolving rows, not a speed bound: on SQLite (one
    // writer) the 8,300 rows, half of them dead one by one, take about a minute alone on a
    // 2-core machine, and longer beside the rest of the suite.
    let resolved = settled(&app, within(Duration::from_secs(180))).await;
    let outcomes = outcomes(&app).await;
    let by_id: HashMap<&str, &Outcome> =
        outcomes.iter().map(|o| (o.event_id.as_str(), o)).collect();
    let published: Vec<&str> = outcomes
        .iter()
        .filter(|o| o.status == "published")
        .map(|o| o.event_id.as_str())
        .collect();
    app.broker
        .wait_for_each(
            &published
                .iter()
                .map(|id| outbox_tests::event(id, "-"))
                .collect::<Vec<_>>(),
            within(Duration::from_secs(30)),
        )
        .await;
    let received = app.broker.drain(within(Duration::from_secs(30))).await;
    assert_eq!(
        relay.exited(),
        None,
        "the relay exited:\n{}",
        relay.log_text()
    );
    let log = relay.log_text();
    assert!(!log.contains("panicked"), "the relay panicked:\n{log}");

    let mut deliveries: HashMap<&str, Vec<&Received>> = HashMap::new();
    for message in &received {
        deliveries
            .entry(message.message_id.as_str())
            .or_default()
            .push(message);
    }
    let node_id = &app.settings.relay.node_id;
    let mut failures = Vec::new();
    let mut dead_by_reason: BTreeMap<&str, usize> = BTreeMap::new();
    for row in &inserted {
        let name = preview(&format!("{:?}", row.event_id));
        let Some(outcome) = by_id.get(row.event_id.as_str()) else {
            failures.push(format!("{name}: inserted, and no longer in the table"));
            continue;
        };
        match (outcome.status.as_str(), &row.expect) {
            ("published", _) => match deliveries.get(row.event_id.as_str()) {
                None => failures.push(format!("{name}: published, never received")),
                Some(messages) => {
                    for message in messages {
                        if let Some(wrong) = check_message(row, outcome, message, node_id) {
                            failures.push(format!("{name}: {wrong}"));
                        }
                    }
                }
            },
            // Too close to `frame_max` to call: dead for it is as good as published.
            ("dead", Ok(_))
                if row.fits == Fits::Unsure
                    && outcome.last_error.as_deref().is_some_and(|error| {
                        error.contains(&format!("frame_max of {}", frame::FRAME_MAX))
                    }) =>
            {
                *dead_by_reason
                    .entry("properties over frame_max")
                    .or_default() += 1;
            }
            ("dead", Ok(_)) => failures.push(format!(
                "{name}: dead, though it can be published: {:?}",
                outcome.last_error
            )),
            ("dead", Err(problems)) => {
                let error = outcome.last_error.as_deref().unwrap_or_default();
                *dead_by_reason.entry(dead_reason(error)).or_default() += 1;
                let named = error.starts_with("cannot be published: ")
                    && problems
                        .iter()
                        .any(|problem| error.contains(problem.as_str()));
                if !named || outcome.retry_count != 1 {
                    failures.push(format!(
                        "{name}: dead after {} attempts with {error:?}, which names none of {problems:?}",
                        outcome.retry_count
                    ));
                }
            }
            (status, _) => failures.push(format!(
                "{name}: {status} after {} attempts, last error {:?}",
                outcome.retry_count, outcome.last_error
            )),
        }
    }
    for message in &received {
        if !by_id.contains_key(message.message_id.as_str()) {
            failures.push(format!(
                "received {:?}, which no row has",
                message.message_id
            ));
        }
    }
    let control_rows: HashMap<&str, usize> = inserted
        .iter()
        .filter_map(|row| Some((row.event_id.as_str(), row.control?)))
        .collect();
    let control: Vec<usize> = received
        .iter()
        .filter_map(|message| control_rows.get(message.message_id.as_str()).copied())
        .fold(Vec::new(), |mut firsts, index| {
            if !firsts.contains(&index) {
                firsts.push(index);
            }
            firsts
        });
    let controls = CONTROL_EVENTS.min(rows);
    if control != (0..controls).collect::<Vec<_>>() {
        failures.push(format!("the control room arrived as {control:?}"));
    }
    // Every room, the shared ones where rows go dead among the others too: what remains
    // of it arrives in the order of its rows.
    let rooms: HashMap<&str, (&str, i64)> = inserted
        .iter()
        .filter_map(|row| {
            let outcome = by_id.get(row.event_id.as_str())?;
            Some((row.event_id.as_str(), (row.room.as_str(), outcome.id)))
        })
        .collect();
    failures.extend(out_of_order(&received, &rooms));
    // No fault in this run: no event may be delivered twice.
    let duplicates = received.len() - deliveries.len();
    if duplicates > 0 {
        failures.push(format!(
            "{duplicates} duplicate deliveries in a run without a fault"
        ));
    }
    let over = inserted.iter().filter(|row| row.fits == Fits::No).count();
    let unsure = inserted
        .iter()
        .filter(|row| row.fits == Fits::Unsure)
        .count();
    let mut skipped: BTreeMap<&str, usize> = BTreeMap::new();
    for why in refused.values() {
        *skipped.entry(why.as_str()).or_default() += 1;
    }
    let dead = dead_by_reason.values().sum::<usize>();
    eprintln!(
        "hostile rows on {backend:?} (OUTBOX_HOSTILE_SEED={seed}): {rows} rows drawn in {:.1} s \
         and {controls} control events; {} inserted ({cut} with spaces past a column's length cut), {} skipped at insert \
         {skipped:?}; \
         {} published, {dead} dead {dead_by_reason:?} ({over} clearly over frame_max, {unsure} too \
         close to call); {} deliveries, {duplicates} duplicates; \
         {} failures; {:.1} s in all",
        drawn_in.as_secs_f64(),
        inserted.len(),
        refused.len(),
        published.len(),
        received.len(),
        failures.len(),
        started.elapsed().as_secs_f64(),
    );
    assert!(
        failures.is_empty(),
        "{} rows not as promised; the first:\n{}",
        failures.len(),
        failures
            .iter()
            .take(15)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(resolved, "rows left pending");
    assert_eq!(
        published.len() + dead,
        inserted.len(),
        "0 rows lost, 0 pending"
    );
    relay.stop(Duration::from_secs(30)).await;
    app.teardown().await;
}

per_backend!(every_hostile_row_is_published_intact_or_dead_naming_why: postgres, mariadb, sqlite);
