//! An in-memory store for unit tests and for the engine's own fault-injection tests.

use super::{Etag, StateStore, StoreError, Versioned};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

#[derive(Debug, Default)]
pub struct MemoryStore {
    docs: Mutex<BTreeMap<String, (Vec<u8>, u64)>>,
    version: AtomicU64,
    ops: AtomicU64,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Removes a document, as an operator who deletes a blob by hand would (tests).
    pub fn delete(&self, key: &str) {
        self.docs.lock().expect("memory store lock").remove(key);
    }
}

#[async_trait::async_trait]
impl StateStore for MemoryStore {
    async fn load(&self, key: &str) -> Result<Option<Versioned>, StoreError> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        let docs = self.docs.lock().expect("memory store lock");
        Ok(docs.get(key).map(|(bytes, v)| Versioned { bytes: bytes.clone(), etag: Etag(v.to_string()) }))
    }

    async fn save_if(&self, key: &str, bytes: &[u8], expected: Option<&Etag>) -> Result<Etag, StoreError> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        let mut docs = self.docs.lock().expect("memory store lock");
        let current = docs.get(key).map(|(_, v)| Etag(v.to_string()));
        if current.as_ref() != expected {
            return Err(StoreError::Conflict);
        }
        let v = self.version.fetch_add(1, Ordering::Relaxed) + 1;
        docs.insert(key.to_string(), (bytes.to_vec(), v));
        Ok(Etag(v.to_string()))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        let docs = self.docs.lock().expect("memory store lock");
        Ok(docs.keys().filter(|k| k.starts_with(prefix)).cloned().collect())
    }

    fn operations(&self) -> u64 {
        self.ops.load(Ordering::Relaxed)
    }

    fn describe(&self) -> String {
        "memory".into()
    }
}
