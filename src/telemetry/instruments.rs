//! The instruments: counters and histograms recorded by every tick, gauges read from the last status poll.

use crate::engine::{ErrorKind, OutcomeKind, TickObserver, TickRecord};
use opentelemetry::metrics::{Counter, Histogram, Meter};
use opentelemetry::KeyValue;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Batch sizes (changes): the default batch is 100, the largest allowed 100,000.
const BATCH_SIZE_BOUNDARIES: &[f64] =
    &[1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10_000.0, 100_000.0];
/// Tick durations (ms): an empty tick is a few milliseconds, the default tick timeout 240 s.
const TICK_DURATION_BOUNDARIES: &[f64] = &[
    5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10_000.0, 30_000.0, 60_000.0, 120_000.0,
    240_000.0,
];

/// The per-tick instruments. Attribute values are the function name, the outcome and the failure kind only:
/// a bounded set, never row values.
#[derive(Debug)]
pub(super) struct TickInstruments {
    ticks: Counter<u64>,
    changes: Counter<u64>,
    batch_size: Histogram<u64>,
    tick_duration: Histogram<f64>,
    store_operations: Counter<u64>,
    failures: Counter<u64>,
}

impl TickInstruments {
    pub(super) fn new(meter: &Meter) -> Self {
        Self {
            ticks: meter
                .u64_counter("sql_trigger.ticks")
                .with_description(
                    "Ticks run, by outcome (delivered, redelivered, empty, conflict, lease_held, paused, failed).",
                )
                .with_unit("{tick}")
                .build(),
            changes: meter
                .u64_counter("sql_trigger.changes.delivered")
                .with_description(
                    "Changes answered to the host or handed to the sink; outcome redelivered counts repeats.",
                )
                .with_unit("{change}")
                .build(),
            batch_size: meter
                .u64_histogram("sql_trigger.batch.size")
                .with_description("Changes in each batch answered (ticks that answered none are not recorded).")
                .with_unit("{change}")
                .with_boundaries(BATCH_SIZE_BOUNDARIES.to_vec())
                .build(),
            tick_duration: meter
                .f64_histogram("sql_trigger.tick.duration")
                .with_description("Time one tick took, from taking the function's lock to the answer, by outcome.")
                .with_unit("ms")
                .with_boundaries(TICK_DURATION_BOUNDARIES.to_vec())
                .build(),
            store_operations: meter
                .u64_counter("sql_trigger.store.operations")
                .with_description("State-store operations (blob reads, writes, lists) made by ticks.")
                .with_unit("{operation}")
                .build(),
            failures: meter
                .u64_counter("sql_trigger.failures")
                .with_description(
                    "Failed ticks by kind: transient (retried by the next invocation) or operator (needs a person).",
                )
                .with_unit("{tick}")
                .build(),
        }
    }
}

pub(super) fn outcome_label(outcome: Result<OutcomeKind, ErrorKind>) -> &'static str {
    match outcome {
        Ok(OutcomeKind::Delivered) => "delivered",
        Ok(OutcomeKind::Redelivered) => "redelivered",
        Ok(OutcomeKind::Empty) => "empty",
        Ok(OutcomeKind::Conflict) => "conflict",
        Ok(OutcomeKind::LeaseHeld) => "lease_held",
        Ok(OutcomeKind::Paused) => "paused",
        Err(_) => "failed",
    }
}

impl TickObserver for TickInstruments {
    fn tick_finished(&self, record: &TickRecord<'_>) {
        let function = KeyValue::new("function", record.function.to_string());
        let with_outcome = [function.clone(), KeyValue::new("outcome", outcome_label(record.outcome))];
        self.ticks.add(1, &with_outcome);
        self.tick_duration.record(record.duration.as_secs_f64() * 1000.0, &with_outcome);
        if record.rows > 0 {
            self.changes.add(record.rows as u64, &with_outcome);
            self.batch_size.record(record.rows as u64, std::slice::from_ref(&function));
        }
        self.store_operations.add(record.store_operations, std::slice::from_ref(&function));
        if let Err(kind) = record.outcome {
            let kind = match kind {
                ErrorKind::Transient => "transient",
                ErrorKind::Operator => "operator",
            };
            self.failures.add(1, &[function, KeyValue::new("kind", kind)]);
        }
    }
}

/// The last successful status of each function, by name; what the gauges report.
pub(super) type Snapshots = Arc<Mutex<BTreeMap<String, StatusGauges>>>;

/// The replicas each function's backlog asks for (`partitions::status::target_replicas`), by function name (a
/// partitioned function's `partitionGroup`), from the last status poll in which every partition answered.
pub(super) type Targets = Arc<Mutex<BTreeMap<String, u64>>>;

