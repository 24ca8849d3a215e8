//! [`LOG_LEVEL`] read as a tracing filter: the Functions host's level names and tracing's, nothing else. Called by
//! `main` before logging starts and by configuration loading for a level set in local.settings.json.

use super::table::LOG_LEVEL;
use crate::config::error::ConfigError;

/// A level word as tracing's filter spells it: the Functions host's names (host.json `logging.logLevel`) and
/// tracing's own, any case. `Critical` has no tracing level above error, so it is error.
fn level_word(word: &str) -> Option<&'static str> {
    match word.trim().to_ascii_lowercase().as_str() {
        "trace" => Some("trace"),
        "debug" => Some("debug"),
        "information" | "info" => Some("info"),
        "warning" | "warn" => Some("warn"),
        "error" | "critical" => Some("error"),
        "none" | "off" => Some("off"),
        _ => None,
    }
}

/// [`LOG_LEVEL`] as a tracing filter, or why it is refused. tracing's own filter reads a word that is not one
/// of its levels (`Information`, `verbose`, `-0`) as a module name and then logs nothing at all, errors
/// included, so only levels and `module=level` directives are accepted here.
pub fn log_filter(text: &str) -> Result<String, ConfigError> {
    let refuse = || {
        ConfigError::new(
            format!("app setting {}", LOG_LEVEL.name),
            format!(
                "{text:?} is not a log level: use Trace, Debug, Information, Warning, Error, Critical or None (the \
                 Functions host's names, any case), or trace, debug, info, warn, error or off, optionally with \
                 module directives such as info,sql_pseudo_trigger=debug"
            ),
        )
    };
    let module = |m: &str| {
        !m.is_empty() && m.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') && !m.starts_with(':')
    };
    let mut directives = Vec::new();
    for directive in text.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        if let Some(level) = level_word(directive) {
            directives.push(level.to_string());
            continue;
        }
        match directive.split_once('=') {
            Some((target, level)) if module(target.trim()) => match level_word(level) {
                Some(level) => directives.push(format!("{}={level}", target.trim())),
                None => return Err(refuse()),
            },
            _ => return Err(refuse()),
        }
    }
    if directives.is_empty() {
        return Err(refuse());
    }
    Ok(directives.join(","))
}
