//! The conformance table: every built-in type of PostgreSQL 15 a user might put in a table, each column with its
//! edge values. Row `n` (1-based) holds each column's `n`-th value, or NULL past its list (so every column has
//! NULLs and every row has values). Values are SQL expressions written in unambiguous ISO input, so a hostile session's
//! `DateStyle` or `TimeZone` cannot change what is stored.

/// One column: its name, its type, its values (SQL expressions).
pub struct Column {
    pub name: &'static str,
    pub ty: &'static str,
    pub values: &'static [&'static str],
}

/// How many rows the table gets (the last is all NULL).
pub const ROWS: usize = 8;

/// The row whose update leaves its 1 MB values alone (the logical sources must still deliver them).
pub const TOAST_ROW: i64 = 1;

/// Types the table needs before its columns: a domain, an enum, a composite.
pub const TYPES: &str = r#"
CREATE DOMAIN public.positive AS numeric CHECK (VALUE > 0);
CREATE TYPE public.mood AS ENUM ('sad', 'ok', 'très 😀 happy');
CREATE TYPE public.pair AS (a int, b text, at timestamptz, n numeric);
"#;

/// A megabyte of text that does not compress (TOAST stores it out of line, uncompressed).
const MB_TEXT: &str = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 32768) g)";
/// A megabyte of bytes.
const MB_BYTES: &str = "(SELECT decode(string_agg(md5(g::text), ''), 'hex') FROM generate_series(1, 65536) g)";

