//! Everyday conveniences of the binary: `OUTBOX_RELAY_CONFIG` names the settings file,
//! logs carry no colour codes when stderr is not a terminal, `purge --dry-run` counts
//! what `purge` would delete, deleting nothing, in lines or `--json`, and the container
//! image carries OCI labels.

use outbox_relay::settings::Settings;
use outbox_tests::output::{stderr, succeeded};
use outbox_tests::OutputInTime as _;
use outbox_tests::{
    own_room_events as events, per_backend, seed, unique_name, Backend, SettingsFile, TestDatabase,
};
use std::process::Command;

/// The binary with `args`, run in the temporary directory (no `config/default.toml`
/// there), with no `OUTBOX_RELAY…` variable of the test's own environment.
fn relay(args: &[&str]) -> Command {
    let mut command = Command::new(crate::RELAY);
    command.args(args).current_dir(std::env::temp_dir());
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("OUTBOX_RELAY") {
            command.env_remove(name);
        }
    }
    command
}

#[actix_rt::test]
async fn outbox_relay_config_names_the_settings_file_and_config_wins() {
    let database = TestDatabase::new(Backend::Postgres).await;
    let named = |name: &str| {
        let mut settings = database.binary_settings();
        settings.relay.name = name.to_owned();
        SettingsFile::write(&settings)
    };
    let (from_env, from_flag) = (unique_name("from_env"), unique_name("from_flag"));
    let (env_file, flag_file) = (named(&from_env), named(&from_flag));

    let output = relay(&["check-config"])
        .env("OUTBOX_RELAY_CONFIG", &env_file.path)
        .output_in_time()
        .expect("runs");
    let stdout = succeeded("check-config with OUTBOX_RELAY_CONFIG", &output);
    assert!(
        stdout.contains(&format!("name = \"{from_env}\"")),
        "the file OUTBOX_RELAY_CONFIG names was read:\n{stdout}"
    );

    let output = relay(&["check-config", "--config"])
        .arg(&flag_file.path)
        .env("OUTBOX_RELAY_CONFIG", &env_file.path)
        .output_in_time()
        .expect("runs");
    let stdout = succeeded("check-config --config with OUTBOX_RELAY_CONFIG", &output);
    assert!(
        stdout.contains(&format!("name = \"{from_flag}\"")) && !stdout.contains(&from_env),
        "--config wins over OUTBOX_RELAY_CONFIG:\n{stdout}"
    );

    // A file the variable names must exist, as one --config names must.
    let missing = std::env::temp_dir().join(format!("{}.toml", unique_name("missing")));
    let output = relay(&["check-config"])
        .env("OUTBOX_RELAY_CONFIG", &missing)
        .output_in_time()
        .expect("runs");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let said = stderr(&output);
    assert!(
        said.contains("OUTBOX_RELAY_CONFIG") && said.contains(&missing.display().to_string()),
        "names the variable and the file: {said}"
    );
    let output = relay(&["check-config"])
        .env("OUTBOX_RELAY_CONFIG", "")
        .output_in_time()
        .expect("runs");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(
        stderr(&output).contains("OUTBOX_RELAY_CONFIG is set but empty"),
        "{output:?}"
    );

    let help = succeeded(
        "--help",
        &relay(&["--help"]).output_in_time().expect("runs"),
    );
    assert!(
        help.contains("OUTBOX_RELAY_CONFIG"),
        "the help says so:\n{help}"
    );
    database.drop_table().await;
}

