//! The backfill of the cursor source: the rows that already exist, read in primary-key order in chunks.
//!
//! The rule (argued in docs/architecture.md, "Backfill"): a backfill started while the live checkpoint's cursor
//! was `C` delivers only rows whose cursor is `<= C` when the chunk is read. A row written after the start has
//! a cursor above `C` (xid8 and sequences grow; a timestamp cursor grows with the safety lag's caveat), so it
//! is left to the live path, which delivers it with its newest values; a row the chunk does read has not been
//! written since the live path passed it, so the chunk's value is the newest there is. Soft-deleted rows are
//! not backfilled (a consumer has nothing to delete for a row it never saw). The late-commit guard applies as
//! it does to live fetches. Each chunk is one statement: no transaction or snapshot outlives it.
//!
//! Kept apart from `sql.rs` (the live statements) so the two evolve without touching each other.

use super::connection::{db_error, Connection};
use super::position;
use super::sql::Shape;
use crate::change::{Change, Operation};
use crate::ident::Ident;
use crate::source::{
    backfill_key_misfit, backfill_key_texts, BackfillPlan, ChunkRequest, Fetched, Filter, Position, SourceError,
};
use tokio::sync::OnceCell;
use tokio_postgres::types::ToSql;

/// A filter and how to find each of its columns' types.
pub(super) type Bound<'a> = (&'a Filter, &'a dyn Fn(&Ident) -> Option<String>);

/// `(($n::text)::type, ...)` for the key's columns from parameter `first`.
fn key_params(shape: &Shape, first: usize) -> String {
    let parts: Vec<String> =
        shape.key.iter().enumerate().map(|(i, (_, ty))| format!("(${}::text)::{ty}", first + i)).collect();
    format!("({})", parts.join(", "))
}

/// A stored backfill key position's texts (`None`: before the first key), refused when they do not fit the key or
/// hold a date or time written in another DateStyle.
fn key_texts(shape: &Shape, p: &Position, table: &str) -> Result<Option<Vec<String>>, SourceError> {
    let texts = backfill_key_texts(p, shape.key.len(), table)?;
    if let Some(t) = &texts {
        position::check_iso(position::Stored::Backfill, table, shape.key.iter().map(|(_, ty)| ty), t)
            .map_err(SourceError::Invalid)?;
    }
    Ok(texts)
}

fn key_columns(shape: &Shape) -> String {
    shape.key.iter().map(|(k, _)| format!("t.{}", k.pg())).collect::<Vec<_>>().join(", ")
}

/// A chunk's bound and its key positions' texts (after, up to), as a request stored them.
type Keys<'r> = (&'r str, Option<Vec<String>>, Option<Vec<String>>);

/// The bound and key texts `r` holds, checked against the key and the session contract (a stored value that does
/// not fit is refused with the fix); `None` when the backfill has no bound (nothing to backfill).
fn stored<'r>(shape: &Shape, r: &ChunkRequest<'r>, table: &str) -> Result<Option<Keys<'r>>, SourceError> {
    let Some(bound) = r.bound.as_str() else { return Ok(None) };
    let arity = shape.key.len();
    position::check_iso(position::Stored::Backfill, table, [&shape.cursor_type], &[bound.to_string()])
        .map_err(SourceError::Invalid)?;
    let after = key_texts(shape, r.after, table)?;
    // A chunk delivered before ends at its last row's key: a stored `Null` there is refused, not read unbounded.
    let upto = match r.upto {
        Some(u) => Some(key_texts(shape, u, table)?.ok_or_else(|| backfill_key_misfit(u, arity, table))?),
        None => None,
    };
    Ok(Some((bound, after, upto)))
}

