//! One module per subcommand.

mod check_config;
mod dead;
pub mod demo;
mod migrate;
mod purge;
mod run;
mod status;

use crate::cli::Command;
use crate::settings::Config;

/// Runs `command` with validated settings.
pub async fn dispatch(command: Command, config: Config) -> anyhow::Result<()> {
    match command {
        Command::Run => run::run(config).await,
        Command::Migrate => migrate::migrate(config).await,
        Command::CheckConfig => check_config::check_config(&config),
        Command::Status(args) => status::status(config, args.json).await,
        Command::Dead(command) => dead::dead(config, command).await,
        Command::Demo(args) => demo::demo(config, args).await,
        Command::Purge(args) => purge::purge(config, args).await,
    }
}
