//! Durable state: one small document per function, written only by compare-and-swap.
//!
//! The store knows nothing about what the document means (the engine owns that, in `engine::document`, read and
//! written only by `engine::ledger`); it stores bytes under a key and guards every write with an entity tag.
//! This keeps every backend (Azure Blob, a local file, memory) down to the two operations whose semantics
//! matter, and the same store also holds the immutable quarantine documents.
//!
//! # Contract
//! - `load` returns the latest durable bytes with their etag, or `None` if the key was never written.
//! - `save_if(key, bytes, Some(etag))` replaces the document only if its current etag is `etag`;
//!   `save_if(key, bytes, None)` creates it only if it does not exist. Anything else is
//!   [`StoreError::Conflict`]: another writer moved first, and the caller must reload, not retry blindly.
//! - A successful `save_if` is durable when it returns. A failed or timed-out one may or may not have been
//!   applied ([`StoreError::is_ambiguous`]); the engine resolves that by reloading on the next tick.
//! - Stores count the remote operations they perform, so ticks can report their cost.

pub(crate) mod blob;
mod file;
mod memory;

pub use blob::BlobStore;
pub use file::FileStore;
pub use memory::MemoryStore;

use std::fmt;

/// An opaque entity tag identifying one version of a document.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Etag(pub String);

impl fmt::Debug for Etag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A document and the etag it was read at.
#[derive(Debug, Clone)]
pub struct Versioned {
    pub bytes: Vec<u8>,
    pub etag: Etag,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The precondition failed: the document changed (or appeared) since it was read.
    #[error("the state document changed since it was read (another tick or operator wrote it first)")]
    Conflict,
    /// The store could not be reached or answered with a transient failure; the write may have been applied.
    #[error("the state store is unavailable: {0}")]
    Unavailable(String),
    /// The store refused the request for a reason retrying will not fix (credentials, permissions, bad name).
    #[error("the state store refused the request: {0}")]
    Refused(String),
}

impl StoreError {
    /// True when a write that failed this way may nevertheless have been applied.
    pub fn is_ambiguous(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }
}

/// Where state documents live. See the module docs for the contract every implementation keeps.
#[async_trait::async_trait]
pub trait StateStore: Send + Sync + fmt::Debug {
    async fn load(&self, key: &str) -> Result<Option<Versioned>, StoreError>;
    async fn save_if(&self, key: &str, bytes: &[u8], expected: Option<&Etag>) -> Result<Etag, StoreError>;
    /// Keys that start with `prefix`, sorted. Used for the quarantine listing, never on the tick path.
    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError>;
    /// Remote operations performed so far (loads, saves and lists).
    fn operations(&self) -> u64;
    /// A description for logs and status: backend and location, never a secret.
    fn describe(&self) -> String;
}
