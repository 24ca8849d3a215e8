//! What a change of the partition count did, as the operator reads it (a table, or `--json`).

use super::layout::Loaded;
use crate::source::Position;
use serde::Serialize;
use std::collections::BTreeMap;

/// What the change did: the table of old → new checkpoints and what may be delivered again.
#[derive(Debug, Serialize)]
pub struct Report {
    pub group: String,
    pub from_partitions: u32,
    pub to_partitions: u32,
    pub partitions: Vec<NewPartition>,
    /// Old documents retired by this run.
    pub retired: Vec<String>,
    /// What the new partitions deliver again (duplicates, never losses).
    pub redelivered: Vec<String>,
    /// Quarantine documents of the old partitions, left where they are (`--quarantine-handled`).
    pub quarantine_left: Vec<String>,
    /// Every write was done by an earlier run: nothing was written now.
    pub already_done: bool,
    pub next_steps: Vec<String>,
}

/// One partition of the new layout.
#[derive(Debug, Serialize)]
pub struct NewPartition {
    pub index: u32,
    pub key: String,
    /// Where it starts (a document found from an earlier run: where it is now).
    pub checkpoint: Position,
    /// The old partitions whose keys it may hold, with their checkpoints.
    pub from: Vec<OldPartition>,
    /// `false`: the document was there already, written by an earlier run of this change.
    pub written: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct OldPartition {
    pub index: u32,
    /// `None`: no document (`--missing-from-earliest`: the earliest position stood in).
    pub checkpoint: Option<Position>,
}

/// What the new partitions deliver again, in words.
pub(super) fn redelivered(n: u32, m: u32, old: &BTreeMap<u32, Loaded>, partitions: &[NewPartition]) -> Vec<String> {
    let mut lines = Vec::new();
    for p in partitions.iter().filter(|p| p.written) {
        for o in &p.from {
            match &o.checkpoint {
                None => lines.push(format!(
                    "new partition {} of {m}: the keys of old partition {} of {n} (no document) from {}: every change of them the source holds",
                    p.index, o.index, p.checkpoint
                )),
                Some(c) if *c != p.checkpoint => lines.push(format!(
                    "new partition {} of {m}: the changes of its keys from old partition {} of {n} after {} up to {c}",
                    p.index, o.index, p.checkpoint
                )),
                Some(_) => {}
            }
        }
    }
    for (i, (doc, _)) in old {
        if let Some(f) = doc.in_flight().filter(|_| doc.retired_into().is_none()) {
            lines.push(format!(
                "old partition {i} of {n} had {} batch(es) with {} change(s) in flight after {} (answered, not acknowledged): delivered again",
                f.batches, f.range.rows, doc.checkpoint()
            ));
        }
    }
    if lines.is_empty() {
        lines.push(
            "nothing: every new partition starts exactly where the old partition holding its keys stopped".into(),
        );
    }
    lines
}

pub(super) fn next_steps(g: &str, m: u32) -> Vec<String> {
    vec![
        format!("under `handler run`: set \"partitions\": {m} in {g}/sqltrigger.json, then start the processes"),
        format!("under the Functions host: `handler partitions generate {g} {m}`, delete the old partition folders, deploy, and enable the new functions"),
        format!("PostgreSQL cursor source: create the index for {m} partitions before starting (the handler names it at start-up; docs/postgres.md), and drop the old one after"),
    ]
}

impl std::fmt::Display for Report {
    /// The table an operator reads: each new partition, where it starts, and the old checkpoints it came from.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verb = if self.already_done { "was already changed" } else { "changed" };
        writeln!(f, "{}: partition count {verb} from {} to {}", self.group, self.from_partitions, self.to_partitions)?;
        writeln!(f)?;
        let rows: Vec<[String; 4]> = self
            .partitions
            .iter()
            .map(|p| {
                let from = p
                    .from
                    .iter()
                    .map(|o| {
                        let at = o.checkpoint.as_ref().map_or("(no document)".to_string(), Position::to_string);
                        format!("{}: {at}", o.index)
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                let state = if p.written { "written" } else { "kept (earlier run)" };
                [format!("{} of {}", p.index, self.to_partitions), p.checkpoint.to_string(), from, state.to_string()]
            })
            .collect();
        let header = ["new partition", "starts after", "old partitions: checkpoints", "document"];
        let width = |c: usize| rows.iter().map(|r| r[c].len()).chain([header[c].len()]).max().unwrap_or(0);
        let widths = [width(0), width(1), width(2)];
        let line = |f: &mut std::fmt::Formatter<'_>, r: [&str; 4]| {
            writeln!(
                f,
                "{:w0$}  {:w1$}  {:w2$}  {}",
                r[0],
                r[1],
                r[2],
                r[3],
                w0 = widths[0],
                w1 = widths[1],
                w2 = widths[2]
            )
        };
        line(f, header)?;
        for r in &rows {
            line(f, [&r[0], &r[1], &r[2], &r[3]])?;
        }
        writeln!(f)?;
        if !self.retired.is_empty() {
            writeln!(f, "retired: {}", self.retired.join(", "))?;
        }
        writeln!(f, "may be delivered again:")?;
        for l in &self.redelivered {
            writeln!(f, "- {l}")?;
        }
        if !self.quarantine_left.is_empty() {
            writeln!(f, "quarantine documents left in the store: {}", self.quarantine_left.join(", "))?;
        }
        writeln!(f, "next:")?;
        for s in &self.next_steps {
            writeln!(f, "- {s}")?;
        }
        Ok(())
    }
}
