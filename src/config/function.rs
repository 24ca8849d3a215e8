//! One function the handler serves, as configuration loading (`folder`) made it: its host bindings, source,
//! settings and delivery, and the partition triggers it stands for. Read by `App` (one trigger per partition
//! trigger), the engine and the server; built only by `folder::load`.

use super::host_policy::RetryPolicy;
use super::ncrontab::Schedule;
use super::outputs::{OutputBinding, OutputShapes};
use super::partition::{Partition, Partitioning};
use super::settings::TriggerSettings;
use super::sink_spec::SinkSpec;
use super::source_spec::SourceSpec;
use std::path::PathBuf;
use std::time::Duration;

/// One function folder, validated.
#[derive(Debug, Clone)]
pub struct FunctionConfig {
    pub name: String,
    pub dir: PathBuf,
    /// The timer trigger binding's name: where the host puts the timer under `Data`.
    pub timer_binding: String,
    pub timer_schedule: Option<String>,
    /// The schedule the host fires on (`%Name%` resolved), when the handler serves the host or an operator's
    /// command reads the app (when it resolves and parses); `None` under `handler run`, which has no timer.
    pub schedule: Option<Schedule>,
    pub outputs: Vec<OutputBinding>,
    pub retry: Option<RetryPolicy>,
    /// Deferred delivery: how long an answered batch stays unproven (see [`super::proof_window`]).
    pub proof_window: Duration,
    pub source: SourceSpec,
    pub settings: TriggerSettings,
    /// `outputs` in sqltrigger.json: the shape of each output binding it names (the host's bindings deliver).
    pub output_shapes: OutputShapes,
    /// Where the handler delivers itself: the `"sink"` of sqltrigger.json under deliveryMode sink, and under
    /// `handler run` always (stdout when none is named). `None`: the host's output bindings deliver.
    pub sink: Option<SinkSpec>,
    /// How the function's changes are split into partitions (`"partitions"`, `"partition"`, `"partitionGroup"`).
    pub partitioning: Partitioning,
}

impl FunctionConfig {
    /// The configuration of each partition trigger this folder serves: itself when it is not partitioned; else
    /// one per served partition, each reading only its partition's keys, and named `{group}-p{i}` when the
    /// folder serves them all (`handler run`). A generated folder keeps its own name.
    pub fn partition_triggers(&self) -> Vec<FunctionConfig> {
        if !self.partitioning.is_partitioned() {
            return vec![self.clone()];
        }
        let group = &self.partitioning.group;
        self.partitioning
            .served()
            .into_iter()
            .map(|p| {
                let mut f = self.clone();
                if self.partitioning.only.is_none() {
                    f.name = p.function_name(group);
                }
                f.partitioning.only = Some(p.index);
                f.source.partition = Some(p);
                f
            })
            .collect()
    }

    /// The partition this trigger serves: `None` unless the function is partitioned and this is one of its
    /// partition triggers (see [`FunctionConfig::partition_triggers`]).
    pub fn partition(&self) -> Option<Partition> {
        self.source.partition
    }

    /// The name of this trigger's state document under the app (`{app}/{name}.json`): the function's own name,
    /// or for a partition its group's partition name, shared by a generated folder and `handler run`.
    pub fn state_name(&self) -> String {
        match self.partition() {
            Some(p) => p.state_name(&self.partitioning.group),
            None => self.name.clone(),
        }
    }

    /// What each output binding receives (`outputs` in sqltrigger.json over the defaults by binding type).
    pub fn output_routes(&self) -> Vec<super::outputs::OutputRoute> {
        super::outputs::routes(&self.outputs, &self.output_shapes)
    }
}
