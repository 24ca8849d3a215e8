//! Connections to PostgreSQL, shared by the cursor source and the PostgreSQL sink so both read connection
//! strings, use TLS, explain a failed connection and classify a failed statement the same way.

pub(crate) mod connection_string;
pub mod session;
mod tls;

pub use tls::PostgresTls;

use super::pools::{self, DatabaseKey};
use crate::config::Secret;
use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod};
use std::error::Error;
use std::time::Duration;
use tls::HandshakeError;

/// The shared pool of the PostgreSQL database in app setting `setting`, made on first request without
/// connecting (see [`pool`]), at the process's cap (`db::pools`): every caller with the same connection string
/// and trust gets a handle of the same pool. Every caller's messages keep naming its own `setting`: the pool
/// itself names none.
pub fn shared_pool(setting: &str, connection: &Secret, tls: &PostgresTls) -> Result<Pool, String> {
    let key = DatabaseKey::of("postgres", &[connection.expose().as_bytes(), tls.fingerprint().as_bytes()]);
    // deadpool's `Pool` is a handle: the registry keeps one, and each caller gets a clone of it.
    Ok(pools::shared(key, |cap| pool(setting, connection, cap, tls))?.as_ref().clone())
}

/// A pool of at most `size` connections to the database in app setting `setting`, opening none until used.
/// The connection string is read as libpq reads it (`connection_string`); every connection goes through `tls`,
/// so its `sslmode` decides whether TLS is used (see the `tls` module for what each mode means here), and every
/// session carries the settings of the session contract ([`session`]).
pub fn pool(setting: &str, connection: &Secret, size: usize, tls: &PostgresTls) -> Result<Pool, String> {
    let mut config = connection_string::parse(setting, connection.expose())?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(10));
    }
    if config.get_application_name().is_none() {
        config.application_name("sql-pseudo-trigger");
    }
    session::pin(&mut config);
    let manager = Manager::from_config(config, tls.clone(), ManagerConfig { recycling_method: RecyclingMethod::Fast });
    Pool::builder(manager)
        .max_size(size)
        .wait_timeout(Some(Duration::from_secs(30)))
        .create_timeout(Some(Duration::from_secs(15)))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .map_err(|e| format!("cannot build the connection pool: {e}"))
}

/// The connection settings in app setting `setting`, read as [`pool`] reads them, with the session contract
/// in its options: for a client that opens its own connection (the logical source's replication stream).
pub fn config(setting: &str, connection: &Secret) -> Result<tokio_postgres::Config, String> {
    let mut config = connection_string::parse(setting, connection.expose())?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(10));
    }
    session::pin(&mut config);
    Ok(config)
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
    if let PoolError::Timeout(deadpool_postgres::TimeoutType::Wait) = e {
        return ConnectFailure::Unavailable(format!(
            "{prefix}: all {} connections of the database's pool stayed in use for 30 s; raise {} if the server has \
             room for more, or serve fewer functions or partitions per instance (docs/operations.md, \"Connections\")",
            pools::max_connections(),
            crate::config::settings::MAX_CONNECTIONS_PER_DATABASE.name
        ));
    }
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
            "{prefix}: the server does not support TLS, but the connection string requires it (sslmode=require, \
             verify-ca or verify-full); turn TLS on at the server (ssl = on, with a certificate), or lower sslmode \
             to prefer where a plaintext connection is acceptable"
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
    fn every_caller_of_one_database_shares_one_pool_of_the_cap() {
        let tls = PostgresTls::new(Default::default());
        let url = Secret::new(format!("postgres://u:pw@127.0.0.1:1/{}", uuid::Uuid::new_v4().simple()));
        let other = Secret::new(format!("postgres://u:pw@127.0.0.1:1/{}", uuid::Uuid::new_v4().simple()));
        let first = shared_pool("A", &url, &tls).expect("a pool");
        let second = shared_pool("B", &url, &tls).expect("the same pool");
        let third = shared_pool("A", &other, &tls).expect("another pool");
        // deadpool's `Pool` is a handle: one pool's handles report the same status, resized together.
        first.resize(3);
        assert_eq!((second.status().max_size, third.status().max_size), (3, pools::max_connections()));
    }
}
