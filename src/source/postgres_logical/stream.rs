//! The default reader: one logical replication stream per function, opened by the process's first tick and
//! kept across ticks, so the server decodes each WAL record once (not once per tick, as a peek does).
//!
//! A task reads the stream ahead into the [`Buffer`], answers the server's keepalives, and reports as flushed
//! only the acknowledged checkpoint's resume LSN, so the slot never passes the stored checkpoint. A tick takes
//! its batch from the buffer. When the buffer holds less than a batch, the tick reads the WAL's flush position
//! and waits, at most `streamPollMs`, until the stream has passed it: a tick then sees everything committed
//! before it began, as a peek bounded by that position would.
//!
//! One consumer per slot: PostgreSQL lets one session stream a slot. The task closes the stream after
//! `streamIdleReleaseMs` without a tick (the host fires another instance now), on SIGTERM, and on an error; a
//! tick that finds the slot streamed by another session answers empty and says so once.

use super::buffer::{Buffer, Ended, Shared};
use super::catalog::Catalog;
use super::conn::Conn;
use super::decode::Decoder;
use super::options::Options;
use super::position::{Lsn, Pos};
use super::reader;
use super::scan::{Scan, Want};
use super::slot::{Slot, SlotState};
use super::sql;
use super::wire::{Wire, WireError};
use crate::config::SourceSpec;
use crate::db::postgres::{classify, PostgresTls, Verdict};
use crate::source::SourceError;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// The stream a process holds for one function, if any, and what outlives one stream: the latest acknowledged
/// checkpoint, the last holder seen, the server process of the last stream dropped. Owns the handle of its
/// reader task ([`reader::run`]) and, through it, the buffer they share. The source calls it to read a batch,
/// to report an acknowledgement and for status; a backfill chunk asks it for the stream that serves a read.
#[derive(Debug)]
pub(super) struct Stream {
    conn: Conn,
    spec: SourceSpec,
    options: Options,
    tls: PostgresTls,
    current: tokio::sync::Mutex<Option<Handle>>,
    /// The latest acknowledged checkpoint's resume LSN: what the next stream reports from its start.
    acked: Mutex<Option<Lsn>>,
    /// The session last seen holding the slot, so a long wait for it is said once.
    holder: Mutex<Option<i32>>,
    /// The server process of the stream this process dropped last: the server may not have let the slot go
    /// yet when the next stream starts.
    previous: Mutex<Option<i32>>,
}

