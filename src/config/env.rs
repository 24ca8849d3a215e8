//! The app settings as the handler reads them: the process environment, snapshotted once (every app setting
//! arrives as an environment variable), with local.settings.json under it for a local run. Read by every part
//! of configuration loading; holds values that may be secrets, so `Debug` shows names only.

use super::error::ConfigError;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

/// The process environment, snapshotted (every app setting arrives as an environment variable).
#[derive(Clone, Default)]
pub struct Env(BTreeMap<String, String>);

impl fmt::Debug for Env {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Values may be secrets: show names only.
        f.debug_list().entries(self.0.keys()).finish()
    }
}

impl Env {
    pub fn from_process() -> Self {
        Self(std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))).collect())
    }

    pub fn from_pairs(pairs: impl IntoIterator<Item = (String, String)>) -> Self {
        Self(pairs.into_iter().collect())
    }

    /// Adds the `Values` of `<root>/local.settings.json` under the variables already set, as Core Tools does
    /// for a local run. Used by the CLI and `handler run`; under the host the settings arrive as variables.
    pub fn with_local_settings(mut self, root: &Path) -> Result<Self, ConfigError> {
        let path = root.join("local.settings.json");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(self),
            Err(e) => return Err(ConfigError::new(path.display().to_string(), format!("cannot be read: {e}"))),
        };
        let parsed: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| ConfigError::new(path.display().to_string(), format!("is not valid JSON: {e}")))?;
        if let Some(values) = parsed.get("Values").and_then(|v| v.as_object()) {
            for (k, v) in values {
                let v = match v {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                self.0.entry(k.clone()).or_insert(v);
            }
        }
        Ok(self)
    }

    /// A non-empty value. Azure sets unset settings to empty strings in some paths; treat them as unset.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str).filter(|v| !v.trim().is_empty())
    }
}
