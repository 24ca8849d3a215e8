//! Who owns partition `i` of a partitioned function, and until when: the one [`Ownership`] type that the
//! balancer decides on (`balance`), a process's cycle writes (`owners`) and status shows (`App::partition_owners`),
//! and the ownership document it is stored as.
//!
//! Where: `{app}/{group}/owners/partition-{i}-of-{N}.json`, apart from the state document
//! `{app}/{group}/partition-{i}-of-{N}.json`, so balancing never conflicts with a tick's writes (a claim or a
//! renewal is a compare-and-swap on the ownership document's etag, a tick's commit one on the state
//! document's). Each document says who owns the partition and until when (`now + lease`), stamped like the
//! ledger stamps state documents (a fresh `write_id`, `updated_at`); only this wing reads or writes them.

use crate::state::{Etag, StateStore, StoreError};
use serde::{Deserialize, Serialize};
use std::num::NonZeroU32;
use time::OffsetDateTime;

/// The version of the ownership document's shape.
pub(super) const SCHEMA: u32 = 1;

/// One partition's ownership as read: who owns it and until when. `None` fields when there is no document
/// (nobody ever claimed it) or it does not read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Ownership {
    pub partition: u32,
    /// The owning process (`App::owner`); `None`: never owned, or released.
    pub owner: Option<String>,
    /// When the owner's lease ends (a released partition's is its release time).
    #[serde(with = "time::serde::rfc3339::option")]
    pub expires_at: Option<OffsetDateTime>,
    /// How many times the partition changed owner (claims and steals): status shows how much it moved.
    pub claims: u64,
}

impl Ownership {
    /// What `doc` (`None`: no document, or one that does not read) says of `partition`.
    pub(super) fn of(partition: u32, doc: Option<&OwnershipDoc>) -> Self {
        Self {
            partition,
            owner: doc.and_then(|d| d.owner.clone()),
            expires_at: doc.map(|d| d.expires_at),
            claims: doc.map_or(0, |d| d.claims),
        }
    }

    /// The owner while its lease runs at `now`; `None` when the partition is free to claim (never claimed,
    /// released, or its owner stopped renewing: a killed process).
    pub fn holder(&self, now: OffsetDateTime) -> Option<&str> {
        match (&self.owner, self.expires_at) {
            (Some(owner), Some(until)) if until > now => Some(owner),
            _ => None,
        }
    }
}

/// One partition's ownership document, as stored. Written only by `owners`: a claim and a renewal by the owning
/// process, a release on its clean stop.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(super) struct OwnershipDoc {
    pub schema: u32,
    /// The process that owns the partition (`App::owner`, the same id its ticks stamp the state documents
    /// with); `None` once released.
    pub owner: Option<String>,
    /// When the owner's lease ends unless it renews; a released partition's is its release time.
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
    /// How many times the partition changed owner (claims and steals): status shows how much it moved.
    #[serde(default)]
    pub claims: u64,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    /// Fresh on every write, so no two writes are byte-identical and content-hash etags stay unique.
    pub write_id: String,
}

/// The store key of partition `index` of `count` of `group`'s ownership document.
pub fn owner_key(app: &str, group: &str, index: u32, count: NonZeroU32) -> String {
    format!("{app}/{group}/owners/partition-{index}-of-{count}.json")
}

/// Each partition's owner and lease expiry as the ownership documents say now, partition 0 first: what status
/// shows per partition. A document that does not read is reported as unowned (and logged); the next claim
/// replaces it.
pub async fn owners(
    store: &dyn StateStore,
    app: &str,
    group: &str,
    count: NonZeroU32,
) -> Result<Vec<Ownership>, StoreError> {
    // All at once: status waits for one round trip, not N.
    let reads = (0..count.get()).map(|index| async move {
        let doc = read(store, &owner_key(app, group, index, count)).await?.and_then(|(doc, _)| doc);
        Ok(Ownership::of(index, doc.as_ref()))
    });
    futures::future::join_all(reads).await.into_iter().collect()
}

/// Reads one ownership document: `None` when there is none; `Some((None, etag))` when one is there but does not
/// read (a claim may write over it at that etag).
pub(super) async fn read(
    store: &dyn StateStore,
    key: &str,
) -> Result<Option<(Option<OwnershipDoc>, Etag)>, StoreError> {
    let Some(v) = store.load(key).await? else { return Ok(None) };
    let doc = match serde_json::from_slice::<OwnershipDoc>(&v.bytes) {
        Ok(doc) if doc.schema == SCHEMA => Some(doc),
        Ok(doc) => {
            tracing::warn!(
                key,
                schema = doc.schema,
                "ownership document of another schema; taking the partition as free"
            );
            None
        }
        Err(e) => {
            tracing::warn!(key, error = %e, "ownership document does not read; taking the partition as free");
            None
        }
    };
    Ok(Some((doc, v.etag)))
}
