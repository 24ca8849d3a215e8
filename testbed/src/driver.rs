//! A host driver: plays the Azure Functions host for one app folder, so tests can run the real `handler` binary
//! end to end without Core Tools (which cannot be installed here).
//!
//! What it reproduces, because the trigger's delivery guarantee depends on it (see
//! shared/reference/functions-custom-handler.md):
//! - start-up: the handler is spawned with `FUNCTIONS_CUSTOMHANDLER_PORT`, `FUNCTIONS_APP_ROOT_PATH`,
//!   `FUNCTIONS_CUSTOMHANDLER_WORKER_ID` and every app setting (`local.settings.json` `Values`) as environment
//!   variables, in the app folder, and is ready when `GET /` gets any HTTP answer;
//! - one timer firing ([`HostDriver::run_timer`]): `POST /{function}` with the host's exact timer body, then the
//!   output bindings are written *after* the handler has answered. A non-2xx or non-JSON answer fails the
//!   invocation and writes nothing; a failed binding write (injected with [`HostDriver::fail_output_writes`],
//!   possibly after a prefix of the messages, [`HostDriver::fail_output_writes_after`]) fails it too, and the
//!   handler is never told. Every binding of an attempt is written (the host awaits them together with
//!   `Task.WhenAll`), each message by message, so a failure can be partial.
//! - retries as azure-webjobs-sdk `FunctionExecutorExtensions.TryExecuteAsync` runs them: with a `retry` policy,
//!   `Metadata.RetryContext` on *every* attempt (`RetryCount` 0 on the first), each retry carrying the previous
//!   attempt's exception with its `InstanceId` (that attempt's invocation id), after the policy's delay
//!   (fixedDelay, or the randomized exponential backoff of `RandomizedExponentialBackoffStrategy`), for real.
//!   A firing returns only when its retry loop ends: a test that fires again in sequence gets the timer
//!   listener's pacing, which holds its invocation lock across the whole loop.
//! - manual runs ([`HostDriver::run_manual`]: portal Test/Run, `POST /admin/functions/{name}`): the same retry
//!   loop through `JobHost.CallAsync`, but outside the timer's lock, so a test runs them concurrently with a
//!   firing, at any moment, including during its retry delays.
//! - the timer's pacing ([`HostDriver::run_schedule`], `driver::schedule`): firings on the NCRONTAB schedule as
//!   the timer listener makes them, on a simulated clock (hours of cadence in the time the invocations take) or
//!   on real seconds ([`HostDriver::run_schedule_real`]), never overlapping, a late firing followed at once, and
//!   `ScheduleStatus` null where the host keeps no schedule monitor (sub-minute schedules, `useMonitor: false`).
//!
//! - what each output binding receives ([`receive`]): the host reads the answer with Newtonsoft at default
//!   settings ([`newtonsoft`]: non-integer numbers become doubles, ISO date strings `DateTime`s in the host's
//!   zone, duplicate keys collapse; an answer Newtonsoft cannot read fails the invocation), base64-decodes a
//!   top-level string, and each binding type converts the value its own way: a queue, Service Bus or Event Hubs
//!   message is an element's `ToString()` (indented JSON), a sql binding upserts only the objects and drops the
//!   rest silently, a blob is the whole value as one compact document at a path resolved per write.
//!   [`HostDriver::received`] gives the bodies as the destination got them, [`HostDriver::delivered`] the same
//!   parsed as JSON by a consumer. The host model is a Linux host in UTC ([`HostModel::default`]).
//!
//! Simplifications, on purpose: tests may also fire timers explicitly ([`HostDriver::run_timer`]); output
//! bindings are in-memory sinks, one per binding name, for the five types above only (another type fails its
//! write, naming itself); what SQL Server's `OPENJSON` makes of a row's JSON is not modelled, nor size limits
//! (inject them with [`HostDriver::refuse_messages`]). Real sinks (queues, SQL) are the engine tests' business.

mod app;
pub mod dotnet;
pub mod newtonsoft;
pub mod receive;
mod schedule;
mod wire;

pub use app::{App, Binding, Direction, FunctionSpec, RetryPolicy, RetryStrategy};
pub use receive::{HostModel, Received};
pub use schedule::{Firing, Paced};

/// Whether a firing's retry delays are slept (a real host) or only counted (a simulated clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Time {
    Real,
    Simulated,
}

use crate::embedded::{self, ScratchDir, Signal};
use serde_json::Value;
use sql_pseudo_trigger::protocol::RetryContext;
use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use time::OffsetDateTime;

/// The host's start-up limit in code (the docs say 60 s): a handler must answer `GET /` within it.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`HostDriver::terminate`] waits after SIGTERM before it kills.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// host.json's default `functionTimeout` on the Consumption plan, used when host.json has none.
pub const DEFAULT_FUNCTION_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// `maxRetryCount: -1` means "forever" to the host; a test must end, so the driver stops after this many retries.
pub const UNLIMITED_RETRY_CAP: u32 = 100;
const READY_POLL_INTERVAL: Duration = Duration::from_millis(20);

