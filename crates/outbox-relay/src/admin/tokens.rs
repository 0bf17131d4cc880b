//! The admin API's tokens file and the tokens it holds.
//!
//! One line per token, `name:role:sha256:<64 hex>`, where the hash is the SHA-256 of the
//! token's text; `#` starts a comment line, blank lines are skipped. Only hashes are kept,
//! so the file reveals no token, and a presented token is hashed and compared with every
//! stored hash in constant time.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Reads: outboxes, dead events, one event.
    Viewer,
    /// Reads and actions (requeueing dead events).
    Operator,
}

impl Role {
    /// As the tokens file and `admin-token --role` spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        match text {
            "viewer" => Some(Role::Viewer),
            "operator" => Some(Role::Operator),
            _ => None,
        }
    }
}

/// One token of the file: its name (for audit lines), its role, and its hash.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    /// Who holds it, as audit lines name them.
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// SHA-256 of the token's text.
    hash: [u8; 32],
}

// By hand: the hash is no secret, but there is no reason to print it.
impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("name", &self.name)
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

/// Every token of the tokens file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tokens(Vec<Token>);

impl Tokens {
    /// Reads and parses the file at `path`; the error names the file (and the line).
    pub fn read(path: &str) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|error| format!("{path:?}: {error}"))?;
        Self::parse(&text).map_err(|error| format!("{path:?}: {error}"))
    }

    /// Parses the file's text; the error names the line (from 1) and what it holds wrong,
    /// never the line itself.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut tokens: Vec<Token> = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let number = index + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let token = parse_line(line).map_err(|why| format!("line {number}: {why}"))?;
            if tokens.iter().any(|other| other.name == token.name) {
                return Err(format!(
                    "line {number}: the name {:?} is given twice; each token needs its own",
                    token.name
                ));
            }
            tokens.push(token);
        }
        Ok(Self(tokens))
    }

    /// The token whose hash is the SHA-256 of `presented`, if any. Every stored hash is
    /// compared, each in constant time, so the time taken tells nothing of which matched.
    pub fn find(&self, presented: &str) -> Option<&Token> {
        let hash: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for token in &self.0 {
            if bool::from(token.hash.ct_eq(&hash)) {
                found = Some(token);
            }
        }
        found
    }

    /// How many tokens the file holds.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The file holds no token (nothing can be called).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// What a line should look like, for error messages.
const LINE_FORM: &str = "expected name:role:sha256:<64 hex digits>, role viewer or operator";

fn parse_line(line: &str) -> Result<Token, String> {
    let parts: Vec<&str> = line.split(':').collect();
    let [name, role, algorithm, hex] = parts.as_slice() else {
        return Err(format!("{} fields; {LINE_FORM}", parts.len()));
    };
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c))
    {
        return Err(format!(
            "the name must be letters, digits, '-', '_', '.' or '@'; {LINE_FORM}"
        ));
    }
    let role = Role::parse(role).ok_or_else(|| format!("unknown role; {LINE_FORM}"))?;
    if *algorithm != "sha256" {
        return Err(format!("unknown hash algorithm; {LINE_FORM}"));
    }
    let hash =
        decode_hash(hex).ok_or_else(|| format!("the hash is not 64 hex digits; {LINE_FORM}"))?;
    Ok(Token {
        name: (*name).to_owned(),
        role,
        hash,
    })
}

fn decode_hash(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut hash = [0u8; 32];
    for (index, byte) in hash.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[index * 2..index * 2 + 2], 16).ok()?;
    }
    Some(hash)
}

/// The SHA-256 of `token` in lowercase hex, as the tokens file holds it.
pub fn hash_hex(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// A new token: 32 random bytes from the operating system, in hex (64 characters).
pub fn new_token() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(std::io::Error::other)?;
    Ok(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}

/// The tokens file's line for a token.
pub fn line(name: &str, role: Role, token: &str) -> String {
    format!("{name}:{}:sha256:{}", role.as_str(), hash_hex(token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_found_by_its_hash_and_a_wrong_one_is_not() {
        let text = format!(
            "# admins\n\n{}\n{}\n",
            line("alice", Role::Operator, "secret-a"),
            line("bob", Role::Viewer, "secret-b")
        );
        let tokens = Tokens::parse(&text).unwrap();
        assert_eq!(tokens.len(), 2);
        assert_eq!(
            tokens.find("secret-a").map(|t| t.name.as_str()),
            Some("alice")
        );
        assert_eq!(tokens.find("secret-b").map(|t| t.role), Some(Role::Viewer));
        assert!(tokens.find("secret-c").is_none());
        assert!(tokens.find("").is_none());
    }

    #[test]
    fn a_malformed_line_is_named_by_its_number_without_its_text() {
        let hash = hash_hex("x");
        for (text, says) in [
            ("a:viewer:sha256".to_owned(), "3 fields"),
            (format!("# c\na:admin:sha256:{hash}"), "unknown role"),
            (format!("a:viewer:md5:{hash}"), "algorithm"),
            ("a:viewer:sha256:abc".to_owned(), "64 hex"),
            (format!(":viewer:sha256:{hash}"), "name"),
            (
                format!("a:viewer:sha256:{hash}\na:operator:sha256:{hash}"),
                "twice",
            ),
        ] {
            let error = Tokens::parse(&text).unwrap_err();
            assert!(error.contains(says), "{text}: {error}");
            let number = text.lines().count();
            assert!(error.starts_with(&format!("line {number}:")), "{error}");
            assert!(!error.contains(&hash), "{error}");
        }
    }

    #[test]
    fn a_new_token_is_64_hex_digits_and_never_the_same() {
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
