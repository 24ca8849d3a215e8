//! The replication slot: its state, its creation, why it cannot serve a position, what status shows of it,
//! and how a failed statement on it is worded.

use super::options::Options;
use super::position::{Lsn, Pos};
use super::{sql, PostgresLogical};
use crate::db::postgres::{classify, Verdict};
use crate::source::SourceError;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;

impl PostgresLogical {
    /// The slot as it is now, created when missing (or replaced when invalidated) if `create`; its
    /// `confirmed_flush_lsn`.
    pub(super) async fn ensure_slot(
        &self,
        client: &deadpool_postgres::Client,
        create: bool,
    ) -> Result<Lsn, SourceError> {
        let slot = &self.options.slot;
        match self.slot_state(client).await? {
            SlotState::Ready(at) => Ok(at),
            SlotState::Lost if create => {
                tracing::warn!(slot = %slot, "replication slot {slot} was invalidated (its WAL was removed); dropping and creating it again, as an explicit start or reset asked. Changes between its last position and now are not delivered");
                client.query_one(sql::DROP_SLOT, &[slot]).await.map_err(|e| self.error(e))?;
                self.create_slot(client).await
            }
            SlotState::Missing if create => self.create_slot(client).await,
            state => Err(self.slot_refusal(state, None)),
        }
    }

    async fn create_slot(&self, client: &deadpool_postgres::Client) -> Result<Lsn, SourceError> {
        let slot = &self.options.slot;
        let row = client.query_one(sql::CREATE_SLOT, &[slot]).await.map_err(|e| {
            if e.code().is_some_and(|c| c.code() == "42501") {
                return SourceError::Invalid(format!(
                    "this login may not create replication slot {slot}: give it the REPLICATION attribute, which reading and advancing the slot need too (ALTER ROLE <login> WITH REPLICATION; on Azure Database for PostgreSQL flexible server the admin user may run it). The slot can also be created in advance: SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')"
                ));
            }
            self.error(e)
        })?;
        let lsn: String = row.get(0);
        tracing::info!(slot = %slot, lsn = %lsn, "created replication slot {slot}: changes from here on are read");
        Lsn::parse(&lsn).ok_or_else(|| SourceError::Invalid(format!("PostgreSQL returned an unreadable LSN {lsn}")))
    }

    pub(super) async fn slot_state(&self, client: &deadpool_postgres::Client) -> Result<SlotState, SourceError> {
        let row = client.query_opt(sql::SLOT, &[&self.options.slot]).await.map_err(|e| self.error(e))?;
        Ok(slot_state(row.as_ref(), &self.options.slot))
    }

    /// Why the slot cannot serve a position, and the way on.
    pub(super) fn slot_refusal(&self, state: SlotState, after: Option<Pos>) -> SourceError {
        let slot = &self.options.slot;
        let reset = "handler state reset <function> --to now --confirm (or the admin route's reset)";
        let at = after.map_or(String::new(), |p| format!(" (the function's position is {})", p.to_json()));
        match state {
            SlotState::Missing => SourceError::PositionLost(format!(
                "replication slot {slot} does not exist{at}: it was dropped, so the changes since the function's position can no longer be read. Nothing is recreated silently. To go on from now, run {reset}: it creates the slot; changes made while it was missing are not delivered"
            )),
            SlotState::Lost => SourceError::PositionLost(format!(
                "replication slot {slot} was invalidated: PostgreSQL removed WAL it still needed (max_slot_wal_keep_size, or the server ran short of storage){at}, so changes were lost before this function read them. To go on from now, run {reset}: it drops and recreates the slot. Then raise max_slot_wal_keep_size or fix what stopped this function"
            )),
            SlotState::Foreign(why) => SourceError::Invalid(format!("replication slot {slot} {why}; name another slotName, or drop that slot")),
            SlotState::Ready(confirmed) => SourceError::PositionLost(format!(
                "replication slot {slot} is at {confirmed}, past the function's position {}: the WAL between was released (the slot was advanced by someone else, or the state was replayed or restored to an older position). A replay cannot go back before {confirmed}. To go on, run {reset}",
                after.map_or_else(|| "(none)".to_string(), |p| p.to_json().to_string())
            )),
        }
    }

