//! The engine against its contracts, over in-memory parts from the test bench (`testbed::MemorySource`, a
//! `MemoryStore` behind a `testbed::FaultyStore` per process): no database, no network, manual clocks where
//! time matters. One test binary, one compile.
//!
//! - `deferred`: the failure matrix and acknowledgement by proof (the host's delivery mode);
//! - `sink_mode`: record, deliver, acknowledge; heartbeat, chaining, reconciliation, the fence;
//! - `liveness`: the watchdog's verdicts on a manual clock, the failure streak;
//! - `ops`: operator actions racing ticks;
//! - `repartition`: changing the partition count: where new partitions start, refusals, re-runs;
//! - `runner`: `handler run`'s loop;
//! - `stop`: a clean stop's release of the lease, never another owner's;
//! - `telemetry`: what a tick and a status poll record.

use sql_pseudo_trigger::engine::document::StateDoc;

mod deferred;
mod liveness;
mod ops;
mod repartition;
mod runner;
mod sink_mode;
mod stop;
mod telemetry;

/// A hand edit of a stored state document: its JSON as stored, changed by `edit`, read back. The document's
/// fields are private (outside its own transitions nothing changes them), so a test that stands for an operator
/// editing the stored document by hand edits what is stored.
fn hand_edit(doc: &mut StateDoc, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut json = serde_json::to_value(&*doc).expect("a state document serializes");
    edit(&mut json);
    *doc = serde_json::from_value(json).expect("the edited document reads back");
}
