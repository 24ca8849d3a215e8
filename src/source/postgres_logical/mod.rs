//! PostgreSQL logical-decoding source: every insert, update, hard delete and truncate of a table, read from
//! the write-ahead log through a replication slot, with no change to the table.
//!
//! # How a tick reads
//! A tick peeks at the slot (`pg_logical_slot_peek_binary_changes`, pgoutput protocol 1) on one pooled
//! connection, bounded by the WAL flush position read in the same statement and by a number of messages, and
//! decodes the messages here ([`pgoutput`]). Peeking consumes nothing: the slot moves only when a checkpoint is
//! acknowledged ([`Source::acknowledged`]), so a crash anywhere re-reads and never loses. Why the SQL
//! interface rather than the streaming replication protocol: a tick is a short request, not a session — the
//! SQL interface needs no replication connection, leaves no walsender behind between ticks, and shares the
//! pool, TLS and error handling of every other statement. The stream decodes faster (docs/postgres.md has the
//! measurement), but a tick's time goes mostly elsewhere.
//!
//! # Positions
//! See [`position`]: a change is placed by its transaction's commit LSN and its sequence number in it, which
//! orders changes as decoding hands them out. A transaction larger than a batch is paged: the next page peeks
//! again and skips what the position has passed. Each page decodes the transaction again on the server, and
//! the client keeps only one page in memory.
//!
//! # Values
//! pgoutput sends each value in its type's text form. One statement per batch turns them into the cursor
//! source's JSON (`sql::items`): the same `row_to_json`, so numerics keep every digit, timestamps are ISO
//! 8601, json stays JSON and bytea is base64. A TOAST-ed value an update did not touch is not in the WAL: with
//! `REPLICA IDENTITY FULL` it comes from the old row the WAL carries; otherwise it is read from the table by
//! key (its current value — a later change to it is delivered later, so a consumer converges).

mod options;
pub(crate) mod pgoutput;
mod position;
mod sql;

use super::{Fetched, Lag, Position, Source, SourceError, StartFrom};
use crate::change::{Change, Operation};
use crate::config::SourceSpec;
use crate::db::postgres::{classify, connect_failure, pool, ConnectFailure, PostgresTls, Verdict};
use crate::ident::Ident;
use deadpool_postgres::Pool;
use futures::StreamExt;
use options::{DeleteItem, OnTruncate, Options};
use pgoutput::{Message, OldKind, Relation};
use position::{Lsn, Place, Pos};
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_postgres::types::ToSql;

const POOL_SIZE: usize = 2;
/// Messages status reads at most to count pending changes: `pending` must stay one bounded statement.
const PENDING_SCAN: usize = 10_000;
/// pgoutput's epoch (2000-01-01) in Unix seconds.
const POSTGRES_EPOCH: i64 = 946_684_800;

#[derive(Debug)]
pub struct PostgresLogical {
    spec: SourceSpec,
    options: Options,
    pool: Pool,
    shape: Mutex<Option<Arc<Shape>>>,
    /// One statement on the slot at a time in this process: a slot serves one backend at a time, and status
    /// runs beside ticks.
    slot: tokio::sync::Mutex<SlotMemory>,
    retained_warned: AtomicBool,
}

#[derive(Debug, Default)]
struct SlotMemory {
    /// Where the slot was last seen or put: an acknowledgement that does not pass it costs no statement.
    at: Option<Lsn>,
    /// The table's columns as the last Relation message described them, to notice a schema change.
    columns: Option<Vec<(String, u32)>>,
    /// How many messages the last peek read before its first change after the position.
    skipped: usize,
}

/// The table as the catalog describes it.
#[derive(Debug)]
struct Shape {
    oid: u32,
    /// Key columns: a delete's `Item`, and how a left-out TOAST value is read back.
    key: Vec<Ident>,
    /// The column names, in table order.
    columns: Vec<String>,
    items: String,
}

/// A change as decoded, before its `Item` is built.
#[derive(Debug)]
struct Decoded {
    place: Place,
    operation: Operation,
    /// 0 the row, 1 the key, 2 the row with left-out columns read from the table (`sql::items`).
    kind: i32,
    values: Map<String, Value>,
    lsn: Lsn,
    xid: u32,
    commit_time: i64,
}

/// What one peek found.
#[derive(Debug, Default)]
struct Scan {
    changes: Vec<Decoded>,
    /// The end of the last change's transaction, when the change is its transaction's last.
    last_end: Option<Lsn>,
    /// A skipped TRUNCATE after the last change (`onTruncate: skip`): the position passes it.
    passed: Option<Place>,
    /// Everything up to here was read and holds nothing more (the peek reached the flush bound).
    proven_to: Option<Lsn>,
    /// The server's clock, in Unix seconds.
    now: f64,
}

