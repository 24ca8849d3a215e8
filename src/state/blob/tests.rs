//! Construction, key checks and error wording, and the retry and precondition rules against a scripted transport.

use super::*;

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
