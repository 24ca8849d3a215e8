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
    let rules = Rules::of(shape);
    let mut entries: Vec<Option<Entry<'a>>> = Vec::with_capacity(changes.len());
    let mut last_of_key: HashMap<String, usize> = HashMap::with_capacity(changes.len());
    let mut superseded = 0;
    for (n, change) in changes.iter().enumerate() {
        let (entry, key) = rules.entry(n, change)?;
        if let Some(key) = key {
            if let Some(earlier) = last_of_key.insert(key, entries.len()) {
                entries[earlier] = None;
                superseded += 1;
            }
        }
        entries.push(Some(entry));
    }
    Ok(rules.group(entries, superseded))
}

/// What one change does to the table, before changes superseded by a later one of the same key are dropped.
enum Entry<'a> {
    Delete(Cow<'a, str>),
    Write { columns: Vec<usize>, keyed: bool, text: Cow<'a, str>, raw: Vec<Option<&'a str>> },
}

/// The rules of one table, with what [`plan`] looks up for every change.
struct Rules<'s> {
    shape: &'s TableShape,
    by_name: HashMap<&'s str, usize>,
    /// Columns an inserted row cannot leave out.
    required: Vec<usize>,
}

impl<'s> Rules<'s> {
    fn of(shape: &'s TableShape) -> Self {
        let by_name: HashMap<&str, usize> =
            shape.columns.iter().enumerate().map(|(i, c)| (c.name.as_str(), i)).collect();
        let required: Vec<usize> = (0..shape.columns.len())
            .filter(|&i| {
                let c = &shape.columns[i];
                !c.nullable && !c.has_default && !c.identity && !c.generated
            })
            .collect();
        Self { shape, by_name, required }
    }

    /// Change `n` checked against the rules, as an entry, with its key's text when it has the whole key (a
    /// later change of the same key supersedes it).
    fn entry<'a>(&self, n: usize, change: &'a Change) -> Result<(Entry<'a>, Option<String>), String> {
        let (shape, by_name, required) = (self.shape, &self.by_name, &self.required);
        let text = change.item.get();
        let Props(props) = serde_json::from_str(text)
            .map_err(|e| format!("the item of change {n} is not a JSON object ({e}); every item must be one row"))?;
        let mut columns = Vec::with_capacity(props.len());
        let mut values: Vec<Option<&RawValue>> = vec![None; shape.columns.len()];
        for (name, value) in &props {
            let Some(&i) = by_name.get(name.as_ref()) else {
                return Err(extra_property(shape, n, name));
            };
            self.check_property(n, change, name, value, i)?;
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
                Entry::Delete(keeping(text, &props, by_name, |i| shape.key.contains(&i)))
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
                let text = keeping(text, &props, by_name, |i| !shape.columns[i].raw_json);
                Entry::Write { columns, keyed: missing_key.is_empty(), text, raw }
            }
        };
        let keyed = matches!(entry, Entry::Delete(_) | Entry::Write { keyed: true, .. });
        Ok((entry, keyed.then(|| key_text(shape, &values))))
    }

    /// A property of change `n` that names column `i`: a value the column can take (not a computed column, a
    /// JSON object or array only where it keeps one, U+0000 only where it can be stored).
    fn check_property(&self, n: usize, change: &Change, name: &str, value: &RawValue, i: usize) -> Result<(), String> {
        let shape = self.shape;
        if shape.columns[i].generated && change.operation != Operation::Delete {
            return Err(format!(
                "property {:?} of change {n} is column {:?} of {}, which is computed or generated or of a type the sink cannot write ({}); leave it out of the items (\"columns\" in the source's sqltrigger.json)",
                name,
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
                name,
                shape.columns[i].name.as_str(),
                shape.table,
                shape.columns[i].sql_type
            ));
        }
        let read = change.operation != Operation::Delete || shape.key.contains(&i);
        if read && !shape.columns[i].holds_nul && holds_nul(value.get()) {
            return Err(format!(
                "property {:?} of change {n} holds a JSON string with the character U+0000 (\\u0000), which column {:?} of {} ({}) cannot store; write it to a json column, or remove the character at the source",
                name,
                shape.columns[i].name.as_str(),
                shape.table,
                shape.columns[i].sql_type
            ));
        }
        Ok(())
    }

    /// The surviving entries as the plan: deletes apart, writes grouped by column set and mode in the order
    /// each group first appears.
    fn group<'a>(&self, entries: Vec<Option<Entry<'a>>>, superseded: usize) -> WritePlan<'a> {
        let shape = self.shape;
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
        plan
    }
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

/// The item with only the properties whose column (index into the table's, by `by_name`) `keep` accepts: a
/// delete's key, a row without its raw-JSON columns. [`plain_names`] of the item when it keeps them all.
fn keeping<'a>(
    text: &'a str,
    props: &[(Cow<'a, str>, &'a RawValue)],
    by_name: &HashMap<&str, usize>,
    keep: impl Fn(usize) -> bool,
) -> Cow<'a, str> {
    let kept: Vec<(Cow<'a, str>, &'a RawValue)> =
        props.iter().filter(|(name, _)| by_name.get(name.as_ref()).is_some_and(|&i| keep(i))).cloned().collect();
    if kept.len() == props.len() {
        plain_names(text, props)
    } else {
        rebuild(&kept)
    }
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
mod tests;
