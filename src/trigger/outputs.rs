//! Maps one batch onto the function's output bindings.
//!
//! Message bindings (queue, serviceBus, eventHub, blob and anything unknown) receive the change objects as a
//! JSON array: the host turns an array into one message per element. A `sql` output binding receives plain
//! rows, because the host's SQL binding upserts and cannot delete; deletes sent there are counted and reported,
//! never dropped silently. Values are always arrays, never bare strings (the host base64-decodes those).

use crate::change::{encode_batch, Change, Operation};
use crate::config::OutputBinding;
use serde_json::value::RawValue;
use std::collections::BTreeMap;

/// The `Outputs` object of one answer, plus what could not be expressed.
#[derive(Debug, Default)]
pub struct MappedOutputs {
    pub outputs: BTreeMap<String, Box<RawValue>>,
    /// Deletes that a binding could not express, per binding.
    pub dropped_deletes: Vec<(String, usize)>,
}

pub fn map(bindings: &[OutputBinding], changes: &[Change]) -> MappedOutputs {
    let mut mapped = MappedOutputs::default();
    if changes.is_empty() {
        return mapped;
    }
    let mut all: Option<Box<RawValue>> = None;
    for b in bindings {
        if b.kind.eq_ignore_ascii_case("sql") {
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
            if deletes > 0 {
                mapped.dropped_deletes.push((b.name.clone(), deletes));
            }
            let rows = RawValue::from_string(text).expect("an array of JSON items is JSON");
            mapped.outputs.insert(b.name.clone(), rows);
        } else {
            let value = all.get_or_insert_with(|| encode_batch(changes)).clone();
            mapped.outputs.insert(b.name.clone(), value);
        }
    }
    mapped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(name: &str, kind: &str) -> OutputBinding {
        OutputBinding { name: name.into(), kind: kind.into() }
    }

    #[test]
    fn message_bindings_get_changes_and_sql_gets_rows_without_deletes() {
        let changes = vec![
            Change::from_json(Operation::Insert, r#"{"Id":1,"Name":"a"}"#.into()).expect("json"),
            Change::from_json(Operation::Delete, r#"{"Id":2}"#.into()).expect("json"),
        ];
        let m = map(&[binding("changes", "queue"), binding("rows", "sql")], &changes);
        assert_eq!(
            m.outputs["changes"].get(),
            r#"[{"Operation":0,"Item":{"Id":1,"Name":"a"}},{"Operation":2,"Item":{"Id":2}}]"#
        );
        assert_eq!(m.outputs["rows"].get(), r#"[{"Id":1,"Name":"a"}]"#);
        assert_eq!(m.dropped_deletes, vec![("rows".to_string(), 1)]);
    }

    #[test]
    fn an_empty_batch_writes_nothing() {
        assert!(map(&[binding("changes", "queue")], &[]).outputs.is_empty());
    }
}
