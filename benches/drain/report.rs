//! The figures of one run: collected, judged against the goals, printed, and written into
//! docs/benchmarks.md between two markers (the prose around them is kept).

use crate::cpu::Role;
use crate::ours::{Drain, TickLine, TickProfile};
use crate::peer::PeerDrain;
use crate::positions::Positions;
use crate::setup::Servers;
use crate::{context, BenchResult, Options};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

const BEGIN: &str = "<!-- bench:drain:begin (written by `scripts/bench`; edits inside are overwritten) -->";
const END: &str = "<!-- bench:drain:end -->";
/// The chart's file, next to the document the results go into.
pub const CHART: &str = "benchmarks-drain.svg";

/// One batch size: every drain of every contender.
#[derive(Debug, Clone)]
pub struct BatchRow {
    pub batch: usize,
    pub ours: Vec<Drain>,
    pub raw: Vec<Drain>,
    pub peer: Option<PeerDrain>,
}

impl BatchRow {
    fn ours(&self) -> f64 {
        median(self.ours.iter().map(Drain::rows_per_second).collect())
    }
    fn raw(&self) -> f64 {
        median(self.raw.iter().map(Drain::rows_per_second).collect())
    }
    fn peer(&self) -> Option<f64> {
        self.peer.as_ref().map(|p| p.drain.rows_per_second())
    }
    /// `ok` when every drain delivered the exact id set, else the first problem.
    fn check(&self) -> String {
        let peer = self.peer.iter().map(|p| ("peer", &p.drain));
        let all = self.ours.iter().map(|d| ("ours", d)).chain(self.raw.iter().map(|d| ("raw", d))).chain(peer);
        for (who, drain) in all {
            if let Err(problem) = &drain.verdict {
                return format!("{who}: {problem}");
            }
        }
        "exact".into()
    }
}

#[derive(Debug)]
pub struct Results {
    pub date: String,
    pub cpus: usize,
    /// /proc/loadavg before and after the run: other work on the machine skews every figure.
    pub load_before: String,
    pub load_after: String,
    pub postgres: String,
    pub azurite: String,
    pub rows: u64,
    pub rows_per_transaction: u64,
    pub repeats: usize,
    pub load_seconds: f64,
    pub big_load_seconds: f64,
    pub handler_ready: Duration,
    /// One drain by a handler started with RUST_BACKTRACE=1, at this batch size.
    pub backtraces: Option<(usize, Drain)>,
    /// Whether raw's statements are the handler's, as PostgreSQL recorded them.
    pub statements: Result<(), String>,
    pub drains: Vec<BatchRow>,
    pub profiles: Vec<TickProfile>,
    pub idle_function: String,
    pub empty_latency: Vec<Duration>,
    pub positions: Option<Positions>,
}

impl Results {
    pub fn new(options: &Options, servers: &Servers) -> Self {
        let azurite = std::fs::read_to_string(options.manifest_dir.join("tools/node_modules/azurite/package.json"))
            .ok()
            .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
            .and_then(|v| v.get("version").and_then(|v| v.as_str()).map(str::to_string))
            .unwrap_or_else(|| "unknown".into());
        Self {
            date: time::OffsetDateTime::now_utc().date().to_string(),
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            load_before: String::new(),
            load_after: String::new(),
            postgres: servers.postgres.version().to_string(),
            azurite,
            rows: options.rows,
            rows_per_transaction: options.rows_per_transaction,
            repeats: options.repeats,
            load_seconds: 0.0,
            big_load_seconds: 0.0,
            handler_ready: Duration::ZERO,
            backtraces: None,
            statements: Err("not checked".into()),
            drains: Vec::new(),
            profiles: Vec::new(),
            idle_function: String::new(),
            empty_latency: Vec::new(),
            positions: None,
        }
    }

    fn peer_version(&self) -> String {
        self.drains.iter().find_map(|d| d.peer.as_ref().map(|p| p.version.clone())).unwrap_or_else(|| "-".into())
    }

