//! One shutdown primitive: resolves on SIGTERM (what the host and container runtimes send) or SIGINT.
//!
//! The handlers are installed by [`listen`], before the process says it is ready: a SIGTERM that arrives
//! between "ready" and the first await on it must end the process cleanly, not with the default action (death
//! by signal, as a host that stops a worker right after start-up would see it).

/// SIGTERM and SIGINT, listened for from the moment this is made.
#[derive(Debug)]
pub struct Signals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
}

/// Installs the handlers now (call within the runtime, before announcing readiness).
pub fn listen() -> Signals {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        Signals { term: signal(SignalKind::terminate()).ok(), interrupt: signal(SignalKind::interrupt()).ok() }
    }
    #[cfg(not(unix))]
    Signals {}
}

impl Signals {
    /// Waits for SIGTERM or SIGINT. A handler that could not be installed waits forever; the other still works.
    pub async fn recv(self) {
        #[cfg(unix)]
        {
            async fn next(s: Option<tokio::signal::unix::Signal>) {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            }
            tokio::select! {
                () = next(self.term) => {},
                () = next(self.interrupt) => {},
            }
        }
        #[cfg(not(unix))]
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Waits for SIGTERM or Ctrl-C, listening from this call on.
pub async fn signal() {
    listen().recv().await;
}