/// How to run one app. Build with [`DriverOptions::new`] and adjust fields.
#[derive(Debug, Clone)]
pub struct DriverOptions {
    /// The folder with host.json and one folder per function.
    pub app_root: PathBuf,
    /// The custom handler to spawn. host.json's `defaultExecutablePath` is ignored: tests name the binary they
    /// built. host.json's `arguments` are passed, with `%Setting%` expanded, as the host does.
    pub handler_exe: PathBuf,
    /// Extra environment variables; they win over `local.settings.json` values of the same name.
    pub env: Vec<(String, String)>,
    /// Let the handler write straight to this process's stdout/stderr instead of a log file.
    pub inherit_stdout: bool,
    pub ready_timeout: Duration,
    /// Pause before each retry instead of the policy's delay; `None` (the default) waits as the host does.
    pub retry_delay: Option<Duration>,
    /// HTTP timeout of one invocation; `None` means host.json's `functionTimeout` plus one minute, as the host.
    pub invoke_timeout: Option<Duration>,
    pub shutdown_timeout: Duration,
}

impl DriverOptions {
    pub fn new(app_root: impl Into<PathBuf>, handler_exe: impl Into<PathBuf>) -> Self {
        Self {
            app_root: app_root.into(),
            handler_exe: handler_exe.into(),
            env: Vec::new(),
            inherit_stdout: false,
            ready_timeout: DEFAULT_READY_TIMEOUT,
            retry_delay: None,
            invoke_timeout: None,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
        }
    }
}

/// What went wrong while playing the host; every message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error(
        "cannot read {}: {source}; an app folder needs host.json and one folder per function holding a \
         function.json", path.display()
    )]
    ReadApp { path: PathBuf, source: io::Error },
    #[error("{} is not valid: {reason}", path.display())]
    BadAppFile { path: PathBuf, reason: String },
    #[error("no function named {name:?} in {}; functions found: {known}", app_root.display())]
    UnknownFunction { name: String, app_root: PathBuf, known: String },
    #[error(
        "cannot start the handler {}: {source}; build it with `cargo build --bin handler` or point handler_exe \
         at an executable file", exe.display()
    )]
    Spawn { exe: PathBuf, source: io::Error },
    #[error("the handler exited before it answered GET / ({status}); its output:\n{output}")]
    ExitedBeforeReady { status: ExitStatus, output: String },
    #[error(
        "the handler did not answer GET / on 127.0.0.1:{port} within {waited:?} (last error: {last_error}); the \
         host gives up after 30 s, so listen first and connect to databases lazily. Its output:\n{output}"
    )]
    NotReady { port: u16, waited: Duration, last_error: String, output: String },
    #[error("POST /{function} got no HTTP answer: {source}; the handler must answer within the function timeout. Its output:\n{output}")]
    Request { function: String, source: reqwest::Error, output: String, invocation_id: String },
    #[error("the handler is not running (it was killed or terminated): call restart() first")]
    NotRunning,
    #[error(
        "the handler did not exit within {waited:?} of SIGTERM and was killed: finish or abandon the in-flight \
         tick faster than the shutdown timeout"
    )]
    ShutdownTimeout { waited: Duration },
    #[error("{action}: {source}")]
    Io { action: String, source: io::Error },
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

// ---------------------------------------------------------------------------------------------------------------
// Results
// ---------------------------------------------------------------------------------------------------------------

/// One `POST /{function}` and its answer, as the host saw it.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// The `X-Azure-Functions-InvocationId` sent; new for every attempt, as in the host.
    pub invocation_id: String,
    /// The body sent.
    pub request: Value,
    pub status: u16,
    /// `Outputs`, by binding name; empty unless the answer was a 2xx JSON object.
    pub outputs: BTreeMap<String, Value>,
    /// `Logs`; lost (empty) when the invocation failed, as in the host.
    pub logs: Vec<String>,
    pub return_value: Option<Value>,
    /// The raw response body.
    pub body: String,
    /// Why a 2xx answer was still a failure for the host (not JSON, wrong shape).
    pub decode_error: Option<String>,
    /// When the request was sent, and how long the answer took.
    pub sent_at: Instant,
    pub elapsed: Duration,
}

impl Invocation {
    /// True when the host would go on to write the output bindings.
    pub fn succeeded(&self) -> bool {
        (200..300).contains(&self.status) && self.decode_error.is_none()
    }

    fn failure_reason(&self) -> String {
        match &self.decode_error {
            Some(reason) if (200..300).contains(&self.status) => reason.clone(),
            _ => format!("the handler answered {}: {}", self.status, truncate(&self.body, 500)),
        }
    }
}

