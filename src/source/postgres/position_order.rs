//! A position no later than several checkpoints of the cursor source ([`Source::no_later_than`]), ordered by
//! the database: a partition that merges old partitions' keys (`handler partitions change`, 8 → 4) must start
//! no later than each of their checkpoints.
//!
//! A position is `[cursor, key...]` as texts, in `(cursor, key)` order. The cursors are ordered by PostgreSQL,
//! cast to the cursor's type (xid8 and integers, but also timestamps, whose texts carry offsets and so do not
//! sort as texts). When one checkpoint has the smallest cursor, it is the answer: exactly where it stopped.
//! When several share it (one transaction's rows, read by several partitions: any multi-row write spanning
//! them), their keys would have to be ordered too, by the key columns' collation; instead the answer steps the
//! cursor back by one unit (an integer or xid8 minus 1, a timestamp minus a microsecond, or a second where the
//! column keeps fewer digits) with any key. That is
//! no later than every checkpoint (its cursor is smaller), and it skips nothing: a row it passes over has a
//! cursor below the smallest checkpoint's, so each old partition had delivered it. What it delivers again is
//! that transaction's rows the partitions had passed, and nothing older than one unit of the cursor.
//!
//! [`Source::no_later_than`]: crate::source::Source::no_later_than

use super::connection::Connection;
use super::position::checkpoint_texts;
use super::sql::Shape;
use crate::source::{Position, SourceError};
use serde_json::Value;
use tokio_postgres::types::ToSql;

/// The statement that ranks `n` cursor texts (parameters `$1..$n`) by the database's order, each with the
/// text of the cursor one unit before it: rows of (input index, dense rank from 1, stepped text, `NULL` when
/// there is no earlier value: xid8 0).
pub(super) fn rank_cursors(shape: &Shape, n: usize) -> String {
    let ty = &shape.cursor_type;
    let values: Vec<String> = (0..n).map(|i| format!("({i}, (${}::text)::{ty})", i + 1)).collect();
    let step = if ty == "xid8" {
        // xid8 has no arithmetic: through numeric, read back as xid8 by the fetch.
        "CASE WHEN v.c::text::numeric > 0 THEN (v.c::text::numeric - 1)::text END".to_string()
    } else if ty.starts_with("timestamp") {
        // In the column's own type, as the fetch reads the text back: a column of fewer fractional digits
        // (`timestamp(3)`, `timestamptz(0)`) rounds a microsecond less back up to the cursor itself, which would
        // start the partition at one of the tied checkpoints and skip the others' keys. Then a whole second less,
        // exact at every precision.
        format!(
            "CASE WHEN (v.c - interval '1 microsecond')::{ty} < v.c THEN ((v.c - interval '1 microsecond')::{ty})::text \
             ELSE ((v.c - interval '1 second')::{ty})::text END"
        )
    } else {
        "(v.c - 1)::text".to_string()
    };
    format!("SELECT v.i, dense_rank() OVER (ORDER BY v.c), {step} FROM (VALUES {}) AS v(i, c)", values.join(", "))
}

/// One ranked cursor: the input's index, its rank (1: the smallest), the cursor one unit before it.
pub(super) type Ranked = (usize, i64, Option<String>);

/// The answer from the ranked cursors and the positions' texts: the one position with the smallest cursor,
/// else the smallest cursor stepped back with the first such position's key. `None`: there is no smaller
/// cursor value.
pub(super) fn choose(ranked: &[Ranked], texts: &[Vec<String>]) -> Option<Position> {
    let first: Vec<&Ranked> = ranked.iter().filter(|(_, rank, _)| *rank == 1).collect();
    match first[..] {
        [] => None,
        [(i, _, _)] => Some(as_position(texts.get(*i)?)),
        [(i, _, ref stepped), ..] => {
            let mut position = texts.get(*i)?.clone();
            *position.first_mut()? = stepped.clone()?;
            Some(as_position(&position))
        }
    }
}

fn as_position(texts: &[String]) -> Position {
    Value::Array(texts.iter().cloned().map(Value::String).collect())
}

