//! The `sqltrigger.json` keys only the SQL Server change-tracking source reads: typed and checked at load
//! (`config::ChangeTrackingOptions`), so a typo fails at start-up with the key's name in config's one list.

use crate::config::{SourceKind, SourceOptions, SourceSpec};
use crate::source::SourceError;

pub use crate::config::{ChangeTrackingOptions as Options, OnPositionLost};

impl Options {
    /// The change-tracking keys of `spec`, which must be a change-tracking spec.
    pub fn from_spec(spec: &SourceSpec) -> Result<Self, SourceError> {
        match &spec.options {
            SourceOptions::MssqlChangeTracking(options) => Ok(options.clone()),
            _ => Err(crate::source::wrong_kind(spec, SourceKind::MssqlChangeTracking)),
        }
    }
}
