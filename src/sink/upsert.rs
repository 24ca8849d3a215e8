//! The official SQL output binding's rules, independent of the dialect: which rows of a batch are deleted,
//! upserted or plainly inserted, and which batches are refused before any statement runs.
//!
//! The rules (Azure/azure-functions-sql-extension's output binding, kept so a function moving from it to
//! this sink keeps its behaviour):
//! - every property of an item must be a column of the table, matched exactly (column names are
//!   case-sensitive); an extra property is an error naming it;
//! - a NOT NULL column without a default that an item leaves out is an error (the insert could not work);
//! - an identity or default-valued primary-key column absent from an item makes that row a plain INSERT
//!   (the database assigns the key); present, the row is upserted on the primary key;
//! - several changes of one key in a batch are collapsed to the last one (upstream's MERGE fails on
//!   duplicate keys; keeping the last is what applying them in order would leave);
//! - deletes (Operation 2, whose item holds the primary key) delete by primary key, which the host's
//!   binding cannot do at all.
//!
//! Rows are grouped by the set of columns they carry, so a missing nullable column is left as it is on
//! update instead of being overwritten with NULL. Items are not re-serialized: the statements read the item
//! JSON text the source produced, so numerics keep every digit. Only an item whose property names are
//! written with escapes is rewritten, its names spelled plainly and its values left as they were (see
//! [`plain_names`]).

use crate::change::{Change, Operation};
use crate::ident::{Ident, TableName};
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

/// One column of the target table, as the catalog describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: Ident,
    /// The type as the dialect spells it in a column definition (`numeric(12,2)`, `nvarchar(100)`).
    pub sql_type: String,
    pub nullable: bool,
    pub has_default: bool,
    pub identity: bool,
    /// Computed or generated (or, SQL Server, of a type the sink cannot write): never written.
    pub generated: bool,
    /// Binary: items carry it as base64 text (as every source here sends it), decoded by the statement.
    pub binary: bool,
    /// A JSON object or array in an item can be written to this column: kept as its JSON text, converted by
    /// the database (PostgreSQL's json, jsonb and array columns), or refused by it with an error. False where
    /// the dialect's statement would read it as NULL (SQL Server reads one only into a character column),
    /// so `plan` refuses it, naming the column, instead of a NULL being stored silently.
    pub holds_json: bool,
    /// Takes the value's own JSON text, cast to the column by the statement (PostgreSQL's `json`), instead of
    /// a conversion that de-escapes it: `json_to_recordset` de-escapes every string of its input and cannot
    /// represent `\u0000` in text, so one such string anywhere failed the whole statement (SQLSTATE 22P05).
    /// [`plan`] leaves these values out of the row text and hands them over apart ([`RowGroup::raw`]).
    pub raw_json: bool,
    /// The column can hold a string with the character U+0000 (`\u0000`): every SQL Server column that takes
    /// a string; in PostgreSQL only `json` (text and jsonb cannot store it). Elsewhere [`plan`] refuses the
    /// value, naming the property, the column and its type, before any statement runs.
    pub holds_nul: bool,
    /// The column's collation, where the dialect names it in statements (SQL Server's character columns:
    /// a key is compared under its own collation); `None` elsewhere.
    pub collation: Option<String>,
}

/// The target table: its columns in table order and its primary key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableShape {
    pub table: TableName,
    pub columns: Vec<Column>,
    /// Indexes into `columns`, in key order. Never empty: a table without a primary key is refused at discovery.
    pub key: Vec<usize>,
}

impl TableShape {
    pub fn key_columns(&self) -> impl Iterator<Item = &Column> {
        self.key.iter().map(|&k| &self.columns[k])
    }
}

/// Rows of one batch that share a column set and a mode; one or more statements each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowGroup<'a> {
    /// The columns every row of the group carries, as indexes into the table's columns, in table order.
    pub columns: Vec<usize>,
    /// True: every key column is present, so rows are upserted on the primary key. False: an identity or
    /// default-valued key column is absent, so rows are inserted and the database assigns the key.
    pub keyed: bool,
    /// The items' JSON texts, in batch order, without the group's raw-JSON columns (see `raw`).
    pub rows: Vec<Cow<'a, str>>,
    /// The group's raw-JSON columns ([`Column::raw_json`]), each with its values' own JSON text per row, in the
    /// order of `rows` (`None` for a JSON null). Empty when the group has none (always, for SQL Server).
    pub raw: Vec<(usize, Vec<Option<&'a str>>)>,
}

