//! The checks the fuzz targets run (fuzz/, docs/fuzzing.md), here so that the fuzzer and the corpus replay test
//! (tests/fuzz_corpora.rs) run the very same code. Each takes arbitrary bytes, feeds them to one decoder of
//! untrusted input, and panics when the decoder panics or breaks a property it promises: a decoded request
//! re-encodes to the same meaning, a document that reads back re-serializes and reads back equal, no error or
//! `Debug` output holds a part of a secret.
//!
//! Not an API: nothing here is stable, and only the fuzz targets and their replay test call it.

use crate::config::{AppConfig, Env, RetryPolicy, Secret};
use crate::engine::document::{QuarantineDoc, StateDoc};
use crate::protocol::{Attempt, InvocationRequest};
use crate::source::postgres_logical::pgoutput::{self, Message, OldKind, Value as PgValue};
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::time::Duration;

/// One fuzz target: its name (the folder of its corpus, fuzz/corpus/<name>) and its check.
pub type Target = (&'static str, fn(&[u8]));

/// Every target, for the replay test and scripts/fuzz.
pub const TARGETS: &[Target] = &[
    ("invocation", invocation),
    ("pgoutput", pgoutput),
    ("postgres_connection_string", postgres_connection_string),
    ("mssql_connection_string", mssql_connection_string),
    ("storage_connection_string", storage_connection_string),
    ("ncrontab", ncrontab),
    ("function_config", function_config),
    ("state_document", state_document),
];

/// Characters no message template of this crate holds: a token made with one of them that shows up in a
/// message came from the input. Tokens without one (`host`, `Password`) may be words of the message itself.
fn distinctive(token: &str) -> bool {
    token.chars().count() >= 4
        && token.chars().any(|c| matches!(c, '~' | '!' | '^' | '*' | '|' | '<' | '>') || !c.is_ascii())
}

/// The distinctive tokens of `text`, split where connection-string syntax splits.
fn tokens(text: &str) -> Vec<&str> {
    text.split(|c: char| {
        c.is_whitespace()
            || matches!(
                c,
                '=' | ';'
                    | '&'
                    | '?'
                    | '/'
                    | ':'
                    | '@'
                    | '\''
                    | '"'
                    | ','
                    | '{'
                    | '}'
                    | '\\'
                    | '%'
                    | '('
                    | ')'
                    | '['
                    | ']'
            )
    })
    .filter(|t| distinctive(t))
    .collect()
}

/// Panics when `output` holds one of `secrets`' distinctive tokens. A token that `input` holds more than once
/// is skipped: the output may quote it from another place of the input, where it is no secret (a host name).
fn assert_no_secret(what: &str, output: &str, secrets: &[&str], input: &str) {
    for secret in secrets {
        for token in tokens(secret).into_iter().filter(|t| input.matches(t).count() == 1) {
            assert!(!output.contains(token), "{what} holds {token:?}, part of a secret:\n{output}");
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The host's invocation
// ---------------------------------------------------------------------------------------------------------------

/// The invocation decoder (`server::host_attempt`): the first line is the `X-Azure-Functions-InvocationId`
/// header (absent when the line is empty), its first byte picking the function's retry policy; the rest is the
/// body. An attempt it accepts must re-encode, as the host would send it, to the same attempt.
pub fn invocation(data: &[u8]) {
    let (line, body) = match data.iter().position(|b| *b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    let policy = match line.first().map(|b| b % 4) {
        Some(0) | None => None,
        Some(1) => Some(RetryPolicy::fixed(-1, Duration::from_secs(1))),
        Some(2) => Some(RetryPolicy::fixed(0, Duration::from_secs(1))),
        Some(_) => Some(RetryPolicy::fixed(5, Duration::from_secs(1))),
    };
    let header = line.get(1..).and_then(|h| std::str::from_utf8(h).ok()).filter(|h| !h.is_empty());
    if let Ok(text) = std::str::from_utf8(body) {
        host_date(text.trim());
    }
    let attempt = match crate::server::host_attempt("timer", policy.as_ref(), header, body) {
        Ok(attempt) => attempt,
        Err(malformed) => {
            assert!(!malformed.0.is_empty(), "a refusal without a message");
            return;
        }
    };
    let id = uuid::Uuid::parse_str(&attempt.id).expect("an accepted id is a GUID");
    assert_eq!(attempt.id, id.hyphenated().to_string(), "ids are kept in one spelling");
    if body.iter().all(u8::is_ascii_whitespace) {
        assert_eq!(attempt.retry, None, "a manual run names no failure");
        return;
    }
    let retry = attempt.retry.as_ref();
    assert_eq!(retry.map(|r| r.max_retry_count), policy.as_ref().map(|p| p.max_retry_count), "the policy's count");
    if let Some(r) = retry {
        assert!(r.retry_count >= 0 && (r.max_retry_count < 0 || r.retry_count <= r.max_retry_count), "{r:?}");
        assert!(r.failed_invocation.is_none() || r.is_retry(), "a first attempt names a failure: {r:?}");
    }
    // Re-encoded as the host sends it, the attempt decodes to itself.
    let again =
        crate::server::host_attempt("timer", policy.as_ref(), Some(&attempt.id.to_uppercase()), &host_body(&attempt))
            .unwrap_or_else(|e| panic!("{attempt:?} re-encoded is refused: {e}"));
    assert_eq!(again, attempt, "re-encoded, the attempt decodes differently");
    // And the body decodes alike on its own.
    let request = InvocationRequest::decode(body).expect("decoded once, decodes again");
    assert_eq!(request.retry, attempt.retry);
}

/// The body the host sends for `attempt` (see `protocol`'s module docs).
fn host_body(attempt: &Attempt) -> Vec<u8> {
    let mut metadata = Map::new();
    metadata.insert("sys".into(), json!({ "MethodName": "F", "UtcNow": "2026-11-22T02:50:00.0123456Z" }));
    if let Some(retry) = &attempt.retry {
        let exception = match (&retry.failed_invocation, retry.is_retry()) {
            (Some(id), _) => json!({ "InstanceId": id.to_uppercase(), "ClassName": "FunctionInvocationException" }),
            (None, true) => json!({ "InstanceId": null }),
            (None, false) => Value::Null,
        };
        metadata.insert(
            "RetryContext".into(),
            json!({ "RetryCount": retry.retry_count, "MaxRetryCount": retry.max_retry_count, "Exception": exception }),
        );
    }
    let body = json!({ "Data": { "timer": { "IsPastDue": false, "ScheduleStatus": null } }, "Metadata": metadata });
    serde_json::to_vec(&body).expect("JSON")
}

/// A date the host writes reads back, written with every digit, as the same instant.
fn host_date(text: &str) {
    let Some(date) = crate::protocol::parse_host_date(text) else { return };
    let offset = date.offset();
    let (h, m, _) = offset.as_hms();
    let written = format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:09}{}{:02}:{:02}",
        date.year(),
        u8::from(date.month()),
        date.day(),
        date.hour(),
        date.minute(),
        date.second(),
        date.nanosecond(),
        if offset.is_negative() { '-' } else { '+' },
        h.unsigned_abs(),
        m.unsigned_abs()
    );
    assert_eq!(crate::protocol::parse_host_date(&written), Some(date), "{text:?} written as {written:?}");
}

// ---------------------------------------------------------------------------------------------------------------
// pgoutput
// ---------------------------------------------------------------------------------------------------------------

/// The pgoutput decoder: a message it decodes, encoded again as PostgreSQL's `proto.c` writes it, decodes to the
/// same message.
pub fn pgoutput(data: &[u8]) {
    let Ok(message) = pgoutput::decode(data) else { return };
    let bytes = encode_pgoutput(&message);
    assert_eq!(pgoutput::decode(&bytes).as_ref(), Ok(&message), "re-encoded as {bytes:?}");
}

fn encode_pgoutput(message: &Message) -> Vec<u8> {
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend(s.as_bytes());
        out.push(0);
    }
    fn tuple(out: &mut Vec<u8>, values: &[PgValue]) {
        out.extend(u16::try_from(values.len()).expect("at most u16 columns decode").to_be_bytes());
        for value in values {
            match value {
                PgValue::Null => out.push(b'n'),
                PgValue::Unchanged => out.push(b'u'),
                PgValue::Text(text) => {
                    out.push(b't');
                    out.extend(i32::try_from(text.len()).expect("decoded lengths fit").to_be_bytes());
                    out.extend(text.as_bytes());
                }
            }
        }
    }
    fn old(out: &mut Vec<u8>, (kind, values): &(OldKind, Vec<PgValue>)) {
        out.push(match kind {
            OldKind::Key => b'K',
            OldKind::Row => b'O',
        });
        tuple(out, values);
    }
    let mut out = Vec::new();
    match message {
        Message::Begin { final_lsn, commit_time, xid } => {
            out.push(b'B');
            out.extend(final_lsn.0.to_be_bytes());
            out.extend(commit_time.to_be_bytes());
            out.extend(xid.to_be_bytes());
        }
        Message::Commit { commit_lsn, end_lsn, commit_time } => {
            out.extend([b'C', 0]);
            out.extend(commit_lsn.0.to_be_bytes());
            out.extend(end_lsn.0.to_be_bytes());
            out.extend(commit_time.to_be_bytes());
        }
        Message::Relation(relation) => {
            out.push(b'R');
            out.extend(relation.id.to_be_bytes());
            string(&mut out, &relation.namespace);
            string(&mut out, &relation.name);
            out.push(relation.replica_identity);
            out.extend(u16::try_from(relation.columns.len()).expect("at most u16 columns decode").to_be_bytes());
            for column in &relation.columns {
                out.push(u8::from(column.key));
                string(&mut out, &column.name);
                out.extend(column.type_oid.to_be_bytes());
                out.extend(column.type_modifier.to_be_bytes());
            }
        }
        Message::Insert { relation, new } => {
            out.push(b'I');
            out.extend(relation.to_be_bytes());
            out.push(b'N');
            tuple(&mut out, new);
        }
        Message::Update { relation, old: before, new } => {
            out.push(b'U');
            out.extend(relation.to_be_bytes());
            if let Some(before) = before {
                old(&mut out, before);
            }
            out.push(b'N');
            tuple(&mut out, new);
        }
        Message::Delete { relation, old: before } => {
            out.push(b'D');
            out.extend(relation.to_be_bytes());
            old(&mut out, before);
        }
        Message::Truncate { relations, cascade, restart_identity } => {
            out.push(b'T');
            out.extend(u32::try_from(relations.len()).expect("at most u32 relations decode").to_be_bytes());
            out.push(u8::from(*cascade) | (u8::from(*restart_identity) << 1));
            for relation in relations {
                out.extend(relation.to_be_bytes());
            }
        }
        Message::Other(kind) => out.push(*kind),
    }
    out
}

// ---------------------------------------------------------------------------------------------------------------
// Connection strings
// ---------------------------------------------------------------------------------------------------------------

/// The PostgreSQL connection string reader: no refusal holds any part of the string (option names of libpq's
/// own list aside, which hold no distinctive character), and a string it accepts shows no password in `Debug`.
pub fn postgres_connection_string(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match crate::db::postgres::connection_string::parse("Pg", text) {
        Err(message) => {
            assert!(message.contains("app setting Pg"), "the refusal does not name the setting: {message}");
            assert_no_secret("the refusal", &message, &[text], text);
        }
        Ok(config) => {
            let password = config.get_password().map(String::from_utf8_lossy).unwrap_or_default();
            assert_no_secret("Debug of the configuration", &format!("{config:?}"), &[&password], text);
        }
    }
}

/// The SQL Server (ADO.NET) connection string reader: neither a refusal nor the `Debug` of a string it accepts
/// holds the password.
pub fn mssql_connection_string(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let pairs = crate::db::mssql::connection_string::pairs(text);
    let passwords: Vec<&str> =
        pairs.iter().filter(|(k, _)| k == "password" || k == "pwd").map(|(_, v)| v.as_str()).collect();
    match crate::db::mssql::Settings::parse("Sql", &Secret::new(text)) {
        Err(message) => {
            assert!(message.contains("app setting Sql"), "the refusal does not name the setting: {message}");
            assert_no_secret("the refusal", &message, &passwords, text);
        }
        Ok(settings) => assert_no_secret("Debug of the settings", &format!("{settings:?}"), &passwords, text),
    }
}

/// The storage connection string reader and the SAS it carries: no refusal holds a value, `Debug` holds neither
/// the account key nor the signature, and an error that quotes a request URL, once masked, holds no signature.
pub fn storage_connection_string(data: &[u8]) {
    use crate::state::blob::connection_string::{ConnectionString, KeyAuth};
    let Ok(text) = std::str::from_utf8(data) else { return };
    let values: Vec<&str> = text.split(';').filter_map(|s| s.split_once('=')).map(|(_, v)| v.trim()).collect();
    match ConnectionString::parse(&Secret::new(text)) {
        Err(e) => assert_no_secret("the refusal", &e.to_string(), &values, text),
        Ok(cs) => {
            assert!(cs.blob_endpoint.query().is_none(), "the endpoint keeps a query: {}", cs.blob_endpoint);
            let secret = match &cs.auth {
                KeyAuth::SharedKey { key, .. } => key.expose().to_string(),
                KeyAuth::Sas(sas) => sas.expose().to_string(),
            };
            assert_no_secret("Debug of the connection string", &format!("{cs:?}"), &[&secret], text);
            if let KeyAuth::Sas(sas) = &cs.auth {
                sas_is_masked(&cs.blob_endpoint, sas);
            }
        }
    }
}

/// A transport error quotes the request URL, SAS and all; masked, it keeps no signature of the base64 (or
/// percent-encoded base64) alphabet a real signature has.
fn sas_is_masked(endpoint: &azure_core::http::Url, sas: &Secret) {
    let mut url = endpoint.clone();
    url.set_query(Some(sas.expose()));
    let quoted = format!("error sending request for url ({url})");
    let masked = crate::state::blob::redact_signature(&quoted);
    for signature in url.query().unwrap_or_default().split('&').filter_map(|p| p.strip_prefix("sig=")) {
        let base64 = signature.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=' | '%'));
        // A signature the URL holds elsewhere too ("sv=2025" and "sig=2025") may show there.
        if base64 && signature.len() >= 4 && quoted.matches(signature).count() == 1 {
            assert!(!masked.contains(signature), "signature {signature:?} survives masking: {masked}");
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// NCRONTAB
// ---------------------------------------------------------------------------------------------------------------

/// The timer schedule reader: a schedule it accepts answers, from any of a few base times, an occurrence after
/// the base time with none before it.
pub fn ncrontab(data: &[u8]) {
    use crate::config::ncrontab::Schedule;
    use time::macros::datetime;
    let Ok(text) = std::str::from_utf8(data) else { return };
    let schedule = match Schedule::parse(text) {
        Ok(schedule) => schedule,
        Err(message) => {
            assert!(message.contains("schedule"), "{message}");
            return;
        }
    };
    let end = time::PrimitiveDateTime::new(time::Date::MAX, time::Time::MIDNIGHT);
    for base in [datetime!(2026-11-25 10:00:03.7), datetime!(2028-02-28 23:59:59), datetime!(2026-12-31 23:59:59)] {
        let next = schedule.next_after(base);
        if next == end {
            continue; // a schedule that never fires (31 February) answers the end of time, as NCrontab does
        }
        if schedule == Schedule::Every(Duration::ZERO) {
            // A zero time span ("00:00:00", "00:000:0") parses, as the code means it to (firings_per_second
            // answers 0 for it); its next occurrence is its base time. Whether the host accepts it is open.
            assert_eq!(next, base);
            continue;
        }
        assert!(next > base, "{text:?}: after {base} comes {next}");
        if let Schedule::Cron(_) = schedule {
            assert_eq!(next.nanosecond(), 0, "{text:?}: occurrences are on whole seconds");
            let just_before = next - Duration::from_secs(1);
            if just_before > base {
                assert_eq!(schedule.next_after(just_before), next, "{text:?}: an occurrence was skipped after {base}");
            }
        }
    }
    if let Schedule::Every(every) = schedule {
        let pace = schedule.firings_per_second(datetime!(2026-11-25 10:00:00));
        assert!(pace.is_finite() && pace >= 0.0, "{text:?} ({every:?}): pace {pace}");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// A function folder's configuration
// ---------------------------------------------------------------------------------------------------------------

/// The secrets the configuration target always sets, none of which may appear in an error or in `Debug`.
const PG_SECRET: &str = "Pg~Secret~0451";
const SQL_SECRET: &str = "Sql~Secret~0452";
const STORAGE_KEY: &str = "U3RvcmFnZX5LZXl+MDQ1Mw==";
const ADMIN_SECRET: &str = "Admin~Key~0454";

/// The function-folder configuration: the input is function.json, sqltrigger.json, host.json and app settings
/// (`Name=value` lines), separated by 0xFF bytes (which UTF-8 text never holds); a part that is absent leaves
/// its file out. Loading either succeeds or lists problems that each name a setting or file, and neither the
/// problems nor the loaded configuration's `Debug` holds a secret.
pub fn function_config(data: &[u8]) {
    let mut parts = data.split(|b| *b == 0xFF);
    let (function_json, sqltrigger_json, host_json, settings) =
        (parts.next(), parts.next(), parts.next(), parts.next());
    let root = scratch_root();
    let dir = root.join("Orders");
    for (path, part) in [
        (dir.join("function.json"), function_json),
        (dir.join("sqltrigger.json"), sqltrigger_json),
        (root.join("host.json"), host_json),
    ] {
        match part {
            Some(bytes) => std::fs::write(&path, bytes).expect("the scratch folder is writable"),
            None => {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    let mut env: Vec<(String, String)> = vec![
        ("Pg".into(), format!("postgres://app:{PG_SECRET}@127.0.0.1:1/db")),
        ("Sql".into(), format!("Server=tcp:127.0.0.1,1;Database=d;User ID=u;Password={SQL_SECRET}")),
        (
            "AzureWebJobsStorage".into(),
            format!("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={STORAGE_KEY}"),
        ),
        ("Sql_Trigger_AdminKey".into(), ADMIN_SECRET.into()),
    ];
    if let Some(settings) = settings {
        for line in String::from_utf8_lossy(settings).lines() {
            if let Some((name, value)) = line.split_once('=') {
                env.push((name.to_string(), value.to_string()));
            }
        }
    }
    let env = Env::from_pairs(env);
    // Each secret, unless the input holds it too (then a message may quote it from where the input put it) or
    // overrides its setting.
    let checked: Vec<&str> = [
        ("Pg", PG_SECRET),
        ("Sql", SQL_SECRET),
        ("AzureWebJobsStorage", STORAGE_KEY),
        ("Sql_Trigger_AdminKey", ADMIN_SECRET),
    ]
    .into_iter()
    .filter(|(name, secret)| {
        env.get(name).is_some_and(|v| v.contains(secret)) && !data.windows(secret.len()).any(|w| w == secret.as_bytes())
    })
    .map(|(_, secret)| secret)
    .collect();
    match AppConfig::load_from(&root, env) {
        Err(errors) => {
            assert!(!errors.0.is_empty(), "a refusal without a problem");
            for e in &errors.0 {
                assert!(!e.setting.is_empty() && !e.problem.is_empty(), "{e:?}");
            }
            assert_no_secret_verbatim("the refusal", &errors.to_string(), &checked);
        }
        Ok(config) => {
            assert_no_secret_verbatim("Debug of the configuration", &format!("{config:?}"), &checked);
            for warning in &config.warnings {
                assert_no_secret_verbatim("a warning", &warning.to_string(), &checked);
            }
        }
    }
}

fn assert_no_secret_verbatim(what: &str, output: &str, secrets: &[&str]) {
    for secret in secrets {
        assert!(!output.contains(secret), "{what} holds the secret {secret:?}:\n{output}");
    }
}

/// A folder of this process's own for [`function_config`], with the function folder in it.
fn scratch_root() -> PathBuf {
    static ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("spt-fuzz-config-{}", std::process::id()));
        std::fs::create_dir_all(root.join("Orders")).expect("a scratch folder");
        root
    })
    .clone()
}

// ---------------------------------------------------------------------------------------------------------------
// State and quarantine documents
// ---------------------------------------------------------------------------------------------------------------

/// The state and quarantine document readers (`serde_json` into the document types, as a tick and the CLI read
/// them): a document that reads back re-serializes, and reads back equal.
pub fn state_document(data: &[u8]) {
    // The handler's own reader (`document::read`: types, then the checks that refuse a hand edit).
    if let Ok(doc) = crate::engine::document::read(data) {
        let bytes =
            serde_json::to_vec(&doc).unwrap_or_else(|e| panic!("a state document that reads cannot be written: {e}"));
        let again: StateDoc = crate::engine::document::read(&bytes).unwrap_or_else(|e| {
            panic!("a state document written cannot be read: {e}\n{}", String::from_utf8_lossy(&bytes))
        });
        assert_eq!(again, doc, "the state document changed through a write and a read");
    }
    if let Ok(doc) = QuarantineDoc::read(data) {
        let text =
            serde_json::to_string(&doc).unwrap_or_else(|e| panic!("a quarantine document cannot be written: {e}"));
        let again = QuarantineDoc::read(text.as_bytes())
            .unwrap_or_else(|e| panic!("a quarantine document written cannot be read: {e}\n{text}"));
        let again_text = serde_json::to_string(&again).expect("written once, written again");
        assert_eq!(again_text, text, "the quarantine document changed through a write and a read");
        let _ = doc.decode_changes();
    }
}
