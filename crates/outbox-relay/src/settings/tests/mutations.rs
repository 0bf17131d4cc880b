//! The settings campaign's cases and the rule they are held to.
//!
//! Each case is a valid settings file (`config/default.toml`, `config/production.example.toml`,
//! or every key of `docs/reference/settings.md` at its default, with two `[[outboxes]]`)
//! mutated by a few random edits — a key deleted, an unknown key added, a value of another
//! type, a number out of range, a malformed duration or URL, broken TOML, bytes that are no
//! UTF-8, a key given twice, random Unicode, an `[[outboxes]]` entry with an odd name —
//! and a few `OUTBOX_RELAY__…` variables with such values. The cases come from a seed, so
//! a run is repeatable and a failure can be replayed by the seed and its number. Each case
//! records its edits as the keys they touched and the values they wrote (`edits.rs`).
//!
//! A start on such settings must succeed or be refused with messages that each name a key
//! (`key_named.rs`, beside this file); the in-process campaign (`campaign.rs`) holds it to
//! more (`verdict.rs`). Used by that campaign and by the binary's (`tests/e2e/settings.rs`,
//! which includes this file and `key_named.rs`).

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config as RunnerConfig, RngAlgorithm, TestRng, TestRunner};
use std::path::Path;

#[path = "edits.rs"]
mod edits;
use edits::{after_delete, placeholders, segments};
pub use edits::{key, Kind, Mutation};

/// The campaign's seed unless `OUTBOX_SETTINGS_SEED` gives another.
pub const SEED: u64 = 0x5e77_1265_c0ff_ee01;

/// The variable `name` as a number, else `default` (`OUTBOX_SETTINGS_CASES`, …).
pub fn number_from_env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(default)
}

/// One mutated start: a settings file's bytes and the variables set beside it.
#[derive(Debug, Clone)]
pub struct Case {
    /// Its position in the campaign, from 0 (the same seed gives the same case).
    pub number: usize,
    /// The settings file, as bytes (not always UTF-8).
    pub file: Vec<u8>,
    /// `OUTBOX_RELAY__…` variables: names of `[A-Za-z0-9_]`, values without NUL.
    pub env: Vec<(String, String)>,
    /// What was done to the base, for a failure's report.
    pub edits: Vec<String>,
    /// The same edits and variables, each with the key it touched and what it wrote.
    pub mutations: Vec<Mutation>,
    /// The first line (from 1) that the edits of the text (a line twice, broken TOML, an
    /// appended entry) changed; `None` when they changed nothing. Read by the in-process
    /// campaign only.
    #[allow(dead_code)]
    pub text_changed_from: Option<usize>,
}

/// The valid settings the cases start from, as tables. `database_url` and `amqp_url` are
/// put in for the production example's servers (the tests' own where they connect); its
/// `password_file` and `tls_ca_file` keys are left out, since the files they name exist in
/// a deployment only.
pub fn bases(root: &Path, database_url: &str, amqp_url: &str) -> Vec<toml::Table> {
    let read = |name: &str| {
        let path = root.join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
    };
    let mut default: toml::Table = toml::from_str(&read("config/default.toml")).expect("TOML");
    set(&mut default, &["amqp", "url"], amqp_url);
    let production: String = read("config/production.example.toml")
        .lines()
        .filter(|line| {
            let key = line.trim_start();
            !key.starts_with("password_file") && !key.starts_with("tls_ca_file")
        })
        .map(|line| format!("{line}\n"))
        .collect();
    let mut production: toml::Table = toml::from_str(&production).expect("TOML");
    set(&mut production, &["database", "url"], database_url);
    set(&mut production, &["amqp", "url"], amqp_url);
    let mut reference = reference(&read("docs/reference/settings.md"));
    set(&mut reference, &["amqp", "url"], amqp_url);
    vec![default, production, reference]
}

/// Sets the text at `path` of `table`.
fn set(table: &mut toml::Table, path: &[&str], value: &str) {
    let (last, parents) = path.split_last().expect("a path");
    let mut table = table;
    for key in parents {
        table = table
            .entry(*key)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .expect("a table");
    }
    table.insert((*last).into(), toml::Value::String(value.into()));
}

