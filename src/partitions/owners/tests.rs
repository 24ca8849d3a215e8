//! The balancer's processes on a simulated clock, cycling over one memory store (in turn, and at once with every
//! store call interleaved), through start, kill, add and leave.

use super::*;
use crate::clock::ManualClock;
use crate::partitions::ownership::owners;
use crate::state::{MemoryStore, Versioned};
use std::collections::BTreeSet;

const N: u32 = 8;
const LEASE: Duration = Duration::from_secs(30);
/// The balancer's cycle: a third of the lease, as the runner sets it.
const CYCLE: Duration = Duration::from_secs(10);

fn t0() -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_800_000_000).expect("a time")
}

fn secs(s: i64) -> time::Duration {
    time::Duration::seconds(s)
}

// -- Processes over one store ------------------------------------------------------------------------------------

/// A memory store that yields to the scheduler before every call, so processes cycling at once interleave
/// their reads and conditional writes as processes on a real store do.
#[derive(Debug, Default)]
struct Racing(MemoryStore);

#[async_trait::async_trait]
impl StateStore for Racing {
    async fn load(&self, key: &str) -> Result<Option<Versioned>, StoreError> {
        tokio::task::yield_now().await;
        self.0.load(key).await
    }
    async fn save_if(&self, key: &str, bytes: &[u8], expected: Option<&Etag>) -> Result<Etag, StoreError> {
        tokio::task::yield_now().await;
        self.0.save_if(key, bytes, expected).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        self.0.list(prefix).await
    }
    fn operations(&self) -> u64 {
        self.0.operations()
    }
    fn describe(&self) -> String {
        "racing memory".into()
    }
}

/// Processes balancing partitions `0..N` of one group, one cycle each per step of the simulated clock.
struct Sim {
    store: Arc<Racing>,
    clock: ManualClock,
    procs: BTreeMap<String, Owners>,
    /// Every process cycles at once (interleaved store calls) rather than in turn.
    at_once: bool,
    /// What each process believed it owned after the last step.
    views: BTreeMap<String, BTreeSet<u32>>,
    /// Partitions two processes believed they owned after the last step.
    overlap: BTreeSet<u32>,
    cycles: usize,
}

impl Sim {
    fn new(at_once: bool) -> Self {
        Self {
            store: Arc::default(),
            clock: ManualClock::new(t0()),
            procs: BTreeMap::new(),
            at_once,
            views: BTreeMap::new(),
            overlap: BTreeSet::new(),
            cycles: 0,
        }
    }

    fn group() -> Group {
        Group {
            app: "app".into(),
            name: "orders".into(),
            count: NonZeroU32::new(N).expect("N"),
            served: (0..N).collect(),
        }
    }

    fn start(&mut self, name: &str) {
        let clock: Arc<dyn Clock> = Arc::new(self.clock.clone());
        let owners = Owners::new(self.store.clone(), Self::group(), name, LEASE, clock);
        self.procs.insert(name.into(), owners);
    }

    /// kill -9: the process stops cycling; its leases run out.
    fn kill(&mut self, name: &str) {
        self.procs.remove(name);
        self.views.remove(name);
    }

    /// SIGTERM: the process releases what it holds and stops.
    async fn leave(&mut self, name: &str) {
        let mut owners = self.procs.remove(name).expect("a running process");
        owners.release().await.expect("release");
        self.views.remove(name);
    }

    /// One step of the clock and one cycle of every process; checks that no partition stays with two
    /// processes for more than one cycle.
    async fn step(&mut self) {
        self.clock.advance(CYCLE);
        self.cycles += 1;
        let results: Vec<(String, Cycle)> = if self.at_once {
            // Real processes' cycles drift apart; in perfect lockstep a thief's read-to-write window always
            // holds its victim's renewal, which then wins every race (see `lockstep_...` below). Each process
            // here starts its cycle a few store calls after the one before, so the cycles overlap but differ
            // in phase.
            let cycles = self.procs.iter_mut().enumerate().map(|(i, (name, o))| async move {
                for _ in 0..i * 5 {
                    tokio::task::yield_now().await;
                }
                (name.clone(), o.cycle().await)
            });
            futures::future::join_all(cycles).await.into_iter().map(|(n, c)| (n, c.expect("a cycle"))).collect()
        } else {
            let mut all = Vec::new();
            for (name, o) in self.procs.iter_mut() {
                all.push((name.clone(), o.cycle().await.expect("a cycle")));
            }
            all
        };
        self.views = results.into_iter().map(|(n, c)| (n, c.owned.into_iter().collect())).collect();
        let mut seen = BTreeSet::new();
        let mut overlap = BTreeSet::new();
        for owned in self.views.values() {
            for p in owned {
                if !seen.insert(*p) {
                    overlap.insert(*p);
                }
            }
        }
        let lasting: Vec<&u32> = overlap.intersection(&self.overlap).collect();
        assert!(lasting.is_empty(), "partitions {lasting:?} owned by two processes for two cycles: {:?}", self.views);
        self.overlap = overlap;
    }

