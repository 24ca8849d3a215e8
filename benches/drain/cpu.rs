//! Where a drain's time goes: the CPU time each process involved spent during it, read from /proc.
//!
//! A drain is a strictly sequential pipeline (driver → handler → Azurite → PostgreSQL → Azurite → handler →
//! driver), so on a small machine its wall time is close to the sum of these CPU times plus the wake-ups
//! between them; the split says which process to make cheaper. Linux only; elsewhere every figure is zero.

use std::collections::BTreeMap;
use std::fs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A process's part in a measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// This bench process: the host driver for ours, the query loop for raw.
    Bench,
    Handler,
    Azurite,
    /// The postmaster and every backend under it.
    Postgres,
    /// The peer's Python process (reported by the script itself: its tick only, not its imports).
    Peer,
}

impl Role {
    pub fn label(self) -> &'static str {
        match self {
            Role::Bench => "bench process (driver / query loop)",
            Role::Handler => "handler",
            Role::Azurite => "Azurite",
            Role::Postgres => "PostgreSQL",
            Role::Peer => "peer (Python)",
        }
    }
}

/// The processes to watch.
#[derive(Debug, Clone, Copy, Default)]
pub struct Watch {
    pub handler: Option<u32>,
    pub azurite: Option<u32>,
    pub postmaster: Option<u32>,
}

/// CPU ticks per process at one moment, with each process's role.
#[derive(Debug, Clone, Default)]
pub struct Sample(BTreeMap<u32, (Role, u64)>);

impl Watch {
    pub fn sample(&self) -> Sample {
        let mut sample = BTreeMap::new();
        let mut add = |pid: u32, role: Role| {
            if let Some((_, ticks)) = stat(pid) {
                sample.insert(pid, (role, ticks));
            }
        };
        add(std::process::id(), Role::Bench);
        if let Some(pid) = self.handler {
            add(pid, Role::Handler);
        }
        if let Some(pid) = self.azurite {
            add(pid, Role::Azurite);
        }
        if let Some(postmaster) = self.postmaster {
            add(postmaster, Role::Postgres);
            for pid in all_pids() {
                if stat(pid).is_some_and(|(ppid, _)| ppid == postmaster) {
                    add(pid, Role::Postgres);
                }
            }
        }
        Sample(sample)
    }
}

/// Samples every [`SAMPLE_EVERY`] on a thread until dropped, keeping each process's last reading, so that a
/// process that ends in the middle (the peer's PostgreSQL backends end with it) still counts up to then.
#[derive(Debug)]
pub struct Recorder {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Sample>>,
    watch: Watch,
}

/// How often a [`Recorder`] samples: what a process that ends may lose at most.
const SAMPLE_EVERY: Duration = Duration::from_millis(200);

impl Recorder {
    pub fn start(watch: Watch) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seen = Sample::default();
            while !flag.load(Ordering::Acquire) {
                seen.merge(watch.sample());
                std::thread::sleep(SAMPLE_EVERY);
            }
            seen
        });
        Self { stop, thread: Some(thread), watch }
    }

    /// CPU seconds per role since `before`, up to now.
    pub fn finish(mut self, before: &Sample) -> BTreeMap<Role, f64> {
        self.stop.store(true, Ordering::Release);
        let mut seen = self.thread.take().and_then(|t| t.join().ok()).unwrap_or_default();
        seen.merge(self.watch.sample());
        between(before, &seen)
    }
}

impl Sample {
    /// Keeps the latest reading of every process either sample saw.
    fn merge(&mut self, newer: Sample) {
        self.0.extend(newer.0);
    }
}

/// Measures the CPU per role spent while `work` runs.
pub async fn measure<T>(watch: Watch, work: impl std::future::Future<Output = T>) -> (T, BTreeMap<Role, f64>) {
    let before = watch.sample();
    let recorder = Recorder::start(watch);
    let result = work.await;
    (result, recorder.finish(&before))
}

/// CPU seconds per role between two samples. A process that started in between counts from zero.
pub fn between(before: &Sample, after: &Sample) -> BTreeMap<Role, f64> {
    let per_second = clock_ticks_per_second();
    let mut seconds = BTreeMap::new();
    for (pid, (role, ticks)) in &after.0 {
        let earlier = before.0.get(pid).map_or(0, |(_, t)| *t);
        *seconds.entry(*role).or_insert(0.0) += ticks.saturating_sub(earlier) as f64 / per_second;
    }
    seconds
}

/// `(ppid, utime + stime)` of a process, from /proc/<pid>/stat.
fn stat(pid: u32) -> Option<(u32, u64)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: fields are counted after its closing one.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(0) ppid(1) ... utime(11) stime(12).
    let ppid = fields.get(1)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((ppid, utime + stime))
}

fn all_pids() -> Vec<u32> {
    fs::read_dir("/proc")
        .map(|entries| entries.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default()
}

/// /proc reports CPU time in USER_HZ ticks, which Linux fixes at 100 per second for user space on every
/// architecture (the kernel converts from its own HZ), so no sysconf call is needed.
fn clock_ticks_per_second() -> f64 {
    100.0
}