pub const COLUMNS: &[Column] = &[
    Column { name: "bool", ty: "boolean", values: &["true", "false"] },
    Column { name: "i2", ty: "smallint", values: &["-32768", "32767", "0"] },
    Column { name: "i4", ty: "integer", values: &["-2147483648", "2147483647"] },
    Column { name: "i8", ty: "bigint", values: &["-9223372036854775808", "9223372036854775807", "9007199254740993"] },
    Column {
        name: "num",
        ty: "numeric",
        values: &[
            "'NaN'",
            "'Infinity'",
            "'-Infinity'",
            "1234567890123456789012345678901234567890",
            "-123456789012345678901.2345678901234567890",
            "120.00",
            "0.000000000000000000000000000000000000001",
        ],
    },
    Column { name: "num_scaled", ty: "numeric(12, 2)", values: &["0.5", "-999.99", "1e9"] },
    Column {
        name: "f4",
        ty: "real",
        values: &["'NaN'", "'Infinity'", "'-Infinity'", "1.1", "3.4028235e38", "1e-45", "'-0'"],
    },
    Column {
        name: "f8",
        ty: "double precision",
        values: &["'NaN'", "'Infinity'", "'-Infinity'", "0.1", "1.0000000000000002", "5e-324", "1e15"],
    },
    Column { name: "money", ty: "money", values: &["1234.56", "-0.01", "'92233720368547758.07'"] },
    Column {
        name: "text",
        ty: "text",
        values: &[
            "E'quote \" back \\\\ nl \\n cr \\r tab \\t ctl \\x01 del \\x7f \\u2028'",
            "'é€ astral 😀 𝄞 𠜎'",
            "''",
            "'2024-07-02T03:04:05+02:00'",
            "' spaces  '",
        ],
    },
    Column { name: "varchar", ty: "varchar(20)", values: &["'abc'", "''"] },
    Column { name: "bpchar", ty: "char(5)", values: &["'ab'", "'é'"] },
    Column { name: "name", ty: "name", values: &["'n\"m\\'"] },
    Column { name: "char1", ty: "\"char\"", values: &["'x'"] },
    Column {
        name: "uuid",
        ty: "uuid",
        values: &["'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'", "'00000000-0000-0000-0000-000000000000'"],
    },
    Column {
        name: "json",
        ty: "json",
        values: &[
            r#"'{"b":1,  "a" : 2, "a": 3, "n": 0.10000000000000000000001, "big": 12345678901234567890123}'"#,
            "'  [ ]  '",
            "'null'",
            r#"E'{\n  "nl": "x"\n}'"#,
            r#"'"just a string"'"#,
            "'12345678901234567890.50'",
            r#"'{"deep": [[[1.0]]], "at": "2024-07-02T03:04:05+02:00"}'"#,
            // Last: the PostgreSQL sink cannot write it until the fix of its \u0000 defect; a sink test with
            // batches of one row still shows every row before it.
            r#"'{"nul": "a\u0000b"}'"#,
        ],
    },
    Column {
        name: "jsonb",
        ty: "jsonb",
        values: &[
            r#"'{"n": 123456789012345678901234567890.5, "m": 2.50, "e": 1e-30, "s": "é\"\\"}'"#,
            "'null'",
            r#"'[1, "two", {"k": null}, true]'"#,
            r#"'"2024-07-02T03:04:05+02:00"'"#,
        ],
    },
    Column { name: "bytea", ty: "bytea", values: &["'\\x00ff10deadbeef'", "''", "'\\x5c'"] },
    Column {
        name: "date",
        ty: "date",
        values: &["'2024-02-29'", "'0044-03-15 BC'", "'12345-01-01'", "'infinity'", "'-infinity'", "'4713-01-01 BC'"],
    },
    Column {
        name: "ts",
        ty: "timestamp",
        values: &[
            "'1999-12-31 23:59:59.999999'",
            "'0044-03-15 12:00:00 BC'",
            "'12345-01-01 00:00:00'",
            "'infinity'",
            "'-infinity'",
            "'2024-07-01 12:00:00.5'",
        ],
    },
    Column {
        name: "tstz",
        ty: "timestamptz",
        values: &[
            "'2024-02-29 23:59:59.123456+05:30'",
            "'1850-01-01 00:00:00+00'",
            "'infinity'",
            "'-infinity'",
            "'0044-03-15 12:00:00+00 BC'",
            "'12345-01-01 00:00:00+00'",
            "'2024-07-01 12:00:00-03:30'",
        ],
    },
    Column { name: "time", ty: "time", values: &["'00:00:00'", "'23:59:59.999999'", "'24:00:00'"] },
    Column { name: "timetz", ty: "timetz", values: &["'12:34:56.789+05:30'", "'00:00:00-15:59'"] },
    Column {
        name: "interval",
        ty: "interval",
        values: &[
            "'1 year 2 mons 3 days 04:05:06.789'",
            "'-1 days +02:00:00'",
            "'178000000 years'",
            "'-00:00:00.000001'",
            "'0'",
            "'1 mon -1 day'",
        ],
    },
    Column { name: "bit", ty: "bit(4)", values: &["B'1010'", "B'0000'"] },
    Column { name: "varbit", ty: "bit varying", values: &["B''", "B'101'"] },
    Column { name: "inet", ty: "inet", values: &["'192.168.0.1/24'", "'::1'", "'2001:db8::1/64'"] },
    Column { name: "cidr", ty: "cidr", values: &["'10.0.0.0/8'", "'2001:db8::/32'"] },
    Column { name: "macaddr", ty: "macaddr", values: &["'08:00:2b:01:02:03'"] },
    Column { name: "macaddr8", ty: "macaddr8", values: &["'08:00:2b:01:02:03:04:05'"] },
    Column { name: "point", ty: "point", values: &["'(1.5,-2)'", "'(0.1,1e300)'"] },
    Column { name: "line", ty: "line", values: &["'{1,2,3}'"] },
    Column { name: "lseg", ty: "lseg", values: &["'[(0,0),(1,1)]'"] },
    Column { name: "box", ty: "box", values: &["'(1,1),(0,0)'"] },
    Column { name: "path", ty: "path", values: &["'[(0,0),(1,1),(2,0)]'", "'((0,0),(1,1))'"] },
    Column { name: "polygon", ty: "polygon", values: &["'((0,0),(1,1),(1,0))'"] },
    Column { name: "circle", ty: "circle", values: &["'<(0,0),1.5>'"] },
    Column { name: "xml", ty: "xml", values: &["'<a b=\"1\">é &amp; x</a>'", "'text only'"] },
    Column { name: "tsvector", ty: "tsvector", values: &["'a fat:2 cat:3A ''quoted'''"] },
    Column { name: "tsquery", ty: "tsquery", values: &["'fat & (rat | !cat)'"] },
    Column { name: "int4range", ty: "int4range", values: &["'[1,5)'", "'empty'", "'(,)'"] },
    Column { name: "int8range", ty: "int8range", values: &["'[-9223372036854775808,0]'"] },
    Column { name: "numrange", ty: "numrange", values: &["'[0.1,1e20]'", "'(,NaN)'"] },
    Column { name: "tsrange", ty: "tsrange", values: &["'[\"2024-01-01 00:00\",infinity)'"] },
    Column { name: "tstzrange", ty: "tstzrange", values: &["'[2024-01-01 00:00+00,2024-06-01 00:00+00)'"] },
    Column { name: "daterange", ty: "daterange", values: &["'[2024-01-01,2024-12-31]'"] },
    Column { name: "int4multirange", ty: "int4multirange", values: &["'{[1,3),[5,7)}'", "'{}'"] },
    Column { name: "tstzmultirange", ty: "tstzmultirange", values: &["'{[2024-01-01 00:00+00,2024-01-02 00:00+00)}'"] },
    Column {
        name: "int_array",
        ty: "integer[]",
        values: &["'{1,2,NULL}'", "'[0:2]={1,2,3}'", "'{{1,2},{3,4}}'", "'{}'"],
    },
    Column { name: "text_array", ty: "text[]", values: &["ARRAY['a', 'b c', 'ü\"q', NULL, '😀', '']"] },
    Column {
        name: "tstz_array",
        ty: "timestamptz[]",
        values: &["ARRAY['2024-01-01 00:00+00'::timestamptz, 'infinity']"],
    },
    Column { name: "f8_array", ty: "double precision[]", values: &["'{0.1,NaN,Infinity,-0}'"] },
    Column { name: "num_array", ty: "numeric[]", values: &["'{1.50,NaN}'"] },
    Column { name: "bytea_array", ty: "bytea[]", values: &["ARRAY['\\x00ff'::bytea, '']"] },
    Column { name: "domain", ty: "public.positive", values: &["3.14"] },
    Column { name: "enum", ty: "public.mood", values: &["'très 😀 happy'", "'sad'"] },
    Column {
        name: "composite",
        ty: "public.pair",
        values: &["ROW(1, 'x \"y\"', '2024-01-01 00:00+00', 1.50)::public.pair", "ROW(NULL, NULL, NULL, NULL)"],
    },
    Column { name: "oid", ty: "oid", values: &["4294967295", "0"] },
    Column { name: "regclass", ty: "regclass", values: &["'pg_class'"] },
    Column { name: "regtype", ty: "regtype", values: &["'integer'"] },
    Column { name: "xid", ty: "xid", values: &["'4294967295'"] },
    Column { name: "xid8", ty: "xid8", values: &["'18446744073709551615'"] },
    Column { name: "pg_lsn", ty: "pg_lsn", values: &["'16/B374D848'", "'FFFFFFFF/FFFFFFFF'"] },
    Column { name: "snapshot", ty: "pg_snapshot", values: &["'10:20:10,14,15'"] },
    Column { name: "toast_text", ty: "text", values: &[MB_TEXT] },
    Column { name: "toast_bytea", ty: "bytea", values: &[MB_BYTES] },
];

