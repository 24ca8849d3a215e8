//! Maps one batch onto the function's output bindings, by the routes of `config::outputs` (which binding
//! receives changes, rows or the whole batch; see there for the shapes and their defaults).
//!
//! Deletes sent to a binding that receives rows cannot be expressed (a row has no operation; the host's SQL
//! binding upserts and cannot delete): they are left out, counted per binding, and reported once per batch,
//! never dropped silently.
//!
//! With `messageFormat` `json` (the default) values are arrays or objects, never bare strings: the host
//! base64-decodes a top-level string when it can. With `text` each message travels as a JSON string holding
//! its text: an array of strings for bindings that send one message per element (the host writes each
//! element's bare text, untouched), one string for the others (a blob gets its UTF-8). Such a string always
//! starts with `{` or `[`, which base64 does not allow, so the host's base64 step leaves it alone. Why it
//! matters: the host re-reads JSON values with Newtonsoft, which turns decimals into doubles and moves
//! date-times to its own zone (docs/values.md).

use crate::change::{encode_batch, Change, Operation};
use crate::config::{MessageFormat, OutputRoute, OutputShape};
use serde_json::value::RawValue;
use std::collections::BTreeMap;

/// The `Outputs` object of one answer, plus what could not be expressed.
#[derive(Debug, Default)]
pub struct MappedOutputs {
    pub outputs: BTreeMap<String, Box<RawValue>>,
    /// Deletes that a binding could not express, per binding.
    pub dropped_deletes: Vec<(String, usize)>,
}

impl MappedOutputs {
    /// One line per binding that could not receive the batch's deletes, for the invocation's logs.
    pub fn report(&self) -> Vec<String> {
        self.dropped_deletes
            .iter()
            .map(|(binding, n)| {
                format!(
                    "{n} delete(s) not sent to output binding {binding:?}: it receives rows, which cannot express a delete; send deletes to a binding with shape changes or batch, or use deliveryMode sink with a postgres sink"
                )
            })
            .collect()
    }

    /// Deletes left out of this batch, over all bindings.
    pub fn deletes_not_sent(&self) -> u64 {
        self.dropped_deletes.iter().map(|(_, n)| *n as u64).sum()
    }
}

pub fn map(routes: &[OutputRoute], changes: &[Change], format: MessageFormat) -> MappedOutputs {
    let mut mapped = MappedOutputs::default();
    if changes.is_empty() {
        return mapped;
    }
    // Each shape is rendered at most once per batch, however many bindings share it.
    let mut all: Option<Box<RawValue>> = None;
    let mut rows: Option<(Box<RawValue>, usize)> = None;
    for route in routes {
        let value = match route.shape {
            OutputShape::Changes => all.get_or_insert_with(|| encode_batch(changes)).clone(),
            OutputShape::Rows => {
                let (value, deletes) = rows.get_or_insert_with(|| rows_of(changes));
                if *deletes > 0 {
                    mapped.dropped_deletes.push((route.binding.clone(), *deletes));
                }
                value.clone()
            }
            OutputShape::Batch => {
                let changes = all.get_or_insert_with(|| encode_batch(changes)).get();
                // One element of an array for bindings that send one message per element; the object itself
                // for bindings that take the value as one item.
                let text = if route.collector {
                    format!("[{{\"changes\":{changes}}}]")
                } else {
                    format!("{{\"changes\":{changes}}}")
                };
                RawValue::from_string(text).expect("an object around a JSON array is JSON")
            }
        };
        let value = match format {
            MessageFormat::Json => value,
            MessageFormat::Text => as_text(&value, route.collector),
        };
        mapped.outputs.insert(route.binding.clone(), value);
    }
    mapped
}

/// The value as JSON text in strings: each element's text for a collector (whose values are arrays), the
/// whole text otherwise.
fn as_text(value: &RawValue, collector: bool) -> Box<RawValue> {
    let text = if collector {
        let items: Vec<&RawValue> = serde_json::from_str(value.get()).expect("a collector's value is an array");
        let texts: Vec<&str> = items.iter().map(|item| item.get()).collect();
        serde_json::to_string(&texts)
    } else {
        serde_json::to_string(value.get())
    };
    RawValue::from_string(text.expect("strings always serialize")).expect("serialized strings are JSON")
}

