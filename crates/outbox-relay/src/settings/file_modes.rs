//! Secrets in files that others may read: the settings file when it holds a secret, every
//! password file, and the admin API's tokens file while it is enabled, each checked as
//! libpq checks `.pgpass` (no access for the group or others) and named in a warning with
//! its mode and the fix (`docs/security.md#secret-files-others-can-read`).
//!
//! A warning, not a refusal: files that worked before an upgrade keep working, and the
//! operator is told what to change. Secrets mounted where their mode is not the operator's
//! to choose (Docker and Kubernetes secrets, systemd credentials) are recognised and not
//! checked.

use figment::value::{Dict, Value};
use std::path::{Path, PathBuf};

/// A file to check: where it is, and the key that names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SecretFile {
    /// The path as the settings give it.
    path: PathBuf,
    /// The password file's key (`database.password_file`); `None`: the settings file.
    key: Option<String>,
}

/// The files of these settings that hold a secret: `config` (the settings file) when
/// `config_holds_secret`, and every password file `settings` (the file's and the
/// environment's layers together) names, each once.
pub(super) fn secret_files(
    config: &Path,
    config_holds_secret: bool,
    settings: &super::Settings,
) -> Vec<SecretFile> {
    let mut files = Vec::new();
    if config_holds_secret {
        files.push(SecretFile {
            path: config.to_owned(),
            key: None,
        });
    }
    let Some(dict) = Value::serialize(settings).ok().and_then(Value::into_dict) else {
        return files;
    };
    let mut pairs = Vec::new();
    walk(&dict, &mut Vec::new(), &mut pairs);
    for (path, value) in pairs {
        let key = path.last().map(String::as_str).unwrap_or_default();
        let Some(file) = value
            .as_str()
            .map(str::trim)
            .filter(|file| !file.is_empty())
        else {
            continue;
        };
        // The admin API's tokens file holds hashes, not tokens, but whoever can write it
        // can let themselves in, and whoever can read it can try tokens offline.
        let tokens_file = key == "tokens_file" && settings.admin.enabled;
        if !(key.ends_with("password_file") || tokens_file)
            || files.iter().any(|known| known.path == Path::new(file))
        {
            continue;
        }
        files.push(SecretFile {
            path: PathBuf::from(file),
            key: Some(super::wording::key(&path)),
        });
    }
    files
}

/// Whether the settings file's own table (before the environment is laid over it) holds a
/// secret: a password key that is set (`password`, `database_password`), or a URL with a
/// password in it (`database.url`, `amqp.url` and each of its list, an entry's
/// `database_url`, …). RabbitMQ's built-in `guest:guest`, which the broker accepts from
/// loopback only, is no secret.
pub(super) fn holds_secret(file: &Dict) -> bool {
    let mut pairs = Vec::new();
    walk(file, &mut Vec::new(), &mut pairs);
    pairs.iter().any(|(path, value)| {
        let key = path
            .iter()
            .rev()
            .find(|segment| segment.parse::<usize>().is_err())
            .map(String::as_str)
            .unwrap_or_default();
        let Some(text) = value.as_str() else {
            return false;
        };
        if key.contains("password") && !key.ends_with("_file") {
            return !text.is_empty();
        }
        (key.ends_with("url") || key == "otlp_endpoint") && text.split(',').any(url_secret)
    })
}

/// Whether `url` carries a password other than RabbitMQ's default `guest:guest`.
fn url_secret(url: &str) -> bool {
    url::Url::parse(url.trim()).is_ok_and(|parsed| match parsed.password() {
        None => false,
        Some(password) => !(parsed.username() == "guest" && password == "guest"),
    })
}

/// Every scalar of `dict` with its path (list items by their position).
fn walk<'a>(dict: &'a Dict, path: &mut Vec<String>, out: &mut Vec<(Vec<String>, &'a Value)>) {
    for (key, item) in dict {
        path.push(key.clone());
        walk_value(item, path, out);
        path.pop();
    }
}

/// [`walk`] for one value.
fn walk_value<'a>(
    value: &'a Value,
    path: &mut Vec<String>,
    out: &mut Vec<(Vec<String>, &'a Value)>,
) {
    match value {
        Value::Dict(_, dict) => walk(dict, path, out),
        Value::Array(_, items) => {
            for (index, item) in items.iter().enumerate() {
                path.push(index.to_string());
                walk_value(item, path, out);
                path.pop();
            }
        }
        scalar => out.push((path.clone(), scalar)),
    }
}

/// The warnings for `files`: one per file whose mode gives its group or others access,
/// unless it is a mounted secret ([`mounted_secret`]).
pub(super) fn warnings(files: &[SecretFile]) -> Vec<String> {
    files.iter().filter_map(warning).collect()
}

#[cfg(not(unix))]
fn warning(_: &SecretFile) -> Option<String> {
    None
}

