//! Column types as the catalog reports them, and the two things the source needs from a type: whether the
//! trigger can put it in `Item`, and how a key value round-trips through text in a stored position.
//!
//! Positions hold key values as text (like the PostgreSQL source) so one code path serves every key type.
//! The text is made by `CONVERT(NVARCHAR(MAX), value, style)` and read back by `CONVERT(TYPE, @Pn, style)`;
//! the style is chosen per type so the round trip is exact (the default styles drop datetime milliseconds,
//! money's last two digits and float digits). Type names in statements come only from the fixed list
//! below, never from catalog text.

/// A column's type from `INFORMATION_SCHEMA.COLUMNS` (`DATA_TYPE` is the base system type, also for alias
/// types).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlType {
    /// Lower-case system type name (`int`, `nvarchar`, `datetime2`, `geography`, ...).
    pub name: String,
    /// `CHARACTER_MAXIMUM_LENGTH`: characters or bytes, -1 for `(max)`.
    pub max_length: Option<i32>,
    pub precision: Option<i32>,
    pub scale: Option<i32>,
    /// `DATETIME_PRECISION`: fractional-second digits of `time`, `datetime2` and `datetimeoffset`.
    pub datetime_precision: Option<i32>,
    /// `COLLATION_NAME` of a character column: the code page a `char`/`varchar` key is read back in.
    pub collation: Option<String>,
}

/// Types `FOR JSON` cannot serialize (CLR types) or that have no stable JSON form. The official trigger
/// rejects the first three; `sql_variant` is rejected too because its JSON shape changes with each value.
pub const UNSUPPORTED: &[&str] = &["geography", "geometry", "hierarchyid", "sql_variant"];

