//! The filter of a filtered backfill (`handler state backfill <fn> --where <filter>`): a small grammar, parsed
//! here into a tree and rendered by each source with every literal bound as a parameter. Nothing an operator
//! types is spliced into SQL: column names become validated, quoted identifiers checked against the table's
//! columns, literals become parameters, and only the operators below exist.
//!
//! ```text
//! filter  := all ( OR all )*
//! all     := term ( AND term )*
//! term    := '(' filter ')'
//!          | column op literal                    op: = <> != < <= > >=
//!          | column IS [NOT] NULL
//!          | column [NOT] IN '(' literal ( ',' literal )* ')'
//! column  := name | "quoted name"                 (case-sensitive, as in the table)
//! literal := 'text' ('' for a quote) | number | true | false
//! ```
//! Keywords are case-insensitive. A literal is compared as the column's type (PostgreSQL casts the bound text
//! to it), so `created >= '2026-01-01'` and `total > 100.5` mean what they say. At most [`MAX_TERMS`] terms
//! and [`MAX_TEXT`] characters.

use crate::ident::Ident;
use std::fmt;

/// At most this many comparisons in one filter.
pub const MAX_TERMS: usize = 64;
/// At most this many characters of filter text.
pub const MAX_TEXT: usize = 4000;
const MAX_DEPTH: usize = 16;

/// A parsed filter.
#[derive(Debug, Clone, PartialEq)]
pub enum Filter {
    Or(Vec<Filter>),
    And(Vec<Filter>),
    Compare { column: Ident, op: CompareOp, value: Literal },
    IsNull { column: Ident, negated: bool },
    In { column: Ident, values: Vec<Literal>, negated: bool },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CompareOp {
    pub fn sql(self) -> &'static str {
        match self {
            Self::Eq => "=",
            Self::Ne => "<>",
            Self::Lt => "<",
            Self::Le => "<=",
            Self::Gt => ">",
            Self::Ge => ">=",
        }
    }
}

/// A literal, kept as the text the database casts to the column's type.
#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    Text(String),
    Number(String),
    Bool(bool),
}

impl Literal {
    /// The text bound as the parameter.
    pub fn text(&self) -> &str {
        match self {
            Self::Text(t) | Self::Number(t) => t,
            Self::Bool(true) => "true",
            Self::Bool(false) => "false",
        }
    }
}

impl fmt::Display for Literal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Text(t) => write!(f, "'{}'", t.replace('\'', "''")),
            other => f.write_str(other.text()),
        }
    }
}

impl Filter {
    /// Parses `text` (see the module docs). The error says where and what was expected.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.chars().count() > MAX_TEXT {
            return Err(format!("the filter is longer than {MAX_TEXT} characters"));
        }
        let tokens = lex(text)?;
        let mut p = Parser { tokens, at: 0, terms: 0 };
        let filter = p.filter(0)?;
        match p.tokens.get(p.at) {
            None => Ok(filter),
            Some(t) => Err(format!("unexpected {t} after a complete filter; join conditions with AND or OR")),
        }
    }

    /// Every column the filter names, in order of appearance (with repeats).
    pub fn columns(&self) -> Vec<&Ident> {
        match self {
            Self::Or(all) | Self::And(all) => all.iter().flat_map(Filter::columns).collect(),
            Self::Compare { column, .. } | Self::IsNull { column, .. } | Self::In { column, .. } => vec![column],
        }
    }

    /// Refuses a column not in `known` (the table's columns), naming the ones that are.
    pub fn check_columns<'a>(&self, table: &str, known: impl Iterator<Item = &'a str> + Clone) -> Result<(), String> {
        for column in self.columns() {
            if !known.clone().any(|k| k == column.as_str()) {
                let names: Vec<&str> = known.clone().collect();
                return Err(format!(
                    "the filter names column {:?}, which {table} does not have (names are case-sensitive; its columns: {})",
                    column.as_str(),
                    names.join(", ")
                ));
            }
        }
        Ok(())
    }

    /// Renders the filter as PostgreSQL over table alias `t`: each literal becomes `(($n::text)::type)` with
    /// `type` the column's (from `type_of`), its text pushed to `params`; `$n` counts on from `params.len()`
    /// plus `first` (the number of parameters before these).
    pub fn to_pg(&self, type_of: &dyn Fn(&Ident) -> Option<String>, first: usize, params: &mut Vec<String>) -> String {
        let bind = |column: &Ident, value: &Literal, params: &mut Vec<String>| {
            params.push(value.text().to_string());
            let ty = type_of(column).unwrap_or_else(|| "text".into());
            format!("(${}::text)::{ty}", first + params.len())
        };
        match self {
            Self::Or(all) => {
                let parts: Vec<String> = all.iter().map(|f| f.to_pg(type_of, first, params)).collect();
                format!("({})", parts.join(" OR "))
            }
            Self::And(all) => {
                let parts: Vec<String> = all.iter().map(|f| f.to_pg(type_of, first, params)).collect();
                format!("({})", parts.join(" AND "))
            }
            Self::Compare { column, op, value } => {
                let bound = bind(column, value, params);
                format!("t.{} {} {bound}", column.pg(), op.sql())
            }
            Self::IsNull { column, negated } => {
                format!("t.{} IS {}NULL", column.pg(), if *negated { "NOT " } else { "" })
            }
            Self::In { column, values, negated } => {
                let bound: Vec<String> = values.iter().map(|v| bind(column, v, params)).collect();
                format!("t.{} {}IN ({})", column.pg(), if *negated { "NOT " } else { "" }, bound.join(", "))
            }
        }
    }
}

impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let quoted = |c: &Ident| c.pg();
        match self {
            Self::Or(all) | Self::And(all) => {
                let word = if matches!(self, Self::Or(_)) { " OR " } else { " AND " };
                let parts: Vec<String> = all.iter().map(|p| format!("({p})")).collect();
                f.write_str(&parts.join(word))
            }
            Self::Compare { column, op, value } => write!(f, "{} {} {value}", quoted(column), op.sql()),
            Self::IsNull { column, negated } => {
                write!(f, "{} IS {}NULL", quoted(column), if *negated { "NOT " } else { "" })
            }
            Self::In { column, values, negated } => {
                let vals: Vec<String> = values.iter().map(Literal::to_string).collect();
                write!(f, "{} {}IN ({})", quoted(column), if *negated { "NOT " } else { "" }, vals.join(", "))
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Word(String),
    Quoted(String),
    Text(String),
    Number(String),
    Op(CompareOp),
    Open,
    Close,
    Comma,
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Word(w) => write!(f, "{w:?}"),
            Self::Quoted(w) => write!(f, "column \"{w}\""),
            Self::Text(t) => write!(f, "text '{t}'"),
            Self::Number(n) => write!(f, "number {n}"),
            Self::Op(op) => write!(f, "operator {}", op.sql()),
            Self::Open => f.write_str("'('"),
            Self::Close => f.write_str("')'"),
            Self::Comma => f.write_str("','"),
        }
    }
}

