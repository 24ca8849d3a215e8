//! SQL Server and Azure SQL sources: change tracking (the official trigger's mechanism) and rowversion
//! polling (for tables where change tracking cannot be turned on).
//!
//! Structure, as in the PostgreSQL source: every statement is built in `sql` from validated, quoted names;
//! the table is discovered and checked on first use (`catalog` reads, `schema` decides, each failure with a
//! message that says what to run); positions are opaque JSON (`position`); `Item` JSON is built by SQL
//! Server with `FOR JSON PATH` (exact numerics, ISO 8601 dates, binary as base64, like the official
//! trigger). `connect` owns connection strings, Entra ID tokens, the pool and the retry table.
//!
//! Unlike the official trigger there is no `az_func` schema, no lease table and no database-wide
//! `sp_getapplock`: the engine's state store holds the position and the lease, so the database only sees
//! reads, and functions on one database never serialize each other.

mod catalog;
mod change_tracking;
mod connect;
mod options;
mod position;
mod rowversion;
mod schema;
mod sql;
mod types;

pub use change_tracking::MssqlChangeTracking;
/// The connection layer, for other SQL Server users in the crate (the upsert sink): `Pool::execute` retries a
/// whole statement on transient failures, which is safe for reads and for atomic, idempotent batches only,
/// and answers a [`Failed`] statement for the caller to word; `describe` is the sources' wording.
pub use connect::{describe, Auth, Failed, Failure, Param, Pool, Settings, RETRY_BUDGET, TOKEN_SCOPE, TRANSIENT_CODES};
pub use rowversion::MssqlRowversion;