/// How one attempt of a timer firing ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// Every output binding was written.
    Applied,
    /// Non-2xx, non-JSON, or no HTTP answer at all: nothing was written.
    HandlerFailed { reason: String },
    /// The handler answered, but writing this binding failed: nothing was written, and the handler is not told.
    OutputWriteFailed { binding: String, reason: String },
}

/// One attempt: the first invocation or one retry.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// The `RetryContext` sent: on every attempt under a retry policy (`RetryCount` 0 on the first); `None`
    /// without a policy.
    pub retry: Option<RetryContext>,
    /// `None` when the handler gave no HTTP answer (connection refused, reset, timeout).
    pub invocation: Option<Invocation>,
    pub outcome: AttemptOutcome,
}

/// Everything the host did for one timer firing.
#[derive(Debug, Clone)]
pub struct TimerRun {
    pub attempts: Vec<Attempt>,
    /// True when an attempt ended in [`AttemptOutcome::Applied`].
    pub succeeded: bool,
    /// What that attempt wrote, by binding name: one value per message, row or blob, as a consumer parses what
    /// the binding received (see [`HostDriver::received`] for the bodies themselves).
    pub applied: BTreeMap<String, Vec<Value>>,
    /// The retry delays of the loop: slept for real, or only counted when the firing runs on simulated time.
    pub waited: Duration,
}

impl TimerRun {
    pub fn attempt_count(&self) -> usize {
        self.attempts.len()
    }

    /// The last HTTP answer, if any attempt got one.
    pub fn last_invocation(&self) -> Option<&Invocation> {
        self.attempts.iter().rev().find_map(|a| a.invocation.as_ref())
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The driver
// ---------------------------------------------------------------------------------------------------------------

/// Plays the Functions host for one app folder and owns the spawned handler process (killed on drop).
///
/// Methods take `&self` so that a test can share the driver (`Arc<HostDriver>`) and, say, send SIGTERM while an
/// invocation is in flight.
#[derive(Debug)]
pub struct HostDriver {
    options: DriverOptions,
    app: App,
    client: reqwest::Client,
    worker_id: String,
    process: Mutex<Process>,
    sinks: Mutex<Sinks>,
    // Last: holds the handler's log, removed after the process is gone.
    scratch: ScratchDir,
}

#[derive(Debug, Default)]
struct Process {
    child: Option<Child>,
    port: u16,
    ready_after: Duration,
    last_exit: Option<ExitStatus>,
}

/// A message the destination refuses every time (a queue's 64 KB limit, a SQL constraint).
type Poison = Box<dyn Fn(&Value) -> bool + Send + Sync>;

#[derive(Default)]
struct Sinks {
    /// What each binding's destination received, in order.
    delivered: BTreeMap<String, Vec<Received>>,
    /// Injected write failures by binding: each writes this many messages, then fails.
    failures_left: BTreeMap<String, std::collections::VecDeque<usize>>,
    /// Messages each binding's destination refuses, whenever they come.
    poison: BTreeMap<String, Poison>,
    /// When each function last fired: the next body's `ScheduleStatus.Last`.
    last_fired: BTreeMap<String, OffsetDateTime>,
}

impl std::fmt::Debug for Sinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sinks")
            .field("delivered", &self.delivered)
            .field("failures_left", &self.failures_left)
            .field("poison", &self.poison.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl HostDriver {
    /// Reads the app folder, spawns the handler as the host does, and waits until `GET /` gets an answer.
    pub async fn start(options: DriverOptions) -> Result<Self, DriverError> {
        let app = App::load(&options.app_root)?;
        let scratch = ScratchDir::new("driver").map_err(|source| DriverError::Io {
            action: "cannot create a scratch directory for the handler's log".into(),
            source,
        })?;
        let driver = Self {
            client: http_client()?,
            worker_id: uuid::Uuid::new_v4().to_string(),
            options,
            app,
            process: Mutex::new(Process::default()),
            sinks: Mutex::new(Sinks::default()),
            scratch,
        };
        driver.spawn_and_wait().await?;
        Ok(driver)
    }

    pub fn app(&self) -> &App {
        &self.app
    }

    pub fn port(&self) -> u16 {
        self.process().port
    }

    /// `http://127.0.0.1:PORT`
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port())
    }

    /// How long the last (re)start took from spawn to the first HTTP answer.
    pub fn ready_after(&self) -> Duration {
        self.process().ready_after
    }

    /// The handler's stdout and stderr so far (empty with `inherit_stdout`).
    pub fn output(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.scratch.path().join("handler.log")
    }

    fn output_tail(&self) -> String {
        if self.options.inherit_stdout {
            return "(written to this process's stdout)".into();
        }
        embedded::log_tail(&self.log_path(), 40)
    }

    /// The handler's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process().child.as_ref().map(Child::id)
    }

    /// True while the handler process is alive.
    pub fn is_running(&self) -> bool {
        matches!(self.process().child.as_mut().map(Child::try_wait), Some(Ok(None)))
    }