/// What one batch does to the table, after the rules above.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WritePlan<'a> {
    /// Items of deletes cut to their key columns (all a delete reads), in batch order.
    pub deletes: Vec<Cow<'a, str>>,
    pub groups: Vec<RowGroup<'a>>,
    /// Changes dropped because a later change of the same key in the batch supersedes them.
    pub superseded: usize,
}

impl WritePlan<'_> {
    pub fn rows(&self) -> usize {
        self.deletes.len() + self.groups.iter().map(|g| g.rows.len()).sum::<usize>()
    }
}

/// Applies the rules to a batch. An error names the change, the property or column, and what to do; it
/// never quotes a row value.
pub fn plan<'a>(shape: &TableShape, changes: &'a [Change]) -> Result<WritePlan<'a>, String> {
    let by_name: HashMap<&str, usize> = shape.columns.iter().enumerate().map(|(i, c)| (c.name.as_str(), i)).collect();
    // Columns an inserted row cannot leave out.
    let required: Vec<usize> = (0..shape.columns.len())
        .filter(|&i| {
            let c = &shape.columns[i];
            !c.nullable && !c.has_default && !c.identity && !c.generated
        })
        .collect();

    enum Entry<'a> {
        Delete(Cow<'a, str>),
        Write { columns: Vec<usize>, keyed: bool, text: Cow<'a, str>, raw: Vec<Option<&'a str>> },
    }
    let mut entries: Vec<Option<Entry<'a>>> = Vec::with_capacity(changes.len());
    let mut last_of_key: HashMap<String, usize> = HashMap::with_capacity(changes.len());
    let mut superseded = 0;

    for (n, change) in changes.iter().enumerate() {
        let text = change.item.get();
        let Props(props) = serde_json::from_str(text)
            .map_err(|e| format!("the item of change {n} is not a JSON object ({e}); every item must be one row"))?;
        let mut columns = Vec::with_capacity(props.len());
        let mut values: Vec<Option<&RawValue>> = vec![None; shape.columns.len()];
        for (name, value) in &props {
            let Some(&i) = by_name.get(name.as_ref()) else {
                return Err(extra_property(shape, n, name));
            };
            if shape.columns[i].generated && change.operation != Operation::Delete {
                return Err(format!(
                    "property {:?} of change {n} is column {:?} of {}, which is computed or generated or of a type the sink cannot write ({}); leave it out of the items (\"columns\" in the source's sqltrigger.json)",
                    name.as_ref(),
                    shape.columns[i].name.as_str(),
                    shape.table,
                    shape.columns[i].sql_type
                ));
            }
            if change.operation != Operation::Delete
                && !shape.columns[i].holds_json
                && matches!(value.get().as_bytes().first(), Some(b'{' | b'['))
            {
                return Err(format!(
                    "property {:?} of change {n} holds a JSON object or array, which column {:?} of {} ({}) cannot hold; write it to a character column (which keeps its JSON text), or leave the property out of the items (\"columns\" in the source's sqltrigger.json)",
                    name.as_ref(),
                    shape.columns[i].name.as_str(),
                    shape.table,
                    shape.columns[i].sql_type
                ));
            }
            let read = change.operation != Operation::Delete || shape.key.contains(&i);
            if read && !shape.columns[i].holds_nul && holds_nul(value.get()) {
                return Err(format!(
                    "property {:?} of change {n} holds a JSON string with the character U+0000 (\\u0000), which column {:?} of {} ({}) cannot store; write it to a json column, or remove the character at the source",
                    name.as_ref(),
                    shape.columns[i].name.as_str(),
                    shape.table,
                    shape.columns[i].sql_type
                ));
            }
            columns.push(i);
            values[i] = Some(value);
        }
        columns.sort_unstable();
        columns.dedup();
        let missing_key: Vec<usize> = shape.key.iter().copied().filter(|&k| values[k].is_none()).collect();

        let entry = match change.operation {
            Operation::Delete => {
                if let Some(&k) = missing_key.first() {
                    return Err(format!(
                        "the delete in change {n} lacks primary key column {:?} of {}; a delete's item must hold the whole primary key",
                        shape.columns[k].name.as_str(),
                        shape.table
                    ));
                }
                let key: Vec<(Cow<'a, str>, &'a RawValue)> = props
                    .iter()
                    .filter(|(name, _)| by_name.get(name.as_ref()).is_some_and(|i| shape.key.contains(i)))
                    .cloned()
                    .collect();
                Entry::Delete(if key.len() == props.len() { plain_names(text, &props) } else { rebuild(&key) })
            }
            Operation::Insert | Operation::Update => {
                for &k in &missing_key {
                    let c = &shape.columns[k];
                    if !c.identity && !c.has_default {
                        return Err(format!(
                            "change {n} lacks primary key column {:?} of {}, which has no default and is not an identity; every item must carry the primary key (names are case-sensitive)",
                            c.name.as_str(),
                            shape.table
                        ));
                    }
                }
                if let Some(&c) = required.iter().find(|&&c| values[c].is_none()) {
                    return Err(format!(
                        "change {n} lacks column {:?} of {}, which is NOT NULL and has no default; add it to the items or give the column a default",
                        shape.columns[c].name.as_str(),
                        shape.table
                    ));
                }
                let raw: Vec<Option<&'a str>> = columns
                    .iter()
                    .filter(|&&i| shape.columns[i].raw_json)
                    .map(|&i| values[i].map(RawValue::get).filter(|v| *v != "null"))
                    .collect();
                let text = if raw.is_empty() {
                    plain_names(text, &props)
                } else {
                    let kept: Vec<(Cow<'a, str>, &'a RawValue)> = props
                        .iter()
                        .filter(|(name, _)| by_name.get(name.as_ref()).is_some_and(|&i| !shape.columns[i].raw_json))
                        .cloned()
                        .collect();
                    rebuild(&kept)
                };
                Entry::Write { columns, keyed: missing_key.is_empty(), text, raw }
            }
        };
        let keyed = matches!(entry, Entry::Delete(_) | Entry::Write { keyed: true, .. });
        if keyed {
            let key = key_text(shape, &values);
            if let Some(earlier) = last_of_key.insert(key, entries.len()) {
                entries[earlier] = None;
                superseded += 1;
            }
        }
        entries.push(Some(entry));
    }

    let mut plan = WritePlan { superseded, ..WritePlan::default() };
    let mut group_of: HashMap<(Vec<usize>, bool), usize> = HashMap::new();
    for entry in entries.into_iter().flatten() {
        match entry {
            Entry::Delete(text) => plan.deletes.push(text),
            Entry::Write { columns, keyed, text, raw } => {
                let next = plan.groups.len();
                let g = *group_of.entry((columns.clone(), keyed)).or_insert(next);
                if g == next {
                    let raw_columns = columns.iter().copied().filter(|&i| shape.columns[i].raw_json);
                    let raw = raw_columns.map(|i| (i, Vec::new())).collect();
                    plan.groups.push(RowGroup { columns, keyed, rows: Vec::new(), raw });
                }
                let group = &mut plan.groups[g];
                group.rows.push(text);
                for ((_, values), value) in group.raw.iter_mut().zip(raw) {
                    values.push(value);
                }
            }
        }
    }
    Ok(plan)
}

