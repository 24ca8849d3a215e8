//! The ledger: the only code that reads and writes a function's state document and its quarantine documents.
//! Ticks, operator actions (`ops`) and the sink tick's heartbeat all go through it, so every write is typed,
//! stamped (a fresh `write_id`, `updated_at` from the engine's clock, `updated_by`) and a compare-and-swap on
//! the etag the writer read, and every read checks the schema.

use super::document::{QuarantineDoc, StateDoc};
use super::error::TickError;
use crate::change::Change;
use crate::clock::Clock;
use crate::state::{Etag, StateStore, StoreError};
use std::sync::Arc;

/// Where a function's documents live, and who writes them from this process.
#[derive(Debug)]
pub struct Ledger {
    store: Arc<dyn StateStore>,
    app: String,
    /// `{app}/{function}.json`, or `{app}/{group}/partition-{i}-of-{N}.json` for a partition.
    key: String,
    /// `{app}/{function}/quarantine/` (a partition's under its own name).
    quarantine_prefix: String,
    clock: Arc<dyn Clock>,
}

/// What a conditional write met.
#[derive(Debug)]
pub enum Saved {
    /// Written; the document's new etag.
    Written(Etag),
    /// Another writer moved first (the etag was not the one read): nothing written.
    Conflict,
}

impl Ledger {
    /// The documents of `name` (a function's name, or a partition's [`crate::config::FunctionConfig::state_name`])
    /// in `app_name`'s name space.
    pub fn new(store: Arc<dyn StateStore>, app_name: &str, name: &str, clock: Arc<dyn Clock>) -> Self {
        Self {
            store,
            app: app_name.to_string(),
            key: format!("{app_name}/{name}.json"),
            quarantine_prefix: format!("{app_name}/{name}/quarantine/"),
            clock,
        }
    }

    /// The same documents, reading the time from `clock` (tests).
    pub fn with_clock(&self, clock: Arc<dyn Clock>) -> Self {
        Self {
            store: self.store.clone(),
            app: self.app.clone(),
            key: self.key.clone(),
            quarantine_prefix: self.quarantine_prefix.clone(),
            clock,
        }
    }

