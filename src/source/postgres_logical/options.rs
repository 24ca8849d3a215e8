//! The `sqltrigger.json` keys only the logical source reads, checked when the source is built so a typo fails
//! at start-up with the key's name rather than on the first tick.

use crate::source::SourceError;
use serde_json::{Map, Value};

/// What a delete's `Item` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteItem {
    /// The key columns, like the official trigger (the default).
    Key,
    /// The whole old row; needs `REPLICA IDENTITY FULL`, since only then does the WAL carry it.
    Row,
}

/// What a `TRUNCATE` of the watched table does to the function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnTruncate {
    /// Stop at it with an error naming the transaction (the default): a truncate removes every row without a
    /// change per row, so a consumer that mirrors the table is now wrong, and someone must decide.
    Fail,
    /// Log an error and go on: the consumer does not mirror the table (a log, an outbox).
    Skip,
}

/// How the source reads the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    /// One logical replication connection per function, kept across ticks (the default).
    Stream,
    /// `pg_logical_slot_peek_binary_changes` on a pooled connection each tick: for servers and poolers that
    /// refuse a replication connection.
    Sql,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub slot: String,
    pub publication: String,
    pub delete_item: DeleteItem,
    pub include_metadata: bool,
    pub on_truncate: OnTruncate,
    /// Retained WAL above which status warns, in bytes.
    pub wal_warn_bytes: u64,
    pub reader: Reader,
    /// The stream's read-ahead bound: decoded changes held in memory, in bytes of pgoutput messages and in
    /// changes. Reading pauses at either.
    pub buffer_bytes: usize,
    pub buffer_changes: usize,
    /// The longest a tick waits for the stream to catch up with the WAL flushed when it started.
    pub poll_ms: u64,
    /// A process whose stream no tick has used for this long closes it, releasing the slot to another
    /// instance.
    pub idle_release_ms: u64,
}

/// Names PostgreSQL accepts for a replication slot (`ReplicationSlotValidateName`): lower-case letters,
/// digits and underscores, at most 63 bytes. Publications get the same rule so both can be written unquoted in
/// the commands an error prints.
fn slot_like_name(key: &str, v: &str) -> Result<String, SourceError> {
    if v.is_empty() || v.len() > 63 || !v.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') {
        return Err(SourceError::Invalid(format!(
            "{key} in sqltrigger.json is {v:?}; use 1 to 63 lower-case letters, digits and underscores (a replication slot's rule), for example \"sqltrigger_orders\""
        )));
    }
    Ok(v.to_string())
}

impl Options {
    pub fn parse(o: &Map<String, Value>) -> Result<Self, SourceError> {
        let bad = |key: &str, what: &str| SourceError::Invalid(format!("{key} in sqltrigger.json {what}"));
        let slot = match o.get("slotName") {
            Some(Value::String(s)) => slot_like_name("slotName", s)?,
            Some(_) => return Err(bad("slotName", "must be a string")),
            None => {
                return Err(bad(
                    "slotName",
                    "is required for postgres-logical: the replication slot this function reads, one per function (two functions on one slot would acknowledge each other's changes), for example \"sqltrigger_orders\"",
                ))
            }
        };
        let publication = match o.get("publicationName") {
            None => slot.clone(),
            Some(Value::String(s)) => slot_like_name("publicationName", s)?,
            Some(_) => return Err(bad("publicationName", "must be a string")),
        };
        let delete_item = match o.get("deleteItem").map(|v| v.as_str()) {
            None | Some(Some("key")) => DeleteItem::Key,
            Some(Some("row")) => DeleteItem::Row,
            Some(_) => return Err(bad("deleteItem", "must be \"key\" (the default) or \"row\"")),
        };
        let include_metadata = match o.get("includeMetadata") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(bad("includeMetadata", "must be true or false")),
        };
        let on_truncate = match o.get("onTruncate").map(|v| v.as_str()) {
            None | Some(Some("fail")) => OnTruncate::Fail,
            Some(Some("skip")) => OnTruncate::Skip,
            Some(_) => return Err(bad("onTruncate", "must be \"fail\" (the default) or \"skip\"")),
        };
        let wal_warn_bytes = match o.get("walRetainedWarnMb") {
            None => 1024 << 20,
            Some(v) => match v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())) {
                Some(mb) if (1..=1 << 30).contains(&mb) => mb << 20,
                _ => return Err(bad("walRetainedWarnMb", "must be a whole number of megabytes, at least 1")),
            },
        };
        let reader = match o.get("reader").map(|v| v.as_str()) {
            None | Some(Some("stream")) => Reader::Stream,
            Some(Some("sql")) => Reader::Sql,
            Some(_) => return Err(bad("reader", "must be \"stream\" (the default) or \"sql\"")),
        };
        let whole = |key: &str, default: u64, range: std::ops::RangeInclusive<u64>| match o.get(key) {
            None => Ok(default),
            Some(v) => match v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())) {
                Some(n) if range.contains(&n) => Ok(n),
                _ => Err(bad(key, &format!("must be a whole number from {} to {}", range.start(), range.end()))),
            },
        };
        let buffer_bytes = (whole("streamBufferMb", 64, 1..=4096)? << 20) as usize;
        let buffer_changes = whole("streamBufferChanges", 100_000, 100..=10_000_000)? as usize;
        let poll_ms = whole("streamPollMs", 500, 1..=60_000)?;
        let idle_release_ms = whole("streamIdleReleaseMs", 30_000, 100..=3_600_000)?;
        for key in ["cursorColumn", "cursorGuard", "insertedColumn", "softDeleteColumn", "safetyLagMs"] {
            if o.contains_key(key) {
                return Err(bad(key, "is for postgres-cursor; postgres-logical reads every change from the WAL and needs no cursor, insert marker or soft-delete column: remove it"));
            }
        }
        Ok(Self {
            slot,
            publication,
            delete_item,
            include_metadata,
            on_truncate,
            wal_warn_bytes,
            reader,
            buffer_bytes,
            buffer_changes,
            poll_ms,
            idle_release_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<Options, String> {
        Options::parse(v.as_object().expect("an object")).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_every_key() {
        let o = parse(json!({"slotName": "fn_orders"})).expect("valid");
        assert_eq!(o.publication, "fn_orders");
        assert_eq!((o.delete_item, o.include_metadata, o.on_truncate), (DeleteItem::Key, false, OnTruncate::Fail));
        assert_eq!(o.wal_warn_bytes, 1 << 30);
        assert_eq!((o.reader, o.buffer_bytes, o.buffer_changes), (Reader::Stream, 64 << 20, 100_000));
        assert_eq!((o.poll_ms, o.idle_release_ms), (500, 30_000));
        let o = parse(json!({"slotName": "s", "publicationName": "p", "deleteItem": "row", "includeMetadata": true,
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
    fn every_mistake_names_its_key() {
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
            let e = parse(v.clone()).expect_err("refused");
            assert!(e.starts_with(key), "{v}: {e}");
        }
    }
}
