//! Connections to PostgreSQL, shared by the cursor source and the PostgreSQL sink so both read connection
//! strings, use TLS, explain a failed connection and classify a failed statement the same way.

mod tls;

pub use tls::PostgresTls;

use crate::config::settings::POSTGRES_ROOT_CERTIFICATE;
use crate::config::Secret;
use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod};
use std::error::Error;
use std::time::Duration;
use tls::HandshakeError;

/// A pool of at most `size` connections to the database in app setting `setting`, opening none until used.
/// Every connection goes through `tls`, so the connection string's `sslmode` decides whether TLS is used
/// (see the `tls` module for what each mode means here).
pub fn pool(setting: &str, connection: &Secret, size: usize, tls: &PostgresTls) -> Result<Pool, String> {
    let mut config: tokio_postgres::Config = connection.expose().parse().map_err(|e| unparsable(setting, &e))?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(10));
    }
    if config.get_application_name().is_none() {
        config.application_name("sql-pseudo-trigger");
    }
    let manager = Manager::from_config(config, tls.clone(), ManagerConfig { recycling_method: RecyclingMethod::Fast });
    Pool::builder(manager)
        .max_size(size)
        .wait_timeout(Some(Duration::from_secs(30)))
        .create_timeout(Some(Duration::from_secs(15)))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .map_err(|e| format!("cannot build the connection pool: {e}"))
}

/// Why a connection string does not parse. Only tokio-postgres's option-name messages are repeated (they
/// name a key, never a value), so no part of a password can reach the message.
fn unparsable(setting: &str, e: &tokio_postgres::Error) -> String {
    let cause = e.source().map(ToString::to_string).unwrap_or_default();
    let root = POSTGRES_ROOT_CERTIFICATE.name;
    match cause.as_str() {
        "invalid value for option `sslmode`" => format!(
            "app setting {setting}: sslmode must be disable, prefer or require; verify-ca and verify-full are not \
             needed, because prefer and require already verify the certificate and host name whenever TLS is used"
        ),
        "unknown option `sslrootcert`" => format!(
            "app setting {setting}: the connection string cannot carry sslrootcert; remove it and give the CA \
             certificate in app setting {root}"
        ),
        "unknown option `sslcert`" | "unknown option `sslkey`" => format!(
            "app setting {setting}: client certificates (sslcert, sslkey) are not supported; authenticate with a \
             password or an access token in the connection string"
        ),
        _ if cause.starts_with("unknown option `") || cause.starts_with("invalid value for option `") => format!(
            "app setting {setting} is not a usable PostgreSQL connection string: {cause}"
        ),
        _ => format!(
            "app setting {setting} is not a PostgreSQL connection string ({e}); use postgres://user:password@host:5432/db or key=value form"
        ),
    }
}

/// A connection that could not be opened, in words an operator can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectFailure {
    /// Retrying cannot help: what we trust, the certificate or `sslmode` must change.
    Misconfigured(String),
    /// The server may answer the next attempt (down, unreachable, overloaded, a handshake that broke off).
    Unavailable(String),
}

impl ConnectFailure {
    pub fn message(&self) -> &str {
        match self {
            Self::Misconfigured(m) | Self::Unavailable(m) => m,
        }
    }
}

