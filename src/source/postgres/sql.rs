//! Every statement the PostgreSQL cursor source runs, built in one place from validated, quoted names.
//!
//! The fetch is a row-value keyset: `(cursor, pk...) > ($1, $2...)` lets PostgreSQL walk the
//! `(cursor, pk...)` index as one range scan, so batch N costs the same as batch 1 (the OR-expanded form
//! `c > $1 OR (c = $1 AND pk > $2)` rescans the index from the start every batch). Positions travel as text
//! and are cast to the column types read from the catalog, so one code path serves every key type.
//!
//! A partition's statements add `<partition expression> = <index>` (see [`Shape::partition_expression`]); with
//! the index `(<partition expression>, cursor, pk...)` the equality and the row-value keyset together bound one
//! range of that index, so a partition's fetch stays one range scan whatever the share of the table before it.

use crate::config::Partition;
use crate::ident::Ident;

/// Key column types whose text form is IMMUTABLE (the same text in every session, whatever its `DateStyle`,
/// `TimeZone` or `extra_float_digits`), so the partition expression over them can be indexed and a key always
/// hashes to the same partition. Others are refused for partitioned functions: PostgreSQL would refuse the
/// index ("functions in index expression must be marked IMMUTABLE"), and a key hashed from a session-dependent
/// text could land in different partitions for different sessions.
pub const PARTITION_KEY_TYPES: &[&str] = &["int2", "int4", "int8", "numeric", "text", "varchar", "bpchar", "uuid"];

/// `hashtextextended` returns any `bigint`; clearing the sign bit gives a non-negative value for `%`.
const SIGN_MASK: &str = "9223372036854775807";

/// How late commits are kept from being skipped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Guard {
    /// `xid8` cursor read only below the oldest running transaction: exact.
    Xid8,
    /// Timestamp cursor read only below `now() - lag`: a commit slower than the lag can still be missed.
    Lag { seconds: f64, with_time_zone: bool },
    /// No guard: the user accepted that late commits may be missed.
    None,
}

/// How the age of a pending change is read (the lag in status).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Age {
    /// The cursor is the change's time: age = now minus the cursor (`localtimestamp` for a `timestamp` column,
    /// as the lag guard compares it).
    Cursor { with_time_zone: bool },
    /// The cursor is not a time (xid8, integers): the commit timestamp of the row's last writer, `xmin`, which
    /// PostgreSQL records only with `track_commit_timestamp = on`.
    CommitTimestamp,
}

/// The table's shape as the source uses it.
#[derive(Debug, Clone)]
pub struct Shape {
    pub table: String,
    pub cursor: Ident,
    pub cursor_type: String,
    /// Primary key columns, in key order, with their types.
    pub key: Vec<(Ident, String)>,
    /// Columns of `Item`, in table order, each with whether it is bytea (sent as base64).
    pub columns: Vec<(Ident, bool)>,
    /// Soft-delete column and whether it is boolean (`IS TRUE`) or anything else (`IS NOT NULL`).
    pub soft_delete: Option<(Ident, bool)>,
    pub inserted: Option<Ident>,
    pub guard: Guard,
    pub age: Age,
    /// The partition of the keys this source reads (`None`: every key).
    pub partition: Option<Partition>,
}

impl Shape {
    /// A stable hash of the primary key modulo the partition count:
    /// `((hashtextextended(<key text>, 0) & 9223372036854775807) % N)`, `<key text>` being `k::text` for one key
    /// column and `a::text || ',' || b::text` for several. Every part is IMMUTABLE for the key types of
    /// [`PARTITION_KEY_TYPES`], so PostgreSQL can index it; the count is a literal so the planner matches the
    /// index expression (a parameter would not). `qualifier` is `"t."` in statements and empty in the index DDL.
    pub fn partition_expression(&self, count: u32, qualifier: &str) -> String {
        let text: Vec<String> = self.key.iter().map(|(k, _)| format!("{qualifier}{}::text", k.pg())).collect();
        format!("((hashtextextended({}, 0) & {SIGN_MASK}) % {count})", text.join(" || ',' || "))
    }

