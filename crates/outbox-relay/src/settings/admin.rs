//! `[admin]`: the admin API's listener and its tokens file, read as it is checked so that
//! `check-config` and `run` refuse a file that cannot be used.

use super::check::Section;
use super::config::AdminConfig;
use super::shape::AdminSettings;
use crate::admin::Tokens;
use std::sync::Arc;

impl AdminSettings {
    /// `Some(None)` when disabled (nothing else is checked then: the keys are inert).
    pub(super) fn validate(&self, check: &mut Section<'_>) -> Option<Option<AdminConfig>> {
        if !self.enabled {
            return Some(None);
        }
        let listen = if self.listen.is_blank() {
            check.reject(
                "listen",
                "",
                "an address such as \"127.0.0.1:9188\" (set admin.enabled = false to serve no \
                 admin API)",
            )
        } else {
            check.parse(
                "listen",
                &self.listen,
                Some("an address such as \"127.0.0.1:9188\""),
            )
        };
        let path = self.tokens_file.trim();
        let tokens = if path.is_empty() {
            check.reject(
                "tokens_file",
                "",
                "the path of the tokens file, required when admin.enabled is true (one \
                 name:role:sha256:<hex> line per token; `outbox-relay admin-token` makes one)",
            )
        } else {
            match Tokens::read(path) {
                Ok(tokens) => Some(tokens),
                Err(why) => check.reject(
                    "tokens_file",
                    path,
                    format!("a readable tokens file of name:role:sha256:<hex> lines ({why})"),
                ),
            }
        };
        Some(Some(AdminConfig {
            listen: listen?,
            tokens: Arc::new(tokens?),
        }))
    }
}
