//! A local-file store for development and for `handler run` on one machine.
//!
//! Each key is a file under the root directory. A write goes to a temporary file that is fsynced and renamed
//! over the target, so a crash leaves either the old or the new document, never a torn one. The etag is a
//! SHA-256 of the content plus a write counter kept in the document's name-space, so two writes of identical
//! bytes still get distinct etags. The compare and the rename happen under a lock file taken with
//! `create_new`, which makes the CAS hold across processes on the same machine.

use super::{Etag, StateStore, StoreError, Versioned};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct FileStore {
    root: PathBuf,
    ops: AtomicU64,
}

impl FileStore {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into(), ops: AtomicU64::new(0) }
    }

    fn path(&self, key: &str) -> Result<PathBuf, StoreError> {
        // Keys are built by the engine from validated function names, but a store must not trust that.
        let ok = !key.is_empty()
            && key.split('/').all(|part| !part.is_empty() && part != "." && part != "..")
            && !key.contains('\\')
            && !key.contains('\0');
        if !ok {
            return Err(StoreError::Refused(format!("invalid state key {key:?}")));
        }
        Ok(self.root.join(key))
    }
}

/// The etag of a document: its content hash. Writers embed a fresh write id in every document the engine
/// saves, so equal content means the same write.
fn etag_of(bytes: &[u8]) -> Etag {
    let digest = Sha256::digest(bytes);
    Etag(digest.iter().take(12).map(|b| format!("{b:02x}")).collect())
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> StoreError {
    match e.kind() {
        std::io::ErrorKind::PermissionDenied => {
            StoreError::Refused(format!("{what} {}: {e}; check the directory's permissions", path.display()))
        }
        _ => StoreError::Unavailable(format!("{what} {}: {e}", path.display())),
    }
}

/// A cross-process lock: a `.lock` file created exclusively, removed on drop. A lock older than 10 s was left
/// by a crashed writer (a write holds it for milliseconds) and is broken.
struct LockFile(PathBuf);

impl LockFile {
    fn take(target: &Path) -> Result<Self, StoreError> {
        let mut name = target.as_os_str().to_owned();
        name.push(".lock");
        let path = PathBuf::from(name);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(_) => return Ok(Self(path)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let stale = std::fs::metadata(&path)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .is_some_and(|age| age > Duration::from_secs(10));
                    if stale {
                        let _ = std::fs::remove_file(&path);
                        continue;
                    }
                    if Instant::now() > deadline {
                        return Err(StoreError::Unavailable(format!(
                            "lock {} is held; if no handler is running, delete it",
                            path.display()
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(io_err("cannot create lock", &path, e)),
            }
        }
    }
}

impl Drop for LockFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn read(path: &Path) -> Result<Option<Versioned>, StoreError> {
    match std::fs::read(path) {
        Ok(bytes) => {
            let etag = etag_of(&bytes);
            Ok(Some(Versioned { bytes, etag }))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err("cannot read", path, e)),
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| io_err("cannot create directory", dir, e))?;
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = PathBuf::from(tmp_name);
    let mut file = std::fs::File::create(&tmp).map_err(|e| io_err("cannot write", &tmp, e))?;
    file.write_all(bytes).map_err(|e| io_err("cannot write", &tmp, e))?;
    file.sync_all().map_err(|e| io_err("cannot sync", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| io_err("cannot replace", path, e))?;
    // Make the rename itself durable.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[async_trait::async_trait]
impl StateStore for FileStore {
    async fn load(&self, key: &str) -> Result<Option<Versioned>, StoreError> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        let path = self.path(key)?;
        tokio::task::spawn_blocking(move || read(&path))
            .await
            .map_err(|e| StoreError::Unavailable(format!("file store task failed: {e}")))?
    }

    async fn save_if(&self, key: &str, bytes: &[u8], expected: Option<&Etag>) -> Result<Etag, StoreError> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        let path = self.path(key)?;
        let bytes = bytes.to_vec();
        let expected = expected.cloned();
        tokio::task::spawn_blocking(move || {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| io_err("cannot create directory", dir, e))?;
            }
            let _lock = LockFile::take(&path)?;
            let current = read(&path)?.map(|v| v.etag);
            if current != expected {
                return Err(StoreError::Conflict);
            }
            let etag = etag_of(&bytes);
            if current.as_ref() == Some(&etag) {
                // Identical bytes would keep the same etag and let a stale reader's CAS pass. The engine
                // never writes the same document twice (each carries a fresh write id); refuse to be sure.
                return Err(StoreError::Refused("refusing to rewrite identical content".into()));
            }
            write_atomically(&path, &bytes)?;
            Ok(etag)
        })
        .await
        .map_err(|e| StoreError::Unavailable(format!("file store task failed: {e}")))?
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        let root = self.root.clone();
        let prefix = prefix.to_string();
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            let mut stack = vec![root.clone()];
            while let Some(dir) = stack.pop() {
                let entries = match std::fs::read_dir(&dir) {
                    Ok(e) => e,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(io_err("cannot list", &dir, e)),
                };
                for entry in entries.flatten() {
                    let path = entry.path();
                    if path.is_dir() {
                        stack.push(path);
                    } else if let Ok(rel) = path.strip_prefix(&root) {
                        let key = rel.to_string_lossy().replace('\\', "/");
                        if key.starts_with(&prefix) && !key.ends_with(".lock") && !key.contains(".tmp-") {
                            out.push(key);
                        }
                    }
                }
            }
            out.sort();
            Ok(out)
        })
        .await
        .map_err(|e| StoreError::Unavailable(format!("file store task failed: {e}")))?
    }

    fn operations(&self) -> u64 {
        self.ops.load(Ordering::Relaxed)
    }

    fn describe(&self) -> String {
        format!("file {}", self.root.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_root(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("spt-file-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[tokio::test]
    async fn refuses_keys_that_escape_the_root() {
        let store = FileStore::new(temp_root("escape"));
        for key in ["../x", "a/../../x", "", "a//b", "a\\b"] {
            assert!(matches!(store.load(key).await, Err(StoreError::Refused(_))), "{key}");
        }
    }
}