impl SqlType {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_ascii_lowercase(),
            max_length: None,
            precision: None,
            scale: None,
            datetime_precision: None,
            collation: None,
        }
    }

    #[cfg(test)]
    pub fn with_collation(mut self, collation: &str) -> Self {
        self.collation = Some(collation.to_string());
        self
    }

    #[cfg(test)]
    pub fn with_length(mut self, length: i32) -> Self {
        self.max_length = Some(length);
        self
    }

    #[cfg(test)]
    pub fn with_precision(mut self, precision: i32, scale: i32) -> Self {
        self.precision = Some(precision);
        self.scale = Some(scale);
        self
    }

    #[cfg(test)]
    pub fn with_datetime_precision(mut self, digits: i32) -> Self {
        self.datetime_precision = Some(digits);
        self
    }

    /// True when the trigger cannot put this column in `Item`.
    pub fn is_unsupported(&self) -> bool {
        UNSUPPORTED.contains(&self.name.as_str())
    }

    /// The `CONVERT` style that makes the text form of a value exact, if the default is not.
    pub fn text_style(&self) -> Option<u8> {
        match self.name.as_str() {
            // 0x-prefixed hex; style 1 converts back as well.
            "binary" | "varbinary" => Some(1),
            // ODBC canonical with all fractional digits (and the offset for datetimeoffset).
            "date" | "time" | "datetime" | "datetime2" | "smalldatetime" | "datetimeoffset" => Some(121),
            // 17 significant digits: the documented lossless style.
            "float" | "real" => Some(3),
            // Four decimals, no thousands separators (the default style keeps only two).
            "money" | "smallmoney" => Some(2),
            _ => None,
        }
    }

    /// The type to `CONVERT` a key's text back to, in upper case. `Err` names why the type cannot be a key
    /// the trigger pages over.
    pub fn convert_target(&self) -> Result<String, String> {
        let sized = |n: &str| match self.max_length {
            Some(-1) => Ok(format!("{n}(MAX)")),
            Some(len) if len > 0 => Ok(format!("{n}({len})")),
            _ => Err(format!("{} has no length in the catalog", self.name)),
        };
        let upper = self.name.to_ascii_uppercase();
        match self.name.as_str() {
            "bigint" | "int" | "smallint" | "tinyint" | "bit" | "money" | "smallmoney" | "float" | "real" | "date"
            | "datetime" | "smalldatetime" | "uniqueidentifier" => Ok(upper),
            "decimal" | "numeric" => match (self.precision, self.scale) {
                (Some(p), Some(s)) if (1..=38).contains(&p) && (0..=p).contains(&s) => Ok(format!("{upper}({p},{s})")),
                _ => Err(format!("{} has no precision and scale in the catalog", self.name)),
            },
            "time" | "datetime2" | "datetimeoffset" => match self.datetime_precision {
                Some(d) if (0..=7).contains(&d) => Ok(format!("{upper}({d})")),
                _ => Ok(upper),
            },
            "nchar" | "nvarchar" | "binary" | "varbinary" => sized(&upper),
            // A key's text arrives as nvarchar; converted to varchar without a collation it would take the
            // database's default code page, and a column in another one (or a UTF-8 collation) would compare
            // with `?` in place of its characters: the keyset would skip or repeat rows. Converted under the
            // column's own collation, the value has the column's bytes, and compares (and seeks) as it sorts.
            "char" | "varchar" => match self.key_collation() {
                Some(_) => sized(&upper),
                None => Err(format!("{} has no collation in the catalog", self.name)),
            },
            other => Err(format!("{other} cannot be a key the trigger pages over")),
        }
    }

    /// The type a backfill filter's `literal` for a column of this type is converted to before the comparison
    /// (`--where`, `sql::MssqlFilter`): the column's own type, so `created >= '2026-01-01'` compares dates and
    /// the column side needs no conversion (an index on it still seeks), except where that conversion would change
    /// the literal: a sized character or binary type takes its `(MAX)` form (converted to the column's length, a
    /// longer literal would be cut and equal a value it is not), and a `decimal` or `numeric` widens to the
    /// literal's digits (converted to the column's scale, `price > 10.555` would round to `price > 10.56` and leave
    /// out 10.56). `Err` names why a column of this type cannot be compared with a value.
    pub fn literal_type(&self, literal: &str) -> Result<SqlType, String> {
        let widened = match self.name.as_str() {
            "char" | "varchar" => Some("varchar"),
            "nchar" | "nvarchar" => Some("nvarchar"),
            "binary" | "varbinary" => Some("varbinary"),
            _ => None,
        };
        let mut ty = match widened {
            Some(name) => SqlType { name: name.into(), max_length: Some(-1), ..self.clone() },
            None => self.clone(),
        };
        if let ("decimal" | "numeric", Some(p), Some(s), Some((int, frac))) =
            (ty.name.as_str(), ty.precision, ty.scale, decimal_digits(literal))
        {
            let int = (p - s).max(int);
            let scale = s.max(frac).min(38 - int.min(38));
            ty.precision = Some((int + scale).clamp(1, 38));
            ty.scale = Some(scale);
        }
        ty.convert_target().map(|_| ty).map_err(|_| {
            format!("a filter cannot compare a {} column with a value (only IS [NOT] NULL applies to it)", self.name)
        })
    }

    /// The expression `FOR JSON` serializes for a column of this type: the column itself, except where the
    /// official trigger's payload differs and matching it loses nothing. The official trigger reads rows into
    /// .NET values and writes them with Newtonsoft.Json: a `date` is a `DateTime` (`"2026-01-02T00:00:00"`,
    /// where FOR JSON writes `"2026-01-02"`), a `uniqueidentifier` a `Guid` (lower case, where FOR JSON
    /// writes upper case). Decimals stay exact here (docs/sql-server.md lists the remaining differences).
    pub fn json_value(&self, expr: &str) -> String {
        match self.name.as_str() {
            "date" => format!("CONVERT(DATETIME2(0), {expr})"),
            "uniqueidentifier" => format!("LOWER(CONVERT(NCHAR(36), {expr}))"),
            _ => expr.to_string(),
        }
    }

    /// The collation name, when it is one a statement may name: it is spliced after `COLLATE` (a name, not a
    /// value, so it cannot be a parameter), so only letters, digits and `_`, as every collation name is.
    fn key_collation(&self) -> Option<&str> {
        self.collation.as_deref().filter(|c| !c.is_empty() && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
    }

    /// `CONVERT(NVARCHAR(MAX), expr[, style])`: the exact text of a key value.
    pub fn to_text(&self, expr: &str) -> String {
        match self.text_style() {
            Some(style) => format!("CONVERT(NVARCHAR(MAX), {expr}, {style})"),
            None => format!("CONVERT(NVARCHAR(MAX), {expr})"),
        }
    }

    /// `CONVERT(TYPE, @Pn[, style])`: a key value back from its text. Only valid for key types. A `char` or
    /// `varchar` key converts `@Pn COLLATE <column's collation>` (see `convert_target`).
    pub fn parse_text(&self, param: &str) -> String {
        let target = self.convert_target().unwrap_or_else(|_| "NVARCHAR(MAX)".to_string());
        let param = match self.key_collation().filter(|_| matches!(self.name.as_str(), "char" | "varchar")) {
            Some(collation) => format!("{param} COLLATE {collation}"),
            None => param.to_string(),
        };
        match self.text_style() {
            Some(style) => format!("CONVERT({target}, {param}, {style})"),
            None => format!("CONVERT({target}, {param})"),
        }
    }
}

