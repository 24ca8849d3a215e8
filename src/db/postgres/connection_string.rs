//! PostgreSQL connection strings as users write them, in libpq's two forms: the URI
//! (`postgres://user:password@host:5432/db?sslmode=require`) and key=value
//! (`host=db.example.com user=app password='my secret' sslmode=require`), read into tokio-postgres's `Config`.
//!
//! tokio-postgres parses both forms, but users test their strings with psql (libpq), and three of its readings
//! differ, so the string is adjusted before tokio-postgres reads it:
//! - `sslmode=verify-ca` and `sslmode=verify-full` (and libpq's `ssl=true` in a URI) become `require`, which
//!   verifies the certificate and the host name with our connector (see `tls`). tokio-postgres knows only
//!   disable, prefer and require. For verify-ca that is stricter than libpq, which checks no host name there.
//! - In a URI, libpq's user information ends at the first `@` before any `/`; tokio-postgres takes the first
//!   `@` anywhere, so `postgres://host/db?user=myadmin@myserver` would name the user `host/db?user=myadmin`.
//!   Every `@` after the user information is percent-encoded (tokio-postgres decodes the path and the query).
//! - An `@` left unencoded in a URI's user name or password (Azure Single Server's `myadmin@myserver`) makes
//!   both read the rest as host and port: tokio-postgres then refuses the port, or dials a host named
//!   `myserver@host`. Refused here with the fix (`%40`).
//!
//! No message here holds any part of the string. Option names are repeated only when they are libpq's own:
//! a word of a password whose quotes were forgotten reads as an option name.

use crate::config::settings::POSTGRES_ROOT_CERTIFICATE;
use percent_encoding::percent_decode_str;
use std::error::Error;
use std::ops::Range;
use tokio_postgres::Config;

/// The connection string in app setting `setting`, read as libpq reads it (see the module comment).
pub(crate) fn parse(setting: &str, text: &str) -> Result<Config, String> {
    let form =
        if text.starts_with("postgres://") || text.starts_with("postgresql://") { Form::Uri } else { Form::KeyValue };
    let adjusted = match form {
        Form::Uri => uri(text),
        Form::KeyValue => key_value(text),
    }
    .map_err(|fault| fault.message(setting))?;
    adjusted.parse().map_err(|e| unparsable(setting, form, &e))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    Uri,
    KeyValue,
}

