//! One module per subcommand.

/// `println!` that returns the write's error ([`OutputError`]) instead of panicking: a
/// reader that stops early (`outbox-relay status | head -3`) closes the pipe, and the
/// command ends quietly ([`crate::main`]). Use as `say!(…)?`.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*).map_err($crate::commands::OutputError)
    }};
}

mod admin_token;
mod check_config;
mod dead;
pub mod demo;
mod migrate;
mod purge;
mod run;
pub use run::ForcedStop;
mod status;
mod top;

use crate::cli::Command;
use crate::settings::Config;

/// A command's write to standard output failed ([`say`]).
#[derive(Debug, thiserror::Error)]
#[error("cannot write to standard output: {0}")]
pub struct OutputError(pub std::io::Error);

impl OutputError {
    /// The reader closed the pipe: Rust ignores SIGPIPE, so the write fails with
    /// `BrokenPipe` where a C tool would have been stopped by the signal; like such a
    /// tool, the command ends quietly. Other failures (a full disk) are errors.
    pub fn reader_gone(error: &anyhow::Error) -> bool {
        error
            .downcast_ref::<Self>()
            .is_some_and(|output| output.0.kind() == std::io::ErrorKind::BrokenPipe)
    }
}

/// Runs `command` with validated settings.
pub async fn dispatch(command: Command, config: Config) -> anyhow::Result<()> {
    match command {
        Command::Run => run::run(config).await,
        Command::Migrate(args) => migrate::migrate(config, args).await,
        Command::CheckConfig(args) => check_config::check_config(&config, args).await,
        Command::Status(args) => status::status(config, args).await,
        Command::Dead(command) => dead::dead(config, command).await,
        Command::Demo(args) => demo::demo(config, args).await,
        Command::Purge(args) => purge::purge(config, args).await,
        Command::Top(args) => top::top(config, args).await,
        Command::AdminToken(args) => admin_token::admin_token(args),
    }
}

/// Who runs an operator command, for the audit log line: `$USER`, else `$LOGNAME`, else
/// the numeric user id (systemd units and containers often set neither variable).
fn operator() -> String {
    operator_from(|name| std::env::var(name).ok())
}

fn operator_from(var: impl Fn(&str) -> Option<String>) -> String {
    use std::os::unix::fs::MetadataExt;
    ["USER", "LOGNAME"]
        .into_iter()
        .find_map(|name| var(name).filter(|value| !value.is_empty()))
        .or_else(|| {
            std::fs::metadata("/proc/self")
                .ok()
                .map(|process| format!("uid:{}", process.uid()))
        })
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::operator_from;

    #[test]
    fn the_operator_is_the_user_then_the_login_name_then_the_user_id() {
        let env = |user: Option<&str>, login: Option<&str>| {
            let (user, login) = (user.map(String::from), login.map(String::from));
            operator_from(move |name| match name {
                "USER" => user.clone(),
                "LOGNAME" => login.clone(),
                _ => None,
            })
        };
        assert_eq!(env(Some("ana"), Some("bo")), "ana");
        assert_eq!(env(Some(""), Some("bo")), "bo");
        let uid = env(None, None);
        assert!(
            uid.strip_prefix("uid:")
                .is_some_and(|n| n.parse::<u32>().is_ok()),
            "{uid}"
        );
    }
}