/// Every key of the reference's plain sections at its default, and two `[[outboxes]]`
/// entries (`rooms` at its defaults, `orders` with its own exchange).
fn reference(page: &str) -> toml::Table {
    let mut table = toml::Table::new();
    let mut listed = false;
    for line in page.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            listed = heading.starts_with("`[[");
            continue;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (Some(key), Some(default)) = (cells.get(1), cells.get(3)) else {
            continue;
        };
        let (Some(key), Some(default)) = (
            key.strip_prefix('`').and_then(|k| k.strip_suffix('`')),
            default.strip_prefix('`').and_then(|d| d.strip_suffix('`')),
        ) else {
            continue;
        };
        let Ok(value) = format!("v = {default}").parse::<toml::Table>() else {
            continue;
        };
        if listed || key.starts_with("outboxes.") {
            continue;
        }
        let path: Vec<&str> = key.split('.').collect();
        let (last, parents) = path.split_last().expect("a key");
        let mut at = &mut table;
        for key in parents {
            at = at
                .entry(*key)
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .expect("a table");
        }
        at.insert((*last).into(), value["v"].clone());
    }
    let entries: toml::Value = toml::from_str::<toml::Table>(
        "[[outboxes]]\nname = \"rooms\"\ntable = \"room_outbox\"\n\
         [[outboxes]]\nname = \"orders\"\ntable = \"orders_outbox\"\nexchange = \"orders\"\n",
    )
    .expect("TOML")["outboxes"]
        .clone();
    table.insert("outboxes".into(), entries);
    table
}

/// One edit of a base.
#[derive(Debug, Clone)]
enum Edit {
    /// Remove the value (or section) at the pick.
    Delete(usize),
    /// Add `key` to the table at the pick, holding a value.
    Unknown(usize, String, String),
    /// Replace the value at the pick by this TOML text (another type, out of range, …).
    Replace(usize, String),
    /// Write the line at the pick twice (a key or a section given twice).
    Twice(usize),
    /// Append an `[[outboxes]]` entry with this name and table.
    Outbox(String, String),
    /// Insert this text at the pick of bytes (broken TOML).
    Break(usize, String),
    /// Insert these bytes at the pick (no UTF-8).
    Bytes(usize, Vec<u8>),
}

/// A TOML value as text: another type, out of range, malformed, odd.
fn raw_value() -> impl Strategy<Value = String> {
    let quoted = text().prop_map(|text| toml::Value::String(text).to_string());
    prop_oneof![
        3 => quoted,
        2 => proptest::sample::select(RAW.to_vec()).prop_map(str::to_owned),
        1 => any::<i64>().prop_map(|n| n.to_string()),
        1 => any::<bool>().prop_map(|b| b.to_string()),
    ]
}

/// Text values: malformed durations and URLs, odd names, random Unicode.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::sample::select(TEXTS.to_vec()).prop_map(str::to_owned),
        1 => proptest::collection::vec(any::<char>(), 0..12)
            .prop_map(|chars| chars.into_iter().filter(|c| *c != '\0').collect()),
    ]
}

/// TOML values of every type, and numbers TOML or the settings cannot hold.
const RAW: &[&str] = &[
    "-1",
    "0",
    "1",
    "-9223372036854775808",
    "9223372036854775807",
    "18446744073709551616",
    "18446744073709551615",
    "1e309",
    "-1e309",
    "nan",
    "inf",
    "-0.0",
    "0.5",
    "0x7fffffffffffffff",
    "1_000",
    "true",
    "false",
    "{}",
    "{ a = 1 }",
    "{ column = \"tenant\", type = \"nope\" }",
    "[]",
    "[1, \"a\"]",
    "[\"amqp://guest:guest@127.0.0.1:5672/%2f\", 5]",
    "[{ event_type = \"a.*\", exchange = \"x\" }]",
    "[{ exchange = 5 }]",
    "1979-05-27T07:32:00Z",
    "07:32:00",
    "'literal \\ text'",
    "\"\"\"two\nlines\"\"\"",
];

