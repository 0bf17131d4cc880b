//! The database and the broker as `run` and `migrate` meet them at start: possibly not
//! there yet (a rolling deploy, a failover, `docker compose up`).
//!
//! - [`classify`]: the one place that decides whether a failure to reach them is one a
//!   retry can fix, a refusal of the settings (exit code 2), or anything else.
//! - [`wait`]: trying again with the project's jittered backoff until they answer, the
//!   failure is not one a retry can fix, or the bound runs out.

pub mod classify;
pub mod wait;

pub use classify::{classify, Verdict};
pub use wait::{Patience, StartupTimeout, Wait};

/// What the relay waits for at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dependency {
    /// Every outbox's database.
    Database,
    /// RabbitMQ.
    Broker,
}

impl Dependency {
    /// The `dependency` field of log lines and the label of `outbox_up`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Database => "database",
            Self::Broker => "broker",
        }
    }
}

impl std::fmt::Display for Dependency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the {}", self.label())
    }
}