    fn process(&self) -> MutexGuard<'_, Process> {
        // A panic while holding the lock leaves plain data behind; keep going rather than cascade panics.
        self.process.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn sinks(&self) -> MutexGuard<'_, Sinks> {
        self.sinks.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts the handler on a free port and waits until it answers. A port is free when picked and bound by the
    /// handler a moment later: another process (a server another test starts) can take it in between, and the
    /// handler then exits naming it. That, and only that, is retried on another port: the Functions host picks
    /// its worker's port the same way and is not what a test here checks.
    async fn spawn_and_wait(&self) -> Result<(), DriverError> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.spawn_and_wait_once().await {
                Err(DriverError::ExitedBeforeReady { status, output })
                    if attempts < PORT_ATTEMPTS && port_taken(&output, self.process().port) =>
                {
                    eprintln!("the handler's port was taken before it bound it ({status}); starting it on another");
                }
                other => return other,
            }
        }
    }

    async fn spawn_and_wait_once(&self) -> Result<(), DriverError> {
        let port = embedded::free_port()
            .map_err(|source| DriverError::Io { action: "cannot find a free port for the handler".into(), source })?;
        let command = self.command(port)?;
        let started = Instant::now();
        let child = embedded::spawn_owned(command, Signal::Kill)
            .map_err(|source| DriverError::Spawn { exe: self.options.handler_exe.clone(), source })?;
        {
            let mut process = self.process();
            process.child = Some(child);
            process.port = port;
        }
        let url = format!("http://127.0.0.1:{port}/");
        loop {
            let exited = {
                let mut process = self.process();
                let status = process.child.as_mut().map(Child::try_wait).transpose().ok().flatten().flatten();
                if let Some(status) = status {
                    process.child = None;
                    process.last_exit = Some(status);
                }
                status
            };
            if let Some(status) = exited {
                return Err(DriverError::ExitedBeforeReady { status, output: self.output_tail() });
            }
            let last_error = match self.client.get(&url).timeout(Duration::from_secs(1)).send().await {
                Ok(_) => {
                    self.process().ready_after = started.elapsed();
                    return Ok(());
                }
                Err(err) => err.to_string(),
            };
            if started.elapsed() >= self.options.ready_timeout {
                self.kill();
                return Err(DriverError::NotReady {
                    port,
                    waited: started.elapsed(),
                    last_error,
                    output: self.output_tail(),
                });
            }
            tokio::time::sleep(READY_POLL_INTERVAL).await;
        }
    }

    fn command(&self, port: u16) -> Result<Command, DriverError> {
        let mut env: Vec<(String, String)> = self.app.settings.clone();
        env.extend(self.options.env.iter().cloned());
        env.push(("FUNCTIONS_CUSTOMHANDLER_PORT".into(), port.to_string()));
        env.push(("FUNCTIONS_APP_ROOT_PATH".into(), self.app.root.display().to_string()));
        env.push(("FUNCTIONS_CUSTOMHANDLER_WORKER_ID".into(), self.worker_id.clone()));
        let lookup = |name: &str| {
            env.iter()
                .rev()
                .find(|(key, _)| key.eq_ignore_ascii_case(name))
                .map(|(_, value)| value.clone())
                .or_else(|| std::env::var(name).ok())
        };
        let arguments: Vec<String> = self.app.arguments.iter().map(|a| app::expand_settings(a, lookup)).collect();

        let mut command = Command::new(&self.options.handler_exe);
        command.args(arguments).envs(env.iter().map(|(k, v)| (k, v))).current_dir(&self.app.root).stdin(Stdio::null());
        if !self.options.inherit_stdout {
            let log = OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.log_path())
                .map_err(|source| DriverError::Io { action: "cannot open the handler's log".into(), source })?;
            let stderr = log
                .try_clone()
                .map_err(|source| DriverError::Io { action: "cannot open the handler's log".into(), source })?;
            command.stdout(log).stderr(stderr);
        }
        Ok(command)
    }

    /// One `POST /{function}` with the host's timer body, as the attempt `retry` describes (a test playing the
    /// host by hand names the failed invocation in it); `None` is a first attempt as the host makes it:
    /// `RetryContext` with count 0 under a retry policy, none without. Outputs are not applied: use
    /// [`run_timer`](Self::run_timer) for what the host does end to end.
    pub async fn invoke(&self, function: &str, retry: Option<RetryContext>) -> Result<Invocation, DriverError> {
        let spec = self.app.function(function)?;
        let retry = retry.or_else(|| spec.retry.as_ref().map(|p| RetryContext::first(p.max_retry_count)));
        let data = self.next_timer_data(spec, OffsetDateTime::now_utc());
        self.post(spec, &data, retry.as_ref()).await
    }

    /// A retry of `failed` as the host makes it: the next retry count of the function's policy, naming it.
    pub async fn retry(&self, function: &str, n: i64, failed: &Invocation) -> Result<Invocation, DriverError> {
        let spec = self.app.function(function)?;
        let max = spec.retry.as_ref().map_or(0, |p| p.max_retry_count);
        self.invoke(function, Some(RetryContext::after(n, max, failed.invocation_id.clone()))).await
    }

    /// What the host does for one timer firing: invoke; on failure (non-2xx, non-JSON, no answer, or a failed
    /// output write) wait the policy's delay and invoke again with the same trigger data and a `RetryContext`
    /// naming the failed attempt, until an attempt succeeds or the policy's retries are used up. Returns when
    /// the retry loop ends, as the timer listener does before it schedules the next firing.
    ///
    /// Fails only when the function is unknown or the handler is not running at the start.
    pub async fn run_timer(&self, function: &str) -> Result<TimerRun, DriverError> {
        let spec = self.app.function(function)?;
        if !self.is_running() {
            return Err(DriverError::NotRunning);
        }
        let data = self.next_timer_data(spec, OffsetDateTime::now_utc());
        self.run_chain(spec, &data, Time::Real).await
    }

    /// A manual run (portal Test/Run or `POST /admin/functions/{name}`): the host invokes the function through
    /// `JobHost.CallAsync`, with the same retry loop as a firing but outside the timer listener's lock, so it
    /// may run at any moment, concurrently with a firing and during its retry delays.
    pub async fn run_manual(&self, function: &str) -> Result<TimerRun, DriverError> {
        let spec = self.app.function(function)?;
        if !self.is_running() {
            return Err(DriverError::NotRunning);
        }
        let data = wire::manual_timer_data(spec.trigger().map_or("timer", |t| t.name.as_str()));
        self.run_chain(spec, &data, Time::Real).await
    }

    /// One retry loop over `data` (FunctionExecutorExtensions.TryExecuteAsync). On simulated time the retry
    /// delays are counted in [`TimerRun::waited`] instead of slept.
    async fn run_chain(&self, spec: &FunctionSpec, data: &Value, time: Time) -> Result<TimerRun, DriverError> {
        let max_retry_count = spec.retry.as_ref().map_or(0, |p| p.max_retry_count);
        let retries = u32::try_from(max_retry_count).unwrap_or(UNLIMITED_RETRY_CAP);
        let mut backoff = Backoff::default();
        let mut attempts = Vec::new();
        let mut failed: Option<String> = None;
        let mut waited = Duration::ZERO;
        for retry_count in 0..=retries {
            let retry = spec.retry.as_ref().map(|policy| RetryContext {
                retry_count: i64::from(retry_count),
                max_retry_count: policy.max_retry_count,
                failed_invocation: failed.clone(),
            });
            if retry_count > 0 {
                let delay = match (self.options.retry_delay, &spec.retry) {
                    (Some(delay), _) => delay,
                    (None, Some(policy)) => backoff.next(policy),
                    (None, None) => Duration::ZERO,
                };
                waited += delay;
                if time == Time::Real {
                    tokio::time::sleep(delay).await;
                }
            }
            let (invocation, outcome, id) = match self.post(spec, data, retry.as_ref()).await {
                Ok(invocation) if invocation.succeeded() => {
                    let outcome = self.apply(spec, &invocation);
                    let id = invocation.invocation_id.clone();
                    (Some(invocation), outcome, id)
                }
                Ok(invocation) => {
                    let reason = invocation.failure_reason();
                    let id = invocation.invocation_id.clone();
                    (Some(invocation), AttemptOutcome::HandlerFailed { reason }, id)
                }
                Err(DriverError::Request { function, source, output, invocation_id }) => {
                    let err = DriverError::Request { function, source, output, invocation_id: invocation_id.clone() };
                    (None, AttemptOutcome::HandlerFailed { reason: err.to_string() }, invocation_id)
                }
                Err(err @ DriverError::NotRunning) => {
                    (None, AttemptOutcome::HandlerFailed { reason: err.to_string() }, uuid::Uuid::new_v4().to_string())
                }
                Err(err) => return Err(err),
            };
            let applied = outcome == AttemptOutcome::Applied;
            attempts.push(Attempt { retry, invocation, outcome });
            if applied {
                let applied = attempts
                    .last()
                    .and_then(|a| a.invocation.as_ref())
                    .map(|invocation| writes(spec, invocation))
                    .unwrap_or_default();
                return Ok(TimerRun { attempts, succeeded: true, applied, waited });
            }
            failed = Some(id);
        }
        Ok(TimerRun { attempts, succeeded: false, applied: BTreeMap::new(), waited })
    }

    /// Fault injection: the next `times` writes to output binding `binding` fail, as during a queue outage.
    /// A write happens only for a non-empty value, so an attempt that outputs nothing there consumes nothing.
    pub fn fail_output_writes(&self, binding: &str, times: u32) {
        self.fail_output_writes_after(binding, times, 0);
    }

    /// Like [`fail_output_writes`](Self::fail_output_writes), but each failing write first writes the first
    /// `written` messages (they reach the destination), as a host that fails in the middle of a batch does.
    pub fn fail_output_writes_after(&self, binding: &str, times: u32, written: usize) {
        let mut sinks = self.sinks();
        let queue = sinks.failures_left.entry(binding.to_string()).or_default();
        queue.extend(std::iter::repeat_n(written, times as usize));
    }

    /// Fault injection: `binding`'s destination refuses every message `refuses` matches, every time: a write
    /// reaching one writes the messages before it (they go one by one) and fails, as a queue fails a message
    /// over its size limit.
    pub fn refuse_messages(&self, binding: &str, refuses: impl Fn(&Value) -> bool + Send + Sync + 'static) {
        self.sinks().poison.insert(binding.to_string(), Box::new(refuses));
    }

    /// Every message, row or blob written to `binding` so far, in order, across timer runs and handler restarts,
    /// as a consumer parses it as JSON (a body that is not JSON is a string). The host changed it on the way
    /// (see [`receive`]); [`received`](Self::received) has the exact bodies.
    pub fn delivered(&self, binding: &str) -> Vec<Value> {
        self.received(binding).iter().map(Received::to_value).collect()
    }

    /// What the host would write to each output binding of `function` for `invocation`'s answer, as a consumer
    /// parses it: for tests that play the host by hand and decide that a write happened (or half happened).
    pub fn writes_for(
        &self,
        function: &str,
        invocation: &Invocation,
    ) -> Result<BTreeMap<String, Vec<Value>>, DriverError> {
        Ok(writes(self.app.function(function)?, invocation))
    }

    /// Every message body, row or blob `binding`'s destination received so far, exactly, in order.
    pub fn received(&self, binding: &str) -> Vec<Received> {
        self.sinks().delivered.get(binding).cloned().unwrap_or_default()
    }

    /// SIGKILLs the handler and reaps it: what the Functions host does on shutdown, restart and scale-in
    /// (azure-functions-host `WorkerProcess.Dispose`: `Process.Kill()`), and what a crash or an OOM kill does.
    pub fn kill(&self) {
        let mut process = self.process();
        if let Some(mut child) = process.child.take() {
            if embedded::send_signal(&mut child, Signal::Kill).is_ok() {
                process.last_exit = child.wait().ok();
            }
        }
    }

    /// Sends SIGTERM and waits for the exit up to `shutdown_timeout`; past it the handler is killed and
    /// [`DriverError::ShutdownTimeout`] returned. The Functions host never sends SIGTERM (it kills: [`kill`](Self::kill));
    /// this is what a container supervisor or a developer's Ctrl-C sends, for the handler's graceful path.
    pub async fn terminate(&self) -> Result<ExitStatus, DriverError> {
        let io = |action: &str| {
            let action = action.to_string();
            move |source| DriverError::Io { action, source }
        };
        {
            let mut process = self.process();
            let Some(child) = process.child.as_mut() else {
                return process.last_exit.ok_or(DriverError::NotRunning);
            };
            embedded::send_signal(child, Signal::Terminate).map_err(io("cannot send SIGTERM to the handler"))?;
        }
        let started = Instant::now();
        loop {
            {
                let mut process = self.process();
                let status = match process.child.as_mut() {
                    Some(child) => child.try_wait().map_err(io("waiting for the handler"))?,
                    None => return process.last_exit.ok_or(DriverError::NotRunning),
                };
                if let Some(status) = status {
                    process.child = None;
                    process.last_exit = Some(status);
                    return Ok(status);
                }
            }
            if started.elapsed() >= self.options.shutdown_timeout {
                self.kill();
                return Err(DriverError::ShutdownTimeout { waited: started.elapsed() });
            }
            tokio::time::sleep(READY_POLL_INTERVAL).await;
        }
    }

    /// Starts the handler again (SIGKILLing it first if it still runs, as the host restarts a worker), with the
    /// same environment and worker id
    /// on a new port, and waits until it is ready. Sinks and fault injections are kept.
    pub async fn restart(&self) -> Result<(), DriverError> {
        self.kill();
        self.spawn_and_wait().await
    }

    /// The exit status of the last handler process that ended, if any.
    pub fn last_exit(&self) -> Option<ExitStatus> {
        self.process().last_exit
    }

    /// The timer trigger's value for a new firing of `spec`, keyed by the trigger binding's name.
    /// The timer's value for a firing at `now`: `ScheduleStatus` from the schedule when the host keeps one (a
    /// schedule monitor), null when it does not (`useMonitor` false, or turned off for a sub-minute schedule).
    fn next_timer_data(&self, spec: &FunctionSpec, now: OffsetDateTime) -> Value {
        let last = self.sinks().last_fired.insert(spec.name.clone(), now);
        let status = match self.schedule(spec) {
            Ok(schedule) if schedule::monitored(spec, &schedule) => {
                let at = time::PrimitiveDateTime::new(now.date(), now.time());
                Some((last, schedule.next_after(at).assume_utc()))
            }
            _ => None,
        };
        wire::timer_data(spec.trigger().map_or("timer", |t| t.name.as_str()), status)
    }

    async fn post(
        &self,
        spec: &FunctionSpec,
        data: &Value,
        retry: Option<&RetryContext>,
    ) -> Result<Invocation, DriverError> {
        let mut invocation = self.send(spec, data, retry).await?;
        if (200..300).contains(&invocation.status) {
            match wire::decode_answer(&invocation.body) {
                Ok((outputs, logs, return_value)) => {
                    invocation.outputs = outputs;
                    invocation.logs = logs;
                    invocation.return_value = return_value;
                }
                Err(reason) => invocation.decode_error = Some(reason),
            }
        }
        Ok(invocation)
    }

    /// One `POST /{function}` like [`invoke`](Self::invoke), with the answer left undecoded in
    /// [`Invocation::body`] (`outputs` and `logs` stay empty). For benchmarks, which decode only what they
    /// check, so that the driver's own JSON work is not counted as the handler's.
    pub async fn invoke_raw(&self, function: &str) -> Result<Invocation, DriverError> {
        let spec = self.app.function(function)?;
        let data = self.next_timer_data(spec, OffsetDateTime::now_utc());
        let retry = spec.retry.as_ref().map(|p| RetryContext::first(p.max_retry_count));
        self.send(spec, &data, retry.as_ref()).await
    }

    /// Sends one invocation and reads the whole answer.
    async fn send(
        &self,
        spec: &FunctionSpec,
        data: &Value,
        retry: Option<&RetryContext>,
    ) -> Result<Invocation, DriverError> {
        let port = {
            let process = self.process();
            if process.child.is_none() {
                return Err(DriverError::NotRunning);
            }
            process.port
        };
        let request = wire::request(&spec.name, data, retry);
        let invocation_id = uuid::Uuid::new_v4().to_string();
        let timeout = self.options.invoke_timeout.unwrap_or_else(|| {
            self.app.function_timeout.map_or(Duration::from_secs(24 * 3600), |t| t + Duration::from_secs(60))
        });
        let started = Instant::now();
        let sent = async {
            let response = self
                .client
                .post(format!("http://127.0.0.1:{port}/{}", spec.name))
                .header("X-Azure-Functions-InvocationId", &invocation_id)
                .json(&request)
                .timeout(timeout)
                .send()
                .await?;
            let status = response.status().as_u16();
            Ok::<_, reqwest::Error>((status, response.text().await?))
        };
        let (status, body) = sent.await.map_err(|source| DriverError::Request {
            function: spec.name.clone(),
            source,
            output: self.output_tail(),
            invocation_id: invocation_id.clone(),
        })?;
        Ok(Invocation {
            invocation_id,
            request,
            status,
            outputs: BTreeMap::new(),
            logs: Vec::new(),
            return_value: None,
            body,
            decode_error: None,
            sent_at: started,
            elapsed: started.elapsed(),
        })
    }

    /// Writes an attempt's outputs: every binding (the host awaits them together), each receiving what the host
    /// makes of the answer ([`receive`]). Messages go one by one, so an injected failure writes its prefix of
    /// them and fails that binding, and so the attempt; a sql batch (one transaction) or a blob (one upload)
    /// that fails writes nothing. A value the binding cannot take fails its write the same way.
    fn apply(&self, spec: &FunctionSpec, invocation: &Invocation) -> AttemptOutcome {
        let outputs = match host_writes(spec, invocation) {
            Ok(outputs) => outputs,
            Err(reason) => return AttemptOutcome::HandlerFailed { reason },
        };
        let mut sinks = self.sinks();
        let mut failure = None;
        for (binding, writes) in outputs {
            let received = match writes {
                Ok(received) if received.is_empty() => continue,
                Ok(received) => received,
                Err(reason) => {
                    failure.get_or_insert(AttemptOutcome::OutputWriteFailed { binding: binding.name.clone(), reason });
                    continue;
                }
            };
            let values: Vec<Value> = received.iter().map(Received::to_value).collect();
            let refused = sinks.poison.get(&binding.name).and_then(|refuses| values.iter().position(refuses));
            let fails_after = refused
                .or_else(|| sinks.failures_left.get_mut(&binding.name).and_then(std::collections::VecDeque::pop_front));
            let partial = receive::BindingKind::of(&binding.kind).is_some_and(|kind| kind.writes_partially());
            let written = match fails_after {
                None => received.len(),
                Some(n) if partial => n.min(received.len()),
                Some(_) => 0,
            };
            sinks.delivered.entry(binding.name.clone()).or_default().extend(received.into_iter().take(written));
            if fails_after.is_some() {
                failure.get_or_insert(AttemptOutcome::OutputWriteFailed {
                    binding: binding.name.clone(),
                    reason: format!("injected write failure after {written} message(s) (fail_output_writes)"),
                });
            }
        }
        failure.unwrap_or(AttemptOutcome::Applied)
    }
}