    /// Every tick of a kind, across all drained functions.
    fn ticks<'a>(&'a self, pick: impl Fn(&'a TickProfile) -> Vec<&'a TickLine>) -> Vec<&'a TickLine> {
        self.profiles.iter().flat_map(pick).collect()
    }

    fn goals(&self) -> Vec<(String, String, bool)> {
        let mut goals = Vec::new();
        if let Some(row) = self.drains.iter().find(|d| d.batch == 100) {
            if let Some(peer) = row.peer() {
                let ratio = row.ours() / peer;
                goals.push(("≥ 10× the peer at batch 100".into(), format!("{ratio:.1}×"), ratio >= 10.0));
            }
        }
        if let Some(row) = self.drains.iter().find(|d| d.batch == 1000) {
            let rate = row.ours();
            goals.push((
                "≥ 100k rows/s at batch 1000".into(),
                format!("{:.1}k rows/s", rate / 1000.0),
                rate >= 100_000.0,
            ));
        }
        let empty = self.ticks(|p| p.empty.iter().collect());
        if let Some(max) = empty.iter().map(|t| t.store_operations).max() {
            goals.push(("blob operations per empty tick: 1".into(), ops_summary(&empty), max <= 1));
        }
        let delivering = self.ticks(|p| p.delivering.iter().collect());
        if let Some(max) = delivering.iter().map(|t| t.store_operations).max() {
            goals.push(("blob operations per delivering tick: ≤ 2".into(), ops_summary(&delivering), max <= 2));
        }
        if !self.empty_latency.is_empty() {
            let p50 = percentile(&self.empty_latency, 50.0);
            goals.push(("empty tick p50 ≤ 3 ms".into(), format!("{:.2} ms", ms(p50)), p50 <= Duration::from_millis(3)));
        }
        if let Some(p) = &self.positions {
            let ratio = ms(percentile(&p.ours_90, 50.0)) / ms(percentile(&p.ours_10, 50.0));
            goals.push(("fetch at 90 % / at 10 % ≤ 1.5".into(), format!("{ratio:.2}"), ratio <= 1.5));
        }
        goals
    }

    /// Ours, per invocation: the driver's wall time split into the HTTP round trip, the tick inside the handler
    /// (its own `elapsed_ms`) and what remains (the driver decoding the answer and checking ids).
    fn invocation_breakdown(&self, out: &mut String) {
        let _ = writeln!(out, "\n### Ours: where one invocation's time goes (mean ms per invocation)\n");
        let _ = writeln!(out, "| batch | invocation (driver wall) | HTTP round trip | tick inside the handler | HTTP + answer encoding outside the tick | driver: decode answer, check ids |");
        let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|");
        for row in &self.drains {
            let invocations: u64 = row.ours.iter().map(|d| d.invocations).sum();
            if invocations == 0 {
                continue;
            }
            let n = invocations as f64;
            let wall = row.ours.iter().map(|d| d.seconds).sum::<f64>() * 1000.0 / n;
            let http = row.ours.iter().map(|d| d.http_seconds).sum::<f64>() * 1000.0 / n;
            let ticks: Vec<&TickLine> = self
                .profiles
                .iter()
                .filter(|p| p.first.as_ref().is_some_and(|f| f.function.starts_with(&format!("DrainB{}R", row.batch))))
                .flat_map(|p| p.first.iter().chain(p.delivering.iter()).chain(p.acknowledging.iter()))
                .collect();
            let tick = ticks.iter().map(|t| t.elapsed_ms).sum::<f64>() / ticks.len().max(1) as f64;
            let _ = writeln!(
                out,
                "| {} | {wall:.2} | {http:.2} | {tick:.2} | {:.2} | {:.2} |",
                row.batch,
                http - tick,
                wall - http
            );
        }
    }

    /// CPU per 1000 rows delivered, per process, for every contender: what each drain costs the machine.
    fn cpu_table(&self, out: &mut String) {
        let roles = [Role::Bench, Role::Handler, Role::Azurite, Role::Postgres, Role::Peer];
        let _ = writeln!(out, "\n### CPU per 1000 rows delivered (ms), by process\n");
        let header: Vec<&str> = roles.iter().map(|r| r.label()).collect();
        let _ = writeln!(out, "| drain | {} | all CPU | wall |", header.join(" | "));
        let _ = writeln!(out, "|---|{}---:|---:|", "---:|".repeat(roles.len()));
        for row in &self.drains {
            let peer: Vec<Drain> = row.peer.iter().map(|p| p.drain.clone()).collect();
            for (who, drains) in [("ours", &row.ours), ("raw", &row.raw), ("peer", &peer)] {
                let rows: u64 = drains.iter().map(|d| d.rows).sum();
                if rows == 0 {
                    continue;
                }
                let per_1000 = |seconds: f64| seconds * 1000.0 * 1000.0 / rows as f64;
                let cells: Vec<String> = roles
                    .iter()
                    .map(|role| per_1000(drains.iter().map(|d| d.cpu.get(role).copied().unwrap_or(0.0)).sum()))
                    .map(|ms| format!("{ms:.1}"))
                    .collect();
                let all: f64 = drains.iter().flat_map(|d| d.cpu.values()).sum();
                let wall: f64 = drains.iter().map(|d| d.seconds).sum();
                let _ = writeln!(
                    out,
                    "| {who} b{} | {} | {:.1} | {:.1} |",
                    row.batch,
                    cells.join(" | "),
                    per_1000(all),
                    per_1000(wall)
                );
            }
        }
        let _ = writeln!(out, "\nFrom /proc (10 ms ticks); PostgreSQL is the postmaster and its backends, the peer's figure is its tick only (no imports).");
    }

    /// Ours with RUST_BACKTRACE=1 next to ours as measured (unset, as in production).
    fn backtrace_table(&self, out: &mut String) {
        let Some((batch, traced)) = &self.backtraces else { return };
        let Some(row) = self.drains.iter().find(|d| d.batch == *batch) else { return };
        let _ = writeln!(out, "\n### Ours with `RUST_BACKTRACE=1` (batch {batch})\n");
        let _ = writeln!(out, "| handler environment | rows/s | handler CPU per 1000 rows (ms) | check |");
        let _ = writeln!(out, "|---|---:|---:|---|");
        let per_1000 = |drains: &[&Drain]| {
            let rows: u64 = drains.iter().map(|d| d.rows).sum();
            let cpu: f64 = drains.iter().map(|d| d.cpu.get(&Role::Handler).copied().unwrap_or(0.0)).sum();
            cpu * 1e6 / rows.max(1) as f64
        };
        let all: Vec<&Drain> = row.ours.iter().collect();
        let _ = writeln!(
            out,
            "| `RUST_BACKTRACE=0`, the same as unset (the figures above) | {} | {:.1} | {} |",
            rate(row.ours()),
            per_1000(&all),
            row.check()
        );
        let verdict = traced.verdict.as_ref().map_or_else(|e| e.clone(), |()| "exact".to_string());
        let _ = writeln!(
            out,
            "| `RUST_BACKTRACE=1` | {} | {:.1} | {verdict} |",
            rate(traced.rows_per_second()),
            per_1000(&[traced])
        );
    }

    /// The drain table as a bar chart: rows per second by contender, one group per batch size.
    pub fn chart(&self) -> String {
        use crate::chart::{horizontal_bars, Bar, Contender, Group};
        let groups: Vec<Group> = self
            .drains
            .iter()
            .map(|row| {
                let mut bars = vec![
                    Bar { label: "ours (handler over HTTP, blob)".into(), value: row.ours(), who: Contender::Ours },
                    Bar { label: "raw keyset loop (the limit)".into(), value: row.raw(), who: Contender::Raw },
                ];
                if let Some(peer) = row.peer() {
                    bars.push(Bar {
                        label: format!("peer azure-functions-db {}", self.peer_version()),
                        value: peer,
                        who: Contender::Peer,
                    });
                }
                Group { heading: format!("batch {}", row.batch), bars }
            })
            .collect();
        let title = format!("Drain of {} changed rows: rows per second", thousands(self.rows));
        let note = format!(
            "scripts/bench, {}, {} CPUs, load {} before; ours and raw: median of {} drains; every drain checked id by id",
            self.date, self.cpus, self.load_before, self.repeats
        );
        horizontal_bars(&title, &note, &groups, |v| format!("{} rows/s", rate(v)))
    }

    /// The results as Markdown (also what is printed).
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Run of {} on {} CPU(s) (load average {} before, {} after): {}; Azurite {}; peer \
             azure-functions-db {}; handler log level `info` (the shipped default), written to a file.\n",
            self.date,
            self.cpus,
            self.load_before,
            self.load_after,
            self.postgres,
            self.azurite,
            self.peer_version()
        );
        let _ = writeln!(
            out,
            "### Drain of {} changed rows ({} per transaction, so {} per cursor value)\n",
            thousands(self.rows),
            self.rows_per_transaction,
            self.rows_per_transaction
        );
        let _ = writeln!(out, "Rows per second from the first call to the empty answer; ours and raw are the median of {} drains, the peer drains once. `check`: every id exactly once.\n", self.repeats);
        let _ = writeln!(out, "| batch | ours (handler, HTTP, blob) | raw keyset loop | peer | ours / peer | ours / raw | ours: ms per invocation | ours without the driver's decoding¹ | check |");
        let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|---|");
        for row in &self.drains {
            let peer = row.peer();
            let per_call: Vec<f64> = row.ours.iter().map(|d| d.seconds * 1000.0 / d.invocations as f64).collect();
            let handler_side = median(row.ours.iter().map(|d| d.rows as f64 / d.http_seconds).collect());
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {:.2} | {:.2} | {} | {} |",
                row.batch,
                rate(row.ours()),
                rate(row.raw()),
                peer.map_or("-".into(), rate),
                peer.map_or("-".into(), |p| format!("{:.1}×", row.ours() / p)),
                row.ours() / row.raw(),
                median(per_call),
                rate(handler_side),
                row.check()
            );
        }
        let spread: Vec<String> = self
            .drains
            .iter()
            .map(|row| {
                let all: Vec<String> = row.ours.iter().map(|d| rate(d.rows_per_second())).collect();
                format!("b{}: {}", row.batch, all.join(", "))
            })
            .collect();
        let _ = writeln!(out, "\n¹ Rows divided by the summed HTTP round trips (request sent to answer read): what the handler delivers when the driver's own work is free. The driver, which stands in for the Functions host, decodes only the ids it checks from each answer; the host does its own decoding on its own cores. Derived, not a separate drain.\n");
        let _ = writeln!(out, "![Drain throughput, rows per second, by batch size]({CHART})\n");
        let _ = writeln!(out, "Every drain of ours, rows/s: {}.", spread.join("; "));
        let _ = match &self.statements {
            Ok(()) => writeln!(
                out,
                "Raw's two statements are byte for byte the ones the handler ran (checked in `pg_stat_activity`)."
            ),
            Err(problem) => writeln!(out, "**Raw's statements are not the handler's**: {problem}."),
        };
        let peer_ops: Vec<String> = self
            .drains
            .iter()
            .filter_map(|row| {
                let p = row.peer.as_ref()?;
                Some(format!("b{}: {:.2}", row.batch, p.blob_requests_per_batch?))
            })
            .collect();
        if !peer_ops.is_empty() {
            let _ = writeln!(
                out,
                "The peer's blob requests per batch (counted at its HTTP pipeline): {}.",
                peer_ops.join(", ")
            );
        }

        self.invocation_breakdown(&mut out);
        self.cpu_table(&mut out);
        self.backtrace_table(&mut out);

        let _ = writeln!(out, "\n### Blob operations and time inside the handler, per tick\n");
        let _ = writeln!(out, "From the handler's `tick finished` lines (`store_operations` counts every request the blob store sends; `elapsed_ms` is the tick inside the handler).\n");
        let _ = writeln!(out, "| tick | count | blob operations | handler ms p50 | handler ms p99 |");
        let _ = writeln!(out, "|---|---:|---|---:|---:|");
        let kinds: [(&str, Vec<&TickLine>); 4] = [
            ("first tick of a fresh function", self.ticks(|p| p.first.iter().collect())),
            (
                "delivering (acknowledges the previous batch, records the next)",
                self.ticks(|p| p.delivering.iter().collect()),
            ),
            ("empty, acknowledging the last batch", self.ticks(|p| p.acknowledging.iter().collect())),
            ("empty (nothing to acknowledge or deliver)", self.ticks(|p| p.empty.iter().collect())),
        ];
        for (kind, ticks) in &kinds {
            if ticks.is_empty() {
                continue;
            }
            let times: Vec<Duration> = ticks.iter().map(|t| Duration::from_secs_f64(t.elapsed_ms / 1000.0)).collect();
            let _ = writeln!(
                out,
                "| {kind} | {} | {} | {:.2} | {:.2} |",
                ticks.len(),
                ops_summary(ticks),
                ms(percentile(&times, 50.0)),
                ms(percentile(&times, 99.0))
            );
        }
        for row in &self.drains {
            let ticks: Vec<&TickLine> = self
                .profiles
                .iter()
                .filter(|p| p.first.as_ref().is_some_and(|f| f.function.starts_with(&format!("DrainB{}R", row.batch))))
                .flat_map(|p| p.delivering.iter())
                .collect();
            let times: Vec<Duration> = ticks.iter().map(|t| Duration::from_secs_f64(t.elapsed_ms / 1000.0)).collect();
            if !times.is_empty() {
                let _ = writeln!(
                    out,
                    "| delivering, batch {} only | {} | {} | {:.2} | {:.2} |",
                    row.batch,
                    ticks.len(),
                    ops_summary(&ticks),
                    ms(percentile(&times, 50.0)),
                    ms(percentile(&times, 99.0))
                );
            }
        }

        if !self.empty_latency.is_empty() {
            let _ = writeln!(out, "\n### Empty tick, as the host sees it\n");
            let _ = writeln!(
                out,
                "{} invocations of drained function {} (HTTP round trip from the driver: request, one blob read, one query, answer): p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms. The handler answered its first `GET /` {:.0} ms after spawn.",
                self.empty_latency.len(),
                self.idle_function,
                ms(percentile(&self.empty_latency, 50.0)),
                ms(percentile(&self.empty_latency, 90.0)),
                ms(percentile(&self.empty_latency, 99.0)),
                ms(percentile(&self.empty_latency, 100.0)),
                ms(self.handler_ready)
            );
        }

        if let Some(p) = &self.positions {
            let _ = writeln!(
                out,
                "\n### Fetch at 10 % and 90 % of a {}-row table (batch {})\n",
                thousands(p.rows),
                p.batch
            );
            let _ = writeln!(out, "Ours: the product's `Source::fetch` ({} samples per position, alternating). Peer: its OR-expanded predicate as a plain statement ({} samples). Times in ms.\n", p.ours_10.len(), p.peer_10.len());
            let _ =
                writeln!(out, "| fetch | at 10 % p50 | at 10 % p99 | at 90 % p50 | at 90 % p99 | 90 % / 10 % (p50) |");
            let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|");
            for (who, at10, at90) in [
                ("ours (row-value keyset)", &p.ours_10, &p.ours_90),
                ("peer (`c > :c OR (c = :c AND pk > :p)`)", &p.peer_10, &p.peer_90),
            ] {
                if at10.is_empty() {
                    continue;
                }
                let _ = writeln!(
                    out,
                    "| {who} | {:.3} | {:.3} | {:.3} | {:.3} | {:.2} |",
                    ms(percentile(at10, 50.0)),
                    ms(percentile(at10, 99.0)),
                    ms(percentile(at90, 50.0)),
                    ms(percentile(at90, 99.0)),
                    ms(percentile(at90, 50.0)) / ms(percentile(at10, 50.0))
                );
            }
        }

        let _ = writeln!(out, "\n### Goals\n");
        let _ = writeln!(out, "| goal | measured | met |");
        let _ = writeln!(out, "|---|---|---|");
        for (goal, measured, met) in self.goals() {
            let _ = writeln!(out, "| {goal} | {measured} | {} |", if met { "yes" } else { "**no**" });
        }
        let _ = writeln!(
            out,
            "\nSet-up, not timed: {} rows loaded in {:.1} s, {} rows in {:.1} s.",
            thousands(self.rows),
            self.load_seconds,
            thousands(self.positions.as_ref().map_or(0, |p| p.rows)),
            self.big_load_seconds
        );
        out
    }
}

