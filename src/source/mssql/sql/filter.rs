//! A backfill's `--where` filter (`source::filter`) in T-SQL: column names bracket-quoted through
//! [`Ident::mssql`] and checked against the table, every literal a parameter (`Slot::Filter(i)`, bound as
//! text) converted to its column's type on the server (`SqlType::literal_type`), the operators the grammar has
//! and nothing else.
//!
//! Checked once, when the backfill starts ([`MssqlFilter::new`]): a column the table does not have, or one whose
//! type cannot be compared with a value (`xml`, `text`, `image`, CLR types), is refused there with what would
//! work, so rendering a chunk's statement cannot fail.

use super::{Params, Slot};
use crate::ident::Ident;
use crate::source::filter::{Filter, Literal};
use crate::source::mssql::types::SqlType;

/// A filter checked against a table: the tree, and for each literal (in the order the filter is written) the
/// type its text is converted to.
#[derive(Debug, Clone, PartialEq)]
pub struct MssqlFilter {
    filter: Filter,
    literal_types: Vec<SqlType>,
}

impl MssqlFilter {
    /// Checks `filter` against the columns of `table` (`(name, type)`, as the catalog reports them).
    pub fn new(filter: &Filter, table: &str, columns: &[(String, SqlType)]) -> Result<Self, String> {
        filter.check_columns(table, columns.iter().map(|(n, _)| n.as_str()))?;
        let mut literal_types = Vec::new();
        for (column, literal) in compared(filter) {
            let ty = columns.iter().find(|(n, _)| n == column.as_str()).map(|(_, t)| t);
            let ty = ty.ok_or_else(|| format!("internal error: column {:?} vanished", column.as_str()))?;
            literal_types
                .push(ty.literal_type(literal.text()).map_err(|e| format!("column {:?}: {e}", column.as_str()))?);
        }
        Ok(Self { filter: filter.clone(), literal_types })
    }

    /// The text bound to each `Slot::Filter(i)`, in order.
    pub fn values(&self) -> Vec<String> {
        compared(&self.filter).into_iter().map(|(_, l)| l.text().to_string()).collect()
    }

    /// The condition over the rows of `alias`, its literals numbered on from `p`'s parameters.
    pub(super) fn render(&self, p: &mut Params, alias: &str) -> String {
        let mut next = 0;
        self.node(&self.filter, p, alias, &mut next)
    }

    fn node(&self, f: &Filter, p: &mut Params, alias: &str, next: &mut usize) -> String {
        let column = |c: &Ident| format!("{alias}.{}", c.mssql());
        match f {
            Filter::Or(all) | Filter::And(all) => {
                let word = if matches!(f, Filter::Or(_)) { " OR " } else { " AND " };
                let parts: Vec<String> = all.iter().map(|x| self.node(x, p, alias, next)).collect();
                format!("({})", parts.join(word))
            }
            Filter::Compare { column: c, op, .. } => format!("{} {} {}", column(c), op.sql(), self.bind(p, next)),
            Filter::IsNull { column: c, negated } => {
                format!("{} IS {}NULL", column(c), if *negated { "NOT " } else { "" })
            }
            Filter::In { column: c, values, negated } => {
                let bound: Vec<String> = values.iter().map(|_| self.bind(p, next)).collect();
                format!("{} {}IN ({})", column(c), if *negated { "NOT " } else { "" }, bound.join(", "))
            }
        }
    }

    /// The next literal: its parameter, converted to its column's type.
    fn bind(&self, p: &mut Params, next: &mut usize) -> String {
        let i = *next;
        *next += 1;
        // `new` found one type per literal; an index past them cannot happen, and text is the safe default.
        let ty = self.literal_types.get(i).cloned().unwrap_or_else(|| SqlType::new("nvarchar"));
        ty.parse_text(&p.p(Slot::Filter(i)))
    }
}

