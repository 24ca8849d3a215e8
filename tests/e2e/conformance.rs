//! The conformance suite (issue 31): every built-in type of PostgreSQL 15 a user might put in a table, with its
//! edge values ([`schema`]), through every path (cursor answer, host json, host text, logical stream, logical
//! SQL reader, PostgreSQL sink, stdout sink, webhook sink), in a database with PostgreSQL's defaults and in one
//! with hostile ones (`Asia/Kolkata`, `SQL, DMY`, `postgres_verbose`, `extra_float_digits 0`, `bytea_output
//! escape`). The oracle is PostgreSQL's own output ([`oracle`]): `row_to_json` in a canonical session, and the
//! sink's target read back. Paths the docs promise bytes for are compared byte for byte; host json and the
//! sink by value, where every difference must be one of the named, documented rules ([`differences`]), and
//! every rule must apply somewhere. docs/values.md is the table these tests prove.

mod differences;
mod oracle;
mod run;
mod schema;

use differences::*;
use run::Defaults;
use std::collections::BTreeMap;

/// How a path's cell may differ from the oracle's: `Ok(None)` equal, `Ok(Some(rule))` explained by a
/// documented rule, `Err` a finding.
type Explain = fn(&str, &str) -> Result<Option<&'static str>, String>;

/// A path that promises the oracle's bytes: no difference is explained.
fn exact(oracle: &str, got: &str) -> Result<Option<&'static str>, String> {
    if oracle == got {
        Ok(None)
    } else {
        Err(format!("oracle {}, got {}", oracle::preview(oracle), oracle::preview(got)))
    }
}

/// Compares a path's `(Operation, Item)`s with the oracle's Items by id: every row exactly once, every cell as
/// `explain` allows, and, where the path promises bytes (`bytes`), the Item's own bytes too.
fn compare_items(
    findings: &mut Findings,
    path: &str,
    oracle: &BTreeMap<i64, String>,
    got: &[(i64, String)],
    explain: Explain,
    bytes: bool,
) {
    let mut seen: BTreeMap<i64, usize> = BTreeMap::new();
    for (op, item) in got {
        let id = oracle::id_of(item);
        *seen.entry(id).or_default() += 1;
        if *op != 0 {
            findings.unexplained(format!("{path}: row {id} came as Operation {op}, not 0 (an insert)"));
        }
        compare_item(findings, path, id, oracle.get(&id).map(String::as_str), item, explain, bytes);
    }
    let expected: BTreeMap<i64, usize> = oracle.keys().map(|id| (*id, 1)).collect();
    if seen != expected {
        findings.unexplained(format!("{path}: rows delivered {seen:?}, expected each of {:?} once", oracle.keys()));
    }
}

/// One Item against the oracle's, cell by cell with `explain`; with `bytes`, an Item whose cells are all the
/// oracle's must be the oracle's bytes too (key order, spacing).
fn compare_item(
    findings: &mut Findings,
    path: &str,
    id: i64,
    oracle: Option<&str>,
    got: &str,
    explain: Explain,
    bytes: bool,
) {
    let Some(oracle) = oracle else {
        return findings.unexplained(format!("{path}: row {id} is not in the table"));
    };
    if oracle == got {
        return;
    }
    let (want, have) = (oracle::cells(oracle), oracle::cells(got));
    let columns: std::collections::BTreeSet<&String> = want.keys().chain(have.keys()).collect();
    let mut differing = 0;
    for column in columns {
        let verdict = match (want.get(column), have.get(column)) {
            (Some(w), Some(h)) if w == h => continue,
            (Some(w), Some(h)) => explain(w, h),
            (w, h) => Err(format!("present in the oracle: {}, in the path: {}", w.is_some(), h.is_some())),
        };
        differing += 1;
        match verdict {
            Ok(Some(rule)) => findings.fired(rule),
            Ok(None) => {}
            Err(e) => findings.unexplained(format!("{path}: row {id} column {column}: {e}")),
        }
    }
    if bytes && differing == 0 {
        findings.unexplained(format!("{path}: row {id}: the same values, but not the oracle's bytes (order, spacing)"));
    }
}

