//! Every statement the logical source runs on a pooled connection (the stream's commands are in `wire`). Names reach SQL only quoted (`Ident::pg`) or as parameters; slot
//! and publication names are restricted to `[a-z0-9_]` by the options, and are parameters where PostgreSQL
//! takes them as values.

use crate::ident::Ident;

/// The server's wal_level, the login, whether the login may use replication slots, the server's version, and
/// the session's time zone.
pub const WAL_LEVEL: &str = "SELECT current_setting('wal_level'), current_user::text,
    coalesce((SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user), false),
    current_setting('server_version_num')::int4, current_setting('TimeZone')";

/// The table's oid, replica identity, schema and name; no row when it does not exist.
pub const TABLE: &str = "SELECT c.oid, c.relreplident::text, n.nspname::text, c.relname::text
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)";

/// Columns in table order: name, type (as SQL spells it), and whether the type (or a domain's base type) is
/// json or jsonb, whose text `jsonb_populate_record` would keep as a JSON string; then the type's OID and
/// modifier, as a Relation message names them; then the type a backfill filter's literal is cast to: the
/// (base) type without its modifier, schema-qualified (`'10.555'::numeric(12,2)` would round the literal to
/// 10.56 and `'abcd'::varchar(3)` cut it; `format_type(oid, NULL)` spells bpchar as `character`, length 1).
pub const COLUMNS: &str = "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod),
        coalesce(b.typname, t.typname) IN ('json', 'jsonb'), a.atttypid, a.atttypmod,
        format('%I.%I', en.nspname, e.typname)
    FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid LEFT JOIN pg_type b ON b.oid = nullif(t.typbasetype, 0)
    JOIN pg_type e ON e.oid = coalesce(b.oid, t.oid) JOIN pg_namespace en ON en.oid = e.typnamespace
    WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum";

/// The primary key's columns in key order.
pub const PRIMARY_KEY: &str = "SELECT a.attname::text FROM pg_index i
    CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
    JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
    WHERE i.indrelid = $1 AND i.indisprimary ORDER BY k.ord";

/// The columns of the replica identity index (`REPLICA IDENTITY USING INDEX`).
pub const IDENTITY_INDEX: &str = "SELECT a.attname::text FROM pg_index i
    CROSS JOIN LATERAL unnest(i.indkey::int2[]) AS k(attnum)
    JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
    WHERE i.indrelid = $1 AND i.indisreplident";

/// What a publication publishes.
pub const PUBLICATION: &str =
    "SELECT pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = $1";

/// Whether the publication has the table, with its row filter and column list (PostgreSQL 15 and later).
pub const PUBLISHED: &str = "SELECT rowfilter IS NULL, attnames::text[] FROM pg_publication_tables
    WHERE pubname = $1 AND schemaname = $2 AND tablename = $3";

/// `PUBLISHED` before PostgreSQL 15, which has neither row filters nor column lists.
pub const PUBLISHED_WHOLE: &str = "SELECT true, NULL::text[] FROM pg_publication_tables
    WHERE pubname = $1 AND schemaname = $2 AND tablename = $3";

/// The slot as `pg_replication_slots` shows it; no row when it does not exist.
pub const SLOT: &str = "SELECT plugin::text, database::text, current_database()::text, temporary,
        coalesce(wal_status, ''), confirmed_flush_lsn::text
    FROM pg_replication_slots WHERE slot_name = $1";

pub const CREATE_SLOT: &str = "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')";

pub const DROP_SLOT: &str = "SELECT pg_drop_replication_slot($1)";

/// Moves the slot to a position an acknowledged checkpoint has passed.
pub const ADVANCE: &str = "SELECT end_lsn::text FROM pg_replication_slot_advance($1, $2::text::pg_lsn)";

/// The WAL is flushed up to here: every commit record that starts before it can be decoded now.
pub const FLUSH: &str = "SELECT pg_current_wal_flush_lsn()::text";

/// Status: the slot's positions, the WAL it keeps the server from recycling, and the session reading it.
pub const SLOT_STATUS: &str = "SELECT s.confirmed_flush_lsn::text, s.restart_lsn::text,
        coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn), 0)::int8,
        coalesce(s.wal_status, ''), s.safe_wal_size, s.active_pid,
        a.application_name::text, a.client_addr::text, a.backend_start::text
    FROM pg_replication_slots s LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid WHERE s.slot_name = $1";

/// A temporary copy of the slot (`$1`) named `$2`, for status to peek at while the stream holds the slot.
pub const COPY_SLOT: &str = "SELECT pg_copy_logical_replication_slot($1, $2, true)::text";

/// Whether the slot (`$1`) has taken a flush report at or past `$2`.
pub const CONFIRMED_AT: &str = "SELECT coalesce(confirmed_flush_lsn >= $2::text::pg_lsn, false)
    FROM pg_replication_slots WHERE slot_name = $1";

/// Who holds the slot: the session of a backend pid.
pub const HOLDER: &str = "SELECT coalesce(application_name, ''), coalesce(client_addr::text, 'local')
    FROM pg_stat_activity WHERE pid = $1";

/// Up to `$2` messages (give or take a transaction) from the slot, decoded by pgoutput, with the flush
/// position read first and used as the bound: a stretch that ends at it without a change for this source is
/// proven empty. The server clock comes along for the lag. One row with null message columns when there are
/// no messages.
/// The slot is `$1`, so status can peek at a temporary copy.
pub fn peek(publication: &str) -> String {
    format!(
        "SELECT f.flush::text, f.now, p.lsn::text, p.data
        FROM (SELECT pg_current_wal_flush_lsn() AS flush, extract(epoch FROM clock_timestamp())::float8 AS now) f
        LEFT JOIN LATERAL pg_logical_slot_peek_binary_changes($1, f.flush, $2,
            'proto_version', '1', 'publication_names', '\"{publication}\"') p ON true"
    )
}