/// The statement of the chunk `r` asks for, with its parameters in order (all text; the limit is the last
/// placeholder and not among them); `None` when the backfill has no bound. Rows after `r.after` (`Null`: from
/// the first key), up to `r.upto` when given, whose cursor is at most the bound, not soft-deleted, below the
/// guard, matching `r.filter` (its columns' types from `type_of`); in key order, at most the limit. Columns: the
/// key's texts, then the item JSON.
pub(super) fn chunk(
    shape: &Shape,
    r: &ChunkRequest<'_>,
    table: &str,
    type_of: &dyn Fn(&Ident) -> Option<String>,
) -> Result<Option<(String, Vec<String>)>, SourceError> {
    let Some((bound, after, upto)) = stored(shape, r, table)? else { return Ok(None) };
    let (preds, params) = predicates(shape, bound, after, upto, r.filter.map(|f| (f, type_of)));
    let keys = key_columns(shape);
    let texts: Vec<String> = shape.key.iter().map(|(k, _)| format!("t.{}::text", k.pg())).collect();
    let sql = format!(
        "SELECT {}, row_to_json(r.*)::text FROM {} WHERE {preds} ORDER BY {keys} LIMIT ${}",
        texts.join(", "),
        shape.row_source(),
        params.len() + 1
    );
    Ok(Some((sql, params)))
}

/// The count of the rows a backfill will deliver (what `chunk` walks from the beginning): its estimate.
pub(super) fn estimate(shape: &Shape, bound: &str, filter: Option<Bound<'_>>) -> (String, Vec<String>) {
    let (preds, params) = predicates(shape, bound, None, None, filter);
    (format!("SELECT count(*) FROM {} t WHERE {preds}", shape.table), params)
}

/// The conditions of a chunk over alias `t`, and their parameters (`$1` the bound).
fn predicates(
    shape: &Shape,
    bound: &str,
    after: Option<Vec<String>>,
    upto: Option<Vec<String>>,
    filter: Option<Bound<'_>>,
) -> (String, Vec<String>) {
    let mut params = vec![bound.to_string()];
    let mut preds = vec![format!("t.{} <= ($1::text)::{}", shape.cursor.pg(), shape.cursor_type)];
    let keys = key_columns(shape);
    if let Some(after) = after {
        preds.push(format!("({keys}) > {}", key_params(shape, params.len() + 1)));
        params.extend(after);
    }
    if let Some(upto) = upto {
        preds.push(format!("({keys}) <= {}", key_params(shape, params.len() + 1)));
        params.extend(upto);
    }
    preds.extend(shape.guard_predicate());
    // A partition's backfill walks only its own keys, as its live fetches do.
    preds.extend(shape.partition_predicate());
    if let Some((column, is_bool)) = &shape.soft_delete {
        preds.push(if *is_bool {
            format!("t.{} IS NOT TRUE", column.pg())
        } else {
            format!("t.{} IS NULL", column.pg())
        });
    }
    if let Some((filter, type_of)) = filter {
        let mut bound = Vec::new();
        let text = filter.to_pg(type_of, params.len(), &mut bound);
        preds.push(text);
        params.extend(bound);
    }
    (preds.join(" AND "), params)
}

/// Every column of a table and the type a filter's literal for it is cast to: the column's type without its
/// modifier, schema-qualified and quoted (`pg_catalog."numeric"`, `pg_catalog."bpchar"`), and a domain's base
/// type. With the modifier the cast itself would change the literal: `'10.555'::numeric(12,2)` is 10.56, so
/// `amount > 10.555` would leave 10.56 out, and `'abcd'::varchar(3)` is 'abc', so `name = 'abcd'` would match
/// 'abc'. (`format_type(oid, NULL)` is no way out: it spells bpchar and bit as `character` and `bit`, which a
/// cast reads as length 1.) The column is compared with the literal in the column's type family as written.
const FILTER_COLUMNS: &str = "SELECT a.attname::text, format('%I.%I', n.nspname, b.typname) \
     FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
     JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END \
     JOIN pg_namespace n ON n.oid = b.typnamespace \
     WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum";

