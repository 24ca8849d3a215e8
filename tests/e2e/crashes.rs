//! Crashes of the handler process at every point of a tick that matters, over a stream of inserts: the process
//! dies as under `kill -9` and a new one takes over from the state in Azurite. No order may be lost, and each
//! duplicate must be explained by a crash after the host wrote a batch and before the next invocation could
//! acknowledge it: the test predicts the exact number of times every order reaches the queue.
//!
//! A round inserts a few orders, starts a handler process, lets it run to its kill point and kills it (the
//! failpoints abort the process themselves, the other points use `HostDriver::kill`). Leases last 1 s (the
//! shortest allowed), so the next process takes over a dead one's batch after at most that long.
//!
//! Most of a round is that wait, so the twenty rounds run as two independent streams side by side (each its
//! own database, app and state), which halves the time the rounds take (about 12 s to 6.5 s on a 2-core
//! machine) without changing a round: the same seeded schedule, the fixed opening in order in the first
//! stream, every kill point exercised, every order's delivery count predicted.

use crate::common::*;
use crate::support::AppFolder;
use serde_json::{json, Value};
use sql_pseudo_trigger::failpoint;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const KILLS: [Kill; 5] =
    [Kill::AfterFetch, Kill::AfterCommit, Kill::AfterWrittenAnswer, Kill::AfterLostAnswer, Kill::WhileIdle];

/// xorshift64*: a seeded generator, so a failing schedule can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One stream of orders through a succession of handler processes.
struct Stream {
    /// Which stream, for failure messages.
    name: &'static str,
    orders: Orders,
    app: AppFolder,
    next_id: i64,
    /// Everything the host wrote to the queue, across processes.
    written: Vec<Value>,
    /// Writes beyond the first one each order is expected to get: one for every batch the host wrote and whose
    /// process died before its acknowledgement was committed (the next owner re-delivers it whole).
    extra: BTreeMap<i64, usize>,
    /// The rounds so far, for failure messages.
    trace: Vec<String>,
}

impl Stream {
    async fn new(name: &'static str) -> Self {
        let orders = Orders::new(name).await;
        let app = orders_app(&orders, &unique_app_name(name), json!({}), &[("Sql_Trigger_LeaseDurationMs", "1000")]);
        Self { name, orders, app, next_id: 1, written: Vec::new(), extra: BTreeMap::new(), trace: Vec::new() }
    }

    /// Runs `schedule`'s rounds in order, then checks that nothing was lost.
    async fn run(mut self, schedule: &[(Kill, i64)]) {
        for (kill, rows) in schedule {
            self.round(*kill, *rows).await;
        }
        self.assert_nothing_lost().await;
    }

    /// Inserts `rows` new orders, then runs a new handler process until `kill`.
    async fn round(&mut self, kill: Kill, rows: i64) {
        let first = self.next_id;
        self.next_id += rows;
        self.orders.insert(first..self.next_id).await;
        let host = match kill.failpoint(None) {
            Some(point) => self.app.start_handler(&[(failpoint::ENV, &point)]).await,
            None => start(&self.app).await,
        };
        let mut note = format!("{}: {kill:?} after inserting {first}..{}", self.name, self.next_id);
        note.push_str(&kill_at(&host, kill, 20, &mut self.extra).await);
        self.written.extend(host.delivered("changes"));
        self.trace.push(note);
    }

    /// Runs a last, uninterrupted process until every order was written, then checks every order's count.
    async fn assert_nothing_lost(mut self) {
        let host = start(&self.app).await;
        let all = ids(1..=self.next_id - 1);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let mut written = self.written.clone();
            written.extend(host.delivered("changes"));
            if tally(&written).0.is_superset(&all) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "orders missing after 15 s: {:?}\n{:?}",
                &all - &tally(&written).0,
                self.trace
            );
            let run = host.run_timer(FUNCTION).await.expect("timer run");
            assert!(run.succeeded, "{:?}", run.attempts.last().map(|a| &a.outcome));
        }
        drain(&host, 20).await;
        self.written.extend(host.delivered("changes"));
        let expected: BTreeMap<i64, usize> =
            all.iter().map(|id| (*id, 1 + self.extra.get(id).copied().unwrap_or(0))).collect();
        assert_eq!(tally(&self.written).1, expected, "rounds: {:#?}", self.trace);
    }
}

#[tokio::test]
async fn kill_9_at_every_point_of_a_tick_over_twenty_rounds_of_inserts_loses_nothing() {
    // GIVEN a stream of orders and a schedule of kill points: first a fixed one (a batch the host wrote killed
    // twice in a row, then deaths right after fetching and right after committing the batch that follows it,
    // then an answer lost with its instance), then seeded random ones (SQL_PSEUDO_TRIGGER_CRASH_SEED replays
    // another schedule)
    let seed = std::env::var("SQL_PSEUDO_TRIGGER_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5EED_CAFE);
    let mut rng = Rng(seed);
    let fixed = [
        Kill::AfterWrittenAnswer,
        Kill::AfterWrittenAnswer,
        Kill::AfterFetch,
        Kill::AfterCommit,
        Kill::AfterLostAnswer,
    ];
    let mut schedule: Vec<(Kill, i64)> = fixed.iter().map(|k| (*k, 2)).collect();
    schedule.extend((0..15).map(|_| (KILLS[rng.below(5) as usize], 1 + rng.below(4) as i64)));
    let mut kinds: Vec<Kill> = schedule.iter().map(|(k, _)| *k).collect();
    kinds.sort();
    kinds.dedup();
    assert_eq!(kinds, KILLS, "seed {seed} does not exercise every kill point: {schedule:?}");

    // WHEN each round inserts a few orders and runs a new handler process until it is killed, in two streams
    // side by side: the fixed opening and the first three random rounds in one, the other twelve in the other
    // (the opening's rounds nearly all wait out a lease, random ones about half, so the two take about as long)
    let (first, second) = schedule.split_at(fixed.len() + 3);
    let (a, b) = tokio::join!(Stream::new("crashes_a"), Stream::new("crashes_b"));

    // THEN in each stream every order is written, and every duplicate is a batch the host wrote before a crash
    // that came before its acknowledgement was committed, once per such crash
    tokio::join!(a.run(first), b.run(second));
}
