//! TLS for PostgreSQL connections: a tokio-postgres connector over rustls that verifies the server's
//! certificate and host name, the two app settings that decide what it trusts, and handshake errors that say
//! what to change.
//!
//! What the connection string's `sslmode` means with this connector (tokio-postgres implements three modes):
//! - `disable`: plaintext; no TLS is attempted.
//! - `prefer` (the default): TLS when the server offers it, plaintext when it does not. When TLS is used the
//!   certificate **is verified**, and one that fails verification fails the connection: there is no fallback to
//!   plaintext. That is stricter than libpq, whose `prefer` and `require` encrypt without verifying anything.
//!   We verify because the password and every row cross this connection, and an unverified TLS session hands
//!   both to whoever can intercept it.
//! - `require`: TLS or no connection, verified as above (what libpq calls `verify-full`). libpq's `verify-full`
//!   and `verify-ca` are read as `require` (`connection_string`); for `verify-ca` that is stricter than libpq,
//!   which does not check the host name there.
//!
//! What is trusted: the platform's roots (so Azure Database for PostgreSQL, whose certificates chain to public
//! roots, needs nothing), plus the CA certificates in `Sql_Trigger_PostgresRootCertificate` (a self-hosted
//! server with its own CA). `Sql_Trigger_PostgresTrustServerCertificate=true` turns verification off, like
//! SQL Server's `TrustServerCertificate`; the app logs a warning at start-up when it is set.
//!
//! Why our own connector rather than the tokio-postgres-rustls crate: the tree already holds rustls,
//! tokio-rustls and rustls-platform-verifier (through reqwest and tiberius), the connector is small, and here
//! its errors can name the setting that fixes them.

use crate::config::PostgresTrust;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, DistinguishedName, SignatureScheme};
use sha2::{Digest, Sha256, Sha384, Sha512};
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

mod refusal;

pub use refusal::HandshakeError;
use refusal::{bare_name, Problem};

/// The TLS side of every PostgreSQL connection the handler opens (sources and sinks): what it trusts, and the
/// rustls configuration built from that on first use. Cloning shares one configuration.
#[derive(Clone, Default)]
pub struct PostgresTls {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    trust: PostgresTrust,
    /// Built when the first server offers TLS, not before: loading the platform's roots costs a few
    /// milliseconds and may fail (a container without CA certificates), which must not break plaintext
    /// connections (`sslmode=disable`, or `prefer` against a server without TLS). Built once per process, a
    /// failure included: roots installed later take effect at the next start.
    config: OnceLock<Result<Built, Problem>>,
}

/// The rustls configuration, and the verifier in it, which each handshake wraps in its own `Witness`.
#[derive(Clone)]
struct Built {
    config: Arc<ClientConfig>,
    verifier: Arc<dyn ServerCertVerifier>,
}

impl fmt::Debug for PostgresTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner.trust {
            PostgresTrust::Platform => f.write_str("PostgresTls(platform roots)"),
            PostgresTrust::PlatformAnd(roots) => write!(f, "PostgresTls(platform roots and {} more)", roots.len()),
            PostgresTrust::AnyCertificate => f.write_str("PostgresTls(any certificate)"),
        }
    }
}

impl PostgresTls {
    /// The connector for what the app settings say to trust (read by `config`).
    pub fn new(trust: PostgresTrust) -> Self {
        Self { inner: Arc::new(Inner { trust, config: OnceLock::new() }) }
    }

    /// What this connector trusts, as text for `db::pools`' key: two connectors that trust the same share a
    /// pool. Certificates are public; the text is hashed there, never shown.
    pub fn fingerprint(&self) -> String {
        format!("{:?}", self.inner.trust)
    }

    /// True under `Sql_Trigger_PostgresTrustServerCertificate=true`: the start-up warning's condition.
    pub fn trusts_any_certificate(&self) -> bool {
        matches!(self.inner.trust, PostgresTrust::AnyCertificate)
    }

    fn built(&self) -> Result<Built, Problem> {
        self.inner.config.get_or_init(|| build_config(&self.inner.trust)).clone()
    }

    /// True when `Sql_Trigger_PostgresRootCertificate` gave roots: an untrusted certificate then says that
    /// none of them signed it.
    fn roots_given(&self) -> bool {
        matches!(self.inner.trust, PostgresTrust::PlatformAnd(_))
    }
}