/// How far a scan goes.
#[derive(Debug, Clone, Copy)]
struct Want {
    after: Option<Pos>,
    upto: Option<Pos>,
    limit: usize,
    /// Build the values (a fetch) or only count and date (status).
    values: bool,
}

struct Txn {
    commit: Lsn,
    commit_time: i64,
    xid: u32,
    seq: u64,
}

impl PostgresLogical {
    /// Builds the source without connecting.
    pub fn new(spec: SourceSpec, tls: &PostgresTls) -> Result<Self, SourceError> {
        let options = Options::parse(&spec.options)?;
        let pool = pool(&spec.connection_setting, &spec.connection, POOL_SIZE, tls).map_err(SourceError::Invalid)?;
        Ok(Self {
            spec,
            options,
            pool,
            shape: Mutex::new(None),
            slot: tokio::sync::Mutex::new(SlotMemory::default()),
            retained_warned: AtomicBool::new(false),
        })
    }

    async fn client(&self) -> Result<deadpool_postgres::Client, SourceError> {
        self.pool.get().await.map_err(|e| match connect_failure(&self.spec.connection_setting, &e) {
            ConnectFailure::Misconfigured(m) => SourceError::Invalid(m),
            ConnectFailure::Unavailable(m) => SourceError::Unavailable(m),
        })
    }

    fn error(&self, e: tokio_postgres::Error) -> SourceError {
        db_error(e, &self.spec.table, &self.options)
    }

    async fn shape(&self) -> Result<Arc<Shape>, SourceError> {
        if let Some(shape) = self.shape.lock().expect("shape lock").clone() {
            return Ok(shape);
        }
        let shape = Arc::new(self.discover().await?);
        *self.shape.lock().expect("shape lock") = Some(shape.clone());
        Ok(shape)
    }

