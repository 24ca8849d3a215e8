//! Partitions, in one wing: everything that spans the N partitions of a function. A tick never knows it serves
//! a partition (each partition is a trigger of its own, with its own state document); what spans them is here:
//!
//! - `generate`: `handler partitions generate`, one function folder per partition for the Functions host;
//! - [`change`]: `handler partitions change`, a new partition count seeded loss-free from the old documents;
//! - [`ownership`]: the one type for "who owns partition `i`, until when", and its stored document;
//! - `balance`: the pure balancing rule (the Event Hubs processor's), over [`Ownership`]s and `now`;
//! - [`owners`]: one process's balancing cycle and release, driven by the runner (`runner/partitions.rs`);
//! - [`status`]: a partitioned function's status summed over its partitions, and the replicas it asks for.
//!
//! Reads downward: `owners` → `balance` → `ownership`; `change` and `status` stand on the engine's public
//! verbs (the ledger, the state document, a trigger's status). Nothing in the engine calls back into this wing.
//! The settings (`"partitions"`, `"partition"`, `"partitionGroup"`) are parsed in `config::partition`, with the
//! rest of the configuration: config is plain data, and the sources read [`crate::config::Partition`] from it
//! without depending on this wing.

mod balance;
pub mod change;
pub mod generate;
pub mod owners;
pub mod ownership;
pub mod status;

pub use balance::{Claim, Share};
pub use generate::{generate, GenerateError, Generated};
pub use owners::{Cycle, Group, Owners};
pub use ownership::Ownership;
