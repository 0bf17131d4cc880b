//! One typed setting as written: a duration, a choice or an address.

use serde::de::value::StrDeserializer;
use serde::de::{self, DeserializeOwned, Expected, Unexpected};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::time::Duration;

/// A setting as the file or the environment spells it, and what serde makes of it.
///
/// A plain typed field would end the load at its first bad value; this one keeps the text
/// and why it does not parse, so validation reports every bad value at once, with its key.
/// It serialises back to the text, so `check-config` prints what was written.
#[derive(Clone)]
pub struct Field<T> {
    /// As written.
    text: String,
    /// The trimmed text through `T`'s `Deserialize`, or what would have been accepted.
    parsed: Result<T, String>,
    /// Written as a bare number or boolean rather than as text (`lease = 30`), so that a
    /// message shows it as written.
    bare: bool,
}

impl<T: DeserializeOwned> Field<T> {
    /// Parses `text`; blanks around it are ignored.
    pub fn new(text: impl Into<String>) -> Self {
        let text = text.into();
        let parsed = T::deserialize(StrDeserializer::<Accepted>::new(text.trim()))
            .map_err(|Accepted(accepted)| accepted);
        Self {
            text,
            parsed,
            bare: false,
        }
    }
}

impl<T> Field<T> {
    /// The text as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Nothing but blanks was written (several settings give that a meaning of its own).
    pub fn is_blank(&self) -> bool {
        self.text.trim().is_empty()
    }

    /// Written as a bare number or boolean (`lease = 30`) rather than as text.
    pub fn is_bare(&self) -> bool {
        self.bare
    }

    /// The value, or what would have been accepted, in serde's words (an enum's variants).
    pub fn parsed(&self) -> Result<&T, &str> {
        self.parsed.as_ref().map_err(String::as_str)
    }
}

impl<T: DeserializeOwned> From<&str> for Field<T> {
    fn from(text: &str) -> Self {
        Self::new(text)
    }
}

impl<T: DeserializeOwned> From<String> for Field<T> {
    fn from(text: String) -> Self {
        Self::new(text)
    }
}

impl<T> fmt::Debug for Field<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.text, f)
    }
}

impl<T> Serialize for Field<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Field<T> {
    /// Any text, number or boolean is kept (a bad one is reported by validation, with the
    /// others); only a table or a list fails here.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Scalar(std::marker::PhantomData))
    }
}

/// Reads a [`Field`] from any scalar.
struct Scalar<T>(std::marker::PhantomData<T>);

impl<T: DeserializeOwned> Scalar<T> {
    fn bare<E>(text: String) -> Result<Field<T>, E> {
        Ok(Field {
            bare: true,
            ..Field::new(text)
        })
    }
}

impl<T: DeserializeOwned> de::Visitor<'_> for Scalar<T> {
    type Value = Field<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
        Ok(Field::new(text))
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Self::Value, E> {
        Self::bare(value.to_string())
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Self::Value, E> {
        Self::bare(value.to_string())
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Self::Value, E> {
        Self::bare(value.to_string())
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Self::Value, E> {
        Self::bare(value.to_string())
    }
}

/// A duration as settings spell it, through humantime: "250ms", "3s", "5m", "7d".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Span(#[serde(with = "humantime_serde")] pub Duration);

/// serde's complaint about a value, phrased as what would have been accepted.
#[derive(Debug)]
struct Accepted(String);

impl fmt::Display for Accepted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Accepted {}

impl de::Error for Accepted {
    fn custom<M: fmt::Display>(message: M) -> Self {
        Self(message.to_string())
    }

    fn invalid_value(_: Unexpected<'_>, expected: &dyn Expected) -> Self {
        Self(expected.to_string())
    }

    fn unknown_variant(_: &str, expected: &'static [&'static str]) -> Self {
        let mut quoted: Vec<String> = expected.iter().map(|name| format!("{name:?}")).collect();
        let last = quoted.pop().unwrap_or_default();
        if quoted.is_empty() {
            Self(last)
        } else {
            Self(format!("one of {} or {last}", quoted.join(", ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::{Ordering, RetryStrategy};
    use std::net::SocketAddr;

    #[test]
    fn a_value_that_parses_keeps_its_text() {
        let field = Field::<Span>::new(" 7d ");
        assert_eq!(field.parsed(), Ok(&Span(Duration::from_secs(7 * 86_400))));
        assert_eq!(field.text(), " 7d ", "the text as written, not \"7days\"");
        assert_eq!(format!("{field:?}"), "\" 7d \"");
        let listen = Field::<SocketAddr>::from("127.0.0.1:9187");
        assert_eq!(listen.parsed().map(SocketAddr::port), Ok(9187));
    }

    #[test]
    fn a_bad_choice_lists_the_accepted_spellings() {
        let field = Field::<RetryStrategy>::new("linear");
        assert_eq!(
            field.parsed(),
            Err("one of \"fixed_interval\" or \"exponential\"")
        );
        assert_eq!(field.text(), "linear");
        let field = Field::<Ordering>::new("");
        assert!(field.is_blank());
        assert_eq!(field.parsed(), Err("one of \"per_room\" or \"none\""));
    }

    #[test]
    fn a_bad_duration_says_a_duration_is_expected() {
        assert_eq!(Field::<Span>::new("soon").parsed(), Err("a duration"));
    }

    #[test]
    fn it_reads_and_writes_as_the_bare_text() {
        #[derive(Deserialize, Serialize)]
        struct File {
            every: Field<Span>,
        }
        let file: File = toml::from_str("every = \"soon\"").unwrap();
        assert_eq!(file.every.parsed(), Err("a duration"), "kept, not an error");
        assert!(!file.every.is_bare());
        assert_eq!(toml::to_string(&file).unwrap(), "every = \"soon\"\n");
        let file: File = toml::from_str("every = 5").unwrap();
        assert_eq!(file.every.parsed(), Err("a duration"), "kept, not an error");
        assert!(file.every.is_bare() && file.every.text() == "5");
        let error = toml::from_str::<File>("every = [5]").err().unwrap();
        assert!(error.to_string().contains("string"), "{error}");
    }
}