    /// What status shows of the slot: its positions, the WAL it retains (warned about above
    /// `walRetainedWarnMb`), and the session streaming it.
    pub(super) async fn slot_health(&self) -> Result<Option<Value>, SourceError> {
        let _memory = self.slot.lock().await;
        let client = self.client().await?;
        let Some(row) = client.query_opt(sql::SLOT_STATUS, &[&self.options.slot]).await.map_err(|e| self.error(e))?
        else {
            return Ok(Some(json!({ "slot": self.options.slot, "exists": false })));
        };
        let retained: i64 = row.get(2);
        let wal_status: String = row.get(3);
        let over = retained.max(0) as u64 > self.options.wal_warn_bytes;
        if over && !self.retained_warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                slot = %self.options.slot, retained_bytes = retained,
                "replication slot {} keeps {} MB of WAL on the server (warning above {} MB, walRetainedWarnMb): the function is behind or stopped, and the server's disk fills until it catches up or the slot is dropped",
                self.options.slot, retained >> 20, self.options.wal_warn_bytes >> 20
            );
        } else if !over {
            self.retained_warned.store(false, Ordering::Relaxed);
        }
        Ok(Some(json!({
            "slot": self.options.slot,
            "publication": self.options.publication,
            "exists": true,
            "confirmed_flush_lsn": row.get::<_, Option<String>>(0),
            "restart_lsn": row.get::<_, Option<String>>(1),
            "wal_retained_bytes": retained,
            "wal_retained_warning": over,
            "wal_status": wal_status,
            "safe_wal_size": row.get::<_, Option<i64>>(4),
            "active_pid": row.get::<_, Option<i32>>(5),
            // Who reads the slot now (its replication connection names its host and process), when anyone does.
            "held_by": row.get::<_, Option<i32>>(5).map(|pid| json!({
                "pid": pid,
                "application_name": row.get::<_, Option<String>>(6),
                "client_addr": row.get::<_, Option<String>>(7),
                "since": row.get::<_, Option<String>>(8),
            })),
        })))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum SlotState {
    Ready(Lsn),
    Missing,
    Lost,
    /// A slot of that name that is not ours to read (another plugin or database, temporary).
    Foreign(String),
}

fn slot_state(row: Option<&tokio_postgres::Row>, slot: &str) -> SlotState {
    let Some(row) = row else { return SlotState::Missing };
    let (plugin, database, current): (Option<String>, Option<String>, String) = (row.get(0), row.get(1), row.get(2));
    let temporary: bool = row.get(3);
    let wal_status: String = row.get(4);
    let confirmed: Option<String> = row.get(5);
    if plugin.as_deref() != Some("pgoutput") {
        return SlotState::Foreign(format!(
            "uses plugin {}, not pgoutput",
            plugin.unwrap_or_else(|| "(physical)".into())
        ));
    }
    if database.as_deref() != Some(current.as_str()) {
        return SlotState::Foreign(format!("belongs to database {}", database.unwrap_or_default()));
    }
    if temporary {
        return SlotState::Foreign("is a temporary slot".into());
    }
    if wal_status == "lost" {
        return SlotState::Lost;
    }
    match confirmed.as_deref().and_then(Lsn::parse) {
        Some(at) => SlotState::Ready(at),
        None => SlotState::Foreign(format!("{slot} has no confirmed position yet")),
    }
}

/// A failed statement in the source's words: what waiting fixes is `Unavailable`, the rest says what to change.
pub(super) fn db_error(e: tokio_postgres::Error, table: &crate::ident::TableName, options: &Options) -> SourceError {
    let Some(db) = e.as_db_error() else {
        return SourceError::Unavailable(format!("PostgreSQL connection failed: {e}"));
    };
    let code = db.code().code();
    let msg = db.message();
    let detail = db.detail().map_or(String::new(), |d| format!(" ({d})"));
    match classify(Some(code)) {
        Verdict::Transient if code == "55006" => SourceError::Unavailable(format!(
            "PostgreSQL: {msg} (SQLSTATE {code}): another session is reading replication slot {} (another instance's status, or a consumer that shares the slot, which must not happen); the next tick tries again",
            options.slot
        )),
        Verdict::Transient => SourceError::Unavailable(format!("PostgreSQL: {msg} (SQLSTATE {code})")),
        Verdict::Denied => SourceError::Invalid(format!(
            "PostgreSQL: {msg} (SQLSTATE {code}); the login needs SELECT on {table} and the REPLICATION attribute (ALTER ROLE <login> WITH REPLICATION)"
        )),
        Verdict::BadValue | Verdict::Refused => {
            SourceError::Invalid(format!("PostgreSQL: {msg}{detail} (SQLSTATE {code}) while reading {table} through slot {}", options.slot))
        }
    }
}
