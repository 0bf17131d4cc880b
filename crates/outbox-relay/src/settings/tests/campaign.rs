//! The settings campaign, in process: thousands of mutated settings files and variables
//! ([`super::mutations`]) loaded as the binary's start loads them ([`Config::load`], whose
//! rejection is exit code 2), each under `catch_unwind`. Every start must be accepted, or
//! refused with messages that each name a key ([`super::key_named`]). `OUTBOX_SETTINGS_CASES` sets how many cases
//! (2,000 by default), `OUTBOX_SETTINGS_SEED` the seed (a fixed one by default).

use super::key_named;
use super::mutations::{self, number_from_env, Case, SEED};
use crate::settings::Config;
use figment::Jail;
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::Instant;

/// The settings file's name in the jail (no section's name starts it, so that naming the
/// file is never taken for naming a key).
const FILE: &str = "campaign-settings.toml";

/// What loading one case came to.
enum Outcome {
    Accepted,
    Rejected(Vec<String>),
    Panicked(String),
}

/// Loads `case` as `run` and `check-config` do, in a jail (its own directory and
/// variables).
// figment's Jail closures return its (large) error type.
#[allow(clippy::result_large_err)]
fn load(case: &Case) -> Outcome {
    let mut outcome = Outcome::Accepted;
    Jail::expect_with(|jail| {
        std::fs::write(jail.directory().join(FILE), &case.file).expect("file written");
        for (name, value) in &case.env {
            jail.set_env(name, value);
        }
        outcome = match catch_unwind(AssertUnwindSafe(|| Config::load(Path::new(FILE), true))) {
            Ok(Ok(_)) => Outcome::Accepted,
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

#[test]
fn mutated_settings_are_accepted_or_refused_naming_a_key() {
    let count = number_from_env("OUTBOX_SETTINGS_CASES", 2_000) as usize;
    let seed = number_from_env("OUTBOX_SETTINGS_SEED", SEED);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let bases = mutations::bases(
        &root,
        "postgres://relay@db.internal:5432/rooms",
        "amqp://guest:guest@127.0.0.1:5672/%2f",
    );
    let started = Instant::now();
    let cases = mutations::cases(&bases, seed, count);
    let (mut accepted, mut refused) = (0, 0);
    let mut by_key: BTreeMap<String, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    for case in &cases {
        let fail = |why: String| {
            format!(
                "case {} (seed {seed:#x}): {why}\n  edits: {:?}\n  env: {:?}\n  file:\n{}",
                case.number,
                case.edits,
                case.env,
                String::from_utf8_lossy(&case.file)
            )
        };
        match load(case) {
            Outcome::Accepted => accepted += 1,
            Outcome::Panicked(message) => failures.push(fail(format!("panicked: {message}"))),
            Outcome::Rejected(errors) if errors.is_empty() => {
                failures.push(fail("refused without a message".into()))
            }
            Outcome::Rejected(errors) => {
                refused += 1;
                for error in &errors {
                    match key_named::names_a_key(error, FILE, &case.env) {
                        Some(key) => *by_key.entry(key).or_default() += 1,
                        None => failures.push(fail(format!("names no key: {error}"))),
                    }
                }
            }
        }
    }
    eprintln!(
        "settings campaign (seed {seed:#x}): {} cases in {:.1?}: {accepted} accepted (exit 0), \
         {refused} refused (exit 2); their messages by the key they name: {}",
        cases.len(),
        started.elapsed(),
        key_named::summary(&by_key)
    );
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}
