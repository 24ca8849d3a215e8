//! The balancing decision, as pure code: given what every ownership document of a group says and `now`, what
//! one process renews and which one partition (if any) it claims this cycle (`owners` asks it once a cycle).
//! The Event Hubs processor's rules:
//!
//! 1. renew every partition the documents name this process as owner of;
//! 2. count the active owners: every owner of an unexpired lease, this process included;
//! 3. the fair share of `N` partitions over `k` owners is `N / k`, and `N % k` of them may hold one more;
//! 4. a process below its share (or at it while fewer than `N % k` others hold one more) claims one partition:
//!    a free one (never owned, released, or its lease expired) if there is one, else it steals one from the
//!    owner holding the most, and only if that owner holds at least two more than this process (so a steal
//!    always narrows the gap and two processes never trade a partition back and forth);
//! 5. one claim per cycle, so a new process takes partitions over gradually and a race costs one cycle.
//!
//! Why it converges: every claim that lands either takes a free partition or moves one from an owner holding
//! at least two more to one holding less; so the sum over owners of how far each is from its share never
//! grows while the set of owners holds still, and drops with each landed claim. Concurrent claims on one
//! document are settled by the store's compare-and-swap: one lands, the rest do nothing this cycle. While some
//! process is off its share, at least one claim lands per cycle (the tests measure the bound, `tests.rs`).

use super::ownership::Ownership;
use std::collections::BTreeMap;
use time::OffsetDateTime;

#[cfg(test)]
mod tests;

/// What the balancer does this cycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The partitions whose documents name this process (renewed, expired or not: the conditional write fails
    /// if another process took one in the meantime).
    pub renew: Vec<u32>,
    /// The one partition to claim, if this process is below its fair share.
    pub claim: Option<Claim>,
    /// The shares as this process counted them (for the log line).
    pub share: Share,
}

/// A partition to claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub partition: u32,
    /// The live owner it is stolen from; `None` when it was free (never owned, released or expired).
    pub from: Option<String>,
}

/// How the partitions divide among the active owners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// Active owners, this process included.
    pub owners: usize,
    /// `N / owners`: every owner holds at least this many once balanced.
    pub fair: usize,
    /// `N % owners`: how many owners hold one more once balanced.
    pub with_one_more: usize,
    /// What this process holds (its renewals included).
    pub mine: usize,
}

impl Share {
    /// Whether holding `held` partitions is within this share (`fair` or `fair + 1` when some hold one more).
    pub fn fits(&self, held: usize) -> bool {
        held == self.fair || (self.with_one_more > 0 && held == self.fair + 1)
    }
}

/// The balancer's choice for process `me` on the documents `seen` (one per partition of the group) at `now`.
/// `salt` picks among equal candidates (different per process and cycle, so two processes that claim in the
/// same cycle seldom pick the same document).
pub fn plan(me: &str, seen: &[Ownership], now: OffsetDateTime, salt: u64) -> Plan {
    let renew: Vec<u32> = seen.iter().filter(|s| s.owner.as_deref() == Some(me)).map(|s| s.partition).collect();
    // Every owner of a live lease, and what it holds; this process counts with what it renews.
    let mut held: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    held.insert(me, renew.clone());
    for s in seen {
        if let Some(owner) = s.holder(now).filter(|o| *o != me) {
            held.entry(owner).or_default().push(s.partition);
        }
    }
    let n = seen.len();
    let owners = held.len();
    let mine = renew.len();
    let share = Share { owners, fair: n / owners, with_one_more: n % owners, mine };
    let others_with_one_more = held.iter().filter(|(owner, parts)| **owner != me && parts.len() > share.fair).count();
    let below = mine < share.fair || (mine == share.fair && others_with_one_more < share.with_one_more);
    if !below {
        return Plan { renew, claim: None, share };
    }
    let free: Vec<u32> = seen
        .iter()
        .filter(|s| s.owner.as_deref() != Some(me) && s.holder(now).is_none())
        .map(|s| s.partition)
        .collect();
    if !free.is_empty() {
        let partition = free[pick(salt, free.len())];
        return Plan { renew, claim: Some(Claim { partition, from: None }), share };
    }
    // Nothing free: steal from the owner holding the most (the first by name among equals), if it holds at
    // least two more than this process.
    let victim = held
        .iter()
        .filter(|(owner, _)| **owner != me)
        .max_by(|a, b| a.1.len().cmp(&b.1.len()).then_with(|| b.0.cmp(a.0)));
    let claim = victim
        .filter(|(_, parts)| parts.len() >= mine + 2)
        .map(|(owner, parts)| Claim { partition: parts[pick(salt, parts.len())], from: Some(owner.to_string()) });
    Plan { renew, claim, share }
}

/// An index below `len` from `salt` (`len` > 0).
fn pick(salt: u64, len: usize) -> usize {
    (salt % len as u64) as usize
}

/// A salt for [`plan`] from this process's id and its cycle count: FNV-1a, stable across builds.
pub fn salt(me: &str, cycle: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in me.bytes().chain(cycle.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}
