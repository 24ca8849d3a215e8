//! Why a TLS handshake with a PostgreSQL server did not succeed, in words that name every way out.

use super::Listed;
use crate::config::settings::{POSTGRES_ROOT_CERTIFICATE, POSTGRES_TRUST_SERVER_CERTIFICATE};
use rustls::CertificateError;
use std::fmt;
use std::io;
use std::net::IpAddr;

/// A TLS handshake with a PostgreSQL server that did not succeed: the message names the server, the problem
/// and the fix. Never holds the connection string.
#[derive(Debug, Clone)]
pub struct HandshakeError {
    pub(super) host: String,
    pub(super) problem: Problem,
}

#[derive(Debug, Clone)]
pub(super) enum Problem {
    /// The chain ends at no trusted root. `listed`: whether the certificate lists the host name;
    /// `roots_given`: whether `Sql_Trigger_PostgresRootCertificate` holds roots (none of which signed it).
    Untrusted {
        listed: Listed,
        roots_given: bool,
    },
    /// The certificate does not name the host; the names it does list.
    WrongName(Vec<String>),
    Expired,
    NotValidYet,
    Revoked,
    /// No root could be loaded at all.
    NoRoots(String),
    /// Any other certificate problem: the certificate was seen and refused.
    Rejected(String),
    /// The handshake itself failed (connection reset, protocol mismatch): possibly transient.
    Failed(String),
}

impl Problem {
    pub(super) fn from_io(e: io::Error) -> Self {
        let Some(tls) = e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) else {
            return Self::Failed(e.to_string());
        };
        let rustls::Error::InvalidCertificate(cert) = tls else { return Self::Failed(tls.to_string()) };
        match cert {
            CertificateError::UnknownIssuer => Self::Untrusted { listed: Listed::Unknown, roots_given: false },
            CertificateError::NotValidForName => Self::WrongName(Vec::new()),
            CertificateError::NotValidForNameContext { presented, .. } => {
                Self::WrongName(presented.iter().map(|name| bare_name(name)).collect())
            }
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => Self::Expired,
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => Self::NotValidYet,
            CertificateError::Revoked => Self::Revoked,
            other => Self::Rejected(rustls::Error::InvalidCertificate(other.clone()).to_string()),
        }
    }
}

/// `DnsName("db.example.com")` and `IpAddress(10.0.0.5)`, webpki's forms of the names a certificate lists, as
/// the bare names an operator would type.
pub(super) fn bare_name(name: &str) -> String {
    let dns = name.strip_prefix("DnsName(\"").and_then(|n| n.strip_suffix("\")"));
    let ip = name.strip_prefix("IpAddress(").and_then(|n| n.strip_suffix(')'));
    dns.or(ip).unwrap_or(name).to_string()
}

impl HandshakeError {
    /// True when retrying cannot help: the certificate or what we trust must change. False for a handshake
    /// that broke off, which the next attempt may complete.
    pub fn needs_operator(&self) -> bool {
        !matches!(self.problem, Problem::Failed(_))
    }
}

/// Where a self-signed certificate is on Debian and Ubuntu: the one `ssl-cert` makes at install, which their
/// PostgreSQL packages serve with `ssl = on` ("snakeoil": trusted by nobody, issued for the machine's name).
const DEBIAN_SNAKEOIL: &str = "/etc/ssl/certs/ssl-cert-snakeoil.pem";

/// How to keep dialling the same server under another name: `hostaddr=` with the address.
fn dial(host: &str) -> String {
    if host.parse::<IpAddr>().is_ok() {
        format!("hostaddr={host} keeps dialling that address")
    } else {
        "hostaddr= can give the address to dial".to_string()
    }
}

/// The ways out every refused certificate shares, after the first, which fixes the certificate or the trust.
fn other_ways_out() -> String {
    format!(
        "(2) sslmode=disable in the connection string, where plaintext is acceptable (a local server, a trusted \
         network); (3) app setting {}=true, which encrypts without verifying the certificate (for development \
         only)",
        POSTGRES_TRUST_SERVER_CERTIFICATE.name
    )
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = &self.host;
        let root = POSTGRES_ROOT_CERTIFICATE.name;
        let others = other_ways_out();
        match &self.problem {
            Problem::Untrusted { listed, roots_given } => {
                let trust = if *roots_given {
                    format!(
                        "add the certificate of the CA that signed it to app setting {root}, which holds no CA \
                         that did"
                    )
                } else {
                    format!(
                        "set app setting {root} to the certificate of the CA that signed it, a PEM file or the \
                         PEM text"
                    )
                };
                let name = match listed {
                    Listed::Host => String::new(),
                    Listed::Others(names) if names.is_empty() => format!(
                        ", and reissue it with {host} in its subjectAltName (it lists no name there; the common name \
                         is not used)"
                    ),
                    Listed::Others(names) => format!(
                        ", and connect with a host name it lists ({}) rather than {host} ({})",
                        names.join(", "),
                        dial(host)
                    ),
                    Listed::Unknown => {
                        format!(", and connect with a host name its subjectAltName lists ({})", dial(host))
                    }
                };
                write!(
                    f,
                    "the certificate of PostgreSQL server {host} is not signed by a certificate authority this \
                     handler trusts; certificates are verified whenever TLS is used, with the default sslmode=prefer \
                     too. Ways out: (1) {trust} (for a self-signed certificate, the certificate itself; Debian's and \
                     Ubuntu's is {DEBIAN_SNAKEOIL}){name}; {others}"
                )
            }
            Problem::WrongName(presented) if presented.is_empty() => write!(
                f,
                "the certificate of PostgreSQL server {host} is not valid for the name {host}: it lists no name in \
                 its subjectAltName (the common name is not used). Ways out: (1) reissue it with {host} in its \
                 subjectAltName; {others}"
            ),
            Problem::WrongName(presented) => write!(
                f,
                "the certificate of PostgreSQL server {host} is not valid for the name {host} (it is for {}). Ways \
                 out: (1) connect with a host name the certificate lists ({}), or reissue it with {host} in its \
                 subjectAltName; {others}",
                presented.join(", "),
                dial(host)
            ),
            Problem::Expired => write!(
                f,
                "the certificate of PostgreSQL server {host} has expired: renew it on the server (or check this \
                 machine's clock)"
            ),
            Problem::NotValidYet => write!(
                f,
                "the certificate of PostgreSQL server {host} is not valid yet: check this machine's clock and the \
                 certificate's start date"
            ),
            Problem::Revoked => {
                write!(
                    f,
                    "the certificate of PostgreSQL server {host} has been revoked: install a new one on the server"
                )
            }
            Problem::NoRoots(e) => write!(
                f,
                "cannot verify PostgreSQL server {host}: no trusted root certificate could be loaded ({e}); install \
                 the platform's CA certificates (ca-certificates) or set app setting {root}"
            ),
            Problem::Rejected(e) => write!(f, "the certificate of PostgreSQL server {host} was refused: {e}"),
            Problem::Failed(e) => write!(f, "the TLS handshake with PostgreSQL server {host} failed: {e}"),
        }
    }
}

impl std::error::Error for HandshakeError {}