/// The delays of one retry loop under a policy: fixedDelay's interval, or azure-webjobs-sdk's
/// `RandomizedExponentialBackoffStrategy` (the first retry after `minimumInterval`, then `minimum` plus a
/// randomized (±20 %) doubling of `minimum`, never above `maximumInterval`).
#[derive(Debug, Default)]
struct Backoff {
    exponent: u32,
    current: Duration,
}

impl Backoff {
    fn next(&mut self, policy: &RetryPolicy) -> Duration {
        let (minimum, maximum) = match policy.strategy {
            RetryStrategy::FixedDelay { delay } => return delay,
            RetryStrategy::ExponentialBackoff { minimum, maximum } => (minimum, maximum),
        };
        if self.current == maximum && self.exponent > 0 {
            return maximum;
        }
        let mut interval = minimum;
        if self.exponent > 0 {
            let random = 0.8 + 0.4 * (uuid::Uuid::new_v4().as_u128() % 1_000_000) as f64 / 1_000_000.0;
            interval += minimum.mul_f64(random * 2f64.powi(self.exponent as i32 - 1));
        }
        if interval < maximum {
            self.current = interval;
            self.exponent += 1;
        } else {
            self.current = maximum;
        }
        self.current
    }
}

impl Drop for HostDriver {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One output binding and what its destination receives, or why the write fails.
type BindingWrite<'a> = (&'a Binding, Result<Vec<Received>, String>);

