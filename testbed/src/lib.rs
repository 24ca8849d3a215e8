//! The test bench of sql-pseudo-trigger: what its tests, benchmarks and demo run against. Never shipped, never
//! a normal dependency of the `handler` (its Cargo.toml has it only under dev-dependencies).
//!
//! - [`embedded`]: a real PostgreSQL and a real Azurite, started on loopback from the machine's binaries;
//! - [`driver`]: a strict model of the Azure Functions host for one app folder (readiness, the timer body,
//!   `RetryContext` on every attempt naming the failed one, retry delays, manual runs, output writes, and what
//!   each output binding receives after the host's Newtonsoft re-serialization);
//! - [`demo`]: the whole product end to end (`cargo demo`);
//! - [`faulty`]: a state store that injects faults between the engine and a real store;
//! - [`memory_source`]: an in-memory change source with transactions and a late-commit guard;
//! - [`store_contract`]: the assertions every state store must pass;
//! - [`config`], [`attempts`]: configurations and host attempts for tests that build an engine by hand;
//! - [`chunks`]: a source's backfill chunks read directly, as its tests do.

pub mod attempts;
pub mod chunks;
pub mod config;
pub mod demo;
pub mod driver;
pub mod embedded;
pub mod faulty;
pub mod memory_source;
pub mod store_contract;

pub use faulty::{Fault, FaultyStore, StoreOp};
pub use memory_source::MemorySource;