/// The item's text with its property names spelled plainly, each as [`serde_json`] writes a string (only
/// `"`, `\` and control characters escaped). Borrowed unchanged when no name carries an escape, as is usual
/// (a name without escapes is already spelled so); otherwise rebuilt from the names and the values' own text.
///
/// Why: a statement names a property in one spelling, and SQL Server's OPENJSON matches a path against a
/// name as it is written in the text, escapes included. `FOR JSON`, which the SQL Server sources build items
/// with, writes `/` as `\/` (in names too), so a column `a/b` arrives as `"a\/b"` and a path `$."a/b"` would
/// find nothing: the official output binding met this for names with `/` (Azure/azure-functions-sql-extension
/// issue 1026, fixed in PR 1042 by escaping every `/` of its own serializer's rows, which never escapes one).
fn plain_names<'a>(text: &'a str, props: &[(Cow<'a, str>, &'a RawValue)]) -> Cow<'a, str> {
    if props.iter().all(|(name, _)| matches!(name, Cow::Borrowed(_))) {
        return Cow::Borrowed(text);
    }
    rebuild(props)
}

/// An object of `props`, names spelled plainly and values as their own text (a delete's key, or a row
/// without its raw-JSON columns).
fn rebuild<'a>(props: &[(Cow<'a, str>, &'a RawValue)]) -> Cow<'a, str> {
    let mut plain = String::with_capacity(props.iter().map(|(n, v)| n.len() + v.get().len() + 4).sum::<usize>() + 2);
    plain.push('{');
    for (i, (name, value)) in props.iter().enumerate() {
        if i > 0 {
            plain.push(',');
        }
        plain.push_str(&serde_json::to_string(name.as_ref()).expect("a string serializes"));
        plain.push(':');
        plain.push_str(value.get());
    }
    plain.push('}');
    Cow::Owned(plain)
}

