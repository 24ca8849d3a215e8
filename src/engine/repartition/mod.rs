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

mod plan;
mod report;
mod start;

pub use plan::{earliest, feeders};
pub use report::{NewPartition, OldPartition, Report};

use super::document::{Origin, Seeded, StateDoc};
use super::error::TickError;
use super::ledger::{Ledger, Saved};
use crate::clock::Clock;
use crate::config::{Partition, MAX_PARTITIONS};
use crate::source::{Position, Source, StartFrom};
use crate::state::{Etag, StateStore};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::num::NonZeroU32;
use std::sync::Arc;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// How often a retirement that lost its compare-and-swap (the old document moved) is tried again.
const RETIRE_ATTEMPTS: usize = 5;

/// The function whose partitions change, and where its documents are.
#[derive(Debug, Clone)]
pub struct Repartition {
    pub store: Arc<dyn StateStore>,
    /// The app's name space in the store.
    pub app: String,
    /// The partitions' group: the function's folder name (or `"partitionGroup"` of its generated folders).
    pub group: String,
    /// The function's source as configured: positions are compared by it, and its fingerprint must be the one
    /// the documents were written for.
    pub source: Arc<dyn Source>,
    pub clock: Arc<dyn Clock>,
}

/// What the operator asked for.
#[derive(Debug, Clone)]
pub struct Request {
    pub to: NonZeroU32,
    /// The layout to change from, when the store holds several.
    pub from: Option<NonZeroU32>,
    /// An old partition without a document starts its keys at the source's earliest position (every change of
    /// them the source still holds is delivered again) instead of refusing.
    pub missing_from_earliest: bool,
    /// The old partitions' quarantined batches were dealt with: they stay in the store, where no new partition
    /// can re-deliver them.
    pub quarantine_handled: bool,
    /// Who asks, for the documents' stamps and the retirement reason.
    pub who: String,
}

/// Why nothing (or not everything) was written.
#[derive(Debug, thiserror::Error)]
pub enum RepartitionError {
    /// Each problem says what to do; `written` lists the documents already written (a re-run finishes).
    #[error("{}", refusal(.problems, .written))]
    Refused { problems: Vec<String>, written: Vec<String> },
    /// The store failed; `written` as above.
    #[error("{}", refusal(&[format!("the state store failed: {}", .error)], .written))]
    Store { error: TickError, written: Vec<String> },
}

fn refusal(problems: &[String], written: &[String]) -> String {
    let mut text = if written.is_empty() {
        "the partition count was not changed; nothing was written:".to_string()
    } else {
        format!(
            "the partition count change stopped midway; written so far: {}. Fix what follows and run the same command again: it keeps what it wrote and finishes:",
            written.join(", ")
        )
    };
    for p in problems {
        let _ = write!(text, "\n- {p}");
    }
    text
}

/// A stored document and the etag it was read at.
type Loaded = (StateDoc, Etag);

/// What is in the store for one new partition.
enum Target {
    /// Nothing, or a document of an earlier, retired layout: written under this etag (`None`: created).
    Write(Option<Etag>),
    /// Written by an earlier run of this change (seeded from the same layout): kept as it is.
    Ours(Box<StateDoc>),
}

impl Repartition {
    /// The state name of partition `index` of `count` (`count` 1: the unpartitioned document).
    fn name(&self, index: u32, count: u32) -> String {
        match NonZeroU32::new(count).filter(|c| c.get() > 1).and_then(|c| Partition::new(index, c)) {
            Some(p) => p.state_name(&self.group),
            None => self.group.clone(),
        }
    }

    /// The function name that serves partition `index` of `count` (its trigger under `handler run`, its folder
    /// under the host): `{group}-p{i}`, or the group itself unpartitioned.
    fn function(&self, index: u32, count: u32) -> String {
        match NonZeroU32::new(count).filter(|c| c.get() > 1).and_then(|c| Partition::new(index, c)) {
            Some(p) => p.function_name(&self.group),
            None => self.group.clone(),
        }
    }

    fn ledger(&self, index: u32, count: u32) -> Ledger {
        Ledger::new(self.store.clone(), &self.app, &self.name(index, count), self.clock.clone())
    }