/// The two losses of every JSON path, seen in the oracle's own Items (every byte path equals them): a json
/// `null` and SQL NULL are the same `null`, and an array's lower bound is gone.
async fn every_json_path_loses(findings: &mut Findings, url: &str, label: &str) {
    let canonical = oracle::canonical_session(url).await;
    let (items, texts) =
        (oracle::items(&canonical, "conf", &schema::columns(false)).await, oracle::texts(&canonical, "conf").await);
    let column = |name: &str| schema::names().iter().position(|n| *n == name).expect("a column of the schema");
    let (jsonb, array) = (column("jsonb"), column("int_array"));
    let cell = |id: &i64, name: &str| oracle::cells(&items[id]).remove(name).unwrap_or_default();
    let json_null = texts.iter().find(|(_, t)| t[jsonb].as_deref() == Some("null")).map(|(id, _)| *id);
    let sql_null = texts.iter().find(|(_, t)| t[jsonb].is_none()).map(|(id, _)| *id);
    match (json_null, sql_null) {
        (Some(a), Some(b)) if cell(&a, "jsonb") == "null" && cell(&b, "jsonb") == "null" => {
            findings.fired(JSON_NULL_IS_SQL_NULL)
        }
        other => findings.unexplained(format!("{label}: json null and SQL NULL of jsonb: rows {other:?} differ")),
    }
    for (id, t) in &texts {
        let Some((_, elements)) =
            t[array].as_deref().and_then(|a| a.strip_prefix('[')).and_then(|a| a.split_once("]={"))
        else {
            continue;
        };
        let unbounded = format!("[{}", elements.replace('}', "]"));
        if cell(id, "int_array") == unbounded {
            findings.fired(ARRAY_LOWER_BOUNDS_ARE_LOST);
        } else {
            findings.unexplained(format!("{label}: row {id} int_array {:?} is {}", t[array], cell(id, "int_array")));
        }
    }
}

#[tokio::test]
async fn the_cursor_answers_every_type_byte_for_byte_and_the_host_changes_only_what_the_docs_say() {
    let mut findings = Findings::default();
    let mut answers: Vec<BTreeMap<i64, String>> = Vec::new();
    for defaults in Defaults::BOTH {
        // GIVEN every type with its edge values, in a database with `defaults`
        let url = run::cursor_database(defaults).await;
        let oracle = run::oracle_items(&url).await;
        every_json_path_loses(&mut findings, &url, defaults.label()).await;

        // WHEN the cursor source answers the host with messageFormat json, then with text
        let json = run::cursor_through_the_host(&url, "json").await;
        let text = run::cursor_through_the_host(&url, "text").await;

        // THEN the answer's Items are the oracle's bytes
        let answered: Vec<(i64, String)> = json.answered.iter().map(|item| (0, item.clone())).collect();
        compare_items(&mut findings, &format!("cursor answer, {}", defaults.label()), &oracle, &answered, exact, true);
        answers.push(answered.iter().map(|(_, item)| (oracle::id_of(item), item.clone())).collect());
        // AND with text each message is the change's JSON exactly
        let path = format!("host text, {}", defaults.label());
        let messages: Vec<(i64, String)> = text.received.iter().map(|m| oracle::item_of(m)).collect();
        compare_items(&mut findings, &path, &oracle, &messages, exact, true);
        for (message, (_, item)) in text.received.iter().zip(&messages) {
            if *message != format!("{{\"Operation\":0,\"Item\":{item}}}") {
                findings.unexplained(format!(
                    "{path}: a message is not the change's compact JSON: {}",
                    oracle::preview(message)
                ));
            }
        }
        // AND with json the consumer reads each value as the oracle's, or changed by a documented rule
        let path = format!("host json, {}", defaults.label());
        let messages: Vec<(i64, String)> = json.received.iter().map(|m| oracle::item_of(m)).collect();
        compare_items(&mut findings, &path, &oracle, &messages, host_json_cell, false);
    }
    // AND of all the hostile database's settings only its TimeZone shows, in the values that carry an offset
    if let [default, hostile] = answers.as_slice() {
        for (id, item) in default {
            let (d, h) = (oracle::cells(item), oracle::cells(hostile.get(id).map_or("{}", String::as_str)));
            for (column, value) in &d {
                match h.get(column) {
                    Some(other) if other == value => {}
                    Some(_) if OFFSET_COLUMNS.contains(&column.as_str()) => findings.fired(ONLY_THE_TIME_ZONE_SHOWS),
                    other => findings.unexplained(format!(
                        "hostile database: row {id} column {column} is {:?}, {} in the default database",
                        other.map(|o| oracle::preview(o)),
                        oracle::preview(value)
                    )),
                }
            }
        }
    }
    findings.require(
        "cursor and host",
        &[
            ONLY_THE_TIME_ZONE_SHOWS,
            DECIMALS_BECOME_DOUBLES,
            OFFSETS_MOVE_TO_THE_HOSTS_ZONE,
            NESTED_JSON_IS_REWRITTEN,
            NEGATIVE_ZERO_LOSES_ITS_SIGN,
            STRINGS_ARE_ESCAPED_ANEW,
            JSON_NULL_IS_SQL_NULL,
            ARRAY_LOWER_BOUNDS_ARE_LOST,
        ],
    );
}

