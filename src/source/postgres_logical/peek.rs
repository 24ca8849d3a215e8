//! The SQL-interface reader (`"reader": "sql"`, and status in every mode): a tick peeks at the slot
//! (`pg_logical_slot_peek_binary_changes`, pgoutput protocol 1) on one pooled connection, bounded by the WAL
//! flush position read in the same statement and by a number of messages. Peeking consumes nothing: the slot
//! moves only when a checkpoint is acknowledged (`pg_replication_slot_advance`). Every peek decodes from the
//! slot's `restart_lsn` on the server, which is why the stream is the default (docs/postgres.md).

use super::decode::Decoder;
use super::position::Lsn;
use super::scan::{Scan, Scanner, Want};
use super::slot::SlotState;
use super::{sql, PostgresLogical, SlotMemory};
use crate::source::SourceError;
use futures::StreamExt;
use tokio_postgres::types::ToSql;

/// What one peek found.
#[derive(Debug, Default)]
struct Peeked {
    scan: Scan,
    /// A Relation message showed columns the shape does not have: discover again and scan again.
    shape_changed: bool,
    /// Messages read before the first change after the position.
    skipped: usize,
}

impl PostgresLogical {
    /// Peeks until the scan is complete (see [`Want`]), growing the message bound when a page of skipped
    /// messages or a stretch of other tables' transactions used it up. A Relation message that shows columns
    /// the table's shape does not have makes it read the catalog again, once. `copy`: peek at a temporary
    /// copy of the slot (status, while a stream holds the slot).
    pub(super) async fn scan(&self, want: Want, copy: bool) -> Result<Scan, SourceError> {
        let mut discovered_again = false;
        loop {
            self.shape().await?;
            let mut memory = self.slot.lock().await;
            let client = self.client().await?;
            let copied = if copy {
                let name = format!("sqltrigger_status_{}", &uuid::Uuid::new_v4().simple().to_string()[..16]);
                client.query_one(sql::COPY_SLOT, &[&self.options.slot, &name]).await.map_err(|e| self.error(e))?;
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
                let read = self.peek(&client, copied.as_deref(), decoder_columns.clone(), want, budget).await;
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
                *self.shape.lock().unwrap_or_else(|p| p.into_inner()) = None;
                continue;
            }
            return Ok(peeked.scan);
        }
    }

    /// One peek; `None` when the message bound cut it short before the scan was complete.
    async fn peek(
        &self,
        client: &deadpool_postgres::Client,
        copy: Option<&str>,
        columns: Option<Vec<(String, u32)>>,
        want: Want,
        budget: usize,
    ) -> Result<Option<(Peeked, Option<Vec<(String, u32)>>)>, SourceError> {
        let shape = self.shape().await?;
        let slot = copy.unwrap_or(&self.options.slot);
        let statement =
            client.prepare_cached(&sql::peek(&self.options.publication)).await.map_err(|e| self.error(e))?;
        let budget_param = budget as i32;
        let params: [&(dyn ToSql + Sync); 2] = [&slot, &budget_param];
        // The slot's state first, not pipelined with the peek: the peek's rows stream, and a reply queued
        // behind rows nobody reads yet would wait for ever.
        match (self.slot_state(client).await?, want.after) {
            (SlotState::Ready(confirmed), Some(after)) if confirmed > after.resume() => {
                return Err(self.slot_refusal(SlotState::Ready(confirmed), Some(after)))
            }
            (SlotState::Ready(_), _) => {}
            (other, after) => return Err(self.slot_refusal(other, after)),
        }
        let rows = client.query_raw(&statement, params.iter().copied()).await.map_err(|e| self.error(e))?;
        futures::pin_mut!(rows);

        let table = self.spec.table.to_string();
        let mut decoder = Decoder::new(shape, self.options.delete_item, want.values, columns, table.clone());
        let mut scanner = Scanner::new(want, self.options.on_truncate, &table);
        let mut out = Peeked::default();
        let mut flush = String::new();
        let mut events = Vec::new();
        let mut seen = 0usize;
        'rows: while let Some(row) = rows.next().await {
            let row = row.map_err(|e| self.error(e))?;
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
    pub(super) async fn advance_over_sql(&self, memory: &mut SlotMemory, target: Lsn) -> Result<(), SourceError> {
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
}
