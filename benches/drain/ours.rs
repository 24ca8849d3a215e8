//! Ours: the real `handler` binary, invoked over HTTP by the host driver exactly as the Functions host would
//! (timer body, a first attempt's RetryContext), with its state in Azure Blob (Azurite), until an invocation answers an empty batch.
//!
//! The per-tick figures (blob operations, time inside the handler) come from the handler's own `tick finished`
//! log line, written at the level the product ships with (info): the store counts every request it sends, so
//! this is the product's own accounting rather than a guess from outside.

use crate::cpu::Role;
use crate::setup::IdCheck;
use crate::{context, BenchResult};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use testbed::driver::HostDriver;

/// One drain by any contender.
#[derive(Debug, Clone)]
pub struct Drain {
    pub rows: u64,
    pub seconds: f64,
    /// Invocations (ours), queries (raw) or ticks (peer), including the one that found nothing.
    pub invocations: u64,
    /// Ours: the summed HTTP round trips (request sent to body read), so `seconds - http_seconds` is the
    /// driver's own work (decoding the ids, checking them).
    pub http_seconds: f64,
    /// CPU seconds per process role during the drain (filled in by the caller).
    pub cpu: BTreeMap<Role, f64>,
    /// `Ok` when the exact id set arrived.
    pub verdict: Result<(), String>,
}

impl Drain {
    pub fn rows_per_second(&self) -> f64 {
        self.rows as f64 / self.seconds
    }
}

/// Invokes `function` until it answers an empty batch; every row's `Item.id` is checked against `1..=expected`.
pub async fn drain(driver: &HostDriver, function: &str, expected: u64) -> BenchResult<Drain> {
    let mut ids = IdCheck::new(expected);
    let mut invocations = 0u64;
    let mut http = Duration::ZERO;
    let started = Instant::now();
    loop {
        let invocation = driver.invoke_raw(function).await.map_err(context(format!("invoking {function}")))?;
        invocations += 1;
        http += invocation.elapsed;
        if !invocation.succeeded() {
            return Err(format!(
                "{function} failed on invocation {invocations} ({}): {}\nhandler log tail:\n{}",
                invocation.status,
                invocation.body,
                tail(&driver.output(), 20)
            ));
        }
        // Only what is checked is decoded: the ids. The host's own decoding is the host's cost, not the handler's.
        let answer: IdsAnswer = serde_json::from_str(&invocation.body)
            .map_err(|e| format!("{function}: the answer is not an Outputs.changes array of Items with ids: {e}"))?;
        if answer.outputs.changes.is_empty() {
            break;
        }
        for change in answer.outputs.changes {
            ids.add(change.item.id);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(Drain {
        rows: ids.received,
        seconds,
        invocations,
        http_seconds: http.as_secs_f64(),
        cpu: BTreeMap::new(),
        verdict: ids.verdict(),
    })
}

/// The part of an answer the drain checks: `{"Outputs":{"changes":[{"Item":{"id":..}}, ..]}}`.
#[derive(serde::Deserialize)]
struct IdsAnswer {
    #[serde(rename = "Outputs", default)]
    outputs: IdsOutputs,
}

#[derive(serde::Deserialize, Default)]
struct IdsOutputs {
    #[serde(default)]
    changes: Vec<IdsChange>,
}

#[derive(serde::Deserialize)]
struct IdsChange {
    #[serde(rename = "Item")]
    item: IdsItem,
}

#[derive(serde::Deserialize)]
struct IdsItem {
    id: i64,
}

/// Latency of `count` invocations that find nothing to deliver, as the host sees it (HTTP round trip).
pub async fn empty_ticks(driver: &HostDriver, function: &str, count: usize) -> BenchResult<Vec<Duration>> {
    let mut latencies = Vec::with_capacity(count);
    for _ in 0..count {
        let invocation = driver.invoke(function, None).await.map_err(context(format!("invoking {function}")))?;
        let delivered = invocation.outputs.get("changes").and_then(Value::as_array).map_or(0, Vec::len);
        if !invocation.succeeded() || delivered > 0 {
            return Err(format!(
                "{function}: an empty tick was expected, got status {} with {delivered} change(s)",
                invocation.status
            ));
        }
        latencies.push(invocation.elapsed);
    }
    Ok(latencies)
}

/// One `tick finished` line of the handler's log.
#[derive(Debug, Clone, PartialEq)]
pub struct TickLine {
    pub function: String,
    pub rows: u64,
    pub outcome: String,
    pub store_operations: u64,
    pub elapsed_ms: f64,
}

/// The `tick finished` lines of a handler log, in order. The format is tracing's default: the span's fields in
/// `invocation{function=X invocation_id=Y}`, then the message, then `key=value` fields.
pub fn tick_lines(log: &str) -> Vec<TickLine> {
    log.lines()
        .filter_map(|line| {
            let (head, fields) = line.split_once("tick finished")?;
            let function = head.split_once("function=")?.1.split([' ', '}']).next()?.to_string();
            let field = |key: &str| {
                fields.split_whitespace().find_map(|kv| kv.strip_prefix(key).and_then(|rest| rest.strip_prefix('=')))
            };
            Some(TickLine {
                function,
                rows: field("rows")?.parse().ok()?,
                outcome: field("outcome")?.to_string(),
                store_operations: field("store_operations")?.parse().ok()?,
                elapsed_ms: field("elapsed_ms")?.parse().ok()?,
            })
        })
        .collect()
}

/// The ticks of one drain, by kind: what the blob-operation goals are about.
#[derive(Debug, Clone, Default)]
pub struct TickProfile {
    /// The first tick of a fresh function (state not found, container check, first write).
    pub first: Option<TickLine>,
    /// Ticks that delivered a new batch (and acknowledged the previous one), after the first.
    pub delivering: Vec<TickLine>,
    /// The empty tick right after the last batch: it acknowledges that batch, so it writes.
    pub acknowledging: Option<TickLine>,
    /// Ticks with nothing to acknowledge and nothing to deliver.
    pub empty: Vec<TickLine>,
}

impl TickProfile {
    pub fn of(lines: &[TickLine], function: &str) -> Self {
        let mut profile = Self::default();
        for line in lines.iter().filter(|l| l.function == function) {
            if profile.first.is_none() {
                profile.first = Some(line.clone());
            } else if line.rows > 0 {
                profile.delivering.push(line.clone());
            } else if profile.acknowledging.is_none() {
                profile.acknowledging = Some(line.clone());
            } else {
                profile.empty.push(line.clone());
            }
        }
        profile
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