    /// What the ownership documents say each live owner holds now.
    async fn held(&self) -> BTreeMap<String, usize> {
        let now = self.clock.now();
        let all = owners(self.store.as_ref(), "app", "orders", Self::group().count).await.expect("owners");
        let mut held = BTreeMap::new();
        for p in &all {
            if let Some(owner) = p.holder(now) {
                *held.entry(owner.to_string()).or_insert(0) += 1;
            }
        }
        held
    }

    /// Every partition held by a running process, and each within its fair share (`N / k`, or one more for
    /// `N % k` of them), by the documents and by each process's own view.
    async fn fair(&self) -> bool {
        let held = self.held().await;
        let k = self.procs.len();
        let (fair, more) = (N as usize / k, N as usize % k);
        let fits = |n: usize| n == fair || (more > 0 && n == fair + 1);
        let views_agree =
            self.procs.keys().all(|p| self.views.get(p).map_or(0, BTreeSet::len) == held.get(p).copied().unwrap_or(0));
        held.keys().all(|o| self.procs.contains_key(o))
            && held.values().sum::<usize>() == N as usize
            && self.procs.keys().all(|p| fits(held.get(p).copied().unwrap_or(0)))
            && views_agree
    }

    /// Steps until the shares are fair, at most `limit` cycles; how many it took.
    async fn until_fair(&mut self, limit: usize, what: &str) -> usize {
        for n in 1..=limit {
            self.step().await;
            if self.fair().await {
                return n;
            }
        }
        panic!("{what}: not fair within {limit} cycles: {:?} (views {:?})", self.held().await, self.views);
    }

    /// Steps `n` more cycles, the shares staying fair and nothing moving.
    async fn stays_fair(&mut self, n: usize) {
        let before = self.held().await;
        for _ in 0..n {
            self.step().await;
            assert!(self.fair().await, "unbalanced again: {:?}", self.held().await);
        }
        assert_eq!(self.held().await, before, "partitions moved while the shares were fair");
    }
}

/// Start, kill, add and leave, with the cycles each took to be fair again; the bounds are the ones
/// docs/operations.md states ("Scaling out under handler run").
async fn lifecycle(at_once: bool) -> Vec<usize> {
    let mut sim = Sim::new(at_once);
    let mut took = Vec::new();
    // GIVEN one process: it claims one partition per cycle, all 8 in N cycles
    sim.start("a");
    took.push(sim.until_fair(N as usize, "a lone process").await);
    sim.stays_fair(3).await;
    // WHEN two more start THEN within N cycles each holds 2 or 3 (one claim per process per cycle)
    sim.start("b");
    sim.start("c");
    took.push(sim.until_fair(N as usize, "1 -> 3 processes").await);
    sim.stays_fair(3).await;
    // WHEN b is killed THEN its partitions move once its leases expire (3 cycles), within N cycles after that
    sim.kill("b");
    took.push(sim.until_fair(3 + N as usize, "after a kill").await);
    sim.stays_fair(3).await;
    // WHEN d is added THEN it takes its share from the others within N cycles
    sim.start("d");
    took.push(sim.until_fair(N as usize, "after an add").await);
    sim.stays_fair(3).await;
    // WHEN a leaves cleanly THEN its released partitions are claimed at once, not after a lease
    sim.leave("a").await;
    took.push(sim.until_fair(N as usize, "after a leave").await);
    sim.stays_fair(3).await;
    took
}

