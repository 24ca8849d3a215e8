//! The fingerprints stored states hold.

use super::*;
use crate::config::{Env, SourceKind};

fn spec(kind: SourceKind, table: &str, key: Option<&[&str]>) -> SourceSpec {
    let env = Env::from_pairs([("Db".into(), "unused".into())]);
    let sqltrigger = serde_json::json!({ "source": kind.as_str(), "tableName": table,
        "connectionStringSetting": "Db", "primaryKey": key, "cursorColumn": "c" });
    let sqltrigger = serde_json::Value::Object(
        sqltrigger
            .as_object()
            .expect("an object")
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    );
    SourceSpec::from_json(&sqltrigger, &env).expect("a valid spec")
}

#[test]
fn fingerprints_are_the_digests_stored_states_hold() {
    // Pinned values, computed outside Rust (`sha256` of the text, first 16 hex digits): a state written by
    // an earlier release must still match.
    let pg = spec(SourceKind::PostgresCursor, "public.orders", Some(&["id"]));
    assert_eq!(fingerprint(&pg, Some("xmin8")), "dfee9c56e23c95fa");
    let ct = spec(SourceKind::MssqlChangeTracking, "dbo.Orders", None);
    assert_eq!(fingerprint(&ct, None), "600a545d732e771b");
    let rv = spec(SourceKind::MssqlRowversion, "dbo.Items", Some(&["Id", "Line"]));
    assert_eq!(fingerprint(&rv, Some("(rowversion)")), "8d4960d6f28e9c51");
}
