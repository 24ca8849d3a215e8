//! Azure Blob Storage as the state store: one block blob per key, written with conditional PUTs.
//!
//! Blob Storage is where a Functions app already keeps its host state (`AzureWebJobsStorage`), and its ETags
//! give exactly the compare-and-swap the [`StateStore`] contract needs: `If-Match: <etag>` to replace,
//! `If-None-Match: *` to create, 412 (or 409 `BlobAlreadyExists`) when another writer moved first.
//!
//! Built on azure_storage_blob 1.1, with three things the SDK does not do by itself:
//! - connection strings and Shared Key signing ([`connection_string`], [`shared_key`]), since the SDK only
//!   takes Entra ID tokens and Azurite only takes keys;
//! - a service version Azurite accepts ([`SERVICE_VERSION`]; the SDK defaults to a newer one);
//! - bounded time: the engine decides retries per tick, so the SDK may retry only briefly
//!   ([`transport::MAX_RETRIES`]) and every try has a deadline ([`transport::REQUEST_TIMEOUT`]).
//!
//! One subtlety: a conditional write retried by the SDK after a lost response can fail its precondition
//! against its *own* first attempt. A 412/409 after more than one try is therefore reported as
//! [`StoreError::Unavailable`] (ambiguous, the engine reloads), never as a plain conflict.

pub(crate) mod connection_string;
mod identity;
mod names;
mod sdk_error;
mod shared_key;
mod transport;

use names::{validate_container_name, validate_key};
pub(crate) use sdk_error::redact_signature;
use sdk_error::{chain, error_code, token_failure_is_transient};
use transport::{client_options, http_client, CountTries, Tries};

use super::{Etag, StateStore, StoreError, Versioned};
use crate::config::Secret;
use azure_core::error::ErrorKind;
use azure_core::http::policies::Policy;
use azure_core::http::{ClientMethodOptions, ClientOptions, Context, RequestContent, StatusCode, Transport, Url};
use azure_storage_blob::models::{
    BlobClientDownloadOptions, BlobClientUploadOptions, BlobContainerClientListBlobsOptions,
};
use azure_storage_blob::{BlobContainerClient, BlobContainerClientOptions};
use connection_string::{ConnectionString, KeyAuth};
use futures::TryStreamExt as _;
use shared_key::SharedKeyPolicy;
use std::fmt;
use std::num::NonZero;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// The storage service version sent as `x-ms-version`. azure_storage_blob 1.1 defaults to 2026-04-06, which
/// Azurite 3.35 rejects with 400; 2025-11-05 is the newest it accepts and has everything used here.
pub const SERVICE_VERSION: &str = "2025-11-05";
const CONTENT_TYPE: &str = "application/json";

/// A [`StateStore`] over one blob container. See the module docs.
pub struct BlobStore {
    container: BlobContainerClient,
    container_name: String,
    /// `azure blob {endpoint}/{container}`, without any query (a SAS lives there).
    description: String,
    /// What to check when storage answers 401/403, specific to the credential in use.
    auth_hint: &'static str,
    /// What to check when no Entra ID token could be had (identity-based connections only): the settings that
    /// make up the credential.
    token_hint: String,
    /// Set once the container is known to exist; cleared if a write finds it gone.
    container_ready: AtomicBool,
    /// HTTP requests sent, retries included; shared with the counting policy.
    ops: Arc<AtomicU64>,
}

impl fmt::Debug for BlobStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlobStore").field("location", &self.description).finish_non_exhaustive()
    }
}

/// How the store authenticates; chosen by the constructors.
enum Auth {
    SharedKey(SharedKeyPolicy),
    Sas(Secret),
    /// The credential, and what to check when it cannot get a token.
    Token(Arc<dyn azure_core::credentials::TokenCredential>, String),
}

impl BlobStore {
    /// The default storage setting prefix, as in the Functions host.
    pub const DEFAULT_SETTING: &'static str = "AzureWebJobsStorage";
    /// The `x-ms-version` this store sends (see `SERVICE_VERSION`).
    pub const SERVICE_VERSION: &'static str = SERVICE_VERSION;