    /// Reads the server's settings, the table and the publication, and checks them against the options,
    /// creating the publication when it is missing and the login may.
    async fn discover(&self) -> Result<Shape, SourceError> {
        let client = self.client().await?;
        let table = &self.spec.table;
        let quoted = table.pg();
        let row = client.query_one(sql::WAL_LEVEL, &[]).await.map_err(|e| self.error(e))?;
        let (wal_level, login, replication, version): (String, String, bool, i32) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        if version < 130_000 {
            return Err(SourceError::Invalid(format!(
                "postgres-logical needs PostgreSQL 13 or later (it reads pg_replication_slots.wal_status to tell an invalidated slot), and the server is version {}; use postgres-cursor, or upgrade",
                version / 10_000
            )));
        }
        if wal_level != "logical" {
            return Err(SourceError::Invalid(format!(
                "postgres-logical needs wal_level = logical, and the server runs with {wal_level}. On your own server: ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL. On Azure Database for PostgreSQL flexible server: set the server parameter wal_level to LOGICAL and restart the server (docs/postgres.md). The login {login} also needs the REPLICATION attribute (ALTER ROLE \"{login}\" WITH REPLICATION)"
            )));
        }
        let row = client.query_opt(sql::TABLE, &[&quoted]).await.map_err(|e| self.error(e))?;
        let Some(row) = row else {
            return Err(SourceError::Invalid(format!(
                "table {table} does not exist (or the login cannot see it); check tableName and the search_path"
            )));
        };
        let (oid, identity, schema, name): (u32, String, String, String) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        let columns: Vec<(String, String, bool)> = client
            .query(sql::COLUMNS, &[&oid])
            .await
            .map_err(|e| self.error(e))?
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        let has = |c: &Ident| columns.iter().any(|(n, _, _)| n == c.as_str());
        let key: Vec<Ident> = match &self.spec.primary_key {
            Some(k) => k.clone(),
            None => {
                let names: Vec<String> = client
                    .query(sql::PRIMARY_KEY, &[&oid])
                    .await
                    .map_err(|e| self.error(e))?
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                if names.is_empty() {
                    return Err(SourceError::Invalid(format!(
                        "table {table} has no primary key; add one, or name a unique, non-null key in primaryKey (and ALTER TABLE {quoted} REPLICA IDENTITY FULL, so the WAL carries it for deletes)"
                    )));
                }
                names.iter().map(|n| Ident::new(n).map_err(SourceError::Invalid)).collect::<Result<_, _>>()?
            }
        };
        for k in &key {
            if !has(k) {
                return Err(SourceError::Invalid(format!(
                    "primary key column {:?} is not a column of {table}; column names are case-sensitive",
                    k.as_str()
                )));
            }
        }
        // The WAL carries the old row's replica identity only; a delete's Item is built from it.
        let full = format!("ALTER TABLE {quoted} REPLICA IDENTITY FULL");
        match identity.as_str() {
            "n" => {
                return Err(SourceError::Invalid(format!(
                    "table {table} has REPLICA IDENTITY NOTHING: PostgreSQL refuses updates and deletes on it once it is published, and a delete would carry no key. Run ALTER TABLE {quoted} REPLICA IDENTITY DEFAULT (the primary key) or {full}"
                )))
            }
            "d" if self.spec.primary_key.is_some() => {
                return Err(SourceError::Invalid(format!(
                    "primaryKey is set for {table}, but with REPLICA IDENTITY DEFAULT a delete carries only the table's primary key. Remove primaryKey, or run {full}"
                )))
            }
            "i" => {
                let index: Vec<String> =
                    client.query(sql::IDENTITY_INDEX, &[&oid]).await.map_err(|e| self.error(e))?.iter().map(|r| r.get(0)).collect();
                if let Some(k) = key.iter().find(|k| !index.iter().any(|c| c == k.as_str())) {
                    return Err(SourceError::Invalid(format!(
                        "the replica identity index of {table} does not hold key column {:?}, so a delete would not carry it; set primaryKey to the index's columns ({}) or run {full}",
                        k.as_str(),
                        index.join(", ")
                    )));
                }
            }
            _ => {}
        }
        if self.options.delete_item == DeleteItem::Row && identity != "f" {
            return Err(SourceError::Invalid(format!(
                "deleteItem row needs the whole old row in the WAL, which PostgreSQL writes only with REPLICA IDENTITY FULL: run {full}, or use deleteItem key"
            )));
        }
        let wanted = super::item_column_names(&self.spec, columns.iter().map(|(n, _, _)| n.as_str()))?;
        let mut item_columns = Vec::new();
        for c in &wanted {
            let (_, typname, _) = columns.iter().find(|(n, _, _)| n == c.as_str()).ok_or_else(|| {
                SourceError::Invalid(format!(
                    "column {:?} is not a column of {table}; column names are case-sensitive",
                    c.as_str()
                ))
            })?;
            let json = columns.iter().any(|(n, _, json)| n == c.as_str() && *json);
            let render = match typname.as_str() {
                "bytea" => sql::Render::Base64,
                ty if json => sql::Render::Json(ty.to_string()),
                _ => sql::Render::Plain,
            };
            item_columns.push((c.clone(), render));
        }
        // What else the login lacks, said with the publication's refusal so an operator fixes it all at once.
        let also = (!replication).then(|| {
            format!(
                ". The login {login} also lacks the REPLICATION attribute that reading a slot needs: ALTER ROLE \"{login}\" WITH REPLICATION (or have such a user create the slot: SELECT pg_create_logical_replication_slot('{}', 'pgoutput'))",
                self.options.slot
            )
        });
        let also = also.as_deref().unwrap_or_default();
        self.check_publication(&client, [&quoted, &schema, &name], &columns, also, version >= 150_000).await?;
        Ok(Shape {
            oid,
            items: sql::items(&quoted, &key, &item_columns),
            key,
            columns: columns.into_iter().map(|(n, _, _)| n).collect(),
        })
    }