/// What is wrong with a string before tokio-postgres reads it. Holds option names from libpq's list only.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fault {
    /// A URI with an `@` in its host part: the user name or password holds an unencoded `@`.
    UnencodedAt,
    /// `jdbc:postgresql://...`, Java's form.
    Jdbc,
    /// `Server=...;Database=...`, the ADO.NET (Npgsql) form the Azure portal also shows.
    AdoNet,
    /// key=value: text that is not `key=value`, after the value of this option (if it is libpq's).
    NotKeyValue { after: Option<&'static str> },
    /// key=value: `key=` at the end, without a value.
    NoValue { key: Option<&'static str> },
    /// key=value: a quote that is never closed.
    Unterminated { key: Option<&'static str> },
}

/// The key=value form's quoting, for messages.
const QUOTING: &str = "single-quote a value that holds spaces (password='my secret'), writing \\' for a quote \
                       and \\\\ for a backslash inside it";

/// The URI form's encoding, for messages.
const ENCODING: &str = "in a URI, percent-encode the special characters of the user name and password (@ as %40, \
                        / as %2F, : as %3A, ? as %3F, # as %23, % as %25, a space as %20), or use the key=value \
                        form: host=... user=... password='...'";

impl Fault {
    fn message(&self, setting: &str) -> String {
        let named = |key: &Option<&str>| key.map_or_else(|| "an option".to_string(), |k| format!("option {k}"));
        match self {
            Self::UnencodedAt => format!(
                "app setting {setting}: the user name or password of the connection string holds an @ that is \
                 not percent-encoded, so part of it would be read as the host; {ENCODING} (Azure Single Server's \
                 user name myadmin@myserver is written myadmin%40myserver)"
            ),
            Self::Jdbc => format!(
                "app setting {setting} holds a JDBC URL (jdbc:postgresql://...); remove the jdbc: prefix, which \
                 leaves the URI form postgres://host:5432/db?user=...&password=..."
            ),
            Self::AdoNet => format!(
                "app setting {setting} holds an ADO.NET connection string (Server=...;Database=...); write it in \
                 libpq's form: host=... port=5432 dbname=... user=... password='...' sslmode=require"
            ),
            Self::NotKeyValue { after: Some(key) } => format!(
                "app setting {setting} is not a PostgreSQL connection string: text that is not key=value follows \
                 the value of option {key}; {QUOTING}"
            ),
            Self::NotKeyValue { after: None } => format!(
                "app setting {setting} is not a PostgreSQL connection string: write key=value pairs \
                 (host=db.example.com user=app password='...') or a URI (postgres://user:password@host:5432/db); \
                 {QUOTING}"
            ),
            Self::NoValue { key } => {
                format!("app setting {setting}: {} has no value after its =; write '' for an empty value", named(key))
            }
            Self::Unterminated { key } => format!(
                "app setting {setting}: the value of {} opens a quote (') that is never closed; {QUOTING}",
                named(key)
            ),
        }
    }
}

/// A URI as tokio-postgres should read it: `verify-*` as `require`, and every `@` after the user information
/// encoded (see the module comment).
fn uri(text: &str) -> Result<String, Fault> {
    let Some((scheme, rest)) = text.split_once("://") else { return Ok(text.to_string()) };
    // libpq: the user information ends at the first '@', unless a '/' comes first (then there is none).
    let (user_info, after) = match rest.find(['@', '/']) {
        Some(at) if rest[at..].starts_with('@') => rest.split_at(at + 1),
        _ => ("", rest),
    };
    let host_end = after.find(['/', '?']).unwrap_or(after.len());
    if after[..host_end].contains('@') {
        return Err(Fault::UnencodedAt);
    }
    let (path, query) = match after.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (after, None),
    };
    let mut adjusted = format!("{scheme}://{user_info}{}", path.replace('@', "%40"));
    if let Some(query) = query {
        adjusted.push('?');
        adjusted.push_str(&uri_query(query).replace('@', "%40"));
    }
    Ok(adjusted)
}

/// A URI's query with libpq's TLS words rewritten, walked as tokio-postgres walks it: a key runs to the next
/// `=`, its value to the next `&`. A malformed rest is left for tokio-postgres to report.
fn uri_query(mut query: &str) -> String {
    let mut out = String::with_capacity(query.len());
    while let Some((key, rest)) = query.split_once('=') {
        let (value, next) = match rest.split_once('&') {
            Some((value, next)) => (value, Some(next)),
            None => (rest, None),
        };
        match (decoded(key).as_str(), decoded(value).as_str()) {
            ("sslmode", mode) if verifies(mode) => out.push_str("sslmode=require"),
            // libpq's "JDBC compatibility": ssl=true means sslmode=require.
            ("ssl", "true") => out.push_str("sslmode=require"),
            _ => out.extend([key, "=", value]),
        }
        match next {
            Some(next) => {
                out.push('&');
                query = next;
            }
            None => return out,
        }
    }
    out.push_str(query);
    out
}

fn decoded(s: &str) -> String {
    percent_decode_str(s).decode_utf8_lossy().into_owned()
}

/// libpq's sslmodes that verify the certificate, both read here as `require` (which verifies it and the name).
fn verifies(mode: &str) -> bool {
    matches!(mode, "verify-full" | "verify-ca")
}

/// A key=value string as tokio-postgres should read it: each `sslmode` that verifies becomes `require`.
fn key_value(text: &str) -> Result<String, Fault> {
    if text.starts_with("jdbc:") {
        return Err(Fault::Jdbc);
    }
    let first_key = text.split('=').next().unwrap_or_default().trim();
    if text.contains(';') && libpq_keyword(first_key).is_none() {
        return Err(Fault::AdoNet);
    }
    let mut adjusted = text.to_string();
    // From the last to the first, so each span still points at the text it was read from.
    for pair in pairs(text)?.iter().rev() {
        if pair.key == "sslmode" && verifies(&pair.value) {
            adjusted.replace_range(pair.span.clone(), "require");
        }
    }
    Ok(adjusted)
}

/// One `key = value` of the key=value form, with where its value (quotes included) lies in the text.
#[derive(Debug)]
struct Pair<'a> {
    key: &'a str,
    value: String,
    span: Range<usize>,
}

/// The pairs of a key=value string, read as libpq reads them: spaces around `=` are allowed; a value ends at
/// white space unless it is single-quoted; a backslash escapes the next character (`\'`, `\\`, `\ `).
/// tokio-postgres reads the same grammar, except that it stops silently at a pair without a key, which libpq
/// refuses, as this does.
fn pairs(text: &str) -> Result<Vec<Pair<'_>>, Fault> {
    let mut pairs: Vec<Pair<'_>> = Vec::new();
    let mut chars = text.char_indices().peekable();
    let at = |chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>| chars.peek().map_or(text.len(), |c| c.0);
    loop {
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let start = at(&mut chars);
        if start == text.len() {
            return Ok(pairs);
        }
        while chars.next_if(|(_, c)| !c.is_whitespace() && *c != '=').is_some() {}
        let key = &text[start..at(&mut chars)];
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let after = pairs.last().and_then(|p| libpq_keyword(p.key));
        if key.is_empty() || chars.next_if(|(_, c)| *c == '=').is_none() {
            return Err(Fault::NotKeyValue { after });
        }
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let value_start = at(&mut chars);
        let mut value = String::new();
        if chars.next_if(|(_, c)| *c == '\'').is_some() {
            loop {
                match chars.next() {
                    Some((_, '\'')) => break,
                    Some((_, '\\')) => match chars.next() {
                        Some((_, c)) => value.push(c),
                        None => return Err(Fault::Unterminated { key: libpq_keyword(key) }),
                    },
                    Some((_, c)) => value.push(c),
                    None => return Err(Fault::Unterminated { key: libpq_keyword(key) }),
                }
            }
        } else {
            while let Some((_, c)) = chars.next_if(|(_, c)| !c.is_whitespace()) {
                match c {
                    '\\' => value.extend(chars.next().map(|(_, c)| c)),
                    c => value.push(c),
                }
            }
            if value.is_empty() {
                return Err(Fault::NoValue { key: libpq_keyword(key) });
            }
        }
        pairs.push(Pair { key, value, span: value_start..at(&mut chars) });
    }
}

