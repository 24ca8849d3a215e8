//! What each kind of source reads from `sqltrigger.json` besides its table and connection, typed and checked at
//! load: a typo fails at start-up in the one list of problems, naming its key, rather than when the source is
//! built or on the first tick.

use super::error::ConfigError;
use super::SourceKind;
use crate::ident::Ident;
use serde_json::{Map, Value};
use std::time::Duration;

/// How the postgres-cursor source keeps a transaction that commits late from being skipped (`cursorGuard`);
/// unset, the source picks one from the cursor column's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CursorGuard {
    /// `xid8`: read only below the oldest running transaction (an xid8 cursor column).
    Xid8,
    /// `lag`: read only rows older than `safetyLagMs` (a timestamp cursor column).
    Lag,
    /// `none`: no guard; the author accepts that a late commit may be skipped.
    Unguarded,
}

impl CursorGuard {
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Xid8 => "xid8",
            Self::Lag => "lag",
            Self::Unguarded => "none",
        }
    }
}

/// The postgres-cursor source's own keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresCursorOptions {
    pub cursor_column: Ident,
    pub cursor_guard: Option<CursorGuard>,
    /// `safetyLagMs` (5 s by default): how old a row must be before the `lag` guard reads it.
    pub safety_lag: Duration,
    pub inserted_column: Option<Ident>,
    pub soft_delete_column: Option<Ident>,
}

/// The mssql-rowversion source's own keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RowversionOptions {
    /// The rowversion column; unset, the table's only one.
    pub cursor_column: Option<Ident>,
    pub inserted_column: Option<Ident>,
    pub soft_delete_column: Option<Ident>,
    /// `partitionColumn`: a persisted computed column holding each row's partition,
    /// `(CHECKSUM(<key>) & 2147483647) % N`, so a partition's fetch seeks an index on (it, rowversion, key).
    /// Only with `"partitions"` above 1; unset there, the hash is computed inline and every partition reads every
    /// changed row (docs/sql-server.md, "Partitions").
    pub partition_column: Option<Ident>,
}

/// What a delete's `Item` holds (postgres-logical `deleteItem`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteItem {
    /// The key columns, like the official trigger (the default).
    Key,
    /// The whole old row; needs `REPLICA IDENTITY FULL`, since only then does the WAL carry it.
    Row,
}

/// What a `TRUNCATE` of the watched table does to the function (postgres-logical `onTruncate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnTruncate {
    /// Stop at it with an error naming the transaction (the default): a truncate removes every row without a
    /// change per row, so a consumer that mirrors the table is now wrong, and someone must decide.
    Fail,
    /// Log an error and go on: the consumer does not mirror the table (a log, an outbox).
    Skip,
}

/// How the postgres-logical source reads its slot (`reader`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    /// One logical replication connection per function, kept across ticks (the default).
    Stream,
    /// `pg_logical_slot_peek_binary_changes` on a pooled connection each tick: for servers and poolers that
    /// refuse a replication connection.
    Sql,
}

/// The postgres-logical source's own keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresLogicalOptions {
    pub slot: String,
    pub publication: String,
    pub delete_item: DeleteItem,
    pub include_metadata: bool,
    pub on_truncate: OnTruncate,
    /// Retained WAL above which status warns, in bytes (`walRetainedWarnMb`).
    pub wal_warn_bytes: u64,
    pub reader: Reader,
    /// The stream's read-ahead bound: decoded changes held in memory, in bytes of pgoutput messages
    /// (`streamBufferMb`) and in changes (`streamBufferChanges`). Reading pauses at either.
    pub buffer_bytes: usize,
    pub buffer_changes: usize,
    /// The longest a tick waits for the stream to catch up with the WAL flushed when it started (`streamPollMs`).
    pub poll_ms: u64,
    /// A process whose stream no tick has used for this long closes it, releasing the slot to another
    /// instance (`streamIdleReleaseMs`).
    pub idle_release_ms: u64,
}

/// What to do when change tracking no longer holds the changes after the stored position (`onPositionLost`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnPositionLost {
    /// Stop with `SourceError::PositionLost` (the default): losing changes silently is the official
    /// trigger's behaviour and the one thing this source refuses to copy.
    #[default]
    Fail,
    /// Walk the table again (every current row as an Insert), then follow changes from there. Deletes that
    /// happened in the lost window are not reported.
    Resync,
}

/// The mssql-change-tracking source's own keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangeTrackingOptions {
    pub on_position_lost: OnPositionLost,
    /// Changes made under this `CHANGE_TRACKING_CONTEXT` are skipped (`skipOwnChangesContext`).
    pub skip_context: Option<Vec<u8>>,
    /// `Metadata` on each change: version, creation version and changed columns.
    pub include_metadata: bool,
}

