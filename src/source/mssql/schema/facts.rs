//! The catalog facts the SQL Server sources read on first use (`catalog` decodes them), and the two helpers every
//! check words its messages with.

use crate::ident::Ident;
use crate::source::mssql::types::SqlType;
use crate::source::SourceError;

/// `sql::DATABASE`, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabaseFacts {
    pub compatibility_level: i32,
    /// `snapshot_isolation_state`: 1 = ON.
    pub snapshot_state: i32,
    pub read_committed_snapshot: bool,
    /// NULL when change tracking is off for the database.
    pub ct_version: Option<i64>,
    /// Retention and its unit code (1 minutes, 2 hours, 3 days).
    pub retention: Option<(i32, i32)>,
    pub name: String,
    pub user: String,
}

impl DatabaseFacts {
    pub fn snapshot_allowed(&self) -> bool {
        self.snapshot_state == 1
    }

    pub fn quoted_name(&self) -> String {
        quote(&self.name)
    }

    pub fn retention_text(&self) -> String {
        match self.retention {
            Some((n, unit)) => {
                let unit = match unit {
                    1 => "MINUTES",
                    2 => "HOURS",
                    _ => "DAYS",
                };
                format!("{n} {unit}")
            }
            None => "unknown".into(),
        }
    }
}

/// `sql::table()`, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableFacts {
    pub object_id: Option<i32>,
    pub is_base_table: bool,
    pub can_select: bool,
    pub can_view_change_tracking: bool,
    pub min_valid_version: Option<i64>,
}

/// One row of `sql::columns()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnFacts {
    pub name: String,
    pub ty: SqlType,
    pub column_id: i32,
    pub pk_ordinal: Option<i32>,
}

pub(super) fn quote(name: &str) -> String {
    Ident::new(name).map(|i| i.mssql()).unwrap_or_else(|_| "[?]".into())
}

pub(super) fn invalid(msg: String) -> SourceError {
    SourceError::Invalid(msg)
}
