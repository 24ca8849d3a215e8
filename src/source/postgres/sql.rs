//! Every statement the PostgreSQL cursor source runs, built in one place from validated, quoted names.
//!
//! The fetch is a row-value keyset: `(cursor, pk...) > ($1, $2...)` lets PostgreSQL walk the
//! `(cursor, pk...)` index as one range scan, so batch N costs the same as batch 1 (the OR-expanded form
//! `c > $1 OR (c = $1 AND pk > $2)` rescans the index from the start every batch). Positions travel as text
//! and are cast to the column types read from the catalog, so one code path serves every key type.

use crate::ident::Ident;

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
}

impl Shape {
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
        let row = "row_to_json(r)::text".to_string();
        let item = match &deleted {
            Some(d) => {
                let pk: Vec<String> =
                    self.key.iter().map(|(k, _)| format!("{}, t.{}", quote_literal(k.as_str()), k.pg())).collect();
                format!("CASE WHEN {d} THEN json_build_object({})::text ELSE {row} END", pk.join(", "))
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
        let mut preds = vec![format!("({}) > {}", self.order_columns().join(", "), self.position_params(1))];
        preds.extend(self.guard_predicate());
        format!(
            "SELECT {} FROM {} WHERE {} ORDER BY {} LIMIT ${}",
            self.select_list(Some(1)),
            self.row_source(),
            preds.join(" AND "),
            self.order_columns().join(", "),
            n + 1
        )
    }

    /// Changes from the beginning: the only parameter is the limit.
    pub fn fetch_first(&self) -> String {
        let preds = self.guard_predicate().map(|g| format!(" WHERE {g}")).unwrap_or_default();
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
        format!(
            "SELECT {} FROM {} WHERE ({order}) > {} AND ({order}) <= {} ORDER BY {order} LIMIT ${}",
            self.select_list(Some(1)),
            self.row_source(),
            self.position_params(1),
            self.position_params(n + 1),
            2 * n + 1
        )
    }

    /// Changes in `[start, upto]` when the batch started at the beginning: the upto texts, then the limit.
    pub fn fetch_range_first(&self) -> String {
        let n = self.position_arity();
        let order = self.order_columns().join(", ");
        format!(
            "SELECT {} FROM {} WHERE ({order}) <= {} ORDER BY {order} LIMIT ${}",
            self.select_list(None),
            self.row_source(),
            self.position_params(1),
            n + 1
        )
    }

    /// The newest committed position (for `startFrom: now`). Deliberately unguarded: a row committed before
    /// the first tick existed before "now" even if an older transaction still holds the guard back; writes of
    /// transactions still open at that moment count as before "now" too.
    pub fn newest(&self) -> String {
        let order: Vec<String> = self.order_columns().iter().map(|c| format!("{c} DESC")).collect();
        let texts: Vec<String> = self.order_columns().iter().map(|c| format!("{c}::text")).collect();
        format!("SELECT {} FROM {} t ORDER BY {} LIMIT 1", texts.join(", "), self.table, order.join(", "))
    }

    /// Readable changes after a position (for status); parameters are the position texts.
    pub fn pending_after(&self) -> String {
        let mut preds = vec![format!("({}) > {}", self.order_columns().join(", "), self.position_params(1))];
        preds.extend(self.guard_predicate());
        format!("SELECT count(*) FROM {} t WHERE {}", self.table, preds.join(" AND "))
    }

    pub fn pending_all(&self) -> String {
        let preds = self.guard_predicate().map(|g| format!(" WHERE {g}")).unwrap_or_default();
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
        let filter = after.map(|p| format!(" WHERE {p}")).unwrap_or_default();
        format!("SELECT {age} FROM {} t{filter} ORDER BY {} LIMIT 1", self.table, self.order_columns().join(", "))
    }
}

/// Whether PostgreSQL records commit timestamps (`track_commit_timestamp`, set only at server start).
pub const COMMIT_TIMESTAMPS: &str = "SELECT current_setting('track_commit_timestamp')::bool";

/// A SQL string literal. Only used for JSON key names built from validated identifiers.
fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Catalog queries: the table's oid, columns and primary key. Parameters only, no splicing.
pub const TABLE_OID: &str = "SELECT to_regclass($1)::oid";
pub const COLUMNS: &str = "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), t.typname::text \
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
mod tests {
    use super::*;