/// Old published rows (two hours), recent published ones (ten minutes), old dead rows and
/// pending rows with an old `published_at`: what a purge of one hour would and would not
/// take.
async fn seed_rows(database: &TestDatabase) {
    let two_hours_ago = database.minutes_ago(120);
    let ten_minutes_ago = database.minutes_ago(10);
    for (prefix, count, sets) in [
        (
            "old",
            30,
            format!("status = 'published', published_at = {two_hours_ago}"),
        ),
        (
            "recent",
            4,
            format!("status = 'published', published_at = {ten_minutes_ago}"),
        ),
        (
            "dead",
            3,
            format!("status = 'dead', created_at = {two_hours_ago}"),
        ),
        (
            "held",
            2,
            format!(
                "created_at = {two_hours_ago}, published_at = {two_hours_ago}, available_at = {}",
                database.minutes_ago(-1440)
            ),
        ),
    ] {
        seed(database, &events(prefix, count, 2)).await;
        database
            .execute(&format!(
                "UPDATE {{t}} SET {sets} WHERE event_id LIKE '{prefix}-%'"
            ))
            .await;
    }
}

/// Rows left per prefix, sorted by prefix.
async fn left(database: &TestDatabase) -> Vec<(String, usize)> {
    let mut counts = std::collections::BTreeMap::new();
    for row in database.rows().await {
        let prefix = row.event_id.split('-').next().unwrap_or("").to_owned();
        *counts.entry(prefix).or_insert(0) += 1;
    }
    counts.into_iter().collect()
}

fn all_rows() -> Vec<(String, usize)> {
    [("dead", 3), ("held", 2), ("old", 30), ("recent", 4)]
        .into_iter()
        .map(|(prefix, n)| (prefix.to_owned(), n))
        .collect()
}

async fn purge_dry_run_counts_and_deletes_nothing(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    seed_rows(&database).await;
    let settings = database.binary_settings();
    let purge = |args: &[&str]| {
        let output = outbox_tests::run_binary(crate::RELAY, &settings, args);
        succeeded(&format!("{args:?}"), &output)
    };

    let stdout = purge(&["purge", "--older-than", "1h", "--dry-run"]);
    assert!(
        stdout.contains("would purge 30 published row(s) confirmed more than 1h ago"),
        "prints the count: {stdout}"
    );
    assert!(
        !stdout.contains("dead"),
        "dead rows only with --dead: {stdout}"
    );
    assert_eq!(
        left(&database).await,
        all_rows(),
        "--dry-run deletes nothing"
    );

    let stdout = purge(&[
        "purge",
        "--older-than",
        "1h",
        "--dead",
        "--dry-run",
        "--json",
    ]);
    let json: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|error| panic!("one JSON object: {error}: {stdout}"));
    assert_eq!(json["dry_run"], true, "{json}");
    assert_eq!(json["published"], 30, "{json}");
    assert_eq!(json["dead"], 3, "{json}");
    let name = database.table.as_str();
    assert_eq!(json["outboxes"][name]["published"], 30, "{json}");
    assert!(json["older_than"].is_string(), "{json}");
    assert_eq!(
        left(&database).await,
        all_rows(),
        "--dry-run deletes nothing"
    );

    // The real purge deletes what the dry run counted, and reports it in the same shape.
    let stdout = purge(&["purge", "--older-than", "1h", "--dead", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|error| panic!("one JSON object: {error}: {stdout}"));
    assert_eq!(json["dry_run"], false, "{json}");
    assert_eq!((&json["published"], &json["dead"]), (&30.into(), &3.into()));
    let kept: Vec<(String, usize)> = vec![("held".into(), 2), ("recent".into(), 4)];
    assert_eq!(left(&database).await, kept, "pending and recent rows stay");

    let stdout = purge(&["purge", "--older-than", "1h", "--dead", "--dry-run"]);
    assert!(
        stdout.contains("would purge 0 published row(s)")
            && stdout.contains("would purge 0 dead row(s)"),
        "{stdout}"
    );
    database.drop_table().await;
}

per_backend!(purge_dry_run_counts_and_deletes_nothing: postgres, sqlite, mariadb);

/// `purge` logs one info line per status ("rows purged"); pretty format, info level.
fn logging_settings(database: &TestDatabase) -> Settings {
    let mut settings = database.binary_settings();
    settings.log.format = "pretty".into();
    settings.log.level = "info".into();
    settings
}