/// Each output binding of `spec` (function.json order) the host writes to for `invocation`'s answer (bindings
/// without a value are left out). `Err` when the host cannot read the answer at all (the invocation fails).
fn host_writes<'a>(spec: &'a FunctionSpec, invocation: &Invocation) -> Result<Vec<BindingWrite<'a>>, String> {
    let model = HostModel::default();
    let answer = newtonsoft::read_answer(&invocation.body, model.zone)
        .map_err(|err| format!("the host cannot read the answer: {err}"))?;
    let outputs: Vec<Binding> = spec.outputs().cloned().collect();
    Ok(spec
        .outputs()
        .filter_map(|binding| {
            let value = receive::binding_value(&outputs, binding, &answer)?;
            Some((binding, receive::receive(binding, &value, &model)))
        })
        .collect())
}

/// What an applied attempt wrote, as a consumer parses it (the bodies of [`host_writes`]).
fn writes(spec: &FunctionSpec, invocation: &Invocation) -> BTreeMap<String, Vec<Value>> {
    let mut out = BTreeMap::new();
    for (binding, received) in host_writes(spec, invocation).unwrap_or_default() {
        if let Some(values) = received.ok().filter(|r| !r.is_empty()) {
            out.insert(binding.name.clone(), values.iter().map(Received::to_value).collect());
        }
    }
    out
}