    /// `<partition expression> = <index>` when this source reads one partition.
    pub(super) fn partition_predicate(&self) -> Option<String> {
        self.partition.map(|p| format!("{} = {}", self.partition_expression(p.count.get(), "t."), p.index))
    }

    /// The index a partition's fetch needs: the partition expression, then the keyset's columns. Built
    /// `CONCURRENTLY` so creating it on a busy table does not block writers.
    pub fn partition_index_ddl(&self) -> Option<String> {
        let p = self.partition?;
        let columns: Vec<String> = std::iter::once(self.partition_expression(p.count.get(), ""))
            .chain(std::iter::once(self.cursor.pg()))
            .chain(self.key.iter().map(|(k, _)| k.pg()))
            .collect();
        Some(format!("CREATE INDEX CONCURRENTLY ON {} ({})", self.table, columns.join(", ")))
    }

    /// ` WHERE a AND b` from the predicates given (empty when none).
    fn where_clause(preds: impl IntoIterator<Item = String>) -> String {
        let preds: Vec<String> = preds.into_iter().collect();
        if preds.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", preds.join(" AND "))
        }
    }

    fn order_columns(&self) -> Vec<String> {
        std::iter::once(format!("t.{}", self.cursor.pg()))
            .chain(self.key.iter().map(|(k, _)| format!("t.{}", k.pg())))
            .collect()
    }

    /// `(($1::text)::type, ...)` for a position starting at parameter `first`.
    fn position_params(&self, first: usize) -> String {
        let types = std::iter::once(&self.cursor_type).chain(self.key.iter().map(|(_, t)| t));
        let parts: Vec<String> = types.enumerate().map(|(i, ty)| format!("(${}::text)::{ty}", first + i)).collect();
        format!("({})", parts.join(", "))
    }

    pub fn position_arity(&self) -> usize {
        1 + self.key.len()
    }

    pub(super) fn guard_predicate(&self) -> Option<String> {
        let cursor = format!("t.{}", self.cursor.pg());
        match self.guard {
            Guard::Xid8 => Some(format!("{cursor} < pg_snapshot_xmin(pg_current_snapshot())")),
            Guard::Lag { seconds, with_time_zone } => {
                let now = if with_time_zone { "now()" } else { "localtimestamp" };
                Some(format!("{cursor} < {now} - make_interval(secs => {seconds:.3})"))
            }
            Guard::None => None,
        }
    }

    /// The select list: position texts, operation code, item JSON.
    fn select_list(&self, op_after_param: Option<usize>) -> String {
        let mut cols: Vec<String> = self.order_columns().into_iter().map(|c| format!("{c}::text")).collect();
        let deleted = self.soft_delete.as_ref().map(|(c, is_bool)| {
            if *is_bool {
                format!("t.{} IS TRUE", c.pg())
            } else {
                format!("t.{} IS NOT NULL", c.pg())
            }
        });
        // A row is new since the position when its (insert marker, key) is past the position's (cursor, key):
        // rows of one transaction share the marker, so a transaction split across batches still reports its
        // later rows as inserts.
        let inserted = match (&self.inserted, op_after_param) {
            (Some(col), Some(p)) => {
                let key: Vec<String> = self.key.iter().map(|(k, _)| format!("t.{}", k.pg())).collect();
                format!("(t.{}, {}) > {}", col.pg(), key.join(", "), self.position_params(p))
            }
            (Some(_), None) => "true".to_string(),
            (None, _) => "false".to_string(),
        };
        let op = match &deleted {
            Some(d) => format!("CASE WHEN {d} THEN 2 WHEN {inserted} THEN 0 ELSE 1 END"),
            None => format!("CASE WHEN {inserted} THEN 0 ELSE 1 END"),
        };
        cols.push(format!("({op})::int4"));
        let row = "row_to_json(r.*)::text".to_string();
        let item = match &deleted {
            Some(d) => {
                // row_to_json of the key, so a delete's Item has the bytes every other Item has (no spaces)
                let pk: Vec<String> = self.key.iter().map(|(k, _)| format!("t.{} AS {}", k.pg(), k.pg())).collect();
                format!(
                    "CASE WHEN {d} THEN (SELECT row_to_json(k.*)::text FROM (SELECT {}) k) ELSE {row} END",
                    pk.join(", ")
                )
            }
            None => row,
        };
        cols.push(item);
        cols.join(", ")
    }

    pub(super) fn row_source(&self) -> String {
        let projected: Vec<String> = self
            .columns
            .iter()
            .map(|(c, is_bytea)| {
                if *is_bytea {
                    format!("translate(encode(t.{}, 'base64'), E'\\n', '') AS {}", c.pg(), c.pg())
                } else {
                    format!("t.{} AS {}", c.pg(), c.pg())
                }
            })
            .collect();
        format!("{} t CROSS JOIN LATERAL (SELECT {}) r", self.table, projected.join(", "))
    }

    /// Changes after a position: parameters are the position texts, then the limit.
    pub fn fetch_after(&self) -> String {
        let n = self.position_arity();
        let mut preds: Vec<String> = self.partition_predicate().into_iter().collect();
        preds.push(format!("({}) > {}", self.order_columns().join(", "), self.position_params(1)));
        preds.extend(self.guard_predicate());
        format!(
            "SELECT {} FROM {}{} ORDER BY {} LIMIT ${}",
            self.select_list(Some(1)),
            self.row_source(),
            Self::where_clause(preds),
            self.order_columns().join(", "),
            n + 1
        )
    }

    /// Changes from the beginning: the only parameter is the limit.
    pub fn fetch_first(&self) -> String {
        let preds = Self::where_clause(self.partition_predicate().into_iter().chain(self.guard_predicate()));
        format!(
            "SELECT {} FROM {}{} ORDER BY {} LIMIT $1",
            self.select_list(None),
            self.row_source(),
            preds,
            self.order_columns().join(", ")
        )
    }

    /// Changes in `(after, upto]`: the after texts, the upto texts, then the limit.
    pub fn fetch_range(&self) -> String {
        let n = self.position_arity();
        let order = self.order_columns().join(", ");
        let preds = self.partition_predicate().into_iter().chain([
            format!("({order}) > {}", self.position_params(1)),
            format!("({order}) <= {}", self.position_params(n + 1)),
        ]);
        format!(
            "SELECT {} FROM {}{} ORDER BY {order} LIMIT ${}",
            self.select_list(Some(1)),
            self.row_source(),
            Self::where_clause(preds),
            2 * n + 1
        )
    }

    /// Changes in `[start, upto]` when the batch started at the beginning: the upto texts, then the limit.
    pub fn fetch_range_first(&self) -> String {
        let n = self.position_arity();
        let order = self.order_columns().join(", ");
        let preds = self.partition_predicate().into_iter().chain([format!("({order}) <= {}", self.position_params(1))]);
        format!(
            "SELECT {} FROM {}{} ORDER BY {order} LIMIT ${}",
            self.select_list(None),
            self.row_source(),
            Self::where_clause(preds),
            n + 1
        )
    }

    /// The newest committed position (for `startFrom: now`). Deliberately unguarded: a row committed before
    /// the first tick existed before "now" even if an older transaction still holds the guard back; writes of
    /// transactions still open at that moment count as before "now" too.
    pub fn newest(&self) -> String {
        let order: Vec<String> = self.order_columns().iter().map(|c| format!("{c} DESC")).collect();
        let texts: Vec<String> = self.order_columns().iter().map(|c| format!("{c}::text")).collect();
        format!(
            "SELECT {} FROM {} t{} ORDER BY {} LIMIT 1",
            texts.join(", "),
            self.table,
            Self::where_clause(self.partition_predicate()),
            order.join(", ")
        )
    }

    /// Readable changes after a position (for status); parameters are the position texts.
    pub fn pending_after(&self) -> String {
        let mut preds: Vec<String> = self.partition_predicate().into_iter().collect();
        preds.push(format!("({}) > {}", self.order_columns().join(", "), self.position_params(1)));
        preds.extend(self.guard_predicate());
        format!("SELECT count(*) FROM {} t{}", self.table, Self::where_clause(preds))
    }

    pub fn pending_all(&self) -> String {
        let preds = Self::where_clause(self.partition_predicate().into_iter().chain(self.guard_predicate()));
        format!("SELECT count(*) FROM {} t{}", self.table, preds)
    }

    /// The age in seconds of the first row after a position (parameters: the position texts), for the lag.
    /// Deliberately unguarded: a committed row the guard still holds back is waiting too. One index probe: the
    /// first row of the keyset range. No row when nothing waits; a NULL age when the row cannot be dated
    /// (`dated` false: commit timestamps are off, so the function that reads them would fail).
    pub fn oldest_after(&self, dated: bool) -> String {
        self.oldest(dated, Some(format!("({}) > {}", self.order_columns().join(", "), self.position_params(1))))
    }

    /// [`Self::oldest_after`] from the beginning: no parameters.
    pub fn oldest_first(&self, dated: bool) -> String {
        self.oldest(dated, None)
    }

    fn oldest(&self, dated: bool, after: Option<String>) -> String {
        let age = match (dated, self.age) {
            (false, _) => "NULL::float8".to_string(),
            (true, Age::Cursor { with_time_zone }) => {
                let now = if with_time_zone { "now()" } else { "localtimestamp" };
                format!("EXTRACT(EPOCH FROM {now} - t.{})::float8", self.cursor.pg())
            }
            (true, Age::CommitTimestamp) => {
                "EXTRACT(EPOCH FROM now() - pg_xact_commit_timestamp(t.xmin))::float8".into()
            }
        };
        let filter = Self::where_clause(self.partition_predicate().into_iter().chain(after));
        format!("SELECT {age} FROM {} t{filter} ORDER BY {} LIMIT 1", self.table, self.order_columns().join(", "))
    }
}