fn lex(text: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() => i += 1,
            '(' | ')' | ',' | '=' => {
                tokens.push(match c {
                    '(' => Token::Open,
                    ')' => Token::Close,
                    ',' => Token::Comma,
                    _ => Token::Op(CompareOp::Eq),
                });
                i += 1;
            }
            '<' | '>' | '!' => {
                let next = chars.get(i + 1).copied();
                let (op, len) = match (c, next) {
                    ('<', Some('=')) => (CompareOp::Le, 2),
                    ('<', Some('>')) => (CompareOp::Ne, 2),
                    ('<', _) => (CompareOp::Lt, 1),
                    ('>', Some('=')) => (CompareOp::Ge, 2),
                    ('>', _) => (CompareOp::Gt, 1),
                    ('!', Some('=')) => (CompareOp::Ne, 2),
                    _ => return Err(format!("'!' at character {} must be followed by '=' (!=)", i + 1)),
                };
                tokens.push(Token::Op(op));
                i += len;
            }
            '\'' | '"' => {
                let mut value = String::new();
                let start = i;
                i += 1;
                loop {
                    match chars.get(i) {
                        None => {
                            let what = if c == '\'' { "text" } else { "quoted column name" };
                            return Err(format!("the {what} starting at character {} is not closed", start + 1));
                        }
                        Some(&q) if q == c && chars.get(i + 1) == Some(&c) => {
                            value.push(c);
                            i += 2;
                        }
                        Some(&q) if q == c => {
                            i += 1;
                            break;
                        }
                        Some(&other) => {
                            value.push(other);
                            i += 1;
                        }
                    }
                }
                tokens.push(if c == '\'' { Token::Text(value) } else { Token::Quoted(value) });
            }
            c if c.is_ascii_digit() || c == '-' || c == '+' || c == '.' => {
                let start = i;
                i += 1;
                while i < chars.len()
                    && (chars[i].is_ascii_digit()
                        || matches!(chars[i], '.' | 'e' | 'E')
                        || (matches!(chars[i], '-' | '+') && matches!(chars[i - 1], 'e' | 'E')))
                {
                    i += 1;
                }
                let number: String = chars[start..i].iter().collect();
                if number.parse::<f64>().is_err() {
                    return Err(format!("{number:?} at character {} is not a number", start + 1));
                }
                tokens.push(Token::Number(number));
            }
            c if c.is_alphabetic() || c == '_' => {
                let start = i;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_' || chars[i] == '$') {
                    i += 1;
                }
                tokens.push(Token::Word(chars[start..i].iter().collect()));
            }
            other => {
                return Err(format!(
                    "{other:?} at character {} is not part of a filter (comparisons, AND, OR, IS [NOT] NULL, [NOT] IN, parentheses)",
                    i + 1
                ))
            }
        }
    }
    Ok(tokens)
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
    terms: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn keyword(&self, word: &str) -> bool {
        matches!(self.peek(), Some(Token::Word(w)) if w.eq_ignore_ascii_case(word))
    }

    fn filter(&mut self, depth: usize) -> Result<Filter, String> {
        if depth > MAX_DEPTH {
            return Err(format!("the filter nests parentheses deeper than {MAX_DEPTH}"));
        }
        let mut any = vec![self.all(depth)?];
        while self.keyword("or") {
            self.at += 1;
            any.push(self.all(depth)?);
        }
        Ok(if any.len() == 1 { any.remove(0) } else { Filter::Or(any) })
    }

    fn all(&mut self, depth: usize) -> Result<Filter, String> {
        let mut all = vec![self.term(depth)?];
        while self.keyword("and") {
            self.at += 1;
            all.push(self.term(depth)?);
        }
        Ok(if all.len() == 1 { all.remove(0) } else { Filter::And(all) })
    }

    fn term(&mut self, depth: usize) -> Result<Filter, String> {
        if self.peek() == Some(&Token::Open) {
            self.at += 1;
            let inner = self.filter(depth + 1)?;
            return match self.peek() {
                Some(Token::Close) => {
                    self.at += 1;
                    Ok(inner)
                }
                other => Err(format!("expected ')' but found {}", describe(other))),
            };
        }
        self.terms += 1;
        if self.terms > MAX_TERMS {
            return Err(format!("the filter has more than {MAX_TERMS} conditions"));
        }
        let column = match self.peek().cloned() {
            Some(Token::Word(w)) if is_keyword(&w) => {
                return Err(format!(
                    "expected a column name but found the keyword {w:?}; quote a column of that name (\"{w}\")"
                ))
            }
            Some(Token::Word(w) | Token::Quoted(w)) => Ident::new(&w)?,
            other => return Err(format!("expected a column name but found {}", describe(other.as_ref()))),
        };
        self.at += 1;
        match self.peek().cloned() {
            Some(Token::Op(op)) => {
                self.at += 1;
                let value = self.literal()?;
                Ok(Filter::Compare { column, op, value })
            }
            Some(Token::Word(w)) if w.eq_ignore_ascii_case("is") => {
                self.at += 1;
                let negated = self.keyword("not");
                if negated {
                    self.at += 1;
                }
                if !self.keyword("null") {
                    return Err(format!(
                        "expected NULL after IS{} but found {}",
                        if negated { " NOT" } else { "" },
                        describe(self.peek())
                    ));
                }
                self.at += 1;
                Ok(Filter::IsNull { column, negated })
            }
            Some(Token::Word(w)) if w.eq_ignore_ascii_case("in") || w.eq_ignore_ascii_case("not") => {
                let negated = w.eq_ignore_ascii_case("not");
                self.at += 1;
                if negated {
                    if !self.keyword("in") {
                        return Err(format!("expected IN after NOT but found {}", describe(self.peek())));
                    }
                    self.at += 1;
                }
                if self.peek() != Some(&Token::Open) {
                    return Err(format!("expected '(' after IN but found {}", describe(self.peek())));
                }
                self.at += 1;
                let mut values = vec![self.literal()?];
                loop {
                    match self.peek() {
                        Some(Token::Comma) => {
                            self.at += 1;
                            values.push(self.literal()?);
                        }
                        Some(Token::Close) => {
                            self.at += 1;
                            break;
                        }
                        other => {
                            return Err(format!("expected ',' or ')' in an IN list but found {}", describe(other)))
                        }
                    }
                }
                if values.len() > MAX_TERMS {
                    return Err(format!("an IN list holds more than {MAX_TERMS} values"));
                }
                Ok(Filter::In { column, values, negated })
            }
            other => Err(format!(
                "expected a comparison (= <> < <= > >=), IS [NOT] NULL or [NOT] IN after column {:?} but found {}",
                column.as_str(),
                describe(other.as_ref())
            )),
        }
    }

    fn literal(&mut self) -> Result<Literal, String> {
        let value = match self.peek().cloned() {
            Some(Token::Text(t)) => Literal::Text(t),
            Some(Token::Number(n)) => Literal::Number(n),
            Some(Token::Word(w)) if w.eq_ignore_ascii_case("true") => Literal::Bool(true),
            Some(Token::Word(w)) if w.eq_ignore_ascii_case("false") => Literal::Bool(false),
            Some(Token::Word(w)) if w.eq_ignore_ascii_case("null") => {
                return Err("compare with NULL using IS NULL or IS NOT NULL".into())
            }
            other => {
                return Err(format!(
                    "expected a value ('text', a number, true or false) but found {}; columns cannot be compared with columns",
                    describe(other.as_ref())
                ))
            }
        };
        self.at += 1;
        Ok(value)
    }
}

fn is_keyword(word: &str) -> bool {
    ["and", "or", "not", "is", "null", "in", "true", "false"].iter().any(|k| word.eq_ignore_ascii_case(k))
}

fn describe(token: Option<&Token>) -> String {
    token.map_or_else(|| "the end of the filter".to_string(), Token::to_string)
}

#[cfg(test)]
mod tests;