    /// A store from an Azure Storage connection string: `UseDevelopmentStorage=true`, or `AccountName` +
    /// `AccountKey` (with `DefaultEndpointsProtocol`, `EndpointSuffix` or `BlobEndpoint`), or `BlobEndpoint` +
    /// `SharedAccessSignature`. Nothing is contacted until the first operation.
    pub fn from_connection_string(cs: &Secret, container: &str) -> Result<BlobStore, StoreError> {
        let parsed = ConnectionString::parse(cs).map_err(|e| StoreError::Refused(e.to_string()))?;
        let (auth, hint) = match parsed.auth {
            KeyAuth::SharedKey { account, key } => {
                let policy = SharedKeyPolicy::new(&account, &key).ok_or_else(|| {
                    StoreError::Refused("the storage connection string's AccountKey is not base64".into())
                })?;
                let hint = "check the AccountKey in the storage connection string (keys may have been rotated)";
                (Auth::SharedKey(policy), hint)
            }
            KeyAuth::Sas(sas) => {
                let hint = "check the SharedAccessSignature in the storage connection string: it must allow read, \
                            write, create and list on the container and must not have expired";
                (Auth::Sas(sas), hint)
            }
        };
        Self::build(parsed.blob_endpoint, auth, hint, container)
    }

    /// A store from app settings, following the Functions convention for `prefix` (normally
    /// [`BlobStore::DEFAULT_SETTING`]): the setting itself as a connection string, or `{prefix}__blobServiceUri` /
    /// `{prefix}__accountName` with an Entra ID credential (`{prefix}__credential=managedidentity` and optional
    /// `{prefix}__clientId`; otherwise the managed identity when hosted in Azure, else the developer's sign-in).
    pub fn from_settings(
        get: &dyn Fn(&str) -> Option<String>,
        prefix: &str,
        container: &str,
    ) -> Result<BlobStore, StoreError> {
        match identity::resolve(get, prefix).map_err(StoreError::Refused)? {
            identity::Resolved::ConnectionString(cs) => Self::from_connection_string(&cs, container),
            identity::Resolved::Identity { blob_endpoint, credential } => {
                // The token requests go through the same client and retry bounds as storage requests, so an
                // authority that does not answer holds a tick no longer than storage would.
                let transport = Transport::new(Arc::new(http_client()?));
                let token = credential.build(client_options(transport)).map_err(|e| {
                    StoreError::Refused(format!(
                        "could not set up the Entra ID credential for {prefix}: {}; {}",
                        chain(&e),
                        credential.token_hint(prefix)
                    ))
                })?;
                let auth = Auth::Token(token, credential.token_hint(prefix));
                Self::build(blob_endpoint, auth, credential.hint(), container)
            }
        }
    }

    fn build(endpoint: Url, auth: Auth, auth_hint: &'static str, container: &str) -> Result<BlobStore, StoreError> {
        Self::build_with(endpoint, auth, auth_hint, container, Transport::new(Arc::new(http_client()?)))
    }

    fn build_with(
        endpoint: Url,
        auth: Auth,
        auth_hint: &'static str,
        container: &str,
        transport: Transport,
    ) -> Result<BlobStore, StoreError> {
        validate_container_name(container)?;

        let mut container_url = endpoint.clone();
        container_url
            .path_segments_mut()
            .map_err(|()| StoreError::Refused("the blob endpoint cannot carry a path".into()))?
            .pop_if_empty()
            .push(container);
        let description = format!("azure blob {}/{container}", endpoint.as_str().trim_end_matches('/'));

        let ops = Arc::new(AtomicU64::new(0));
        let mut per_try: Vec<Arc<dyn Policy>> = vec![Arc::new(CountTries { ops: ops.clone() })];
        let mut credential = None;
        let mut token_hint = String::new();
        match auth {
            Auth::SharedKey(policy) => per_try.push(Arc::new(policy)),
            Auth::Sas(sas) => container_url.set_query(Some(sas.expose())),
            Auth::Token(token, hint) => (credential, token_hint) = (Some(token), hint),
        }
        let options = BlobContainerClientOptions {
            client_options: ClientOptions { per_try_policies: per_try, ..client_options(transport) },
            version: SERVICE_VERSION.to_string(),
        };
        let client = BlobContainerClient::new(container_url, credential, Some(options))
            .map_err(|e| StoreError::Refused(format!("invalid blob endpoint for {description}: {}", chain(&e))))?;
        Ok(BlobStore {
            container: client,
            container_name: container.to_string(),
            description,
            auth_hint,
            token_hint,
            container_ready: AtomicBool::new(false),
            ops,
        })
    }