/// Why the platform verifier: it is what reqwest (the state store's client) uses, so PostgreSQL trusts what the
/// rest of the process trusts. On Linux it reads the system's store (`/etc/ssl/certs`, or `SSL_CERT_FILE`) and
/// verifies with webpki, exactly as `rustls-native-certs` would; on Windows and macOS it asks the operating
/// system, which also knows roots an administrator installed and checks revocation. Extra roots are added to
/// the platform's, not substituted for them.
fn build_config(trust: &PostgresTrust) -> Result<Built, Problem> {
    // Explicitly ring, the provider main.rs installs: the tree also carries aws-lc-rs, so the process default
    // would be ambiguous wherever nobody installed one (library users, tests).
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier: Arc<dyn ServerCertVerifier> = match trust {
        PostgresTrust::Platform => Arc::new(
            rustls_platform_verifier::Verifier::new(provider.clone()).map_err(|e| Problem::NoRoots(e.to_string()))?,
        ),
        PostgresTrust::PlatformAnd(roots) => Arc::new(
            rustls_platform_verifier::Verifier::new_with_extra_roots(roots.iter().cloned(), provider.clone())
                .map_err(|e| Problem::NoRoots(e.to_string()))?,
        ),
        PostgresTrust::AnyCertificate => Arc::new(AnyCertificate(provider.clone())),
    };
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Problem::Failed(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier.clone())
        .with_no_client_auth();
    // What libpq 17 sends: PostgreSQL 17 requires it for `sslnegotiation=direct`; older servers ignore it.
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(Built { config: Arc::new(config), verifier })
}

impl<S> MakeTlsConnect<S> for PostgresTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = TlsStream<S>;
    type TlsConnect = Connect;
    type Error = HandshakeError;

    /// Never fails: tokio-postgres calls this for every connection before it knows whether the server speaks
    /// TLS at all, so every problem waits for `Connect::connect`, which runs only once the server said yes.
    fn make_tls_connect(&mut self, host: &str) -> Result<Connect, HandshakeError> {
        Ok(Connect { tls: self.clone(), host: host.to_string() })
    }
}

/// One handshake with the server `host` (the connection string's `host`, which the certificate must name).
#[derive(Debug)]
pub struct Connect {
    tls: PostgresTls,
    host: String,
}

impl<S> TlsConnect<S> for Connect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = TlsStream<S>;
    type Error = HandshakeError;
    type Future = Pin<Box<dyn Future<Output = Result<TlsStream<S>, HandshakeError>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let fail = |problem| HandshakeError { host: self.host.clone(), problem };
            let built = self.tls.built().map_err(fail)?;
            let name = ServerName::try_from(self.host.clone())
                .map_err(|e| fail(Problem::Failed(format!("{:?} is not a host name ({e})", self.host))))?;
            // A configuration of this handshake's own (a clone shares everything but the verifier), so the
            // witness notes this server's certificate and no other.
            let witness = Arc::new(Witness { verifier: built.verifier, listed: OnceLock::new() });
            let mut config = ClientConfig::clone(&built.config);
            config.dangerous().set_certificate_verifier(witness.clone());
            let stream =
                tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, stream).await.map_err(|e| {
                    fail(match Problem::from_io(e) {
                        Problem::Untrusted { .. } => Problem::Untrusted {
                            listed: witness.listed.get().cloned().unwrap_or(Listed::Unknown),
                            roots_given: self.tls.roots_given(),
                        },
                        other => other,
                    })
                })?;
            Ok(TlsStream(stream))
        })
    }
}

