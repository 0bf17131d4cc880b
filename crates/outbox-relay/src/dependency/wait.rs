//! [`Wait`]: trying to reach a dependency again, with backoff, while the failure is one a
//! retry can fix ([`classify`]).

use super::classify::{classify, Verdict};
use super::Dependency;
use outbox_core::Backoff;
use std::future::Future;
use std::time::Duration;
use thiserror::Error;
use tokio::time::Instant;
use tracing::{info, warn};

/// How long a command waits for its dependencies at start.
#[derive(Debug, Clone, Copy)]
pub enum Patience {
    /// One try: the one-shot commands, and `migrate --wait 0s`.
    None,
    /// Until the deadline, counted from when the first wait began.
    Until {
        /// When to give up.
        deadline: Instant,
        /// The bound, as the message names it.
        bound: Duration,
        /// Where the bound is set: `relay.startup_timeout`, `migrate --wait`.
        setting: &'static str,
    },
    /// As long as it takes (`relay.startup_timeout` unset).
    Forever,
}

impl Patience {
    /// Waits at most `bound` from now (`setting` names where it is set); `None`: forever.
    pub fn from_now(bound: Option<Duration>, setting: &'static str) -> Self {
        match bound {
            None => Self::Forever,
            Some(bound) => Self::Until {
                deadline: Instant::now() + bound,
                bound,
                setting,
            },
        }
    }
}

/// The wait ran out of time: exit code 1.
#[derive(Debug, Error)]
#[error(
    "gave up waiting for {dependency} at {url}: not usable within {} ({setting}); last error: {last}",
    humantime::format_duration(*bound)
)]
pub struct StartupTimeout {
    /// What was waited for.
    pub dependency: Dependency,
    /// Where, password masked.
    pub url: String,
    /// The bound.
    pub bound: Duration,
    /// Where the bound is set.
    pub setting: &'static str,
    /// The last failure, or that the last try did not finish.
    pub last: String,
}

/// Waiting for one dependency.
pub struct Wait<'a> {
    /// What is waited for.
    pub dependency: Dependency,
    /// Where, password masked, for the log lines.
    pub url: &'a str,
    /// The steps between tries: the relay's own for reconnecting to this dependency.
    pub backoff: Backoff,
    /// How long to keep trying.
    pub patience: Patience,
}

impl Wait<'_> {
    /// Runs `attempt` until it succeeds. A failure a retry can fix is logged (one `warn`
    /// line: the dependency, the URL, the reason, the next delay) and tried again after the
    /// backoff's next delay; any other failure comes back at once as it is (the binary
    /// gives exit code 2 to those [`classify`] calls [`Verdict::Refused`], 1 to the rest);
    /// past the deadline, a [`StartupTimeout`] (exit code 1).
    pub async fn until_up<T, F, Fut>(mut self, mut attempt: F) -> anyhow::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = anyhow::Result<T>>,
    {
        let mut tries = 0u32;
        let mut last: Option<String> = None;
        loop {
            tries += 1;
            let result = match self.patience {
                Patience::Until { deadline, .. } => {
                    match tokio::time::timeout_at(deadline, attempt()).await {
                        Ok(result) => result,
                        Err(_) => return Err(self.gave_up(last).into()),
                    }
                }
                Patience::None | Patience::Forever => attempt().await,
            };
            let error = match result {
                Ok(up) => {
                    if tries > 1 {
                        info!(
                            dependency = self.dependency.label(),
                            url = %self.url,
                            tries,
                            "{} is usable; starting", self.dependency
                        );
                    }
                    return Ok(up);
                }
                Err(error) => error,
            };
            let reason = match (classify(&error), self.patience) {
                (Verdict::Transient(reason), Patience::Until { .. } | Patience::Forever) => reason,
                _ => return Err(error),
            };
            let delay = self.backoff.next_delay();
            warn!(
                dependency = self.dependency.label(),
                url = %self.url,
                %reason,
                retry_in = %humantime::format_duration(round_to_ms(delay)),
                "{} is not usable yet; trying again", self.dependency
            );
            last = Some(format!("{error:#}"));
            match self.patience {
                Patience::Until { deadline, .. } if Instant::now() + delay >= deadline => {
                    tokio::time::sleep_until(deadline).await;
                    // One last try at the deadline would race it: give up now.
                    return Err(self.gave_up(last).into());
                }
                _ => tokio::time::sleep(delay).await,
            }
        }
    }

    fn gave_up(&self, last: Option<String>) -> StartupTimeout {
        let Patience::Until { bound, setting, .. } = self.patience else {
            unreachable!("only a bounded wait gives up");
        };
        StartupTimeout {
            dependency: self.dependency,
            url: self.url.to_owned(),
            bound,
            setting,
            last: last.unwrap_or_else(|| "the first try did not finish".into()),
        }
    }
}