#[tokio::test]
async fn processes_cycling_in_turn_converge_to_fair_shares_through_start_kill_add_and_leave() {
    let took = lifecycle(false).await;
    eprintln!("cycles to fair shares, in turn (start, 1->3, kill, add, leave): {took:?}");
    // 8 claims for a lone process; a kill waits 3 cycles for the leases, then claims; a leave none of that
    assert_eq!(took[0], 8);
    assert!(took[2] >= 3, "a killed process's partitions moved before its leases expired: {took:?}");
    assert!(took[4] < 3, "a released partition waited for its lease: {took:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn processes_cycling_at_once_converge_too_and_a_race_for_one_document_has_one_winner() {
    let took = lifecycle(true).await;
    eprintln!("cycles to fair shares, at once (start, 1->3, kill, add, leave): {took:?}");
    assert!(took[2] >= 3 && took[4] < 3, "{took:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn two_processes_claiming_one_free_partition_at_once_leave_exactly_one_owner() {
    // GIVEN one partition and two processes that both see it free
    let store: Arc<Racing> = Arc::default();
    let clock = ManualClock::new(t0());
    let group = Group { app: "app".into(), name: "one".into(), count: NonZeroU32::MIN, served: vec![0] };
    let make = |me: &str| Owners::new(store.clone(), group.clone(), me, LEASE, Arc::new(clock.clone()));
    let (mut a, mut b) = (make("a"), make("b"));
    // WHEN both cycle at once
    let (ca, cb) = futures::future::join(a.cycle(), b.cycle()).await;
    let (ca, cb) = (ca.expect("a cycle"), cb.expect("a cycle"));
    // THEN both tried, exactly one landed, and the document names that one
    assert!(ca.catching_up && cb.catching_up);
    assert_eq!(ca.owned.len() + cb.owned.len(), 1, "{ca:?} {cb:?}");
    let winner = if ca.owned.is_empty() { "b" } else { "a" };
    let docs = owners(store.as_ref(), "app", "one", NonZeroU32::MIN).await.expect("owners");
    assert_eq!(docs[0].holder(clock.now()), Some(winner));
    assert_eq!(docs[0].claims, 1);
}

#[tokio::test]
async fn a_stolen_partition_is_reported_lost_at_the_victims_next_cycle_and_a_release_frees_at_once() {
    // GIVEN a holds all 8
    let mut sim = Sim::new(false);
    sim.start("a");
    sim.until_fair(N as usize, "a alone").await;
    // WHEN b starts and steals one
    sim.start("b");
    sim.clock.advance(CYCLE);
    let stolen = sim.procs.get_mut("b").expect("b").cycle().await.expect("b's cycle");
    let claim = stolen.claimed.clone().expect("b claimed");
    assert_eq!(claim.from.as_deref(), Some("a"));
    // THEN a's next cycle reports it lost to b, and a no longer owns it
    let a = sim.procs.get_mut("a").expect("a").cycle().await.expect("a's cycle");
    assert_eq!(a.lost, vec![(claim.partition, Some("b".to_string()))]);
    assert!(!a.owned.contains(&claim.partition));
    // WHEN b leaves THEN its partition is free now, and the document says so, with the claims counted
    sim.leave("b").await;
    let docs = owners(sim.store.as_ref(), "app", "orders", NonZeroU32::new(N).expect("N")).await.expect("owners");
    let doc = &docs[claim.partition as usize];
    assert_eq!((doc.owner.as_deref(), doc.holder(sim.clock.now())), (None, None));
    assert_eq!(doc.claims, 2, "claimed by a, then stolen by b");
}

#[tokio::test]
async fn a_process_that_cannot_reach_the_store_keeps_what_it_holds_only_until_its_leases_end() {
    let mut sim = Sim::new(false);
    sim.start("a");
    sim.until_fair(N as usize, "a alone").await;
    let a = sim.procs.get("a").expect("a");
    let now = sim.clock.now();
    assert_eq!(a.held_until(now).len(), N as usize);
    // Every cycle renewed them all: they end together, one lease after the last cycle
    assert_eq!(a.held_until(now + secs(29)).len(), N as usize);
    assert!(a.held_until(now + secs(30)).is_empty());
}

#[test]
fn an_ownership_document_key_sits_under_its_group_apart_from_the_state_documents() {
    let key = owner_key("app", "orders", 3, NonZeroU32::new(8).expect("8"));
    assert_eq!(key, "app/orders/owners/partition-3-of-8.json");
}

#[tokio::test(flavor = "current_thread")]
async fn lockstep_a_steal_loses_every_race_to_its_victims_renewal_and_a_drifted_phase_lands_it() {
    // GIVEN a holds all 8 and b is new
    let mut sim = Sim::new(false);
    sim.start("a");
    sim.until_fair(N as usize, "a alone").await;
    sim.start("b");
    let held = |sim: &Sim| sim.views.get("b").map_or(0, BTreeSet::len);
    // WHEN both cycle in perfect lockstep (the same store calls in the same order) THEN a's renewal, written
    // between b's read and b's claim, wins every time: the one way a steal can starve
    for _ in 0..3 {
        sim.clock.advance(CYCLE);
        let (a, b) = {
            let mut procs = sim.procs.iter_mut();
            let (_, a) = procs.next().expect("a");
            let (_, b) = procs.next().expect("b");
            futures::future::join(a.cycle(), b.cycle()).await
        };
        let b = b.expect("b's cycle");
        assert!(b.catching_up && b.claimed.is_none(), "{b:?}");
        sim.views.insert("b".into(), b.owned.into_iter().collect());
        assert_eq!(a.expect("a's cycle").owned.len(), N as usize);
    }
    assert_eq!(held(&sim), 0);
    // WHEN their cycles drift apart by a few store calls THEN b's steals land
    let mut at_once = Sim { at_once: true, ..sim };
    at_once.until_fair(N as usize, "drifted").await;
}