    /// Requests this process's state store has sent so far (status, and a tick's cost in its log line).
    pub fn store_operations(&self) -> u64 {
        self.store.operations()
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    /// The app name space of the state key.
    pub fn app(&self) -> &str {
        &self.app
    }

    pub fn quarantine_prefix(&self) -> &str {
        &self.quarantine_prefix
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The state document and its etag; `None` when the function has none yet.
    pub async fn load(&self) -> Result<Option<(StateDoc, Etag)>, TickError> {
        let Some(v) = self.store.load(&self.key).await? else { return Ok(None) };
        parse(&self.key, &v.bytes).map(|doc| Some((doc, v.etag)))
    }

    /// The state document as it reads with its types alone, without the checks that refuse a hand-edited one:
    /// for an operator's reset, which then keeps its batch ids and counters. `None` when there is none or it
    /// does not read even so.
    pub async fn load_unchecked(&self) -> Result<Option<(StateDoc, Etag)>, TickError> {
        let Some(v) = self.store.load(&self.key).await? else { return Ok(None) };
        Ok(serde_json::from_slice(&v.bytes).ok().map(|doc| (doc, v.etag)))
    }

    /// The stored document's etag, whether or not it parses (an operator's reset replaces a corrupt one).
    pub async fn etag(&self) -> Result<Option<Etag>, TickError> {
        Ok(self.store.load(&self.key).await?.map(|v| v.etag))
    }

    /// Writes `doc` if the stored document is still at `etag` (`None`: only if there is none), stamped as
    /// written by `by` now. Store failures other than a lost race are errors (a failed write may have been
    /// applied: the caller reads again before it decides anything more).
    pub async fn save(&self, doc: &mut StateDoc, etag: Option<&Etag>, by: &str) -> Result<Saved, TickError> {
        let bytes = self.stamp(doc, by);
        match self.store.save_if(&self.key, &bytes, etag).await {
            Ok(etag) => Ok(Saved::Written(etag)),
            Err(StoreError::Conflict) => Ok(Saved::Conflict),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether the stored document is the very write of `doc` (same `write_id`): how a writer whose store
    /// call failed learns that the write was applied after all. Its etag when it is.
    pub async fn find_own_write(&self, doc: &StateDoc) -> Option<Etag> {
        let stored = self.store.load(&self.key).await.ok()??;
        let parsed = parse(&self.key, &stored.bytes).ok()?;
        (parsed.write_id() == doc.write_id()).then_some(stored.etag)
    }

    /// Marks a write of `doc` by `by` (a fresh `write_id`, so no two writes are byte-identical and content-hash
    /// etags stay unique) and serializes it.
    fn stamp(&self, doc: &mut StateDoc, by: &str) -> Vec<u8> {
        doc.stamp(by, self.clock.now());
        serde_json::to_vec(doc).expect("state documents serialize")
    }

    /// The batch id in a quarantine document's key (`.../quarantine/{id:020}.json`).
    pub fn quarantine_batch_id(key: &str) -> Option<u64> {
        key.rsplit('/').next()?.strip_suffix(".json")?.parse().ok()
    }

    /// The store key of batch `batch_id`'s quarantine document.
    pub fn quarantine_key(&self, batch_id: u64) -> String {
        format!("{}{:020}.json", self.quarantine_prefix, batch_id)
    }

    /// Writes a quarantine document, once: a document already there (written by an earlier tick that then
    /// lost the race to commit) is the same batch and stays.
    pub async fn write_quarantine(&self, doc: &QuarantineDoc) -> Result<String, TickError> {
        let key = self.quarantine_key(doc.batch_id);
        let bytes = serde_json::to_vec(doc).expect("quarantine documents serialize");
        match self.store.save_if(&key, &bytes, None).await {
            Ok(_) | Err(StoreError::Conflict) => Ok(key),
            Err(e) => Err(e.into()),
        }
    }

    /// Reads a quarantine document by key.
    pub async fn load_quarantine(&self, key: &str) -> Result<QuarantineDoc, TickError> {
        let Some(v) = self.store.load(key).await? else {
            return Err(TickError::CorruptQuarantine {
                key: key.to_string(),
                detail: "the quarantine document is missing".into(),
            });
        };
        QuarantineDoc::read(&v.bytes).map_err(|detail| TickError::CorruptQuarantine { key: key.to_string(), detail })
    }

    /// A quarantine document by key with its changes decoded: what re-delivering a quarantined batch needs.
    pub async fn load_quarantined_batch(&self, key: &str) -> Result<(QuarantineDoc, Vec<Change>), TickError> {
        let doc = self.load_quarantine(key).await?;
        let changes =
            doc.decode_changes().map_err(|detail| TickError::CorruptQuarantine { key: key.to_string(), detail })?;
        Ok((doc, changes))
    }

    /// The keys of every quarantine document of the function, oldest batch first.
    pub async fn list_quarantine(&self) -> Result<Vec<String>, TickError> {
        Ok(self.store.list(&self.quarantine_prefix).await?)
    }
}

/// Reads a state document back, refusing one that is not what a handler of this version wrote (see
/// `document::read`): the error names the field, and nothing is written over it.
fn parse(key: &str, bytes: &[u8]) -> Result<StateDoc, TickError> {
    super::document::read(bytes).map_err(|detail| TickError::CorruptState {
        function: function_of(key),
        key: key.to_string(),
        detail,
    })
}

/// The function whose document `key` is, as the CLI knows it: `{app}/{function}.json` names the function, and a
/// partition's `{app}/{group}/partition-{i}-of-{N}.json` names the trigger that serves it (`{group}-p{i}`), not
/// the document's file name, which no command accepts.
fn function_of(key: &str) -> String {
    let stem = key.trim_end_matches(".json");
    let mut parts = stem.rsplit('/');
    let (last, group) = (parts.next().unwrap_or(stem), parts.next());
    let partition = last.strip_prefix("partition-").and_then(|rest| rest.split_once("-of-")).and_then(|(i, n)| {
        let count = n.parse().ok().and_then(std::num::NonZeroU32::new)?;
        crate::config::Partition::new(i.parse().ok()?, count)
    });
    match (partition, group) {
        (Some(p), Some(group)) => p.function_name(group),
        _ => last.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_damaged_document_names_the_function_the_cli_knows_a_partitions_trigger_for_a_partition() {
        let damaged = |key: &str| match parse(key, b"{not json") {
            Err(TickError::CorruptState { function, .. }) => function,
            other => panic!("{key}: expected a damaged-state error, got {other:?}"),
        };
        assert_eq!(damaged("app/OrdersChanged.json"), "OrdersChanged");
        assert_eq!(damaged("app/OrdersChanged/partition-1-of-4.json"), "OrdersChanged-p1");
        // Not a partition's name (an index past the count): the file's own name, as before.
        assert_eq!(damaged("app/OrdersChanged/partition-4-of-4.json"), "partition-4-of-4");
    }
}