    /// Creates the container unless this process already saw it exist. 409 (it exists) is success.
    async fn ensure_container(&self) -> Result<(), StoreError> {
        if self.container_ready.load(Ordering::Acquire) {
            return Ok(());
        }
        match self.container.create(None).await {
            Ok(_) => tracing::debug!(container = %self.container_name, status = 201, "created state container"),
            Err(e) if error_code(&e) == Some("ContainerAlreadyExists") => {}
            Err(e) if error_code(&e) == Some("ContainerBeingDeleted") => {
                return Err(StoreError::Unavailable(format!(
                    "container {} is being deleted; it can be created again once the deletion finishes",
                    self.container_name
                )))
            }
            Err(e) => return Err(self.classify("create container", None, &e)),
        }
        self.container_ready.store(true, Ordering::Release);
        Ok(())
    }

    async fn put(&self, key: &str, bytes: &[u8], expected: Option<&Etag>) -> Result<Etag, PutFailure> {
        let tries = Tries::default();
        let options = BlobClientUploadOptions {
            blob_content_type: Some(CONTENT_TYPE.to_string()),
            if_match: expected.map(|etag| etag.0.clone().into()),
            if_none_match: expected.is_none().then(|| "*".into()),
            method_options: ClientMethodOptions { context: Context::new().with_value(tries.clone()) },
            ..Default::default()
        };
        let result = self.container.blob_client(key).upload(RequestContent::from(bytes.to_vec()), Some(options)).await;
        match result {
            Ok(done) => {
                tracing::debug!(key, status = 201, "saved state blob");
                let etag = done.etag.ok_or_else(|| {
                    PutFailure::Store(StoreError::Unavailable(format!(
                        "storage saved {key} but returned no ETag; reload it"
                    )))
                })?;
                Ok(Etag(etag.to_string()))
            }
            Err(e) => {
                let status = e.http_status();
                tracing::debug!(key, status = status.map(u16::from), "saving state blob failed");
                let code = error_code(&e);
                let lost_race = match status {
                    Some(StatusCode::PreconditionFailed) => true,
                    Some(StatusCode::Conflict) => code == Some("BlobAlreadyExists"),
                    // If-Match on a blob that was deleted since it was read.
                    Some(StatusCode::NotFound) => expected.is_some() && code == Some("BlobNotFound"),
                    _ => false,
                };
                if lost_race && tries.0.load(Ordering::Relaxed) > 1 {
                    return Err(PutFailure::Store(StoreError::Unavailable(format!(
                        "saving {key}: the precondition failed on a retry, so an earlier attempt may have been \
                         applied; reload to find out"
                    ))));
                }
                if lost_race {
                    return Err(PutFailure::Store(StoreError::Conflict));
                }
                let error = self.classify("save", Some(key), &e);
                if status == Some(StatusCode::NotFound) && code == Some("ContainerNotFound") {
                    return Err(PutFailure::ContainerGone(error));
                }
                Err(PutFailure::Store(error))
            }
        }
    }

    /// Maps an SDK error to the store's three outcomes. Messages name the operation, the key and the status,
    /// never a credential.
    fn classify(&self, op: &str, key: Option<&str>, e: &azure_core::Error) -> StoreError {
        let target = match key {
            Some(key) => format!("{}/{key}", self.container_name),
            None => self.container_name.clone(),
        };
        match e.kind() {
            ErrorKind::HttpResponse { status, error_code, .. } => {
                let code = error_code.as_deref().unwrap_or("no error code");
                let status_num = u16::from(*status);
                match *status {
                    StatusCode::Unauthorized | StatusCode::Forbidden => StoreError::Refused(format!(
                        "{op} {target}: storage answered {status_num} {code}: {}",
                        self.auth_hint
                    )),
                    StatusCode::BadRequest => StoreError::Refused(format!(
                        "{op} {target}: storage rejected the request as invalid (400 {code}): check the blob \
                         name and that the service accepts x-ms-version {SERVICE_VERSION}"
                    )),
                    StatusCode::RequestTimeout | StatusCode::TooManyRequests => {
                        StoreError::Unavailable(format!("{op} {target}: storage answered {status_num} {code}"))
                    }
                    s if s.is_server_error() => {
                        StoreError::Unavailable(format!("{op} {target}: storage answered {status_num} {code}"))
                    }
                    StatusCode::NotFound => StoreError::Refused(format!(
                        "{op} {target}: storage answered 404 {code}: check the endpoint and account name in \
                         the storage setting"
                    )),
                    _ => StoreError::Refused(format!("{op} {target}: storage answered {status_num} {code}")),
                }
            }
            // The authority unreachable or failing (5xx, timeout) passes; a refusal (wrong secret, unknown
            // tenant or client) needs the settings fixed.
            ErrorKind::Credential if token_failure_is_transient(e) => StoreError::Unavailable(format!(
                "{op} {target}: could not get an Entra ID token for storage, the authority did not answer or \
                 failed: {}",
                chain(e)
            )),
            ErrorKind::Credential => StoreError::Refused(format!(
                "{op} {target}: could not get an Entra ID token for storage: {}; {}",
                chain(e),
                self.token_hint
            )),
            _ => StoreError::Unavailable(format!("{op} {target}: {}", chain(e))),
        }
    }
}

