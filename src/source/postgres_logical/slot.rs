//! The replication slot: its state, its creation, why it cannot serve a position, what status shows of it, and
//! the SQL-interface reader.
//!
//! The SQL-interface reader (`"reader": "sql"`, and status in every mode): a tick peeks at the slot
//! (`pg_logical_slot_peek_binary_changes`, pgoutput protocol 1) on one pooled connection, bounded by the WAL
//! flush position read in the same statement and by a number of messages. Peeking consumes nothing: the slot
//! moves only when a checkpoint is acknowledged (`pg_replication_slot_advance`). Every peek decodes from the
//! slot's `restart_lsn` on the server, which is why the stream is the default (docs/postgres.md).

use super::catalog::Catalog;
use super::conn::Conn;
use super::decode::Decoder;
use super::options::Options;
use super::position::{Lsn, Pos};
use super::scan::{Scan, Scanner, Want};
use super::sql;
use crate::ident::TableName;
use crate::source::{SourceError, StartFrom};
use futures::StreamExt;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::MutexGuard;
use tokio_postgres::types::ToSql;

/// One function's replication slot, as this process sees it. One statement on the slot at a time in this
/// process (the lock on [`SlotMemory`]): a slot serves one backend at a time, and status runs beside ticks. The
/// source calls it to start, to advance over SQL, for status and for the SQL reader's peeks; the stream asks it
/// for the slot's state and holds its lock while a flush report lands.
#[derive(Debug)]
pub(super) struct Slot {
    conn: Conn,
    options: Options,
    table: TableName,
    memory: tokio::sync::Mutex<SlotMemory>,
    retained_warned: AtomicBool,
}

/// What this process remembers of the slot between statements.
#[derive(Debug, Default)]
pub(super) struct SlotMemory {
    /// Where the slot was last seen or put: an acknowledgement that does not pass it costs no statement.
    at: Option<Lsn>,
    /// The table's columns as the last Relation message described them, to notice a schema change.
    columns: Option<Vec<(String, u32)>>,
    /// How many messages the last peek read before its first change after the position.
    skipped: usize,
}

impl SlotMemory {
    /// Whether the slot is known to be at or past `target`.
    pub fn passed(&self, target: Lsn) -> bool {
        self.at.is_some_and(|at| at >= target)
    }

    /// The slot was seen at, or put at, `at`.
    pub fn seen_at(&mut self, at: Lsn) {
        self.at = Some(at);
    }
}

/// What one peek found.
#[derive(Debug, Default)]
struct Peeked {
    scan: Scan,
    /// A Relation message showed columns the shape does not have: discover again and scan again.
    shape_changed: bool,
    /// Messages read before the first change after the position.
    skipped: usize,
}

impl Slot {
    pub fn new(conn: Conn, options: Options, table: TableName) -> Self {
        Self {
            conn,
            options,
            table,
            memory: tokio::sync::Mutex::new(SlotMemory::default()),
            retained_warned: AtomicBool::new(false),
        }
    }

