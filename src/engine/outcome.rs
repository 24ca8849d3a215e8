//! What a tick answers: its batch, what kind of answer it is, and for the host the output bindings' share.

use super::outputs::MappedOutputs;
use crate::change::Change;

/// What one tick produced.
#[derive(Debug, Default)]
pub struct TickOutcome {
    pub changes: Vec<Change>,
    pub batch_id: Option<u64>,
    pub kind: OutcomeKind,
    /// Lines for the invocation's `Logs` (also written to the process log).
    pub logs: Vec<String>,
    /// State-store operations this tick performed.
    pub store_operations: u64,
    /// The lease token this batch was answered under (0 when none); sinks use it as a fencing token.
    pub fence: u64,
    /// After a sink tick (`Trigger::tick_into`): the function's backfill was running when the tick ended, so
    /// its chunks are a backlog. A loop that waits its polling interval after a batch smaller than
    /// `MaxBatchSize` must not wait after a delivering tick while this holds: a trickle of live changes would
    /// otherwise leave a chunk about one tick per interval (see `runner::pause_after`).
    pub backfill_running: bool,
    /// After a tick whose live fetch found nothing: the checkpoint, or the later position the source proved
    /// empty up to (`Fetched::advance`), recorded or not. A drain asks the source whether it has passed the
    /// position the drain started at (`Source::reached`); `None` after any other tick.
    pub proven: Option<crate::source::Position>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeKind {
    /// A new batch.
    Delivered,
    /// A batch delivered before, sent again.
    Redelivered,
    /// Nothing to send.
    #[default]
    Empty,
    /// Another tick committed first; this one sends nothing.
    Conflict,
    /// Another instance holds the batch in flight.
    LeaseHeld,
    Paused,
}

/// What an invocation answers the host: the tick, and what each output binding receives (nothing when the
/// trigger delivers through a sink).
#[derive(Debug)]
pub struct Answer {
    pub outcome: TickOutcome,
    pub outputs: MappedOutputs,
}

/// What a clean stop gave up ([`super::Trigger::release_on_stop`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Released {
    /// A batch recorded for the next tick and never delivered was withdrawn.
    pub withdrew: bool,
    /// This process's lease on the state document was let lapse.
    pub released: bool,
}
