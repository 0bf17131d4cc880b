//! `outbox-relay admin-token --name NAME --role viewer|operator`.

use crate::admin::tokens::{self, Role};
use crate::cli::{AdminRole, AdminTokenArgs};
use anyhow::Context as _;

/// Prints a new token and the tokens file's line for it (its hash, never the token).
pub fn admin_token(args: AdminTokenArgs) -> anyhow::Result<()> {
    let role = match args.role {
        AdminRole::Viewer => Role::Viewer,
        AdminRole::Operator => Role::Operator,
    };
    let token = tokens::new_token().context("cannot read randomness from the system")?;
    let line = tokens::line(&args.name, role, &token);
    // The line parses as the file would hold it: a bad name is refused here, not at start.
    tokens::Tokens::parse(&line)
        .map_err(|why| crate::startup::ConfigProblem(format!("--name {:?}: {why}", args.name)))?;
    say!("token: {token}")?;
    say!("line for admin.tokens_file: {line}")?;
    Ok(())
}
