//! One change row as a change read returns it, and its payload: the official `Operation` and `Item`, and with
//! `includeMetadata` the change's version, creation version and changed columns.

use crate::change::{Change, Operation};
use crate::source::mssql::sql::CtShape;
use crate::source::SourceError;
use serde_json::value::RawValue;

/// One row of `CtShape::changes`.
#[derive(Debug)]
pub(super) struct ChangeRow {
    pub version: i64,
    pub op: i32,
    pub item: String,
    pub created: Option<i64>,
    pub mask: Option<String>,
    pub key: Vec<String>,
}

/// The change `row` reports on a table of `shape`; with `include_metadata` its change-tracking metadata too.
pub(super) fn change(row: &ChangeRow, shape: &CtShape, include_metadata: bool) -> Result<Change, SourceError> {
    let op = Operation::from_code(row.op.into())
        .ok_or_else(|| SourceError::Invalid(format!("unexpected operation code {} from SQL Server", row.op)))?;
    let mut change = Change::from_json(op, row.item.clone())
        .map_err(|e| SourceError::Invalid(format!("SQL Server returned invalid row JSON: {e}")))?;
    if include_metadata {
        let mut meta = serde_json::Map::new();
        meta.insert("Version".into(), row.version.into());
        meta.insert("CreationVersion".into(), row.created.map(Into::into).unwrap_or(serde_json::Value::Null));
        // A mask is present only for updates of a table tracking columns; NULL means "all columns".
        if let (Some(mask), Operation::Update) = (&row.mask, op) {
            let changed: Vec<serde_json::Value> = shape
                .item
                .iter()
                .zip(mask.chars())
                .filter(|(_, bit)| *bit == '1')
                .map(|(c, _)| c.name.as_str().into())
                .collect();
            meta.insert("ChangedColumns".into(), changed.into());
        }
        let text = serde_json::Value::Object(meta).to_string();
        change.metadata = RawValue::from_string(text).ok();
    }
    Ok(change)
}
