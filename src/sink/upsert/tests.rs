//! The output binding's rules, case by case (`super::plan`).

use super::*;

/// `orders(id bigint PK, name text NOT NULL, "order" int NULL, note text NULL DEFAULT 'x')`.
fn shape() -> TableShape {
    let mut id = Column::plain("id", "bigint");
    id.nullable = false;
    let mut name = Column::plain("name", "text");
    name.nullable = false;
    let mut note = Column::plain("note", "text");
    note.has_default = true;
    TableShape {
        table: TableName::parse("public.orders").expect("valid"),
        columns: vec![id, name, Column::plain("order", "integer"), note],
        key: vec![0],
    }
}

fn change(op: Operation, item: &str) -> Change {
    Change::from_json(op, item.to_string()).expect("json")
}

#[test]
fn the_last_change_of_a_key_wins_and_deletes_are_kept_apart() {
    // GIVEN an insert, an update of the same key, a delete of another, and a delete then re-insert
    let changes = vec![
        change(Operation::Insert, r#"{"id":1,"name":"a"}"#),
        change(Operation::Delete, r#"{"id":2}"#),
        change(Operation::Update, r#"{"id":1,"name":"b"}"#),
        change(Operation::Delete, r#"{"id":3}"#),
        change(Operation::Insert, r#"{"id":3,"name":"c"}"#),
    ];
    // WHEN planned
    let p = plan(&shape(), &changes).expect("valid batch");
    // THEN one row per key survives, the last of each
    assert_eq!(p.deletes, vec![r#"{"id":2}"#]);
    assert_eq!(p.groups.len(), 1);
    assert_eq!(p.groups[0].rows, vec![r#"{"id":1,"name":"b"}"#, r#"{"id":3,"name":"c"}"#]);
    assert_eq!(p.superseded, 2);
    assert_eq!(p.rows(), 3);
}

#[test]
fn rows_carrying_different_columns_go_to_different_statements() {
    let changes = vec![
        change(Operation::Insert, r#"{"id":1,"name":"a"}"#),
        change(Operation::Insert, r#"{"name":"b","id":2,"order":7}"#),
        change(Operation::Insert, r#"{"id":3,"name":"c"}"#),
    ];
    let p = plan(&shape(), &changes).expect("valid batch");
    let groups: Vec<(Vec<usize>, usize)> = p.groups.iter().map(|g| (g.columns.clone(), g.rows.len())).collect();
    assert_eq!(groups, vec![(vec![0, 1], 2), (vec![0, 1, 2], 1)]);
}

#[test]
fn an_extra_property_is_an_error_naming_it_with_a_case_hint() {
    let changes = vec![change(Operation::Insert, r#"{"id":1,"Name":"secret value"}"#)];
    let e = plan(&shape(), &changes).unwrap_err();
    assert!(e.contains("property \"Name\" of change 0 is not a column of public.orders"), "{e}");
    assert!(e.contains("did you mean \"name\""), "{e}");
    assert!(!e.contains("secret value"), "errors never quote values: {e}");
}

#[test]
fn a_missing_not_null_column_without_default_is_an_error_and_nullable_or_default_ones_are_not() {
    let e = plan(&shape(), &[change(Operation::Insert, r#"{"id":1}"#)]).unwrap_err();
    assert!(e.contains("lacks column \"name\""), "{e}");
    assert!(plan(&shape(), &[change(Operation::Insert, r#"{"id":1,"name":"a"}"#)]).is_ok());
}

#[test]
fn a_missing_plain_key_is_an_error_but_a_missing_identity_or_default_key_is_a_plain_insert() {
    let e = plan(&shape(), &[change(Operation::Insert, r#"{"name":"a"}"#)]).unwrap_err();
    assert!(e.contains("lacks primary key column \"id\""), "{e}");
    for (identity, has_default) in [(true, false), (false, true)] {
        let mut s = shape();
        s.columns[0].identity = identity;
        s.columns[0].has_default = has_default;
        let changes = vec![change(Operation::Insert, r#"{"name":"a"}"#), change(Operation::Insert, r#"{"name":"a"}"#)];
        let p = plan(&s, &changes).expect("plain inserts");
        assert_eq!(p.groups.len(), 1);
        assert!(!p.groups[0].keyed);
        // Without a key nothing can be de-duplicated: both rows are inserted.
        assert_eq!(p.groups[0].rows.len(), 2);
        // And with the key present the same table upserts.
        let keyed = [change(Operation::Insert, r#"{"id":5,"name":"a"}"#)];
        assert!(plan(&s, &keyed).expect("upsert").groups[0].keyed);
    }
}

#[test]
fn a_delete_must_carry_the_whole_key() {
    let e = plan(&shape(), &[change(Operation::Delete, r#"{"name":"a"}"#)]).unwrap_err();
    assert!(e.contains("delete in change 0 lacks primary key column \"id\""), "{e}");
}

#[test]
fn reserved_and_unicode_column_names_match_exactly_and_escaped_names_are_read() {
    let mut s = shape();
    s.columns.push(Column::plain("Ünïcode Col", "text"));
    let changes = vec![change(Operation::Insert, r#"{"id":1,"name":"a","order":2,"\u00dcn\u00efcode Col":"x"}"#)];
    let p = plan(&s, &changes).expect("valid");
    assert_eq!(p.groups[0].columns, vec![0, 1, 2, 4]);
}

#[test]
fn nested_json_is_refused_for_a_column_that_cannot_hold_it_and_kept_for_one_that_can() {
    // GIVEN "order" cannot hold nested JSON (SQL Server would read it as NULL), "note" can
    let mut s = shape();
    s.columns[2].holds_json = false;
    // WHEN an object or an array arrives for each
    for nested in [r#"{"a":1}"#, "[1,2]"] {
        let e =
            plan(&s, &[change(Operation::Insert, &format!(r#"{{"id":1,"name":"a","order":{nested}}}"#))]).unwrap_err();
        // THEN it is refused naming the column and its type, without quoting the value
        assert!(e.contains(r#"property "order" of change 0 holds a JSON object or array, which column "order" of public.orders (integer) cannot hold"#), "{e}");
        assert!(!e.contains(nested), "{e}");
        let kept = format!(r#"{{"id":1,"name":"a","order":null,"note":{nested}}}"#);
        assert_eq!(plan(&s, &[change(Operation::Insert, &kept)]).expect("valid").groups[0].rows, vec![kept.as_str()]);
    }
    // AND a delete, which reads only the key, ignores what else its item carries
    assert!(plan(&s, &[change(Operation::Delete, r#"{"id":1,"order":{"a":1}}"#)]).is_ok());
}

#[test]
fn escaped_property_names_are_spelled_plainly_and_values_are_left_as_written() {
    // GIVEN a column named with a slash, as FOR JSON writes it (`\/`), and a value with escapes and digits
    let mut s = shape();
    s.columns.push(Column::plain("a/b", "text"));
    let item = r#"{"id":1,"name":"x\/y \u00e9","a\/b":1.50000000000000000001}"#;
    // WHEN planned
    let changes = [change(Operation::Insert, item)];
    let p = plan(&s, &changes).expect("valid");
    // THEN the name is spelled plainly, the values exactly as they came
    assert_eq!(p.groups[0].rows, vec![r#"{"id":1,"name":"x\/y \u00e9","a/b":1.50000000000000000001}"#]);
    assert_eq!(p.groups[0].columns, vec![0, 1, 4]);
    // AND an item whose names carry no escape is passed on as the very same text, as is a delete's
    let plain = r#"{"id":2, "name" : "q\/r"}"#;
    let changes = [change(Operation::Insert, plain)];
    let p = plan(&s, &changes).expect("valid");
    assert!(matches!(&p.groups[0].rows[0], Cow::Borrowed(t) if *t == plain), "{:?}", p.groups[0].rows[0]);
    let changes = [change(Operation::Delete, r#"{"\u0069d":3}"#)];
    let deleted = plan(&s, &changes).expect("valid");
    assert_eq!(deleted.deletes, vec![r#"{"id":3}"#]);
}

#[test]
fn json_values_travel_apart_as_their_own_text_and_u0000_is_refused_where_it_cannot_be_stored() {
    // GIVEN "note" is a json column (PostgreSQL's: it takes the value's own text) and "name" a text one
    let mut s = shape();
    s.columns[3].raw_json = true;
    s.columns[1].holds_nul = false;
    // WHEN rows carry json values, one holding \u0000, and one leaves it out as JSON null
    let changes = [
        change(Operation::Insert, r#"{"id":1,"name":"a","note":{"x":"\u0000", "n": 1.50}}"#),
        change(Operation::Insert, r#"{"note":null,"id":2,"name":"b"}"#),
    ];
    let p = plan(&s, &changes).expect("valid");
    // THEN the rows' text leaves the json column out, and its values follow apart, exactly as written
    assert_eq!(p.groups[0].rows, vec![r#"{"id":1,"name":"a"}"#, r#"{"id":2,"name":"b"}"#]);
    assert_eq!(p.groups[0].raw, vec![(3, vec![Some(r#"{"x":"\u0000", "n": 1.50}"#), None])]);
    // AND \u0000 for a column that cannot store it is refused naming property, column and type, but an
    // escaped backslash before "u0000" is not the character
    let e = plan(&s, &[change(Operation::Insert, r#"{"id":1,"name":"x\u0000"}"#)]).unwrap_err();
    assert!(e.contains(r#"property "name" of change 0 holds a JSON string with the character U+0000 (\u0000), which column "name" of public.orders (text) cannot store"#), "{e}");
    assert!(plan(&s, &[change(Operation::Insert, r#"{"id":1,"name":"x\\u0000"}"#)]).is_ok());
}

#[test]
fn a_delete_is_sent_cut_to_its_key_whatever_else_its_item_holds() {
    // GIVEN a delete whose item carries the whole row, one value holding \u0000
    let changes = [change(Operation::Delete, r#"{"name":"\u0000","id":3,"order":{"a":1}}"#)];
    // WHEN planned, THEN the delete's item holds the key alone
    assert_eq!(plan(&shape(), &changes).expect("valid").deletes, vec![r#"{"id":3}"#]);
}

#[test]
fn a_generated_column_cannot_be_written_and_non_objects_are_refused() {
    let mut s = shape();
    s.columns[2].generated = true;
    let e = plan(&s, &[change(Operation::Insert, r#"{"id":1,"name":"a","order":2}"#)]).unwrap_err();
    assert!(
        e.contains(
            "property \"order\" of change 0 is column \"order\" of public.orders, which is computed or generated"
        ),
        "{e}"
    );
    let e = plan(&s, &[change(Operation::Insert, "[1,2]")]).unwrap_err();
    assert!(e.contains("not a JSON object"), "{e}");
}