/// The columns whose types the logical source renders itself, from the WAL's text, with no statement
/// (src/source/postgres_logical/item.rs): a table of only these takes that path; any other column sends the
/// whole table's Items through PostgreSQL.
pub const HANDLER_BUILT: &[&str] = &[
    "bool",
    "i2",
    "i4",
    "i8",
    "num",
    "num_scaled",
    "text",
    "varchar",
    "bpchar",
    "name",
    "uuid",
    "json",
    "jsonb",
    "date",
    "ts",
    "tstz",
    "xid8",
    "toast_text",
];

/// Every column of the table, or only those of [`HANDLER_BUILT`].
pub fn columns(handler_built_only: bool) -> Vec<&'static Column> {
    COLUMNS.iter().filter(|c| !handler_built_only || HANDLER_BUILT.contains(&c.name)).collect()
}

/// `"name"`: every column name here is a plain identifier, quoted anyway.
pub fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `CREATE TABLE public.<table>` with `columns`, and `extra` column definitions after them.
pub fn create_table(table: &str, columns: &[&Column], extra: &str) -> String {
    let columns: Vec<String> = columns.iter().map(|c| format!("{} {}", quoted(c.name), c.ty)).collect();
    format!("CREATE TABLE public.{table} (id bigint PRIMARY KEY, {}{extra});", columns.join(", "))
}

/// The INSERT of every row into `columns`, one statement (one transaction).
pub fn insert_rows(table: &str, columns: &[&Column]) -> String {
    let names: Vec<String> = columns.iter().map(|c| quoted(c.name)).collect();
    let rows: Vec<String> = (0..ROWS)
        .map(|n| {
            let values: Vec<&str> = columns.iter().map(|c| c.values.get(n).copied().unwrap_or("NULL")).collect();
            format!("({}, {})", n + 1, values.join(", "))
        })
        .collect();
    format!("INSERT INTO public.{table} (id, {}) VALUES {};", names.join(", "), rows.join(",\n"))
}

/// An update of [`TOAST_ROW`] that leaves its 1 MB values alone (the WAL carries them as "unchanged").
pub fn update_leaving_toast(table: &str) -> String {
    format!("UPDATE public.{table} SET \"i4\" = 7 WHERE id = {TOAST_ROW};")
}

/// The column names, in table order.
pub fn names() -> Vec<&'static str> {
    COLUMNS.iter().map(|c| c.name).collect()
}