/// The newest position below the late-commit guard (for `startFrom: snapshot`): every transaction that wrote a
/// cursor at or below it has ended, so no row the backfill must deliver can still appear behind it.
pub(super) fn newest_guarded(shape: &Shape) -> String {
    let order: Vec<String> = std::iter::once(format!("t.{}", shape.cursor.pg()))
        .chain(shape.key.iter().map(|(k, _)| format!("t.{}", k.pg())))
        .collect();
    let texts: Vec<String> = order.iter().map(|c| format!("{c}::text")).collect();
    let desc: Vec<String> = order.iter().map(|c| format!("{c} DESC")).collect();
    let guard = shape.guard_predicate().map(|g| format!(" WHERE {g}")).unwrap_or_default();
    format!("SELECT {} FROM {} t{guard} ORDER BY {} LIMIT 1", texts.join(", "), shape.table, desc.join(", "))
}

/// A backfill of the cursor source: what it keeps between chunks is only the table's column types, read on the
/// first use of a filter. Owned by `PostgresCursor`, which lends it the connection and the shape.
#[derive(Debug, Default)]
pub(super) struct Backfill {
    /// Every column and its type, read on a backfill's first use of a filter.
    column_types: OnceCell<Vec<(String, String)>>,
}

impl Backfill {
    /// The backfill's bound is the live checkpoint's cursor (`Null`: nothing delivered yet, so the live path
    /// delivers every row and there is nothing to backfill).
    pub async fn start(
        &self,
        conn: &Connection,
        shape: &Shape,
        checkpoint: &Position,
        filter: Option<&Filter>,
    ) -> Result<BackfillPlan, SourceError> {
        let table = conn.table().to_string();
        if let Some(filter) = filter {
            let columns = self.column_types(conn).await?;
            filter.check_columns(&table, columns.iter().map(|(n, _)| n.as_str())).map_err(SourceError::Invalid)?;
        }
        let bound = match checkpoint {
            Position::Null => return Ok(BackfillPlan { bound: Position::Null, estimate: Some(0) }),
            other => position::checkpoint_texts(shape, &table, other)?.remove(0),
        };
        let columns = self.column_types(conn).await?;
        let type_of = |c: &Ident| columns.iter().find(|(n, _)| n == c.as_str()).map(|(_, t)| t.clone());
        let (sql, params) = estimate(shape, &bound, filter.map(|f| (f, &type_of as &dyn Fn(&Ident) -> _)));
        let client = conn.client().await?;
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|t| t as &(dyn ToSql + Sync)).collect();
        let row = client.query_one(&sql, &refs).await.map_err(|e| conn.error(e))?;
        let count: i64 = row.get(0);
        Ok(BackfillPlan { bound: Position::String(bound), estimate: Some(count.max(0) as u64) })
    }

    /// The chunk `r` asks for; its rule needs no live position (`r.live`): the bound excludes every row written
    /// since the start.
    pub async fn chunk(&self, conn: &Connection, shape: &Shape, r: &ChunkRequest<'_>) -> Result<Fetched, SourceError> {
        let table = conn.table().to_string();
        // The stored keys are checked before the catalog is read for a filter's column types.
        if stored(shape, r, &table)?.is_none() {
            return Ok(Fetched::default());
        }
        let columns: &[(String, String)] = match r.filter {
            Some(_) => self.column_types(conn).await?,
            None => &[],
        };
        let type_of = |c: &Ident| columns.iter().find(|(n, _)| n == c.as_str()).map(|(_, t)| t.clone());
        let Some((sql, params)) = chunk(shape, r, &table, &type_of)? else { return Ok(Fetched::default()) };
        let client = conn.client().await?;
        let stmt = client.prepare_cached(&sql).await.map_err(|e| conn.error(e))?;
        let limit = r.limit as i64;
        let mut refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|t| t as &(dyn ToSql + Sync)).collect();
        refs.push(&limit);
        let rows = client.query(&stmt, &refs).await.map_err(|e| conn.error(e))?;
        let arity = shape.key.len();
        let mut changes = Vec::with_capacity(rows.len());
        for row in &rows {
            let item: String = row.get(arity);
            changes.push(
                Change::from_json(Operation::Insert, item)
                    .map_err(|e| SourceError::Invalid(format!("PostgreSQL returned invalid row JSON: {e}")))?,
            );
        }
        let last = rows
            .last()
            .map(|row| Position::Array((0..arity).map(|c| Position::String(row.get::<_, String>(c))).collect()));
        Ok(Fetched { changes, last, advance: None })
    }

    /// Every column of the table with the type a filter's literal is cast to, read once: what a filter's
    /// columns are checked against (see [`FILTER_COLUMNS`]).
    async fn column_types(&self, conn: &Connection) -> Result<&Vec<(String, String)>, SourceError> {
        self.column_types
            .get_or_try_init(|| async {
                let client = conn.client().await?;
                let table = conn.table();
                let oid: Option<u32> = client
                    .query_one(super::sql::TABLE_OID, &[&table.pg()])
                    .await
                    .map_err(|e| db_error(e, table))?
                    .get(0);
                let oid = oid.ok_or_else(|| SourceError::Invalid(format!("table {table} does not exist")))?;
                let rows = client.query(FILTER_COLUMNS, &[&oid]).await.map_err(|e| db_error(e, table))?;
                Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
            })
            .await
    }
}

