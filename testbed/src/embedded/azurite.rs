//! Azurite's blob service of our own, in memory or persistent, on a free port.

use super::process::{io_error, shut_down, spawn_owned, DROP_GRACE, POLL_INTERVAL, STOP_GRACE};
use super::{free_port, log_tail, LaunchError, ScratchDir, Signal};
use std::fs::{self, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long Azurite may take from spawn to answering HTTP. Node starts slower than PostgreSQL on a busy machine.
pub const AZURITE_READY_TIMEOUT: Duration = Duration::from_secs(20);
/// Azurite's well-known development account (public, documented by Microsoft; not a secret).
pub const DEV_ACCOUNT: &str = "devstoreaccount1";
/// Azurite's well-known development account key (public, documented by Microsoft; not a secret).
pub const DEV_ACCOUNT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// Azurite's blob service of our own, on a free port, with its well-known development account.
///
/// In-memory by default (fast, nothing to clean, and lost on [`stop`](Self::stop));
/// [`start_persistent`](Self::start_persistent) keeps blobs in a scratch folder so they survive a restart, as
/// the engine tests need.
#[derive(Debug)]
pub struct Azurite {
    exe: PathBuf,
    port: u16,
    persistent: bool,
    child: Option<Child>,
    started_in: Duration,
    // Last: dropped after `Drop::drop` has stopped the server.
    scratch: ScratchDir,
}

impl Azurite {
    /// Starts an in-memory Azurite blob service: data is lost when it stops.
    pub fn start() -> Result<Self, LaunchError> {
        Self::launch(false)
    }

    /// Starts an Azurite blob service that keeps its data in a scratch folder, so it survives
    /// [`stop`](Self::stop) + [`start_again`](Self::start_again).
    pub fn start_persistent() -> Result<Self, LaunchError> {
        Self::launch(true)
    }

    fn launch(persistent: bool) -> Result<Self, LaunchError> {
        let exe = find_azurite()?;
        let scratch = ScratchDir::new("azurite").map_err(io_error("cannot create a scratch directory for Azurite"))?;
        let mut server = Self {
            exe,
            port: free_port().map_err(io_error("cannot find a free port for Azurite"))?,
            persistent,
            child: None,
            started_in: Duration::ZERO,
            scratch,
        };
        server.start_again()?;
        Ok(server)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT/devstoreaccount1` (no trailing slash).
    pub fn blob_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/{DEV_ACCOUNT}", self.port)
    }

    /// The full development-storage connection string for this instance's blob endpoint.
    pub fn connection_string(&self) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName={DEV_ACCOUNT};AccountKey={DEV_ACCOUNT_KEY};BlobEndpoint={};",
            self.blob_endpoint()
        )
    }

    pub fn is_persistent(&self) -> bool {
        self.persistent
    }

    /// How long the last start took from spawn to answering HTTP.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// Azurite's stdout and stderr, appended across restarts (access logs are off).
    pub fn log_path(&self) -> PathBuf {
        self.scratch.path().join("azurite.log")
    }

    /// Azurite's (node's) process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(None)))
    }

    /// Stops Azurite (SIGTERM, then SIGKILL after 10 s). In-memory data is gone afterwards.
    pub fn stop(&mut self) -> Result<(), LaunchError> {
        if let Some(mut child) = self.child.take() {
            shut_down(&mut child, Signal::Terminate, STOP_GRACE).map_err(io_error("stopping Azurite"))?;
        }
        Ok(())
    }

    /// Starts Azurite again on the same port (and, when persistent, the same data) and waits until it answers.
    pub fn start_again(&mut self) -> Result<(), LaunchError> {
        if self.is_running() {
            return Ok(());
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(io_error("cannot open the Azurite log"))?;
        let stderr = log.try_clone().map_err(io_error("cannot open the Azurite log"))?;
        let mut command = Command::new(&self.exe);
        command
            .args(["--blobHost", "127.0.0.1", "--blobPort"])
            .arg(self.port.to_string())
            // Newer service versions than Azurite knows are what the Azure SDKs send; accept them.
            .args(["--disableTelemetry", "--skipApiVersionCheck", "--silent"])
            // Azurite's default workspace is its working directory: keep it inside our scratch folder.
            .current_dir(self.scratch.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr);
        if self.persistent {
            let location = self.scratch.path().join("data");
            fs::create_dir_all(&location).map_err(io_error("cannot create Azurite's data folder"))?;
            command.arg("--location").arg(location);
        } else {
            command.arg("--inMemoryPersistence");
        }
        let started = Instant::now();
        let child =
            spawn_owned(command, Signal::Kill).map_err(io_error(format!("cannot start {}", self.exe.display())))?;
        self.child = Some(child);
        self.wait_ready(started)?;
        self.started_in = started.elapsed();
        Ok(())
    }

    /// Stops and starts again on the same port.
    pub fn restart(&mut self) -> Result<(), LaunchError> {
        self.stop()?;
        self.start_again()
    }

    fn wait_ready(&mut self, started: Instant) -> Result<(), LaunchError> {
        let deadline = started + AZURITE_READY_TIMEOUT;
        let log_path = self.log_path();
        let Some(child) = self.child.as_mut() else {
            return Err(LaunchError::NotRunning("Azurite"));
        };
        loop {
            if let Some(status) = child.try_wait().map_err(io_error("waiting for Azurite"))? {
                return Err(LaunchError::Exited { server: "Azurite", status, log: log_tail(&log_path, 30), log_path });
            }
            let last_error = match http_answers(self.port) {
                Ok(()) => return Ok(()),
                Err(err) => err.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(LaunchError::NotReady {
                    server: "Azurite",
                    port: self.port,
                    waited: started.elapsed(),
                    last_error,
                    log: log_tail(&log_path, 30),
                    log_path,
                });
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = shut_down(&mut child, Signal::Kill, DROP_GRACE);
        }
    }
}

/// One unauthenticated HTTP request: any HTTP status (Azurite answers 403) proves the server is serving.
fn http_answers(port: u16) -> io::Result<()> {
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_millis(500))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    write!(stream, "GET /{DEV_ACCOUNT}?comp=list HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n")?;
    let mut head = [0u8; 8];
    stream.read_exact(&mut head)?;
    if head.starts_with(b"HTTP/1.") {
        Ok(())
    } else {
        Err(io::Error::other("the answer is not HTTP"))
    }
}

fn find_azurite() -> Result<PathBuf, LaunchError> {
    let mut searched = Vec::new();
    let tools = std::env::var_os("SQL_PSEUDO_TRIGGER_TOOLS")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .into_iter()
        // tools/ of the repository (scripts/test installs Azurite there), one level above this crate.
        .chain([Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("tools")]);
    for dir in tools {
        let exe = dir.join("node_modules").join(".bin").join("azurite-blob");
        if exe.is_file() {
            return Ok(exe);
        }
        searched.push(exe.display().to_string());
    }
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        let exe = dir.join("azurite-blob");
        if exe.is_file() {
            return Ok(exe);
        }
    }
    searched.push("PATH".into());
    Err(LaunchError::AzuriteNotFound { searched: searched.join(", ") })
}
