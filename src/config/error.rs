//! A configuration problem: where it is (a setting or a file) and what to change. Loading collects every one
//! into [`ConfigErrors`] instead of stopping at the first.

use std::fmt;

/// One configuration problem: where it is and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub setting: String,
    pub problem: String,
}

impl ConfigError {
    pub fn new(setting: impl Into<String>, problem: impl Into<String>) -> Self {
        Self { setting: setting.into(), problem: problem.into() }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.setting, self.problem)
    }
}

/// Every problem found, printed one per line.
#[derive(Debug, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "the configuration has {} problem(s):", self.0.len())?;
        for e in &self.0 {
            writeln!(f, "  - {e}")?;
        }
        Ok(())
    }
}