/// The guarded newest position (`startFrom: snapshot`).
pub(super) async fn snapshot_position(conn: &Connection, shape: &Shape) -> Result<Position, SourceError> {
    let client = conn.client().await?;
    let rows = client.query(&newest_guarded(shape), &[]).await.map_err(|e| conn.error(e))?;
    Ok(match rows.first() {
        Some(row) => {
            Position::Array((0..shape.position_arity()).map(|c| Position::String(row.get::<_, String>(c))).collect())
        }
        None => Position::Null,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::postgres::sql::{Age, Guard};

    fn shape() -> Shape {
        let id = |s: &str| Ident::new(s).expect("valid");
        Shape {
            table: "\"public\".\"orders\"".into(),
            cursor: id("version"),
            cursor_type: "xid8".into(),
            key: vec![(id("tenant"), "integer".into()), (id("id"), "bigint".into())],
            columns: vec![(id("id"), false)],
            soft_delete: Some((id("deleted"), true)),
            inserted: None,
            guard: Guard::Xid8,
            age: Age::CommitTimestamp,
            partition: None,
        }
    }

    /// The tests' backfill bound: cursor 900.
    const BOUND: &str = "900";

    /// A chunk request under `bound`.
    fn request<'a>(
        bound: &'a Position,
        after: &'a Position,
        upto: Option<&'a Position>,
        filter: Option<&'a Filter>,
    ) -> ChunkRequest<'a> {
        ChunkRequest { bound, after, upto, filter, limit: 10, live: &Position::Null }
    }

    /// A statement and its parameters.
    struct Sql {
        sql: String,
        params: Vec<String>,
    }

    fn sql((sql, params): (String, Vec<String>)) -> Sql {
        Sql { sql, params }
    }

    /// The statement `r` asks for, without a filter.
    fn statement(shape: &Shape, r: ChunkRequest<'_>) -> Sql {
        sql(chunk(shape, &r, "public.orders", &|_| None).expect("fits").expect("bounded"))
    }

    #[test]
    fn a_stored_chunk_key_of_a_time_written_in_another_date_style_is_refused_naming_it_and_the_fix() {
        let mut shape = shape();
        shape.key[0].1 = "timestamp with time zone".into();
        let key = |at: &str| Position::Array(vec![Position::String(at.into()), Position::String("7".into())]);
        let read = key_texts(&shape, &key("2024-01-02 03:04:05+00"), "public.orders").expect("ISO passes");
        assert_eq!(read, Some(vec!["2024-01-02 03:04:05+00".to_string(), "7".to_string()]));
        let refused = key_texts(&shape, &key("02/01/2024 03:04:05 UTC"), "public.orders").expect_err("not ISO");
        let refused = refused.to_string();
        assert!(
            refused.contains(r#"holds the timestamp with time zone "02/01/2024 03:04:05 UTC""#)
                && refused.contains("handler state backfill <function> --cancel"),
            "{refused}"
        );
    }

    #[test]
    fn a_chunk_walks_the_key_below_the_bound_and_the_guard() {
        let (bound, after) = (Position::from(BOUND), serde_json::json!(["1", "7"]));
        let c = statement(&shape(), request(&bound, &after, None, None));
        assert_eq!(
            c.sql,
            "SELECT t.\"tenant\"::text, t.\"id\"::text, row_to_json(r.*)::text FROM \"public\".\"orders\" t CROSS JOIN LATERAL (SELECT t.\"id\" AS \"id\") r \
WHERE t.\"version\" <= ($1::text)::xid8 AND (t.\"tenant\", t.\"id\") > (($2::text)::integer, ($3::text)::bigint) \
AND t.\"version\" < pg_snapshot_xmin(pg_current_snapshot()) AND t.\"deleted\" IS NOT TRUE ORDER BY t.\"tenant\", t.\"id\" LIMIT $4"
        );
        assert_eq!(c.params, ["900", "1", "7"]);
    }

    #[test]
    fn a_re_read_is_bounded_on_both_sides_and_a_filter_is_bound() {
        let filter = Filter::parse("region = 'eu' OR id IN (1, 2)").expect("parses");
        let type_of = |c: &Ident| Some(if c.as_str() == "region" { "text".to_string() } else { "bigint".into() });
        let (bound, upto) = (Position::from(BOUND), serde_json::json!(["2", "9"]));
        let r = request(&bound, &Position::Null, Some(&upto), Some(&filter));
        let c = sql(chunk(&shape(), &r, "public.orders", &type_of).expect("fits").expect("bounded"));
        assert!(
            c.sql.contains("AND (t.\"tenant\", t.\"id\") <= (($2::text)::integer, ($3::text)::bigint) AND"),
            "{}",
            c.sql
        );
        assert!(
            c.sql.contains(
                "(t.\"region\" = ($4::text)::text OR t.\"id\" IN (($5::text)::bigint, ($6::text)::bigint)) ORDER BY"
            ),
            "{}",
            c.sql
        );
        assert!(c.sql.ends_with("LIMIT $7"));
        assert_eq!(c.params, ["900", "2", "9", "eu", "1", "2"]);
        let e = sql(estimate(&shape(), BOUND, Some((&filter, &type_of))));
        assert!(
            e.sql.starts_with(
                "SELECT count(*) FROM \"public\".\"orders\" t WHERE t.\"version\" <= ($1::text)::xid8 AND"
            ),
            "{}",
            e.sql
        );
        assert!(!e.sql.contains("ORDER BY") && !e.sql.contains("LIMIT"), "{}", e.sql);
    }

    #[test]
    fn a_partitions_chunk_reads_only_its_keys() {
        let partition = crate::config::Partition::new(1, std::num::NonZeroU32::new(4).expect("4"));
        let s = Shape { partition, ..shape() };
        let bound = Position::from(BOUND);
        let c = statement(&s, request(&bound, &Position::Null, None, None));
        let expected = format!("{} = 1", s.partition_expression(4, "t."));
        assert!(c.sql.contains(&format!("AND {expected} AND")), "{}", c.sql);
    }

    #[test]
    fn the_snapshot_start_is_the_newest_row_below_the_guard() {
        assert_eq!(
            newest_guarded(&shape()),
            "SELECT t.\"version\"::text, t.\"tenant\"::text, t.\"id\"::text FROM \"public\".\"orders\" t \
WHERE t.\"version\" < pg_snapshot_xmin(pg_current_snapshot()) ORDER BY t.\"version\" DESC, t.\"tenant\" DESC, t.\"id\" DESC LIMIT 1"
        );
    }
}