    /// The publication must publish every operation of the table (`quoted`, in `schema` as `name`), every row
    /// and every column; created when missing and the login may. `also` is appended to a refusal; `filters`:
    /// the server has row filters and column lists (PostgreSQL 15 and later).
    async fn check_publication(
        &self,
        client: &deadpool_postgres::Client,
        [quoted, schema, name]: [&str; 3],
        columns: &[(String, String, bool)],
        also: &str,
        filters: bool,
    ) -> Result<(), SourceError> {
        let publication = &self.options.publication;
        let create = format!("CREATE PUBLICATION {publication} FOR TABLE {quoted}");
        let row = client.query_opt(sql::PUBLICATION, &[publication]).await.map_err(|e| self.error(e))?;
        let Some(row) = row else {
            return match client.batch_execute(&create).await {
                Ok(()) => {
                    tracing::info!(publication = %publication, table = %self.spec.table, "created publication {publication}");
                    Ok(())
                }
                Err(e) if e.code().is_some_and(|c| c.code() == "42501") => Err(SourceError::Invalid(format!(
                    "publication {publication} does not exist, and this login may not create it ({}). Have the table's owner run: {create}{also}",
                    e.as_db_error().map_or(String::new(), |d| d.message().to_string())
                ))),
                Err(e) => Err(self.error(e)),
            };
        };
        let publishes: [bool; 4] = [row.get(0), row.get(1), row.get(2), row.get(3)];
        if publishes.contains(&false) {
            return Err(SourceError::Invalid(format!(
                "publication {publication} does not publish every operation (insert, update, delete, truncate), so some changes would never reach this function: ALTER PUBLICATION {publication} SET (publish = 'insert, update, delete, truncate')"
            )));
        }
        // Row filters and column lists exist from PostgreSQL 15; before, a published table is published whole.
        let statement = if filters { sql::PUBLISHED } else { sql::PUBLISHED_WHOLE };
        let published = client.query_opt(statement, &[publication, &schema, &name]).await.map_err(|e| self.error(e))?;
        let Some(published) = published else {
            return Err(SourceError::Invalid(format!(
                "publication {publication} does not include {}: ALTER PUBLICATION {publication} ADD TABLE {quoted}",
                self.spec.table
            )));
        };
        let (unfiltered, attnames): (bool, Option<Vec<String>>) = (published.get(0), published.get(1));
        let attnames = attnames.unwrap_or_else(|| columns.iter().map(|(c, _, _)| c.clone()).collect());
        if !unfiltered {
            return Err(SourceError::Invalid(format!(
                "publication {publication} filters the rows of {} (a WHERE clause), so changes to other rows would never arrive; publish the table without a row filter",
                self.spec.table
            )));
        }
        if let Some((missing, _, _)) = columns.iter().find(|(c, _, _)| !attnames.contains(c)) {
            return Err(SourceError::Invalid(format!(
                "publication {publication} publishes only some columns of {} ({missing:?} is left out); publish the table without a column list",
                self.spec.table
            )));
        }
        Ok(())
    }