/// The items of the non-delete changes as a JSON array, and how many deletes were left out.
fn rows_of(changes: &[Change]) -> (Box<RawValue>, usize) {
    let mut text = String::from("[");
    let mut deletes = 0;
    for c in changes {
        if c.operation == Operation::Delete {
            deletes += 1;
            continue;
        }
        if text.len() > 1 {
            text.push(',');
        }
        text.push_str(c.item.get());
    }
    text.push(']');
    (RawValue::from_string(text).expect("an array of JSON items is JSON"), deletes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(binding: &str, shape: OutputShape, collector: bool) -> OutputRoute {
        OutputRoute { binding: binding.into(), shape, collector }
    }

    fn changes() -> Vec<Change> {
        vec![
            Change::from_json(Operation::Insert, r#"{"Id":1,"Name":"a"}"#.into()).expect("json"),
            Change::from_json(Operation::Delete, r#"{"Id":2}"#.into()).expect("json"),
        ]
    }

    #[test]
    fn message_bindings_get_changes_and_rows_bindings_get_rows_without_deletes_reported_once() {
        let m = map(
            &[route("changes", OutputShape::Changes, true), route("rows", OutputShape::Rows, true)],
            &changes(),
            MessageFormat::Json,
        );
        assert_eq!(
            m.outputs["changes"].get(),
            r#"[{"Operation":0,"Item":{"Id":1,"Name":"a"}},{"Operation":2,"Item":{"Id":2}}]"#
        );
        assert_eq!(m.outputs["rows"].get(), r#"[{"Id":1,"Name":"a"}]"#);
        assert_eq!(m.dropped_deletes, vec![("rows".to_string(), 1)]);
        assert_eq!(m.deletes_not_sent(), 1);
        let report = m.report();
        assert_eq!(report.len(), 1);
        assert!(report[0].starts_with("1 delete(s) not sent to output binding \"rows\""), "{}", report[0]);
    }

    #[test]
    fn a_batch_is_one_message_wrapped_for_collectors_and_bare_for_single_item_bindings() {
        let routes = [route("q", OutputShape::Batch, true), route("blob", OutputShape::Batch, false)];
        let m = map(&routes, &changes(), MessageFormat::Json);
        let inner = r#"{"changes":[{"Operation":0,"Item":{"Id":1,"Name":"a"}},{"Operation":2,"Item":{"Id":2}}]}"#;
        assert_eq!(m.outputs["q"].get(), format!("[{inner}]"));
        assert_eq!(m.outputs["blob"].get(), inner);
        assert!(m.dropped_deletes.is_empty());
    }

    #[test]
    fn an_empty_batch_writes_nothing() {
        assert!(map(&[route("changes", OutputShape::Changes, true)], &[], MessageFormat::Json).outputs.is_empty());
    }

    #[test]
    fn text_sends_each_message_as_a_string_of_its_exact_json() {
        let changes = vec![
            Change::from_json(Operation::Insert, r#"{"Id":1,"Price":12345678901234567.89}"#.into()).expect("json"),
            Change::from_json(Operation::Update, r#"{"Id":2,"At":"2024-07-02T03:04:05.12+02:00"}"#.into())
                .expect("json"),
        ];
        let routes = [
            route("changes", OutputShape::Changes, true),
            route("audit", OutputShape::Batch, true),
            route("archive", OutputShape::Changes, false),
        ];
        let m = map(&routes, &changes, MessageFormat::Text);
        let one = r#"{"Operation":0,"Item":{"Id":1,"Price":12345678901234567.89}}"#;
        let two = r#"{"Operation":1,"Item":{"Id":2,"At":"2024-07-02T03:04:05.12+02:00"}}"#;
        let as_string = |text: &str| serde_json::to_string(text).expect("a string");
        assert_eq!(m.outputs["changes"].get(), format!("[{},{}]", as_string(one), as_string(two)));
        assert_eq!(m.outputs["audit"].get(), format!("[{}]", as_string(&format!(r#"{{"changes":[{one},{two}]}}"#))));
        assert_eq!(m.outputs["archive"].get(), as_string(&format!("[{one},{two}]")));
        // each string is the message's text exactly
        let decoded: Vec<String> = serde_json::from_str(m.outputs["changes"].get()).expect("strings");
        assert_eq!(decoded, [one, two]);
    }
}
