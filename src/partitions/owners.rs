//! One process's share of a partitioned function under `handler run`: [`Owners`] reads the group's ownership
//! documents (`ownership`), asks the balancer what to renew and claim (`balance`, the Event Hubs processor's
//! rules), writes that, and releases what it holds on a clean stop. The runner (`runner/partitions.rs`) calls
//! [`Owners::cycle`] and runs the tick loops of the partitions it reports owned.
//!
//! Why a steal never loses a change. Ownership only decides which process runs a partition's tick loop; what a
//! tick may do is still decided by the state document: its batch in flight carries its own lease and fencing
//! token, and every write of it is a compare-and-swap. A process that loses a partition stops after the tick
//! in hand, whose batch it delivers and acknowledges (or leaves in flight under its lease), and withdraws the
//! batch it recorded for its next tick. Until then the new owner's ticks meet that lease and answer empty
//! (`OutcomeKind::LeaseHeld`); if the old process dies instead, its batch lease expires and the new owner
//! delivers the batch again with a higher fencing token, which the SQL sinks' fence makes the old one's late
//! write lose to. For at most one balancing cycle after a steal, both processes may tick the partition: every
//! one of those ticks is still a CAS on one document, so they deliver each change at least once, never skip
//! one, and the duplicates are those of a takeover.
//!
//! Under the Functions host none of this runs: each partition is its own timer function, a singleton the host
//! already places on one instance.

use super::balance::{plan, salt, Claim, Share};
use super::ownership::{owner_key, read, Ownership, OwnershipDoc, SCHEMA};
use crate::clock::Clock;
use crate::state::{Etag, StateStore, StoreError};
use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;

#[cfg(test)]
mod tests;

/// What one process knows of a group's ownership documents, and the verbs that change them: a balancing cycle
/// and the release on a clean stop. One per partitioned function per process (`runner`).
#[derive(Debug)]
pub struct Owners {
    store: Arc<dyn StateStore>,
    group: Group,
    me: String,
    lease: time::Duration,
    clock: Arc<dyn Clock>,
    /// The partitions this process holds: its last write of each and that write's etag.
    held: BTreeMap<u32, (Etag, OwnershipDoc)>,
    cycles: u64,
}

/// What one balancing cycle did.
#[derive(Debug, Clone, PartialEq)]
pub struct Cycle {
    /// The partitions this process owns after the cycle: the ones to run.
    pub owned: Vec<u32>,
    /// The partition claimed this cycle, and from whom when it was a steal.
    pub claimed: Option<Claim>,
    /// Partitions this process held and another took since the last cycle, each with the new owner when the
    /// document names one.
    pub lost: Vec<(u32, Option<String>)>,
    /// How the partitions divide, as this cycle counted them (before its claim).
    pub share: Share,
    /// This process was below its share and tried a claim (landed or not): the next cycle should come soon,
    /// so that a process catching up does not wait a full cycle per partition.
    pub catching_up: bool,
}

/// The partitions of one function a process balances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The app's name space (`Sql_Trigger_AppName`).
    pub app: String,
    /// The partitions' group name (`"partitionGroup"`, else the function's folder name).
    pub name: String,
    pub count: NonZeroU32,
    /// The partitions this process serves: all `count` under `handler run` with one folder; the folders
    /// deployed when they were generated one per partition.
    pub served: Vec<u32>,
}

impl Owners {
    /// The ownership of `group`'s served partitions for process `me` (`App::owner`), each claim and renewal
    /// lasting `lease`, on `clock`.
    pub fn new(store: Arc<dyn StateStore>, group: Group, me: &str, lease: Duration, clock: Arc<dyn Clock>) -> Self {
        Self {
            store,
            group,
            me: me.to_string(),
            lease: time::Duration::try_from(lease).unwrap_or(time::Duration::MAX),
            clock,
            held: BTreeMap::new(),
            cycles: 0,
        }
    }

    pub fn group(&self) -> &Group {
        &self.group
    }

    /// The partitions this process holds by what it last wrote, whose leases have not ended at `now`: what
    /// may keep running when a cycle could not reach the store.
    pub fn held_until(&self, now: OffsetDateTime) -> Vec<u32> {
        self.held.iter().filter(|(_, (_, doc))| doc.expires_at > now).map(|(p, _)| *p).collect()
    }

    fn key(&self, index: u32) -> String {
        owner_key(&self.group.app, &self.group.name, index, self.group.count)
    }

