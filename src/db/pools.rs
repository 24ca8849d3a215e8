//! One pool of connections per database per process, shared by every function, partition, source and sink
//! that connects with the same connection string (issue 32: a pool per function made the connections of an
//! instance grow with its partitions, 2 per partition function and more for status, until the server refused
//! clients).
//!
//! The registry is process-wide because the database's limit is: whatever the app's folders say, one process
//! opens at most [`max_connections`] connections to one database through its pools (`Sql_Trigger_
//! MaxConnectionsPerDatabase`, read at start by `App`). docs/operations.md ("Connections") gives the formula
//! per instance. A caller that needs a connection while all are in use waits for one (at most the pool's
//! wait timeout) instead of opening another.
//!
//! A pool is found by a [`DatabaseKey`]: a SHA-256 of the connection string (and, for PostgreSQL, of what its
//! TLS trusts), so the registry holds no secret and nothing here can log one. The cap is part of the key: a
//! process that changes it (tests building apps with other caps) gets new pools, never a pool of another size.

//!
//! This file is the bottom of `db/`: it knows no dialect. Each dialect keeps its pools here through
//! [`shared`] (`postgres::shared_pool`, `mssql::Pool::new`) and reads the cap from here, so nothing here
//! imports the dialects that import it.

use crate::config::settings::MOST_CONNECTIONS_PER_DATABASE;
use sha2::{Digest, Sha256};
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// The cap when `Sql_Trigger_MaxConnectionsPerDatabase` is not set.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10;

/// A database as the registry knows it: a digest of its connection string, never the string.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DatabaseKey([u8; 32]);

impl DatabaseKey {
    /// The key of a connection string of database kind `kind`, with `extra` (what else changes how a
    /// connection is made, such as PostgreSQL's trust settings). Parts are length-prefixed, so no two
    /// different lists of parts give the same input to the digest.
    pub fn of(kind: &str, parts: &[&[u8]]) -> Self {
        let mut digest = Sha256::new();
        for part in std::iter::once(kind.as_bytes()).chain(parts.iter().copied()) {
            digest.update((part.len() as u64).to_le_bytes());
            digest.update(part);
        }
        Self(digest.finalize().into())
    }
}

impl std::fmt::Debug for DatabaseKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A few bytes of a digest tell keys apart in a debugger and reveal nothing of the string.
        write!(f, "DatabaseKey({:02x}{:02x}{:02x}{:02x}…)", self.0[0], self.0[1], self.0[2], self.0[3])
    }
}

/// The pools of this process, by the type of pool (one per dialect), database and cap.
type Registry = HashMap<(TypeId, DatabaseKey, usize), Arc<dyn Any + Send + Sync>>;

fn registry() -> &'static Mutex<Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(Mutex::default)
}

static MAX_CONNECTIONS: AtomicUsize = AtomicUsize::new(DEFAULT_MAX_CONNECTIONS);

/// Sets the cap of the pools made from now on (`App` calls it with the validated setting before it builds
/// any source or sink). Pools made before keep their size.
pub fn set_max_connections(cap: usize) {
    MAX_CONNECTIONS.store(cap.clamp(1, MOST_CONNECTIONS_PER_DATABASE), Ordering::SeqCst);
}

/// The most connections one pool (one database) opens: `Sql_Trigger_MaxConnectionsPerDatabase`.
pub fn max_connections() -> usize {
    MAX_CONNECTIONS.load(Ordering::SeqCst)
}

/// The one pool of type `T` of the database `key` names (its connection string's digest), made by `make(cap)`
/// on first request at the cap in force (`make` fails: nothing is kept, and the next request tries again).
pub(crate) fn shared<T: Any + Send + Sync, E>(
    key: DatabaseKey,
    make: impl FnOnce(usize) -> Result<T, E>,
) -> Result<Arc<T>, E> {
    let cap = max_connections();
    let mut registry = registry().lock().unwrap_or_else(PoisonError::into_inner);
    let slot = (TypeId::of::<T>(), key, cap);
    if let Some(pool) = registry.get(&slot).and_then(|p| p.clone().downcast::<T>().ok()) {
        return Ok(pool);
    }
    let pool = Arc::new(make(cap)?);
    registry.insert(slot, pool.clone());
    Ok(pool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cap_is_the_documented_one() {
        assert_eq!(DEFAULT_MAX_CONNECTIONS.to_string(), crate::config::settings::MAX_CONNECTIONS_PER_DATABASE.default);
    }

    #[test]
    fn a_key_tells_connection_strings_apart_and_shows_none() {
        let a = DatabaseKey::of("postgres", &[b"host=a password=secret", b""]);
        assert_eq!(a, DatabaseKey::of("postgres", &[b"host=a password=secret", b""]));
        assert_ne!(a, DatabaseKey::of("postgres", &[b"host=b password=secret", b""]));
        assert_ne!(a, DatabaseKey::of("mssql", &[b"host=a password=secret", b""]));
        // Length prefixes: moving a byte from one part to the next is another key.
        assert_ne!(DatabaseKey::of("k", &[b"ab", b"c"]), DatabaseKey::of("k", &[b"a", b"bc"]));
        assert!(!format!("{a:?}").contains("secret"), "{a:?}");
    }
}