/// True when the JSON text holds the escape `\u0000` in a string (a valid JSON text holds a backslash only in a
/// string, each one starting an escape). Escapes are case-insensitive in hex: `\u0000` has no letter.
fn holds_nul(json: &str) -> bool {
    let bytes = json.as_bytes();
    let mut i = 0;
    while let Some(at) = bytes[i..].iter().position(|&b| b == b'\\') {
        let escape = i + at;
        if bytes.get(escape + 1..escape + 6) == Some(b"u0000".as_slice()) {
            return true;
        }
        i = escape + 2;
        if i >= bytes.len() {
            return false;
        }
    }
    false
}

/// The key's values as one string: the raw JSON of each key column, separated by a byte JSON never holds.
fn key_text(shape: &TableShape, values: &[Option<&RawValue>]) -> String {
    let mut key = String::new();
    for &k in &shape.key {
        key.push_str(values[k].map_or("null", |v| v.get()));
        key.push('\u{0}');
    }
    key
}

fn extra_property(shape: &TableShape, n: usize, name: &str) -> String {
    let hint = shape
        .columns
        .iter()
        .find(|c| c.name.as_str().eq_ignore_ascii_case(name))
        .map(|c| format!(" (column names are case-sensitive: did you mean {:?}?)", c.name.as_str()))
        .unwrap_or_default();
    format!(
        "property {name:?} of change {n} is not a column of {}{hint}; add the column, or leave the property out of the items (\"columns\" in the source's sqltrigger.json)",
        shape.table
    )
}

/// An item's properties, borrowed from its JSON text: names (owned only when escaped) and raw values.
struct Props<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de> Deserialize<'de> for Props<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Props<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut props = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some(Name(name)) = map.next_key()? {
                    props.push((name, map.next_value()?));
                }
                Ok(Props(props))
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(Deserialize)]
struct Name<'a>(#[serde(borrow)] Cow<'a, str>);

#[cfg(test)]
impl Column {
    /// A nullable column without a default, identity or generation: what tests build shapes from.
    pub(crate) fn plain(name: &str, sql_type: &str) -> Self {
        Self {
            name: Ident::new(name).expect("a valid column name"),
            sql_type: sql_type.into(),
            nullable: true,
            has_default: false,
            identity: false,
            generated: false,
            binary: false,
            holds_json: true,
            raw_json: false,
            holds_nul: true,
            collation: None,
        }
    }
}

#[cfg(test)]
mod tests {
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
            let changes =
                vec![change(Operation::Insert, r#"{"name":"a"}"#), change(Operation::Insert, r#"{"name":"a"}"#)];
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
            let e = plan(&s, &[change(Operation::Insert, &format!(r#"{{"id":1,"name":"a","order":{nested}}}"#))])
                .unwrap_err();
            // THEN it is refused naming the column and its type, without quoting the value
            assert!(e.contains(r#"property "order" of change 0 holds a JSON object or array, which column "order" of public.orders (integer) cannot hold"#), "{e}");
            assert!(!e.contains(nested), "{e}");
            let kept = format!(r#"{{"id":1,"name":"a","order":null,"note":{nested}}}"#);
            assert_eq!(
                plan(&s, &[change(Operation::Insert, &kept)]).expect("valid").groups[0].rows,
                vec![kept.as_str()]
            );
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
}
