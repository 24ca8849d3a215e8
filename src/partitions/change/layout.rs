//! Where a function's documents are, layout by layout: [`Repartition`] (the function whose partitions change,
//! its store and source), the name, key and serving function of each partition's document under a partition
//! count, and what the store holds of each layout. The bottom of `change`: every step reads its documents
//! through here.

use crate::clock::Clock;
use crate::config::{Partition, MAX_PARTITIONS};
use crate::engine::document::StateDoc;
use crate::engine::{Ledger, TickError};
use crate::source::Source;
use crate::state::{Etag, StateStore};
use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;
use std::sync::Arc;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

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

/// A stored document and the etag it was read at.
pub(super) type Loaded = (StateDoc, Etag);

/// Every document in the store, by layout (partition count) and partition.
pub(super) type Layouts = BTreeMap<u32, BTreeMap<u32, Loaded>>;

impl Repartition {
    /// The state name of partition `index` of `count` (`count` 1: the unpartitioned document).
    pub(super) fn name(&self, index: u32, count: u32) -> String {
        match NonZeroU32::new(count).filter(|c| c.get() > 1).and_then(|c| Partition::new(index, c)) {
            Some(p) => p.state_name(&self.group),
            None => self.group.clone(),
        }
    }

    /// The function name that serves partition `index` of `count` (its trigger under `handler run`, its folder
    /// under the host): `{group}-p{i}`, or the group itself unpartitioned.
    pub(super) fn function(&self, index: u32, count: u32) -> String {
        match NonZeroU32::new(count).filter(|c| c.get() > 1).and_then(|c| Partition::new(index, c)) {
            Some(p) => p.function_name(&self.group),
            None => self.group.clone(),
        }
    }

    pub(super) fn ledger(&self, index: u32, count: u32) -> Ledger {
        Ledger::new(self.store.clone(), &self.app, &self.name(index, count), self.clock.clone())
    }

    pub(super) fn prefix(&self) -> String {
        format!("{}/{}/", self.app, self.group)
    }

    /// Every layout with a document in the store: partition count → the partitions that have one.
    pub(super) async fn layouts(&self) -> Result<BTreeMap<u32, BTreeSet<u32>>, TickError> {
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

    /// Every document of every layout in the store, read through its ledger. A document that does not read is a
    /// problem (its text in `problems`); a store failure ends the read.
    pub(super) async fn load_layouts(&self, problems: &mut Vec<String>) -> Result<Layouts, TickError> {
        let layouts = self.layouts().await?;
        let mut loaded = Layouts::new();
        for (&count, indexes) in &layouts {
            for &index in indexes {
                let ledger = self.ledger(index, count);
                match ledger.load().await {
                    Ok(Some(doc)) => {
                        loaded.entry(count).or_default().insert(index, doc);
                    }
                    Ok(None) => {}
                    Err(e @ TickError::CorruptState { .. }) => problems.push(e.to_string()),
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(loaded)
    }
}

/// The state name in a store key `{app}/{name}.json`.
fn name_of(key: &str) -> &str {
    let key = key.strip_suffix(".json").unwrap_or(key);
    key.split_once('/').map_or(key, |(_, name)| name)
}

pub(super) fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_else(|_| t.to_string())
}
