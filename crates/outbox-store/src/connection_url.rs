//! The URL sqlx is given: the configured one, with the relay's transport defaults.
//!
//! TLS as libpq decides it, never weaker: a mode in the URL (`sslmode=`, `ssl-mode=`)
//! wins, then `PGSSLMODE` (PostgreSQL; sqlx reads it, with `PGSSLROOTCERT`, `PGSSLCERT`
//! and `PGSSLKEY`), then the drivers' own default, "prefer" (TLS whenever the server
//! offers it). One exception: to a loopback host or a Unix socket, where TLS protects
//! nothing, the relay connects in plain text unless the URL or `PGSSLMODE` asks for TLS
//! (docs/security.md#tls).

/// The values of `PGSSLMODE` (and `sslmode=`) that libpq takes.
pub const PG_SSL_MODES: [&str; 6] = [
    "disable",
    "allow",
    "prefer",
    "require",
    "verify-ca",
    "verify-full",
];

/// The URL to hand to sqlx for `url`: `mariadb://` becomes `mysql://` (the scheme sea-orm
/// knows), and a PostgreSQL or MySQL URL to a loopback host without a TLS mode (and, for
/// PostgreSQL, with no `PGSSLMODE` in the environment) gets the plain-text one (see the
/// module documentation). SQLite URLs and unparsable text come back unchanged.
pub fn connection_url(url: &str) -> String {
    let pg_ssl_mode = std::env::var("PGSSLMODE").ok();
    connection_url_with(url, pg_ssl_mode.as_deref())
}

/// [`connection_url`] with `PGSSLMODE` given rather than read.
pub fn connection_url_with(url: &str, pg_ssl_mode: Option<&str>) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return url.to_owned();
    };
    if parsed.scheme() == "mariadb" && parsed.set_scheme("mysql").is_err() {
        return url.to_owned();
    }
    let (key, plain) = match parsed.scheme() {
        // libpq's environment: sqlx applies it under the URL's own parameters.
        "postgres" | "postgresql" if pg_ssl_mode.is_some_and(|mode| !mode.is_empty()) => {
            return parsed.to_string()
        }
        "postgres" | "postgresql" => ("sslmode", "disable"),
        "mysql" => ("ssl-mode", "disabled"),
        _ => return parsed.to_string(),
    };
    // sqlx accepts both spellings on both backends.
    let has_mode = parsed
        .query_pairs()
        .any(|(name, _)| name == "sslmode" || name == "ssl-mode");
    if !has_mode && is_local(&parsed) {
        parsed.query_pairs_mut().append_pair(key, plain);
    }
    parsed.to_string()
}

/// Whether `url` (any scheme) reaches its server over loopback or a Unix socket: no
/// host, `localhost`, `127.0.0.0/8`, `::1`, a socket path as the host, or a `host=` /
/// `socket=` parameter naming a path.
pub fn is_local(url: &url::Url) -> bool {
    let by_parameter = url
        .query_pairs()
        .any(|(name, value)| (name == "host" || name == "socket") && value.starts_with('/'));
    if by_parameter {
        return true;
    }
    match url.host() {
        None => true,
        // A URL of a scheme the URL standard does not know (`postgres`, `mysql`, `amqp`)
        // keeps its host as text, addresses included.
        Some(url::Host::Domain(name)) => {
            let name = name.to_ascii_lowercase();
            let address = name.trim_start_matches('[').trim_end_matches(']');
            name.is_empty()
                || name == "localhost"
                || name.ends_with(".localhost")
                || name.starts_with("%2f")
                || name.starts_with('/')
                || address
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|address| address.is_loopback())
        }
        Some(url::Host::Ipv4(address)) => address.is_loopback(),
        Some(url::Host::Ipv6(address)) => address.is_loopback(),
    }
}

#[cfg(test)]
mod tests {
    use super::{connection_url_with, is_local};

    fn url(text: &str) -> String {
        connection_url_with(text, None)
    }

    #[test]
    fn loopback_without_a_mode_connects_in_plain_text() {
        assert_eq!(
            url("postgres://relay:pw@127.0.0.1:5432/app"),
            "postgres://relay:pw@127.0.0.1:5432/app?sslmode=disable"
        );
        assert_eq!(
            url("postgresql://localhost/app?application_name=relay"),
            "postgresql://localhost/app?application_name=relay&sslmode=disable"
        );
        assert_eq!(
            url("postgres://[::1]/app"),
            "postgres://[::1]/app?sslmode=disable"
        );
        assert_eq!(
            url("postgres://%2Fvar%2Frun%2Fpostgresql/app"),
            "postgres://%2Fvar%2Frun%2Fpostgresql/app?sslmode=disable"
        );
    }

    #[test]
    fn another_host_without_a_mode_keeps_the_drivers_default() {
        for text in [
            "postgres://relay:pw@db:5432/app",
            "postgres://10.0.0.7/app",
            "mysql://root@db.internal:3306/app",
        ] {
            assert_eq!(url(text), text, "prefer, as libpq and sqlx");
        }
    }

    #[test]
    fn pgsslmode_in_the_environment_is_never_lowered() {
        for mode in ["require", "verify-full", "disable", "prefer"] {
            assert_eq!(
                connection_url_with("postgres://127.0.0.1/app", Some(mode)),
                "postgres://127.0.0.1/app",
                "sqlx reads PGSSLMODE={mode} itself"
            );
        }
        assert_eq!(
            connection_url_with("postgres://127.0.0.1/app", Some("")),
            "postgres://127.0.0.1/app?sslmode=disable",
            "an empty PGSSLMODE is unset, as for libpq"
        );
        assert_eq!(
            connection_url_with("mysql://127.0.0.1/app", Some("require")),
            "mysql://127.0.0.1/app?ssl-mode=disabled",
            "PGSSLMODE is PostgreSQL's"
        );
    }

    #[test]
    fn a_mode_in_the_url_is_kept() {
        for text in [
            "postgres://127.0.0.1/app?sslmode=require",
            "postgres://db/app?ssl-mode=verify-full&sslrootcert=/etc/ca.pem",
            "mysql://localhost/app?ssl-mode=required",
            "mysql://db/app?sslmode=verify_identity",
        ] {
            assert_eq!(url(text), text);
        }
    }

    #[test]
    fn mysql_and_mariadb_on_loopback_connect_in_plain_text() {
        assert_eq!(
            url("mysql://root@127.0.0.1:3306/app"),
            "mysql://root@127.0.0.1:3306/app?ssl-mode=disabled"
        );
        assert_eq!(
            url("mariadb://root:pw@localhost/app"),
            "mysql://root:pw@localhost/app?ssl-mode=disabled"
        );
        assert_eq!(url("mariadb://root:pw@db/app"), "mysql://root:pw@db/app");
    }

    #[test]
    fn sqlite_is_unchanged() {
        let text = "sqlite://outbox-relay.db?mode=rwc";
        assert_eq!(url(text), text);
    }

    #[test]
    fn what_counts_as_local() {
        for text in [
            "postgres://127.0.0.2/app",
            "postgres://LOCALHOST/app",
            "postgres:///app?host=/run/postgresql",
            "mysql://root@localhost/app?socket=/run/mysqld/mysqld.sock",
            "amqp://[::1]:5672/%2f",
        ] {
            assert!(is_local(&url::Url::parse(text).unwrap()), "{text}");
        }
        for text in [
            "postgres://db/app",
            "postgres://10.1.2.3/app",
            "amqp://mq-1:5672/%2f",
            "postgres://localhost.example.com/app",
        ] {
            assert!(!is_local(&url::Url::parse(text).unwrap()), "{text}");
        }
    }
}
