//! What PostgreSQL connections trust, read from two app settings. Plain data: the connector that acts on it is
//! `db::postgres::PostgresTls`.

use super::env::Env;
use super::error::ConfigError;
use super::settings::{POSTGRES_ROOT_CERTIFICATE, POSTGRES_TRUST_SERVER_CERTIFICATE};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::RootCertStore;
use std::path::Path;

/// Where trust in a server certificate comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum PostgresTrust {
    /// The platform's roots: no setting given.
    #[default]
    Platform,
    /// The platform's roots plus the operator's CA certificates (`Sql_Trigger_PostgresRootCertificate`).
    PlatformAnd(Vec<CertificateDer<'static>>),
    /// `Sql_Trigger_PostgresTrustServerCertificate=true`: encrypt, but verify neither the certificate nor the
    /// host name; only the handshake's signatures are checked.
    AnyCertificate,
}

impl PostgresTrust {
    /// Reads `Sql_Trigger_PostgresRootCertificate` (a PEM file, relative to `app_root`, or the PEM text) and
    /// `Sql_Trigger_PostgresTrustServerCertificate`, reporting every problem with its setting.
    pub fn from_env(env: &Env, app_root: &Path) -> Result<Self, Vec<ConfigError>> {
        let mut errors = Vec::new();
        let problem = |def: &str, msg: String| ConfigError::new(format!("app setting {def}"), msg);
        let trust_any = match env.get(POSTGRES_TRUST_SERVER_CERTIFICATE.name).map(str::trim) {
            None => false,
            Some(v) if v.eq_ignore_ascii_case("true") => true,
            Some(v) if v.eq_ignore_ascii_case("false") => false,
            Some(v) => {
                errors
                    .push(problem(POSTGRES_TRUST_SERVER_CERTIFICATE.name, format!("must be true or false, got {v:?}")));
                false
            }
        };
        let roots = match env.get(POSTGRES_ROOT_CERTIFICATE.name) {
            None => None,
            Some(value) => match read_roots(value, app_root) {
                Ok(roots) => Some(roots),
                Err(e) => {
                    errors.push(problem(POSTGRES_ROOT_CERTIFICATE.name, e));
                    None
                }
            },
        };
        if trust_any && env.get(POSTGRES_ROOT_CERTIFICATE.name).is_some() {
            errors.push(problem(
                POSTGRES_TRUST_SERVER_CERTIFICATE.name,
                format!(
                    "is true, which verifies no certificate, so {} would be ignored: set only one of them",
                    POSTGRES_ROOT_CERTIFICATE.name
                ),
            ));
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        let trust = match (trust_any, roots) {
            (true, _) => Self::AnyCertificate,
            (false, Some(roots)) => Self::PlatformAnd(roots),
            (false, None) => Self::Platform,
        };
        Ok(trust)
    }
}

/// The operator's CA certificates: PEM text (it holds `-----BEGIN`), else the path of a PEM file.
fn read_roots(value: &str, app_root: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let (pem, what) = if value.contains("-----BEGIN") {
        // A PEM pasted into a one-line setting often arrives with literal `\n`s; base64 never holds `\`.
        (value.replace("\\n", "\n").into_bytes(), "the PEM text".to_string())
    } else {
        let path = app_root.join(value.trim());
        let bytes = std::fs::read(&path).map_err(|e| {
            format!(
                "cannot read {} ({e}); give the path of a PEM file (absolute, or relative to the app root) or the PEM text itself",
                path.display()
            )
        })?;
        (bytes, path.display().to_string())
    };
    let roots: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{what} is not valid PEM ({e})"))?;
    if roots.is_empty() {
        return Err(format!(
            "{what} holds no certificate (-----BEGIN CERTIFICATE-----); convert a DER file with `openssl x509 -inform der -in ca.cer -out ca.pem`"
        ));
    }
    for (i, root) in roots.iter().enumerate() {
        RootCertStore::empty()
            .add(root.clone())
            .map_err(|e| format!("certificate {} in {what} cannot be a trusted root ({e})", i + 1))?;
    }
    Ok(roots)
}
