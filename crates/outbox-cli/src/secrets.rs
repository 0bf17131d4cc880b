//! Passwords: read from `*.password` / `*.password_file`, put into the connection URLs at
//! validation, and kept out of every log line and error message.
//!
//! Redaction where we format a URL ([`redact_url`], [`masked`]) covers our own text;
//! [`Secrets::scrub`] is the last line of defence for text we do not control — the libraries'
//! error messages and log lines (e.g. a trace line that prints the parsed broker URL).

use crate::settings::ConfigError;
use std::io;
use std::path::Path;
use std::sync::Arc;

/// The URL with any password replaced by `***`; unparsable text is not echoed at all.
pub fn redact_url(value: &str) -> String {
    if value.trim().is_empty() {
        return String::new();
    }
    match url::Url::parse(value) {
        Ok(mut parsed) => {
            if parsed.password().is_some() {
                let _ = parsed.set_password(Some("***"));
            }
            parsed.to_string()
        }
        Err(_) => "<unparsable URL>".into(),
    }
}

/// `"***"` for a set secret, `""` for an unset one.
pub fn masked(secret: &str) -> &'static str {
    if secret.is_empty() {
        ""
    } else {
        "***"
    }
}

/// `url` (validated) and its redacted form, with the password of
/// `<section>.password(_file)` put in when one is set.
pub fn with_password(
    section: &str,
    (url, redacted): (String, String),
    password: &str,
    password_file: &str,
) -> Result<(String, String), ConfigError> {
    match password_setting(section, password, password_file)? {
        None => Ok((url, redacted)),
        Some(password) => {
            let url = insert_password(section, &url, &password)?;
            let redacted = redact_url(&url);
            Ok((url, redacted))
        }
    }
}

/// The password given by `<section>.password` or `<section>.password_file`, if any.
/// Giving both is ambiguous, so it is an error; so is a file that cannot be read or holds
/// nothing (a secret that was not mounted). Errors name the key and the path, never the
/// secret.
pub fn password_setting(
    section: &str,
    password: &str,
    password_file: &str,
) -> Result<Option<String>, ConfigError> {
    let file_key = format!("{section}.password_file");
    match (password.is_empty(), password_file.trim()) {
        (true, "") => Ok(None),
        (false, "") => Ok(Some(password.to_owned())),
        (false, file) => Err(ConfigError::Invalid {
            key: file_key,
            value: file.to_owned(),
            accepted: format!(
                "either {section}.password or {section}.password_file, not both (both are set)"
            ),
        }),
        (true, file) => {
            let text = std::fs::read_to_string(file).map_err(|error| ConfigError::Invalid {
                key: file_key.clone(),
                value: file.to_owned(),
                accepted: format!("a readable file holding the password ({error})"),
            })?;
            // Secret files usually end with a newline that is not part of the password.
            let secret = text.trim_end_matches(['\r', '\n']);
            if secret.is_empty() {
                return Err(ConfigError::Invalid {
                    key: file_key,
                    value: file.to_owned(),
                    accepted: "a file holding the password; this one is empty".into(),
                });
            }
            Ok(Some(secret.to_owned()))
        }
    }
}

/// `url` (already validated) with `password` put in (percent-encoded). The URL must name
/// a user and hold no password of its own: a password in two places is ambiguous.
pub fn insert_password(section: &str, url: &str, password: &str) -> Result<String, ConfigError> {
    let url_key = format!("{section}.url");
    let invalid = |accepted: String| ConfigError::Invalid {
        key: url_key.clone(),
        value: redact_url(url),
        accepted,
    };
    let mut parsed = url::Url::parse(url).map_err(|error| invalid(format!("a URL ({error})")))?;
    if parsed.scheme() == "sqlite" {
        return Err(ConfigError::Invalid {
            key: format!("{section}.password"),
            value: "***".into(),
            accepted: "no password for sqlite:// URLs (SQLite has none); leave \
                       database.password and database.password_file empty"
                .into(),
        });
    }
    if parsed.password().is_some() {
        return Err(invalid(format!(
            "a URL without a password, since {section}.password or {section}.password_file \
             is set (give the password in one place)"
        )));
    }
    if parsed.username().is_empty() {
        return Err(invalid(format!(
            "a URL that names the user (such as {}://relay@host/…), since a password is set",
            parsed.scheme()
        )));
    }
    parsed
        .set_password(Some(password))
        .map_err(|()| invalid("a URL with a host, since a password is set".into()))?;
    Ok(parsed.into())
}

