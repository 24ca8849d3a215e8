//! Changing a function's number of partitions (`handler partitions change <function> --to M`), loss-free.
//!
//! The old layout is the function's documents as they are in the store: its one unpartitioned document
//! (`{app}/{group}.json`, N = 1) or its N partition documents (`{app}/{group}/partition-{i}-of-{N}.json`). Each
//! new partition's document starts at the earliest acknowledged checkpoint of the old partitions whose keys it
//! may hold (`plan::feeders`): from an earlier position a change is delivered again (at-least-once allows it),
//! from a later one it would be skipped (never). A span in flight is never a position to start from: the new
//! partitions deliver it again.
//!
//! Nothing is written while anything could lose or skip a change: a live lease on an old document (something
//! may still be running it), quarantined batches of an old partition (no new partition could re-deliver them),
//! an old document missing beside the others (its keys' position is unknown), a paused or halted old document,
//! a new layout that already exists, or checkpoints the source can neither order nor name a position before
//! (`start`).
//!
//! The writes, in this order, each through the ledger's compare-and-swap:
//! 1. each new document is created (a conditional create: two concurrent runs cannot both write one), marked
//!    `seeded` with where its checkpoint came from, batch ids continuing after every id the function's names
//!    gave out (destinations deduplicate on them);
//! 2. each old document is retired: halted with a reason that says where its checkpoint went, so a deployment of
//!    the old layout that comes back stops instead of delivering from a stale checkpoint.
//!
//! A crash between writes leaves new documents it made (known by `seeded`) and old ones not yet retired: a
//! re-run keeps the former, creates what is missing and retires the rest. A re-run after the end finds every
//! old document retired into M and reports the change as done.
//!
//! [`Repartition::change`] runs the steps in order, each in its own file, reading downward: `layout` (where
//! the documents are, and what the store holds), `checks` (every problem, before any write), `start` (where
//! each new partition starts, by `plan`'s arithmetic), `write` (the writes), `report` (what the operator reads).

mod checks;
mod layout;
mod plan;
mod report;
mod request;
mod start;
mod write;

pub use layout::Repartition;
pub use plan::{earliest, feeders};
pub use report::{NewPartition, OldPartition, Report};
pub use request::{RepartitionError, Request};

use crate::config::MAX_PARTITIONS;
use crate::source::Position;
use std::collections::BTreeMap;
use write::Seed;

impl Repartition {
    /// Changes the partition count as `request` says, or refuses with every problem found and writes nothing.
    pub async fn change(&self, request: &Request) -> Result<Report, RepartitionError> {
        let m = request.to.get();
        if m > MAX_PARTITIONS {
            return Err(RepartitionError::refused(vec![format!(
                "--to {m}: a function has at most {MAX_PARTITIONS} partitions"
            )]));
        }
        let now = self.clock.now();
        let mut problems = Vec::new();
        let loaded = self.load_layouts(&mut problems).await.map_err(RepartitionError::store)?;
        if !problems.is_empty() {
            return Err(RepartitionError::refused(problems));
        }
        let n = self.old_layout(request, &loaded)?;
        let empty = BTreeMap::new();
        let old = loaded.get(&n).unwrap_or(&empty);
        let targets = loaded.get(&m).unwrap_or(&empty);

        // Every problem of the old layout, then of the new one; nothing is written unless there is none.
        let quarantine_left = self.check_old_layout(request, (n, m), old, now, &mut problems).await?;
        let plan = self.plan_targets((n, m), targets, &mut problems);

        // Where each new partition starts: no later than every checkpoint of its feeders (`start`).
        let source = self.source.as_ref();
        let stand_in = start::stand_in(source, request.missing_from_earliest, n, old, &mut problems).await;
        let mut starts = start::starts(source, (n, m), old, &stand_in, &mut problems).await;
        if !problems.is_empty() {
            return Err(RepartitionError::refused(problems));
        }

        // The writes: the new documents first, then the old ones retired.
        let Some((template, _)) = old.values().next() else {
            return Err(RepartitionError::refused(vec![format!(
                "the {n}-partition layout has no document left to change from"
            )]));
        };
        // Batch ids of one function name never repeat across layouts: destinations deduplicate on them.
        let last_id = loaded.values().flat_map(|docs| docs.values()).map(|(d, _)| d.next_batch_id()).max().unwrap_or(1);
        let by = format!("operator {}", request.who);
        let seed = Seed { n, m, template, last_id, who: &request.who, by: &by, now };
        let mut written: Vec<String> = Vec::new();
        let mut partitions = Vec::new();
        for (j, target) in plan {
            let start = starts.remove(&j).unwrap_or((Position::Null, Vec::new()));
            partitions.push(self.write_new(&seed, (j, target), start, &mut written).await?);
        }
        let retired = self.retire_old(&seed, old, &mut written).await?;
        let redelivered = report::redelivered(n, m, old, &partitions);
        let already_done = written.is_empty();
        Ok(Report {
            group: self.group.clone(),
            from_partitions: n,
            to_partitions: m,
            partitions,
            retired,
            redelivered,
            quarantine_left,
            already_done,
            next_steps: report::next_steps(&self.group, m),
        })
    }
}
