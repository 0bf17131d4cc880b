//! Passwords and CA files: read from where the settings say, put where they belong, and
//! never shown in an error, `check-config` or `{:?}`.

use super::load;
use crate::settings::Settings;

#[test]
fn passwords_never_reach_messages_or_effective_settings() {
    let config = load(
        "[database]\nurl = \"postgres://relay:s3cret@db:5432/app\"\n[amqp]\nurl = \"amqp://relay:hunter2@mq:5672/%2f\"",
        &[],
    )
    .unwrap();
    let effective = toml::to_string(&config.effective).unwrap();
    assert!(
        !effective.contains("s3cret") && !effective.contains("hunter2"),
        "{effective}"
    );
    assert!(effective.contains("relay:***@db"), "{effective}");
    let error = load("[database]\nurl = \"oracle://u:s3cret@db/x\"", &[]).unwrap_err();
    assert!(!error.contains("s3cret"), "{error}");
    assert!(error.contains("database.url"), "{error}");
}

/// A file in a fresh temporary directory (outside figment's jail, which owns the cwd).
fn temp_file(name: &str, contents: &str) -> String {
    let dir = std::env::temp_dir().join(format!("outbox-settings-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path.display().to_string()
}

#[test]
fn password_from_a_file_goes_into_the_url_and_nowhere_else() {
    let file = temp_file("db-password", "fr0m-f1le\n");
    let config = load(
        &format!(
            "[database]\nurl = \"postgres://relay@db/app\"\npassword_file = \"{file}\"\n\
             [amqp]\nurl = \"amqp://relay@mq/%2f\""
        ),
        &[("OUTBOX_RELAY__AMQP__PASSWORD", "fr0m-env")],
    )
    .unwrap();
    assert_eq!(config.database.url, "postgres://relay:fr0m-f1le@db/app");
    assert_eq!(config.database.redacted_url, "postgres://relay:***@db/app");
    assert_eq!(config.amqp.brokers[0].url, "amqp://relay:fr0m-env@mq/%2f");
    let shown = format!(
        "{}\n{config:?}",
        toml::to_string(&config.effective).unwrap()
    );
    assert!(
        !shown.contains("fr0m-f1le") && !shown.contains("fr0m-env"),
        "{shown}"
    );
    assert_eq!(config.secrets.scrub("x fr0m-f1le fr0m-env"), "x *** ***");
}

#[test]
fn debug_output_of_the_settings_and_config_holds_no_password() {
    let config = load(
        "[database]\nurl = \"postgres://relay:s3cret@db/app\"\n[amqp]\nurl = \"amqp://relay:hunter2@mq/%2f\"",
        &[],
    )
    .unwrap();
    let debug = format!("{config:?}\n{:#?}", config.effective);
    assert!(
        !debug.contains("s3cret") && !debug.contains("hunter2"),
        "{debug}"
    );
    assert!(debug.contains("relay:***@db"), "{debug}");
    let mut settings = Settings::default();
    settings.database.password = "s3cret".into();
    assert!(!format!("{settings:?}").contains("s3cret"));
}

#[test]
fn unreadable_password_file_is_rejected_naming_the_key_and_path() {
    let error = load(
        "[database]\nurl = \"postgres://relay@db/app\"\npassword_file = \"/nonexistent/db-password\"",
        &[],
    )
    .unwrap_err();
    assert!(
        error.contains("database.password_file") && error.contains("/nonexistent/db-password"),
        "{error}"
    );
}

#[test]
fn empty_password_file_is_rejected() {
    let file = temp_file("empty-password", "\n");
    let error = load(
        &format!("[amqp]\nurl = \"amqp://relay@mq/%2f\"\npassword_file = \"{file}\""),
        &[],
    )
    .unwrap_err();
    assert!(
        error.contains("amqp.password_file") && error.contains("empty"),
        "{error}"
    );
}

#[test]
fn password_and_password_file_together_are_rejected() {
    let file = temp_file("both-password", "from-file");
    let error = load(
        &format!("[amqp]\nurl = \"amqp://relay@mq/%2f\"\npassword_file = \"{file}\""),
        &[("OUTBOX_RELAY__AMQP__PASSWORD", "from-env")],
    )
    .unwrap_err();
    assert_eq!(
        error,
        format!(
            "amqp.password (from environment variable OUTBOX_RELAY__AMQP__PASSWORD) and \
             amqp.password_file = {file:?} are both set: give the password in one of them, \
             not both"
        ),
        "names the variable that gave the password"
    );
    assert!(
        !error.contains("from-env") && !error.contains("from-file"),
        "{error}"
    );
}

#[test]
fn a_database_password_given_twice_names_the_variable_of_either_key() {
    let file = temp_file("both-database-password", "from-file");
    let url = "[database]\nurl = \"postgres://relay@db/app\"\n";
    let error = load(
        &format!("{url}password_file = \"{file}\""),
        &[("OUTBOX_RELAY__DATABASE__PASSWORD", "from-env")],
    )
    .unwrap_err();
    assert!(
        error.starts_with(
            "database.password (from environment variable OUTBOX_RELAY__DATABASE__PASSWORD) \
             and database.password_file = "
        ) && error.contains("are both set"),
        "{error}"
    );
    let error = load(
        &format!("{url}password = \"from-toml\""),
        &[("OUTBOX_RELAY__DATABASE__PASSWORD_FILE", &file)],
    )
    .unwrap_err();
    assert!(
        error.starts_with(&format!(
            "database.password and database.password_file = {file:?} (from environment \
             variable OUTBOX_RELAY__DATABASE__PASSWORD_FILE) are both set"
        )),
        "{error}"
    );
    assert!(!error.contains("from-toml"), "{error}");
    let error = load(
        &format!("{url}password = \"x\"\npassword_file = \"{file}\""),
        &[],
    )
    .unwrap_err();
    assert!(
        error.starts_with("database.password and database.password_file = ")
            && !error.contains("environment"),
        "both in the file: no variable named: {error}"
    );
}

#[test]
fn an_outbox_password_given_twice_names_the_variable_of_either_key() {
    let file = temp_file("both-outbox-password", "from-file");
    let entry = "[[outboxes]]\ntable = \"a\"\ndatabase_url = \"postgres://relay@db2/x\"\n";
    let error = load(
        &format!("{entry}database_password_file = \"{file}\""),
        &[("OUTBOX_RELAY__OUTBOXES__A__DATABASE_PASSWORD", "from-env")],
    )
    .unwrap_err();
    assert!(
        error.starts_with("outboxes[0] (a): database_password and database_password_file = ")
            && error.ends_with(
                "(from environment variable OUTBOX_RELAY__OUTBOXES__A__DATABASE_PASSWORD)"
            ),
        "{error}"
    );
    let error = load(
        &format!("{entry}database_password = \"from-toml\""),
        &[("OUTBOX_RELAY__OUTBOXES__0__DATABASE_PASSWORD_FILE", &file)],
    )
    .unwrap_err();
    assert!(
        error.ends_with(
            "(from environment variable OUTBOX_RELAY__OUTBOXES__0__DATABASE_PASSWORD_FILE)"
        ),
        "{error}"
    );
}

#[test]
fn password_setting_next_to_a_password_in_the_url_is_rejected() {
    let error = load(
        "[database]\nurl = \"postgres://relay:in-url@db/app\"",
        &[("OUTBOX_RELAY__DATABASE__PASSWORD", "in-env")],
    )
    .unwrap_err();
    assert!(
        error.contains("database.url") && error.contains("one place"),
        "{error}"
    );
    assert!(
        !error.contains("in-url") && !error.contains("in-env"),
        "{error}"
    );
}

#[test]
fn password_setting_without_a_user_in_the_url_is_rejected() {
    let error = load(
        "[database]\nurl = \"postgres://db/app\"\npassword = \"pw\"",
        &[],
    )
    .unwrap_err();
    assert!(
        error.contains("database.url") && error.contains("names the user"),
        "{error}"
    );
}

#[test]
fn password_setting_for_sqlite_is_rejected() {
    let error = load("[database]\npassword = \"pw\"", &[]).unwrap_err();
    assert!(
        error.contains("database.password") && error.contains("sqlite"),
        "{error}"
    );
}

#[test]
fn amqps_url_with_a_ca_file_is_accepted() {
    let file = temp_file(
        "ca.pem",
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    );
    let config = load(
        &format!("[amqp]\nurl = \"amqps://relay:pw@mq:5671/%2f\"\ntls_ca_file = \"{file}\""),
        &[],
    )
    .unwrap();
    assert_eq!(config.amqp.redacted_urls(), "amqps://relay:***@mq:5671/%2f");
    assert!(config
        .amqp
        .tls_ca_pem
        .unwrap()
        .contains("BEGIN CERTIFICATE"));
}

#[test]
fn missing_tls_ca_file_is_rejected_naming_the_key_and_path() {
    let error = load(
        "[amqp]\nurl = \"amqps://mq/%2f\"\ntls_ca_file = \"/nonexistent/ca.pem\"",
        &[],
    )
    .unwrap_err();
    assert!(
        error.contains("amqp.tls_ca_file") && error.contains("/nonexistent/ca.pem"),
        "{error}"
    );
}

#[test]
fn tls_ca_file_without_certificates_is_rejected() {
    let file = temp_file("not-a-ca.pem", "hello");
    let error = load(
        &format!("[amqp]\nurl = \"amqps://mq/%2f\"\ntls_ca_file = \"{file}\""),
        &[],
    )
    .unwrap_err();
    assert!(
        error.contains("amqp.tls_ca_file") && error.contains("holds none"),
        "{error}"
    );
}

#[test]
fn tls_ca_file_with_a_plain_amqp_url_is_rejected() {
    let file = temp_file(
        "plain-ca.pem",
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    );
    let error = load(&format!("[amqp]\ntls_ca_file = \"{file}\""), &[]).unwrap_err();
    assert!(
        error.contains("amqp.tls_ca_file") && error.contains("amqps://"),
        "{error}"
    );
}

#[test]
fn every_broker_of_a_cluster_gets_the_password_and_none_shows_it() {
    let config = load(
        "[amqp]\nurl = [\"amqp://relay@mq-1/%2f\", \"amqp://relay:own-pw@mq-2/%2f\"]",
        &[("OUTBOX_RELAY__AMQP__PASSWORD", "cl0ster")],
    )
    .unwrap_err();
    assert!(
        config.contains("amqp.url") && config.contains("password in one place"),
        "a URL with its own password beside amqp.password: {config}"
    );
    assert!(
        !config.contains("own-pw") && !config.contains("cl0ster"),
        "{config}"
    );

    let config = load(
        "[amqp]\nurl = [\"amqp://relay@mq-1/%2f\", \"amqp://relay@mq-2/%2f\"]",
        &[("OUTBOX_RELAY__AMQP__PASSWORD", "cl0ster")],
    )
    .unwrap();
    let urls: Vec<&str> = config.amqp.brokers.iter().map(|b| b.url.as_str()).collect();
    assert_eq!(
        urls,
        vec![
            "amqp://relay:cl0ster@mq-1/%2f",
            "amqp://relay:cl0ster@mq-2/%2f"
        ]
    );
    let shown = format!(
        "{}\n{config:?}",
        toml::to_string(&config.effective).unwrap()
    );
    assert!(!shown.contains("cl0ster"), "{shown}");
    assert!(
        shown.contains(r#"url = ["amqp://relay@mq-1/%2f", "amqp://relay@mq-2/%2f"]"#)
            && shown.contains("amqp://relay:***@mq-2/%2f"),
        "check-config prints the list as written, the Debug output redacted: {shown}"
    );
    assert_eq!(
        config.secrets.scrub("x amqp://relay:cl0ster@mq-1"),
        "x amqp://relay:***@mq-1"
    );
}

/// Loads `toml` from a settings file of `mode`, with `env`: the warnings.
#[cfg(unix)]
// figment's Jail closures return its (large) error type.
#[allow(clippy::result_large_err)]
fn warnings_at_mode(toml: &str, mode: u32, env: &[(&str, &str)]) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    let mut warnings = Vec::new();
    figment::Jail::expect_with(|jail| {
        jail.create_file("relay.toml", toml)?;
        std::fs::set_permissions("relay.toml", std::fs::Permissions::from_mode(mode))
            .expect("chmod");
        for (key, value) in env {
            jail.set_env(key, value);
        }
        let config = crate::settings::Config::load(std::path::Path::new("relay.toml"), true)
            .expect("valid settings");
        warnings = config.warnings;
        Ok(())
    });
    warnings
}

#[cfg(unix)]
#[test]
fn a_settings_file_holding_a_password_that_others_may_read_is_warned_of() {
    let toml = "[database]\nurl = \"postgres://relay:s3cret@db/app\"\n";
    let warnings = warnings_at_mode(toml, 0o644, &[]);
    assert_eq!(
        warnings,
        [
            "settings file relay.toml holds a secret and is readable by its group or others \
          (mode 0644): chmod 600 relay.toml (or chmod 640 with a group only the relay's user \
          is in, the file owned by root)"
        ]
    );
    assert!(!warnings[0].contains("s3cret"));
    assert_eq!(warnings_at_mode(toml, 0o600, &[]), Vec::<String>::new());
    // Nothing secret in the file: its mode is its owner's business.
    let plain = "[database]\nurl = \"postgres://relay@db/app\"\n";
    assert_eq!(warnings_at_mode(plain, 0o644, &[]), Vec::<String>::new());
}

#[cfg(unix)]
#[test]
fn a_password_file_that_others_may_read_is_warned_of_with_its_key() {
    use std::os::unix::fs::PermissionsExt;
    let file = temp_file("open-password", "pw\n");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    let toml = "[database]\nurl = \"postgres://relay@db/app\"\n";
    let warnings = warnings_at_mode(
        toml,
        0o600,
        &[("OUTBOX_RELAY__DATABASE__PASSWORD_FILE", file.as_str())],
    );
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with(&format!(
            "password file {file} (database.password_file) is readable by its group or others \
             (mode 0640): chmod 600 {file}"
        )),
        "{warnings:?}"
    );
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let quiet = warnings_at_mode(
        toml,
        0o600,
        &[("OUTBOX_RELAY__DATABASE__PASSWORD_FILE", file.as_str())],
    );
    assert_eq!(quiet, Vec::<String>::new());
}
