//! The settings campaign, in process: thousands of mutated settings files and variables
//! ([`super::mutations`]) loaded as the binary's start loads them ([`Config::load`], whose
//! rejection is exit code 2), each under `catch_unwind`. An accepted start must hold every
//! value written ([`super::verdict::check_accepted`]); a refused one must name, in each
//! message, a key the case edited ([`super::refused::check_refused`]). Every kind of edit
//! must be tried, both outcomes must occur, and a file that is no UTF-8 or holds an
//! unknown key must never be accepted.
//!
//! `OUTBOX_SETTINGS_CASES` sets how many cases (2,000 by default), `OUTBOX_SETTINGS_SEED`
//! the seed; without it, a fixed seed, or a fresh one on CI (`CI` set), so that CI tries
//! other cases each run. The seed is printed first, so that a failure can be replayed.

use super::key_named;
use super::mutations::{self, number_from_env, Case, Kind, SEED};
use super::refused;
use super::verdict::{self, Judged};
use crate::settings::Config;
use figment::Jail;
use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::Instant;

/// The settings file's name in the jail (no section's name starts it, so that naming the
/// file is never taken for naming a key).
const FILE: &str = "campaign-settings.toml";

/// At a full campaign (this many cases or more), each kind of edit must get this many
/// cases at least, so that no kind goes untried unnoticed.
const FULL: usize = 500;
const EACH_KIND_AT_LEAST: usize = 5;

/// What loading one case came to.
enum Outcome {
    Accepted(Box<Config>),
    Rejected(Vec<String>),
    Panicked(String),
}

/// Loads `case` as `run` and `check-config` do, in a jail (its own directory and
/// variables).
// figment's Jail closures return its (large) error type.
#[allow(clippy::result_large_err)]
fn load(case: &Case) -> Outcome {
    let mut outcome = Outcome::Rejected(Vec::new());
    Jail::expect_with(|jail| {
        std::fs::write(jail.directory().join(FILE), &case.file).expect("file written");
        for (name, value) in &case.env {
            jail.set_env(name, value);
        }
        outcome = match catch_unwind(AssertUnwindSafe(|| Config::load(Path::new(FILE), true))) {
            Ok(Ok(config)) => Outcome::Accepted(Box::new(config)),
            Ok(Err(rejected)) => {
                Outcome::Rejected(rejected.errors.iter().map(ToString::to_string).collect())
            }
            Err(panic) => Outcome::Panicked(
                panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default(),
            ),
        };
        Ok(())
    });
    outcome
}

/// `OUTBOX_SETTINGS_SEED` (decimal, or hexadecimal after `0x`); else, on CI, a fresh
/// one; else [`SEED`].
fn seed() -> u64 {
    if let Ok(text) = std::env::var("OUTBOX_SETTINGS_SEED") {
        let text = text.trim();
        let parsed = match text.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16).ok(),
            None => text.parse().ok(),
        };
        return parsed.unwrap_or_else(|| panic!("OUTBOX_SETTINGS_SEED={text:?} is no number"));
    }
    if std::env::var_os("CI").is_some() {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos(),
        );
        return hasher.finish();
    }
    SEED
}

/// The cases of one kind of edit, by outcome.
#[derive(Debug, Default)]
struct Tally {
    cases: usize,
    accepted: usize,
    refused: usize,
    compared: usize,
    not_compared: usize,
}

