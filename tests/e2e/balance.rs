//! `handler run` processes sharing a partitioned function: the real binary × 3 over 8 partitions of the orders
//! cursor function, mirrored into a PostgreSQL table while a writer inserts orders throughout; one process is
//! killed with -9, one added, one stopped with SIGTERM.
//!
//! What is asserted: every committed order reaches the target (the exact set); each partition's state is
//! written only by the process its ownership document names, or by one that lost it less than a lease ago (the
//! ownership and state documents sampled every 100 ms); after each change every running process holds its
//! fair share within ±1 (`N / k`, or one more for `N % k` of them) within the bound docs/operations.md states:
//! a lease (for a kill) plus N balancing cycles.
//!
//! Until the cursor source filters by partition, every partition reads every key, so this test asserts nothing
//! about which keys a partition delivers (and the target sees each order several times: it upserts).

use crate::common::*;
use crate::runner::Runner;
use crate::support::AppFolder;
use serde_json::json;
use sql_pseudo_trigger::engine::document::StateDoc;
use sql_pseudo_trigger::partitions::ownership::{self, Ownership};
use sql_pseudo_trigger::state::StateStore;
use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use time::OffsetDateTime;

const PARTITIONS: u32 = 8;
/// The partitions' lease (`leaseDurationMs`): the balancer cycles every third of it.
const LEASE: Duration = Duration::from_secs(3);
const CYCLE: Duration = Duration::from_secs(1);
/// How long after a change the shares must be fair again: N cycles, plus the lease after a kill (the dead
/// process's partitions are claimable only then), plus 2 s for process start. A cycle is its 1 s pause plus its
/// own store calls, which on this test's loaded Azurite (four processes ticking 8 partitions each) take up to
/// another second: 2 s per cycle here.
const SETTLE: Duration = Duration::from_secs(2 * CYCLE.as_secs() * PARTITIONS as u64 + 2);

/// How late a sample may show what a write already reflects.
const SAMPLING: time::Duration = time::Duration::seconds(1);

const COPY_TABLE: &str = "CREATE TABLE public.orders_copy (
    id bigint PRIMARY KEY, customer text NOT NULL, amount numeric(12, 2) NOT NULL)";

/// The orders app with 8 partitions mirrored into `orders_copy` of the same database, state in Azurite.
fn partitioned_app(orders: &Orders, app_name: &str) -> AppFolder {
    let sink = json!({ "type": "postgres", "tableName": "public.orders_copy", "connectionStringSetting": "TargetDb" });
    let trigger = json!({
        "partitions": PARTITIONS, "deliveryMode": "sink", "sink": sink, "columns": ["id", "customer", "amount"],
        "leaseDurationMs": LEASE.as_millis() as u64, "pollingIntervalMs": 200, "maxBatchSize": 200
    });
    orders_app(orders, app_name, trigger, &[("TargetDb", orders.url.as_str())])
}

/// Inserts 10 orders per transaction every 50 ms until stopped; the ids committed.
struct Writer {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<BTreeSet<i64>>,
}

impl Writer {
    async fn start(url: &str) -> Self {
        let orders = Orders::on(url.to_string()).await;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut committed = BTreeSet::new();
            let mut next = 1i64;
            while !stopped.load(Ordering::Relaxed) {
                orders.insert(next..next + 10).await;
                committed.extend(next..next + 10);
                next += 10;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            committed
        });
        Self { stop, task }
    }

    async fn stop(self) -> BTreeSet<i64> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("the writer")
    }
}

/// What the documents said at one moment.
#[derive(Debug, Clone)]
struct Sample {
    at: OffsetDateTime,
    /// Each partition's owner while its lease runs.
    holders: Vec<Option<String>>,
    /// Each partition's state document's last write: when and by whom.
    written: Vec<Option<(OffsetDateTime, String)>>,
}

