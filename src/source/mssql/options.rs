//! The `sqltrigger.json` keys only the SQL Server change-tracking source reads: typed and checked at load
//! (`config::ChangeTrackingOptions`), so a typo fails at start-up with the key's name in config's one list, and
//! handed to [`super::MssqlChangeTracking::new`] as the payload of their `SourceOptions` variant.

pub use crate::config::{ChangeTrackingOptions as Options, OnPositionLost};
