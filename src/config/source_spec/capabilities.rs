//! What each kind of source can do, answered in one place: [`SourceKind::capabilities`]. The places that refuse
//! what a kind cannot do (`"partitions"` in the settings, `handler partitions generate` and `change`, a backfill
//! of a source that has none) ask this table and say its reason, in their own words, from here.

use super::SourceKind;

/// What one kind of source supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// `"partitions"` above 1: the source can read one hash range of the table's keys; `Err`: why it cannot.
    pub partitions: Result<(), NoPartitions>,
    /// `handler state backfill` and `startFrom: snapshot`: the source reads the rows that exist in key order.
    pub backfill: bool,
    /// `"includeMetadata"`: the source can put its own metadata on each change (the kinds whose options read
    /// the key: postgres-logical, mssql-change-tracking).
    pub metadata: bool,
}

/// Why a kind of source has no partitions, said in the words of each place that refuses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoPartitions {
    /// postgres-logical: one replication stream decodes the server's WAL once for the whole function; N
    /// partitions would each need their own slot (and a row-filtered publication) and decode it N times.
    OneReplicationStream,
}

impl NoPartitions {
    /// The settings check (`"partitions"` in sqltrigger.json of a `kind` function): the reason and the fix.
    pub fn in_settings(self, kind: SourceKind) -> String {
        match self {
            Self::OneReplicationStream => format!(
                "is not supported by the {} source: its one replication stream decodes the server's WAL once for the whole function, while N partitions would each need their own slot and row-filtered publication (PostgreSQL 15+) and decode the whole WAL N times. Remove \"partitions\"; see docs/operations.md, \"Scaling out\"",
                kind.as_str()
            ),
        }
    }

    /// `handler partitions generate` refusing `function`, a `kind` function.
    pub fn in_generate(self, function: &str, kind: SourceKind) -> String {
        match self {
            Self::OneReplicationStream => format!(
                "{function} reads {}, which does not support partitions: its one replication stream decodes the server's WAL once for the whole function (N partitions would each need their own slot and decode the whole WAL N times); see docs/operations.md, \"Scaling out\"",
                kind.as_str()
            ),
        }
    }

    /// `handler partitions change` refusing `function`, a `kind` function.
    pub fn in_change(self, function: &str, kind: SourceKind) -> String {
        match self {
            Self::OneReplicationStream => format!(
                "{function} reads the {} source, which has no partitions (one replication stream decodes the WAL once for the whole function): nothing was written",
                kind.as_str()
            ),
        }
    }
}

impl SourceKind {
    /// Every kind, in the order the documentation lists them.
    pub const ALL: [SourceKind; 4] =
        [Self::PostgresCursor, Self::PostgresLogical, Self::MssqlChangeTracking, Self::MssqlRowversion];

    /// What this kind of source supports: the one table every check of a capability reads.
    pub fn capabilities(self) -> Capabilities {
        match self {
            Self::PostgresCursor => Capabilities { partitions: Ok(()), backfill: true, metadata: false },
            Self::PostgresLogical => {
                Capabilities { partitions: Err(NoPartitions::OneReplicationStream), backfill: true, metadata: true }
            }
            Self::MssqlChangeTracking => Capabilities { partitions: Ok(()), backfill: true, metadata: true },
            Self::MssqlRowversion => Capabilities { partitions: Ok(()), backfill: true, metadata: false },
        }
    }

    /// The kinds whose capabilities pass `test`, as a sentence names them: "a, b and c".
    pub fn listed(test: impl Fn(Capabilities) -> bool) -> String {
        let names: Vec<&str> = Self::ALL.into_iter().filter(|k| test(k.capabilities())).map(|k| k.as_str()).collect();
        match names.split_last() {
            None => "no".to_string(),
            Some((last, [])) => last.to_string(),
            Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        }
    }
}

#[cfg(test)]
mod tests;
