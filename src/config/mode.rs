//! Who drives an app's ticks, chosen by the command that loads it (`handler serve`, `handler run`, the
//! operator's commands).

/// Who will drive the ticks: read by configuration loading (what a function folder must hold) and by the
/// watchdog (the cadence a function is held to). How each batch is then acknowledged is the function's
/// [`super::DeliveryMode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The Functions host, through timer invocations and output bindings (`handler serve`).
    Host,
    /// The handler's own loop and sinks (`handler run`).
    Runner,
    /// An operator's command (`handler state`, `handler partitions`): the app read as `handler run` reads it,
    /// and each function's timer schedule as the host would fire it (when it resolves), so that status reports
    /// what the host's timer allows (`ceiling_per_second`) for an app the host runs.
    Operator,
}