/// libpq's connection keywords (PostgreSQL 18's list), the only option names a message may repeat.
const LIBPQ_KEYWORDS: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "passfile",
    "require_auth",
    "channel_binding",
    "connect_timeout",
    "client_encoding",
    "options",
    "application_name",
    "fallback_application_name",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
    "replication",
    "gssencmode",
    "sslmode",
    "requiressl",
    "sslnegotiation",
    "sslcompression",
    "sslcert",
    "sslkey",
    "sslkeylogfile",
    "sslpassword",
    "sslcertmode",
    "sslrootcert",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "requirepeer",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "min_protocol_version",
    "max_protocol_version",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
    "service",
    "target_session_attrs",
    "load_balance_hosts",
    "oauth_issuer",
    "oauth_client_id",
    "oauth_client_secret",
    "oauth_scope",
];

fn libpq_keyword(key: &str) -> Option<&'static str> {
    LIBPQ_KEYWORDS.iter().copied().find(|k| *k == key)
}

/// Why tokio-postgres did not take the adjusted string. Its option messages name an option and never a value;
/// an unknown option's name is repeated only when it is libpq's (see the module comment).
fn unparsable(setting: &str, form: Form, e: &tokio_postgres::Error) -> String {
    let cause = e.source().map(ToString::to_string).unwrap_or_default();
    let root = POSTGRES_ROOT_CERTIFICATE.name;
    let option = |prefix: &str| cause.strip_prefix(prefix).and_then(|rest| rest.strip_suffix('`')).map(str::to_owned);
    if let Some(name) = option("unknown option `") {
        return match libpq_keyword(&name) {
            Some("sslrootcert") => format!(
                "app setting {setting}: the connection string cannot carry sslrootcert; remove it and give the CA \
                 certificate in app setting {root}"
            ),
            Some("sslcert" | "sslkey") => format!(
                "app setting {setting}: client certificates (sslcert, sslkey) are not supported; authenticate with \
                 a password or an access token in the connection string"
            ),
            Some(known) => format!(
                "app setting {setting}: libpq's option {known} is not supported here (the driver, tokio-postgres, \
                 does not implement it); remove it from the connection string"
            ),
            None => format!(
                "app setting {setting}: the connection string holds an option libpq does not know, not named here \
                 in case it is part of a password; check the spelling of each option, and {}",
                match form {
                    Form::KeyValue => QUOTING,
                    Form::Uri => "percent-encode & as %26 and = as %3D inside a value",
                }
            ),
        };
    }
    if let Some(name) = option("invalid value for option `") {
        let fix = match (name.as_str(), form) {
            ("sslmode", _) => {
                return format!(
                    "app setting {setting}: sslmode must be disable, prefer, require, verify-ca or verify-full \
                     (require and both verify modes verify the certificate and host name here; libpq's allow is \
                     not supported: use prefer)"
                )
            }
            ("port" | "host", Form::Uri) => format!("; {ENCODING}"),
            ("port", Form::KeyValue) => "; a port is a number (port=5432)".to_string(),
            ("hostaddr", _) => "; hostaddr takes an IP address (hostaddr=10.0.0.5), host= takes a name".to_string(),
            _ => String::new(),
        };
        return format!("app setting {setting}: the connection string's {name} has an invalid value{fix}");
    }
    // The URI parser's own words, which hold no part of the string.
    let what = match cause.as_str() {
        "unterminated parameter" => "a query parameter without =",
        c if c.contains("utf-8") => "a percent-encoded sequence that is not UTF-8",
        _ => "a syntax error",
    };
    format!(
        "app setting {setting} is not a PostgreSQL connection string ({what}); write a URI \
         (postgres://user:password@host:5432/db) or key=value pairs (host=... user=... password='...')"
    )
}

#[cfg(test)]
mod tests;