/// Reads `amqp.tls_ca_file`: CA certificates (PEM) trusted for `amqps://` besides the
/// bundled webpki roots. Empty: none. Only meaningful with `amqps://` URLs (`urls`: every
/// broker's), so a CA file next to a plain URL is an error rather than silently ignored.
pub fn tls_ca_file(urls: &[&str], file: &str) -> Result<Option<String>, ConfigError> {
    const KEY: &str = "amqp.tls_ca_file";
    let file = file.trim();
    if file.is_empty() {
        return Ok(None);
    }
    let invalid = |accepted: String| ConfigError::Invalid {
        key: KEY.into(),
        value: file.to_owned(),
        accepted,
    };
    // An unparsable URL is reported under amqp.url already.
    let plain = |url: &&str| url::Url::parse(url).is_ok_and(|parsed| parsed.scheme() != "amqps");
    if urls.iter().any(plain) {
        return Err(invalid(
            "a CA file only together with an amqps:// URL (amqp.url is plain amqp://)".into(),
        ));
    }
    let pem = std::fs::read_to_string(Path::new(file))
        .map_err(|error| invalid(format!("a readable PEM file of CA certificates ({error})")))?;
    if !pem.contains("-----BEGIN CERTIFICATE-----") {
        return Err(invalid(
            "a PEM file of CA certificates (\"-----BEGIN CERTIFICATE-----\" blocks); this one \
             holds none"
                .into(),
        ));
    }
    Ok(Some(pem))
}

/// The passwords in force, for scrubbing text we did not format ourselves.
#[derive(Clone, Default)]
pub struct Secrets {
    /// Every form a password may take in text (as given, percent-encoded as in a URL,
    /// escaped as in Debug or JSON output), longest first.
    forms: Arc<Vec<String>>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secrets({} forms)", self.forms.len())
    }
}

impl Secrets {
    /// The passwords of `urls` (none for a URL without one).
    pub fn from_urls<'a>(urls: impl IntoIterator<Item = &'a str>) -> Self {
        let mut forms = Vec::new();
        for url in urls {
            let Some(encoded) = url::Url::parse(url)
                .ok()
                .and_then(|parsed| parsed.password().map(str::to_owned))
            else {
                continue;
            };
            let raw = percent_encoding_decode(&encoded);
            let debug = format!("{raw:?}");
            let json = serde_json::to_string(&raw).unwrap_or_default();
            for form in [
                raw.clone(),
                encoded,
                debug.trim_matches('"').to_owned(),
                json.trim_matches('"').to_owned(),
            ] {
                if !form.is_empty() && !forms.contains(&form) {
                    forms.push(form);
                }
            }
        }
        // Longest first, so a form that contains another is replaced whole.
        forms.sort_by_key(|form| std::cmp::Reverse(form.len()));
        Self {
            forms: Arc::new(forms),
        }
    }

    /// `text` with every password replaced by `***`.
    pub fn scrub(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for form in self.forms.iter() {
            if text.contains(form.as_str()) {
                text = text.replace(form.as_str(), "***");
            }
        }
        text
    }

    /// A writer that scrubs what it is given before passing it to `inner`. The tracing
    /// formatter writes each event in one `write` call, so a password cannot be split
    /// across two writes.
    pub fn writer<W: io::Write>(&self, inner: W) -> ScrubbingWriter<W> {
        ScrubbingWriter {
            secrets: self.clone(),
            inner,
        }
    }
}

/// Percent-decoding as the database and AMQP URL parsers do it.
fn percent_encoding_decode(encoded: &str) -> String {
    percent_encoding::percent_decode_str(encoded)
        .decode_utf8_lossy()
        .into_owned()
}

/// See [`Secrets::writer`].
#[derive(Debug)]
pub struct ScrubbingWriter<W> {
    /// What to replace.
    secrets: Secrets,
    /// Where the scrubbed text goes.
    inner: W,
}

impl<W: io::Write> io::Write for ScrubbingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        self.inner.write_all(self.secrets.scrub(&text).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_of_a_password_is_scrubbed() {
        let secrets = Secrets::from_urls(["postgres://relay:p%40ss%22w@db/app", "sqlite://x.db"]);
        let text = "raw p@ss\"w, url p%40ss%22w, debug \"p@ss\\\"w\"";
        assert_eq!(
            secrets.scrub(text),
            "raw ***, url ***, debug \"***\"",
            "{secrets:?}"
        );
    }

    #[test]
    fn the_writer_scrubs_what_passes_through() {
        let secrets = Secrets::from_urls(["amqp://guest:hunter2@mq/%2f"]);
        let mut out = Vec::new();
        io::Write::write_all(
            &mut secrets.writer(&mut out),
            b"uri=amqp://guest:hunter2@mq\n",
        )
        .unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "uri=amqp://guest:***@mq\n");
    }

    #[test]
    fn a_redacted_url_keeps_everything_but_the_password() {
        assert_eq!(
            redact_url("postgres://relay:s3cret@db:5432/app?sslmode=require"),
            "postgres://relay:***@db:5432/app?sslmode=require"
        );
        assert_eq!(redact_url("amqp://mq/%2f"), "amqp://mq/%2f");
        assert_eq!(redact_url("//relay:s3cret@db/app"), "<unparsable URL>");
    }

    #[test]
    fn the_password_is_percent_encoded_into_the_url() {
        let url = insert_password("database", "postgres://relay@db/app", "p@ss/w:rd%").unwrap();
        let parsed = url::Url::parse(&url).unwrap();
        assert_eq!(parsed.username(), "relay");
        assert_eq!(
            percent_encoding_decode(parsed.password().unwrap()),
            "p@ss/w:rd%"
        );
        assert_eq!(parsed.host_str(), Some("db"));
    }
}