    /// One balancing cycle: read every served partition's document, renew this process's own, claim at most
    /// one more (`balance::plan`). A store failure ends the cycle with an error; what this process held stays
    /// held until its leases end ([`Owners::held_until`]).
    pub async fn cycle(&mut self) -> Result<Cycle, StoreError> {
        self.cycles += 1;
        let mut seen = Vec::with_capacity(self.group.served.len());
        let mut etags: BTreeMap<u32, (Option<Etag>, Option<OwnershipDoc>)> = BTreeMap::new();
        // All at once: a cycle waits for one round trip of reads, not N.
        let store = self.store.as_ref();
        let keys: Vec<(u32, String)> = self.group.served.iter().map(|&index| (index, self.key(index))).collect();
        let reads = keys.into_iter().map(|(index, key)| async move { (index, read(store, &key).await) });
        for (index, doc) in futures::future::join_all(reads).await {
            let (doc, etag) = match doc? {
                Some((doc, etag)) => (doc, Some(etag)),
                None => (None, None),
            };
            seen.push(Ownership::of(index, doc.as_ref()));
            etags.insert(index, (etag, doc));
        }
        let now = self.clock.now();
        let plan = plan(&self.me, &seen, now, salt(&self.me, self.cycles));
        let mut lost: Vec<(u32, Option<String>)> = Vec::new();
        // Held by the last cycle, and another owner's now.
        for (&index, _) in self.held.iter() {
            if !plan.renew.contains(&index) {
                let owner = seen.iter().find(|s| s.partition == index).and_then(|s| s.owner.clone());
                lost.push((index, owner));
            }
        }
        let mut held = BTreeMap::new();
        // All renewals at once: the sooner they land, the shorter the window in which a thief's claim and a
        // renewal race for one document.
        let until = now + self.lease;
        let this: &Self = self;
        let renewals = plan.renew.iter().map(|&index| {
            let (etag, doc) = etags.remove(&index).unwrap_or_default();
            let claims = doc.map_or(0, |d| d.claims);
            async move { (index, this.write(index, etag.as_ref(), Some(&this.me), until, claims).await) }
        });
        let mut failed = None;
        for (index, renewed) in futures::future::join_all(renewals).await {
            match renewed {
                Ok(Some(written)) => {
                    held.insert(index, written);
                }
                // Taken between the read and the renewal.
                Ok(None) if self.held.contains_key(&index) => lost.push((index, None)),
                Ok(None) => {}
                Err(e) => {
                    // The renewal may have been applied; until the next cycle knows, the partition stays held
                    // as long as the lease last written for it runs.
                    if let Some(h) = self.held.get(&index) {
                        held.insert(index, h.clone());
                    }
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            self.held = held;
            return Err(e);
        }
        let mut claimed = None;
        if let Some(claim) = &plan.claim {
            let (etag, doc) = etags.remove(&claim.partition).unwrap_or_default();
            let claims = doc.map_or(0, |d| d.claims) + 1;
            match self.write(claim.partition, etag.as_ref(), Some(&self.me), now + self.lease, claims).await {
                Ok(Some(written)) => {
                    held.insert(claim.partition, written);
                    claimed = Some(claim.clone());
                }
                // Another process moved first: no claim this cycle.
                Ok(None) => {}
                Err(e) => {
                    self.held = held;
                    return Err(e);
                }
            }
        }
        self.held = held;
        let catching_up = plan.claim.is_some();
        Ok(Cycle { owned: self.held.keys().copied().collect(), claimed, lost, share: plan.share, catching_up })
    }

    /// Releases every partition this process holds (a clean stop): each document is written unowned, its
    /// lease ending now, so the other processes claim them at their next cycle instead of waiting for the
    /// leases to run out. A partition taken in the meantime is left to its new owner. Returns how many were
    /// released.
    pub async fn release(&mut self) -> Result<usize, StoreError> {
        let now = self.clock.now();
        let mut released = 0;
        for (index, (etag, doc)) in std::mem::take(&mut self.held) {
            if self.write(index, Some(&etag), None, now, doc.claims).await?.is_some() {
                released += 1;
            }
        }
        Ok(released)
    }

    /// Writes partition `index`'s document if it is still at `etag` (`None`: only if there is none); the new
    /// etag and what was written. `Ok(None)`: another process wrote first.
    async fn write(
        &self,
        index: u32,
        etag: Option<&Etag>,
        owner: Option<&str>,
        expires_at: OffsetDateTime,
        claims: u64,
    ) -> Result<Option<(Etag, OwnershipDoc)>, StoreError> {
        let doc = OwnershipDoc {
            schema: SCHEMA,
            owner: owner.map(str::to_string),
            expires_at,
            claims,
            updated_at: self.clock.now(),
            write_id: uuid::Uuid::new_v4().to_string(),
        };
        let bytes = serde_json::to_vec(&doc).expect("ownership documents serialize");
        match self.store.save_if(&self.key(index), &bytes, etag).await {
            Ok(etag) => Ok(Some((etag, doc))),
            Err(StoreError::Conflict) => Ok(None),
            Err(e) => Err(e),
        }
    }
}
