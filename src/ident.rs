//! SQL identifiers from configuration: validated once, then quoted for each dialect.
//!
//! Table and column names arrive from `sqltrigger.json` and app settings, so they are untrusted text. An
//! [`Ident`] can only be built through validation, and it reaches SQL only through the quoting functions here,
//! which double the closing delimiter. No statement in this crate splices a raw configured name.

use std::fmt;

/// SQL Server's `sysname` limit; PostgreSQL's is 63 bytes, checked by the PostgreSQL source itself.
const MAX_IDENT_CHARS: usize = 128;

/// A validated identifier (one name part, unquoted).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ident(String);

impl Ident {
    pub fn new(raw: &str) -> Result<Self, String> {
        if raw.is_empty() {
            return Err("an identifier is empty".into());
        }
        if raw.chars().count() > MAX_IDENT_CHARS {
            return Err(format!("identifier {raw:?} is longer than {MAX_IDENT_CHARS} characters"));
        }
        if let Some(c) = raw.chars().find(|c| c.is_control()) {
            return Err(format!("identifier {raw:?} contains the control character {:?}", c));
        }
        Ok(Self(raw.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `"name"` with embedded quotes doubled (PostgreSQL, ANSI).
    pub fn pg(&self) -> String {
        format!("\"{}\"", self.0.replace('"', "\"\""))
    }

    /// `[name]` with embedded closing brackets doubled (SQL Server).
    pub fn mssql(&self) -> String {
        format!("[{}]", self.0.replace(']', "]]"))
    }
}

impl fmt::Debug for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl fmt::Display for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `schema.table`, parsed from the forms users write: `Orders`, `dbo.Orders`, `[dbo].[Order Items]`,
/// `"public"."Order Items"`. A dot inside a delimited part belongs to the name.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    pub schema: Option<Ident>,
    pub table: Ident,
}

impl TableName {
    pub fn parse(text: &str) -> Result<Self, String> {
        let parts = split_parts(text.trim())?;
        match parts.as_slice() {
            [table] => Ok(Self { schema: None, table: Ident::new(table)? }),
            [schema, table] => Ok(Self { schema: Some(Ident::new(schema)?), table: Ident::new(table)? }),
            _ => Err(format!(
                "table name {text:?} has {} parts; write table or schema.table (quote parts that contain dots)",
                parts.len()
            )),
        }
    }

    pub fn pg(&self) -> String {
        match &self.schema {
            Some(s) => format!("{}.{}", s.pg(), self.table.pg()),
            None => self.table.pg(),
        }
    }

    pub fn mssql(&self) -> String {
        match &self.schema {
            Some(s) => format!("{}.{}", s.mssql(), self.table.mssql()),
            None => self.table.mssql(),
        }
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(s) => write!(f, "{s}.{}", self.table),
            None => write!(f, "{}", self.table),
        }
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

fn split_parts(text: &str) -> Result<Vec<String>, String> {
    let mut parts = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        let mut part = String::new();
        match chars.peek() {
            Some('[') | Some('"') => {
                let open = chars.next().unwrap_or('"');
                let close = if open == '[' { ']' } else { '"' };
                loop {
                    match chars.next() {
                        Some(c) if c == close => {
                            if chars.peek() == Some(&close) {
                                chars.next();
                                part.push(close);
                            } else {
                                break;
                            }
                        }
                        Some(c) => part.push(c),
                        None => return Err(format!("table name {text:?} has an unclosed {open}")),
                    }
                }
            }
            _ => {
                while let Some(&c) = chars.peek() {
                    if c == '.' {
                        break;
                    }
                    if matches!(c, '[' | ']' | '"') {
                        return Err(format!(
                            "table name {text:?} has a stray {c:?}; quote the whole part, e.g. [dbo].[My Table]"
                        ));
                    }
                    part.push(c);
                    chars.next();
                }
            }
        }
        parts.push(part);
        match chars.next() {
            None => return Ok(parts),
            Some('.') => continue,
            Some(c) => return Err(format!("table name {text:?} has {c:?} after a quoted part; expected a dot")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_hostile_names_so_they_stay_names() {
        let evil = Ident::new("x]; DROP TABLE t; --").expect("valid text");
        assert_eq!(evil.mssql(), "[x]]; DROP TABLE t; --]");
        let evil = Ident::new("x\"; DROP TABLE t; --").expect("valid text");
        assert_eq!(evil.pg(), "\"x\"\"; DROP TABLE t; --\"");
    }

    #[test]
    fn rejects_empty_control_and_overlong_names() {
        assert!(Ident::new("").is_err());
        assert!(Ident::new("a\0b").unwrap_err().contains("control"));
        assert!(Ident::new(&"x".repeat(129)).is_err());
    }

    #[test]
    fn parses_the_forms_users_write() {
        let t = TableName::parse("[dbo].[User]").expect("parses");
        assert_eq!(t.mssql(), "[dbo].[User]");
        let t = TableName::parse("\"public\".\"Order.Items\"").expect("parses");
        assert_eq!(t.table.as_str(), "Order.Items");
        assert_eq!(t.pg(), "\"public\".\"Order.Items\"");
        let t = TableName::parse("orders").expect("parses");
        assert!(t.schema.is_none());
        let t = TableName::parse("[we]]ird].[ünï cødé]").expect("parses");
        assert_eq!(t.schema.as_ref().map(Ident::as_str), Some("we]ird"));
        assert_eq!(t.mssql(), "[we]]ird].[ünï cødé]");
    }

    #[test]
    fn rejects_malformed_table_names_with_a_reason() {
        assert!(TableName::parse("a.b.c").unwrap_err().contains("3 parts"));
        assert!(TableName::parse("[dbo.Orders").unwrap_err().contains("unclosed"));
        assert!(TableName::parse("dbo.Ord]ers").unwrap_err().contains("stray"));
        assert!(TableName::parse("dbo.").is_err());
    }
}