/// Each literal with the column it is compared with, in the order the literals are written (the order `render`
/// numbers them in).
fn compared(f: &Filter) -> Vec<(&Ident, &Literal)> {
    match f {
        Filter::Or(all) | Filter::And(all) => all.iter().flat_map(compared).collect(),
        Filter::Compare { column, value, .. } => vec![(column, value)],
        Filter::IsNull { .. } => Vec::new(),
        Filter::In { column, values, .. } => values.iter().map(|v| (column, v)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn columns() -> Vec<(String, SqlType)> {
        vec![
            ("Region".into(), SqlType::new("varchar").with_length(8).with_collation("Greek_100_CI_AS")),
            ("Total".into(), SqlType::new("decimal").with_precision(18, 2)),
            ("Is Open".into(), SqlType::new("bit")),
            ("Name]x".into(), SqlType::new("nvarchar").with_length(20)),
            ("At".into(), SqlType::new("datetime2").with_datetime_precision(3)),
            ("Doc".into(), SqlType::new("xml")),
        ]
    }

    fn render(text: &str, first: &[Slot]) -> (String, Vec<Slot>, Vec<String>) {
        let f = MssqlFilter::new(&Filter::parse(text).expect("parses"), "[dbo].[T]", &columns()).expect("valid");
        let mut p = Params::default();
        for slot in first {
            p.p(*slot);
        }
        let sql = f.render(&mut p, "T");
        (sql, p.0, f.values())
    }

    #[test]
    fn literals_are_parameters_converted_to_each_columns_type_after_the_statements_own() {
        let (sql, slots, values) = render(
            "Region = 'eu' AND (Total >= 100.5 OR \"Is Open\" = true) AND At < '2026-01-01 00:00:00'",
            &[Slot::Limit, Slot::Bound],
        );
        assert_eq!(
            sql,
            "(T.[Region] = CONVERT(VARCHAR(MAX), @P3 COLLATE Greek_100_CI_AS) AND (T.[Total] >= CONVERT(DECIMAL(18,2), @P4) \
OR T.[Is Open] = CONVERT(BIT, @P5)) AND T.[At] < CONVERT(DATETIME2(3), @P6, 121))"
        );
        assert_eq!(slots[2..], [Slot::Filter(0), Slot::Filter(1), Slot::Filter(2), Slot::Filter(3)]);
        assert_eq!(values, ["eu", "100.5", "true", "2026-01-01 00:00:00"]);
    }

    #[test]
    fn names_are_bracket_quoted_and_an_injection_stays_a_value() {
        let (sql, _, values) = render("\"Name]x\" IN ('a''b', 'x]; DROP TABLE t; --') OR Doc IS NOT NULL", &[]);
        assert_eq!(
            sql,
            "(T.[Name]]x] IN (CONVERT(NVARCHAR(MAX), @P1), CONVERT(NVARCHAR(MAX), @P2)) OR T.[Doc] IS NOT NULL)"
        );
        assert_eq!(values, ["a'b", "x]; DROP TABLE t; --"]);
        let (sql, slots, _) = render("Region NOT IN ('a') AND Total <> -3.125", &[]);
        assert_eq!(
            sql,
            "(T.[Region] NOT IN (CONVERT(VARCHAR(MAX), @P1 COLLATE Greek_100_CI_AS)) AND T.[Total] <> CONVERT(DECIMAL(19,3), @P2))",
            "a decimal literal finer than the column is compared as written, not rounded to the column's scale"
        );
        assert_eq!(slots, [Slot::Filter(0), Slot::Filter(1)]);
    }

    #[test]
    fn an_unknown_column_or_an_incomparable_type_is_refused_at_the_start_with_what_works() {
        let check = |text: &str| MssqlFilter::new(&Filter::parse(text).expect("parses"), "[dbo].[T]", &columns());
        let e = check("region = 'eu'").unwrap_err();
        assert!(e.contains("\"region\"") && e.contains("case-sensitive") && e.contains("Region, Total"), "{e}");
        let e = check("Doc = 'x'").unwrap_err();
        assert!(e.contains("column \"Doc\"") && e.contains("xml column") && e.contains("IS [NOT] NULL"), "{e}");
        assert!(check("Doc IS NULL").is_ok(), "a NULL test compares nothing");
    }
}
