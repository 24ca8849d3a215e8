//! Everything that could make a change lose or skip a change, found before anything is written: which layout
//! to change from, the problems of each old partition's document (a live lease, a pause, a halt, an open
//! backfill, quarantined batches, another source's fingerprint), and what is already in the store for each new
//! partition. Each problem says what to do; `change` writes nothing unless there is none.

use super::layout::{rfc3339, Layouts, Loaded, Repartition};
use super::request::{RepartitionError, Request};
use crate::engine::document::StateDoc;
use crate::engine::Ledger;
use crate::state::Etag;
use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;
use time::OffsetDateTime;

/// What is in the store for one new partition.
pub(super) enum Target {
    /// Nothing, or a document of an earlier, retired layout: written under this etag (`None`: created).
    Write(Option<Etag>),
    /// Written by an earlier run of this change (seeded from the same layout): kept as it is.
    Ours(Box<StateDoc>),
}

impl Repartition {
    /// The layout to change from: the one named, else the only one not wholly retired (besides the target), else
    /// (every write done before) the one the target's documents were seeded from.
    pub(super) fn old_layout(&self, request: &Request, loaded: &Layouts) -> Result<u32, RepartitionError> {
        let m = request.to.get();
        let refuse = |p: String| RepartitionError::refused(vec![p]);
        let describe = || {
            let layouts: Vec<String> = loaded
                .iter()
                .map(|(n, docs)| {
                    let retired = docs.values().filter(|(d, _)| d.retired_into().is_some()).count();
                    format!("{n} partition(s): {} document(s), {retired} retired", docs.len())
                })
                .collect();
            if layouts.is_empty() {
                "none".to_string()
            } else {
                layouts.join("; ")
            }
        };
        if let Some(from) = request.from.map(NonZeroU32::get) {
            if from == m {
                return Err(refuse(format!("--from {from} and --to {m} name the same layout: nothing to change")));
            }
            if !loaded.contains_key(&from) {
                return Err(refuse(format!(
                    "no state document of a {from}-partition layout of {} is in the store (layouts found under {}: {})",
                    self.group,
                    self.prefix(),
                    describe()
                )));
            }
            return Ok(from);
        }
        let live: Vec<u32> = loaded
            .iter()
            .filter(|(n, docs)| **n != m && docs.values().any(|(d, _)| d.retired_into().is_none()))
            .map(|(n, _)| *n)
            .collect();
        match live[..] {
            [n] => Ok(n),
            [] => {
                let seeded: BTreeSet<u32> = loaded
                    .get(&m)
                    .into_iter()
                    .flat_map(|docs| docs.values())
                    .filter_map(|(d, _)| d.seeded().map(|s| s.from_partitions))
                    .collect();
                let in_use = loaded.get(&m).is_some_and(|docs| docs.values().any(|(d, _)| d.retired_into().is_none()));
                match seeded.iter().next() {
                    Some(&n) if seeded.len() == 1 && loaded.contains_key(&n) => Ok(n),
                    _ if in_use => Err(refuse(format!(
                        "{} already runs with {m} partition(s) (layouts found: {}): nothing to change",
                        self.group,
                        describe()
                    ))),
                    _ if loaded.is_empty() => Err(refuse(format!(
                        "{} has no state documents ({}/{}.json, {}partition-*-of-*.json): it has not run, so nothing needs carrying over. Set \"partitions\" to {m} in its folder and start it",
                        self.group,
                        self.app,
                        self.group,
                        self.prefix()
                    ))),
                    _ => Err(refuse(format!(
                        "{} has no layout in use to change into {m} partitions (layouts found: {}); name one with --from N",
                        self.group,
                        describe()
                    ))),
                }
            }
            _ => Err(refuse(format!(
                "several partition layouts of {} are in the store ({}): name the one the deployment runs with --from N",
                self.group,
                describe()
            ))),
        }
    }

    /// The problems of every partition of the old layout (`n` partitions, `old` their documents) on the way to
    /// `m`, read at `now`; the quarantine documents the old partitions leave in the store.
    pub(super) async fn check_old_layout(
        &self,
        request: &Request,
        (n, m): (u32, u32),
        old: &BTreeMap<u32, Loaded>,
        now: OffsetDateTime,
        problems: &mut Vec<String>,
    ) -> Result<Vec<String>, RepartitionError> {
        let mut quarantine_left = Vec::new();
        for i in 0..n {
            match old.get(&i) {
                None if !request.missing_from_earliest => problems.push(format!(
                    "partition {i} of {n} has no state document ({}) while the others have one: where its keys stopped is unknown. If it never ran, or its document was deleted, run again with --missing-from-earliest: its keys then start from the earliest change the source still holds, and every such change of them is delivered again",
                    self.ledger(i, n).key()
                )),
                None => {}
                Some((doc, _)) => match doc.retired_into() {
                    Some(into) if into == m => {}
                    Some(into) => problems.push(format!(
                        "partition {i} of {n} was already retired by a change into {into} partitions that did not finish: finish that one with `handler partitions change {} --to {into}`",
                        self.group
                    )),
                    None => {
                        self.check_old(i, n, doc, now, problems);
                        let quarantined = self.ledger(i, n).list_quarantine().await.map_err(RepartitionError::store)?;
                        if !quarantined.is_empty() && !request.quarantine_handled {
                            problems.push(self.quarantined(i, n, &quarantined));
                        }
                        quarantine_left.extend(quarantined);
                    }
                },
            }
        }
        Ok(quarantine_left)
    }