    /// The slot as it is now, created when missing (or replaced when invalidated) if `create`; its
    /// `confirmed_flush_lsn`.
    async fn ensure_slot(&self, client: &deadpool_postgres::Client, create: bool) -> Result<Lsn, SourceError> {
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

    async fn slot_state(&self, client: &deadpool_postgres::Client) -> Result<SlotState, SourceError> {
        let row = client.query_opt(sql::SLOT, &[&self.options.slot]).await.map_err(|e| self.error(e))?;
        Ok(slot_state(row.as_ref(), &self.options.slot))
    }

    /// Why the slot cannot serve a position, and the way on.
    fn slot_refusal(&self, state: SlotState, after: Option<Pos>) -> SourceError {
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

    /// Peeks until the scan is complete (see [`Want`]), growing the message bound when a page of skipped
    /// messages or a stretch of other tables' transactions used it up. A Relation message that shows columns
    /// the table's shape does not have makes it read the catalog again, once.
    async fn scan(&self, want: Want) -> Result<Scan, SourceError> {
        let mut discovered_again = false;
        loop {
            let shape = self.shape().await?;
            let mut memory = self.slot.lock().await;
            let client = self.client().await?;
            // Deferred delivery keeps the slot at the proven checkpoint, so a tick skips the unproven span first:
            // start from what the last peek needed rather than growing to it again every tick.
            let mut budget =
                (want.limit.saturating_mul(3) + 64).max(memory.skipped + want.limit).min(i32::MAX as usize);
            let peeked = loop {
                match self.peek(&client, &shape, &mut memory, want, budget).await? {
                    Some(peeked) => break peeked,
                    None => budget = budget.saturating_mul(4).min(i32::MAX as usize),
                }
            };
            memory.skipped = peeked.skipped;
            if peeked.shape_changed && !discovered_again {
                discovered_again = true;
                *self.shape.lock().expect("shape lock") = None;
                continue;
            }
            return Ok(peeked.scan);
        }
    }

    /// One peek; `None` when the message bound cut it short before the scan was complete.
    async fn peek(
        &self,
        client: &deadpool_postgres::Client,
        shape: &Shape,
        memory: &mut SlotMemory,
        want: Want,
        budget: usize,
    ) -> Result<Option<Peeked>, SourceError> {
        let slot = &self.options.slot;
        let statement =
            client.prepare_cached(&sql::peek(&self.options.publication)).await.map_err(|e| self.error(e))?;
        let budget_param = budget as i32;
        let params: [&(dyn ToSql + Sync); 2] = [slot, &budget_param];
        // The slot's state first, not pipelined with the peek: the peek's rows stream, and a reply queued
        // behind rows nobody reads yet would wait for ever.
        let state = self.slot_state(client).await?;
        match (state, want.after) {
            (SlotState::Ready(confirmed), Some(after)) if confirmed > after.resume() => {
                return Err(self.slot_refusal(SlotState::Ready(confirmed), Some(after)))
            }
            (SlotState::Ready(confirmed), _) => memory.at = Some(memory.at.map_or(confirmed, |a| a.max(confirmed))),
            (other, after) => return Err(self.slot_refusal(other, after)),
        }
        let rows = client.query_raw(&statement, params.iter().copied()).await.map_err(|e| self.error(e))?;
        futures::pin_mut!(rows);

        let mut out = Peeked::default();
        let mut txn: Option<Txn> = None;
        let mut relation: Option<Relation> = None;
        let mut seen = 0usize;
        // After `limit` changes: whether the last one ends its transaction decides its position's `end`.
        let mut looking_ahead = false;
        let mut complete = false;
        'rows: while let Some(row) = rows.next().await {
            let row = row.map_err(|e| self.error(e))?;
            if out.scan.now == 0.0 {
                out.scan.now = row.get(1);
                out.flush = row.get::<_, String>(0);
            }
            let Some(data) = row.get::<_, Option<Vec<u8>>>(3) else { break };
            seen += 1;
            let lsn = row.get::<_, Option<String>>(2).and_then(|l| Lsn::parse(&l)).unwrap_or_default();
            let message = pgoutput::decode(&data)
                .map_err(|e| SourceError::Invalid(format!("{e} at LSN {lsn} of slot {slot}; please report it")))?;
            match message {
                Message::Begin { final_lsn, commit_time, xid } => {
                    txn = Some(Txn { commit: final_lsn, commit_time, xid, seq: 0 });
                }
                Message::Commit { end_lsn, .. } => {
                    let ours =
                        txn.take().is_some_and(|t| out.scan.changes.last().is_some_and(|c| c.place.commit == t.commit));
                    if ours {
                        out.scan.last_end = Some(end_lsn);
                    }
                    if looking_ahead {
                        complete = true;
                        break;
                    }
                }
                Message::Relation(r) if r.id == shape.oid => {
                    let columns: Vec<(String, u32)> = r.columns.iter().map(|c| (c.name.clone(), c.type_oid)).collect();
                    if memory.columns.as_ref().is_some_and(|known| *known != columns) {
                        tracing::warn!(
                            table = %self.spec.table, lsn = %lsn,
                            "the columns of {} changed (from the WAL at {lsn}): {}; Item follows the new shape",
                            self.spec.table,
                            columns.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ")
                        );
                        if columns.iter().map(|(n, _)| n).ne(shape.columns.iter()) {
                            out.shape_changed = true;
                        }
                    }
                    memory.columns = Some(columns);
                    relation = Some(r);
                }
                Message::Insert { relation: id, .. }
                | Message::Update { relation: id, .. }
                | Message::Delete { relation: id, .. }
                    if id == shape.oid =>
                {
                    let t = txn.as_mut().ok_or_else(|| undecodable("a change outside a transaction", lsn))?;
                    let r = relation.as_ref().ok_or_else(|| undecodable("a change before its relation", lsn))?;
                    // An update that moves a row to another key is two changes, a delete of the old key and an
                    // insert of the new row (as change tracking reports it): a consumer keyed by the primary key
                    // would otherwise keep the old row for ever.
                    let parts = if key_changed(&message, r, shape) { 2 } else { 1 };
                    for part in 0..parts {
                        t.seq += 1;
                        let place = Place { commit: t.commit, seq: t.seq };
                        if looking_ahead {
                            complete = true;
                            break 'rows;
                        }
                        if want.after.is_some_and(|a| a.covers(place)) {
                            out.skipped = seen;
                            continue;
                        }
                        if want.upto.is_some_and(|u| !u.covers(place)) {
                            complete = true;
                            break 'rows;
                        }
                        let (operation, kind, values) = match (want.values, parts, part) {
                            (false, _, _) => (Operation::Insert, 0, Map::new()),
                            (true, 2, 0) => self.old_key(&message, r, shape),
                            (true, 2, _) => {
                                let (_, kind, values) = self.values(&message, r, shape);
                                (Operation::Insert, kind, values)
                            }
                            (true, _, _) => self.values(&message, r, shape),
                        };
                        out.scan.changes.push(Decoded {
                            place,
                            operation,
                            kind,
                            values,
                            lsn,
                            xid: t.xid,
                            commit_time: t.commit_time,
                        });
                        out.scan.last_end = None;
                        out.scan.passed = None;
                        if out.scan.changes.len() >= want.limit {
                            looking_ahead = true;
                        }
                    }
                }
                Message::Truncate { relations, .. } if relations.contains(&shape.oid) => {
                    let t = txn.as_mut().ok_or_else(|| undecodable("a truncate outside a transaction", lsn))?;
                    t.seq += 1;
                    let place = Place { commit: t.commit, seq: t.seq };
                    if looking_ahead {
                        complete = true;
                        break;
                    }
                    if want.after.is_some_and(|a| a.covers(place)) {
                        continue;
                    }
                    if want.upto.is_some_and(|u| !u.covers(place)) {
                        complete = true;
                        break;
                    }
                    match self.options.on_truncate {
                        OnTruncate::Fail if out.scan.changes.is_empty() => {
                            return Err(SourceError::Invalid(format!(
                                "table {} was truncated (TRUNCATE in transaction {} committed at LSN {}): a truncate removes every row without a change per row, so a consumer that mirrors the table is now out of step. Resync the consumer, then either set onTruncate to \"skip\" in sqltrigger.json to go on past it, or run handler state reset <function> --to now --confirm",
                                self.spec.table, t.xid, t.commit
                            )))
                        }
                        // Deliver what came before it first; the next fetch stops at it.
                        OnTruncate::Fail => {
                            complete = true;
                            break;
                        }
                        OnTruncate::Skip => {
                            tracing::error!(
                                table = %self.spec.table, xid = t.xid, lsn = %t.commit,
                                "table {} was truncated (transaction {} committed at LSN {}); onTruncate is skip, so no change is delivered for it",
                                self.spec.table, t.xid, t.commit
                            );
                            out.scan.passed = Some(place);
                        }
                    }
                }
                _ => {}
            }
        }
        if !complete && seen >= budget {
            return Ok(None);
        }
        if !complete {
            out.scan.proven_to = Lsn::parse(&out.flush);
        }
        Ok(Some(out))
    }

    /// An insert, update or delete as the operation, what `sql::items` should build, and the column values.
    fn values(&self, message: &Message, r: &Relation, shape: &Shape) -> (Operation, i32, Map<String, Value>) {
        match message {
            Message::Insert { new, .. } => (Operation::Insert, 0, tuple_object(new, r, shape, false)),
            Message::Update { new, old, .. } => {
                let mut values = tuple_object(new, r, shape, false);
                let left_out: Vec<usize> =
                    new.iter().enumerate().filter(|(_, v)| **v == pgoutput::Value::Unchanged).map(|(i, _)| i).collect();
                let mut kind = 0;
                if !left_out.is_empty() {
                    match old {
                        // REPLICA IDENTITY FULL: the old row carries the untouched values.
                        Some((OldKind::Row, old)) => {
                            let old = tuple_object(old, r, shape, false);
                            for i in left_out {
                                let name = &r.columns[i].name;
                                if let Some(v) = old.get(name) {
                                    values.insert(name.clone(), v.clone());
                                }
                            }
                        }
                        _ => kind = 2,
                    }
                }
                (Operation::Update, kind, values)
            }
            Message::Delete { old: (old_kind, old), .. } => match (self.options.delete_item, old_kind) {
                (DeleteItem::Row, OldKind::Row) => (Operation::Delete, 0, tuple_object(old, r, shape, false)),
                _ => (Operation::Delete, 1, tuple_object(old, r, shape, true)),
            },
            other => unreachable!("values is called for inserts, updates and deletes only, not {other:?}"),
        }
    }

    /// The delete half of an update that changed the key: the old key (or the whole old row, as a delete's
    /// `Item` would be).
    fn old_key(&self, message: &Message, r: &Relation, shape: &Shape) -> (Operation, i32, Map<String, Value>) {
        match message {
            Message::Update { old: Some((OldKind::Row, old)), .. } if self.options.delete_item == DeleteItem::Row => {
                (Operation::Delete, 0, tuple_object(old, r, shape, false))
            }
            Message::Update { old: Some((_, old)), .. } => (Operation::Delete, 1, tuple_object(old, r, shape, true)),
            other => unreachable!("old_key is called for key-changing updates only, not {other:?}"),
        }
    }

    /// Builds the changes of a scan: one statement turns the values into `Item`s.
    async fn changes(&self, scan: &Scan) -> Result<Vec<Change>, SourceError> {
        if scan.changes.is_empty() {
            return Ok(Vec::new());
        }
        let shape = self.shape().await?;
        let client = self.client().await?;
        let objects: Vec<String> =
            scan.changes.iter().map(|c| serde_json::to_string(&c.values).expect("values serialize")).collect();
        let kinds: Vec<i32> = scan.changes.iter().map(|c| c.kind).collect();
        let statement = client.prepare_cached(&shape.items).await.map_err(|e| self.error(e))?;
        let rows = client.query(&statement, &[&objects, &kinds]).await.map_err(|e| self.error(e))?;
        if rows.len() != scan.changes.len() {
            return Err(SourceError::Invalid(format!(
                "building the items of {} changes returned {} rows; please report it",
                scan.changes.len(),
                rows.len()
            )));
        }
        let mut out = Vec::with_capacity(rows.len());
        for (decoded, row) in scan.changes.iter().zip(&rows) {
            let item: String = row.get(0);
            let mut change = Change::from_json(decoded.operation, item)
                .map_err(|e| SourceError::Invalid(format!("PostgreSQL returned invalid row JSON: {e}")))?;
            if self.options.include_metadata {
                let metadata = json!({
                    "Lsn": decoded.lsn.to_string(),
                    "CommitLsn": decoded.place.commit.to_string(),
                    "Xid": decoded.xid,
                    "CommitTime": commit_time_text(decoded.commit_time),
                });
                change.metadata = Some(serde_json::value::to_raw_value(&metadata).expect("metadata serializes"));
            }
            out.push(change);
        }
        Ok(out)
    }

    /// The position after a scan's last change (or a skipped truncate after it).
    fn last(scan: &Scan) -> Option<Position> {
        if let Some(place) = scan.passed {
            return Some(Pos { commit: place.commit, seq: place.seq, end: None }.to_json());
        }
        let c = scan.changes.last()?;
        Some(Pos { commit: c.place.commit, seq: c.place.seq, end: scan.last_end }.to_json())
    }

    async fn fetched(&self, want: Want) -> Result<Fetched, SourceError> {
        let scan = self.scan(want).await?;
        let changes = self.changes(&scan).await?;
        if !changes.is_empty() {
            return Ok(Fetched { last: Self::last(&scan), changes, advance: None });
        }
        // Nothing to deliver: a skipped truncate is passed, else the stretch read is proven empty.
        let advance = match scan.passed {
            Some(place) => Some(Pos { commit: place.commit, seq: place.seq, end: None }.to_json()),
            None => scan
                .proven_to
                .filter(|to| want.after.is_none_or(|a| a.resume() < *to))
                .map(|to| Pos::before(to).to_json()),
        };
        Ok(Fetched { changes, last: None, advance })
    }

    fn position(&self, p: &Position) -> Result<Option<Pos>, SourceError> {
        if p.is_null() {
            return Ok(None);
        }
        Pos::from_json(p).map(Some).ok_or_else(|| {
            SourceError::Invalid(format!(
                "stored position {p} is not a postgres-logical position ({{\"lsn\": \"0/16B3748\", \"n\": 1}}); reset the function's state"
            ))
        })
    }
}

#[derive(Debug, Default)]
struct Peeked {
    scan: Scan,
    flush: String,
    /// A Relation message showed columns the shape does not have: discover again and scan again.
    shape_changed: bool,
    /// Messages read before the first change after the position.
    skipped: usize,
}

#[derive(Debug, Clone, PartialEq)]
enum SlotState {
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

/// A tuple as the JSON object `sql::items` reads: column name to text (JSON for json columns) or null; a value
/// the WAL left out (an unchanged TOAST-ed value) is left out. `only_key`: the key columns only.
fn tuple_object(tuple: &[pgoutput::Value], r: &Relation, shape: &Shape, only_key: bool) -> Map<String, Value> {
    let mut m = Map::new();
    for (c, v) in r.columns.iter().zip(tuple) {
        if only_key && !shape.key.iter().any(|k| k.as_str() == c.name) {
            continue;
        }
        let value = match v {
            pgoutput::Value::Null => Value::Null,
            pgoutput::Value::Unchanged => continue,
            pgoutput::Value::Text(t) => Value::String(t.clone()),
        };
        m.insert(c.name.clone(), value);
    }
    m
}

/// Whether an update moved its row to another key: the old tuple (sent when the replica identity changed or
/// is stored out of line, and always with REPLICA IDENTITY FULL) holds other key values than the new one.
fn key_changed(message: &Message, r: &Relation, shape: &Shape) -> bool {
    let Message::Update { old: Some((_, old)), new, .. } = message else { return false };
    r.columns.iter().enumerate().any(|(i, c)| {
        shape.key.iter().any(|k| k.as_str() == c.name)
            && matches!((old.get(i), new.get(i)), (Some(o @ pgoutput::Value::Text(_)), Some(n @ pgoutput::Value::Text(_))) if o != n)
    })
}

fn undecodable(what: &str, lsn: Lsn) -> SourceError {
    SourceError::Invalid(format!("pgoutput sent {what} at LSN {lsn}; please report it"))
}

/// pgoutput's commit time (microseconds since 2000-01-01 UTC) as RFC 3339.
fn commit_time_text(micros: i64) -> String {
    let nanos = (i128::from(POSTGRES_EPOCH) * 1_000_000 + i128::from(micros)) * 1_000;
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_default()
}

/// Seconds since the Unix epoch of pgoutput's commit time.
fn commit_unix_seconds(micros: i64) -> f64 {
    POSTGRES_EPOCH as f64 + micros as f64 / 1e6
}

#[async_trait::async_trait]
impl Source for PostgresLogical {
    fn name(&self) -> String {
        format!("postgres-logical:{}", self.spec.table)
    }

