//! Construction, key checks and error wording, and the retry and precondition rules against a scripted transport.

use super::transport::MAX_RETRIES;
use super::*;
use azure_core::http::policies::PolicyResult;
use azure_core::http::Request;

fn store(cs: &str) -> BlobStore {
    BlobStore::from_connection_string(&Secret::new(cs), "state").expect("valid connection string")
}

#[test]
fn describe_names_endpoint_and_container_but_no_secret() {
    let s = store("UseDevelopmentStorage=true");
    assert_eq!(s.describe(), "azure blob http://127.0.0.1:10000/devstoreaccount1/state");
    let s = store("AccountName=acct;AccountKey=c2VjcmV0");
    assert_eq!(s.describe(), "azure blob https://acct.blob.core.windows.net/state");
    assert!(!format!("{s:?}").contains("c2VjcmV0"));
    let s = store("BlobEndpoint=https://acct.blob.core.windows.net/;SharedAccessSignature=sv=1&sig=topsecret");
    assert_eq!(s.describe(), "azure blob https://acct.blob.core.windows.net/state");
    assert!(!format!("{s:?}").contains("topsecret"));
}

/// The client secret of an identity-based connection, as `Debug` of the settings resolved, of the credential
/// built from them and of the store, and as the error of a credential that cannot be built, never shows.
#[test]
fn debug_and_errors_of_an_identity_store_hold_no_client_secret() {
    const SECRET: &str = "Cs8Q~UnitClientSecret.9d1";
    let with_tenant = |tenant: &'static str| {
        move |key: &str| {
            let value = match key {
                "AzureWebJobsStorage__accountName" => "acct",
                "AzureWebJobsStorage__tenantId" => tenant,
                "AzureWebJobsStorage__clientId" => "3c1e9a0d-5b7f-4e2a-8d61-0f9b2c4a7e15",
                "AzureWebJobsStorage__clientSecret" => SECRET,
                _ => return None,
            };
            Some(value.to_string())
        }
    };
    let settings = with_tenant("72f988bf-86f1-41af-91ab-2d7cd011db47");
    let resolved = identity::resolve(&settings, BlobStore::DEFAULT_SETTING).expect("resolves");
    assert!(!format!("{resolved:?}").contains(SECRET), "{resolved:?}");
    let identity::Resolved::Identity { credential, .. } = &resolved else { panic!("identity: {resolved:?}") };
    let transport = Transport::new(Arc::new(http_client().expect("a client")));
    let built = credential.build(client_options(transport)).expect("a credential");
    let debug = format!("{built:?}");
    assert!(debug.contains("ClientSecretCredential") && !debug.contains(SECRET), "{debug}");
    let store = BlobStore::from_settings(&settings, BlobStore::DEFAULT_SETTING, "state").expect("a store");
    assert!(!format!("{store:?}").contains(SECRET), "{store:?}");
    assert!(!store.token_hint.contains(SECRET) && store.token_hint.contains("AzureWebJobsStorage__clientSecret"));

    let err = BlobStore::from_settings(&with_tenant("not/a tenant"), BlobStore::DEFAULT_SETTING, "state")
        .expect_err("an invalid tenant id");
    let text = err.to_string();
    assert!(text.contains("invalid tenant ID") && text.contains("AzureWebJobsStorage__tenantId"), "{text}");
    assert!(!text.contains(SECRET) && !format!("{err:?}").contains(SECRET), "{text}");
}

#[test]
fn construction_errors_are_refusals_that_name_the_problem() {
    let err = BlobStore::from_connection_string(&Secret::new("AccountName=acct"), "state").expect_err("no key");
    assert!(matches!(&err, StoreError::Refused(m) if m.contains("AccountKey or SharedAccessSignature")), "{err}");
    let err = BlobStore::from_connection_string(&Secret::new("UseDevelopmentStorage=true"), "Bad_Name")
        .expect_err("bad container");
    assert!(matches!(&err, StoreError::Refused(m) if m.contains("invalid blob container name")), "{err}");
    let err = BlobStore::from_settings(&|_| None, BlobStore::DEFAULT_SETTING, "state").expect_err("nothing set");
    assert!(matches!(&err, StoreError::Refused(m) if m.starts_with("AzureWebJobsStorage is not set")), "{err}");
}

#[test]
fn keys_that_blob_storage_would_mangle_are_refused() {
    for bad in ["", "/a", "a/", "a//b", "a/./b", "../a", "a.", "a\\b", "a\nb"] {
        assert!(validate_key(bad).is_err(), "{bad:?}");
    }
    for good in ["fn.json", "quarantine/fn/2024-01-01T00:00:00Z.json", "a b/c"] {
        assert!(validate_key(good).is_ok(), "{good:?}");
    }
}

