//! `handler run` with a partitioned function: the processes of a deployment share its partitions. Each process
//! runs one balancer per partitioned function (`partitions::owners`: renew its own, claim one when below its
//! fair share, the Event Hubs processor's rules) and the tick loop ([`super::run_one`]) of only the partitions
//! it owns.
//!
//! The lease is the function's `leaseDurationMs` (`Sql_Trigger_LeaseDurationMs`), the same one that guards a
//! batch in flight: both protect a partition from a process that died, so a new owner finds the dead one's
//! batch lease run out when it gets the partition. The balancer cycles every third of it, and every second
//! (at most) while it is claiming, so a process that starts alone does not wait a full cycle per partition.
//!
//! A partition this process loses (stolen by a process below its share) stops after the tick in hand: that
//! tick's batch is acknowledged, the batch recorded for the next tick is withdrawn (as on SIGTERM), and the new
//! owner's ticks meet the state document's own lease until then, so a steal never loses or skips a change (see
//! `partitions::owners`). On SIGTERM every partition loop finishes its tick in hand and withdraws its chained
//! batch, then the balancer releases the partitions so the other processes claim them at their next cycle.

use super::{run_one, RunOptions, RunSummary};
use crate::engine::Trigger;
use crate::partitions::{Cycle, Owners};
use crate::sink::Sink;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The longest pause between cycles while this process is claiming partitions.
const CATCH_UP: Duration = Duration::from_secs(1);

/// A partition's tick loop, running in this process.
struct Loop {
    stop: watch::Sender<bool>,
    task: JoinHandle<RunSummary>,
}

/// The triggers of one partitioned function this process serves, by partition.
pub(super) type Parts = BTreeMap<u32, (Arc<Trigger>, Arc<dyn Sink>)>;

/// Balances one partitioned function's partitions with the other processes and runs the owned ones' tick loops,
/// until `stop` turns true; then stops the loops and releases the partitions.
pub(super) async fn run_group(
    app: String,
    mut owners: Owners,
    parts: Parts,
    options: RunOptions,
    mut stop: watch::Receiver<bool>,
) -> RunSummary {
    let group = owners.group().name.clone();
    let lease = parts.values().next().map_or(Duration::from_secs(60), |(t, _)| t.config().settings.lease_duration);
    let cycle = lease / 3;
    let catch_up = cycle.min(CATCH_UP);
    tracing::info!(function = %group, partitions = parts.len(), lease_ms = lease.as_millis() as u64,
        cycle_ms = cycle.as_millis() as u64, "sharing the function's partitions with the other processes");
    for (trigger, _) in parts.values() {
        trigger.mark_owned_elsewhere();
    }
    let mut running: BTreeMap<u32, Loop> = BTreeMap::new();
    let mut stopping: Vec<(u32, JoinHandle<RunSummary>)> = Vec::new();
    let mut summary = RunSummary::default();
    while !*stop.borrow() {
        reap(&mut stopping, &running, &parts, &mut summary, false).await;
        let (owned, wait) = match owners.cycle().await {
            Ok(done) => {
                report(&group, &done);
                let wait = if done.catching_up { catch_up } else { cycle };
                (done.owned, wait)
            }
            Err(e) => {
                let held = owners.held_until(time::OffsetDateTime::now_utc());
                tracing::warn!(function = %group, error = %e, running = held.len(),
                    "partition balancing could not reach the state store; running the partitions this process holds until their leases end");
                (held, catch_up)
            }
        };
        // Lost (or run out): stop after the tick in hand.
        for partition in running.keys().copied().filter(|p| !owned.contains(p)).collect::<Vec<_>>() {
            if let Some(l) = running.remove(&partition) {
                let _ = l.stop.send(true);
                stopping.push((partition, l.task));
            }
        }
        // Owned and not running: start (once a loop lost earlier has finished its tick in hand).
        for partition in owned {
            let busy = running.contains_key(&partition) || stopping.iter().any(|(p, _)| *p == partition);
            if let (false, Some((trigger, sink))) = (busy, parts.get(&partition)) {
                let (tx, rx) = watch::channel(false);
                let (app, trigger, sink) = (app.clone(), trigger.clone(), sink.clone());
                let task = tokio::spawn(async move { run_one(&app, trigger, sink, options, rx).await });
                running.insert(partition, Loop { stop: tx, task });
            }
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = stop.changed() => {}
        }
    }
    // SIGTERM: every loop finishes its tick in hand and withdraws its chained batch; then the partitions go.
    for (partition, l) in std::mem::take(&mut running) {
        let _ = l.stop.send(true);
        stopping.push((partition, l.task));
    }
    reap(&mut stopping, &running, &parts, &mut summary, true).await;
    match owners.release().await {
        Ok(released) => tracing::info!(function = %group, released, "released this process's partitions"),
        Err(e) => tracing::warn!(function = %group, error = %e,
            "could not release this process's partitions; the other processes take them once the leases expire"),
    }
    summary
}

/// Collects the loops that finished (all of them when `wait`), adding up what they delivered; a partition no
/// longer running here is quiet on purpose (the watchdog is told).
async fn reap(
    stopping: &mut Vec<(u32, JoinHandle<RunSummary>)>,
    running: &BTreeMap<u32, Loop>,
    parts: &Parts,
    summary: &mut RunSummary,
    wait: bool,
) {
    let mut still = Vec::new();
    for (partition, task) in stopping.drain(..) {
        if !wait && !task.is_finished() {
            still.push((partition, task));
            continue;
        }
        if let Ok(s) = task.await {
            summary.delivered += s.delivered;
            summary.batches += s.batches;
            summary.failed_deliveries += s.failed_deliveries;
            summary.stopped.extend(s.stopped);
        }
        if let (false, Some((trigger, _))) = (running.contains_key(&partition), parts.get(&partition)) {
            trigger.mark_owned_elsewhere();
        }
    }
    *stopping = still;
}

/// Logs a cycle's claim and losses with the counts behind them.
fn report(group: &str, done: &Cycle) {
    let share = &done.share;
    let owned = done.owned.len();
    if let Some(claim) = &done.claimed {
        match &claim.from {
            None => tracing::info!(function = %group, partition = claim.partition, owned, owners = share.owners,
                fair_share = share.fair, "claimed a free partition"),
            Some(from) => tracing::info!(function = %group, partition = claim.partition, from = %from, owned,
                owners = share.owners, fair_share = share.fair, "stole a partition from an owner above its share"),
        }
    }
    for (partition, to) in &done.lost {
        tracing::info!(function = %group, partition, to = to.as_deref().unwrap_or("another process"), owned,
            owners = share.owners, fair_share = share.fair, "lost a partition; stopping it after the tick in hand");
    }
}