/// Reads the 8 ownership documents and the 8 state documents every 100 ms until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    fn start(app_name: &str) -> Self {
        let (stop, samples) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(Vec::new())));
        let (stopped, into, app) = (stop.clone(), samples.clone(), app_name.to_string());
        let task = tokio::spawn(async move {
            let store = shared_blob_store();
            while !stopped.load(Ordering::Relaxed) {
                let sample = sample(&store, &app).await;
                into.lock().expect("samples").push(sample);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Self { stop, samples, task }
    }

    fn latest(&self) -> Option<Sample> {
        self.samples.lock().expect("samples").last().cloned()
    }

    async fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("the sampler");
        self.samples.lock().expect("samples").clone()
    }
}

async fn sample(store: &dyn StateStore, app: &str) -> Sample {
    let count = NonZeroU32::new(PARTITIONS).expect("8");
    let owners: Vec<Ownership> = ownership::owners(store, app, FUNCTION, count).await.expect("ownership documents");
    // Read after the ownership documents: a write seen here is no older than the owners just read.
    let at = OffsetDateTime::now_utc();
    let holders = owners.iter().map(|o| o.holder(at).map(str::to_string)).collect();
    let written = futures::future::join_all((0..PARTITIONS).map(|i| async move {
        let key = format!("{app}/{FUNCTION}/partition-{i}-of-{PARTITIONS}.json");
        store.load(&key).await.expect("a state document read").map(|v| {
            let doc: StateDoc = serde_json::from_slice(&v.bytes).expect("a state document");
            (doc.updated_at(), doc.updated_by().to_string())
        })
    }))
    .await;
    Sample { at, holders, written }
}

/// The process id in an owner id (`{host}-{pid}-{random}`).
fn pid_of(owner: &str) -> Option<u32> {
    owner.rsplit('-').nth(1)?.parse().ok()
}

/// How many partitions each of `pids` holds in `sample`, and whether that is fair: every partition held by one
/// of them, each holding `N / k` or (for `N % k` of them) one more.
fn shares(sample: &Sample, pids: &[u32]) -> (BTreeMap<u32, usize>, bool) {
    let mut held: BTreeMap<u32, usize> = pids.iter().map(|p| (*p, 0)).collect();
    let mut stray = 0;
    for holder in &sample.holders {
        match holder.as_deref().and_then(pid_of).and_then(|pid| held.get_mut(&pid)) {
            Some(n) => *n += 1,
            None => stray += 1,
        }
    }
    let (fair, more) = (PARTITIONS as usize / pids.len(), PARTITIONS as usize % pids.len());
    let fits = held.values().all(|n| *n == fair || (more > 0 && *n == fair + 1));
    (held, stray == 0 && fits)
}

/// Waits until the shares of `runners` are fair, at most `bound`; how long it took.
async fn until_fair(sampler: &Sampler, runners: &[&Runner], bound: Duration, what: &str) -> Duration {
    let pids: Vec<u32> = runners.iter().map(|r| r.pid()).collect();
    let started = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Some(latest) = sampler.latest() else { continue };
        let (held, fair) = shares(&latest, &pids);
        if fair {
            let took = started.elapsed();
            eprintln!("{what}: fair shares {held:?} after {took:?}");
            return took;
        }
        let logs: Vec<String> = runners.iter().map(|r| r.stderr()).collect();
        assert!(
            started.elapsed() < bound,
            "{what}: shares not fair within {bound:?}: {held:?}\n{}",
            logs.join("\n---\n")
        );
    }
}

/// Every state write by a process while another owned the partition for longer than a lease (plus 1 s of
/// sampling and scheduling slack), as `(partition, writer, seconds since it last held it)`.
fn writes_without_ownership(samples: &[Sample], since: OffsetDateTime) -> Vec<(usize, String, f64)> {
    let slack = time::Duration::try_from(LEASE + Duration::from_secs(1)).expect("a duration");
    let mut bad = Vec::new();
    let writes: BTreeSet<(usize, OffsetDateTime, String)> = samples
        .iter()
        .flat_map(|s| s.written.iter().enumerate().filter_map(|(i, w)| w.clone().map(|(at, by)| (i, at, by))))
        .collect();
    for (partition, at, by) in writes {
        let last_held = samples
            .iter()
            // A write can come before the first sample that shows its writer's claim.
            .filter(|s| s.at <= at + SAMPLING && s.holders[partition].as_deref() == Some(by.as_str()))
            .map(|s| s.at)
            .max();
        let gap = at - last_held.unwrap_or(since);
        if gap > slack {
            bad.push((partition, by, gap.as_seconds_f64()));
        }
    }
    bad
}

