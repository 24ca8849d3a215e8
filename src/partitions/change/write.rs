//! The writes of a change, in this order, each through the ledger's compare-and-swap: each new document
//! created (or kept, when an earlier run of this change wrote it), then each old document retired. `written`
//! collects the keys written so far, so that a refusal or a store failure midway names them (a re-run keeps
//! them and finishes).

use super::checks::Target;
use super::layout::{rfc3339, Loaded, Repartition};
use super::report::{NewPartition, OldPartition};
use super::request::RepartitionError;
use crate::engine::document::{Origin, Seeded, StateDoc};
use crate::engine::Saved;
use crate::source::Position;
use crate::state::Etag;
use std::collections::BTreeMap;
use time::OffsetDateTime;

/// How often a retirement that lost its compare-and-swap (the old document moved) is tried again.
const RETIRE_ATTEMPTS: usize = 5;

/// What every write of one change is made from.
pub(super) struct Seed<'a> {
    /// The old layout's partition count.
    pub n: u32,
    /// The new layout's partition count.
    pub m: u32,
    /// An old document: the new documents carry its source and fingerprint.
    pub template: &'a StateDoc,
    /// The highest next batch id any of the function's documents gave out: new documents continue after it.
    pub last_id: u64,
    /// Who asks (`Request::who`), and the stamp of the documents it writes (`operator {who}`).
    pub who: &'a str,
    pub by: &'a str,
    pub now: OffsetDateTime,
}

impl Repartition {
    /// Writes (or keeps) new partition `j`'s document as `target` says, starting at `start`, fed by `from`.
    pub(super) async fn write_new(
        &self,
        seed: &Seed<'_>,
        (j, target): (u32, Target),
        (start, from): (Position, Vec<OldPartition>),
        written: &mut Vec<String>,
    ) -> Result<NewPartition, RepartitionError> {
        let (n, m) = (seed.n, seed.m);
        let ledger = self.ledger(j, m);
        let (checkpoint, wrote) = match target {
            Target::Ours(doc) => (doc.checkpoint().clone(), false),
            Target::Write(etag) => {
                let function = self.function(j, m);
                let origin = Origin {
                    function: &function,
                    source: seed.template.source(),
                    fingerprint: seed.template.fingerprint(),
                };
                let mut doc = StateDoc::new(origin, start.clone(), seed.by, seed.now);
                doc.continue_ids_after(seed.last_id.saturating_sub(1));
                doc.seed(Seeded {
                    from_partitions: n,
                    from: from.iter().map(|o| o.index).collect(),
                    at: seed.now,
                    by: seed.who.to_string(),
                });
                match ledger.save(&mut doc, etag.as_ref(), seed.by).await {
                    Ok(Saved::Written(_)) => {
                        written.push(ledger.key().to_string());
                        (start, true)
                    }
                    // Another run of this change created it first: the same seed, kept.
                    Ok(Saved::Conflict) => match ledger.load().await {
                        Ok(Some((doc, _))) if doc.seeded().is_some_and(|s| s.from_partitions == n) => {
                            (doc.checkpoint().clone(), false)
                        }
                        Ok(_) => {
                            return Err(RepartitionError::Refused {
                                problems: vec![format!(
                                    "{} was written by someone else while this ran; run this again to see by whom",
                                    ledger.key()
                                )],
                                written: std::mem::take(written),
                            })
                        }
                        Err(error) => return Err(RepartitionError::Store { error, written: std::mem::take(written) }),
                    },
                    Err(error) => return Err(RepartitionError::Store { error, written: std::mem::take(written) }),
                }
            }
        };
        Ok(NewPartition { index: j, key: ledger.key().to_string(), checkpoint, from, written: wrote })
    }

    /// Retires every old document not retired yet (`old`, the layout of `seed.n`): halted with a reason that
    /// says where its checkpoint went. The keys retired.
    pub(super) async fn retire_old(
        &self,
        seed: &Seed<'_>,
        old: &BTreeMap<u32, Loaded>,
        written: &mut Vec<String>,
    ) -> Result<Vec<String>, RepartitionError> {
        let m = seed.m;
        let detail = format!(
            "at {} by {}: partition layout of {} replaced; the {m} documents under {} carry its checkpoint on. Deploy the function with \"partitions\": {m}; do not resume this document, which would deliver its keys again from a stale position",
            rfc3339(seed.now),
            seed.who,
            seed.n,
            if m == 1 { format!("{}/{}.json", self.app, self.group) } else { self.prefix() }
        );
        let mut retired = Vec::new();
        for (&i, (doc, etag)) in old {
            if doc.retired_into().is_some() {
                continue;
            }
            let key = self.retire(seed, i, (doc.clone(), etag.clone()), &detail, written).await?;
            written.push(key.clone());
            retired.push(key);
        }
        Ok(retired)
    }

    /// Retires old partition `i`, read as `loaded`; when it moved since (a lost compare-and-swap), again on what
    /// it is now, which must still pass every check. Its key.
    async fn retire(
        &self,
        seed: &Seed<'_>,
        i: u32,
        loaded: Loaded,
        detail: &str,
        written: &mut Vec<String>,
    ) -> Result<String, RepartitionError> {
        let (n, m) = (seed.n, seed.m);
        let ledger = self.ledger(i, n);
        let (mut doc, mut etag): (StateDoc, Etag) = loaded;
        let mut attempts = 0;
        loop {
            doc.retire(m, detail);
            match ledger.save(&mut doc, Some(&etag), seed.by).await {
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
                        return Err(RepartitionError::Refused { problems, written: std::mem::take(written) });
                    }
                    (doc, etag) = (fresh, fresh_etag);
                }
                Ok(Saved::Conflict) => {
                    return Err(RepartitionError::Refused {
                        problems: vec![format!(
                            "{} kept changing while this ran: stop what writes it, then run this again",
                            ledger.key()
                        )],
                        written: std::mem::take(written),
                    })
                }
                Err(error) => return Err(RepartitionError::Store { error, written: std::mem::take(written) }),
            }
        }
        Ok(ledger.key().to_string())
    }
}
