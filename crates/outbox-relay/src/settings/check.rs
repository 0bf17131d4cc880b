//! The bookkeeping of validation: every error and warning recorded, keys named in full,
//! and the one place that decides what an unset (zero) value becomes.

use super::field::{Field, Span};
use super::ConfigError;
use std::time::Duration;

/// What a duration setting accepts.
const DURATION: &str = "a duration such as \"30s\", \"250ms\" or \"5m\"";

/// The longest duration a setting takes: 1,000 years (`"1000y"`). A longer one is a slip,
/// and no deadline the relay can keep: a lease that long ends past the last timestamp the
/// databases (and chrono) hold.
pub(super) const MAX_DURATION: Duration = Duration::from_secs(1_000 * 31_557_600);

/// What validation has found so far.
#[derive(Default)]
pub(super) struct Report {
    /// Every value that cannot be used.
    pub(super) errors: Vec<ConfigError>,
    /// Every value replaced by its default.
    pub(super) warnings: Vec<String>,
}

impl Report {
    pub(super) fn section(&mut self, name: &'static str) -> Section<'_> {
        Section { name, report: self }
    }
}

/// The checks of one `[section]`, which name their keys `section.key`. Each returns `None`
/// when the value cannot be used, after recording why.
pub(super) struct Section<'a> {
    name: &'static str,
    report: &'a mut Report,
}

impl Section<'_> {
    /// `section.key`, as errors and warnings name it.
    pub(super) fn key(&self, key: &str) -> String {
        if self.name.is_empty() {
            return key.to_owned();
        }
        format!("{}.{key}", self.name)
    }

    /// `result`'s value, or `None` with its error recorded.
    pub(super) fn take<T>(&mut self, result: Result<T, ConfigError>) -> Option<T> {
        result.map_err(|error| self.report.errors.push(error)).ok()
    }

    /// Records that `key = value` is invalid and what would be accepted.
    pub(super) fn reject<T>(
        &mut self,
        key: &str,
        value: impl Into<String>,
        accepted: impl Into<String>,
    ) -> Option<T> {
        let error = ConfigError::Invalid {
            key: self.key(key),
            value: value.into(),
            accepted: accepted.into(),
        };
        self.take(Err(error))
    }

    /// A typed value; when it does not parse, says what is accepted: `accepted`, else
    /// serde's words (the variants of an enum).
    pub(super) fn parse<T: Clone>(
        &mut self,
        key: &str,
        field: &Field<T>,
        accepted: Option<&str>,
    ) -> Option<T> {
        match field.parsed() {
            Ok(value) => Some(value.clone()),
            Err(expected) if field.is_bare() => {
                let error = ConfigError::Mistyped {
                    key: self.key(key),
                    written: field.text().to_owned(),
                    accepted: accepted.unwrap_or(expected).to_owned(),
                };
                self.take(Err(error))
            }
            Err(expected) => self.reject(key, field.text(), accepted.unwrap_or(expected)),
        }
    }

    /// A duration of at most [`MAX_DURATION`]; blank is zero.
    pub(super) fn duration(&mut self, key: &str, field: &Field<Span>) -> Option<Duration> {
        if field.is_blank() {
            return Some(Duration::ZERO);
        }
        let Span(duration) = self.parse(key, field, Some(DURATION))?;
        self.bounded(key, field, duration)
    }

    /// `duration`, or `None` with an error when it is above [`MAX_DURATION`].
    fn bounded(&mut self, key: &str, field: &Field<Span>, duration: Duration) -> Option<Duration> {
        if duration <= MAX_DURATION {
            return Some(duration);
        }
        self.reject(
            key,
            field.text(),
            "a duration of at most 1000 years (\"1000y\")",
        )
    }

    /// A duration that blank or zero turns off (`None`; zero with a warning): `accepted`
    /// says what a bad value should be, `off` what off means.
    pub(super) fn optional_duration(
        &mut self,
        key: &str,
        field: &Field<Span>,
        accepted: &str,
        off: &str,
    ) -> Option<Option<Duration>> {
        if field.is_blank() {
            return Some(None);
        }
        let Span(duration) = self.parse(key, field, Some(accepted))?;
        let duration = self.bounded(key, field, duration)?;
        Some(self.or_default(key, Some(duration), None, &format!("\"\" ({off})")))
    }

    /// A duration whose zero (or blank) means `default`.
    pub(super) fn duration_or_default(
        &mut self,
        key: &str,
        field: &Field<Span>,
        default: &Field<Span>,
    ) -> Option<Duration> {
        let duration = self.duration(key, field)?;
        Some(self.or_default(key, duration, builtin(default).0, default.text()))
    }

    /// A size whose zero (or less) means `default`.
    pub(super) fn size(&mut self, key: &str, value: i64, default: i64) -> usize {
        let size = self.or_default(key, value, default, &default.to_string());
        usize::try_from(size).unwrap_or(usize::MAX)
    }

    /// The original worker's rule, decided here only: a size or a duration of zero is
    /// unset rather than a wish, so it takes its default, with a warning.
    pub(super) fn or_default<T: Unset>(
        &mut self,
        key: &str,
        value: T,
        default: T,
        default_text: &str,
    ) -> T {
        let Some(unset) = value.unset() else {
            return value;
        };
        let warning = format!(
            "{} is {unset}; using the default {default_text}",
            self.key(key)
        );
        self.report.warnings.push(warning);
        default
    }
}

/// A size or a duration, which zero leaves unset.
pub(super) trait Unset {
    /// How an unset value reads in a warning; `None` when the value is set.
    fn unset(&self) -> Option<String>;
}

impl Unset for i64 {
    fn unset(&self) -> Option<String> {
        (*self <= 0).then(|| self.to_string())
    }
}

impl Unset for Duration {
    fn unset(&self) -> Option<String> {
        self.is_zero().then(|| "zero".to_owned())
    }
}

impl Unset for Option<Duration> {
    fn unset(&self) -> Option<String> {
        self.and_then(|duration| duration.unset())
    }
}

/// The value of a built-in default, which always parses (see the `defaults_are_valid` test).
pub(super) fn builtin<T: Clone>(field: &Field<T>) -> T {
    field
        .parsed()
        .cloned()
        .expect("the built-in defaults parse")
}
