//! Positions of the SQL Server sources, as the opaque JSON the engine stores.
//!
//! Change tracking: `{"phase":"changes","base":B,"last":{"version":V,"key":[...]}}` means "every net
//! change reported by `CHANGETABLE(CHANGES t, B)` up to `(V, key)` in `(version, key)` order was
//! delivered"; without `last` it means "everything up to version B". `{"phase":"snapshot","base":B,
//! "key":[...]}` is a walk of the current rows (startFrom snapshot, or a resync) that continues with the
//! changes after B, the version read before the walk began.
//!
//! Rowversion: `{"rv":R,"key":[...],"base":B}`: every row up to `(R, key)` in `(rowversion, key)` order;
//! without `key`, every row up to rowversion R. `base` is the rowversion the backlog being paged started
//! from (rows with an `insertedColumn` value at or above it are Inserts; 0: the table's first backlog, every
//! row an Insert); without it the base is R, which is what a drained read leaves (and what positions
//! written before the base existed mean).
//!
//! Key values are texts (see `types`): a position stays readable in the state document and a change of the
//! key's type is caught by the source fingerprint, not by a misparse.

use crate::source::{Position, SourceError};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Last {
    pub version: i64,
    pub key: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "lowercase", deny_unknown_fields)]
pub enum CtPosition {
    Changes {
        base: i64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        last: Option<Last>,
    },
    Snapshot {
        base: i64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<Vec<String>>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RvPosition {
    pub rv: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<i64>,
}

fn misfit(p: &Position, table: &str, why: &str) -> SourceError {
    SourceError::Invalid(format!(
        "stored position {p} does not fit {table} ({why}); the state was written by another source or version: reset it with `handler state reset <function> --to now --confirm`"
    ))
}

impl CtPosition {
    /// Reads a stored position. `Ok(None)` for `null` (before everything).
    pub fn parse(p: &Position, key_len: usize, table: &str) -> Result<Option<Self>, SourceError> {
        if p.is_null() {
            return Ok(None);
        }
        let pos: Self = serde_json::from_value(p.clone()).map_err(|e| misfit(p, table, &e.to_string()))?;
        let len = match &pos {
            Self::Changes { last: Some(l), .. } => Some(l.key.len()),
            Self::Snapshot { key: Some(k), .. } => Some(k.len()),
            _ => None,
        };
        if len.is_some_and(|n| n != key_len) {
            return Err(misfit(p, table, &format!("expected {key_len} key value(s)")));
        }
        Ok(Some(pos))
    }

    pub fn to_json(&self) -> Position {
        serde_json::to_value(self).unwrap_or(Position::Null)
    }
}

impl RvPosition {
    pub fn parse(p: &Position, key_len: usize, table: &str) -> Result<Option<Self>, SourceError> {
        if p.is_null() {
            return Ok(None);
        }
        let pos: Self = serde_json::from_value(p.clone()).map_err(|e| misfit(p, table, &e.to_string()))?;
        if pos.key.as_ref().is_some_and(|k| k.len() != key_len) {
            return Err(misfit(p, table, &format!("expected {key_len} key value(s)")));
        }
        Ok(Some(pos))
    }

    pub fn to_json(&self) -> Position {
        serde_json::to_value(self).unwrap_or(Position::Null)
    }

    /// The base rowversion of the backlog this position is in (see the module docs).
    pub fn base(&self) -> i64 {
        self.base.unwrap_or(self.rv)
    }
}

/// A change-tracking position no later than every one of `positions` ([`crate::source::Source::no_later_than`]:
/// checkpoints of merged partitions at the same version): everything up to the version before the smallest one,
/// `V - 1`. `CHANGETABLE(CHANGES t, V - 1)` reports again every key changed at `V` or later, each at its latest
/// version; a key whose last change came before `V` was delivered by its old partition, whose checkpoint is at
/// `V` or later. `None`: a snapshot walk is among them (the keys it has not walked yet are not changes after
/// any version), a position does not parse, or there is no earlier version.
pub fn ct_no_later_than(positions: &[Position]) -> Option<Position> {
    if positions.iter().any(Position::is_null) {
        return Some(Position::Null);
    }
    let mut smallest: Option<i64> = None;
    for p in positions {
        let version = match serde_json::from_value::<CtPosition>(p.clone()).ok()? {
            CtPosition::Changes { last: Some(last), .. } => last.version,
            CtPosition::Changes { base, last: None } => base,
            CtPosition::Snapshot { .. } => return None,
        };
        smallest = Some(smallest.map_or(version, |s| s.min(version)));
    }
    let base = smallest?.checked_sub(1).filter(|b| *b >= 0)?;
    Some(CtPosition::Changes { base, last: None }.to_json())
}

/// A rowversion position no later than every one of `positions` (as [`ct_no_later_than`]): every row up to
/// the rowversion before the smallest, `R - 1`, with the earliest base among them (rows inserted since are
/// Inserts). A row it passes over has a rowversion below `R`, so each old partition had delivered it. `None`: a
/// position does not parse, or there is no earlier rowversion.
pub fn rv_no_later_than(positions: &[Position]) -> Option<Position> {
    if positions.iter().any(Position::is_null) {
        return Some(Position::Null);
    }
    let parsed: Vec<RvPosition> =
        positions.iter().map(|p| serde_json::from_value(p.clone()).ok()).collect::<Option<_>>()?;
    let rv = parsed.iter().map(|p| p.rv).min()?.checked_sub(1).filter(|r| *r >= 0)?;
    let base = parsed.iter().map(RvPosition::base).min()?.min(rv);
    Some(RvPosition { rv, key: None, base: Some(base) }.to_json())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn positions_round_trip_as_readable_json() {
        let p = CtPosition::Changes { base: 10, last: Some(Last { version: 12, key: vec!["7".into()] }) };
        assert_eq!(p.to_json(), json!({"phase": "changes", "base": 10, "last": {"version": 12, "key": ["7"]}}));
        assert_eq!(CtPosition::parse(&p.to_json(), 1, "t").expect("parses"), Some(p));
        let s = CtPosition::Snapshot { base: 5, key: None };
        assert_eq!(s.to_json(), json!({"phase": "snapshot", "base": 5}));
        assert_eq!(CtPosition::parse(&Position::Null, 1, "t").expect("null"), None);
    }

    #[test]
    fn a_foreign_or_misshapen_position_is_refused_with_the_way_out() {
        let e = CtPosition::parse(&json!(["1", "2"]), 1, "dbo.T").unwrap_err().to_string();
        assert!(e.contains("does not fit dbo.T") && e.contains("handler state reset"), "{e}");
        let e = CtPosition::parse(
            &json!({"phase": "changes", "base": 1, "last": {"version": 2, "key": ["a", "b"]}}),
            1,
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("expected 1 key value"), "{e}");
        assert!(RvPosition::parse(&json!({"rv": 3, "key": ["1"]}), 1, "t").expect("valid").is_some());
        let mid_backlog = RvPosition::parse(&json!({"rv": 9, "key": ["1"], "base": 4}), 1, "t").expect("valid");
        assert_eq!(mid_backlog.map(|p| p.base()), Some(4));
    }

    #[test]
    fn checkpoints_at_one_version_start_from_the_version_before_it() {
        let at = |v: i64, k: &str| json!({"phase": "changes", "base": 3, "last": {"version": v, "key": [k]}});
        let merged = ct_no_later_than(&[at(12, "7"), at(12, "2"), json!({"phase": "changes", "base": 15})]);
        assert_eq!(merged, Some(json!({"phase": "changes", "base": 11})));
        let walking = json!({"phase": "snapshot", "base": 12, "key": ["4"]});
        assert_eq!(ct_no_later_than(&[at(12, "7"), walking]), None, "a walk's remaining keys are not changes");
        assert_eq!(ct_no_later_than(&[at(12, "7"), Position::Null]), Some(Position::Null));
    }

    #[test]
    fn rowversion_checkpoints_at_one_rowversion_start_from_the_one_before_it() {
        let merged = rv_no_later_than(&[
            json!({"rv": 40, "key": ["9"], "base": 30}),
            json!({"rv": 40, "key": ["2"]}),
            json!({"rv": 44}),
        ]);
        assert_eq!(merged, Some(json!({"rv": 39, "base": 30})));
        assert_eq!(rv_no_later_than(&[json!({"rv": 0, "key": ["1"]}), json!({"rv": 0})]), None);
    }
}