#[cfg(unix)]
fn warning(file: &SecretFile) -> Option<String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let metadata = std::fs::metadata(&file.path).ok()?;
    // A pipe or a device (`/dev/stdin`) has no mode of its own to fix.
    if !metadata.is_file() {
        return None;
    }
    let mode = metadata.permissions().mode();
    let credentials = std::env::var_os("CREDENTIALS_DIRECTORY").map(PathBuf::from);
    if !exposed(mode, metadata.uid(), process_uid())
        || mounted_secret(&file.path, credentials.as_deref())
    {
        return None;
    }
    let path = file.path.display();
    // A password file holds a secret by its name.
    let what = match &file.key {
        None => format!("settings file {path} holds a secret and"),
        Some(key) if key.ends_with("tokens_file") => format!("tokens file {path} ({key})"),
        Some(key) => format!("password file {path} ({key})"),
    };
    let access = if mode & 0o044 != 0 {
        "is readable by its group or others"
    } else {
        "gives its group or others access"
    };
    Some(format!(
        "{what} {access} (mode {:04o}): chmod 600 {path} (or chmod 640 with a group only the \
         relay's user is in, the file owned by root)",
        mode & 0o7777,
    ))
}

/// The user this process runs as (the owner of `/proc/self`); `None` where that cannot be
/// told.
#[cfg(unix)]
fn process_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").ok().map(|own| own.uid())
}

/// Whether a file of `mode` owned by `owner` gives its group or others more than it
/// should, as libpq decides for its files: any access for the group or others
/// (`mode & 0o077`), except group read on a file owned by root (libpq's rule for a key
/// file: root chose the group) when the relay does not run as root itself (then it needs
/// no group to read its own file).
fn exposed(mode: u32, owner: u32, process: Option<u32>) -> bool {
    let root_gives_its_group_read = owner == 0 && process != Some(0) && mode & 0o037 == 0;
    mode & 0o077 != 0 && !root_gives_its_group_read
}

/// Whether `path` is a secret mounted by the platform, whose mode is the platform's: after
/// resolving symlinks, under `/run/secrets/` or `/var/run/secrets/` (Docker, Kubernetes'
/// service account) or under `credentials` (systemd's `$CREDENTIALS_DIRECTORY`); or a
/// Kubernetes volume's file, which is a symlink into its `..data` directory (the atomic
/// writer's).
fn mounted_secret(path: &Path, credentials: Option<&Path>) -> bool {
    let resolved = path.canonicalize().unwrap_or_else(|_| path.to_owned());
    let credentials = credentials.map(|dir| dir.canonicalize().unwrap_or_else(|_| dir.to_owned()));
    under_mount(&resolved, credentials.as_deref()) || links_into_data(path)
}

/// Whether `resolved` (symlinks resolved) lies where secrets are mounted.
fn under_mount(resolved: &Path, credentials: Option<&Path>) -> bool {
    ["/run/secrets", "/var/run/secrets"]
        .iter()
        .map(Path::new)
        .chain(credentials.filter(|dir| !dir.as_os_str().is_empty()))
        .any(|mount| resolved.starts_with(mount) && resolved != mount)
}