/// An established TLS session with the server.
#[derive(Debug)]
pub struct TlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for TlsStream<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for TlsStream<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream<S> {
    /// The `tls-server-end-point` hash, for a client that runs SCRAM itself (the logical source's replication
    /// connection): what `channel_binding` below wraps.
    pub fn server_end_point(&self) -> Option<Vec<u8>> {
        let (_, session) = self.0.get_ref();
        session.peer_certificates().and_then(<[_]>::first).and_then(|cert| tls_server_end_point(cert))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for TlsStream<S> {
    /// `tls-server-end-point` (RFC 5929), so SCRAM authentication is bound to this TLS session
    /// (SCRAM-SHA-256-PLUS) and `channel_binding=require` works: a password exchange relayed through a
    /// man in the middle then fails, which matters most when certificates are not verified.
    fn channel_binding(&self) -> ChannelBinding {
        let (_, session) = self.0.get_ref();
        match session.peer_certificates().and_then(<[_]>::first).and_then(|cert| tls_server_end_point(cert)) {
            Some(hash) => ChannelBinding::tls_server_end_point(hash),
            None => ChannelBinding::none(),
        }
    }
}

/// The hash of the server's certificate with the hash function of its signature (MD5 and SHA-1 become
/// SHA-256), as RFC 5929 and PostgreSQL define it. `None` for signatures without one obvious hash (RSA-PSS,
/// Ed25519): authentication then uses plain SCRAM-SHA-256, as PostgreSQL's own client would.
fn tls_server_end_point(cert: &[u8]) -> Option<Vec<u8>> {
    const RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01]; // 1.2.840.113549.1.1
    const ECDSA_SHA1: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x01]; // 1.2.840.10045.4.1
    const ECDSA_SHA2: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03]; // 1.2.840.10045.4.3
    let oid = signature_algorithm(cert)?;
    let (family, last) = oid.split_last().map(|(last, family)| (family, *last))?;
    match (family, last) {
        // md5, sha1 and sha256 with RSA; ecdsa with SHA-1 and SHA-256.
        (RSA, 4 | 5 | 11) | (ECDSA_SHA2, 2) => Some(Sha256::digest(cert).to_vec()),
        _ if oid == ECDSA_SHA1 => Some(Sha256::digest(cert).to_vec()),
        (RSA, 12) | (ECDSA_SHA2, 3) => Some(Sha384::digest(cert).to_vec()),
        (RSA, 13) | (ECDSA_SHA2, 4) => Some(Sha512::digest(cert).to_vec()),
        _ => None,
    }
}

/// The OID of `Certificate.signatureAlgorithm`: `SEQUENCE { tbsCertificate SEQUENCE, signatureAlgorithm
/// SEQUENCE { OID, ... }, signature BIT STRING }`. A walk over three DER headers, rather than an X.509 crate.
fn signature_algorithm(cert: &[u8]) -> Option<&[u8]> {
    let (0x30, certificate, _) = der(cert)? else { return None };
    let (0x30, _tbs, rest) = der(certificate)? else { return None };
    let (0x30, algorithm, _) = der(rest)? else { return None };
    let (0x06, oid, _) = der(algorithm)? else { return None };
    Some(oid)
}

/// One DER element at the start of `bytes`: `(tag, contents, what follows)`.
fn der(bytes: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = bytes.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        (rest[..n].iter().fold(0usize, |len, b| len << 8 | usize::from(*b)), &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// The verifier of one handshake: the shared one, noting what an untrusted certificate lists. rustls reports an
/// unknown issuer without the certificate, and the way out depends on its names: trusting the CA of a
/// certificate that does not list the host name only trades one refusal for another.
#[derive(Debug)]
struct Witness {
    verifier: Arc<dyn ServerCertVerifier>,
    listed: OnceLock<Listed>,
}

impl ServerCertVerifier for Witness {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verdict = self.verifier.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now);
        if let Err(rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer)) = &verdict {
            // Set once: a handshake verifies one certificate.
            let _ = self.listed.set(Listed::of(end_entity, server_name));
        }
        verdict
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verifier.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verifier.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.verifier.supported_verify_schemes()
    }

    fn requires_raw_public_keys(&self) -> bool {
        self.verifier.requires_raw_public_keys()
    }

    fn root_hint_subjects(&self) -> Option<&[DistinguishedName]> {
        self.verifier.root_hint_subjects()
    }
}

/// Whether a certificate lists the host name of the connection string, in its subjectAltName (the only place
/// a verifier looks; the common name is not used).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Listed {
    /// It lists the host name: trusting its CA is all it takes.
    Host,
    /// It lists these names and addresses instead; none when it has no subjectAltName.
    Others(Vec<String>),
    /// The certificate could not be read.
    Unknown,
}

impl Listed {
    /// Asks webpki, through rustls, whether `cert` is valid for `name`: its refusal lists the names there are.
    fn of(cert: &CertificateDer<'_>, name: &ServerName<'_>) -> Self {
        let Ok(parsed) = ParsedCertificate::try_from(cert) else { return Self::Unknown };
        match rustls::client::verify_server_name(&parsed, name) {
            Ok(()) => Self::Host,
            Err(rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext { presented, .. })) => {
                Self::Others(presented.iter().map(|name| bare_name(name)).collect())
            }
            Err(rustls::Error::InvalidCertificate(CertificateError::NotValidForName)) => Self::Others(Vec::new()),
            Err(_) => Self::Unknown,
        }
    }
}

/// `Sql_Trigger_PostgresTrustServerCertificate=true`: any certificate for any name, but the handshake's
/// signatures are still checked (the session is still encrypted to whoever presented that certificate).
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests;
