//! Passwords: read from `*.password` / `*.password_file`, put into the connection URLs at
//! validation, and kept out of every log line and error message.
//!
//! Redaction where we format a URL ([`redact_url`], [`masked`]) covers our own text;
//! [`Secrets::scrub`] is the last line of defence for text we do not control — the libraries'
//! error messages and log lines (e.g. a trace line that prints the parsed broker URL).
//!
//! Scrubbing masks secrets where they occur as secrets: the password of a URL's userinfo
//! (`scheme://user:***@host`, the user kept), the value of a `password=` / `pwd=` /
//! `password: "…"` pair, and the known passwords wherever they appear — but only those of
//! at least [`MIN_SCRUBBED_LEN`] characters that do not also appear in the settings' visible
//! text (a user name equal to the password, a scheme): masking every `e` of a one-letter
//! password, or every `guest` of `guest/guest`, would mangle the logs and reveal the
//! password by its pattern.

use crate::settings::ConfigError;
use std::io;
use std::path::Path;
use std::sync::Arc;

/// What a secret is replaced by.
pub const MASK: &str = "***";

/// The shortest known password that is scrubbed wherever it appears in text; a shorter
/// one is masked only where it stands as a secret (a URL's userinfo, a `password=` pair).
pub const MIN_SCRUBBED_LEN: usize = 8;

/// The URL with any password replaced by `***`. Text that does not parse as a URL is
/// shown with whatever stands where a password would (`user:…@`) masked.
pub fn redact_url(value: &str) -> String {
    if value.trim().is_empty() {
        return String::new();
    }
    // Several database hosts (`db-1:5432,db-2:5432`): masked on the first, listed again.
    if let Some(first) = outbox_store::hosts::first_host(value) {
        return outbox_store::hosts::with_hosts_of(value, &redact_url(&first));
    }
    match url::Url::parse(value) {
        Ok(mut parsed) => {
            if parsed.password().is_some() {
                let _ = parsed.set_password(Some(MASK));
            }
            parsed.to_string()
        }
        Err(_) => mask_unparsable(value),
    }
}

