//! The oracle: PostgreSQL's own output. `row_to_json` of each row in a canonical session (the session contract
//! of docs/values.md, written out here rather than taken from the handler, so the oracle does not depend on the
//! code under test; `TimeZone` stays the database's, as the contract says), with a top-level bytea column as
//! base64 (what every path promises). And each column's canonical text, to read a sink's target back.

use super::schema::{self, Column, COLUMNS};
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use testbed::embedded;

/// The settings the docs promise every handler session has (docs/values.md, "The session contract").
pub const CANONICAL: &[(&str, &str)] = &[
    ("DateStyle", "ISO, MDY"),
    ("IntervalStyle", "postgres"),
    ("extra_float_digits", "3"),
    ("bytea_output", "hex"),
    ("standard_conforming_strings", "on"),
    ("xmloption", "content"),
];

/// A session of the database at `url` with the canonical settings (and the database's `TimeZone`).
pub async fn canonical_session(url: &str) -> tokio_postgres::Client {
    let db = embedded::connect(url).await.expect("connect for the oracle");
    for (name, value) in CANONICAL {
        db.batch_execute(&format!("SET {name} TO '{value}'")).await.unwrap_or_else(|e| panic!("SET {name}: {e}"));
    }
    db
}

/// The `Item` JSON of every row, by id: `row_to_json` of `columns`, bytea as base64.
pub async fn items(db: &tokio_postgres::Client, table: &str, columns: &[&Column]) -> BTreeMap<i64, String> {
    let projection: Vec<String> = std::iter::once("t.id AS id".to_string())
        .chain(columns.iter().map(|c| {
            let name = schema::quoted(c.name);
            if c.ty == "bytea" {
                format!("translate(encode(t.{name}, 'base64'), E'\\n', '') AS {name}")
            } else {
                format!("t.{name} AS {name}")
            }
        }))
        .collect();
    let sql = format!(
        "SELECT t.id, row_to_json(r)::text FROM public.{table} t CROSS JOIN LATERAL (SELECT {}) r ORDER BY t.id",
        projection.join(", ")
    );
    let rows = db.query(&sql, &[]).await.unwrap_or_else(|e| panic!("the oracle's items of {table}: {e}"));
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

/// Each column's text (`::text`, NULL as `None`) of every row, by id: what a target table holds, exactly.
pub async fn texts(db: &tokio_postgres::Client, table: &str) -> BTreeMap<i64, Vec<Option<String>>> {
    let columns: Vec<String> = COLUMNS.iter().map(|c| format!("t.{}::text", schema::quoted(c.name))).collect();
    let sql = format!("SELECT t.id, {} FROM public.{table} t ORDER BY t.id", columns.join(", "));
    let rows = db.query(&sql, &[]).await.unwrap_or_else(|e| panic!("the texts of {table}: {e}"));
    rows.iter().map(|r| (r.get(0), (1..=COLUMNS.len()).map(|i| r.get(i)).collect())).collect()
}

/// An `Item`'s columns and the raw JSON text of each value.
pub fn cells(item: &str) -> BTreeMap<String, String> {
    let map: BTreeMap<String, Box<RawValue>> =
        serde_json::from_str(item).unwrap_or_else(|e| panic!("not a JSON object ({e}): {}", preview(item)));
    map.into_iter().map(|(k, v)| (k, v.get().to_string())).collect()
}

/// The `Item` of a change message (`{"Operation":..,"Item":{..}}`, any spacing) as raw text, and its operation.
pub fn item_of(message: &str) -> (i64, String) {
    #[derive(serde::Deserialize)]
    struct Message<'a> {
        #[serde(rename = "Operation")]
        operation: i64,
        #[serde(rename = "Item", borrow)]
        item: &'a RawValue,
    }
    let m: Message =
        serde_json::from_str(message).unwrap_or_else(|e| panic!("not a change message ({e}): {}", preview(message)));
    (m.operation, m.item.get().to_string())
}

/// The id of an `Item`.
pub fn id_of(item: &str) -> i64 {
    let cells = cells(item);
    cells.get("id").and_then(|id| id.parse().ok()).unwrap_or_else(|| panic!("no id in {}", preview(item)))
}

/// At most 300 characters of `text`: the 1 MB values would drown a failure's message.
pub fn preview(text: &str) -> String {
    if text.chars().count() <= 300 {
        text.to_string()
    } else {
        format!("{}… ({} bytes)", text.chars().take(300).collect::<String>(), text.len())
    }
}
