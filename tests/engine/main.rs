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

mod deferred;
mod liveness;
mod ops;
mod repartition;
mod runner;
mod sink_mode;
mod stop;
mod telemetry;