#[derive(Debug)]
struct Handle {
    pid: i32,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        // Dropping the task drops the connection: the server ends the session and frees the slot.
        self.task.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Stream {
    pub fn new(conn: Conn, spec: SourceSpec, options: Options, tls: PostgresTls) -> Self {
        Self {
            conn,
            spec,
            options,
            tls,
            current: tokio::sync::Mutex::new(None),
            acked: Mutex::new(None),
            holder: Mutex::new(None),
            previous: Mutex::new(None),
        }
    }

    /// A batch's scan from the stream (see the module docs); `None` when another session holds the slot.
    pub async fn fetch(&self, catalog: &Catalog, slot: &Slot, want: Want) -> Result<Option<Scan>, SourceError> {
        for _ in 0..2 {
            let Some(shared) = self.serving(catalog, slot, want.after).await? else { return Ok(None) };
            if let Some(scan) = self.take_batch(&shared, want).await? {
                return Ok(Some(scan));
            }
        }
        Err(SourceError::Unavailable(format!(
            "the replication stream of slot {} broke twice in one tick; the next tick tries again",
            self.options.slot
        )))
    }

    /// The stream that serves a read after `after`: the one held, else a new one.
    pub async fn serving(
        &self,
        catalog: &Catalog,
        slot: &Slot,
        after: Option<Pos>,
    ) -> Result<Option<Arc<Shared>>, SourceError> {
        let mut current = self.current.lock().await;
        if let Some(handle) = current.as_ref() {
            let mut b = handle.shared.lock();
            let keep = match b.ended.take() {
                // What the stream could not decode fails this tick; the next one reads it again from the slot
                // (and fails the same way, until a reset moves the position past it).
                Some(Ended::Failed(e @ SourceError::Invalid(_))) => {
                    drop(b);
                    *current = None;
                    return Err(e);
                }
                Some(Ended::Failed(e)) => {
                    tracing::warn!(slot = %self.options.slot, "the replication stream of slot {} stopped ({e}); starting it again at the slot's confirmed position", self.options.slot);
                    false
                }
                Some(_) => false,
                None if b.shape_changed => {
                    catalog.forget();
                    false
                }
                None if !b.serves(after) => {
                    tracing::debug!(slot = %self.options.slot, "the stream no longer holds what follows the position; starting it again at the slot's confirmed position");
                    false
                }
                None => true,
            };
            drop(b);
            if keep {
                return Ok(Some(handle.shared.clone()));
            }
            *lock(&self.previous) = Some(handle.pid);
            *current = None;
        }
        *current = self.open(catalog, slot, after).await?;
        Ok(current.as_ref().map(|h| h.shared.clone()))
    }

    async fn open(
        &self,
        catalog: &Catalog,
        replication_slot: &Slot,
        after: Option<Pos>,
    ) -> Result<Option<Handle>, SourceError> {
        let shape = catalog.shape().await?;
        let slot = &self.options.slot;
        let confirmed = {
            let client = self.conn.client().await?;
            match replication_slot.state(&client).await? {
                SlotState::Ready(c) if after.is_none_or(|a| c <= a.resume()) => c,
                state => return Err(replication_slot.refusal(state, after)),
            }
        };
        let config = crate::db::postgres::config(&self.spec.connection_setting, &self.spec.connection)
            .map_err(SourceError::Invalid)?;
        // Dates and times (ISO by the session contract in `config`'s options) in the time zone of the sessions that
        // build Items (`item`).
        let session = [("TimeZone", shape.time_zone.as_str())];
        let mut wire =
            Wire::connect(&config, &self.tls, &application_name(), &session).await.map_err(|e| self.wire_error(e))?;
        let deadline = Instant::now() + Duration::from_millis(self.options.poll_ms);
        let previous = *lock(&self.previous);
        loop {
            let Err(e) = wire.start(slot, &self.options.publication, confirmed).await else { break };
            match e {
                // Our own stream of a moment ago: its server process is still on its way out.
                WireError::Server { code, message }
                    if code == "55006"
                        && previous.is_some_and(|p| message.ends_with(&format!(" {p}")))
                        && Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                WireError::Server { code, message } if code == "55006" => {
                    wire.close().await;
                    self.held_elsewhere(&message).await;
                    return Ok(None);
                }
                e => {
                    wire.close().await;
                    return Err(self.wire_error(e));
                }
            }
        }
        *lock(&self.previous) = None;
        *lock(&self.holder) = None;
        let flush = lock(&self.acked).map_or(confirmed, |a| a.max(confirmed));
        let buffer = Buffer::new(confirmed, flush, self.options.buffer_bytes, self.options.buffer_changes);
        let shared = Arc::new(Shared { buffer: Mutex::new(buffer), changed: Notify::new(), wake: Notify::new() });
        let decoder = Decoder::new(shape, self.options.delete_item, true, None, self.spec.table.to_string());
        tracing::info!(slot = %slot, at = %confirmed, pid = wire.pid, "streaming replication slot {slot} from {confirmed} (server process {})", wire.pid);
        let idle = Duration::from_millis(self.options.idle_release_ms);
        let pid = wire.pid;
        let task = tokio::spawn(reader::run(wire, shared.clone(), decoder, idle, slot.clone()));
        Ok(Some(Handle { pid, shared, task }))
    }

    /// Says once per holder that another session streams the slot.
    async fn held_elsewhere(&self, message: &str) {
        let pid: Option<i32> = message.rsplit(' ').next().and_then(|p| p.trim_end_matches('.').parse().ok());
        let slot = &self.options.slot;
        if std::mem::replace(&mut *lock(&self.holder), pid) == pid {
            tracing::debug!(slot = %slot, "replication slot {slot} is still streamed by another session ({message})");
            return;
        }
        let mut who = String::new();
        if let (Some(pid), Ok(client)) = (pid, self.conn.client().await) {
            if let Ok(Some(row)) = client.query_opt(sql::HOLDER, &[&pid]).await {
                who = format!(" by {:?} from {}", row.get::<_, String>(0), row.get::<_, String>(1));
            }
        }
        tracing::warn!(
            slot = %slot, holder_pid = pid,
            "replication slot {slot} is streamed by another session{who} ({message}): this instance delivers nothing until it is released. A handler process that the host stopped firing releases it after streamIdleReleaseMs ({} ms); anything else reading the slot must stop",
            self.options.idle_release_ms
        );
    }

    /// What status shows of this process's stream: what it holds in memory, and how far it has read.
    pub async fn health(&self) -> Option<serde_json::Value> {
        let current = self.current.lock().await;
        let b = current.as_ref()?.shared.lock();
        let (changes, bytes) = b.held();
        Some(serde_json::json!({
            "held_changes": changes, "held_bytes": bytes, "received_to": b.proven().to_string(),
            "reported_flush": b.flush.to_string(), "paused": b.paused, "open": b.ended.is_none(),
        }))
    }

    /// Waits (at most `streamPollMs`) for a whole batch, or for the stream to pass the WAL flushed now. `None`
    /// when the stream ended meanwhile.
    async fn take_batch(&self, shared: &Shared, want: Want) -> Result<Option<Scan>, SourceError> {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(self.options.poll_ms);
        {
            let mut b = shared.lock();
            b.last_used = Instant::now();
            if let Some(a) = want.after.filter(|a| b.delivered.is_none_or(|d| a.includes(d))) {
                b.delivered = Some(a);
            }
        }
        shared.wake.notify_one();
        let table = self.spec.table.to_string();
        let mut flush: Option<Lsn> = None;
        loop {
            let notified = shared.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let b = shared.lock();
                if b.ended.is_some() {
                    return Ok(None);
                }
                let (mut scan, complete) = b.scan(want, self.options.on_truncate, &table)?;
                let proven = b.proven();
                let caught_up = flush.is_some_and(|f| proven >= f);
                if complete || b.paused || caught_up || tokio::time::Instant::now() >= deadline {
                    if !complete {
                        scan.proven_to = Some(proven);
                    }
                    return Ok(Some(scan));
                }
            }
            if flush.is_none() {
                let client = self.conn.client().await?;
                let text: String = client.query_one(sql::FLUSH, &[]).await.map_err(|e| self.conn.error(e))?.get(0);
                flush = Some(Lsn::parse(&text).unwrap_or_default());
                shared.lock().reply_wanted = true;
                shared.wake.notify_one();
                continue;
            }
            let _ = tokio::time::timeout_at(deadline, notified).await;
        }
    }