/// Explains why `pool.get()` failed for the database in app setting `setting`. The text comes from our own
/// handshake errors and from tokio-postgres's error chain, which names hosts and server messages but never
/// the connection string or the password.
pub fn connect_failure(setting: &str, e: &PoolError) -> ConnectFailure {
    let prefix = format!("cannot connect to PostgreSQL (app setting {setting})");
    let PoolError::Backend(e) = e else { return ConnectFailure::Unavailable(format!("{prefix}: {e}")) };
    let causes: Vec<&(dyn Error + 'static)> = std::iter::successors(e.source(), |c| (*c).source()).collect();
    if let Some(handshake) = causes.iter().find_map(|c| c.downcast_ref::<HandshakeError>()) {
        let message = format!("{prefix}: {handshake}");
        return if handshake.needs_operator() {
            ConnectFailure::Misconfigured(message)
        } else {
            ConnectFailure::Unavailable(message)
        };
    }
    // tokio-postgres's own words when the server answers "no" to TLS under sslmode=require (its connect_tls.rs);
    // tests/postgres_tls.rs pins them, so a release that rewords them fails a test rather than this message.
    if causes.iter().any(|c| c.to_string() == "server does not support TLS") {
        return ConnectFailure::Misconfigured(format!(
            "{prefix}: the server does not support TLS, but the connection string requires it (sslmode=require); \
             turn TLS on at the server (ssl = on, with a certificate), or lower sslmode to prefer where a \
             plaintext connection is acceptable"
        ));
    }
    // Also tokio-postgres's: `hostaddr=` alone gives an address but no name to verify the certificate against.
    if causes.iter().any(|c| c.to_string() == "no hostname provided for TLS handshake") {
        return ConnectFailure::Misconfigured(format!(
            "{prefix}: the server offers TLS, but the connection string gives no host name to verify its \
             certificate against (hostaddr= alone); add host= with the name the certificate lists"
        ));
    }
    // The server refused the login: waiting does not change a password, a role or a database name.
    if let Some(db) = e.as_db_error() {
        let code = db.code().code();
        let fix = match &code[..2] {
            "28" => Some("check the user name and password in the connection string, and that the role exists and may log in (a pg_hba.conf rule may refuse it too)"),
            "3D" => Some("the database in the connection string does not exist: correct dbname, or create the database"),
            "42" if code == "42501" => Some("the role may not connect to this database: GRANT CONNECT ON DATABASE to it"),
            _ => None,
        };
        if let Some(fix) = fix {
            return ConnectFailure::Misconfigured(format!("{prefix}: {} (SQLSTATE {code}); {fix}", db.message()));
        }
    }
    let chain: Vec<String> = std::iter::once(e.to_string()).chain(causes.iter().map(ToString::to_string)).collect();
    ConnectFailure::Unavailable(format!("{prefix}: {}", chain.join(": ")))
}

/// What a failed statement's SQLSTATE says, for the source's and the sink's wording alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// No SQLSTATE (the connection broke), or a class that passes by waiting: connection exceptions (08),
    /// transaction rollbacks such as serialization failures and deadlocks (40), insufficient resources (53),
    /// operator intervention such as a shutdown or a cancelled query (57), system errors (58), and of class 55
    /// ("object not in prerequisite state") only a lock not available (55P03) or an object in use (55006); the
    /// rest of 55 (55000, a setting the statement needs) waits for an operator.
    Transient,
    /// 42501: the login lacks a privilege; the caller names the grant.
    Denied,
    /// Class 22: a value does not fit its column. The server's message quotes the value, so it is not repeated.
    BadValue,
    /// Anything else: retrying the same statement fails the same way.
    Refused,
}

/// The one SQLSTATE table of the handler (`None`: the error carries no SQLSTATE). Codes from the PostgreSQL
/// manual's appendix A, "PostgreSQL Error Codes".
pub fn classify(code: Option<&str>) -> Verdict {
    let Some(code) = code else { return Verdict::Transient };
    match code.get(..2).unwrap_or("") {
        "08" | "40" | "53" | "57" | "58" => Verdict::Transient,
        "55" if matches!(code, "55P03" | "55006") => Verdict::Transient,
        "42" if code == "42501" => Verdict::Denied,
        "22" => Verdict::BadValue,
        _ => Verdict::Refused,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_error(connection: &str) -> String {
        pool("Pg", &Secret::new(connection), 1, &PostgresTls::default()).expect_err("must not parse")
    }

    #[test]
    fn verify_full_is_refused_with_what_sslmode_means_here() {
        // GIVEN a libpq connection string with sslmode=verify-full
        // WHEN the pool is built
        let message = parse_error("host=db.example.com user=app password=Secret1 sslmode=verify-full");
        // THEN the error says which modes exist and that they verify
        assert_eq!(
            message,
            "app setting Pg: sslmode must be disable, prefer or require; verify-ca and verify-full are not needed, \
             because prefer and require already verify the certificate and host name whenever TLS is used"
        );
    }

    #[test]
    fn sslrootcert_in_the_connection_string_points_to_the_app_setting() {
        let message = parse_error("postgres://app:Secret1@db.example.com/db?sslrootcert=/certs/ca.pem");
        assert_eq!(
            message,
            "app setting Pg: the connection string cannot carry sslrootcert; remove it and give the CA certificate \
             in app setting Sql_Trigger_PostgresRootCertificate"
        );
    }

    #[test]
    fn an_unknown_option_is_named_without_the_password() {
        let message = parse_error("host=db user=app password=Secret1 sslcompression=1");
        assert_eq!(
            message,
            "app setting Pg is not a usable PostgreSQL connection string: unknown option `sslcompression`"
        );
    }

    #[test]
    fn one_sqlstate_table_decides_what_waiting_fixes() {
        for code in ["08006", "40001", "40P01", "53300", "57P01", "57014", "58030", "55P03", "55006"] {
            assert_eq!(classify(Some(code)), Verdict::Transient, "{code}");
        }
        assert_eq!(classify(None), Verdict::Transient, "a broken connection");
        assert_eq!(classify(Some("55000")), Verdict::Refused, "a setting the statement needs waits for an operator");
        assert_eq!(classify(Some("42501")), Verdict::Denied);
        assert_eq!(classify(Some("22P02")), Verdict::BadValue);
        for code in ["42P01", "42703", "23505", "XX000", "2"] {
            assert_eq!(classify(Some(code)), Verdict::Refused, "{code}");
        }
    }

    #[test]
    fn the_three_sslmodes_parse() {
        for mode in ["disable", "prefer", "require"] {
            let built =
                pool("Pg", &Secret::new(format!("host=db user=app sslmode={mode}")), 1, &PostgresTls::default());
            assert!(built.is_ok(), "sslmode={mode}: {built:?}");
        }
    }
}