/// Keys the cursor sources read, which postgres-logical refuses.
pub(super) const CURSOR_KEYS: [&str; 5] =
    ["cursorColumn", "cursorGuard", "insertedColumn", "softDeleteColumn", "safetyLagMs"];

/// Names PostgreSQL accepts for a replication slot (`ReplicationSlotValidateName`): lower-case letters,
/// digits and underscores, at most 63 bytes. Publications get the same rule so both can be written unquoted in
/// the commands an error prints.
fn slot_like_name(v: &str) -> Result<String, String> {
    if v.is_empty() || v.len() > 63 || !v.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') {
        return Err(format!(
            "is {v:?}; use 1 to 63 lower-case letters, digits and underscores (a replication slot's rule), for example \"sqltrigger_orders\""
        ));
    }
    Ok(v.to_string())
}

/// `includeMetadata`: false unless set.
fn include_metadata(o: &Map<String, Value>) -> Result<bool, String> {
    match o.get("includeMetadata") {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err("must be true or false".into()),
    }
}

/// Reads the postgres-logical keys; every problem is pushed to `errors` as `<key> in <file>`.
pub(super) fn postgres_logical(
    o: &Map<String, Value>,
    file: &str,
    errors: &mut Vec<ConfigError>,
) -> Option<PostgresLogicalOptions> {
    let before = errors.len();
    let mut bad = |key: &str, what: String| errors.push(ConfigError::new(format!("{key} in {file}"), what));
    let slot = match o.get("slotName") {
        Some(Value::String(s)) => slot_like_name(s).map_err(|e| bad("slotName", e)).ok(),
        Some(_) => {
            bad("slotName", "must be a string".into());
            None
        }
        None => {
            bad("slotName", "is required for postgres-logical: the replication slot this function reads, one per function (two functions on one slot would acknowledge each other's changes), for example \"sqltrigger_orders\"".into());
            None
        }
    };
    let publication = match o.get("publicationName") {
        None => slot.clone(),
        Some(Value::String(s)) => slot_like_name(s).map_err(|e| bad("publicationName", e)).ok(),
        Some(_) => {
            bad("publicationName", "must be a string".into());
            None
        }
    };
    let delete_item = match o.get("deleteItem").map(|v| v.as_str()) {
        None | Some(Some("key")) => DeleteItem::Key,
        Some(Some("row")) => DeleteItem::Row,
        Some(_) => {
            bad("deleteItem", "must be \"key\" (the default) or \"row\"".into());
            DeleteItem::Key
        }
    };
    let include_metadata = include_metadata(o).unwrap_or_else(|e| {
        bad("includeMetadata", e);
        false
    });
    let on_truncate = match o.get("onTruncate").map(|v| v.as_str()) {
        None | Some(Some("fail")) => OnTruncate::Fail,
        Some(Some("skip")) => OnTruncate::Skip,
        Some(_) => {
            bad("onTruncate", "must be \"fail\" (the default) or \"skip\"".into());
            OnTruncate::Fail
        }
    };
    let wal_warn_bytes = match o.get("walRetainedWarnMb") {
        None => 1024 << 20,
        Some(v) => match v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())) {
            Some(mb) if (1..=1 << 30).contains(&mb) => mb << 20,
            _ => {
                bad("walRetainedWarnMb", "must be a whole number of megabytes, at least 1".into());
                0
            }
        },
    };
    let reader = match o.get("reader").map(|v| v.as_str()) {
        None | Some(Some("stream")) => Reader::Stream,
        Some(Some("sql")) => Reader::Sql,
        Some(_) => {
            bad("reader", "must be \"stream\" (the default) or \"sql\"".into());
            Reader::Stream
        }
    };
    let mut whole = |key: &str, default: u64, range: std::ops::RangeInclusive<u64>| match o.get(key) {
        None => default,
        Some(v) => match v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())) {
            Some(n) if range.contains(&n) => n,
            _ => {
                bad(key, format!("must be a whole number from {} to {}", range.start(), range.end()));
                default
            }
        },
    };
    let buffer_bytes = (whole("streamBufferMb", 64, 1..=4096) << 20) as usize;
    let buffer_changes = whole("streamBufferChanges", 100_000, 100..=10_000_000) as usize;
    let poll_ms = whole("streamPollMs", 500, 1..=60_000);
    let idle_release_ms = whole("streamIdleReleaseMs", 30_000, 100..=3_600_000);
    for key in CURSOR_KEYS.iter().filter(|k| o.contains_key(**k)) {
        bad(key, "is for postgres-cursor; postgres-logical reads every change from the WAL and needs no cursor, insert marker or soft-delete column: remove it".into());
    }
    if errors.len() > before {
        return None;
    }
    Some(PostgresLogicalOptions {
        slot: slot?,
        publication: publication?,
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

/// Reads `partitionColumn`: a column name, for mssql-rowversion only, and only beside `"partitions"` above 1
/// (the column holds the hash modulo N, which means nothing without N partitions).
pub(super) fn partition_column(
    o: &Map<String, Value>,
    kind: SourceKind,
    file: &str,
    errors: &mut Vec<ConfigError>,
) -> Option<Ident> {
    let v = o.get("partitionColumn")?;
    let mut bad = |what: String| errors.push(ConfigError::new(format!("partitionColumn in {file}"), what));
    if kind != SourceKind::MssqlRowversion {
        let why = match kind {
            SourceKind::MssqlChangeTracking => "CHANGETABLE(CHANGES ...) returns changes, not the table's rows, so no column of the table can narrow it: the change-tracking source filters each change by the hash of its key instead (docs/sql-server.md, \"Partitions\"). Remove it",
            _ => "is for mssql-rowversion; remove it",
        };
        bad(format!("is not used by {}: {why}", kind.as_str()));
        return None;
    }
    let partitions = o.get("partitions").and_then(Value::as_u64).unwrap_or(1);
    if partitions <= 1 {
        bad("names the computed column that holds each row's partition, so it needs \"partitions\" above 1; set \"partitions\" or remove it".into());
        return None;
    }
    match v.as_str().map(Ident::new) {
        Some(Ok(i)) => Some(i),
        Some(Err(e)) => {
            bad(e);
            None
        }
        None => {
            bad("must be a column name (a string)".into());
            None
        }
    }
}

/// Longest `CHANGE_TRACKING_CONTEXT` SQL Server accepts.
const MAX_CONTEXT_BYTES: usize = 128;

/// Reads the mssql-change-tracking keys; every problem is pushed to `errors` as `<key> in <file>`.
pub(super) fn change_tracking(
    o: &Map<String, Value>,
    file: &str,
    errors: &mut Vec<ConfigError>,
) -> Option<ChangeTrackingOptions> {
    let before = errors.len();
    let mut bad = |key: &str, what: String| errors.push(ConfigError::new(format!("{key} in {file}"), what));
    let on_position_lost = match o.get("onPositionLost") {
        None => OnPositionLost::Fail,
        Some(Value::String(s)) if s == "fail" => OnPositionLost::Fail,
        Some(Value::String(s)) if s == "resync" => OnPositionLost::Resync,
        Some(_) => {
            bad("onPositionLost", "must be \"fail\" (the default) or \"resync\"".into());
            OnPositionLost::Fail
        }
    };
    let skip_context = match o.get("skipOwnChangesContext") {
        None | Some(Value::Bool(false)) | Some(Value::Null) => None,
        // `true`: skip what this app writes under its own changeTrackingContext.
        Some(Value::Bool(true)) => match o.get("changeTrackingContext").and_then(Value::as_str) {
            Some(ctx) => context_bytes(ctx).map_err(|e| bad("changeTrackingContext", e)).ok(),
            None => {
                bad("skipOwnChangesContext", "is true but changeTrackingContext is not set; set the context (a string, or hex as 0x...) in either key".into());
                None
            }
        },
        Some(Value::String(s)) => context_bytes(s).map_err(|e| bad("skipOwnChangesContext", e)).ok(),
        Some(_) => {
            bad("skipOwnChangesContext", "must be a string (text, or hex as 0x...) or true".into());
            None
        }
    };
    let include_metadata = include_metadata(o).unwrap_or_else(|e| {
        bad("includeMetadata", e);
        false
    });
    (errors.len() == before).then_some(ChangeTrackingOptions { on_position_lost, skip_context, include_metadata })
}

/// `0x0A0B...` is hex; anything else is the UTF-8 bytes of the text (what `CAST('text' AS varbinary(128))`
/// stores for ASCII text; for `N'text'` contexts, which are UTF-16, give the hex form).
fn context_bytes(text: &str) -> Result<Vec<u8>, String> {
    let bytes = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => {
            if hex.is_empty() || hex.len() % 2 != 0 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!("{text:?} is not hex: write an even number of hex digits after 0x"));
            }
            (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).map_err(|e| e.to_string()))
                .collect::<Result<Vec<u8>, String>>()?
        }
        None => text.as_bytes().to_vec(),
    };
    if bytes.is_empty() || bytes.len() > MAX_CONTEXT_BYTES {
        return Err(format!(
            "must be 1 to {MAX_CONTEXT_BYTES} bytes (CHANGE_TRACKING_CONTEXT is varbinary(128)), got {}",
            bytes.len()
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests;
