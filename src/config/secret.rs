//! A value that must never reach a log, an error message or a state document.

use std::fmt;

/// A secret string (connection string, account key, token). `Debug` and `Display` print `***`; the value is
/// reachable only through [`Secret::expose`], which makes every use greppable.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn never_prints_its_value() {
        let s = super::Secret::new("AccountKey=abc");
        assert_eq!(format!("{s:?} {s}"), "*** ***");
        assert_eq!(s.expose(), "AccountKey=abc");
    }

    /// Found by the function-folder fuzz target's check (fuzz/corpus/function_config/regression-*): a sink
    /// header given as `%Setting%` was resolved into the source's options, and `Debug` of the configuration
    /// printed the secret it named. Since sqltrigger.json is typed at load, a source's spec holds only its own
    /// typed keys (the sink is a `SinkSpec` whose secrets are `Secret`s).
    #[test]
    fn a_sources_debug_shows_no_resolved_option_value() {
        let env = crate::config::Env::from_pairs([
            ("Pg".to_string(), "postgres://app:pw-in-the-string@127.0.0.1/db".to_string()),
            ("WebhookAuth".to_string(), "Bearer resolved-secret-token".to_string()),
        ]);
        let spec = crate::config::SourceSpec::from_json(
            &serde_json::json!({ "source": "postgres-cursor", "tableName": "public.orders", "connectionStringSetting": "Pg",
                "cursorColumn": "version", "sink": { "type": "webhook", "url": "https://h.example/in",
                "headers": { "Authorization": "%WebhookAuth%" } } }),
            &env,
        )
        .expect("a valid source");
        let debug = format!("{spec:?}");
        assert!(!debug.contains("resolved-secret-token") && !debug.contains("pw-in-the-string"), "{debug}");
        assert!(debug.contains("public"), "{debug}");
    }
}
