//! Resuming from the destination: a state document that has acknowledged nothing asks the sink what it
//! recorded (see "Resuming from the destination" in the sink tick's module docs).

use super::super::document::Lease;
use super::super::{Memory, TickError, TickOutcome, Trigger};
use crate::sink::{Resume, Sink};

impl Trigger {
    /// See "Resuming from the destination" in the module docs. Leaves `out` to be delivered as it is (its
    /// lease token raised, or replaced by a conflict when another instance moved first), or answers the lines
    /// that say where the document was moved, after which the tick starts again.
    pub(super) async fn reconcile(
        &self,
        memory: &mut Memory,
        sink: &dyn Sink,
        out: &mut TickOutcome,
    ) -> Result<Option<Vec<String>>, TickError> {
        let Some((doc, _)) = out.committed.as_ref() else { return Ok(None) };
        let Some(flight) = doc.in_flight.as_ref() else { return Ok(None) };
        let acknowledged_nothing = doc.counters.batches == 0 && doc.counters.quarantined == 0;
        if out.batch_id.is_none() || !acknowledged_nothing || flight.quarantined.is_some() {
            return Ok(None);
        }
        let Some(Resume { fence, applied }) =
            sink.resume_position(self.app(), &self.config.name).await.map_err(TickError::Sink)?
        else {
            return Ok(None);
        };
        let this_batch =
            |a: &crate::sink::Applied| a.batch_id == flight.batch_id && a.from == flight.from && a.to == flight.to;
        let moved = applied.filter(|a| a.to != flight.from && !this_batch(a));
        if moved.is_none() && fence <= out.fence {
            return Ok(None);
        }

        let (mut doc, etag) = out.committed.take().expect("checked above");
        let now = self.clock().now();
        let ours = out.fence;
        let line = match &moved {
            // The document's lineage is new: its token goes above anything the destination saw, so a writer of
            // the earlier lineage that still holds a batch is refused.
            Some(applied) => {
                let flight = doc.in_flight.take().expect("checked above");
                doc.checkpoint = applied.to.clone();
                doc.next_batch_id = doc.next_batch_id.max(applied.batch_id + 1);
                doc.progress_at = Some(now);
                // Released at once: the next fetch takes it again and keeps the token (same owner).
                doc.lease = Some(Lease { owner: self.owner.clone(), token: ours.max(fence) + 1, expires_at: now });
                format!(
                    "the state document has acknowledged nothing, but {} records batch {} as applied up to {}: continuing after it, under fencing token {} (the {} change(s) fetched after {} are dropped undelivered)",
                    sink.describe(),
                    applied.batch_id,
                    applied.to,
                    ours.max(fence) + 1,
                    flight.rows,
                    flight.from
                )
            }
            // The batch recorded stays as it is (its id and range name it to an exactly-once sink): only the
            // token moves above the destination's.
            None => {
                if let Some(lease) = doc.lease.as_mut() {
                    lease.token = fence + 1;
                }
                format!(
                    "{} holds fencing token {fence}, above this state document's {ours}: a new state document restarted the tokens; batch {} goes under token {}",
                    sink.describe(),
                    out.batch_id.unwrap_or_default(),
                    fence + 1
                )
            }
        };
        tracing::warn!(function = %self.config.name, "{line}");
        let mut rewritten = TickOutcome::default();
        if !self.commit(memory, &mut doc, Some(&etag), &mut rewritten).await? {
            *out = rewritten;
            return Ok(None);
        }
        if moved.is_some() {
            return Ok(Some(vec![line]));
        }
        out.fence = fence + 1;
        out.committed = rewritten.committed;
        out.logs.insert(0, line);
        Ok(None)
    }
}