    /// The slot is part of what a position means: another slot has other positions.
    fn fingerprint(&self) -> String {
        super::fingerprint(&self.spec, Some(&format!("slot {}", self.options.slot)))
    }

    async fn validate(&self) -> Result<(), SourceError> {
        self.shape().await.map(|_| ())
    }

    async fn start_position(&self, from: StartFrom) -> Result<Position, SourceError> {
        self.shape().await?;
        let mut memory = self.slot.lock().await;
        let client = self.client().await?;
        let confirmed = self.ensure_slot(&client, true).await?;
        memory.at = Some(confirmed);
        let at = match from {
            StartFrom::Earliest => confirmed,
            StartFrom::Now => {
                let flush: String = client.query_one(sql::FLUSH, &[]).await.map_err(|e| self.error(e))?.get(0);
                Lsn::parse(&flush).unwrap_or(confirmed).max(confirmed)
            }
        };
        Ok(Pos::before(at).to_json())
    }

    async fn fetch(&self, after: &Position, limit: usize) -> Result<Fetched, SourceError> {
        let after = self.position(after)?;
        self.fetched(Want { after, upto: None, limit: limit.max(1), values: true }).await
    }

    async fn refetch(&self, after: &Position, upto: &Position, limit: usize) -> Result<Fetched, SourceError> {
        let after = self.position(after)?;
        let upto = self.position(upto)?;
        let mut fetched = self.fetched(Want { after, upto, limit: limit.max(1), values: true }).await?;
        fetched.advance = None;
        Ok(fetched)
    }