/// The logical source with `reader` over both databases, for a table of every type (Items built by PostgreSQL)
/// and one of the types the handler renders itself: every change's Item, in commit order, is the oracle's.
async fn logical_case(reader: &str) {
    let mut findings = Findings::default();
    for (defaults, handler_built) in Defaults::BOTH.into_iter().flat_map(|d| [(d, false), (d, true)]) {
        // GIVEN a slot on a database with `defaults`, WHEN every row is inserted and one updated (its 1 MB
        // values left alone), THEN each change is the oracle's Item of the row as written, byte for byte
        let run::LogicalRun { got, expected, log } = run::logical(defaults, reader, handler_built).await;
        let built = if handler_built { "handler-built types" } else { "every type" };
        let path = format!("logical {reader}, {built}, {}", defaults.label());
        // AND the stream built the handler-built table's Items itself and the other's by statement (the SQL
        // reader's choice for date and time columns is its own: docs/postgres.md, "Values"; the log names it)
        let here = log.contains("the Items of public.conf are built in the handler from the WAL's values");
        let by_statement = log.contains("the Items of public.conf are built by PostgreSQL, one statement per batch");
        let built_here = if reader == "stream" { handler_built } else { here };
        if here != built_here || here == by_statement {
            findings.unexplained(format!(
                "{path}: the log says Items built in the handler {here}, by statement {by_statement}"
            ));
        }
        if got.len() != expected.len() {
            findings.unexplained(format!("{path}: {} changes, expected {}", got.len(), expected.len()));
        }
        for ((op, item), (want_op, want)) in got.iter().zip(&expected) {
            let id = oracle::id_of(want);
            if op != want_op {
                findings.unexplained(format!("{path}: row {id}: Operation {op}, expected {want_op}"));
            }
            compare_item(&mut findings, &path, id, Some(want), item, exact, true);
        }
    }
    findings.require(&format!("logical {reader}"), &[]);
}

#[tokio::test]
async fn the_logical_stream_sends_every_type_as_the_oracle_byte_for_byte() {
    logical_case("stream").await;
}

#[tokio::test]
async fn the_logical_sql_reader_sends_every_type_as_the_oracle_byte_for_byte() {
    logical_case("sql").await;
}