/// What a fetch's plan (`EXPLAIN (FORMAT JSON)`) says about the partition index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanCheck {
    /// The partition expression is an index condition (the scan starts at the partition's range).
    pub expression_indexed: bool,
    /// The partition expression is checked row by row after reading (a `Filter`: other partitions' rows are
    /// read and thrown away).
    pub expression_filtered: bool,
    /// A sort node: the index does not deliver `(cursor, key)` order within the partition.
    pub sorts: bool,
}

impl PlanCheck {
    /// Reads an `EXPLAIN (FORMAT JSON)` result: `[{"Plan": {...}}]`.
    pub fn read(explain: &serde_json::Value) -> Option<Self> {
        let mut check = Self { expression_indexed: false, expression_filtered: false, sorts: false };
        let mut nodes = vec![explain.as_array()?.first()?.get("Plan")?];
        while let Some(node) = nodes.pop() {
            let mentions = |key: &str| {
                node.get(key).and_then(serde_json::Value::as_str).is_some_and(|c| c.contains("hashtextextended"))
            };
            check.expression_indexed |= mentions("Index Cond");
            check.expression_filtered |= mentions("Filter") || mentions("Recheck Cond");
            check.sorts |=
                node.get("Node Type").and_then(serde_json::Value::as_str).is_some_and(|t| t.contains("Sort"));
            nodes.extend(node.get("Plans").and_then(serde_json::Value::as_array).into_iter().flatten());
        }
        Some(check)
    }

    /// The fetch walks one range of an index in order: the partition's rows only, no sort.
    pub fn is_range_scan(&self) -> bool {
        self.expression_indexed && !self.expression_filtered && !self.sorts
    }
}

/// Whether PostgreSQL records commit timestamps (`track_commit_timestamp`, set only at server start).
pub const COMMIT_TIMESTAMPS: &str = "SELECT current_setting('track_commit_timestamp')::bool";

/// Catalog queries: the table's oid, columns and primary key. Parameters only, no splicing.
pub const TABLE_OID: &str = "SELECT to_regclass($1)::oid";
pub const COLUMNS: &str =
    "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), t.typname::text, a.attnotnull \
     FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
     WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum";
pub const PRIMARY_KEY: &str = "SELECT a.attname::text FROM pg_index i \
     CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) \
     JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
     WHERE i.indrelid = $1 AND i.indisprimary ORDER BY k.ord";
/// Indexes whose leading columns are given (by attnum order check done in code).
pub const INDEX_KEYS: &str = "SELECT array_agg(a.attname::text ORDER BY k.ord) FROM pg_index i \
     CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) \
     JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
     WHERE i.indrelid = $1 GROUP BY i.indexrelid";

#[cfg(test)]
pub(super) mod tests;