/// Malformed durations and URLs, odd names, Unicode.
const TEXTS: &[&str] = &[
    "",
    " ",
    "5",
    "-1s",
    "1y",
    "0s",
    "1.5s",
    "5 m",
    "30s ",
    "18446744073709551616s",
    "99999999999999999999d",
    "584942417355y",
    "9223372036854775807s",
    "1000000000000000h",
    "∞",
    "soon",
    "postgres://",
    "postgres://relay:p@ss:w/rd@db/app",
    "postgres://relay:p%zz@db/app",
    "postgres://:5432/app",
    "postgres://relay@/app",
    "postgres://relay@db:99999/app",
    "postgres://relay@db-1:5432,,db-2/app",
    "postgres://relay@db-1:abc,db-2:5432/app",
    "postgres://relay@db-1:5432,db-2:5432/app",
    "postgresql://relay:ü mlaut@db/app",
    "mysql://root@127.0.0.1:3306/test",
    "mariadb://a:b@c/d",
    "sqlite::memory:",
    "sqlite://",
    "sqlite://relay.db?mode=rwc",
    "oracle://u:s3cret@db/x",
    "http://collector:4318",
    "https://user:pw@collector:4318",
    "amqp://",
    "amqp://[::1",
    "amqp://relay:pä%ss@mq/%2f",
    "amqp://guest:guest@127.0.0.1:5672/%2f,",
    "amqps://mq,amqp://",
    "amqp://mq-1/%2f,amqp://relay:p@ss@mq-2/%2f",
    "amqp:// mq",
    "::::",
    "//relay:pw@db/app",
    "[amqp://mq-1/%2f]",
    "host=db password=hunter2",
    "room.events",
    "{event_type}",
    "{nope}",
    "{",
    "room.#.*",
    "per_room",
    "none",
    "global",
    "exponential",
    "json",
    "xml",
    "debug,outbox_pipeline=trace",
    "warning",
    "=debug",
    "127.0.0.1:9187",
    "127.0.0.1:99999",
    "[::1]:0",
    "anywhere",
    "x-delayed-message",
    "key",
    "order",
    "Orders",
    "a b",
    "ä",
    "-",
    ".",
    "../etc",
    "rooms;drop table x",
    "room_outbox",
    "orders",
    "/nonexistent/password",
    "\u{202e}evil",
    "\u{feff}",
    "🦀🦀🦀",
    "日本語",
    "\u{7f}\u{1b}[31m",
];

/// Odd `[[outboxes]]` names (and tables).
const NAMES: &[&str] = &[
    "",
    "Orders",
    "a b",
    "ä",
    "-",
    ".",
    "0",
    "rooms",
    "orders",
    "../etc",
    "x;y",
    "🦀",
    "key",
    "room_outbox",
];

/// Text that breaks TOML where it lands.
const BREAKS: &[&str] = &[
    "=",
    "[",
    "]",
    "\"",
    "'",
    "[[",
    "]]",
    "\\",
    "= =",
    "\n[relay\n",
    "\nkey\n",
    "\n= 1\n",
    "{",
    "\n[relay]\n",
    "\n[[outboxes]]\n",
    "\u{0}",
    "\r",
    "\n\"\"\"\n",
    "#",
    "\n[a.b.c.]\n",
];

/// Bytes that are not UTF-8.
const NOT_UTF8: &[&[u8]] = &[
    &[0xff],
    &[0xc3],
    &[0xed, 0xa0, 0x80],
    &[0xfe, 0xff],
    &[0xc0, 0xaf],
    &[0xf4, 0x90, 0x80, 0x80],
];