#[tokio::test]
async fn the_postgres_sink_writes_every_type_back_as_the_source_holds_it_but_the_documented_losses() {
    let mut findings = Findings::default();
    for defaults in Defaults::BOTH {
        // GIVEN every type in a database with `defaults`, and an empty copy of the table
        let url = run::cursor_database(defaults).await;
        let canonical = oracle::canonical_session(&url).await;

        // WHEN the PostgreSQL sink mirrors it, one row per batch
        let (missing, log) = run::postgres_sink(&url, &canonical).await;

        // THEN every row reached the target
        let path = format!("postgres sink, {}", defaults.label());
        if !missing.is_empty() {
            findings.unexplained(format!("{path}: rows {missing:?} never reached the target; the log ends:\n{log}"));
        }
        // AND read back, each Item and each value's text is the source's, or differs by a documented rule
        let all = schema::columns(false);
        let (source, target) =
            (oracle::items(&canonical, "conf", &all).await, oracle::items(&canonical, "conf_copy", &all).await);
        let (source_texts, target_texts) =
            (oracle::texts(&canonical, "conf").await, oracle::texts(&canonical, "conf_copy").await);
        for (id, item) in &target {
            let (want, got) = (oracle::cells(&source[id]), oracle::cells(item));
            for (column, value) in &want {
                match sink_item_cell(value, got.get(column).map_or("", String::as_str)) {
                    Ok(Some(rule)) => findings.fired(rule),
                    Ok(None) => {}
                    Err(e) => findings.unexplained(format!("{path}: row {id} column {column} (Item): {e}")),
                }
            }
            for (i, column) in schema::COLUMNS.iter().enumerate() {
                let (s, t) = (source_texts[id][i].as_deref(), target_texts[id][i].as_deref());
                match sink_text_cell(column.ty, s, t) {
                    Ok(Some(rule)) => findings.fired(rule),
                    Ok(None) => {}
                    Err(e) => findings.unexplained(format!("{path}: row {id} column {} (text): {e}", column.name)),
                }
            }
        }
    }
    findings
        .require("postgres sink", &[JSON_OUTER_SPACES_ARE_TRIMMED, JSON_NULL_IS_SQL_NULL, ARRAY_LOWER_BOUNDS_ARE_LOST]);
}

#[tokio::test]
async fn the_stdout_and_webhook_sinks_send_every_type_as_the_oracle_byte_for_byte() {
    let mut findings = Findings::default();
    for defaults in Defaults::BOTH {
        // GIVEN every type in a database with `defaults`
        let url = run::cursor_database(defaults).await;
        let oracle = run::oracle_items(&url).await;

        // WHEN `handler run` drains it to stdout
        let stdout = run::stdout_sink(&url).await;

        // THEN stdout is one compact JSON line per change, whose Item is the oracle's bytes
        let path = format!("stdout, {}", defaults.label());
        let mut items = Vec::new();
        for (n, line) in stdout.lines().enumerate() {
            let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else {
                findings.unexplained(format!("{path}: line {} is not a JSON change: {}", n + 1, oracle::preview(line)));
                continue;
            };
            let (op, item) = oracle::item_of(line);
            let expected = format!(
                "{{\"function\":\"{}\",\"batch_id\":{},\"Operation\":{op},\"Item\":{item}}}",
                crate::common::FUNCTION,
                value["batch_id"]
            );
            if line != expected {
                findings.unexplained(format!(
                    "{path}: line {} is not the documented shape: {}",
                    n + 1,
                    oracle::preview(line)
                ));
            }
            items.push((op, item));
        }
        compare_items(&mut findings, &path, &oracle, &items, stdout_cell, true);

        // AND the webhook's bodies carry the same bytes
        let bodies = run::webhook_sink(&url).await;
        let webhook = run::webhook_items(&bodies);
        compare_items(&mut findings, &format!("webhook, {}", defaults.label()), &oracle, &webhook, exact, true);
    }
    findings.require("stdout and webhook", &[STDOUT_COMPACTS_JSON_VALUES]);
}
