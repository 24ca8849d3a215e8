//! The assembled application: validated configuration turned into one [`Trigger`] per function, sharing one
//! state store, and the sink of each function that names one. Building it opens no connection; sources,
//! stores and sinks connect on first use.

use crate::config::{settings, AppConfig, ConfigError, ConfigErrors, StateStoreKind};
use crate::db::postgres::PostgresTls;
use crate::engine::{Released, Trigger};
use crate::source;
use crate::state::{BlobStore, FileStore, StateStore};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// How long a clean stop of `handler serve` spends releasing leases once its invocations have finished. Each
/// release is at most a read and a conditional write of one document, every function at once: well under a
/// second against a reachable store. Past it the process exits anyway (whoever sent SIGTERM kills soon after:
/// Kubernetes after `terminationGracePeriodSeconds`), and what was not released lapses at its expiry, as after a
/// kill.
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug)]
pub struct App {
    pub config: AppConfig,
    pub store: Arc<dyn StateStore>,
    /// By lower-cased function name: the host's routes are case-insensitive.
    triggers: BTreeMap<String, Arc<Trigger>>,
    pub owner: String,
}

impl App {
    pub fn build(config: AppConfig) -> Result<Self, ConfigErrors> {
        let store = build_store(&config).map_err(|e| ConfigErrors(vec![e]))?;
        Self::with_store(config, store)
    }

    /// Builds the app over a given store (tests use memory or a fault-injecting wrapper).
    pub fn with_store(config: AppConfig, store: Arc<dyn StateStore>) -> Result<Self, ConfigErrors> {
        let owner = instance_id(&config);
        // One pool per database for the whole process, of the configured size (`db::pools`).
        crate::db::pools::set_max_connections(config.max_connections_per_database);
        // One connector for every PostgreSQL source and sink: its TLS configuration is built once, on first use.
        let postgres_tls = PostgresTls::new(config.postgres_trust.clone());
        if postgres_tls.trusts_any_certificate() {
            tracing::warn!(
                "{}=true: PostgreSQL server certificates and host names are not verified, so whoever can intercept \
                 a connection can read its rows and password; set {} to the server's CA certificate instead",
                settings::POSTGRES_TRUST_SERVER_CERTIFICATE.name,
                settings::POSTGRES_ROOT_CERTIFICATE.name
            );
        }
        for warning in &config.warnings {
            tracing::warn!("{warning}");
        }
        let mut errors = Vec::new();
        let mut triggers = BTreeMap::new();
        // Every partition a folder serves is a trigger of its own (`handler run` shares them among processes).
        // Two folders that would write one state document (or answer to one name) are refused.
        let mut served: BTreeMap<String, String> = BTreeMap::new();
        for f in config.functions.iter().flat_map(|folder| folder.partition_triggers()) {
            let f = &f;
            let file = format!(
                "{}/sqltrigger.json",
                f.dir.file_name().map_or(f.name.clone(), |d| d.to_string_lossy().into_owned())
            );
            let folder = file.trim_end_matches("/sqltrigger.json").to_string();
            let clash = [format!("state {}", f.state_name()), format!("name {}", f.name.to_ascii_lowercase())]
                .into_iter()
                .find_map(|k| served.insert(k, folder.clone()));
            if let Some(other) = clash {
                errors.push(ConfigError::new(
                    file,
                    format!(
                        "serves {} (state {}), as the folder {other} does: keep either the folders `handler partitions generate` wrote or the one folder with \"partitions\", not both",
                        f.name,
                        f.state_name()
                    ),
                ));
                continue;
            }
            let source = source::open(&f.source, &postgres_tls).map_err(|e| ConfigError::new(file, e.to_string()));
            // The trigger owns its delivery: the sink the configuration chose (for sink delivery, and under
            // `handler run` always); the host's bindings otherwise.
            let sink = f.sink.as_ref().map(|spec| crate::sink::build(&f.name, spec, &postgres_tls)).transpose();
            match (source, sink) {
                (Ok(source), Ok(sink)) => {
                    let trigger = Trigger::new(f.clone(), &config.app_name, source, store.clone(), owner.clone());
                    let trigger = match sink {
                        Some(sink) => trigger.with_sink(sink),
                        None => trigger,
                    };
                    triggers.insert(f.name.to_ascii_lowercase(), Arc::new(trigger));
                }
                (source, sink) => errors.extend(source.err().into_iter().chain(sink.err())),
            }
        }
        if !errors.is_empty() {
            return Err(ConfigErrors(errors));
        }
        Ok(Self { config, store, triggers, owner })
    }

    pub fn trigger(&self, name: &str) -> Option<&Arc<Trigger>> {
        self.triggers.get(&name.to_ascii_lowercase())
    }

    pub fn triggers(&self) -> impl Iterator<Item = &Arc<Trigger>> {
        self.triggers.values()
    }

    pub fn function_names(&self) -> Vec<String> {
        self.triggers.values().map(|t| t.name().to_string()).collect()
    }

    /// The partition triggers of the partitioned function `group` (its `partitionGroup`, matched without regard
    /// to case), in partition order: the `{group}-p{i}` triggers of one folder under `handler run`, or the
    /// folders `handler partitions generate` wrote under the host. Empty when no partitioned function has that
    /// name: the name of no trigger under `handler run`, so status and the scale route answer for it here.
    pub fn partitions(&self, group: &str) -> Vec<Arc<Trigger>> {
        let mut found: Vec<Arc<Trigger>> = self
            .triggers
            .values()
            .filter(|t| t.config().partition().is_some() && t.config().partitioning.group.eq_ignore_ascii_case(group))
            .cloned()
            .collect();
        found.sort_by_key(|t| t.config().partition().map(|p| p.index));
        found
    }

