//! The SQL Server upsert sink: the same rules, fence and exactly-once checkpoint as the PostgreSQL sink,
//! as one atomic T-SQL batch per delivery (`sql`).
//!
//! Status: the statements are built and golden-tested (`tests/golden/mssql_sink/`), but the sink does not
//! run yet: it is meant to reuse the SQL Server source's connection pool (connection strings, Entra ID
//! tokens, redirects, the retry table in `source::mssql::connect`), which that module does not export yet.
//! Until it does, `"type": "mssql"` is refused at start-up with that explanation rather than failing on the
//! first batch.

#[cfg_attr(not(test), allow(dead_code))]
mod sql;

use super::target::Target;
use super::Sink;
use crate::config::Env;
use serde_json::Value;
use std::sync::Arc;

/// Checks the options (so their mistakes are reported first), then refuses: see the module docs.
pub fn from_options(options: &Value, env: &Env) -> Result<Arc<dyn Sink>, String> {
    Target::from_options(options, env, sql::ROWS_PER_STATEMENT)?;
    Err("the SQL Server sink is not available in this build yet (its statements are built and tested, its connection is not wired); use type postgres, webhook or stdout".into())
}
