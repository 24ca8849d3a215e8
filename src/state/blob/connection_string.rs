//! Azure Storage connection strings, parsed into a blob endpoint and a credential.
//!
//! The SDK (azure_storage_blob 1.1) takes a URL and an Entra ID credential only, yet every Functions app is
//! configured with a connection string (`AzureWebJobsStorage`), and Azurite only speaks Shared Key. So the
//! string is parsed here, following the documented grammar: `Key=Value` pairs separated by `;`, keys
//! case-insensitive, values taken verbatim after the first `=` (account keys are base64 and end in `=`).
//! Errors name the missing or malformed key and never echo a value, since any value may be the secret.

use crate::config::Secret;
use azure_core::http::Url;
use base64::Engine as _;
use std::collections::HashMap;

/// Azurite's well-known development account (published in the Azurite and Storage emulator docs).
pub(crate) const DEV_ACCOUNT: &str = "devstoreaccount1";
pub(crate) const DEV_ACCOUNT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
const DEV_BLOB_PORT: u16 = 10000;
const DEFAULT_ENDPOINT_SUFFIX: &str = "core.windows.net";

/// How requests to the account are authorized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyAuth {
    /// `Authorization: SharedKey account:signature`, signed with the base64 account key.
    SharedKey { account: String, key: Secret },
    /// A shared access signature: a query string appended to every request URL.
    Sas(Secret),
}

/// A parsed connection string. `Debug` shows the endpoint and account, never the key or signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConnectionString {
    /// The blob service endpoint without a trailing slash or query, e.g.
    /// `http://127.0.0.1:10000/devstoreaccount1` or `https://acct.blob.core.windows.net`.
    pub blob_endpoint: Url,
    pub auth: KeyAuth,
}

/// Why a connection string was rejected. The messages name keys, never values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ConnectionStringError {
    #[error("the storage connection string is empty")]
    Empty,
    #[error("the storage connection string has a segment without '=' (expected Key=Value pairs separated by ';')")]
    Malformed,
    #[error("the storage connection string has no {0}")]
    Missing(&'static str),
    #[error("the storage connection string's {0} is not valid: {1}")]
    Invalid(&'static str, &'static str),
}

impl ConnectionString {
    pub(crate) fn parse(cs: &Secret) -> Result<Self, ConnectionStringError> {
        let pairs = pairs(cs.expose())?;
        let get = |key: &str| pairs.get(key).map(String::as_str).filter(|v| !v.is_empty());

        if get("usedevelopmentstorage").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return dev_storage(get("developmentstorageproxyuri"));
        }

        let account = get("accountname");
        let blob_endpoint = match get("blobendpoint") {
            Some(endpoint) => parse_endpoint(endpoint, "BlobEndpoint")?,
            None => {
                let account = account.ok_or(ConnectionStringError::Missing("AccountName or BlobEndpoint"))?;
                let protocol = get("defaultendpointsprotocol").unwrap_or("https");
                if !matches!(protocol, "http" | "https") {
                    return Err(ConnectionStringError::Invalid("DefaultEndpointsProtocol", "expected http or https"));
                }
                let suffix = get("endpointsuffix").unwrap_or(DEFAULT_ENDPOINT_SUFFIX);
                parse_endpoint(&format!("{protocol}://{account}.blob.{suffix}"), "AccountName or EndpointSuffix")?
            }
        };

        let auth = match (get("accountkey"), get("sharedaccesssignature")) {
            (Some(key), _) => {
                let account =
                    account.ok_or(ConnectionStringError::Missing("AccountName (required with AccountKey)"))?;
                if base64::engine::general_purpose::STANDARD.decode(key).is_err() {
                    return Err(ConnectionStringError::Invalid("AccountKey", "not base64"));
                }
                KeyAuth::SharedKey { account: account.to_string(), key: Secret::new(key) }
            }
            (None, Some(sas)) => KeyAuth::Sas(Secret::new(sas.trim_start_matches('?'))),
            (None, None) => return Err(ConnectionStringError::Missing("AccountKey or SharedAccessSignature")),
        };
        Ok(Self { blob_endpoint, auth })
    }
}

