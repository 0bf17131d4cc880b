//! `outbox-relay check-config`.

use crate::settings::Config;

/// Prints the effective settings (passwords redacted) as TOML.
pub fn check_config(config: &Config) -> anyhow::Result<()> {
    println!("# configuration is valid; effective settings (secrets redacted):");
    for warning in &config.warnings {
        println!("# warning: {warning}");
    }
    print!("{}", toml::to_string(&config.effective)?);
    Ok(())
}