fn edit() -> impl Strategy<Value = Edit> {
    let pick = 0..10_000usize;
    prop_oneof![
        3 => pick.clone().prop_map(Edit::Delete),
        2 => (pick.clone(), prop_oneof![
                proptest::sample::select(vec!["bogus", "exchnage", "passwd", "url ", "Lease"])
                    .prop_map(str::to_owned),
                text(),
            ], raw_value())
            .prop_map(|(at, key, value)| Edit::Unknown(at, key, value)),
        6 => (pick.clone(), raw_value()).prop_map(|(at, value)| Edit::Replace(at, value)),
        1 => pick.clone().prop_map(Edit::Twice),
        1 => (
                proptest::sample::select(NAMES.to_vec()),
                proptest::sample::select(NAMES.to_vec()),
            )
            .prop_map(|(name, table)| Edit::Outbox(name.into(), table.into())),
        1 => (pick.clone(), proptest::sample::select(BREAKS.to_vec()))
            .prop_map(|(at, text)| Edit::Break(at, text.into())),
        1 => (pick, proptest::sample::select(NOT_UTF8.to_vec()))
            .prop_map(|(at, bytes)| Edit::Bytes(at, bytes.to_vec())),
    ]
}

/// Keys the environment may set, as `section.key` (an entry by position or name).
const ENV_KEYS: &[&str] = &[
    "database.url",
    "database.password",
    "database.password_file",
    "database.table",
    "database.max_connections",
    "database.notify",
    "database.listen_url",
    "database.probe_interval",
    "database.columns.key",
    "database.columns.headers",
    "amqp.url",
    "amqp.password",
    "amqp.tls_ca_file",
    "amqp.exchange",
    "amqp.exchange_type",
    "amqp.routing_key",
    "amqp.routes",
    "amqp.key_header",
    "amqp.header_columns",
    "amqp.declare_exchange",
    "relay.publishers",
    "relay.batch_size",
    "relay.poll_interval",
    "relay.lease",
    "relay.max_attempts",
    "relay.retention",
    "relay.ordering",
    "relay.retry_strategy",
    "relay.max_inflight_bytes",
    "relay.startup_timeout",
    "relay.node_id",
    "log.format",
    "log.level",
    "metrics.listen",
    "telemetry.otlp_endpoint",
    "outboxes.0.table",
    "outboxes.1.database_url",
    "outboxes.orders.database_password",
    "outboxes.rooms.publishers",
    "outboxes.9.table",
    "outboxes.nope.table",
    "outboxes",
    "bogus.key",
    "relay.bogus",
    "relay.lease.deeper",
    "",
    "relay..lease",
];

/// One `OUTBOX_RELAY__…` variable: a key (sometimes in lowercase) and a value.
fn variable() -> impl Strategy<Value = (String, String)> {
    let value = prop_oneof![
        3 => text(),
        1 => proptest::sample::select(RAW.to_vec()).prop_map(str::to_owned),
    ];
    (
        proptest::sample::select(ENV_KEYS.to_vec()),
        any::<bool>(),
        value,
    )
        .prop_map(|(key, lower, value)| {
            let name = format!("OUTBOX_RELAY__{}", key.replace('.', "__").to_uppercase());
            let name = if lower { name.to_lowercase() } else { name };
            (name, value.replace('\0', ""))
        })
}

/// `count` cases from `bases`, generated from `seed`: the same arguments, the same cases.
pub fn cases(bases: &[toml::Table], seed: u64, count: usize) -> Vec<Case> {
    let mut bytes = [0u8; 32];
    for (index, byte) in bytes.iter_mut().enumerate() {
        *byte = seed.to_le_bytes()[index % 8] ^ (index as u8);
    }
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &bytes);
    let mut runner = TestRunner::new_with_rng(RunnerConfig::default(), rng);
    let strategy = (
        0..bases.len(),
        proptest::collection::vec(edit(), 0..4),
        proptest::collection::vec(variable(), 0..3),
    );
    (0..count)
        .map(|number| {
            let (base, edits, env) = strategy.new_tree(&mut runner).expect("a case").current();
            let mut case = apply(&bases[base], &edits);
            case.number = number;
            case.edits.insert(0, format!("base {base}"));
            case.mutations.extend(env.iter().map(|(name, value)| {
                let rest = &name[PREFIX.len()..];
                let path = rest.split("__").map(str::to_ascii_lowercase).collect();
                Mutation {
                    name: Some(name.clone()),
                    ..Mutation::new(Kind::Variable, path, Some(value.clone()))
                }
            }));
            case.env = env;
            case
        })
        .collect()
}

/// The variables' prefix, in any case.
const PREFIX: &str = "OUTBOX_RELAY__";

