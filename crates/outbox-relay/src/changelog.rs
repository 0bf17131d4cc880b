//! CHANGELOG.md against the version this binary reports: a version bump without its
//! changelog section fails the tests (operators decide upgrades from that file).

use crate::cli::Cli;
use clap::CommandFactory as _;

/// The repository's CHANGELOG.md, read at build time.
const CHANGELOG: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../CHANGELOG.md"));

/// The newest released section's heading: the first `## [` heading other than Unreleased.
fn newest_release() -> Option<&'static str> {
    CHANGELOG
        .lines()
        .filter(|line| line.starts_with("## ["))
        .find(|line| !line.starts_with("## [Unreleased]"))
}

#[test]
fn the_newest_changelog_section_is_this_version_with_its_date() {
    let version = env!("CARGO_PKG_VERSION");
    let heading = newest_release().expect("CHANGELOG.md has no released section");
    let prefix = format!("## [{version}] - ");
    let date = heading.strip_prefix(&prefix).unwrap_or_else(|| {
        panic!(
            "CHANGELOG.md's newest release is `{heading}`, not version {version} \
             (Cargo.toml): add its section, `{prefix}YYYY-MM-DD`"
        )
    });
    // Parsed and written back: chrono alone would also take `2026-12-4`.
    let parsed = chrono::NaiveDate::parse_from_str(date, "%Y-%m-%d").ok();
    assert_eq!(
        parsed
            .map(|day| day.format("%Y-%m-%d").to_string())
            .as_deref(),
        Some(date),
        "`{heading}`: the date is not a day written YYYY-MM-DD"
    );
}

#[test]
fn version_prints_the_changelog_version() {
    // `--version` and `outbox_relay_build_info` both take CARGO_PKG_VERSION, the
    // workspace's version; this pins the first to the changelog too.
    let printed = Cli::command().render_version();
    let heading = newest_release().expect("CHANGELOG.md has no released section");
    let version = heading
        .strip_prefix("## [")
        .and_then(|rest| rest.split(']').next())
        .expect("a `## [VERSION]` heading");
    assert_eq!(printed.trim(), format!("outbox-relay {version}"));
}
