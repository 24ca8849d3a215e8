//! Configurations for tests that build an engine by hand over in-memory parts.

use sql_pseudo_trigger::config::{
    DeliveryMode, Env, FunctionConfig, MessageFormat, PoisonAction, SourceSpec, TriggerSettings,
};
use std::path::PathBuf;
use std::time::Duration;

/// The shipped defaults (batch 100, polling 1 s, 1000 changes per worker, 5 attempts, quarantine, deferred),
/// except a lease of an hour, so a test's process never loses it by accident, a tick timeout of 30 s instead of
/// 240 s, and no poison duration (the count alone decides, as a test without a manual clock needs); tests change
/// what they exercise with `..testbed::config::settings()`.
pub fn settings() -> TriggerSettings {
    TriggerSettings {
        max_batch_size: 100,
        polling_interval: Duration::from_secs(1),
        max_changes_per_worker: 1000,
        max_attempts: 5,
        poison_after: Duration::ZERO,
        poison_action: PoisonAction::Quarantine,
        delivery_mode: DeliveryMode::Deferred,
        message_format: MessageFormat::Json,
        lease_duration: Duration::from_secs(3600),
        tick_timeout: Duration::from_secs(30),
    }
}

/// A source spec for engine tests that run over an in-memory source: the engine reads only `start_from`.
pub fn placeholder_source() -> SourceSpec {
    let env = Env::from_pairs([("Conn".into(), "x".into())]);
    let sqltrigger = serde_json::json!({ "source": "postgres-cursor", "tableName": "t", "connectionStringSetting": "Conn", "cursorColumn": "c" });
    SourceSpec::from_json(&sqltrigger, &env).expect("a valid spec")
}

/// A function named `name` over [`placeholder_source`], with no outputs, no retry policy and a proof window of
/// zero (a batch is proven by the next invocation that does not name it).
pub fn function(name: &str, settings: TriggerSettings) -> FunctionConfig {
    FunctionConfig {
        name: name.into(),
        dir: PathBuf::from(name),
        timer_binding: "timer".into(),
        timer_schedule: None,
        schedule: None,
        outputs: Vec::new(),
        retry: None,
        proof_window: Duration::ZERO,
        source: placeholder_source(),
        settings,
        output_shapes: Default::default(),
        sink: None,
        partitioning: sql_pseudo_trigger::config::Partitioning::single(name),
    }
}