/// `text` (not a URL) with the part that may be a password masked: between the first `:`
/// of what precedes the last `@` (after any `//`) and that `@`. Text that does not look
/// like a URL at all (no `://`, no `@`: `host=db password=…`) is not shown.
fn mask_unparsable(text: &str) -> String {
    let Some(at) = text.rfind('@') else {
        if text.contains("://") && !text.contains(char::is_whitespace) {
            return mask_pairs(text);
        }
        return "<unparsable URL>".into();
    };
    let start = text[..at].rfind("//").map_or(0, |slashes| slashes + 2);
    match text[start..at].find(':') {
        Some(colon) => format!("{}{MASK}{}", &text[..start + colon + 1], &text[at..]),
        None => text.to_owned(),
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

/// The keys that give a password, as messages name them.
#[derive(Debug, Clone)]
pub struct PasswordKeys {
    /// The URL the password goes into (`database.url`, `amqp.url[1]`).
    pub url: String,
    /// The password (`database.password`).
    pub password: String,
    /// The file holding it (`database.password_file`).
    pub file: String,
}

impl PasswordKeys {
    /// `<section>.url`, `<section>.password` and `<section>.password_file`.
    pub fn section(section: &str) -> Self {
        Self {
            url: format!("{section}.url"),
            password: format!("{section}.password"),
            file: format!("{section}.password_file"),
        }
    }

    /// The same password keys, for the URL `url` (`database.listen_url`, `amqp.url[1]`).
    pub fn for_url(mut self, url: impl Into<String>) -> Self {
        self.url = url.into();
        self
    }
}

/// `url` (validated) and its redacted form, with the password of `keys` (`password`, or
/// the content of `password_file`) put in when one is set.
pub fn with_password(
    keys: &PasswordKeys,
    (url, redacted): (String, String),
    password: &str,
    password_file: &str,
) -> Result<(String, String), ConfigError> {
    match password_setting(keys, password, password_file)? {
        None => Ok((url, redacted)),
        Some(password) => {
            let url = insert_password(keys, &url, &password)?;
            let redacted = redact_url(&url);
            Ok((url, redacted))
        }
    }
}

/// The password given by `password` or the file `password_file`, if any. Giving both is
/// ambiguous, so it is an error; so is a file that cannot be read or holds nothing (a
/// secret that was not mounted). Errors name the key and the path, never the secret.
pub fn password_setting(
    keys: &PasswordKeys,
    password: &str,
    password_file: &str,
) -> Result<Option<String>, ConfigError> {
    let file_key = keys.file.clone();
    match (password.is_empty(), password_file.trim()) {
        (true, "") => Ok(None),
        (false, "") => Ok(Some(password.to_owned())),
        // Which variable set which key is known only where the layers are read
        // (`settings::load`), which names them.
        (false, file) => Err(ConfigError::PasswordTwice {
            password: keys.password.clone(),
            password_from: None,
            file: file_key,
            file_from: None,
            path: file.to_owned(),
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

/// What a password put into a URL has percent-encoded: all but letters, digits and
/// `-._~`, so the drivers decode it to what was given.
const PASSWORD_ENCODED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `url` (already validated) with `password` put in (percent-encoded). The URL must name
/// a user and hold no password of its own: a password in two places is ambiguous.
pub fn insert_password(
    keys: &PasswordKeys,
    url: &str,
    password: &str,
) -> Result<String, ConfigError> {
    if let Some(first) = outbox_store::hosts::first_host(url) {
        let single = insert_password(keys, &first, password)?;
        return Ok(outbox_store::hosts::with_hosts_of(url, &single));
    }
    let invalid = |accepted: String| ConfigError::Invalid {
        key: keys.url.clone(),
        value: redact_url(url),
        accepted,
    };
    let mut parsed = url::Url::parse(url).map_err(|error| invalid(format!("a URL ({error})")))?;
    if parsed.scheme() == "sqlite" {
        return Err(ConfigError::Invalid {
            key: keys.password.clone(),
            value: MASK.into(),
            accepted: format!(
                "no password for sqlite:// URLs (SQLite has none); leave {} and {} empty",
                keys.password, keys.file
            ),
        });
    }
    if parsed.password().is_some() {
        return Err(invalid(format!(
            "a URL without a password, since {} or {} is set (give the password in one place)",
            keys.password, keys.file
        )));
    }
    if parsed.username().is_empty() {
        return Err(invalid(format!(
            "a URL that names the user (such as {}://relay@host/…), since {} or {} is set",
            parsed.scheme(),
            keys.password,
            keys.file
        )));
    }
    // Everything but RFC 3986's unreserved characters encoded: the URL's own encoding
    // leaves `%` as it is, and the drivers would decode a `%41` in the password to `A`.
    let encoded = percent_encoding::utf8_percent_encode(password, PASSWORD_ENCODED);
    parsed
        .set_password(Some(&encoded.to_string()))
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
    /// Every form a long enough password may take in text (as given, percent-encoded as in
    /// a URL, escaped as in Debug or JSON output), longest first.
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
        Self::new(urls, std::iter::empty())
    }

    /// The passwords of `urls` and the secret `values` (header values, say). A password
    /// shorter than [`MIN_SCRUBBED_LEN`], or one that appears in a URL's visible parts, is
    /// masked only where it stands as a secret (see the module's doc).
    pub fn new<'a>(
        urls: impl IntoIterator<Item = &'a str>,
        values: impl IntoIterator<Item = String>,
    ) -> Self {
        let mut visible = Vec::new();
        let mut secrets = Vec::new();
        for url in urls {
            visible.push(redact_url(url));
            let single = outbox_store::hosts::first_host(url);
            if let Some(encoded) = url::Url::parse(single.as_deref().unwrap_or(url))
                .ok()
                .and_then(|parsed| parsed.password().map(str::to_owned))
            {
                secrets.push(percent_encoding_decode(&encoded));
                secrets.push(encoded);
            }
        }
        secrets.extend(values);
        let mut forms: Vec<String> = Vec::new();
        for secret in &secrets {
            let debug = format!("{secret:?}");
            let json = serde_json::to_string(secret).unwrap_or_default();
            for form in [
                secret.clone(),
                debug.trim_matches('"').to_owned(),
                json.trim_matches('"').to_owned(),
            ] {
                let long = form.chars().count() >= MIN_SCRUBBED_LEN;
                let shown = visible.iter().any(|text| text.contains(form.as_str()));
                if long && !shown && !forms.contains(&form) {
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

    /// `text` with every secret replaced by `***`: URL userinfo passwords, `password=`
    /// pairs, and the known passwords long enough to be told from other text.
    pub fn scrub(&self, text: &str) -> String {
        let mut text = mask_pairs(&mask_userinfo(text));
        for form in self.forms.iter() {
            if text.contains(form.as_str()) {
                text = text.replace(form.as_str(), MASK);
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

/// `text` with the password of every `scheme://user:password@host` masked, the user kept.
fn mask_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(found) = rest.find("://") {
        let start = found + 3;
        out.push_str(&rest[..start]);
        rest = &rest[start..];
        // The authority ends where the path, the query or the text around the URL begins;
        // its userinfo ends at the last `@` before that.
        let end = rest
            .find(|c: char| c.is_whitespace() || "/?#\"'<>`\\".contains(c))
            .unwrap_or(rest.len());
        let Some(at) = rest[..end].rfind('@') else {
            continue;
        };
        match rest[..at].find(':') {
            Some(colon) if &rest[colon + 1..at] != MASK => {
                out.push_str(&rest[..=colon]);
                out.push_str(MASK);
            }
            _ => out.push_str(&rest[..at]),
        }
        rest = &rest[at..];
    }
    out.push_str(rest);
    out
}

/// The keys whose value is a password in `key=value` or `key: value` text.
const PASSWORD_KEYS: [&str; 3] = ["password", "passwd", "pwd"];

/// `text` with the value of every `password=…`, `pwd=…` or `password: "…"` masked.
fn mask_pairs(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut from = 0;
    while let Some((key_start, key)) = PASSWORD_KEYS
        .iter()
        .filter_map(|key| lower[from..].find(key).map(|at| (from + at, *key)))
        .min()
    {
        from = key_start + key.len();
        let word_before = lower[..key_start]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric());
        if word_before {
            continue;
        }
        let Some((value_start, value_end)) = pair_value(text, from) else {
            continue;
        };
        // MySQL's "Access denied … (using password: YES)" says whether one was sent.
        let mysql_says_whether = lower[..key_start].ends_with("using ")
            && matches!(&text[value_start..value_end], "YES" | "NO");
        if &text[value_start..value_end] != MASK && value_start < value_end && !mysql_says_whether {
            out.push_str(&text[copied..value_start]);
            out.push_str(MASK);
            copied = value_end;
        }
        from = value_end.max(from);
    }
    out.push_str(&text[copied..]);
    out
}

/// Where the value of a pair whose key ends at `after_key` lies: after an optional closing
/// quote of the key, blanks, `=` or `:`, blanks; inside its quotes when quoted (`"…"`,
/// `'…'`, or `\"…\"` inside a JSON string), else up to a blank or a separator.
fn pair_value(text: &str, after_key: usize) -> Option<(usize, usize)> {
    let bytes = text.as_bytes();
    let mut at = after_key;
    let skip = |at: &mut usize, what: &[u8]| {
        while *at < bytes.len() && what.contains(&bytes[*at]) {
            *at += 1;
        }
    };
    skip(&mut at, b"\"'\\");
    skip(&mut at, b" \t");
    if at >= bytes.len() || !matches!(bytes[at], b'=' | b':') {
        return None;
    }
    at += 1;
    skip(&mut at, b" \t");
    let rest = &text[at..];
    for quote in ["\\\"", "\"", "'"] {
        if let Some(inner) = rest.strip_prefix(quote) {
            let start = at + quote.len();
            let end = find_unescaped(inner, quote).map_or(text.len(), |end| start + end);
            return Some((start, end));
        }
    }
    let end = rest
        .find(|c: char| c.is_whitespace() || "&;,)}]\"'\\".contains(c))
        .map_or(text.len(), |end| at + end);
    Some((at, end))
}

/// The offset of the first `quote` in `text` not escaped by a backslash.
fn find_unescaped(text: &str, quote: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(found) = text[from..].find(quote) {
        let at = from + found;
        if quote.starts_with('\\') || !text[..at].ends_with('\\') {
            return Some(at);
        }
        from = at + quote.len();
    }
    None
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
    fn a_database_host_list_is_masked_given_a_password_and_scrubbed() {
        let hosts = "postgres://relay:long-s3cret@db-1:5432,db-2:6432/rooms";
        assert_eq!(
            redact_url(hosts),
            "postgres://relay:***@db-1:5432,db-2:6432/rooms"
        );
        let keys = PasswordKeys::section("database");
        let url = insert_password(&keys, "postgres://relay@db-1:5432,db-2:6432/rooms", "pw")
            .expect("a password put in");
        assert_eq!(url, "postgres://relay:pw@db-1:5432,db-2:6432/rooms");
        let secrets = Secrets::from_urls([hosts]);
        assert_eq!(secrets.scrub("said long-s3cret"), "said ***");
    }

    #[test]
    fn every_form_of_a_password_is_scrubbed() {
        let secrets =
            Secrets::from_urls(["postgres://relay:p%40ss%22word@db/app", "sqlite://x.db"]);
        let text = "raw p@ss\"word, url p%40ss%22word, debug \"p@ss\\\"word\"";
        assert_eq!(
            secrets.scrub(text),
            "raw ***, url ***, debug \"***\"",
            "{secrets:?}"
        );
    }

    #[test]
    fn a_short_password_is_masked_only_where_it_stands_as_a_secret() {
        let secrets = Secrets::from_urls(["amqp://relay:e@mq/%2f"]);
        let line = "outbox-relay cannot run with these settings: amqp://relay:e@mq/%2f";
        assert_eq!(
            secrets.scrub(line),
            "outbox-relay cannot run with these settings: amqp://relay:***@mq/%2f"
        );
        assert_eq!(
            secrets.scrub("password=e pwd: \"e\""),
            "password=*** pwd: \"***\""
        );
        assert_eq!(
            secrets.scrub("Access denied for user 'relay'@'db' (using password: YES)"),
            "Access denied for user 'relay'@'db' (using password: YES)",
            "MySQL's YES/NO is no secret"
        );
    }

    #[test]
    fn a_user_named_as_the_password_keeps_its_name() {
        let secrets = Secrets::from_urls(["amqp://guest:guest@mq/%2f"]);
        assert_eq!(
            secrets.scrub("connecting to amqp://guest:guest@mq/%2f as guest"),
            "connecting to amqp://guest:***@mq/%2f as guest"
        );
        let secrets = Secrets::from_urls(["postgres://relay:postgres@db/app"]);
        assert_eq!(
            secrets.scrub("postgres://relay:postgres@db/app"),
            "postgres://relay:***@db/app",
            "a password that is also the scheme is masked as a secret only"
        );
    }

    #[test]
    fn a_long_password_is_scrubbed_from_any_text() {
        let secrets = Secrets::new(["amqp://relay:Sup3rL0ng@mq/%2f"], ["Basic dG9rZW4=".into()]);
        assert_eq!(
            secrets.scrub("auth Sup3rL0ng failed; header Basic dG9rZW4="),
            "auth *** failed; header ***"
        );
    }

    #[test]
    fn pairs_and_userinfo_of_unknown_secrets_are_masked() {
        let secrets = Secrets::default();
        assert_eq!(
            secrets.scrub("host=db password=hunter2 user=relay"),
            "host=db password=*** user=relay"
        );
        assert_eq!(
            secrets.scrub("AMQPUserInfo { username: \"guest\", password: \"g\\\"x\" }"),
            "AMQPUserInfo { username: \"guest\", password: \"***\" }"
        );
        assert_eq!(
            secrets.scrub("{\"msg\":\"x password=\\\"pw\\\" y\"}"),
            "{\"msg\":\"x password=\\\"***\\\" y\"}"
        );
        assert_eq!(
            secrets.scrub("see mysql://app:p@ss@db:3306/x and amqp://mq/%2f"),
            "see mysql://app:***@db:3306/x and amqp://mq/%2f"
        );
        assert_eq!(
            secrets.scrub("password_file = \"/run/secrets/db\" password authentication failed"),
            "password_file = \"/run/secrets/db\" password authentication failed"
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
        assert_eq!(redact_url("//relay:s3cret@db/app"), "//relay:***@db/app");
        assert_eq!(redact_url("amqp//guest:pw@mq"), "amqp//guest:***@mq");
        assert_eq!(redact_url("relay s3cret db"), "<unparsable URL>");
        assert_eq!(redact_url("host=db password=s3cret"), "<unparsable URL>");
        assert_eq!(redact_url("amqp:// mq"), "<unparsable URL>");
    }

    #[test]
    fn the_password_is_percent_encoded_into_the_url() {
        let keys = PasswordKeys::section("database");
        let url = insert_password(&keys, "postgres://relay@db/app", "p@ss/w:rd%").unwrap();
        let parsed = url::Url::parse(&url).unwrap();
        assert_eq!(parsed.username(), "relay");
        assert_eq!(
            percent_encoding_decode(parsed.password().unwrap()),
            "p@ss/w:rd%"
        );
        assert_eq!(parsed.host_str(), Some("db"));
    }
}
