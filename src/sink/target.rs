//! Where a SQL sink writes, as the sinks use it: the `"sink"` options the SQL sinks share are read and checked
//! once at load (`config::TableTarget`); the dialect supplies its default rows per statement.

use crate::config::{Secret, TableTarget};
use crate::ident::TableName;
use std::ops::Range;

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
    let sizes = rows.iter().map(|r| r.as_ref().len());
    chunk_ranges(sizes, max_rows, max_bytes).into_iter().map(|range| json_array(&rows[range])).collect()
}

/// The rows of each statement, as ranges of row indexes: at most `max_rows` rows and about `max_bytes` bytes
/// (the sum of `sizes`, each row's bytes) each; a row larger than `max_bytes` is a statement of its own.
pub fn chunk_ranges(sizes: impl IntoIterator<Item = usize>, max_rows: usize, max_bytes: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut n, mut bytes) = (0, 0, 0);
    for (i, size) in sizes.into_iter().enumerate() {
        // Each row costs a separator too, as the rendered array does.
        if n > 0 && (n >= max_rows || bytes + size + 1 > max_bytes) {
            out.push(start..i);
            (start, n, bytes) = (i, 0, 0);
        }
        n += 1;
        bytes += size + 1;
    }
    if n > 0 {
        out.push(start..start + n);
    }
    out
}

/// `rows` as one JSON array, each row's text as it is.
pub fn json_array<S: AsRef<str>>(rows: &[S]) -> String {
    let mut array = String::with_capacity(rows.iter().map(|r| r.as_ref().len() + 1).sum::<usize>() + 2);
    array.push('[');
    for (i, row) in rows.iter().enumerate() {
        if i > 0 {
            array.push(',');
        }
        array.push_str(row.as_ref());
    }
    array.push(']');
    array
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