    fn prefix(&self) -> String {
        format!("{}/{}/", self.app, self.group)
    }

    /// Every layout with a document in the store: partition count → the partitions that have one.
    async fn layouts(&self) -> Result<BTreeMap<u32, BTreeSet<u32>>, TickError> {
        let mut layouts: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
        if self.ledger(0, 1).etag().await?.is_some() {
            layouts.entry(1).or_default().insert(0);
        }
        let prefix = self.prefix();
        for key in self.store.list(&prefix).await? {
            // Only the state documents right under the group: not quarantine documents, nor anything beside.
            let Some(name) = key.strip_prefix(&prefix).and_then(|k| k.strip_suffix(".json")) else { continue };
            let Some((index, count)) = name.strip_prefix("partition-").and_then(|r| r.split_once("-of-")) else {
                continue;
            };
            if let (Ok(index), Ok(count)) = (index.parse::<u32>(), count.parse::<u32>()) {
                if index < count && (2..=MAX_PARTITIONS).contains(&count) && self.name(index, count) == name_of(&key) {
                    layouts.entry(count).or_default().insert(index);
                }
            }
        }
        Ok(layouts)
    }

    /// Changes the partition count as `request` says, or refuses with every problem found and writes nothing.
    pub async fn change(&self, request: &Request) -> Result<Report, RepartitionError> {
        let store = |error: TickError| RepartitionError::Store { error, written: Vec::new() };
        let refuse = |problems: Vec<String>| RepartitionError::Refused { problems, written: Vec::new() };
        let m = request.to.get();
        if m > MAX_PARTITIONS {
            return Err(refuse(vec![format!("--to {m}: a function has at most {MAX_PARTITIONS} partitions")]));
        }
        let now = self.clock.now();
        let layouts = self.layouts().await.map_err(store)?;
        let mut loaded: BTreeMap<u32, BTreeMap<u32, Loaded>> = BTreeMap::new();
        let mut problems = Vec::new();
        for (&count, indexes) in &layouts {
            for &index in indexes {
                let ledger = self.ledger(index, count);
                match ledger.load().await {
                    Ok(Some(doc)) => {
                        loaded.entry(count).or_default().insert(index, doc);
                    }
                    Ok(None) => {}
                    Err(e @ TickError::CorruptState { .. }) => problems.push(e.to_string()),
                    Err(e) => return Err(store(e)),
                }
            }
        }
        if !problems.is_empty() {
            return Err(refuse(problems));
        }
        let n = self.old_layout(request, &loaded)?;
        let empty = BTreeMap::new();
        let old = loaded.get(&n).unwrap_or(&empty);
        let targets = loaded.get(&m).unwrap_or(&empty);

        // Every problem of the old layout, then of the new one; nothing is written unless there is none.
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
                        self.check_old(i, n, doc, now, &mut problems);
                        let quarantined = self.ledger(i, n).list_quarantine().await.map_err(store)?;
                        if !quarantined.is_empty() && !request.quarantine_handled {
                            let ids: Vec<String> =
                                quarantined.iter().filter_map(|k| Ledger::quarantine_batch_id(k)).map(|id| id.to_string()).collect();
                            let function = self.function(i, n);
                            problems.push(format!(
                                "partition {i} of {n} has quarantined batches ({}) under {}: once the partitions change no partition can re-deliver them (`handler state quarantine retry` reads a partition's own quarantine). Re-deliver each with `handler state quarantine retry {function} <batch id>` and let the function run until `handler state show {function}` lists none to retry, or decide they need nothing more; then run again with --quarantine-handled (the documents stay in the store)",
                                ids.join(", "),
                                self.ledger(i, n).quarantine_prefix()
                            ));
                        }
                        quarantine_left.extend(quarantined);
                    }
                },
            }
        }
        let mut plan: Vec<(u32, Target)> = Vec::new();
        for j in 0..m {
            match targets.get(&j) {
                None => plan.push((j, Target::Write(None))),
                Some((doc, _)) if doc.seeded.as_ref().is_some_and(|s| s.from_partitions == n) => {
                    plan.push((j, Target::Ours(Box::new(doc.clone()))))
                }
                Some((doc, etag)) if doc.retired_into().is_some() => plan.push((j, Target::Write(Some(etag.clone())))),
                Some((doc, _)) => problems.push(format!(
                    "the new layout exists already: {} (last written by {} at {}, checkpoint {}) was not made by a change from {n} partitions, so a deployment with {m} partitions may have run from startFrom. Stop it; to seed the {m} partitions from the {n} ones instead, delete the documents under {} named partition-*-of-{m}.json",
                    self.ledger(j, m).key(),
                    doc.updated_by,
                    rfc3339(doc.updated_at),
                    doc.checkpoint,
                    self.prefix()
                )),
            }
        }

        // Where each new partition starts: no later than every checkpoint of its feeders (`start`).
        let earliest_position = if request.missing_from_earliest && (0..n).any(|i| !old.contains_key(&i)) {
            match self.source.start_position(StartFrom::Earliest).await {
                Ok(p) => Some(p),
                Err(e) => {
                    problems.push(format!(
                        "the earliest position of {} could not be read for the partitions without a document: {e}",
                        self.source.name()
                    ));
                    None
                }
            }
        } else {
            None
        };
        let stand_in = earliest_position.unwrap_or(Position::Null);
        let mut starts = start::starts(self.source.as_ref(), (n, m), old, &stand_in, &mut problems).await;
        if !problems.is_empty() {
            return Err(refuse(problems));
        }

        // The writes: the new documents first, then the old ones retired.
        let template = old.values().next().map(|(d, _)| d.clone());
        let Some(template) = template else {
            return Err(refuse(vec![format!("the {n}-partition layout has no document left to change from")]));
        };
        // Batch ids of one function name never repeat across layouts: destinations deduplicate on them.
        let last_id = loaded.values().flat_map(|docs| docs.values()).map(|(d, _)| d.next_batch_id).max().unwrap_or(1);
        let by = format!("operator {}", request.who);
        let mut written: Vec<String> = Vec::new();
        let mut partitions = Vec::new();
        for (j, target) in plan {
            let (start, from) = starts.remove(&j).unwrap_or((Position::Null, Vec::new()));
            let ledger = self.ledger(j, m);
            let (checkpoint, wrote) = match target {
                Target::Ours(doc) => (doc.checkpoint.clone(), false),
                Target::Write(etag) => {
                    let function = self.function(j, m);
                    let origin =
                        Origin { function: &function, source: &template.source, fingerprint: &template.fingerprint };
                    let mut doc = StateDoc::new(origin, start.clone(), &by, now);
                    doc.continue_ids_after(last_id.saturating_sub(1));
                    doc.seed(Seeded {
                        from_partitions: n,
                        from: from.iter().map(|o| o.index).collect(),
                        at: now,
                        by: request.who.clone(),
                    });
                    match ledger.save(&mut doc, etag.as_ref(), &by).await {
                        Ok(Saved::Written(_)) => {
                            written.push(ledger.key().to_string());
                            (start, true)
                        }
                        // Another run of this change created it first: the same seed, kept.
                        Ok(Saved::Conflict) => match ledger.load().await {
                            Ok(Some((doc, _))) if doc.seeded.as_ref().is_some_and(|s| s.from_partitions == n) => {
                                (doc.checkpoint, false)
                            }
                            Ok(_) => {
                                return Err(RepartitionError::Refused {
                                    problems: vec![format!(
                                        "{} was written by someone else while this ran; run this again to see by whom",
                                        ledger.key()
                                    )],
                                    written,
                                })
                            }
                            Err(error) => return Err(RepartitionError::Store { error, written }),
                        },
                        Err(error) => return Err(RepartitionError::Store { error, written }),
                    }
                }
            };
            partitions.push(NewPartition { index: j, key: ledger.key().to_string(), checkpoint, from, written: wrote });
        }
        let detail = format!(
            "at {} by {}: partition layout of {n} replaced; the {m} documents under {} carry its checkpoint on. Deploy the function with \"partitions\": {m}; do not resume this document, which would deliver its keys again from a stale position",
            rfc3339(now),
            request.who,
            if m == 1 { format!("{}/{}.json", self.app, self.group) } else { self.prefix() }
        );
        let mut retired = Vec::new();
        for (&i, (doc, etag)) in old {
            if doc.retired_into().is_some() {
                continue;
            }
            let ledger = self.ledger(i, n);
            let (mut doc, mut etag) = (doc.clone(), etag.clone());
            let mut attempts = 0;
            loop {
                doc.retire(m, &detail);
                match ledger.save(&mut doc, Some(&etag), &by).await {
                    Ok(Saved::Written(_)) => break,
                    Ok(Saved::Conflict) if attempts < RETIRE_ATTEMPTS => {
                        attempts += 1;
                        // It moved since it was read: what it is now must still pass every check.
                        let Some((fresh, fresh_etag)) = ledger
                            .load()
                            .await
                            .map_err(|error| RepartitionError::Store { error, written: written.clone() })?
                        else {
                            break;
                        };
                        if fresh.retired_into() == Some(m) {
                            break;
                        }
                        let mut problems = Vec::new();
                        self.check_old(i, n, &fresh, self.clock.now(), &mut problems);
                        if fresh.retired_into().is_some() {
                            problems.push(format!("partition {i} of {n} was retired by another change while this ran"));
                        }
                        if !problems.is_empty() {
                            return Err(RepartitionError::Refused { problems, written });
                        }
                        (doc, etag) = (fresh, fresh_etag);
                    }
                    Ok(Saved::Conflict) => {
                        return Err(RepartitionError::Refused {
                            problems: vec![format!(
                                "{} kept changing while this ran: stop what writes it, then run this again",
                                ledger.key()
                            )],
                            written,
                        })
                    }
                    Err(error) => return Err(RepartitionError::Store { error, written }),
                }
            }
            written.push(ledger.key().to_string());
            retired.push(ledger.key().to_string());
        }
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

    /// The layout to change from: the one named, else the only one not wholly retired (besides the target), else
    /// (every write done before) the one the target's documents were seeded from.
    fn old_layout(
        &self,
        request: &Request,
        loaded: &BTreeMap<u32, BTreeMap<u32, Loaded>>,
    ) -> Result<u32, RepartitionError> {
        let m = request.to.get();
        let refuse = |p: String| RepartitionError::Refused { problems: vec![p], written: Vec::new() };
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
                    .filter_map(|(d, _)| d.seeded.as_ref().map(|s| s.from_partitions))
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

    /// The problems of old partition `i` of `n`, a document not retired, read at `now`.
    fn check_old(&self, i: u32, n: u32, doc: &StateDoc, now: OffsetDateTime, problems: &mut Vec<String>) {
        let function = self.function(i, n);
        let configured = self.source.fingerprint();
        if doc.fingerprint != configured {
            problems.push(format!(
                "partition {i} of {n} was written for another source (fingerprint {}, configured {configured}): its positions mean nothing to the configured source. Put back the configuration it was written for, or start over with `handler state reset {function} --to earliest|now --confirm`",
                doc.fingerprint
            ));
        }
        if let Some(lease) = doc.lease.as_ref().filter(|l| l.expires_at > now) {
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
        if let Some(b) = doc.backfill.as_ref().filter(|b| b.open()) {
            problems.push(format!(
                "partition {i} of {n} has backfill {} open ({} row(s) delivered so far), and a backfill's position (a key of this layout's partition) is not carried over to new partitions: let it finish (`handler state status {function}` shows its progress), or cancel it (`handler state backfill {function} --cancel`) and start it again after the change, then stop the function and run this again",
                b.id, b.rows
            ));
        }
        let mut queued = doc.retry_quarantined.clone();
        if let Some(f) = doc.in_flight.as_ref().filter(|f| f.quarantined.is_some()) {
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

/// The state name in a store key `{app}/{name}.json`.
fn name_of(key: &str) -> &str {
    let key = key.strip_suffix(".json").unwrap_or(key);
    key.split_once('/').map_or(key, |(_, name)| name)
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_else(|_| t.to_string())
}