fn truncate(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((index, _)) => &text[..index],
        None => text,
    }
}

/// Plain HTTP to loopback never uses TLS, but reqwest's rustls backend without a built-in provider panics when a
/// client is built unless one is configured; pass ring explicitly rather than install a process-wide default.
fn http_client() -> Result<reqwest::Client, DriverError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|err| DriverError::Client(err.to_string()))?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    reqwest::Client::builder()
        .no_proxy()
        .tls_backend_preconfigured(tls)
        .build()
        .map_err(|err| DriverError::Client(err.to_string()))
}

/// How many ports a start tries when the one picked is taken before the handler binds it.
const PORT_ATTEMPTS: u32 = 3;

/// Whether the handler's `output` says it could not listen on `port` because another process had bound it
/// (the handler's own words, `src/main.rs`: "cannot listen on 127.0.0.1:{port}: Address already in use").
fn port_taken(output: &str, port: u16) -> bool {
    output
        .lines()
        .any(|l| l.contains(&format!("cannot listen on 127.0.0.1:{port}:")) && l.contains("Address already in use"))
}

#[cfg(test)]
mod port_tests {
    use super::port_taken;

    #[test]
    fn only_the_handlers_refusal_of_a_taken_port_is_retried() {
        let line = "error: cannot listen on 127.0.0.1:41483: Address already in use (os error 98)";
        assert!(port_taken(line, 41483));
        assert!(!port_taken(line, 41484), "another port's refusal (an earlier start's output) is not this one");
        assert!(!port_taken("error: cannot listen on 127.0.0.1:41483: Permission denied (os error 13)", 41483));
        assert!(!port_taken(
            "error: cannot listen on 127.0.0.1:41483 for the admin routes: Address already in use",
            41483
        ));
    }
}
