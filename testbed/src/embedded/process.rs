//! Children that cannot outlive the test process, and scratch directories that are cleaned up even when it
//! is killed.

use super::LaunchError;
use std::fs;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};

/// How long a polite stop (fast shutdown, SIGTERM) may take before we escalate to SIGKILL.
pub(super) const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long `Drop` waits after SIGQUIT: a drop must not hang a test run.
pub(super) const DROP_GRACE: Duration = Duration::from_secs(2);
pub(super) const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Every scratch directory starts with this, so that the sweep can find the ones left by dead processes.
pub(super) const SCRATCH_PREFIX: &str = "sql-pseudo-trigger-";

/// The signals the test bed sends to its children.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGINT: PostgreSQL's "fast" shutdown (disconnect clients, checkpoint, exit).
    Interrupt,
    /// SIGTERM: the graceful stop every other server and the Functions host use.
    Terminate,
    /// SIGQUIT: PostgreSQL's "immediate" shutdown, crash-like: recovery runs on the next start.
    Quit,
    /// SIGKILL: no cleanup at all, as when a machine loses power or the OOM killer strikes.
    Kill,
}

impl Signal {
    fn raw(self) -> libc::c_int {
        match self {
            Signal::Interrupt => libc::SIGINT,
            Signal::Terminate => libc::SIGTERM,
            Signal::Quit => libc::SIGQUIT,
            Signal::Kill => libc::SIGKILL,
        }
    }
}

type SpawnJob = Box<dyn FnOnce() + Send>;

/// The queue into the spawner thread. The sender lives in a static, so it is never dropped, so the thread's
/// receive loop never ends: the thread lives exactly as long as the process.
static SPAWNER: OnceLock<mpsc::Sender<SpawnJob>> = OnceLock::new();

/// Spawns `command` so that it cannot outlive this process: the kernel sends it `on_parent_death` when we die.
///
/// Why a dedicated thread: `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not the
/// process, and test harnesses run each test on a thread that exits when the test ends. Spawning from one
/// thread that never exits makes "the parent died" mean "the process died".
///
/// Credentials set with [`CommandExt::uid`]/[`CommandExt::gid`] are applied by std before `pre_exec` closures
/// run (and a credential change clears the death signal), so the signal is armed after the switch and survives.
/// `children_die_with_the_test_process` in tests/testbed.rs checks this against a server run as another user.
pub fn spawn_owned(mut command: Command, on_parent_death: Signal) -> io::Result<Child> {
    let spawner = SPAWNER.get_or_init(|| {
        let (sender, receiver) = mpsc::channel::<SpawnJob>();
        // If the thread cannot be created, the receiver is dropped with the closure and every send below fails
        // with a clear error instead of a panic here.
        let _ = std::thread::Builder::new().name("sql-pseudo-trigger-spawner".into()).spawn(move || {
            for job in receiver {
                // A panic would end this thread, and with it every child it ever spawned.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            }
        });
        sender
    });
    let (reply, answer) = mpsc::channel();
    let job: SpawnJob = Box::new(move || {
        arm_parent_death_signal(&mut command, on_parent_death);
        let _ = reply.send(command.spawn());
    });
    spawner.send(job).map_err(|_| io::Error::other("the process spawner thread could not be started"))?;
    answer.recv().map_err(|_| io::Error::other("the process spawner thread failed while spawning"))?
}

#[allow(unsafe_code)]
fn arm_parent_death_signal(command: &mut Command, signal: Signal) {
    let parent = std::process::id() as libc::pid_t;
    let signal = signal.raw() as libc::c_ulong;
    // SAFETY: the closure runs in the forked child before exec, where only async-signal-safe work is allowed. It
    // makes two plain system calls (prctl, getppid) and builds io::Errors from raw codes, which does not allocate;
    // it touches no lock or heap state inherited from the parent.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, signal, 0 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong)
                != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl; then the signal will never come, so do not exec.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Sends `signal` to `child` unless it has already been reaped (its pid could then belong to someone else).
pub fn send_signal(child: &mut Child, signal: Signal) -> io::Result<()> {
    if child.try_wait()?.is_some() {
        return Ok(());
    }
    let pid = libc::pid_t::try_from(child.id()).map_err(|_| io::Error::other("child pid out of range"))?;
    kill(pid, signal.raw())
}

#[allow(unsafe_code)]
fn kill(pid: libc::pid_t, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: kill(2) has no memory-safety preconditions. Callers pass the pid of their own unreaped child, which
    // the kernel cannot have given to another process.
    if unsafe { libc::kill(pid, signal) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Polls `child` until it exits or `timeout` passes. `None` means it is still running.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Sends `first`, waits up to `grace`, then SIGKILLs; always reaps the child.
pub fn shut_down(child: &mut Child, first: Signal, grace: Duration) -> io::Result<ExitStatus> {
    send_signal(child, first)?;
    if let Some(status) = wait_timeout(child, grace)? {
        return Ok(status);
    }
    send_signal(child, Signal::Kill)?;
    child.wait()
}

// ---------------------------------------------------------------------------------------------------------------
// Scratch directories and ports
// ---------------------------------------------------------------------------------------------------------------

/// A fresh directory under the temp dir, named `sql-pseudo-trigger-<kind>-<pid>-<random>`, removed on drop.
///
/// Directories whose pid is no longer alive are removed by the next `ScratchDir::new` of the same kind: a
/// fixture held in a static is never dropped, and a killed process drops nothing.
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// `kind` names what the directory is for (`pg`, `azurite`, `app`, ...); use letters only.
    pub fn new(kind: &str) -> io::Result<Self> {
        sweep_stale(kind);
        let path =
            std::env::temp_dir().join(format!("{SCRATCH_PREFIX}{kind}-{}-{}", std::process::id(), random_suffix()));
        fs::create_dir(&path)?;
        Ok(Self { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

fn random_suffix() -> String {
    let mut text = uuid::Uuid::new_v4().simple().to_string();
    text.truncate(10);
    text
}

fn sweep_stale(kind: &str) {
    let prefix = format!("{SCRATCH_PREFIX}{kind}-");
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !pid_alive(pid) {
            // Best effort: another user's leftovers may not be ours to remove.
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

fn pid_alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// A TCP port on 127.0.0.1 that was free a moment ago. The listener is dropped so the server can bind it;
/// another process could take it in between, which the readiness checks then report.
pub fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port())
}

/// The last `lines` lines of a log file, for error messages.
pub fn log_tail(path: &Path, lines: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(err) => format!("(cannot read {}: {err})", path.display()),
    }
}

pub(super) fn io_error(action: impl Into<String>) -> impl FnOnce(io::Error) -> LaunchError {
    let action = action.into();
    move |source| LaunchError::Io { action, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_dirs_are_removed_on_drop_and_stale_ones_are_swept() {
        let dir = ScratchDir::new("unittest").expect("temp dir is writable");
        let path = dir.path().to_path_buf();
        assert!(path.is_dir());
        drop(dir);
        assert!(!path.exists());

        // GIVEN a directory left by a pid that cannot be alive (above the kernel's pid_max)
        let stale = std::env::temp_dir().join(format!("{SCRATCH_PREFIX}unittest-4999999-deadbeef"));
        fs::create_dir_all(&stale).expect("temp dir is writable");
        // WHEN a new scratch dir of the same kind is made THEN the stale one is gone
        let _fresh = ScratchDir::new("unittest").expect("temp dir is writable");
        assert!(!stale.exists());
    }

    #[test]
    fn free_ports_are_bindable() {
        let port = free_port().expect("loopback works");
        assert!(TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok());
    }
}