/// `delay` to whole milliseconds, for a log line that reads `retry_in=1s 230ms`.
fn round_to_ms(delay: Duration) -> Duration {
    Duration::from_millis(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::io;

    const FAST: Backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(4));

    fn wait(patience: Patience) -> Wait<'static> {
        Wait {
            dependency: Dependency::Database,
            url: "postgres://relay:***@db/app",
            backoff: FAST,
            patience,
        }
    }

    fn refused() -> anyhow::Error {
        anyhow::Error::new(io::Error::from(io::ErrorKind::ConnectionRefused))
            .context("cannot connect to the database at postgres://relay:***@db/app")
    }

    #[actix_rt::test]
    async fn tries_again_while_refused_and_returns_what_the_first_success_gives() {
        let tries = Cell::new(0);
        let up = wait(Patience::Forever)
            .until_up(|| {
                tries.set(tries.get() + 1);
                let n = tries.get();
                async move {
                    if n < 4 {
                        Err(refused())
                    } else {
                        Ok(n)
                    }
                }
            })
            .await
            .unwrap();
        assert_eq!(up, 4);
    }

    #[actix_rt::test]
    async fn a_refusal_of_the_settings_comes_back_at_once() {
        let tries = Cell::new(0);
        let error = wait(Patience::Forever)
            .until_up(|| {
                tries.set(tries.get() + 1);
                async { Err::<(), _>(anyhow::Error::new(outbox_store::Error::InvalidUrl)) }
            })
            .await
            .unwrap_err();
        assert_eq!(tries.get(), 1);
        assert_eq!(classify(&error), Verdict::Refused, "{error:#}");
    }

    #[actix_rt::test]
    async fn a_fatal_error_or_no_patience_returns_the_error_at_once() {
        let error = wait(Patience::Forever)
            .until_up(|| async { Err::<(), _>(anyhow::anyhow!("a bug")) })
            .await
            .unwrap_err();
        assert_eq!(error.to_string(), "a bug");
        let tries = Cell::new(0);
        let error = wait(Patience::None)
            .until_up(|| {
                tries.set(tries.get() + 1);
                async { Err::<(), _>(refused()) }
            })
            .await
            .unwrap_err();
        assert_eq!(tries.get(), 1, "one-shot: one try");
        assert!(error.to_string().contains("cannot connect"), "{error:#}");
    }

    #[actix_rt::test]
    async fn the_bound_ends_the_wait_naming_the_setting_and_the_last_reason() {
        let started = Instant::now();
        let patience = Patience::from_now(Some(Duration::from_millis(50)), "relay.startup_timeout");
        let error = wait(patience)
            .until_up(|| async { Err::<(), _>(refused()) })
            .await
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(2));
        let timeout = error.downcast_ref::<StartupTimeout>().expect("a timeout");
        let text = timeout.to_string();
        assert!(
            text.contains("relay.startup_timeout")
                && text.contains("postgres://relay:***@db/app")
                && text.contains("refused"),
            "{text}"
        );
        // A try that hangs is cut off at the deadline too.
        let patience = Patience::from_now(Some(Duration::from_millis(50)), "migrate --wait");
        let error = wait(patience)
            .until_up(std::future::pending::<anyhow::Result<()>>)
            .await
            .unwrap_err();
        assert!(error.is::<StartupTimeout>(), "{error:#}");
    }
}
