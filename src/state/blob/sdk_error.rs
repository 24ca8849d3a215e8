//! What an SDK error says, read for the store's messages: its error code, whether a failed token request may
//! pass, and its chain as one line with any SAS signature masked. Called by `BlobStore` when it classifies a
//! failure, and by the fuzz target that checks the masking.

use azure_core::error::ErrorKind;
use azure_core::http::StatusCode;

pub(super) fn error_code(e: &azure_core::Error) -> Option<&str> {
    match e.kind() {
        ErrorKind::HttpResponse { error_code, .. } => error_code.as_deref(),
        _ => None,
    }
}

/// True when a credential failed because Microsoft Entra ID (or the identity endpoint) could not be reached,
/// timed out or answered with a server error: the next try may succeed. A refusal (4xx: a wrong or expired
/// secret, an unknown tenant or client) is not.
pub(super) fn token_failure_is_transient(e: &azure_core::Error) -> bool {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = next {
        if let Some(inner) = err.downcast_ref::<azure_core::Error>() {
            match inner.kind() {
                ErrorKind::Io | ErrorKind::Connection => return true,
                ErrorKind::HttpResponse { status, .. } => {
                    return status.is_server_error()
                        || matches!(*status, StatusCode::RequestTimeout | StatusCode::TooManyRequests)
                }
                _ => {}
            }
        }
        next = err.source();
    }
    false
}

/// An error and its sources as one line, repeated messages collapsed and any SAS signature masked.
pub(super) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(e);
    while let Some(err) = next {
        let text = err.to_string();
        if parts.last() != Some(&text) {
            parts.push(text);
        }
        next = err.source();
    }
    redact_signature(&parts.join(": "))
}

/// Masks `sig=...` query values, which appear in transport errors that quote a SAS request URL.
pub(crate) fn redact_signature(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("sig=") {
        out.push_str(&rest[..at + 4]);
        out.push_str("***");
        rest = &rest[at + 4..];
        let end = rest.find(|c: char| c == '&' || c == ')' || c.is_whitespace()).unwrap_or(rest.len());
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}