/// A fake blob service: answers container creation with 201 and blob PUTs from a script, in order.
#[derive(Debug)]
struct Scripted {
    puts: std::sync::Mutex<Vec<(StatusCode, &'static str)>>,
}

#[async_trait::async_trait]
impl Policy for Scripted {
    async fn send(&self, _: &Context, request: &mut Request, _: &[Arc<dyn Policy>]) -> PolicyResult {
        let mut headers = azure_core::http::headers::Headers::new();
        let (status, code) = if request.url().query().is_some_and(|q| q.contains("restype=container")) {
            (StatusCode::Created, "")
        } else {
            let mut puts = self.puts.lock().expect("script lock");
            if puts.is_empty() {
                (StatusCode::InternalServerError, "ScriptExhausted")
            } else {
                puts.remove(0)
            }
        };
        if status == StatusCode::Created {
            headers.insert("etag", "\"0x2\"");
        } else {
            headers.insert("x-ms-error-code", code);
        }
        Ok(azure_core::http::AsyncRawResponse::from_bytes(status, headers, azure_core::Bytes::new()))
    }
}

fn scripted(puts: Vec<(StatusCode, &'static str)>) -> BlobStore {
    let auth = Auth::Sas(Secret::new("sv=1&sig=x"));
    let endpoint = Url::parse("https://acct.blob.core.windows.net").expect("valid url");
    let transport = Transport::with_policy(Arc::new(Scripted { puts: std::sync::Mutex::new(puts) }));
    BlobStore::build_with(endpoint, auth, "hint", "state", transport).expect("store")
}

#[tokio::test]
async fn a_failed_precondition_on_the_first_try_is_a_conflict() {
    let store = scripted(vec![(StatusCode::PreconditionFailed, "ConditionNotMet")]);
    let result = store.save_if("k.json", b"x", Some(&Etag("\"0x1\"".into()))).await;
    assert!(matches!(result, Err(StoreError::Conflict)), "{result:?}");
}

#[tokio::test]
async fn a_failed_precondition_after_a_retry_is_ambiguous_not_a_conflict() {
    // GIVEN the first PUT's answer is lost (503) and the SDK retries, THEN the retry may have lost to ourselves.
    let store =
        scripted(vec![(StatusCode::ServiceUnavailable, "ServerBusy"), (StatusCode::Conflict, "BlobAlreadyExists")]);
    let result = store.save_if("k.json", b"x", None).await;
    assert!(matches!(&result, Err(e @ StoreError::Unavailable(_)) if e.is_ambiguous()), "{result:?}");
    assert_eq!(store.operations(), 3, "create container, then two tries");
}

#[tokio::test]
async fn a_deleted_container_is_recreated_and_the_write_tried_once_more() {
    let store = scripted(vec![(StatusCode::NotFound, "ContainerNotFound"), (StatusCode::Created, "")]);
    let etag = store.save_if("k.json", b"x", None).await.expect("saved after recreating the container");
    assert_eq!(etag, Etag("\"0x2\"".into()));
    assert_eq!(store.operations(), 4, "create, put, create, put");
}

#[tokio::test]
async fn persistent_server_errors_stop_after_the_bounded_retries() {
    let store = scripted(vec![(StatusCode::ServiceUnavailable, "ServerBusy"); 5]);
    let result = store.save_if("k.json", b"x", None).await;
    assert!(matches!(&result, Err(StoreError::Unavailable(m)) if m.contains("503")), "{result:?}");
    assert_eq!(store.operations(), 1 + 1 + u64::from(MAX_RETRIES));
}

#[test]
fn signatures_are_masked_in_error_text() {
    assert_eq!(
        redact_signature("error sending request for url (https://a/b?sv=1&sig=abc%3D&se=2) sig=xyz"),
        "error sending request for url (https://a/b?sv=1&sig=***&se=2) sig=***"
    );
}

/// An Entra ID authority that refuses (4xx) needs the settings fixed; one that fails (5xx, 408, 429) or cannot
/// be reached passes.
#[test]
fn a_token_failure_is_transient_only_when_the_authority_failed_or_did_not_answer() {
    let failed = |kind: ErrorKind| {
        let inner = azure_core::Error::with_message(kind, "the authority's answer").with_context("a retry wrapper");
        azure_core::Error::with_error(ErrorKind::Credential, inner, "ClientSecretCredential authentication failed")
    };
    let answered = |status| ErrorKind::HttpResponse { status, error_code: None, raw_response: None };
    assert!(!token_failure_is_transient(&failed(answered(StatusCode::BadRequest))));
    assert!(!token_failure_is_transient(&failed(answered(StatusCode::Unauthorized))));
    assert!(token_failure_is_transient(&failed(answered(StatusCode::InternalServerError))));
    assert!(token_failure_is_transient(&failed(answered(StatusCode::TooManyRequests))));
    assert!(token_failure_is_transient(&failed(ErrorKind::Io)));
    assert!(token_failure_is_transient(&failed(ErrorKind::Connection)));
    assert!(!token_failure_is_transient(&failed(ErrorKind::Credential)), "no scopes, an invalid tenant id");
}