#[test]
fn mutated_settings_hold_what_is_written_or_are_refused_naming_the_key() {
    let seed = seed();
    eprintln!("settings campaign seed: {seed}; replay with OUTBOX_SETTINGS_SEED={seed}");
    let count = number_from_env("OUTBOX_SETTINGS_CASES", 2_000) as usize;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let bases = mutations::bases(
        &root,
        "postgres://relay@db.internal:5432/rooms",
        "amqp://guest:guest@127.0.0.1:5672/%2f",
    );
    let started = Instant::now();
    let mut cases = mutations::cases(&bases, seed, count);
    let (mut accepted, mut refused, mut any_key) = (0, 0, 0);
    let mut by_key: BTreeMap<String, usize> = BTreeMap::new();
    let mut tallies: BTreeMap<Kind, Tally> = Kind::ALL.map(|k| (k, Tally::default())).into();
    let mut failures = Vec::new();
    for case in &mut cases {
        verdict::refine(case);
        let case = &*case;
        let fail = |why: String| {
            format!(
                "case {} (replay with OUTBOX_SETTINGS_SEED={seed}): {why}\n  edits: {:?}\n  \
                 env: {:?}\n  file:\n{}",
                case.number,
                case.edits,
                case.env,
                String::from_utf8_lossy(&case.file)
            )
        };
        let outcome = load(case);
        let mut kinds: Vec<Kind> = (case.mutations.iter())
            .filter(|m| m.live)
            .map(|m| m.kind)
            .collect();
        kinds.sort();
        kinds.dedup();
        for kind in &kinds {
            let tally = tallies.get_mut(kind).expect("every kind");
            tally.cases += 1;
            match outcome {
                Outcome::Accepted(_) => tally.accepted += 1,
                _ => tally.refused += 1,
            }
        }
        match outcome {
            Outcome::Accepted(config) => {
                accepted += 1;
                let (wrong, judged) = verdict::check_accepted(case, &config);
                for (kind, judged) in judged {
                    let tally = tallies.get_mut(&kind).expect("every kind");
                    match judged {
                        Judged::Compared => tally.compared += 1,
                        Judged::NotCompared => tally.not_compared += 1,
                    }
                }
                failures.extend(wrong.into_iter().map(fail));
            }
            Outcome::Panicked(message) => failures.push(fail(format!("panicked: {message}"))),
            Outcome::Rejected(errors) if errors.is_empty() => {
                failures.push(fail("refused without a message".into()))
            }
            Outcome::Rejected(errors) => {
                refused += 1;
                let refusal = refused::check_refused(case, &errors, FILE);
                any_key += refusal.any_key;
                failures.extend(refusal.failures.into_iter().map(fail));
                for error in &errors {
                    if let Some(key) = key_named::names_a_key(error, FILE, &case.env) {
                        *by_key.entry(key).or_default() += 1;
                    }
                }
            }
        }
    }
    let mut table = format!(
        "{:<24} {:>6} {:>9} {:>8} {:>9} {:>13}\n",
        "kind of edit", "cases", "accepted", "refused", "compared", "not compared"
    );
    for (kind, tally) in &tallies {
        table.push_str(&format!(
            "{:<24} {:>6} {:>9} {:>8} {:>9} {:>13}\n",
            kind.name(),
            tally.cases,
            tally.accepted,
            tally.refused,
            tally.compared,
            tally.not_compared
        ));
    }
    eprintln!(
        "settings campaign (seed {seed}): {} cases in {:.1?}: {accepted} accepted (exit 0), \
         {refused} refused (exit 2); {any_key} messages of cases whose text was edited named \
         any key; cases by the kinds of edit they hold (values compared: those of accepted \
         cases):\n{table}their messages by the key they name: {}",
        cases.len(),
        started.elapsed(),
        key_named::summary(&by_key)
    );
    assert!(
        failures.is_empty(),
        "{} failures in {} cases (replay with OUTBOX_SETTINGS_SEED={seed}):\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
    // An unknown key accepted is a failure of its case (`check_accepted`) unless text
    // inserted after it may have commented it out; bytes that are no UTF-8 never pass.
    assert_eq!(
        tallies[&Kind::NotUtf8].accepted,
        0,
        "a file that is no UTF-8 accepted"
    );
    assert!(
        accepted > 0 && refused > 0,
        "both outcomes must occur: {accepted} accepted, {refused} refused"
    );
    if cases.len() >= FULL {
        let untried: Vec<&str> = (tallies.iter())
            .filter(|(_, tally)| tally.cases < EACH_KIND_AT_LEAST)
            .map(|(kind, _)| kind.name())
            .collect();
        assert!(
            untried.is_empty(),
            "kinds of edit with fewer than {EACH_KIND_AT_LEAST} cases: {untried:?}"
        );
    }
}
