//! End-to-end tests: the real `handler` binary, driven by the host driver over HTTP, against real PostgreSQL
//! and real Azurite started by the shared fixture. One test binary, so one process shares the servers when run
//! with `cargo test`; every test uses its own database and its own state name space.

#[path = "../support/mod.rs"]
mod support;

mod backfill;
mod backfill_crashes;
mod balance;
mod column_names;
mod common;
mod concurrency;
mod config_errors;
mod conformance;
mod connections;
mod crashes;
mod delivery;
mod docs_sql;
mod drain;
mod failure_matrix;
mod host_behaviour;
mod host_stop;
mod hostile_settings;
mod lag;
mod liveness;
mod log_levels;
mod logical;
mod logical_backfill;
mod operations;
mod outages;
mod outputs;
mod partitions;
mod protocol;
mod repartition;
mod runner;
mod scale;
mod secrets;
mod sink_values;
mod sinks;
mod values;
