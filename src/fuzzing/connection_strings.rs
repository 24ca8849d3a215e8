//! The connection string readers (PostgreSQL, SQL Server, Azure Storage): what they refuse or keep never shows
//! a secret.

use super::secrets::assert_no_secret;
use crate::config::Secret;

/// The PostgreSQL connection string reader: no refusal holds any part of the string (option names of libpq's
/// own list aside, which hold no distinctive character), and a string it accepts shows no password in `Debug`.
pub fn postgres_connection_string(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match crate::db::postgres::connection_string::parse("Pg", text) {
        Err(message) => {
            assert!(message.contains("app setting Pg"), "the refusal does not name the setting: {message}");
            assert_no_secret("the refusal", &message, &[text], text);
        }
        Ok(config) => {
            let password = config.get_password().map(String::from_utf8_lossy).unwrap_or_default();
            assert_no_secret("Debug of the configuration", &format!("{config:?}"), &[&password], text);
        }
    }
}

/// The SQL Server (ADO.NET) connection string reader: neither a refusal nor the `Debug` of a string it accepts
/// holds the password.
pub fn mssql_connection_string(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let pairs = crate::db::mssql::connection_string::pairs(text);
    let passwords: Vec<&str> =
        pairs.iter().filter(|(k, _)| k == "password" || k == "pwd").map(|(_, v)| v.as_str()).collect();
    match crate::db::mssql::Settings::parse("Sql", &Secret::new(text)) {
        Err(message) => {
            assert!(message.contains("app setting Sql"), "the refusal does not name the setting: {message}");
            assert_no_secret("the refusal", &message, &passwords, text);
        }
        Ok(settings) => assert_no_secret("Debug of the settings", &format!("{settings:?}"), &passwords, text),
    }
}

/// The storage connection string reader and the SAS it carries: no refusal holds a value, `Debug` holds neither
/// the account key nor the signature, and an error that quotes a request URL, once masked, holds no signature.
pub fn storage_connection_string(data: &[u8]) {
    use crate::state::blob::connection_string::{ConnectionString, KeyAuth};
    let Ok(text) = std::str::from_utf8(data) else { return };
    let values: Vec<&str> = text.split(';').filter_map(|s| s.split_once('=')).map(|(_, v)| v.trim()).collect();
    match ConnectionString::parse(&Secret::new(text)) {
        Err(e) => assert_no_secret("the refusal", &e.to_string(), &values, text),
        Ok(cs) => {
            assert!(cs.blob_endpoint.query().is_none(), "the endpoint keeps a query: {}", cs.blob_endpoint);
            let secret = match &cs.auth {
                KeyAuth::SharedKey { key, .. } => key.expose().to_string(),
                KeyAuth::Sas(sas) => sas.expose().to_string(),
            };
            assert_no_secret("Debug of the connection string", &format!("{cs:?}"), &[&secret], text);
            if let KeyAuth::Sas(sas) = &cs.auth {
                sas_is_masked(&cs.blob_endpoint, sas);
            }
        }
    }
}

/// A transport error quotes the request URL, SAS and all; masked, it keeps no signature of the base64 (or
/// percent-encoded base64) alphabet a real signature has.
fn sas_is_masked(endpoint: &azure_core::http::Url, sas: &Secret) {
    let mut url = endpoint.clone();
    url.set_query(Some(sas.expose()));
    let quoted = format!("error sending request for url ({url})");
    let masked = crate::state::blob::redact_signature(&quoted);
    for signature in url.query().unwrap_or_default().split('&').filter_map(|p| p.strip_prefix("sig=")) {
        let base64 = signature.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=' | '%'));
        // A signature the URL holds elsewhere too ("sv=2025" and "sig=2025") may show there.
        if base64 && signature.len() >= 4 && quoted.matches(signature).count() == 1 {
            assert!(!masked.contains(signature), "signature {signature:?} survives masking: {masked}");
        }
    }
}
