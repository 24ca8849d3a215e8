//! Connections to the databases, shared by the sources that read them and the sinks that write them: how a
//! connection string is read, TLS, the pools, and one classifier per database that says which failures pass
//! by waiting.
//!
//! Nothing here retries a failed statement. A failure ends the tick, and whoever called the tick retries it:
//! the Functions host (its retry policy, then the next timer firing), or `handler run`'s outage loop. The one
//! exception is not a retry of an outage: a pooled SQL Server connection that turns out to be dead when reused
//! is replaced by a fresh one (`ConnectRetryCount`, as ADO.NET means it). docs/architecture.md ("Who retries
//! what") gives the whole rule, the state store's and the webhook's included.

pub mod mssql;
pub mod pools;
pub mod postgres;