/// Splits `K=V;K=V` into lowercase keys and verbatim values. Empty segments (a trailing `;`) are allowed.
fn pairs(cs: &str) -> Result<HashMap<String, String>, ConnectionStringError> {
    if cs.trim().is_empty() {
        return Err(ConnectionStringError::Empty);
    }
    let mut out = HashMap::new();
    for segment in cs.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        let (key, value) = segment.split_once('=').ok_or(ConnectionStringError::Malformed)?;
        let key = key.trim();
        if key.is_empty() {
            return Err(ConnectionStringError::Malformed);
        }
        out.insert(key.to_ascii_lowercase(), value.trim().to_string());
    }
    Ok(out)
}

/// `UseDevelopmentStorage=true`: Azurite's blob service on port 10000 with the well-known account, or on the
/// host of `DevelopmentStorageProxyUri` when one is given.
fn dev_storage(proxy: Option<&str>) -> Result<ConnectionString, ConnectionStringError> {
    let base = match proxy {
        Some(proxy) => {
            let mut url = Url::parse(proxy)
                .map_err(|_| ConnectionStringError::Invalid("DevelopmentStorageProxyUri", "not an absolute URL"))?;
            url.set_port(Some(DEV_BLOB_PORT))
                .map_err(|_| ConnectionStringError::Invalid("DevelopmentStorageProxyUri", "cannot carry a port"))?;
            url.set_path("");
            url.set_query(None);
            url
        }
        None => Url::parse(&format!("http://127.0.0.1:{DEV_BLOB_PORT}"))
            .map_err(|_| ConnectionStringError::Invalid("UseDevelopmentStorage", "internal endpoint"))?,
    };
    let blob_endpoint = parse_endpoint(&format!("{}/{DEV_ACCOUNT}", base.as_str().trim_end_matches('/')), "")?;
    Ok(ConnectionString {
        blob_endpoint,
        auth: KeyAuth::SharedKey { account: DEV_ACCOUNT.to_string(), key: Secret::new(DEV_ACCOUNT_KEY) },
    })
}

