//! The kind-specific keys, as the sources' own option parsers were tested before they moved to config.

use super::*;
use serde_json::json;

/// One of the kind-specific readers.
type ParseFn<T> = fn(&Map<String, Value>, &str, &mut Vec<ConfigError>) -> Option<T>;

fn errors_of<T>(v: Value, parse: ParseFn<T>) -> Result<T, Vec<String>> {
    let mut errors = Vec::new();
    let parsed = parse(v.as_object().expect("an object"), "f/sqltrigger.json", &mut errors);
    match parsed {
        Some(options) if errors.is_empty() => Ok(options),
        _ => Err(errors.iter().map(ToString::to_string).collect()),
    }
}

fn logical(v: Value) -> Result<PostgresLogicalOptions, Vec<String>> {
    errors_of(v, postgres_logical)
}

fn ct(v: Value) -> Result<ChangeTrackingOptions, Vec<String>> {
    errors_of(v, change_tracking)
}

#[test]
fn logical_defaults_and_every_key() {
    let o = logical(json!({"slotName": "fn_orders"})).expect("valid");
    assert_eq!(o.publication, "fn_orders");
    assert_eq!((o.delete_item, o.include_metadata, o.on_truncate), (DeleteItem::Key, false, OnTruncate::Fail));
    assert_eq!(o.wal_warn_bytes, 1 << 30);
    assert_eq!((o.reader, o.buffer_bytes, o.buffer_changes), (Reader::Stream, 64 << 20, 100_000));
    assert_eq!((o.poll_ms, o.idle_release_ms), (500, 30_000));
    let o = logical(json!({"slotName": "s", "publicationName": "p", "deleteItem": "row", "includeMetadata": true,
        "onTruncate": "skip", "walRetainedWarnMb": "5", "reader": "sql", "streamBufferMb": 2,
        "streamBufferChanges": 500, "streamPollMs": 50, "streamIdleReleaseMs": "1000"}))
    .expect("valid");
    assert_eq!(
        (o.publication.as_str(), o.delete_item, o.on_truncate, o.wal_warn_bytes),
        ("p", DeleteItem::Row, OnTruncate::Skip, 5 << 20)
    );
    assert_eq!((o.reader, o.buffer_bytes, o.buffer_changes), (Reader::Sql, 2 << 20, 500));
    assert_eq!((o.poll_ms, o.idle_release_ms), (50, 1000));
}

#[test]
fn every_logical_mistake_names_its_key() {
    for (v, key) in [
        (json!({}), "slotName"),
        (json!({"slotName": "Orders"}), "slotName"),
        (json!({"slotName": "a-b"}), "slotName"),
        (json!({"slotName": "x".repeat(64)}), "slotName"),
        (json!({"slotName": "s", "publicationName": "p q"}), "publicationName"),
        (json!({"slotName": "s", "deleteItem": "all"}), "deleteItem"),
        (json!({"slotName": "s", "onTruncate": true}), "onTruncate"),
        (json!({"slotName": "s", "includeMetadata": "yes"}), "includeMetadata"),
        (json!({"slotName": "s", "walRetainedWarnMb": 0}), "walRetainedWarnMb"),
        (json!({"slotName": "s", "cursorColumn": "v"}), "cursorColumn"),
        (json!({"slotName": "s", "reader": "peek"}), "reader"),
        (json!({"slotName": "s", "streamBufferMb": 0}), "streamBufferMb"),
        (json!({"slotName": "s", "streamBufferChanges": -1}), "streamBufferChanges"),
        (json!({"slotName": "s", "streamPollMs": "soon"}), "streamPollMs"),
        (json!({"slotName": "s", "streamIdleReleaseMs": 1}), "streamIdleReleaseMs"),
    ] {
        let e = logical(v.clone()).expect_err("refused");
        assert!(e[0].starts_with(&format!("{key} in f/sqltrigger.json: ")), "{v}: {e:?}");
    }
    // AND every mistake is listed at once
    let e = logical(json!({"deleteItem": "all", "onTruncate": 1})).expect_err("refused");
    assert_eq!(e.len(), 3, "{e:?}");
}

#[test]
fn change_tracking_defaults_refuse_lost_positions_and_skip_nothing() {
    let o = ct(json!({})).expect("valid");
    assert_eq!(o.on_position_lost, OnPositionLost::Fail);
    assert_eq!(o.skip_context, None);
    assert!(!o.include_metadata);
}

#[test]
fn a_context_is_hex_or_text() {
    assert_eq!(context_bytes("0x0A0b").expect("hex"), vec![0x0a, 0x0b]);
    assert_eq!(context_bytes("my-app").expect("text"), b"my-app".to_vec());
    assert!(context_bytes("0xABC").unwrap_err().contains("even number"));
    assert!(context_bytes(&"x".repeat(129)).unwrap_err().contains("1 to 128 bytes"));
    let o = ct(json!({"skipOwnChangesContext": true, "changeTrackingContext": "0x01"})).expect("valid");
    assert_eq!(o.skip_context, Some(vec![1]));
    let e = ct(json!({"skipOwnChangesContext": true})).unwrap_err();
    assert!(e[0].contains("changeTrackingContext is not set"), "{e:?}");
}

#[test]
fn bad_change_tracking_values_name_their_key() {
    let e = ct(json!({"onPositionLost": "skip"})).unwrap_err();
    assert!(e[0].starts_with("onPositionLost in f/sqltrigger.json"), "{e:?}");
    let e = ct(json!({"includeMetadata": "yes"})).unwrap_err();
    assert!(e[0].starts_with("includeMetadata"), "{e:?}");
    assert!(ct(json!({"onPositionLost": "resync", "startFrom": "snapshot"})).is_ok());
}

fn partition_column_of(v: Value, kind: SourceKind) -> Result<Option<Ident>, Vec<String>> {
    let mut errors = Vec::new();
    let parsed = partition_column(v.as_object().expect("an object"), kind, "f/sqltrigger.json", &mut errors);
    if errors.is_empty() {
        Ok(parsed)
    } else {
        Err(errors.iter().map(ToString::to_string).collect())
    }
}

#[test]
fn a_partition_column_is_read_for_a_partitioned_rowversion_source_only() {
    let rv = SourceKind::MssqlRowversion;
    assert_eq!(partition_column_of(json!({}), rv), Ok(None));
    let named = partition_column_of(json!({"partitions": 8, "partitionColumn": "sqltrigger_p8"}), rv).expect("valid");
    assert_eq!(named.as_ref().map(Ident::as_str), Some("sqltrigger_p8"));
    for (v, why) in [
        (json!({"partitionColumn": "p"}), "needs \"partitions\" above 1"),
        (json!({"partitions": 1, "partitionColumn": "p"}), "needs \"partitions\" above 1"),
        (json!({"partitions": 8, "partitionColumn": 3}), "must be a column name"),
    ] {
        let errors = partition_column_of(v.clone(), rv).expect_err("refused");
        assert!(
            errors.iter().any(|e| e.starts_with("partitionColumn in f/sqltrigger.json") && e.contains(why)),
            "{v}: {errors:?}"
        );
    }
    let ct = partition_column_of(json!({"partitions": 8, "partitionColumn": "p"}), SourceKind::MssqlChangeTracking);
    assert!(ct.expect_err("refused").iter().any(|e| e.contains("filters each change by the hash of its key")));
}
