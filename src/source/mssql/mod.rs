//! SQL Server and Azure SQL sources: change tracking (the official trigger's mechanism) and rowversion
//! polling (for tables where change tracking cannot be turned on).
//!
//! Structure, as in the PostgreSQL source: every statement is built in `sql` from validated, quoted names;
//! the table is discovered and checked on first use (`catalog` reads, `schema` decides, each failure with a
//! message that says what to run); positions are opaque JSON (`position`); `Item` JSON is built by SQL
//! Server with `FOR JSON PATH` (exact numerics, ISO 8601 dates, binary as base64, like the official
//! trigger). Connections, the pool and the
//! classifier of failures are `db::mssql`'s, shared with the SQL Server sink; `read` words their failures.
//!
//! Unlike the official trigger there is no `az_func` schema, no lease table and no database-wide
//! `sp_getapplock`: the engine's state store holds the position and the lease, so the database only sees
//! reads, and functions on one database never serialize each other.

mod backfill;
mod catalog;
mod change_tracking;
mod options;
mod position;
mod read;
mod rowversion;
mod schema;
mod sql;
mod types;

pub use change_tracking::MssqlChangeTracking;
pub use rowversion::MssqlRowversion;