    /// Each partition of `group`'s owner in `handler run`'s balancing, by partition index, for status: the
    /// holders of the unexpired ownership leases (`partitions::ownership`). Under the host, where nothing balances,
    /// and when the store cannot be read (status then shows each partition's lease holder only, and says nothing
    /// it does not know), it is empty.
    pub async fn partition_owners(&self, group: &str) -> BTreeMap<u32, String> {
        let Some(first) = self.partitions(group).into_iter().next() else { return BTreeMap::new() };
        let (group, count) = (first.config().partitioning.group.clone(), first.config().partitioning.count);
        match crate::partitions::ownership::owners(self.store.as_ref(), &self.config.app_name, &group, count).await {
            Ok(owners) => {
                let now = first.now();
                owners.iter().filter_map(|o| Some((o.partition, o.holder(now)?.to_string()))).collect()
            }
            Err(e) => {
                tracing::warn!(function = %group, "could not read the partitions' ownership documents for status: {e}");
                BTreeMap::new()
            }
        }
    }

    /// On a clean stop of `handler serve`, once no invocation is in flight: releases the state document lease of
    /// every function (every partition function) where this process still holds it, all at once, within
    /// `within` ([`release_on_stop`]). A release waits for its trigger's tick lock, so it never cuts into a tick
    /// still running (after a drain that timed out); one still running past `within` keeps its lease until it
    /// expires. `false`: not all were done within `within`.
    pub async fn release_on_stop(&self, within: Duration) -> bool {
        let all = futures::future::join_all(self.triggers().map(|t| release_on_stop(t)));
        if tokio::time::timeout(within, all).await.is_ok() {
            return true;
        }
        tracing::warn!(
            "could not release every lease within {within:?} (a tick still running, or the state store slow); the next instance goes on with those once they expire"
        );
        false
    }

    /// What the scale route and the metrics report on, in name order: each partitioned function once, by its
    /// group (`Partitioned`), and each unpartitioned function (`Single`).
    pub fn scale_units(&self) -> Vec<ScaleUnit> {
        let mut units: BTreeMap<String, ScaleUnit> = BTreeMap::new();
        for t in self.triggers.values() {
            match t.config().partition() {
                None => {
                    units.insert(t.name().to_ascii_lowercase(), ScaleUnit::Single(t.clone()));
                }
                Some(_) => {
                    let group = &t.config().partitioning.group;
                    units
                        .entry(format!("{}/", group.to_ascii_lowercase()))
                        .or_insert_with(|| ScaleUnit::Partitioned { group: group.clone(), partitions: Vec::new() });
                }
            }
        }
        for unit in units.values_mut() {
            if let ScaleUnit::Partitioned { group, partitions } = unit {
                *partitions = self.partitions(group);
            }
        }
        units.into_values().collect()
    }
}

/// On a clean stop, after `trigger`'s last tick (`handler run` and `handler serve` alike): withdraws a batch
/// recorded for the next tick and never delivered, and releases the lease on the state document where this
/// process still holds it ([`Trigger::release_on_stop`]), saying what it gave up. A batch delivered (or answered
/// to the host) and not yet acknowledged stays in flight: whoever comes next delivers it again, or proves it, at
/// once, as after the lease's expiry.
pub async fn release_on_stop(trigger: &Trigger) -> Released {
    let name = trigger.name();
    match trigger.release_on_stop().await {
        Ok(released @ Released { withdrew: true, .. }) => {
            tracing::info!(function = %name, "withdrew the batch recorded for the next tick (never delivered) and released the lease");
            released
        }
        Ok(released @ Released { released: true, .. }) => {
            tracing::info!(function = %name, "released the lease");
            released
        }
        Ok(released) => released,
        Err(e) => {
            tracing::warn!(function = %name, error = %e,
                "could not release the lease (nor withdraw a batch recorded for the next tick); the next instance goes on once this one's lease expires");
            Released::default()
        }
    }
}

/// A function as the scale route sees it: one trigger, or a partitioned function's partition triggers.
#[derive(Debug, Clone)]
pub enum ScaleUnit {
    Single(Arc<Trigger>),
    Partitioned { group: String, partitions: Vec<Arc<Trigger>> },
}

fn build_store(config: &AppConfig) -> Result<Arc<dyn StateStore>, ConfigError> {
    match &config.state_store {
        StateStoreKind::File { directory } => Ok(Arc::new(FileStore::new(directory.clone()))),
        StateStoreKind::Blob { container } => {
            let get = |name: &str| config.env.get(name).map(str::to_string);
            BlobStore::from_settings(&get, "AzureWebJobsStorage", container)
                .map(|s| Arc::new(s) as Arc<dyn StateStore>)
                .map_err(|e| ConfigError::new("app setting AzureWebJobsStorage", e.to_string()))
        }
    }
}

/// This process's identity in leases: the worker id the host gives (or the host name) plus a random part,
/// so a restarted process is a new owner.
fn instance_id(config: &AppConfig) -> String {
    let base = config
        .env
        .get("FUNCTIONS_CUSTOMHANDLER_WORKER_ID")
        .or_else(|| config.env.get("WEBSITE_INSTANCE_ID"))
        .or_else(|| config.env.get("HOSTNAME"))
        .unwrap_or("handler");
    let base: String = base.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').take(40).collect();
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{base}-{}-{}", std::process::id(), &random[..8])
}
