//! Where each new partition starts: no later than the checkpoint of every old partition whose keys it may hold
//! (`plan::feeders`). The earliest of them when the source orders them without its database
//! ([`Source::position_order`]); otherwise (checkpoints of one transaction or change version, which any
//! multi-row write spanning the merged partitions leaves) a position the source names as no later than all of
//! them ([`Source::no_later_than`]: the cursor source asks PostgreSQL, the SQL Server sources step back one
//! version). Starting earlier delivers again what the later ones had passed (at-least-once allows it);
//! starting later would skip.

use super::layout::Loaded;
use super::plan::{earliest, feeders};
use super::report::OldPartition;
use crate::source::{Position, Source, StartFrom};
use std::collections::BTreeMap;

/// A new partition's start and the old partitions (with their checkpoints) it came from.
pub(super) type Start = (Position, Vec<OldPartition>);

/// Where the keys of an old partition without a document start (`--missing-from-earliest`, and some of the `n`
/// old partitions have none in `old`): the source's earliest position; `null` otherwise, or when the source
/// cannot say (a problem, said).
pub(super) async fn stand_in(
    source: &dyn Source,
    missing_from_earliest: bool,
    n: u32,
    old: &BTreeMap<u32, Loaded>,
    problems: &mut Vec<String>,
) -> Position {
    if !(missing_from_earliest && (0..n).any(|i| !old.contains_key(&i))) {
        return Position::Null;
    }
    match source.start_position(StartFrom::Earliest).await {
        Ok(p) => p,
        Err(e) => {
            problems.push(format!(
                "the earliest position of {} could not be read for the partitions without a document: {e}",
                source.name()
            ));
            Position::Null
        }
    }
}

/// Where each new partition `j` of `m` starts, the old layout of `n` being `old`. An old partition without a
/// document stands in at `stand_in` (`--missing-from-earliest`). A new partition no position can be found for
/// is a problem, said with what to do.
pub(super) async fn starts(
    source: &dyn Source,
    (n, m): (u32, u32),
    old: &BTreeMap<u32, Loaded>,
    stand_in: &Position,
    problems: &mut Vec<String>,
) -> BTreeMap<u32, Start> {
    let order = |a: &Position, b: &Position| source.position_order(a, b);
    let mut starts = BTreeMap::new();
    for j in 0..m {
        let from: Vec<OldPartition> = feeders(j, n, m)
            .iter()
            .map(|&i| OldPartition { index: i, checkpoint: old.get(&i).map(|(d, _)| d.checkpoint().clone()) })
            .collect();
        let positions: Vec<(u32, Position)> =
            from.iter().map(|o| (o.index, o.checkpoint.clone().unwrap_or_else(|| stand_in.clone()))).collect();
        let candidates: Vec<(u32, &Position)> = positions.iter().map(|(i, p)| (*i, p)).collect();
        let unordered = match earliest(&candidates, &order) {
            Ok((_, p)) => {
                starts.insert(j, (p.clone(), from));
                continue;
            }
            Err(pair) => pair,
        };
        let all: Vec<Position> = positions.iter().map(|(_, p)| p.clone()).collect();
        match source.no_later_than(&all).await {
            Ok(Some(p)) => {
                starts.insert(j, (p, from));
            }
            Ok(None) => problems.push(refusal(source, (j, m), n, &positions, unordered)),
            Err(e) => problems.push(format!(
                "new partition {j} of {m} must start no later than the checkpoints of old partitions {}, and {} could not say where that is: {e}. Run this again once the database answers",
                positions.iter().map(|(i, _)| i.to_string()).collect::<Vec<_>>().join(", "),
                source.name()
            )),
        }
    }
    starts
}

/// Why new partition `j` of `m` has no start: two checkpoints the source cannot order, nor name a position
/// before both of.
fn refusal(
    source: &dyn Source,
    (j, m): (u32, u32),
    n: u32,
    positions: &[(u32, Position)],
    (a, b): (u32, u32),
) -> String {
    let at = |k: u32| positions.iter().find(|(i, _)| *i == k).map(|(_, p)| p.to_string()).unwrap_or_default();
    format!(
        "new partition {j} of {m} may hold keys of old partitions {a} and {b}, whose checkpoints {} and {} {} can neither order nor name a position before: the new one must start no later than either. Choose a count that is a multiple of {n} (each new partition then carries one old checkpoint over exactly)",
        at(a),
        at(b),
        source.name()
    )
}