#[tokio::test]
async fn three_runners_share_eight_partitions_through_a_kill_an_add_and_a_sigterm_and_deliver_every_change() {
    // GIVEN orders mirrored into orders_copy by a function with 8 partitions, a writer inserting throughout,
    // and the ownership and state documents sampled
    let orders = Orders::new("balance").await;
    orders.db.batch_execute(COPY_TABLE).await.expect("create orders_copy");
    let app_name = unique_app_name("balance");
    let app = partitioned_app(&orders, &app_name);
    let began = OffsetDateTime::now_utc();
    let writer = Writer::start(&orders.url).await;
    let sampler = Sampler::start(&app_name);

    // WHEN three `handler run` processes start THEN they share the partitions fairly (3, 3, 2)
    let mut a = Runner::start(&app, &[]);
    let mut b = Runner::start(&app, &[]);
    let mut c = Runner::start(&app, &[]);
    let mut took = vec![until_fair(&sampler, &[&a, &b, &c], SETTLE, "3 processes started").await];

    // WHEN a is killed with -9 THEN its partitions move to b and c once its leases expire (4 and 4)
    a.kill();
    took.push(until_fair(&sampler, &[&b, &c], LEASE + SETTLE, "a killed").await);

    // WHEN d is added THEN it takes its share from b and c (3, 3, 2)
    let mut d = Runner::start(&app, &[]);
    took.push(until_fair(&sampler, &[&b, &c, &d], SETTLE, "d added").await);

    // WHEN b is stopped with SIGTERM THEN it exits cleanly, releasing its partitions to c and d (4 and 4)
    b.terminate();
    let status = b.exit(Duration::from_secs(20)).await;
    assert!(status.success(), "b after SIGTERM: {status}\n{}", b.stderr());
    assert!(b.stderr().contains("released this process's partitions"), "{}", b.stderr());
    took.push(until_fair(&sampler, &[&c, &d], SETTLE, "b stopped").await);

    // THEN every order the writer committed reaches orders_copy, and nothing else does
    let committed = writer.stop().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let copied: BTreeSet<i64> = orders
            .db
            .query("SELECT id FROM public.orders_copy", &[])
            .await
            .expect("read orders_copy")
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert!(copied.is_subset(&committed), "orders_copy holds ids nobody committed");
        if copied == committed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} committed orders missing from orders_copy after 60 s:\nc:\n{}\nd:\n{}",
            committed.len() - copied.len(),
            committed.len(),
            c.stderr(),
            d.stderr()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("{} orders delivered; fair shares after start, kill, add, SIGTERM: {took:?}", committed.len());

    // AND no process wrote a partition's state more than a lease after another came to own it
    for r in [&mut c, &mut d] {
        r.terminate();
        let status = r.exit(Duration::from_secs(20)).await;
        assert!(status.success(), "after SIGTERM: {status}\n{}", r.stderr());
    }
    let samples = sampler.stop().await;
    // (on a busy machine a sample of 16 documents takes up to a second; 20 cover the changes above)
    assert!(samples.len() >= 20, "too few samples to judge: {}", samples.len());
    eprintln!("{} samples of the ownership and state documents", samples.len());
    assert_eq!(writes_without_ownership(&samples, began), vec![], "state written by a process that did not own it");
    // AND the logs name the claims, steals and losses with their counts
    let logs = [&b, &c, &d].map(|r| r.stderr()).join("\n");
    for line in [
        "claimed a free partition",
        "stole a partition from an owner above its share",
        "lost a partition; stopping it after the tick in hand",
        "fair_share=",
    ] {
        assert!(logs.contains(line), "no {line:?} in the logs:\n{logs}");
    }
}
