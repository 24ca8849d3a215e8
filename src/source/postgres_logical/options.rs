//! The `sqltrigger.json` keys only the logical source reads: typed and checked at load
//! (`config::PostgresLogicalOptions`), so a typo fails at start-up with the key's name in config's one list.

use crate::config::{SourceKind, SourceOptions, SourceSpec};
use crate::source::SourceError;

pub use crate::config::{DeleteItem, OnTruncate, PostgresLogicalOptions as Options, Reader};

impl Options {
    /// The logical keys of `spec`, which must be a postgres-logical spec.
    pub fn from_spec(spec: &SourceSpec) -> Result<Self, SourceError> {
        match &spec.options {
            SourceOptions::PostgresLogical(options) => Ok(options.clone()),
            _ => Err(crate::source::wrong_kind(spec, SourceKind::PostgresLogical)),
        }
    }
}
