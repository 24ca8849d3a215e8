//! The store's HTTP side: our own client with deadlines (for storage and for Entra ID token requests), the
//! SDK's retry bounds, and the per-try policy that counts requests. Built by the `BlobStore` constructors.

use crate::state::StoreError;
use azure_core::error::ErrorKind;
use azure_core::http::policies::{Policy, PolicyResult};
use azure_core::http::{ClientOptions, Context, ExponentialRetryOptions, Request, RetryOptions, Transport};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Deadline for one HTTP try, from connect to the last body byte.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Deadline for establishing a connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// SDK retries per operation (on connection errors, timeouts, 408, 429 and 5xx). Kept small: a tick that
/// cannot reach storage should fail fast and let the next tick try again.
pub const MAX_RETRIES: u32 = 2;

/// Tries of one call, readable after it returns: placed in the call's context, counted by [`CountTries`].
#[derive(Clone, Default)]
pub(super) struct Tries(pub(super) Arc<AtomicU32>);

/// Per-try policy: counts every request sent (for `StateStore::operations`) and the tries of a call that
/// carries [`Tries`] in its context.
#[derive(Debug)]
pub(super) struct CountTries {
    pub(super) ops: Arc<AtomicU64>,
}

#[async_trait::async_trait]
impl Policy for CountTries {
    async fn send(&self, ctx: &Context, request: &mut Request, next: &[Arc<dyn Policy>]) -> PolicyResult {
        self.ops.fetch_add(1, Ordering::Relaxed);
        if let Some(tries) = ctx.value::<Tries>() {
            tries.0.fetch_add(1, Ordering::Relaxed);
        }
        match next.split_first() {
            Some((first, rest)) => first.send(ctx, request, rest).await,
            None => Err(azure_core::Error::with_message(ErrorKind::Other, "the counting policy must not be last")),
        }
    }
}

/// The HTTP client for storage and for the Entra ID credential's token requests. Our own rather than the SDK's
/// default: that one has no overall deadline (60 s read timeout).
pub(super) fn http_client() -> Result<reqwest::Client, StoreError> {
    ensure_tls_provider();
    reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(REQUEST_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| StoreError::Refused(format!("could not build the HTTP client for blob storage: {e}")))
}

/// Client options with `transport` and the store's retry bounds ([`MAX_RETRIES`], 15 s in all).
pub(super) fn client_options(transport: Transport) -> ClientOptions {
    ClientOptions {
        retry: RetryOptions::exponential(ExponentialRetryOptions {
            initial_delay: azure_core::time::Duration::milliseconds(200),
            max_retries: MAX_RETRIES,
            max_total_elapsed: azure_core::time::Duration::seconds(15),
            max_delay: azure_core::time::Duration::seconds(2),
        }),
        transport: Some(transport),
        ..Default::default()
    }
}

/// reqwest (built with `rustls-no-provider`) panics when no rustls provider is installed. The binary installs
/// ring at start; installing it here as well keeps tests, tools and examples from panicking. A lost race
/// with another installer is fine.
fn ensure_tls_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}