    /// Reports an acknowledged checkpoint through the stream, and waits (at most `streamPollMs`) until the slot
    /// shows it. Without a stream, the next one reports it from its start.
    pub async fn acknowledged(&self, slot: &Slot, checkpoint: Pos) -> Result<(), SourceError> {
        let target = checkpoint.resume();
        {
            let mut acked = lock(&self.acked);
            *acked = Some(acked.map_or(target, |a| a.max(target)));
        }
        let mut memory = slot.memory().await;
        if memory.passed(target) {
            return Ok(());
        }
        {
            let current = self.current.lock().await;
            let Some(handle) = current.as_ref() else { return Ok(()) };
            let mut b = handle.shared.lock();
            if b.ended.is_some() {
                return Ok(());
            }
            b.flush = b.flush.max(target);
            b.trim(checkpoint);
            b.last_used = Instant::now();
            drop(b);
            handle.shared.wake.notify_one();
        }
        let deadline = Instant::now() + Duration::from_millis(self.options.poll_ms);
        let client = self.conn.client().await?;
        loop {
            let row = client
                .query_opt(sql::CONFIRMED_AT, &[&self.options.slot, &target.to_string()])
                .await
                .map_err(|e| self.conn.error(e))?;
            if row.is_some_and(|r| r.get::<_, bool>(0)) {
                memory.seen_at(target);
                return Ok(());
            }
            if Instant::now() >= deadline {
                tracing::debug!(slot = %self.options.slot, to = %target, "the slot has not shown the flush report yet; the next tick looks again");
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// A replication connection's failure in the source's words.
    fn wire_error(&self, e: WireError) -> SourceError {
        let slot = &self.options.slot;
        let setting = &self.spec.connection_setting;
        match e {
            WireError::Broken(m) => SourceError::Unavailable(format!("replication stream of slot {slot} (app setting {setting}): {m}")),
            WireError::Misconfigured(m) => SourceError::Invalid(format!("replication stream of slot {slot} (app setting {setting}): {m}")),
            WireError::Server { code, message } => match (classify(Some(&code)), &code[..code.len().min(2)]) {
                (_, "28") => SourceError::Invalid(format!(
                    "PostgreSQL refused the replication connection: {message} (SQLSTATE {code}); check the login, and that pg_hba.conf lets it connect to the database (a logical replication connection matches the database's own lines). A pooler or server that refuses replication connections can be read with \"reader\": \"sql\""
                )),
                (Verdict::Transient, _) => SourceError::Unavailable(format!("PostgreSQL: {message} (SQLSTATE {code}) on the replication stream of slot {slot}")),
                (Verdict::Denied, _) => SourceError::Invalid(format!(
                    "PostgreSQL: {message} (SQLSTATE {code}); streaming a slot needs the REPLICATION attribute (ALTER ROLE <login> WITH REPLICATION)"
                )),
                _ => SourceError::Invalid(format!(
                    "PostgreSQL refused the replication stream of slot {slot}: {message} (SQLSTATE {code}). If the server or a pooler in front of it does not take replication connections, set \"reader\": \"sql\" in sqltrigger.json"
                )),
            },
        }
    }
}

/// How the stream names itself in `pg_stat_activity`: the host and process, so status says who holds a slot.
fn application_name() -> String {
    let host = std::env::var("HOSTNAME").or_else(|_| std::env::var("COMPUTERNAME")).unwrap_or_default();
    let mut name = format!("sql-pseudo-trigger {host} pid {}", std::process::id());
    while name.len() > 63 {
        name.pop();
    }
    name
}
