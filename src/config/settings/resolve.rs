//! One function's effective trigger settings, read through the precedence chain by [`Resolver`] (called by
//! configuration loading per function folder, and by telemetry for app-wide settings), and the choices they hold.

use super::table::{
    SettingDef, BATCH_SIZE_ALIAS, DELIVERY_MODE, LEASE_DURATION_MS, MAX_ATTEMPTS, MAX_BATCH_SIZE,
    MAX_CHANGES_PER_WORKER, MESSAGE_FORMAT, POISON_ACTION, POISON_AFTER_MS, POLLING_INTERVAL_MS, TICK_TIMEOUT_MS,
};
use crate::config::env::Env;
use crate::config::error::ConfigError;
use serde_json::Value;
use std::time::Duration;

/// How a batch reaches its destination, and so what guarantee holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryMode {
    Deferred,
    Immediate,
    Sink,
}

/// How a batch is handed to the host's output bindings (see [`MESSAGE_FORMAT`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageFormat {
    /// JSON values, re-read and re-written by the host (the official trigger's payload, as it arrives).
    Json,
    /// Each message as a JSON string holding the message's text, which the host passes through as is.
    Text,
}

/// What happens to a batch that failed `MaxAttempts` times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PoisonAction {
    Quarantine,
    Halt,
}

/// The effective trigger settings of one function.
#[derive(Debug, Clone, PartialEq)]
pub struct TriggerSettings {
    pub max_batch_size: usize,
    pub polling_interval: Duration,
    pub max_changes_per_worker: u64,
    pub max_attempts: u32,
    /// Deferred delivery: how long a batch must have been failing before it may be poison.
    pub poison_after: Duration,
    pub poison_action: PoisonAction,
    pub delivery_mode: DeliveryMode,
    /// Deferred and immediate delivery: how the batch is handed to the host's output bindings.
    pub message_format: MessageFormat,
    pub lease_duration: Duration,
    pub tick_timeout: Duration,
}

/// Reads one setting through the precedence chain and reports where the winning value came from, so an
/// error can name it.
#[derive(Debug)]
pub struct Resolver<'a> {
    pub env: &'a Env,
    pub host_sql: Option<&'a Value>,
    pub function: Option<(&'a str, &'a serde_json::Map<String, Value>)>,
}

impl Resolver<'_> {
    pub(in crate::config) fn raw(&self, def: &SettingDef) -> Option<(String, String)> {
        if let (Some((file, obj)), Some(key)) = (self.function, def.function_key) {
            if let Some(v) = obj.get(key) {
                return Some((value_text(v), format!("{key} in {file}")));
            }
        }
        if let Some(v) = self.env.get(def.name) {
            return Some((v.to_string(), format!("app setting {}", def.name)));
        }
        if def.name == MAX_BATCH_SIZE.name {
            if let Some(v) = self.env.get(BATCH_SIZE_ALIAS) {
                return Some((v.to_string(), format!("app setting {BATCH_SIZE_ALIAS}")));
            }
        }
        if let (Some(sql), Some(key)) = (self.host_sql, def.host_json_key) {
            if let Some(v) = sql.get(key) {
                return Some((value_text(v), format!("host.json extensions.sql.{key}")));
            }
        }
        None
    }

    /// A positive integer setting, bounded above.
    pub fn positive(&self, def: &SettingDef, max: u64, errors: &mut Vec<ConfigError>) -> u64 {
        let fallback = def.default.parse().unwrap_or(1);
        let Some((text, from)) = self.raw(def) else { return fallback };
        match text.trim().parse::<u64>() {
            Ok(n) if n > 0 && n <= max => n,
            _ => {
                errors.push(ConfigError::new(
                    from,
                    format!("must be a whole number from 1 to {max}, got {text:?} (default {})", def.default),
                ));
                fallback
            }
        }
    }

    /// A whole number setting from 0, bounded above, or `None` when nothing sets it.
    pub fn optional_whole(&self, def: &SettingDef, max: u64, errors: &mut Vec<ConfigError>) -> Option<u64> {
        let (text, from) = self.raw(def)?;
        match text.trim().parse::<u64>() {
            Ok(n) if n <= max => Some(n),
            _ => {
                errors.push(ConfigError::new(from, format!("must be a whole number from 0 to {max}, got {text:?}")));
                None
            }
        }
    }

    /// A whole number setting from 0, bounded above.
    pub fn whole(&self, def: &SettingDef, max: u64, errors: &mut Vec<ConfigError>) -> u64 {
        let fallback = def.default.parse().unwrap_or(0);
        let Some((text, from)) = self.raw(def) else { return fallback };
        match text.trim().parse::<u64>() {
            Ok(n) if n <= max => n,
            _ => {
                errors.push(ConfigError::new(
                    from,
                    format!("must be a whole number from 0 to {max}, got {text:?} (default {})", def.default),
                ));
                fallback
            }
        }
    }

    /// One of a fixed set of words, case-insensitive.
    pub fn choice<T: Copy>(&self, def: &SettingDef, options: &[(&str, T)], errors: &mut Vec<ConfigError>) -> T {
        let pick = |t: &str| options.iter().find(|(name, _)| name.eq_ignore_ascii_case(t.trim())).map(|(_, v)| *v);
        let fallback = pick(def.default).unwrap_or(options[0].1);
        let Some((text, from)) = self.raw(def) else { return fallback };
        pick(&text).unwrap_or_else(|| {
            let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
            errors.push(ConfigError::new(from, format!("must be one of {}, got {text:?}", names.join(", "))));
            fallback
        })
    }

    pub fn trigger_settings(&self, errors: &mut Vec<ConfigError>) -> TriggerSettings {
        TriggerSettings {
            max_batch_size: self.positive(&MAX_BATCH_SIZE, 100_000, errors) as usize,
            polling_interval: Duration::from_millis(self.positive(&POLLING_INTERVAL_MS, 86_400_000, errors)),
            max_changes_per_worker: self.positive(&MAX_CHANGES_PER_WORKER, u32::MAX as u64, errors),
            max_attempts: self.positive(&MAX_ATTEMPTS, 1000, errors) as u32,
            poison_after: Duration::from_millis(self.whole(&POISON_AFTER_MS, 7 * 86_400_000, errors)),
            poison_action: self.choice(
                &POISON_ACTION,
                &[("quarantine", PoisonAction::Quarantine), ("halt", PoisonAction::Halt)],
                errors,
            ),
            delivery_mode: self.choice(
                &DELIVERY_MODE,
                &[
                    ("deferred", DeliveryMode::Deferred),
                    ("immediate", DeliveryMode::Immediate),
                    ("sink", DeliveryMode::Sink),
                ],
                errors,
            ),
            message_format: self.choice(
                &MESSAGE_FORMAT,
                &[("json", MessageFormat::Json), ("text", MessageFormat::Text)],
                errors,
            ),
            lease_duration: Duration::from_millis(self.positive(&LEASE_DURATION_MS, 3_600_000, errors).max(1000)),
            tick_timeout: Duration::from_millis(self.positive(&TICK_TIMEOUT_MS, 86_400_000, errors)),
        }
    }
}

fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
