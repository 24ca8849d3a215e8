//! Partitions: `"partitions": N` in sqltrigger.json splits a function's changes into N stable hash ranges of the
//! primary key, each with its own state document (checkpoint, span in flight, lease, fencing token).
//!
//! A key always lands in the same partition (its hash modulo N), so the changes of one key keep their order; the
//! partitions have no order among them. Under the Functions host every partition is its own timer function (a
//! folder written by `handler partitions generate`, with `"partition": i` and `"partitionGroup"`); under
//! `handler run` one folder with `"partitions": N` runs as N partition triggers named `{function}-p{i}`, which the
//! processes of the deployment share by claiming partition leases.
//!
//! Plain data: the sources turn a [`Partition`] into their own predicate (`source/*/sql`). It stays in `config`,
//! apart from the partitions wing (`crate::partitions`: generate, change, ownership, balance, status), because it
//! is what sqltrigger.json says, parsed once at load like every other setting, and the sources and the engine
//! read it without depending on the wing; whether a kind of source has partitions at all is its capability
//! (`SourceKind::capabilities`).

use super::{valid_path_part, ConfigError, SourceKind};
use serde_json::{Map, Value};
use std::num::NonZeroU32;

#[cfg(test)]
mod tests;

/// The most partitions a function may have: each is a document, a lease and a fetch per cycle.
pub const MAX_PARTITIONS: u32 = 256;

/// One of a function's partitions: the keys whose hash modulo `count` is `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Partition {
    pub index: u32,
    pub count: NonZeroU32,
}

impl Partition {
    pub fn new(index: u32, count: NonZeroU32) -> Option<Self> {
        (index < count.get()).then_some(Self { index, count })
    }

    /// The partition's state document's name under the app, beside its group's: `{group}/partition-{i}-of-{N}`.
    /// A folder name holds no '/', so no function's own document (`{app}/{function}.json`) can be one of these.
    pub fn state_name(&self, group: &str) -> String {
        format!("{group}/partition-{}-of-{}", self.index, self.count)
    }

    /// The name of the trigger that serves this partition of `group`: the folder name `handler partitions
    /// generate` writes, and the trigger's name under `handler run`.
    pub fn function_name(&self, group: &str) -> String {
        format!("{group}-p{}", self.index)
    }
}

impl std::fmt::Display for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "partition {} of {}", self.index, self.count)
    }
}

/// What sqltrigger.json says about partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partitioning {
    /// `"partitions"`: how many (1: not partitioned).
    pub count: NonZeroU32,
    /// `"partition"`: the one partition this folder serves (a folder `handler partitions generate` wrote); `None`:
    /// all of them (`handler run` shares them among its processes).
    pub only: Option<u32>,
    /// `"partitionGroup"`: the name the partitions' state documents share (the function's folder name unless a
    /// generated folder names the function it came from).
    pub group: String,
}

impl Partitioning {
    pub fn single(function: &str) -> Self {
        Self { count: NonZeroU32::MIN, only: None, group: function.to_string() }
    }

    pub fn is_partitioned(&self) -> bool {
        self.count.get() > 1
    }

    /// The partitions this folder serves, in order.
    pub fn served(&self) -> Vec<Partition> {
        match self.only {
            Some(index) => vec![Partition { index, count: self.count }],
            None => (0..self.count.get()).map(|index| Partition { index, count: self.count }).collect(),
        }
    }

    /// Reads `partitions`, `partition` and `partitionGroup` of the function folder `function`, reporting every
    /// problem. `host`: the Functions host drives the ticks (one timer function per partition).
    pub(super) fn parse(
        options: &Map<String, Value>,
        function: &str,
        kind: Option<SourceKind>,
        host: bool,
        file: &str,
        errors: &mut Vec<ConfigError>,
    ) -> Self {
        let mut problem = |key: &str, msg: String| errors.push(ConfigError::new(format!("{key} in {file}"), msg));
        let whole = |key: &str| options.get(key).map(|v| v.as_u64().ok_or(()));
        let count = match whole("partitions") {
            None => NonZeroU32::MIN,
            Some(Ok(n)) if (1..=u64::from(MAX_PARTITIONS)).contains(&n) => {
                NonZeroU32::new(n as u32).unwrap_or(NonZeroU32::MIN)
            }
            Some(_) => {
                problem("partitions", format!("must be a whole number from 1 to {MAX_PARTITIONS}"));
                NonZeroU32::MIN
            }
        };
        let only = match whole("partition") {
            None => None,
            Some(Ok(i)) if i < u64::from(count.get()) && count.get() > 1 => Some(i as u32),
            Some(_) => {
                problem(
                    "partition",
                    format!(
                        "must be a whole number below \"partitions\" ({count}), and \"partitions\" above 1: the one partition this folder serves (handler partitions generate writes it)"
                    ),
                );
                None
            }
        };
        let group = match options.get("partitionGroup") {
            None => function.to_string(),
            Some(Value::String(g)) if valid_path_part(g) && only.is_some() => g.clone(),
            Some(_) => {
                problem(
                    "partitionGroup",
                    "must be a function name (letters, digits, '-', '_'), and only beside \"partition\": it names the function whose partitions' state this folder shares".into(),
                );
                function.to_string()
            }
        };
        if count.get() > 1 {
            if let Some((kind, Err(why))) = kind.map(|k| (k, k.capabilities().partitions)) {
                problem("partitions", why.in_settings(kind));
            }
            if host && only.is_none() {
                problem(
                    "partitions",
                    format!(
                        "is {count}, but under the Functions host each partition is its own timer function (a timer function runs on one instance at a time): run `handler partitions generate {function} {count}` to write one folder per partition, and deploy those instead of this one"
                    ),
                );
            }
        }
        Self { count, only, group }
    }
}