#[async_trait::async_trait]
impl StateStore for BlobStore {
    async fn load(&self, key: &str) -> Result<Option<Versioned>, StoreError> {
        validate_key(key)?;
        // One request for a state document: documents are far below the SDK's 4 MiB first range.
        let options = BlobClientDownloadOptions { parallel: NonZero::new(1), ..Default::default() };
        let downloaded = match self.container.blob_client(key).download(Some(options)).await {
            Ok(downloaded) => downloaded,
            Err(e)
                if e.http_status() == Some(StatusCode::NotFound)
                    && matches!(error_code(&e), Some("BlobNotFound" | "ContainerNotFound")) =>
            {
                tracing::debug!(key, status = 404, "state blob not found");
                return Ok(None);
            }
            Err(e) => {
                tracing::debug!(key, status = e.http_status().map(u16::from), "loading state blob failed");
                return Err(self.classify("load", Some(key), &e));
            }
        };
        let etag = downloaded
            .properties
            .etag
            .map(|etag| etag.to_string())
            .ok_or_else(|| StoreError::Unavailable(format!("storage returned {key} without an ETag")))?;
        let bytes = downloaded.body.collect().await.map_err(|e| self.classify("load", Some(key), &e))?;
        tracing::debug!(key, status = 200, "loaded state blob");
        Ok(Some(Versioned { bytes: bytes.to_vec(), etag: Etag(etag) }))
    }

    async fn save_if(&self, key: &str, bytes: &[u8], expected: Option<&Etag>) -> Result<Etag, StoreError> {
        validate_key(key)?;
        self.ensure_container().await?;
        match self.put(key, bytes, expected).await {
            Ok(etag) => Ok(etag),
            Err(PutFailure::Store(e)) => Err(e),
            // The container was deleted behind our back: a 404 applied nothing, so recreate it and try once more.
            Err(PutFailure::ContainerGone(_)) => {
                self.container_ready.store(false, Ordering::Release);
                self.ensure_container().await?;
                self.put(key, bytes, expected).await.map_err(PutFailure::into_store_error)
            }
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        // An empty prefix would go out as a key-only `&prefix` query parameter, which Azurite leaves out of the
        // Shared Key canonicalization while the documented algorithm includes it: send none instead.
        let prefix_param = (!prefix.is_empty()).then(|| prefix.to_string());
        let options = BlobContainerClientListBlobsOptions { prefix: prefix_param, ..Default::default() };
        let mut pages =
            self.container.list_blobs(Some(options)).map_err(|e| self.classify("list", Some(prefix), &e))?.into_pages();
        let mut names = Vec::new();
        loop {
            match pages.try_next().await {
                Ok(Some(page)) => {
                    let page = page.into_model().map_err(|e| self.classify("list", Some(prefix), &e))?;
                    names.extend(page.blob_items.into_iter().filter_map(|item| item.name));
                }
                Ok(None) => break,
                Err(e)
                    if e.http_status() == Some(StatusCode::NotFound) && error_code(&e) == Some("ContainerNotFound") =>
                {
                    tracing::debug!(prefix, status = 404, "state container not found");
                    return Ok(Vec::new());
                }
                Err(e) => {
                    tracing::debug!(prefix, status = e.http_status().map(u16::from), "listing state blobs failed");
                    return Err(self.classify("list", Some(prefix), &e));
                }
            }
        }
        tracing::debug!(prefix, status = 200, blobs = names.len(), "listed state blobs");
        names.sort();
        Ok(names)
    }

    fn operations(&self) -> u64 {
        self.ops.load(Ordering::Relaxed)
    }

    fn describe(&self) -> String {
        self.description.clone()
    }
}

/// Why a single PUT failed: a missing container is the one failure `save_if` repairs and retries, because a
/// 404 means nothing was written.
enum PutFailure {
    ContainerGone(StoreError),
    Store(StoreError),
}

impl PutFailure {
    fn into_store_error(self) -> StoreError {
        match self {
            Self::ContainerGone(e) | Self::Store(e) => e,
        }
    }
}

#[cfg(test)]
mod tests;