/// Whether `path`, or a symlink it leads through, has a `..data` component.
fn links_into_data(path: &Path) -> bool {
    let data = |path: &Path| path.components().any(|part| part.as_os_str() == "..data");
    let mut at = path.to_owned();
    // A bound on the hops, as the kernel has (a loop would go on forever).
    for _ in 0..40 {
        if data(&at) {
            return true;
        }
        match std::fs::read_link(&at) {
            Ok(target) => {
                at = at
                    .parent()
                    .map_or(target.clone(), |parent| parent.join(&target));
            }
            Err(_) => return false,
        }
    }
    false
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn group_or_other_access_is_exposed_except_group_read_of_roots_file() {
        for (mode, owner, process, expected) in [
            (0o600, 1000, Some(1000), false),
            (0o400, 1000, Some(1000), false),
            (0o644, 1000, Some(1000), true),
            (0o640, 1000, Some(1000), true),
            (0o604, 1000, Some(1000), true),
            (0o620, 1000, Some(1000), true),
            (0o601, 1000, Some(1000), true),
            (0o640, 0, Some(1000), false),
            (0o640, 0, None, false),
            (0o640, 0, Some(0), true),
            (0o660, 0, Some(1000), true),
            (0o644, 0, Some(1000), true),
            (0o100600, 1000, Some(1000), false),
        ] {
            assert_eq!(
                exposed(mode, owner, process),
                expected,
                "{mode:o} owned by {owner}, run as {process:?}"
            );
        }
    }

    #[test]
    fn docker_kubernetes_and_systemd_mounts_are_recognised() {
        let credentials = Path::new("/run/credentials/outbox-relay.service");
        for (path, expected) in [
            ("/run/secrets/db-password", true),
            ("/var/run/secrets/kubernetes.io/serviceaccount/token", true),
            ("/run/credentials/outbox-relay.service/db-password", true),
            ("/run/secrets", false),
            ("/run/secretsx/db-password", false),
            ("/etc/outbox-relay/db-password", false),
            ("/run/credentials/other.service/db-password", false),
        ] {
            assert_eq!(
                under_mount(Path::new(path), Some(credentials)),
                expected,
                "{path}"
            );
        }
        assert!(!under_mount(
            Path::new("/etc/outbox-relay/db-password"),
            Some(Path::new(""))
        ));
        assert!(links_into_data(Path::new("/etc/secret/..data/password")));
    }

    #[test]
    fn a_kubernetes_volume_file_is_a_symlink_into_data() {
        let volume = std::env::temp_dir().join(format!("outbox-volume-{}", std::process::id()));
        let stamped = volume.join("..2026_01_01_00_00_00.000000001");
        std::fs::create_dir_all(&stamped).unwrap();
        std::fs::write(stamped.join("password"), "pw\n").unwrap();
        let _ = std::fs::remove_file(volume.join("..data"));
        let _ = std::fs::remove_file(volume.join("password"));
        std::os::unix::fs::symlink("..2026_01_01_00_00_00.000000001", volume.join("..data"))
            .unwrap();
        std::os::unix::fs::symlink("..data/password", volume.join("password")).unwrap();
        std::fs::write(volume.join("plain"), "pw\n").unwrap();
        assert!(mounted_secret(&volume.join("password"), None));
        assert!(!mounted_secret(&volume.join("plain"), None));
        assert!(
            mounted_secret(&volume.join("plain"), Some(&volume)),
            "under $CREDENTIALS_DIRECTORY"
        );
        std::fs::remove_dir_all(volume).unwrap();
    }

    #[test]
    fn a_url_password_or_a_password_key_is_a_secret_but_guest_is_not() {
        let holds = |toml: &str| {
            let table: toml::Table = toml::from_str(toml).unwrap();
            holds_secret(&Value::serialize(table).unwrap().into_dict().unwrap())
        };
        assert!(holds("[database]\nurl = \"postgres://relay:pw@db/app\""));
        assert!(holds(
            "[database]\nurl = \"postgres://relay:pw@db-1:5432,db-2:5432/app\""
        ));
        assert!(holds(
            "[amqp]\nurl = [\"amqp://mq-1/%2f\", \"amqp://relay:pw@mq-2/%2f\"]"
        ));
        assert!(holds(
            "[amqp]\nurl = \"amqp://mq-1/%2f,amqp://relay:pw@mq-2/%2f\""
        ));
        assert!(holds("[amqp]\npassword = \"pw\""));
        assert!(holds(
            "[[outboxes]]\ntable = \"t\"\ndatabase_url = \"mysql://app:pw@db/x\""
        ));
        assert!(holds(
            "[[outboxes]]\ntable = \"t\"\ndatabase_password = \"pw\""
        ));
        assert!(!holds(
            "[amqp]\nurl = \"amqp://guest:guest@127.0.0.1:5672/%2f\""
        ));
        assert!(!holds(
            "[database]\nurl = \"sqlite://relay.db?mode=rwc\"\npassword = \"\""
        ));
        assert!(!holds(
            "[database]\npassword_file = \"/etc/outbox-relay/db-password\""
        ));
        assert!(!holds("[relay]\nname = \"pw\""));
    }

    #[test]
    fn every_password_file_is_named_once_with_its_key() {
        let mut settings = crate::settings::Settings::default();
        settings.database.password_file = "/etc/relay/db".into();
        settings.amqp.password_file = "/etc/relay/mq".into();
        settings.outboxes = vec![
            crate::settings::OutboxSettings {
                database_password_file: "/etc/relay/orders".into(),
                ..Default::default()
            },
            crate::settings::OutboxSettings {
                database_password_file: "/etc/relay/db".into(),
                ..Default::default()
            },
        ];
        let files = secret_files(Path::new("relay.toml"), false, &settings);
        let named: Vec<(Option<&str>, &Path)> = (files.iter())
            .map(|file| (file.key.as_deref(), file.path.as_path()))
            .collect();
        assert_eq!(
            named,
            [
                (Some("amqp.password_file"), Path::new("/etc/relay/mq")),
                (Some("database.password_file"), Path::new("/etc/relay/db")),
                (
                    Some("outboxes[0].database_password_file"),
                    Path::new("/etc/relay/orders")
                ),
            ]
        );
        let with_config = secret_files(Path::new("relay.toml"), true, &settings);
        assert_eq!(with_config[0].key, None);
        assert_eq!(with_config[0].path, Path::new("relay.toml"));
    }
}