#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct StatusGauges {
    /// A partition trigger's function (`partitionGroup`) and partition index: the gauges' `group` and
    /// `partition` attributes, so a dashboard can sum a partitioned function's partitions.
    pub(super) partition: Option<(String, u32)>,
    pub(super) pending: u64,
    pub(super) target_workers: u64,
    pub(super) seconds_since_progress: f64,
    /// `None` when the source cannot date its changes: the gauge then has no point for the function rather
    /// than a 0 that would read as "caught up".
    pub(super) lag: Option<f64>,
    pub(super) quarantined: u64,
    /// `None` until the pace is known (status `pace_per_second`).
    pub(super) pace: Option<f64>,
    /// `None` when changes wait and nothing moves (status `seconds_to_drain`).
    pub(super) seconds_to_drain: Option<f64>,
}

/// The gauges read the snapshots only: a collection never waits for the database.
pub(super) fn register_gauges(meter: &Meter, snapshots: &Snapshots, targets: &Targets) {
    fn each(snapshots: &Snapshots, mut f: impl FnMut(&StatusGauges, &[KeyValue])) {
        let snapshots = snapshots.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (function, gauges) in snapshots.iter() {
            let mut attrs = vec![KeyValue::new("function", function.clone())];
            if let Some((group, index)) = &gauges.partition {
                attrs.push(KeyValue::new("group", group.clone()));
                attrs.push(KeyValue::new("partition", i64::from(*index)));
            }
            f(gauges, &attrs);
        }
    }
    let t = targets.clone();
    meter
        .u64_observable_gauge("sql_trigger.target_replicas")
        .with_description(
            "Replicas the backlog asks for: min(partitions, ceil(pending / Sql_Trigger_MaxChangesPerWorker)), per function (a partitioned one by its name), at the last status poll; what the scale route answers.",
        )
        .with_unit("{replica}")
        .with_callback(move |o| {
            let targets = t.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            for (function, replicas) in targets.iter() {
                o.observe(*replicas, &[KeyValue::new("function", function.clone())]);
            }
        })
        .build();
    let s = snapshots.clone();
    meter
        .u64_observable_gauge("sql_trigger.changes.pending")
        .with_description(
            "Changes readable after the checkpoint (the batch in flight included), at the last status poll.",
        )
        .with_unit("{change}")
        .with_callback(move |o| each(&s, |g, attrs| o.observe(g.pending, attrs)))
        .build();
    let s = snapshots.clone();
    meter
        .u64_observable_gauge("sql_trigger.target_workers")
        .with_description("ceil(pending / Sql_Trigger_MaxChangesPerWorker), at the last status poll.")
        .with_unit("{worker}")
        .with_callback(move |o| each(&s, |g, attrs| o.observe(g.target_workers, attrs)))
        .build();
    let s = snapshots.clone();
    meter
        .f64_observable_gauge("sql_trigger.seconds_since_progress")
        .with_description("Seconds since the checkpoint last moved while changes are pending (0 when none are).")
        .with_unit("s")
        .with_callback(move |o| each(&s, |g, attrs| o.observe(g.seconds_since_progress, attrs)))
        .build();
    let s = snapshots.clone();
    meter
        .f64_observable_gauge("sql_trigger.lag")
        .with_description(
            "Age of the oldest undelivered change (0 when none waits), at the last status poll; absent when the source cannot date changes.",
        )
        .with_unit("s")
        .with_callback(move |o| {
            each(&s, |g, attrs| {
                if let Some(lag) = g.lag {
                    o.observe(lag, attrs)
                }
            })
        })
        .build();
    let s = snapshots.clone();
    meter
        .f64_observable_gauge("sql_trigger.pace")
        .with_description(
            "Changes acknowledged per second over the last minutes, at the last status poll; absent until known.",
        )
        .with_unit("{change}/s")
        .with_callback(move |o| each(&s, |g, attrs| g.pace.into_iter().for_each(|v| o.observe(v, attrs))))
        .build();
    let s = snapshots.clone();
    meter
        .f64_observable_gauge("sql_trigger.seconds_to_drain")
        .with_description(
            "Pending changes divided by the pace: seconds to drain at the observed pace (0 when none are pending); absent while nothing moves.",
        )
        .with_unit("s")
        .with_callback(move |o| each(&s, |g, attrs| g.seconds_to_drain.into_iter().for_each(|v| o.observe(v, attrs))))
        .build();
    let s = snapshots.clone();
    meter
        .u64_observable_gauge("sql_trigger.batches.quarantined")
        .with_description("Batches quarantined so far (from the state document), at the last status poll.")
        .with_unit("{batch}")
        .with_callback(move |o| each(&s, |g, attrs| o.observe(g.quarantined, attrs)))
        .build();
}