pub fn print(results: &Results) {
    println!("{}", results.markdown());
}

/// Replaces the text between the markers in `doc` (creating the file, or appending the markers, if needed).
pub fn write_doc(doc: &Path, results: &Results) -> BenchResult<()> {
    let block = format!("{BEGIN}\n{}{END}", results.markdown());
    let current = std::fs::read_to_string(doc).unwrap_or_default();
    let updated = match (current.find(BEGIN), current.find(END)) {
        (Some(begin), Some(end)) if begin < end => {
            format!("{}{block}{}", &current[..begin], &current[end + END.len()..])
        }
        _ if current.is_empty() => format!("# Benchmarks\n\nCommand: `scripts/bench`.\n\n{block}\n"),
        _ => format!("{}\n\n{block}\n", current.trim_end()),
    };
    std::fs::write(doc, updated).map_err(context(format!("writing {}", doc.display())))
}

fn ops_summary(ticks: &[&TickLine]) -> String {
    let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
    for t in ticks {
        *counts.entry(t.store_operations).or_default() += 1;
    }
    if counts.len() == 1 {
        return counts.keys().map(u64::to_string).collect();
    }
    let parts: Vec<String> = counts.iter().map(|(ops, n)| format!("{ops} ({n}×)")).collect();
    parts.join(", ")
}

fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Nearest-rank percentile.
fn percentile(values: &[Duration], p: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    let mut sorted = values.to_vec();
    sorted.sort();
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn rate(rows_per_second: f64) -> String {
    if rows_per_second >= 10_000.0 {
        format!("{:.1}k", rows_per_second / 1000.0)
    } else {
        format!("{:.2}k", rows_per_second / 1000.0)
    }
}

fn thousands(n: u64) -> String {
    if n >= 1_000_000 && n.is_multiple_of(1_000_000) {
        format!("{}M", n / 1_000_000)
    } else if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}
