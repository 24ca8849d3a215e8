//! Reading a state document back from the store. An operator can edit it by hand (Storage Explorer, the
//! portal), so what comes back is checked as untrusted input: it must be JSON, of a schema this handler
//! understands, with every field of its type, and hold together (a batch in flight starts at the checkpoint
//! and has an id below `next_batch_id`). Anything else is refused with the field named; nothing here repairs a
//! document, and the caller writes nothing over it.

use super::{Origin, StateDoc, SCHEMA};
use serde_json::{Map, Value};
use time::OffsetDateTime;

/// The document in `bytes`, or what is wrong with it, naming the field.
pub fn read(bytes: &[u8]) -> Result<StateDoc, String> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| format!("it is not JSON ({e})"))?;
    let Some(object) = value.as_object() else { return Err("it is not a JSON object".into()) };
    match object.get("schema") {
        // A newer handler may have changed any field: nothing else is read.
        Some(Value::Number(n)) if n.as_u64().is_some_and(|s| s > u64::from(SCHEMA)) => {
            return Err(format!(
                "field `schema` is {n}, newer than this handler understands ({SCHEMA}): a newer handler wrote it, so upgrade this one rather than reset it"
            ))
        }
        Some(Value::Number(n)) if n.as_u64().is_some() => {}
        Some(other) => return Err(format!("field `schema` is {other}, not a schema number")),
        None => return Err("field `schema` is missing".into()),
    }
    let doc: StateDoc = serde_json::from_value(value.clone()).map_err(|e| match field_at_fault(object) {
        Some(field) => format!("field `{field}`: {e}"),
        None => e.to_string(),
    })?;
    check(&doc)?;
    Ok(doc)
}

/// The first field that alone makes a valid document unreadable. serde names a missing field but not the field
/// holding a value of the wrong type, so each stored field is tried in a document that is otherwise valid.
fn field_at_fault(object: &Map<String, Value>) -> Option<String> {
    let origin = Origin { function: "f", source: "s", fingerprint: "f" };
    let valid = StateDoc::new(origin, Value::Null, "reader", OffsetDateTime::UNIX_EPOCH);
    let Ok(Value::Object(template)) = serde_json::to_value(valid) else { return None };
    object.iter().find_map(|(field, stored)| {
        let mut probe = template.clone();
        probe.insert(field.clone(), stored.clone());
        serde_json::from_value::<StateDoc>(Value::Object(probe)).is_err().then(|| field.clone())
    })
}

/// A number in a position that is not an integer: no source writes one (positions hold integers and strings),
/// and a float would not even read back as the same number after a write (found by the state-document fuzz
/// target: `333333333333332425333333333333333333333333333333` came back changed).
fn fractional(position: &Value) -> Option<&serde_json::Number> {
    match position {
        Value::Number(n) if !n.is_i64() && !n.is_u64() => Some(n),
        Value::Array(items) => items.iter().find_map(fractional),
        Value::Object(fields) => fields.values().find_map(fractional),
        _ => None,
    }
}

/// Refuses the first of `positions` (each with its field's name) that holds a non-integer number; the state
/// and quarantine readers share it.
pub(super) fn integer_positions(positions: &[(&str, &Value)]) -> Result<(), String> {
    match positions.iter().find_map(|(field, p)| Some((field, fractional(p)?))) {
        Some((field, n)) => Err(format!(
            "field `{field}` holds the number {n}, which no source writes (positions hold integers and strings)"
        )),
        None => Ok(()),
    }
}

/// What every document a handler writes holds to, whatever the source.
fn check(doc: &StateDoc) -> Result<(), String> {
    let mut positions = vec![("checkpoint", &doc.checkpoint)];
    if let Some(flight) = &doc.in_flight {
        positions.extend([("in_flight.from", &flight.range.from), ("in_flight.to", &flight.range.to)]);
    }
    for entry in &doc.quarantine {
        positions.extend([("quarantine.from", &entry.range.from), ("quarantine.to", &entry.range.to)]);
    }
    if let Some(b) = &doc.backfill {
        positions.extend([("backfill.bound", &b.bound), ("backfill.after", &b.after)]);
    }
    integer_positions(&positions)?;
    if let Some(flight) = &doc.in_flight {
        if flight.batches == 0 {
            return Err("field `in_flight.batches` is 0: a batch in flight holds at least one batch".into());
        }
        if flight.range.batch_id >= doc.next_batch_id {
            return Err(format!(
                "field `in_flight.batch_id` is {}, not below `next_batch_id` {}: batch ids are given out in order",
                flight.range.batch_id, doc.next_batch_id
            ));
        }
        // Every batch in flight starts where the checkpoint is, but an operator's retry of a quarantined batch,
        // which lies before it.
        // A backfill chunk starts at its backfill's position instead (a chunk of a backfill replaced since
        // starts where that one was, which the document no longer says).
        let start = match (&flight.range.backfill, &doc.backfill) {
            (Some(id), Some(b)) if *id == b.id => Some(&b.after),
            (Some(_), _) => None,
            (None, _) => Some(&doc.checkpoint),
        };
        if let Some(start) = start.filter(|s| flight.quarantined.is_none() && flight.range.from != **s) {
            return Err(format!(
                "field `in_flight.from` is {}, but the {} is {start}: a batch in flight starts there",
                flight.range.from,
                if flight.range.backfill.is_some() { "backfill's position" } else { "checkpoint" },
            ));
        }
        if flight.range.rows > 0 && flight.range.from == flight.range.to {
            return Err(format!(
                "field `in_flight.to` equals `in_flight.from` ({}), but the batch holds {} row(s)",
                flight.range.to, flight.range.rows
            ));
        }
    }
    if doc.lease.as_ref().is_some_and(|l| l.token == 0) {
        return Err("field `lease.token` is 0: fencing tokens start at 1".into());
    }
    Ok(())
}