    /// The problem of old partition `i` of `n` leaving the quarantine documents `keys` behind.
    fn quarantined(&self, i: u32, n: u32, keys: &[String]) -> String {
        let ids: Vec<String> =
            keys.iter().filter_map(|k| Ledger::quarantine_batch_id(k)).map(|id| id.to_string()).collect();
        let function = self.function(i, n);
        format!(
            "partition {i} of {n} has quarantined batches ({}) under {}: once the partitions change no partition can re-deliver them (`handler state quarantine retry` reads a partition's own quarantine). Re-deliver each with `handler state quarantine retry {function} <batch id>` and let the function run until `handler state show {function}` lists none to retry, or decide they need nothing more; then run again with --quarantine-handled (the documents stay in the store)",
            ids.join(", "),
            self.ledger(i, n).quarantine_prefix()
        )
    }

    /// What to do for each new partition `j` of `m`, given what the store holds of the new layout (`targets`):
    /// write it, or keep what an earlier run of this change from `n` wrote. A document the change did not write
    /// is a problem.
    pub(super) fn plan_targets(
        &self,
        (n, m): (u32, u32),
        targets: &BTreeMap<u32, Loaded>,
        problems: &mut Vec<String>,
    ) -> Vec<(u32, Target)> {
        let mut plan: Vec<(u32, Target)> = Vec::new();
        for j in 0..m {
            match targets.get(&j) {
                None => plan.push((j, Target::Write(None))),
                Some((doc, _)) if doc.seeded().is_some_and(|s| s.from_partitions == n) => {
                    plan.push((j, Target::Ours(Box::new(doc.clone()))))
                }
                Some((doc, etag)) if doc.retired_into().is_some() => plan.push((j, Target::Write(Some(etag.clone())))),
                Some((doc, _)) => problems.push(format!(
                    "the new layout exists already: {} (last written by {} at {}, checkpoint {}) was not made by a change from {n} partitions, so a deployment with {m} partitions may have run from startFrom. Stop it; to seed the {m} partitions from the {n} ones instead, delete the documents under {} named partition-*-of-{m}.json",
                    self.ledger(j, m).key(),
                    doc.updated_by(),
                    rfc3339(doc.updated_at()),
                    doc.checkpoint(),
                    self.prefix()
                )),
            }
        }
        plan
    }

    /// The problems of old partition `i` of `n`, a document not retired, read at `now`.
    pub(super) fn check_old(&self, i: u32, n: u32, doc: &StateDoc, now: OffsetDateTime, problems: &mut Vec<String>) {
        let function = self.function(i, n);
        let configured = self.source.fingerprint();
        if doc.fingerprint() != configured {
            problems.push(format!(
                "partition {i} of {n} was written for another source (fingerprint {}, configured {configured}): its positions mean nothing to the configured source. Put back the configuration it was written for, or start over with `handler state reset {function} --to earliest|now --confirm`",
                doc.fingerprint()
            ));
        }
        if let Some(lease) = doc.lease().filter(|l| l.expires_at > now) {
            problems.push(format!(
                "partition {i} of {n} is leased to {} until {}: something may still be running it. Stop the function first (under the Functions host disable its partition functions, {}; under `handler run` stop its processes), or wait until the lease expires at {}, then run this again",
                lease.owner,
                rfc3339(lease.expires_at),
                if n == 1 { function.clone() } else { format!("{}-p0 … {}-p{}", self.group, self.group, n - 1) },
                rfc3339(lease.expires_at)
            ));
        }
        if doc.paused() {
            problems.push(format!(
                "partition {i} of {n} is paused by an operator, and a pause is not carried over to new partitions: resume it (`handler state resume {function}`) and stop the function instead, then run this again"
            ));
        }
        if let Some(reason) = doc.halted() {
            problems.push(format!(
                "partition {i} of {n} is halted ({reason}): deal with that batch and `handler state resume {function}`, let it deliver, stop the function, then run this again"
            ));
        }
        if let Some(b) = doc.backfill().filter(|b| b.open()) {
            problems.push(format!(
                "partition {i} of {n} has backfill {} open ({} row(s) delivered so far), and a backfill's position (a key of this layout's partition) is not carried over to new partitions: let it finish (`handler state status {function}` shows its progress), or cancel it (`handler state backfill {function} --cancel`) and start it again after the change, then stop the function and run this again",
                b.id, b.rows
            ));
        }
        let mut queued = doc.retry_quarantined().to_vec();
        if let Some(f) = doc.in_flight().filter(|f| f.quarantined.is_some()) {
            queued.insert(0, f.range.batch_id);
        }
        if !queued.is_empty() {
            let ids: Vec<String> = queued.iter().map(u64::to_string).collect();
            problems.push(format!(
                "partition {i} of {n} has quarantined batches queued for re-delivery ({}): let the function run until `handler state show {function}` lists none to retry, then stop it and run this again",
                ids.join(", ")
            ));
        }
    }
}