/// See the module docs. Every position is a stored checkpoint (the caller answers `null`, before everything,
/// itself, before the table's shape is discovered).
pub(super) async fn no_later_than(
    conn: &Connection,
    shape: &Shape,
    positions: &[Position],
) -> Result<Option<Position>, SourceError> {
    let table = conn.table().to_string();
    let texts: Vec<Vec<String>> =
        positions.iter().map(|p| checkpoint_texts(shape, &table, p)).collect::<Result<_, _>>()?;
    if texts.is_empty() {
        return Ok(None);
    }
    let cursors: Vec<&String> = texts.iter().filter_map(|t| t.first()).collect();
    let params: Vec<&(dyn ToSql + Sync)> = cursors.iter().map(|c| *c as &(dyn ToSql + Sync)).collect();
    let client = conn.client().await?;
    let rows = client.query(&rank_cursors(shape, cursors.len()), &params).await.map_err(|e| conn.error(e))?;
    let ranked: Vec<Ranked> =
        rows.iter().map(|r| (usize::try_from(r.get::<_, i32>(0)).unwrap_or(usize::MAX), r.get(1), r.get(2))).collect();
    Ok(choose(&ranked, &texts))
}

#[cfg(test)]
mod tests {
    use super::super::sql::Guard;
    use super::*;
    use serde_json::json;

    fn texts(positions: &[[&str; 2]]) -> Vec<Vec<String>> {
        positions.iter().map(|p| p.iter().map(|t| t.to_string()).collect()).collect()
    }

    #[test]
    fn the_one_checkpoint_with_the_smallest_cursor_is_the_answer_exactly() {
        let t = texts(&[["900", "7"], ["880", "3"], ["905", "1"]]);
        let ranked = [(0, 2, Some("899".into())), (1, 1, Some("879".into())), (2, 3, Some("904".into()))];
        assert_eq!(choose(&ranked, &t), Some(json!(["880", "3"])));
    }

    #[test]
    fn checkpoints_of_one_transaction_start_one_cursor_unit_before_it() {
        // Two partitions stopped inside transaction 880's rows (keys 12 and 4), a third later.
        let t = texts(&[["880", "12"], ["880", "4"], ["905", "1"]]);
        let ranked = [(0, 1, Some("879".into())), (1, 1, Some("879".into())), (2, 2, Some("904".into()))];
        assert_eq!(choose(&ranked, &t), Some(json!(["879", "12"])));
        // Timestamps step by the text the database computed.
        let t = texts(&[["2026-01-01 00:00:00+00", "2"], ["2026-01-01 00:00:00+00", "1"]]);
        let stepped = Some("2025-12-31 23:59:59.999999+00".to_string());
        let ranked = [(0, 1, stepped.clone()), (1, 1, stepped)];
        assert_eq!(choose(&ranked, &t), Some(json!(["2025-12-31 23:59:59.999999+00", "2"])));
    }

    #[test]
    fn an_xid8_cursor_of_zero_has_no_earlier_value() {
        let t = texts(&[["0", "1"], ["0", "2"]]);
        assert_eq!(choose(&[(0, 1, None), (1, 1, None)], &t), None);
    }

    #[test]
    fn the_ranking_statement_casts_each_cursor_and_steps_it_by_its_type() {
        let shape = |ty: &str| Shape { cursor_type: ty.into(), ..super::super::sql::tests::shape(Guard::Xid8) };
        assert_eq!(
            rank_cursors(&shape("xid8"), 2),
            "SELECT v.i, dense_rank() OVER (ORDER BY v.c), CASE WHEN v.c::text::numeric > 0 THEN (v.c::text::numeric - 1)::text END FROM (VALUES (0, ($1::text)::xid8), (1, ($2::text)::xid8)) AS v(i, c)"
        );
        assert!(rank_cursors(&shape("timestamp with time zone"), 1).contains(
            "CASE WHEN (v.c - interval '1 microsecond')::timestamp with time zone < v.c THEN ((v.c - interval '1 microsecond')::timestamp with time zone)::text ELSE ((v.c - interval '1 second')::timestamp with time zone)::text END"
        ));
        assert!(rank_cursors(&shape("bigint"), 1).contains("(v.c - 1)::text"));
    }
}
