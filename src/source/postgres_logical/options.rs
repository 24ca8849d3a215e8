//! The `sqltrigger.json` keys only the logical source reads: typed and checked at load
//! (`config::PostgresLogicalOptions`), so a typo fails at start-up with the key's name in config's one list. The
//! source is built with them (the spec's `SourceOptions::PostgresLogical` payload) and hands each part a copy.

pub use crate::config::{DeleteItem, OnTruncate, PostgresLogicalOptions as Options, Reader};
