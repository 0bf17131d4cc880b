//! The URL sqlx is given: the configured one, with the relay's transport defaults.
//!
//! Plain text unless the URL asks for TLS: sqlx would otherwise negotiate TLS whenever
//! the server offers it ("prefer": 10–15% of throughput on loopback, no certificate
//! check, silent fallback to plain text). Ask for TLS with `sslmode=require` /
//! `ssl-mode=required` or stricter (docs/security.md#tls).

/// The URL to hand to sqlx for `url`: `mariadb://` becomes `mysql://` (the scheme sea-orm
/// knows), and PostgreSQL and MySQL URLs without a TLS mode get the plain-text one (see the
/// module documentation). SQLite URLs and unparsable text come back unchanged.
pub fn connection_url(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return url.to_owned();
    };
    if parsed.scheme() == "mariadb" && parsed.set_scheme("mysql").is_err() {
        return url.to_owned();
    }
    let (key, plain) = match parsed.scheme() {
        "postgres" | "postgresql" => ("sslmode", "disable"),
        "mysql" => ("ssl-mode", "disabled"),
        _ => return parsed.to_string(),
    };
    // sqlx accepts both spellings on both backends.
    let has_mode = parsed
        .query_pairs()
        .any(|(name, _)| name == "sslmode" || name == "ssl-mode");
    if !has_mode {
        parsed.query_pairs_mut().append_pair(key, plain);
    }
    parsed.to_string()
}

#[cfg(test)]
mod tests {
    use super::connection_url;

    #[test]
    fn postgres_without_a_mode_connects_in_plain_text() {
        assert_eq!(
            connection_url("postgres://relay:pw@db:5432/app"),
            "postgres://relay:pw@db:5432/app?sslmode=disable"
        );
        assert_eq!(
            connection_url("postgresql://db/app?application_name=relay"),
            "postgresql://db/app?application_name=relay&sslmode=disable"
        );
    }

    #[test]
    fn a_mode_in_the_url_is_kept() {
        for url in [
            "postgres://db/app?sslmode=require",
            "postgres://db/app?ssl-mode=verify-full&sslrootcert=/etc/ca.pem",
            "mysql://db/app?ssl-mode=required",
            "mysql://db/app?sslmode=verify_identity",
        ] {
            assert_eq!(connection_url(url), url);
        }
    }

    #[test]
    fn mysql_and_mariadb_without_a_mode_connect_in_plain_text() {
        assert_eq!(
            connection_url("mysql://root@db:3306/app"),
            "mysql://root@db:3306/app?ssl-mode=disabled"
        );
        assert_eq!(
            connection_url("mariadb://root:pw@db/app"),
            "mysql://root:pw@db/app?ssl-mode=disabled"
        );
    }

    #[test]
    fn sqlite_is_unchanged() {
        let url = "sqlite://outbox-relay.db?mode=rwc";
        assert_eq!(connection_url(url), url);
    }
}
