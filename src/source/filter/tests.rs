//! The filter grammar's tests: what parses, what is refused and why, and how each source renders it.

use super::*;

fn pg(text: &str) -> (String, Vec<String>) {
    let filter = Filter::parse(text).expect("parses");
    let mut params = Vec::new();
    let sql =
        filter.to_pg(&|c| Some(if c.as_str() == "total" { "numeric".into() } else { "text".into() }), 2, &mut params);
    (sql, params)
}

#[test]
fn literals_are_bound_as_parameters_cast_to_the_columns_type() {
    let (sql, params) = pg("region = 'eu' AND total >= 100.5");
    assert_eq!(sql, "(t.\"region\" = ($3::text)::text AND t.\"total\" >= ($4::text)::numeric)");
    assert_eq!(params, ["eu", "100.5"]);
    let (sql, params) = pg("(a IS NULL OR \"Odd Name\" IS NOT NULL) and b not in ('x', 'y''s') Or c != -1e3");
    assert_eq!(
        sql,
        "(((t.\"a\" IS NULL OR t.\"Odd Name\" IS NOT NULL) AND t.\"b\" NOT IN (($3::text)::text, ($4::text)::text)) OR t.\"c\" <> ($5::text)::text)"
    );
    assert_eq!(params, ["x", "y's", "-1e3"]);
}

#[test]
fn an_injection_stays_a_value() {
    let (sql, params) = pg("region = 'x''; DROP TABLE orders; --'");
    assert_eq!(sql, "t.\"region\" = ($3::text)::text");
    assert_eq!(params, ["x'; DROP TABLE orders; --"]);
    assert!(Filter::parse("region = 'x'; DROP TABLE orders").unwrap_err().contains("';'"));
    assert!(Filter::parse("region = other_column").unwrap_err().contains("columns cannot be compared"));
    assert!(Filter::parse("lower(region) = 'x'").unwrap_err().contains("'('"));
}

#[test]
fn what_is_refused_is_named() {
    for (text, says) in [
        ("", "expected a column name but found the end"),
        ("a =", "expected a value"),
        ("a = NULL", "IS NULL"),
        ("a IS 'x'", "expected NULL after IS"),
        ("a IN 1", "expected '(' after IN"),
        ("a IN (1 2)", "expected ',' or ')'"),
        ("a = 1 b = 2", "unexpected \"b\""),
        ("(a = 1", "expected ')'"),
        ("and = 1", "keyword"),
        ("a = 'open", "not closed"),
        ("a ! 1", "'!'"),
        ("a = 1.2.3", "not a number"),
    ] {
        let e = Filter::parse(text).expect_err(text);
        assert!(e.contains(says), "{text}: {e}");
    }
    let many = vec!["a = 1"; MAX_TERMS + 1].join(" AND ");
    assert!(Filter::parse(&many).unwrap_err().contains("more than"));
    let deep = format!("{}a = 1{}", "(".repeat(20), ")".repeat(20));
    assert!(Filter::parse(&deep).unwrap_err().contains("deeper"));
}

#[test]
fn columns_are_checked_against_the_table() {
    let f = Filter::parse("region = 'eu' or Total > 1").expect("parses");
    let known = ["id", "region", "total"];
    let e = f.check_columns("public.orders", known.iter().copied()).unwrap_err();
    assert!(e.contains("\"Total\"") && e.contains("id, region, total"), "{e}");
    Filter::parse("region = 'eu'").expect("parses").check_columns("t", known.iter().copied()).expect("known");
}

#[test]
fn a_filter_prints_as_it_parses() {
    let f = Filter::parse("a = 'it''s' and (b in (1, 2) or c is not null)").expect("parses");
    assert_eq!(Filter::parse(&f.to_string()).expect("reparses"), f);
}
