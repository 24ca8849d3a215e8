//! The app settings this handler reads: one table of definitions (names, defaults, meaning) that both the
//! parser and the generated configuration reference (`handler settings`, docs/configuration.md) use, so the
//! documentation cannot drift from the code.
//!
//! Precedence for trigger settings, highest first: the function's `sqltrigger.json`, the app setting,
//! host.json `extensions.sql.<camelCase>`, the default. The official trigger's names and defaults are kept.
//!
//! The table (`table`) is plain data; `resolve` reads one function's values through it; `log_level`
//! checks the one setting that is read before logging starts.

mod log_level;
mod resolve;
mod table;

pub use log_level::log_filter;
pub use resolve::{DeliveryMode, MessageFormat, PoisonAction, Resolver, TriggerSettings};
pub use table::*;

#[cfg(test)]
mod tests;