    /// Waits for the slot's turn: one statement on it at a time in this process.
    pub async fn memory(&self) -> MutexGuard<'_, SlotMemory> {
        self.memory.lock().await
    }

    /// Where a function with no state starts (`startFrom`), creating the slot when it is missing: the slot's
    /// confirmed position, or with `now` the WAL flushed now when that is later.
    pub async fn start_position(&self, from: StartFrom) -> Result<Lsn, SourceError> {
        let mut memory = self.memory.lock().await;
        let client = self.conn.client().await?;
        let confirmed = self.ensure(&client, true).await?;
        memory.at = Some(confirmed);
        Ok(match from {
            // Snapshot: the live path starts where earliest does, and the engine starts a backfill of the rows
            // that exist beside it; whatever changes meanwhile, each chunk is checked against the stream.
            StartFrom::Earliest | StartFrom::Snapshot => confirmed,
            StartFrom::Now => {
                let flush: String = client.query_one(sql::FLUSH, &[]).await.map_err(|e| self.conn.error(e))?.get(0);
                Lsn::parse(&flush).unwrap_or(confirmed).max(confirmed)
            }
        })
    }

    /// Moves the slot to `target` over SQL (the SQL reader's acknowledgement), unless it is known to be there.
    pub async fn advance(&self, target: Lsn) -> Result<(), SourceError> {
        let mut memory = self.memory.lock().await;
        if memory.passed(target) {
            return Ok(());
        }
        self.advance_over_sql(&mut memory, target).await
    }

    /// The slot as it is now, created when missing (or replaced when invalidated) if `create`; its
    /// `confirmed_flush_lsn`.
    async fn ensure(&self, client: &deadpool_postgres::Client, create: bool) -> Result<Lsn, SourceError> {
        let slot = &self.options.slot;
        match self.state(client).await? {
            SlotState::Ready(at) => Ok(at),
            SlotState::Lost if create => {
                tracing::warn!(slot = %slot, "replication slot {slot} was invalidated (its WAL was removed); dropping and creating it again, as an explicit start or reset asked. Changes between its last position and now are not delivered");
                client.query_one(sql::DROP_SLOT, &[slot]).await.map_err(|e| self.conn.error(e))?;
                self.create(client).await
            }
            SlotState::Missing if create => self.create(client).await,
            state => Err(self.refusal(state, None)),
        }
    }

    async fn create(&self, client: &deadpool_postgres::Client) -> Result<Lsn, SourceError> {
        let slot = &self.options.slot;
        let row = client.query_one(sql::CREATE_SLOT, &[slot]).await.map_err(|e| {
            if e.code().is_some_and(|c| c.code() == "42501") {
                return SourceError::Invalid(format!(
                    "this login may not create replication slot {slot}: give it the REPLICATION attribute, which reading and advancing the slot need too (ALTER ROLE <login> WITH REPLICATION; on Azure Database for PostgreSQL flexible server the admin user may run it). The slot can also be created in advance: SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')"
                ));
            }
            self.conn.error(e)
        })?;
        let lsn: String = row.get(0);
        tracing::info!(slot = %slot, lsn = %lsn, "created replication slot {slot}: changes from here on are read");
        Lsn::parse(&lsn).ok_or_else(|| SourceError::Invalid(format!("PostgreSQL returned an unreadable LSN {lsn}")))
    }

    pub async fn state(&self, client: &deadpool_postgres::Client) -> Result<SlotState, SourceError> {
        let row = client.query_opt(sql::SLOT, &[&self.options.slot]).await.map_err(|e| self.conn.error(e))?;
        Ok(slot_state(row.as_ref(), &self.options.slot))
    }

    /// Why the slot cannot serve a position, and the way on.
    pub fn refusal(&self, state: SlotState, after: Option<Pos>) -> SourceError {
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
    pub async fn health(&self) -> Result<Option<Value>, SourceError> {
        let _memory = self.memory.lock().await;
        let client = self.conn.client().await?;
        let Some(row) =
            client.query_opt(sql::SLOT_STATUS, &[&self.options.slot]).await.map_err(|e| self.conn.error(e))?
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

    /// Peeks until the scan is complete (see [`Want`]), growing the message bound when a page of skipped
    /// messages or a stretch of other tables' transactions used it up. A Relation message that shows columns
    /// the table's shape does not have makes it read the catalog again, once. `copy`: peek at a temporary
    /// copy of the slot (status, while a stream holds the slot).
    pub async fn scan(&self, catalog: &Catalog, want: Want, copy: bool) -> Result<Scan, SourceError> {
        let mut discovered_again = false;
        loop {
            catalog.shape().await?;
            let mut memory = self.memory.lock().await;
            let client = self.conn.client().await?;
            let copied = if copy {
                let name = format!("sqltrigger_status_{}", &uuid::Uuid::new_v4().simple().to_string()[..16]);
                client.query_one(sql::COPY_SLOT, &[&self.options.slot, &name]).await.map_err(|e| self.conn.error(e))?;
                Some(name)
            } else {
                None
            };
            // Deferred delivery keeps the slot at the proven checkpoint, so a tick skips the unproven span first:
            // start from what the last peek needed rather than growing to it again every tick.
            let mut budget =
                (want.limit.saturating_mul(3) + 64).max(memory.skipped + want.limit).min(i32::MAX as usize);
            let decoder_columns = memory.columns.clone();
            let peeked = loop {
                let read = self.peek(catalog, &client, copied.as_deref(), decoder_columns.clone(), want, budget).await;
                match read {
                    Ok(Some(peeked)) => break Ok(peeked),
                    Ok(None) => budget = budget.saturating_mul(4).min(i32::MAX as usize),
                    Err(e) => break Err(e),
                }
            };
            if let Some(name) = copied {
                // Temporary: the session's end drops it too, should this fail.
                let _ = client.query_one(sql::DROP_SLOT, &[&name]).await;
            }
            let (peeked, columns) = peeked?;
            if !copy {
                memory.skipped = peeked.skipped;
                memory.columns = columns;
            }
            if peeked.shape_changed && !discovered_again {
                discovered_again = true;
                catalog.forget();
                continue;
            }
            return Ok(peeked.scan);
        }
    }

    /// One peek; `None` when the message bound cut it short before the scan was complete.
    async fn peek(
        &self,
        catalog: &Catalog,
        client: &deadpool_postgres::Client,
        copy: Option<&str>,
        columns: Option<Vec<(String, u32)>>,
        want: Want,
        budget: usize,
    ) -> Result<Option<(Peeked, Option<Vec<(String, u32)>>)>, SourceError> {
        let shape = catalog.shape().await?;
        let slot = copy.unwrap_or(&self.options.slot);
        let statement =
            client.prepare_cached(&sql::peek(&self.options.publication)).await.map_err(|e| self.conn.error(e))?;
        let budget_param = budget as i32;
        let params: [&(dyn ToSql + Sync); 2] = [&slot, &budget_param];
        // The slot's state first, not pipelined with the peek: the peek's rows stream, and a reply queued
        // behind rows nobody reads yet would wait for ever.
        match (self.state(client).await?, want.after) {
            (SlotState::Ready(confirmed), Some(after)) if confirmed > after.resume() => {
                return Err(self.refusal(SlotState::Ready(confirmed), Some(after)))
            }
            (SlotState::Ready(_), _) => {}
            (other, after) => return Err(self.refusal(other, after)),
        }
        let rows = client.query_raw(&statement, params.iter().copied()).await.map_err(|e| self.conn.error(e))?;
        futures::pin_mut!(rows);

        let table = self.table.to_string();
        let mut decoder = Decoder::new(shape, self.options.delete_item, want.values, columns, table.clone());
        let mut scanner = Scanner::new(want, self.options.on_truncate, &table);
        let mut out = Peeked::default();
        let mut flush = String::new();
        let mut events = Vec::new();
        let mut seen = 0usize;
        'rows: while let Some(row) = rows.next().await {
            let row = row.map_err(|e| self.conn.error(e))?;
            if scanner.out.now == 0.0 {
                scanner.out.now = row.get(1);
                flush = row.get::<_, String>(0);
            }
            let Some(data) = row.get::<_, Option<Vec<u8>>>(3) else { break };
            seen += 1;
            let lsn = row.get::<_, Option<String>>(2).and_then(|l| Lsn::parse(&l)).unwrap_or_default();
            events.clear();
            decoder.feed(lsn, &data, &mut events).map_err(|e| SourceError::Invalid(format!("{e} (slot {slot})")))?;
            for event in &events {
                scanner.push(event)?;
                if scanner.skipped {
                    out.skipped = seen;
                }
                if scanner.complete {
                    break 'rows;
                }
            }
        }
        if !scanner.complete && seen >= budget {
            return Ok(None);
        }
        out.scan = scanner.out;
        if !scanner.complete {
            out.scan.proven_to = Lsn::parse(&flush);
        }
        out.shape_changed = decoder.shape_changed;
        Ok(Some((out, decoder.columns)))
    }

    /// Moves the slot to `target` over SQL, when no stream of ours holds it.
    async fn advance_over_sql(&self, memory: &mut SlotMemory, target: Lsn) -> Result<(), SourceError> {
        let client = self.conn.client().await?;
        let confirmed = match self.state(&client).await? {
            SlotState::Ready(at) => at,
            // A tick's fetch says so loudly; an acknowledgement has nothing to move.
            _ => return Ok(()),
        };
        if confirmed < target {
            client
                .query_one(sql::ADVANCE, &[&self.options.slot, &target.to_string()])
                .await
                .map_err(|e| self.conn.error(e))?;
            tracing::debug!(slot = %self.options.slot, from = %confirmed, to = %target, "advanced the replication slot");
        }
        memory.at = Some(confirmed.max(target));
        Ok(())
    }

    /// A peek for status: at the slot, or at a temporary copy of it while a stream (ours or another
    /// instance's) holds it.
    pub async fn status_scan(&self, catalog: &Catalog, want: Want) -> Result<Scan, SourceError> {
        match self.scan(catalog, want, false).await {
            Err(SourceError::Unavailable(m)) if m.contains("SQLSTATE 55006") => self.scan(catalog, want, true).await,
            other => other,
        }
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
