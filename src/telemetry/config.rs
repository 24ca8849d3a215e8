//! Metrics settings: which exporters are configured, where they send, how often. Read once at start; nothing
//! here contacts anything.

use crate::config::settings::{self, Resolver};
use crate::config::{ConfigError, ConfigErrors, Env, Secret};
use std::time::Duration;

/// Which of the configured exporters to use (`Sql_Trigger_Metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Choice {
    Auto,
    Otlp,
    AppInsights,
    Off,
}

/// Where metrics go and how often, read from the app settings.
#[derive(Clone)]
pub struct TelemetryConfig {
    /// The full OTLP/HTTP metrics URL (`.../v1/metrics`).
    pub otlp_endpoint: Option<String>,
    /// Extra OTLP request headers (often an API key, hence secret).
    pub otlp_headers: Vec<(String, Secret)>,
    pub app_insights: Option<Secret>,
    /// Export interval, and the interval of the status poll behind the gauges.
    pub interval: Duration,
    /// `service.name`: OTEL_SERVICE_NAME, else the app name.
    pub service_name: String,
}

impl std::fmt::Debug for TelemetryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelemetryConfig")
            .field("otlp_endpoint", &self.otlp_endpoint)
            .field("otlp_headers", &self.otlp_headers.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .field("app_insights", &self.app_insights.as_ref().map(|_| "***"))
            .field("interval", &self.interval)
            .field("service_name", &self.service_name)
            .finish()
    }
}

impl TelemetryConfig {
    /// `Ok(None)` when no exporter is configured or metrics are turned off: then nothing is started.
    pub fn from_env(env: &Env, app_name: &str) -> Result<Option<Self>, ConfigErrors> {
        let is = |name: &str, value: &str| env.get(name).is_some_and(|v| v.trim().eq_ignore_ascii_case(value));
        if is("OTEL_SDK_DISABLED", "true") || is("OTEL_METRICS_EXPORTER", "none") {
            return Ok(None);
        }
        let mut errors = Vec::new();
        let resolver = Resolver { env, host_sql: None, function: None };
        let choice = resolver.choice(
            &settings::METRICS,
            &[
                ("auto", Choice::Auto),
                ("otlp", Choice::Otlp),
                ("appinsights", Choice::AppInsights),
                ("off", Choice::Off),
            ],
            &mut errors,
        );
        let wants = |c: Choice| choice == Choice::Auto || choice == c;
        let otlp_endpoint = if wants(Choice::Otlp) { otlp_endpoint(env, &mut errors) } else { None };
        let app_insights = env
            .get(settings::APPLICATIONINSIGHTS_CONNECTION_STRING.name)
            .filter(|_| wants(Choice::AppInsights))
            .map(Secret::new);
        if otlp_endpoint.is_none() && app_insights.is_none() && errors.is_empty() {
            return Ok(None);
        }
        let interval = Duration::from_millis(resolver.positive(&settings::METRICS_INTERVAL_MS, 3_600_000, &mut errors));
        let otlp_headers = ["OTEL_EXPORTER_OTLP_METRICS_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"]
            .into_iter()
            .find_map(|name| env.get(name).map(|text| (name, text)))
            .filter(|_| otlp_endpoint.is_some())
            .map(|(name, text)| parse_headers(name, text, &mut errors))
            .unwrap_or_default();
        if !errors.is_empty() {
            return Err(ConfigErrors(errors));
        }
        let service_name = env.get("OTEL_SERVICE_NAME").unwrap_or(app_name).to_string();
        Ok(Some(Self { otlp_endpoint, otlp_headers, app_insights, interval, service_name }))
    }
}

/// The OTLP metrics URL from the standard variables: the per-signal one as is, else the base plus `/v1/metrics`.
fn otlp_endpoint(env: &Env, errors: &mut Vec<ConfigError>) -> Option<String> {
    let (setting, url) = match (env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"), env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
    {
        (Some(url), _) => ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", url.trim().to_string()),
        (None, Some(base)) => {
            ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("{}/v1/metrics", base.trim().trim_end_matches('/')))
        }
        (None, None) => return None,
    };
    let protocol = ["OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"]
        .into_iter()
        .find_map(|name| env.get(name).map(|value| (name, value.trim())));
    if let Some((name, protocol)) = protocol.filter(|(_, p)| p.eq_ignore_ascii_case("grpc")) {
        errors.push(ConfigError::new(
            format!("app setting {name}"),
            format!("{protocol:?} is not supported: this handler exports OTLP over http/protobuf only; set it to http/protobuf and point the endpoint at the Collector's HTTP port (4318)"),
        ));
        return None;
    }
    match reqwest::Url::parse(&url) {
        Ok(parsed) if matches!(parsed.scheme(), "http" | "https") => Some(url),
        _ => {
            errors.push(ConfigError::new(
                format!("app setting {setting}"),
                "must be an http:// or https:// URL, such as http://localhost:4318",
            ));
            None
        }
    }
}

/// `key=value,key2=value2` with URL-encoded values, as the OpenTelemetry specification defines the variable.
/// An error names the setting but never repeats its text: header values are often keys.
fn parse_headers(setting: &str, text: &str, errors: &mut Vec<ConfigError>) -> Vec<(String, Secret)> {
    let mut headers = Vec::new();
    for pair in text.split(',').filter(|p| !p.trim().is_empty()) {
        match pair.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => {
                headers.push((key.trim().to_string(), Secret::new(percent_decode(value.trim()))));
            }
            _ => {
                errors.push(ConfigError::new(
                    format!("app setting {setting}"),
                    "must be comma-separated key=value pairs with URL-encoded values, such as api-key=abc%3D,x-team=data",
                ));
                return Vec::new();
            }
        }
    }
    headers
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let hex = |i: usize| bytes.get(i).and_then(|b| (*b as char).to_digit(16));
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], hex(i + 1), hex(i + 2)) {
            (b'%', Some(high), Some(low)) => {
                out.push((high * 16 + low) as u8);
                i += 3;
            }
            (byte, _, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