    fn shape(guard: Guard) -> Shape {
        let id = |s: &str| Ident::new(s).expect("valid");
        Shape {
            table: "\"public\".\"orders\"".into(),
            cursor: id("version"),
            cursor_type: "xid8".into(),
            key: vec![(id("id"), "bigint".into())],
            columns: vec![(id("id"), false), (id("blob"), true)],
            soft_delete: Some((id("deleted"), true)),
            inserted: Some(id("created")),
            guard,
            age: Age::CommitTimestamp,
        }
    }

    #[test]
    fn fetch_uses_a_row_value_keyset_below_the_oldest_running_transaction() {
        assert_eq!(
            shape(Guard::Xid8).fetch_after(),
            "SELECT t.\"version\"::text, t.\"id\"::text, (CASE WHEN t.\"deleted\" IS TRUE THEN 2 WHEN (t.\"created\", t.\"id\") > (($1::text)::xid8, ($2::text)::bigint) THEN 0 ELSE 1 END)::int4, \
CASE WHEN t.\"deleted\" IS TRUE THEN json_build_object('id', t.\"id\")::text ELSE row_to_json(r)::text END \
FROM \"public\".\"orders\" t CROSS JOIN LATERAL (SELECT t.\"id\" AS \"id\", translate(encode(t.\"blob\", 'base64'), E'\\n', '') AS \"blob\") r \
WHERE (t.\"version\", t.\"id\") > (($1::text)::xid8, ($2::text)::bigint) AND t.\"version\" < pg_snapshot_xmin(pg_current_snapshot()) \
ORDER BY t.\"version\", t.\"id\" LIMIT $3"
        );
    }

    #[test]
    fn a_lag_guard_reads_only_below_now_minus_the_lag() {
        let s = shape(Guard::Lag { seconds: 5.0, with_time_zone: true });
        assert!(s.fetch_first().contains("WHERE t.\"version\" < now() - make_interval(secs => 5.000) ORDER BY"));
        let s = shape(Guard::None);
        assert!(!s.fetch_first().contains("WHERE"));
    }

    #[test]
    fn the_lag_dates_the_first_row_of_the_keyset_range_ignoring_the_guard() {
        // An xid8 cursor is dated by its row's commit timestamp, and not at all while those are off
        assert_eq!(
            shape(Guard::Xid8).oldest_after(true),
            "SELECT EXTRACT(EPOCH FROM now() - pg_xact_commit_timestamp(t.xmin))::float8 FROM \"public\".\"orders\" t \
WHERE (t.\"version\", t.\"id\") > (($1::text)::xid8, ($2::text)::bigint) ORDER BY t.\"version\", t.\"id\" LIMIT 1"
        );
        assert_eq!(
            shape(Guard::Xid8).oldest_first(false),
            "SELECT NULL::float8 FROM \"public\".\"orders\" t ORDER BY t.\"version\", t.\"id\" LIMIT 1"
        );
        // A timestamp cursor is its own date, compared in its own kind of time
        let stamped = |with_time_zone| Shape {
            cursor_type: "timestamp with time zone".into(),
            age: Age::Cursor { with_time_zone },
            ..shape(Guard::Lag { seconds: 5.0, with_time_zone })
        };
        assert_eq!(
            stamped(true).oldest_first(true),
            "SELECT EXTRACT(EPOCH FROM now() - t.\"version\")::float8 FROM \"public\".\"orders\" t ORDER BY t.\"version\", t.\"id\" LIMIT 1"
        );
        assert!(stamped(false)
            .oldest_first(true)
            .starts_with("SELECT EXTRACT(EPOCH FROM localtimestamp - t.\"version\")"));
        assert!(
            !stamped(true).oldest_after(true).contains("make_interval"),
            "the safety lag does not hide a waiting row"
        );
    }

    #[test]
    fn range_refetch_is_bounded_on_both_sides() {
        let q = shape(Guard::Xid8).fetch_range();
        assert!(q.contains("> (($1::text)::xid8, ($2::text)::bigint) AND (t.\"version\", t.\"id\") <= (($3::text)::xid8, ($4::text)::bigint)"));
        assert!(q.ends_with("LIMIT $5"));
    }
}