/// A place in a table: a key or a list's position.
#[derive(Debug, Clone)]
enum Step {
    Key(String),
    At(usize),
}

/// Every value of `table` (tables and lists too), by its steps.
fn places(table: &toml::Table) -> Vec<Vec<Step>> {
    fn walk(value: &toml::Value, path: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
        out.push(path.clone());
        match value {
            toml::Value::Table(table) => {
                for (key, value) in table {
                    path.push(Step::Key(key.clone()));
                    walk(value, path, out);
                    path.pop();
                }
            }
            toml::Value::Array(items) => {
                for (index, value) in items.iter().enumerate() {
                    path.push(Step::At(index));
                    walk(value, path, out);
                    path.pop();
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(
        &toml::Value::Table(table.clone()),
        &mut Vec::new(),
        &mut out,
    );
    out.remove(0);
    out
}

/// The value at `path`.
fn at<'a>(value: &'a mut toml::Value, path: &[Step]) -> Option<&'a mut toml::Value> {
    let Some((first, rest)) = path.split_first() else {
        return Some(value);
    };
    let inner = match (first, value) {
        (Step::Key(key), toml::Value::Table(table)) => table.get_mut(key)?,
        (Step::At(index), toml::Value::Array(items)) => items.get_mut(*index)?,
        _ => return None,
    };
    at(inner, rest)
}

/// The base with `edits` applied: structure first, then the text, then the bytes.
fn apply(base: &toml::Table, edits: &[Edit]) -> Case {
    let mut root = toml::Value::Table(base.clone());
    let mut raws: Vec<String> = Vec::new();
    let mut described = Vec::new();
    let mut mutations: Vec<Mutation> = Vec::new();
    // Which mutation each placeholder belongs to.
    let mut owners: Vec<usize> = Vec::new();
    let placeholder = |raws: &mut Vec<String>, raw: &str| {
        raws.push(raw.to_owned());
        toml::Value::String(format!("@@raw{}@@", raws.len() - 1))
    };
    for edit in edits {
        let toml::Value::Table(table) = &root else {
            unreachable!("the root is a table")
        };
        let places = places(table);
        let pick = |at: usize| places.get(at % places.len().max(1)).cloned();
        match edit {
            Edit::Delete(pick_at) => {
                let Some(path) = pick(*pick_at) else { continue };
                let (last, parent) = path.split_last().expect("a place");
                match (at(&mut root, parent), last) {
                    (Some(toml::Value::Table(table)), Step::Key(key)) => {
                        table.remove(key);
                    }
                    (Some(toml::Value::Array(items)), Step::At(index)) => {
                        items.remove(*index);
                    }
                    _ => {}
                }
                let path = segments(&path);
                after_delete(&mut mutations, &path);
                described.push(format!("delete {}", key(&path)));
                mutations.push(Mutation::new(Kind::Delete, path, None));
            }
            Edit::Unknown(pick_at, name, raw) => {
                let tables: Vec<Vec<Step>> = std::iter::once(Vec::new())
                    .chain(places.iter().cloned())
                    .filter(|path| {
                        matches!(at(&mut root.clone(), path), Some(toml::Value::Table(_)))
                    })
                    .collect();
                let path = tables[pick_at % tables.len()].clone();
                let value = placeholder(&mut raws, raw);
                let mut kind = Kind::Unknown;
                if let Some(toml::Value::Table(table)) = at(&mut root, &path) {
                    // A key the table has already: its value is replaced.
                    if table.insert(name.clone(), value).is_some() {
                        kind = Kind::Replace;
                    }
                }
                let mut path = segments(&path);
                path.push(name.clone());
                described.push(format!("add {:?} = {raw}", key(&path)));
                owners.push(mutations.len());
                mutations.push(Mutation::new(kind, path, Some(raw.clone())));
            }
            Edit::Replace(pick_at, raw) => {
                let Some(path) = pick(*pick_at) else { continue };
                let value = placeholder(&mut raws, raw);
                if let Some(slot) = at(&mut root, &path) {
                    *slot = value;
                }
                let path = segments(&path);
                described.push(format!("set {} = {raw}", key(&path)));
                owners.push(mutations.len());
                mutations.push(Mutation::new(Kind::Replace, path, Some(raw.clone())));
            }
            _ => {}
        }
    }
    // A value replaced by a later edit, or deleted with its table, is no longer written.
    for owner in &owners {
        mutations[*owner].live = false;
    }
    let mut found = Vec::new();
    placeholders(&root, &mut Vec::new(), &mut found);
    for (number, path) in found {
        let mutation = &mut mutations[owners[number]];
        mutation.live = true;
        mutation.path = path;
    }
    let toml::Value::Table(table) = root else {
        unreachable!("the root is a table")
    };
    // Each placeholder replaced by its raw text, noting the line it lands on.
    let mut rest = toml::to_string(&table).expect("a table serialises");
    let mut text = String::new();
    while let Some(start) = rest.find("\"@@raw") {
        let end = start + rest[start + 1..].find('"').expect("a closing quote") + 2;
        let number: usize = rest[start + 6..end - 3].parse().expect("a placeholder");
        text.push_str(&rest[..start]);
        mutations[owners[number]].line = Some(text.matches('\n').count() + 1);
        text.push_str(&raws[number]);
        rest = rest.split_off(end);
    }
    text.push_str(&rest);
    let written = text.clone();
    for edit in edits {
        match edit {
            Edit::Twice(pick_at) => {
                let lines: Vec<&str> = text.lines().collect();
                if lines.is_empty() {
                    continue;
                }
                let line = pick_at % lines.len();
                described.push(format!("write twice {:?}", lines[line]));
                mutations.push(Mutation {
                    name: Some(lines[line].to_owned()),
                    ..Mutation::new(Kind::Twice, Vec::new(), None)
                });
                let mut doubled: Vec<&str> = lines[..=line].to_vec();
                doubled.extend(&lines[line..]);
                text = doubled.join("\n") + "\n";
            }
            Edit::Outbox(name, table) => {
                described.push(format!("outbox {name:?} on {table:?}"));
                let entries = text.lines().filter(|line| *line == "[[outboxes]]").count();
                mutations.push(Mutation::new(
                    Kind::Outbox,
                    vec!["outboxes".into(), entries.to_string()],
                    Some(format!("{{ name = {name:?}, table = {table:?} }}")),
                ));
                text.push_str(&format!(
                    "\n[[outboxes]]\nname = {}\ntable = {}\n",
                    toml::Value::String(name.clone()),
                    toml::Value::String(table.clone())
                ));
            }
            Edit::Break(pick_at, junk) => {
                let mut offset = pick_at % (text.len() + 1);
                while !text.is_char_boundary(offset) {
                    offset -= 1;
                }
                described.push(format!("insert {junk:?} at byte {offset}"));
                text.insert_str(offset, junk);
                mutations.push(Mutation::new(Kind::Break, Vec::new(), Some(junk.clone())));
            }
            _ => {}
        }
    }
    let text_changed_from = (written.bytes().zip(text.bytes()))
        .position(|(before, after)| before != after)
        .or_else(|| (written.len() != text.len()).then(|| written.len().min(text.len())))
        .map(|offset| {
            text.as_bytes()[..offset]
                .iter()
                .filter(|b| **b == b'\n')
                .count()
                + 1
        });
    let mut file = text.into_bytes();
    let bytes_from = mutations.len();
    for edit in edits {
        if let Edit::Bytes(pick_at, bytes) = edit {
            let offset = pick_at % (file.len() + 1);
            described.push(format!("insert bytes {bytes:x?} at byte {offset}"));
            file.splice(offset..offset, bytes.iter().copied());
            // Those inserted before at or after `offset` have moved on.
            for earlier in &mut mutations[bytes_from..] {
                earlier.at = earlier
                    .at
                    .map(|at| if at >= offset { at + bytes.len() } else { at });
            }
            mutations.push(Mutation {
                at: Some(offset),
                ..Mutation::new(Kind::NotUtf8, Vec::new(), None)
            });
        }
    }
    Case {
        number: 0,
        file,
        env: Vec::new(),
        edits: described,
        mutations,
        text_changed_from,
    }
}