    async fn pending(&self, after: &Position) -> Result<u64, SourceError> {
        let after = self.position(after)?;
        let scan = self.scan(Want { after, upto: None, limit: PENDING_SCAN, values: false }).await?;
        Ok(scan.changes.len() as u64)
    }

    async fn oldest_pending_age(&self, after: &Position) -> Result<Lag, SourceError> {
        let after = self.position(after)?;
        let scan = self.scan(Want { after, upto: None, limit: 1, values: false }).await?;
        Ok(match scan.changes.first() {
            None => Lag::CaughtUp,
            Some(c) => Lag::Behind(Duration::from_secs_f64((scan.now - commit_unix_seconds(c.commit_time)).max(0.0))),
        })
    }

    async fn acknowledged(&self, checkpoint: &Position) -> Result<(), SourceError> {
        let Some(pos) = Pos::from_json(checkpoint) else { return Ok(()) };
        let target = pos.resume();
        let mut memory = self.slot.lock().await;
        if memory.at.is_some_and(|at| at >= target) {
            return Ok(());
        }
        let client = self.client().await?;
        let confirmed = match self.slot_state(&client).await? {
            SlotState::Ready(at) => at,
            // A tick's fetch says so loudly; an acknowledgement has nothing to move.
            _ => return Ok(()),
        };
        if confirmed < target {
            client
                .query_one(sql::ADVANCE, &[&self.options.slot, &target.to_string()])
                .await
                .map_err(|e| self.error(e))?;
            tracing::debug!(slot = %self.options.slot, from = %confirmed, to = %target, "advanced the replication slot");
        }
        memory.at = Some(confirmed.max(target));
        Ok(())
    }

    async fn health(&self) -> Result<Option<Value>, SourceError> {
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
        })))
    }
}

/// A failed statement in the source's words: what waiting fixes is `Unavailable`, the rest says what to change.
fn db_error(e: tokio_postgres::Error, table: &crate::ident::TableName, options: &Options) -> SourceError {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_times_are_rfc3339_from_the_postgres_epoch() {
        assert_eq!(commit_time_text(0), "2000-01-01T00:00:00Z");
        assert_eq!(commit_time_text(1_500_000), "2000-01-01T00:00:01.5Z");
        assert_eq!(commit_unix_seconds(-POSTGRES_EPOCH * 1_000_000), 0.0);
    }
}
