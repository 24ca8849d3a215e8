//! A change and a batch, in the payload shape of the official Azure SQL trigger:
//! `[{"Operation":0,"Item":{...}}]` with Insert = 0, Update = 1, Delete = 2.
//!
//! `Item` is kept as the JSON text the database produced (`RawValue`): sources build row JSON server-side,
//! with exact numerics and ISO 8601 dates, and the engine never re-parses it on the hot path. (The Functions
//! host does re-parse it before its output bindings write it, unless `messageFormat` is `text`: docs/values.md.)

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

/// What happened to a row since the last delivered position (net change, like CHANGETABLE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    Insert = 0,
    Update = 1,
    Delete = 2,
}

impl Operation {
    pub fn from_code(code: i64) -> Option<Self> {
        match code {
            0 => Some(Self::Insert),
            1 => Some(Self::Update),
            2 => Some(Self::Delete),
            _ => None,
        }
    }
}

impl Serialize for Operation {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u8(*self as u8)
    }
}

impl<'de> Deserialize<'de> for Operation {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let code = i64::deserialize(d)?;
        Self::from_code(code).ok_or_else(|| serde::de::Error::custom(format!("operation {code} is not 0, 1 or 2")))
    }
}

/// One changed row. For deletes `item` holds only the primary-key columns.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Change {
    #[serde(rename = "Operation")]
    pub operation: Operation,
    #[serde(rename = "Item")]
    pub item: Box<RawValue>,
    /// Change metadata (version, changed columns) when a source is asked for it; absent otherwise.
    #[serde(rename = "Metadata", default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Box<RawValue>>,
}

impl Change {
    /// Builds a change from row JSON text. Fails only if the text is not JSON, which a source treats as a bug.
    pub fn from_json(operation: Operation, item: String) -> Result<Self, serde_json::Error> {
        Ok(Self { operation, item: RawValue::from_string(item)?, metadata: None })
    }
}

/// Encodes changes as the JSON array the host hands to output bindings.
pub fn encode_batch(changes: &[Change]) -> Box<RawValue> {
    let text = serde_json::to_string(changes).expect("changes of raw JSON always serialize");
    RawValue::from_string(text).expect("a serialized array is valid JSON")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_the_official_payload_shape() {
        let changes = vec![
            Change::from_json(Operation::Insert, r#"{"Id":1,"Price":12.3456789012345678901}"#.into()).unwrap(),
            Change::from_json(Operation::Delete, r#"{"Id":2}"#.into()).unwrap(),
        ];
        assert_eq!(
            encode_batch(&changes).get(),
            r#"[{"Operation":0,"Item":{"Id":1,"Price":12.3456789012345678901}},{"Operation":2,"Item":{"Id":2}}]"#
        );
    }
}