#[actix_rt::test]
async fn logs_have_no_escape_codes_when_stderr_is_a_file() {
    let database = TestDatabase::new(Backend::Sqlite).await;
    let file = SettingsFile::write(&logging_settings(&database));
    let log = std::env::temp_dir().join(format!("{}.log", unique_name("plain")));
    let child = relay(&["purge", "--older-than", "1h", "--config"])
        .arg(&file.path)
        // NO_COLOR would turn colours off by itself: leave the terminal test alone.
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("runs");
    let status = outbox_tests::finish_within(child, "purge", outbox_tests::CHILD_DEADLINE).status;
    let logged = std::fs::read_to_string(&log).expect("log written");
    let _ = std::fs::remove_file(&log);
    assert!(status.success(), "{status:?}\n{logged}");
    assert!(
        logged.contains("rows purged"),
        "the purge logged its line: {logged:?}"
    );
    assert!(
        !logged.contains('\u{1b}'),
        "no escape codes in a file: {logged:?}"
    );
    database.drop_table().await;
}

/// The other side: on a terminal (a pseudo-terminal from util-linux `script`) the pretty
/// format is still coloured, unless NO_COLOR is set.
#[actix_rt::test]
async fn logs_are_coloured_on_a_terminal_unless_no_color() {
    assert!(
        Command::new("script")
            .arg("--version")
            .output_in_time()
            .is_ok(),
        "this test needs util-linux `script` for a terminal: apt-get install util-linux"
    );
    let database = TestDatabase::new(Backend::Sqlite).await;
    let file = SettingsFile::write(&logging_settings(&database));
    let line = format!(
        "{} --config {} purge --older-than 1h",
        crate::RELAY,
        file.path.display()
    );
    let on_terminal = |no_color: Option<&str>| {
        // A clean environment: nothing of the test's own OUTBOX_RELAY…, RUST_LOG, NO_COLOR.
        let mut script = Command::new("script");
        script
            .args(["-qec", &line, "/dev/null"])
            .current_dir(std::env::temp_dir())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default());
        if let Some(value) = no_color {
            script.env("NO_COLOR", value);
        }
        succeeded(&line, &script.output_in_time().expect("script runs"))
    };
    let coloured = on_terminal(None);
    assert!(
        coloured.contains("rows purged") && coloured.contains('\u{1b}'),
        "coloured on a terminal: {coloured:?}"
    );
    let plain = on_terminal(Some("1"));
    assert!(
        plain.contains("rows purged") && !plain.contains('\u{1b}'),
        "NO_COLOR=1 on a terminal: {plain:?}"
    );
    database.drop_table().await;
}

/// The container image's OCI labels: present, and the version and licence those of the
/// workspace (the Containerfile cannot read Cargo.toml, so this keeps them equal).
#[test]
fn the_containerfile_carries_the_oci_labels_with_the_workspace_version() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let containerfile = std::fs::read_to_string(root.join("deploy/container/Containerfile"))
        .expect("deploy/container/Containerfile");
    let runtime = containerfile
        .rsplit_once("\nFROM ")
        .map(|(_, last)| last)
        .expect("a runtime stage");
    assert!(
        runtime.contains(&format!("ARG VERSION={}\n", env!("CARGO_PKG_VERSION"))),
        "the runtime stage's VERSION is the workspace version {}",
        env!("CARGO_PKG_VERSION")
    );
    for label in [
        "title",
        "description",
        "version=\"${VERSION}\"",
        "revision=\"${REVISION}\"",
        "created=\"${CREATED}\"",
        "source=\"${SOURCE}\"",
        &format!("licenses=\"{}\"", env!("CARGO_PKG_LICENSE")),
    ] {
        assert!(
            runtime.contains(&format!("org.opencontainers.image.{label}")),
            "the runtime stage lacks the label {label}"
        );
    }
}
