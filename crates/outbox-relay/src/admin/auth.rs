//! Who may call the admin API: a bearer token of the tokens file, its role, and a bound on
//! failed attempts per client address.

use super::tokens::{Role, Token, Tokens};
use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tracing::warn;

/// Failed attempts from one address within [`WINDOW`] after which it is refused.
pub const MAX_FAILURES: u32 = 10;
/// The window failures are counted in, and how long an address is refused after.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Addresses tracked at most: past this, the oldest windows are forgotten first, so that
/// a flood of addresses cannot use up memory.
const MAX_TRACKED: usize = 10_000;

/// One address's failed attempts.
#[derive(Debug, Clone, Copy)]
struct Failures {
    /// When the current window began.
    since: Instant,
    /// Failures in it.
    count: u32,
    /// Refused until then, after too many failures.
    refused_until: Option<Instant>,
}

/// Failed attempts by client address, in memory (a restart forgets them).
#[derive(Debug, Default)]
pub struct Limiter {
    failures: Mutex<HashMap<IpAddr, Failures>>,
}

impl Limiter {
    /// `address` is refused for now.
    fn refused(&self, address: IpAddr, now: Instant) -> bool {
        let failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures
            .get(&address)
            .and_then(|entry| entry.refused_until)
            .is_some_and(|until| now < until)
    }

    /// Counts a failure of `address`.
    fn fail(&self, address: IpAddr, now: Instant) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if failures.len() >= MAX_TRACKED && !failures.contains_key(&address) {
            failures.retain(|_, entry| {
                now.duration_since(entry.since) < WINDOW
                    || entry.refused_until.is_some_and(|until| now < until)
            });
        }
        let entry = failures.entry(address).or_insert(Failures {
            since: now,
            count: 0,
            refused_until: None,
        });
        if now.duration_since(entry.since) >= WINDOW {
            *entry = Failures {
                since: now,
                count: 0,
                refused_until: entry.refused_until.filter(|until| now < *until),
            };
        }
        entry.count += 1;
        if entry.count >= MAX_FAILURES {
            entry.refused_until = Some(now + WINDOW);
        }
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// No token, or one the file does not hold: 401.
    Unauthenticated,
    /// A viewer asking for an action: 403.
    Forbidden,
    /// Too many failed attempts from the client's address: 429.
    TooManyFailures,
}

impl Refused {
    /// The answer: a JSON error, and `WWW-Authenticate: Bearer` with a 401.
    pub fn response(self) -> HttpResponse {
        match self {
            Refused::Unauthenticated => {
                let mut response = super::routes::error(
                    HttpResponse::Unauthorized(),
                    "a valid token is required: Authorization: Bearer <token>",
                );
                response.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    header::HeaderValue::from_static("Bearer"),
                );
                response
            }
            Refused::Forbidden => super::routes::error(
                HttpResponse::Forbidden(),
                "this token's role is viewer; the action needs an operator token",
            ),
            Refused::TooManyFailures => super::routes::error(
                HttpResponse::TooManyRequests(),
                "too many failed attempts from this address; try again later",
            ),
        }
    }
}

/// The caller's token if it may do what `needed` allows, else why not: no or an unknown
/// token (logged with the client's address, never what it presented), a viewer asking for
/// an action, or too many failures from its address.
pub fn authorize<'a>(
    request: &HttpRequest,
    tokens: &'a Tokens,
    limiter: &Limiter,
    needed: Role,
) -> Result<&'a Token, Refused> {
    let address = request.peer_addr().map(|address| address.ip());
    let now = Instant::now();
    if let Some(address) = address {
        if limiter.refused(address, now) {
            warn!(client = %address, "admin API: refused, too many failed attempts");
            return Err(Refused::TooManyFailures);
        }
    }
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim);
    let token = presented.and_then(|presented| tokens.find(presented));
    let Some(token) = token else {
        let client = address.map_or_else(|| "unknown".to_owned(), |a| a.to_string());
        warn!(
            %client,
            token_given = presented.is_some(),
            "admin API: authentication failed"
        );
        if let Some(address) = address {
            limiter.fail(address, now);
        }
        return Err(Refused::Unauthenticated);
    };
    if needed == Role::Operator && token.role != Role::Operator {
        return Err(Refused::Forbidden);
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_refused_after_too_many_failures_for_a_window() {
        let limiter = Limiter::default();
        let address: IpAddr = [10, 0, 0, 1].into();
        let start = Instant::now();
        for _ in 0..MAX_FAILURES - 1 {
            limiter.fail(address, start);
        }
        assert!(!limiter.refused(address, start));
        limiter.fail(address, start);
        assert!(limiter.refused(address, start));
        assert!(
            !limiter.refused([10, 0, 0, 2].into(), start),
            "others are not"
        );
        assert!(
            !limiter.refused(address, start + WINDOW),
            "for one window only"
        );
    }
}
