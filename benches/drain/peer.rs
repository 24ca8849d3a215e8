//! The peer: azure-functions-db 0.8.3 draining the same table into its own blob container on the same Azurite,
//! run as benches/peer/drain_peer.py in the venv scripts/bench makes. The script times the drain itself (from
//! its first tick to the empty fetch that ends it), so interpreter start-up and imports are not counted.

use crate::cpu::Role;
use crate::ours::Drain;
use crate::{context, BenchResult, Options};
use serde_json::Value;
use std::process::Command;

/// A peer drain and what the peer reports about itself.
#[derive(Debug, Clone)]
pub struct PeerDrain {
    pub drain: Drain,
    pub blob_requests_per_batch: Option<f64>,
    pub version: String,
}

pub fn drain(options: &Options, pg_url: &str, azurite: &str, batch: usize, expected: u64) -> BenchResult<PeerDrain> {
    let output = Command::new(&options.python)
        .arg(&options.peer_script)
        .args(["--pg-url", pg_url, "--azurite-conn", azurite, "--table", "public.orders"])
        .args(["--cursor-column", "changed_at", "--pk", "id"])
        .args(["--batch", &batch.to_string(), "--expected", &expected.to_string()])
        .output()
        .map_err(context(format!("running {}", options.python.display())))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(format!("the peer failed ({}):\n{stdout}\n{stderr}", output.status));
    }
    let line = stdout.lines().rev().find(|l| l.trim_start().starts_with('{')).unwrap_or_default();
    let result: Value = serde_json::from_str(line).map_err(context(format!("the peer's output {stdout:?}")))?;
    let number = |key: &str| result.get(key).and_then(Value::as_f64);
    let count = |key: &str| result.get(key).and_then(Value::as_u64).unwrap_or(0);
    let rows = count("rows");
    let unique = count("unique");
    let in_range = count("in_range");
    let verdict = if unique == expected && in_range == expected && rows == expected {
        Ok(())
    } else {
        Err(format!(
            "{} missing, {} duplicate(s), {} unknown id(s)",
            expected.saturating_sub(in_range),
            count("duplicates"),
            unique.saturating_sub(in_range)
        ))
    };
    let seconds = number("seconds").ok_or_else(|| format!("the peer's output has no seconds: {line}"))?;
    let mut cpu = std::collections::BTreeMap::new();
    if let Some(seconds) = number("cpu_seconds") {
        cpu.insert(Role::Peer, seconds);
    }
    Ok(PeerDrain {
        drain: Drain { rows, seconds, invocations: count("ticks"), http_seconds: 0.0, cpu, verdict },
        blob_requests_per_batch: number("blob_requests_per_batch"),
        version: result.get("version").and_then(Value::as_str).unwrap_or("unknown").to_string(),
    })
}
