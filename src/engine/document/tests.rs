//! The document's one rule, checked on the source tree: no field changes outside its own methods.

/// Fields of [`super::StateDoc`], and the calls that change a field in place.
const FIELDS: &[&str] = &[
    "schema",
    "function",
    "source",
    "fingerprint",
    "checkpoint",
    "in_flight",
    "lease",
    "paused",
    "halted",
    "next_batch_id",
    "counters",
    "quarantine",
    "retry_quarantined",
    "progress_at",
    "pace",
    "write_id",
    "updated_at",
    "updated_by",
    "lineage",
    "seeded",
    "backfill",
];
const MUTATORS: &[&str] = &["push", "insert", "remove", "retain", "take", "as_mut", "drain", "clear", "get_or_insert"];

/// Where `line` changes a field of a document (a receiver whose name ends in `doc`), if it does.
fn assignment(line: &str) -> Option<String> {
    let mut rest = line;
    while let Some(at) = rest.find("doc.") {
        let after = &rest[at + 4..];
        let field: String = after.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        let mut tail = &after[field.len()..];
        // A chain of fields (`doc.lease.token`, `doc.counters.batches`) still assigns into the document.
        while let Some(next) = tail.strip_prefix('.') {
            let name: String = next.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if next[name.len()..].starts_with('(') {
                if MUTATORS.contains(&name.as_str()) && FIELDS.contains(&field.as_str()) {
                    return Some(format!("doc.{field}...{name}()"));
                }
                break;
            }
            tail = &next[name.len()..];
        }
        let op = tail.trim_start();
        let assigns = (op.starts_with('=') && !op.starts_with("==")) || op.starts_with("+=") || op.starts_with("-=");
        if assigns && FIELDS.contains(&field.as_str()) {
            return Some(format!("doc.{field} {}", &op[..2.min(op.len())]));
        }
        rest = after;
    }
    None
}

fn visit(dir: &std::path::Path, found: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).expect("src is readable") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            visit(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs")
            && !path.ends_with("engine/document/mod.rs")
            && !path.ends_with("engine/document/tests.rs")
        {
            let text = std::fs::read_to_string(&path).expect("a source file");
            for (n, line) in text.lines().enumerate() {
                if let Some(what) = assignment(line) {
                    found.push(format!("{}:{}: {what}", path.display(), n + 1));
                }
            }
        }
    }
}

#[test]
fn the_scan_sees_assignments_chains_and_in_place_changes_but_not_reads() {
    assert!(assignment("    doc.paused = true;").is_some());
    assert!(assignment("tick.doc.counters.takeovers += 1;").is_some());
    assert!(assignment("if let Some(l) = doc.lease.as_mut() {").is_some());
    assert!(assignment("doc.retry_quarantined.push(id);").is_some());
    assert!(assignment("if doc.paused == true {").is_none());
    assert!(assignment("let c = doc.checkpoint.clone();").is_none());
    assert!(assignment("doc.in_flight.as_ref().map(|f| f.range.rows)").is_none());
}

#[test]
fn a_document_changes_only_through_its_own_methods() {
    let mut found = Vec::new();
    visit(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut found);
    assert!(
        found.is_empty(),
        "state document fields changed outside engine/document/mod.rs (add a transition there):\n{}",
        found.join("\n")
    );
}

/// Found by the state-document fuzz target (fuzz/corpus/state_document/regression-float-position-*): a
/// position holding a number beyond f64's precision read as a float that changed through every write and read.
/// No source writes one, so it is refused by name.
#[test]
fn a_position_holding_a_fractional_or_huge_number_is_refused_by_name() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/state_document");
    let state = std::fs::read(dir.join("regression-float-position-state")).expect("corpus file");
    let e = super::read(&state).expect_err("refused");
    assert!(e.contains("field `checkpoint` holds the number"), "{e}");
    let quarantine = std::fs::read(dir.join("regression-float-position-quarantine")).expect("corpus file");
    let e = super::QuarantineDoc::read(&quarantine).expect_err("refused");
    assert!(e.contains("field `from` holds the number"), "{e}");
}
