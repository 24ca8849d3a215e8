//! sql-pseudo-trigger: a SQL trigger for any Azure Functions app, as a custom handler.
//!
//! This is a *pseudo* trigger built on timers, not a native database trigger: the Functions host invokes the
//! handler on a schedule, each invocation runs one lease-guarded tick, and delivery is at-least-once, so
//! consumers must be idempotent. See docs/architecture.md for the tick and the guarantee of each delivery mode.

pub mod admin;
pub mod app;
pub mod change;
pub mod cli;
pub mod clock;
pub mod config;
pub mod db;
pub mod engine;
pub mod failpoint;
#[doc(hidden)]
pub mod fuzzing;
pub mod ident;
pub mod ops;
pub mod partitions;
pub mod protocol;
pub mod runner;
pub mod server;
pub mod shutdown;
pub mod sink;
pub mod source;
pub mod state;
pub mod telemetry;
pub mod watchdog;