/// How a column reaches `Item`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Render {
    /// As `row_to_json` writes the column's type.
    Plain,
    /// bytea, as base64 (as the cursor source and the official trigger send binary columns).
    Base64,
    /// A json or jsonb column (or a domain over one), whose type this is: its text from the WAL is cast back
    /// to the type, so json keeps its exact text, as `row_to_json` of the table would.
    Json(String),
}

/// What builds `Item` from the values the WAL carries, in one statement per batch.
///
/// `$1` holds one JSON object (as text) per change: column name to the text the WAL carries, or null; a
/// TOAST-ed value an update did not touch is left out. `$2` says what to build: 0 the row, 1 the key, 2 the
/// row with the left-out columns read from the table by key. `jsonb_populate_record` runs each text through the column type's input function, and the
/// projection is the cursor source's (`row_to_json`, bytea as base64), so a value reaches the consumer as the
/// cursor source would send it. When the row is gone by the time it is read back (a delete follows in the
/// stream), the left-out columns are left out of `Item` rather than sent as a null the row never held; that
/// object is written member by member as `row_to_json` writes one (`"name":` then `to_json` of the value, which
/// is the same `datum_to_json`, joined by commas without spaces), so it has `row_to_json`'s bytes.
pub fn items(table: &str, key: &[Ident], columns: &[(Ident, Render)]) -> String {
    let value = |c: &Ident, render: &Render| match render {
        Render::Plain => format!("q.{}", c.pg()),
        Render::Base64 => format!("translate(encode(q.{}, 'base64'), E'\\n', '')", c.pg()),
        Render::Json(ty) => {
            let name = literal(c.as_str());
            format!("CASE WHEN x.j ? {name} THEN (x.j->>{name})::{ty} ELSE q.{} END", c.pg())
        }
    };
    let projected: Vec<String> = columns.iter().map(|(c, r)| format!("{} AS {}", value(c, r), c.pg())).collect();
    let members: Vec<String> = columns
        .iter()
        .map(|(c, r)| {
            let (name, member) = (literal(c.as_str()), literal(&format!("{}:", super::item::escape_json(c.as_str()))));
            format!("CASE WHEN x.j ? {name} THEN {member} || coalesce(to_json({})::text, 'null') END", value(c, r))
        })
        .collect();
    let key_projection: Vec<String> = key.iter().map(|k| format!("q.{} AS {}", k.pg(), k.pg())).collect();
    let key_match: Vec<String> = key.iter().map(|k| format!("c.{} = p.{}", k.pg(), k.pg())).collect();
    format!(
        "SELECT CASE WHEN o.kind = 1 THEN (SELECT row_to_json(k.*)::text FROM (SELECT {keys}) k)
            WHEN o.kind = 2 AND cur.row IS NULL THEN '{{' || array_to_string(ARRAY[{members}], ',') || '}}'
            ELSE (SELECT row_to_json(r.*)::text FROM (SELECT {cols}) r) END
        FROM unnest($1::text[], $2::int4[]) WITH ORDINALITY AS o(t, kind, n)
        CROSS JOIN LATERAL (SELECT o.t::jsonb AS j) AS x
        CROSS JOIN LATERAL jsonb_populate_record(NULL::{table}, x.j) AS p
        LEFT JOIN LATERAL (SELECT to_jsonb(c) AS row FROM {table} c WHERE o.kind = 2 AND {matched}) cur ON true
        CROSS JOIN LATERAL jsonb_populate_record(NULL::{table}, coalesce(cur.row, '{{}}'::jsonb) || x.j) AS q
        ORDER BY o.n",
        keys = key_projection.join(", "),
        cols = projected.join(", "),
        members = members.join(", "),
        matched = key_match.join(" AND "),
    )
}

/// A SQL string literal.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_items_statement_quotes_every_name() {
        let key = vec![Ident::new("Order \"Id\"").expect("a name")];
        let cols = vec![
            (Ident::new("Order \"Id\"").expect("a name"), Render::Plain),
            (Ident::new("blob").expect("a name"), Render::Base64),
            (Ident::new("it's").expect("a name"), Render::Json("jsonb".into())),
        ];
        let s = items("\"s\".\"t\"", &key, &cols);
        assert!(s.contains("q.\"Order \"\"Id\"\"\" AS \"Order \"\"Id\"\"\""), "{s}");
        assert!(s.contains("c.\"Order \"\"Id\"\"\" = p.\"Order \"\"Id\"\"\""), "{s}");
        assert!(s.contains("translate(encode(q.\"blob\", 'base64'), E'\\n', '') AS \"blob\""), "{s}");
        assert!(s.contains("NULL::\"s\".\"t\""), "{s}");
        // the object of a row gone since is written as row_to_json writes one: JSON-escaped names, no spaces
        assert!(
            s.contains("CASE WHEN x.j ? 'Order \"Id\"' THEN '\"Order \\\"Id\\\"\":' || coalesce(to_json(q.\"Order \"\"Id\"\"\")::text, 'null') END"),
            "{s}"
        );
        assert!(s.contains("THEN '\"it''s\":' || coalesce(to_json(CASE WHEN x.j ? 'it''s'"), "{s}");
        assert!(s.contains("'{' || array_to_string(ARRAY[CASE"), "{s}");
        assert!(
            s.contains("CASE WHEN x.j ? 'it''s' THEN (x.j->>'it''s')::jsonb ELSE q.\"it's\" END AS \"it's\""),
            "{s}"
        );
    }
}