/// The digits before and after the point of a plain decimal number (`-012.50` is `(2, 2)`); `None` for anything
/// else (an exponent, text), which is then converted to the column's own type.
fn decimal_digits(text: &str) -> Option<(i32, i32)> {
    let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
    let (int, frac) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    if int.is_empty() && frac.is_empty() || !int.chars().chain(frac.chars()).all(|c| c.is_ascii_digit()) {
        return None;
    }
    let significant = int.trim_start_matches('0').len().max(1);
    Some((i32::try_from(significant).ok()?, i32::try_from(frac.len()).ok()?))
}

impl std::fmt::Display for SqlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_types_convert_back_exactly() {
        assert_eq!(SqlType::new("int").parse_text("@P3"), "CONVERT(INT, @P3)");
        assert_eq!(SqlType::new("nvarchar").with_length(50).parse_text("@P3"), "CONVERT(NVARCHAR(50), @P3)");
        assert_eq!(SqlType::new("varbinary").with_length(-1).parse_text("@P3"), "CONVERT(VARBINARY(MAX), @P3, 1)");
        assert_eq!(SqlType::new("decimal").with_precision(18, 4).parse_text("@P3"), "CONVERT(DECIMAL(18,4), @P3)");
        assert_eq!(
            SqlType::new("datetime2").with_datetime_precision(3).parse_text("@P3"),
            "CONVERT(DATETIME2(3), @P3, 121)"
        );
        assert_eq!(SqlType::new("money").to_text("CT.[m]"), "CONVERT(NVARCHAR(MAX), CT.[m], 2)");
    }

    #[test]
    fn a_varchar_key_is_read_back_in_its_columns_code_page() {
        // Issue 15, defect 4: without COLLATE the conversion used the database's default code page.
        let greek = SqlType::new("varchar").with_length(10).with_collation("Greek_100_CI_AS");
        assert_eq!(greek.parse_text("@P3"), "CONVERT(VARCHAR(10), @P3 COLLATE Greek_100_CI_AS)");
        let utf8 = SqlType::new("varchar").with_length(-1).with_collation("Latin1_General_100_CI_AS_SC_UTF8");
        assert_eq!(utf8.parse_text("@P3"), "CONVERT(VARCHAR(MAX), @P3 COLLATE Latin1_General_100_CI_AS_SC_UTF8)");
        assert!(SqlType::new("varchar").with_length(10).convert_target().unwrap_err().contains("no collation"));
        let spliced = SqlType::new("varchar").with_length(10).with_collation("x) --");
        assert!(spliced.convert_target().is_err(), "a collation name is spliced only when it is a plain name");
        assert_eq!(SqlType::new("float").to_text("CT.[f]"), "CONVERT(NVARCHAR(MAX), CT.[f], 3)");
    }

    #[test]
    fn dates_and_uniqueidentifiers_take_the_official_triggers_json_form() {
        // Issue 15, defect 6: Newtonsoft writes a date as a midnight DateTime and a Guid in lower case.
        assert_eq!(SqlType::new("date").json_value("T.[d]"), "CONVERT(DATETIME2(0), T.[d])");
        assert_eq!(SqlType::new("uniqueidentifier").json_value("CT.[g]"), "LOWER(CONVERT(NCHAR(36), CT.[g]))");
        assert_eq!(SqlType::new("decimal").with_precision(18, 4).json_value("T.[p]"), "T.[p]", "exact decimals stay");
        assert_eq!(SqlType::new("datetime2").json_value("T.[t]"), "T.[t]");
    }

    #[test]
    fn a_filter_literal_takes_the_columns_type_with_no_length_to_cut_it() {
        let literal = |ty: SqlType| ty.literal_type("x").map(|t| t.parse_text("@P4"));
        assert_eq!(literal(SqlType::new("nchar").with_length(3)), Ok("CONVERT(NVARCHAR(MAX), @P4)".into()));
        assert_eq!(
            literal(SqlType::new("char").with_length(3).with_collation("Greek_100_CI_AS")),
            Ok("CONVERT(VARCHAR(MAX), @P4 COLLATE Greek_100_CI_AS)".into())
        );
        assert_eq!(literal(SqlType::new("binary").with_length(16)), Ok("CONVERT(VARBINARY(MAX), @P4, 1)".into()));
        assert_eq!(literal(SqlType::new("bit")), Ok("CONVERT(BIT, @P4)".into()));
        assert_eq!(literal(SqlType::new("decimal").with_precision(9, 2)), Ok("CONVERT(DECIMAL(9,2), @P4)".into()));
        assert_eq!(literal(SqlType::new("date")), Ok("CONVERT(DATE, @P4, 121)".into()));
        let decimal = |literal: &str| {
            SqlType::new("decimal").with_precision(9, 2).literal_type(literal).map(|t| t.parse_text("@P4"))
        };
        assert_eq!(decimal("10.5"), Ok("CONVERT(DECIMAL(9,2), @P4)".into()), "fits the column: its own type");
        assert_eq!(decimal("-10.555"), Ok("CONVERT(DECIMAL(10,3), @P4)".into()), "not rounded to the column's scale");
        assert_eq!(decimal("123456789012.5"), Ok("CONVERT(DECIMAL(14,2), @P4)".into()), "nor cut to its precision");
        assert_eq!(decimal("1e3"), Ok("CONVERT(DECIMAL(9,2), @P4)".into()), "an exponent is the server's to read");
        let wide = SqlType::new("numeric").with_precision(38, 30).literal_type(&format!("1.{}", "1".repeat(40)));
        assert_eq!(wide.map(|t| t.parse_text("@P4")), Ok("CONVERT(NUMERIC(38,30), @P4)".into()), "at most 38 digits");
        let e = literal(SqlType::new("xml")).unwrap_err();
        assert!(e.contains("xml column") && e.contains("IS [NOT] NULL"), "{e}");
    }

    #[test]
    fn types_that_cannot_be_keys_or_items_say_so() {
        assert!(SqlType::new("geography").is_unsupported());
        assert!(SqlType::new("sql_variant").is_unsupported());
        assert!(!SqlType::new("xml").is_unsupported());
        assert!(SqlType::new("xml").convert_target().unwrap_err().contains("cannot be a key"));
        assert!(SqlType::new("decimal").convert_target().is_err());
    }
}