/// Parses a blob service endpoint: absolute http(s) URL, no query, no trailing slash.
pub(crate) fn parse_endpoint(endpoint: &str, key: &'static str) -> Result<Url, ConnectionStringError> {
    let mut url =
        Url::parse(endpoint.trim()).map_err(|_| ConnectionStringError::Invalid(key, "not an absolute URL"))?;
    if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() || url.host_str().is_none() {
        return Err(ConnectionStringError::Invalid(key, "expected an http or https URL"));
    }
    url.set_query(None);
    url.set_fragment(None);
    let path = url.path().trim_end_matches('/').to_string();
    url.set_path(&path);
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<ConnectionString, ConnectionStringError> {
        ConnectionString::parse(&Secret::new(s))
    }

    #[test]
    fn development_storage_points_at_azurite_with_the_well_known_account() {
        let cs = parse("UseDevelopmentStorage=true").expect("parses");
        assert_eq!(cs.blob_endpoint.as_str(), "http://127.0.0.1:10000/devstoreaccount1");
        assert_eq!(cs.auth, KeyAuth::SharedKey { account: DEV_ACCOUNT.into(), key: Secret::new(DEV_ACCOUNT_KEY) });
    }

    #[test]
    fn development_storage_honours_the_proxy_uri() {
        let cs = parse("usedevelopmentstorage=TRUE;DevelopmentStorageProxyUri=http://myproxy").expect("parses");
        assert_eq!(cs.blob_endpoint.as_str(), "http://myproxy:10000/devstoreaccount1");
    }

    #[test]
    fn account_key_form_builds_the_public_endpoint_and_keeps_the_base64_padding() {
        let cs = parse(
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=a2V5cw==;EndpointSuffix=core.windows.net;",
        )
        .expect("parses");
        assert_eq!(cs.blob_endpoint.as_str(), "https://acct.blob.core.windows.net/");
        assert_eq!(cs.auth, KeyAuth::SharedKey { account: "acct".into(), key: Secret::new("a2V5cw==") });
    }

    #[test]
    fn keys_are_case_insensitive_and_the_suffix_and_protocol_are_honoured() {
        let cs = parse(
            "accountname=acct;ACCOUNTKEY=a2V5;endpointsuffix=core.chinacloudapi.cn;defaultendpointsprotocol=http",
        )
        .expect("parses");
        assert_eq!(cs.blob_endpoint.as_str(), "http://acct.blob.core.chinacloudapi.cn/");
    }

    #[test]
    fn an_azurite_style_blob_endpoint_wins_over_the_account_name() {
        let cs = parse(&format!(
            "DefaultEndpointsProtocol=http;AccountName={DEV_ACCOUNT};AccountKey={DEV_ACCOUNT_KEY};\
             BlobEndpoint=http://127.0.0.1:41234/{DEV_ACCOUNT}/;"
        ))
        .expect("parses");
        assert_eq!(cs.blob_endpoint.as_str(), "http://127.0.0.1:41234/devstoreaccount1");
        assert!(matches!(cs.auth, KeyAuth::SharedKey { ref account, .. } if account == DEV_ACCOUNT));
    }

    #[test]
    fn a_shared_access_signature_is_kept_without_its_question_mark() {
        let cs =
            parse("BlobEndpoint=https://acct.blob.core.windows.net;SharedAccessSignature=?sv=2025-11-05&sig=abc%3D")
                .expect("parses");
        assert_eq!(cs.auth, KeyAuth::Sas(Secret::new("sv=2025-11-05&sig=abc%3D")));
    }

    #[test]
    fn errors_name_what_is_missing() {
        assert_eq!(parse(""), Err(ConnectionStringError::Empty));
        assert_eq!(parse("AccountName=acct;garbage"), Err(ConnectionStringError::Malformed));
        assert_eq!(parse("AccountKey=a2V5"), Err(ConnectionStringError::Missing("AccountName or BlobEndpoint")));
        assert_eq!(
            parse("AccountName=acct"),
            Err(ConnectionStringError::Missing("AccountKey or SharedAccessSignature"))
        );
        assert_eq!(
            parse("BlobEndpoint=http://127.0.0.1:1/x;AccountKey=a2V5"),
            Err(ConnectionStringError::Missing("AccountName (required with AccountKey)"))
        );
        assert_eq!(
            parse("AccountName=acct;AccountKey=not base64!"),
            Err(ConnectionStringError::Invalid("AccountKey", "not base64"))
        );
        assert_eq!(
            parse("AccountName=acct;AccountKey=a2V5;BlobEndpoint=ftp://x"),
            Err(ConnectionStringError::Invalid("BlobEndpoint", "expected an http or https URL"))
        );
    }

    #[test]
    fn neither_errors_nor_debug_output_contain_the_key() {
        let key = "c2VjcmV0LWtleS12YWx1ZQ==";
        let cs = parse(&format!("AccountName=acct;AccountKey={key}")).expect("parses");
        let debug = format!("{cs:?}");
        assert!(!debug.contains(key) && !debug.contains("c2VjcmV0"), "{debug}");
        assert!(debug.contains("acct.blob.core.windows.net"), "{debug}");

        let sas = parse("BlobEndpoint=https://a.example;SharedAccessSignature=sig=topsecret").expect("parses");
        assert!(!format!("{sas:?}").contains("topsecret"));

        for bad in [format!("AccountName=acct;AccountKey={key}!"), format!("AccountKey={key};{key}")] {
            let err = parse(&bad).expect_err("rejected").to_string();
            assert!(!err.contains("c2VjcmV0"), "{err}");
        }
    }
}
