//! Where a SQL sink writes, as the sinks use it: the `"sink"` options the SQL sinks share are read and checked
//! once at load (`config::TableTarget`); the dialect supplies its default rows per statement.

use crate::config::{Secret, TableTarget};
use crate::ident::TableName;

/// Where a SQL sink writes, and how.
#[derive(Debug, Clone)]
pub struct Target {
    pub table: TableName,
    pub setting: String,
    pub connection: Secret,
    pub fence_table: TableName,
    /// Set with `exactlyOnce`: the table that records the last batch applied, in the rows' transaction.
    pub checkpoint_table: Option<TableName>,
    pub max_rows_per_statement: usize,
}

impl Target {
    /// The target `spec` names; `default_rows` is the dialect's rows per statement.
    pub fn new(spec: &TableTarget, default_rows: usize) -> Self {
        Self {
            table: spec.table.clone(),
            setting: spec.connection_setting.clone(),
            connection: spec.connection.clone(),
            fence_table: spec.fence_table.clone(),
            checkpoint_table: spec.checkpoint_table.clone(),
            max_rows_per_statement: spec.max_rows_per_statement.unwrap_or(default_rows),
        }
    }
}

/// Splits rows into statements of at most `max_rows` rows and about `max_bytes` bytes of JSON each, and
/// renders each as one JSON array.
pub fn chunks<S: AsRef<str>>(rows: &[S], max_rows: usize, max_bytes: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::from("[");
    let mut n = 0;
    for row in rows {
        let row = row.as_ref();
        if n > 0 && (n >= max_rows || current.len() + row.len() > max_bytes) {
            current.push(']');
            out.push(std::mem::replace(&mut current, String::from("[")));
            n = 0;
        }
        if n > 0 {
            current.push(',');
        }
        current.push_str(row);
        n += 1;
    }
    if n > 0 {
        current.push(']');
        out.push(current);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_bound_rows_and_bytes_and_never_split_a_row() {
        let rows = ["{\"a\":1}", "{\"a\":2}", "{\"a\":3}"];
        assert_eq!(chunks(&rows, 2, 1 << 20), vec!["[{\"a\":1},{\"a\":2}]", "[{\"a\":3}]"]);
        assert_eq!(chunks(&rows, 10, 10), vec!["[{\"a\":1}]", "[{\"a\":2}]", "[{\"a\":3}]"]);
        assert!(chunks::<&str>(&[], 10, 10).is_empty());
    }
}
