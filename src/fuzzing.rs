//! The checks the fuzz targets run (fuzz/, docs/fuzzing.md), here so that the fuzzer and the corpus replay test
//! (tests/fuzz_corpora.rs) run the very same code. Each takes arbitrary bytes, feeds them to one decoder of
//! untrusted input, and panics when the decoder panics or breaks a property it promises: a decoded request
//! re-encodes to the same meaning, a document that reads back re-serializes and reads back equal, no error or
//! `Debug` output holds a part of a secret.
//!
//! Not an API: nothing here is stable, and only the fuzz targets and their replay test call it.
//!
//! One file per input format: `invocation`, `pgoutput`, `connection_strings`, `configuration` (schedules and function
//! folders), `state_document`; `secrets` holds the checks they share.

mod configuration;
mod connection_strings;
mod invocation;
mod pgoutput;
mod secrets;
mod state_document;

pub use configuration::{function_config, ncrontab};
pub use connection_strings::{mssql_connection_string, postgres_connection_string, storage_connection_string};
pub use invocation::invocation;
pub use pgoutput::pgoutput;
pub use state_document::state_document;

/// One fuzz target: its name (the folder of its corpus, fuzz/corpus/<name>) and its check.
pub type Target = (&'static str, fn(&[u8]));

/// Every target, for the replay test and scripts/fuzz.
pub const TARGETS: &[Target] = &[
    ("invocation", invocation),
    ("pgoutput", pgoutput),
    ("postgres_connection_string", postgres_connection_string),
    ("mssql_connection_string", mssql_connection_string),
    ("storage_connection_string", storage_connection_string),
    ("ncrontab", ncrontab),
    ("function_config", function_config),
    ("state_document", state_document),
];
