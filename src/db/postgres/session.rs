//! The session contract: the settings every PostgreSQL connection the handler opens (source pools, the
//! replication stream, backfill, status, sinks, the state CLI) carries in its start-up packet, so that no text a
//! consumer receives or the handler parses back depends on how the server, the database or the role was
//! configured (`ALTER DATABASE ... SET DateStyle = 'SQL, DMY'` and the like).
//!
//! pg_dump pins the same settings for the same reason (its `SET DATESTYLE = ISO`, `SET INTERVALSTYLE =
//! POSTGRES`, `SET extra_float_digits TO 3`). Each one, and what it changes:
//!
//! | setting | pinned to | what it decides |
//! |---|---|---|
//! | `DateStyle` | `ISO, MDY` | date and time output (`2024-01-02 03:04:05+05:30`: numeric offsets, never a zone abbreviation such as `IST` that reads back as another zone; BC years as `0001-01-01 BC`), so also ranges and arrays of them; `MDY` only orders ambiguous *input*, which the handler never sends |
//! | `IntervalStyle` | `postgres` | interval output (`1 year 2 mons 3 days 04:05:06`), which every IntervalStyle reads back |
//! | `extra_float_digits` | `3` | float4/float8 output: the shortest text that reads back to the same bits (`0` rounds to 15 digits, and `1.79769313486232e+308` no longer fits a double) |
//! | `bytea_output` | `hex` | bytea inside arrays, composites and domains (`\x0102`); a top-level bytea column is base64 on every path |
//! | `standard_conforming_strings` | `on` | a backslash in a `'...'` literal the handler writes is a backslash, not an escape |
//! | `xmloption` | `content` | an xml value written by the sink is parsed as content, which every stored xml value is |
//!
//! `TimeZone` is **not** pinned: a session keeps the database's (or the role's) zone. With `DateStyle` ISO every
//! `timestamptz` text carries its numeric UTC offset, so the instant is exact in any zone; and the cursor
//! source's `now() - lag` guard over a `timestamp without time zone` column must compare in the zone its
//! writers' `now()` wrote in, which is the database's. To choose another zone for what consumers see, set it in
//! the connection string (`options=-c TimeZone=UTC`). `lc_monetary` is not pinned either: it decides how many
//! fractional digits a `money` value has, so changing it would change the value.
//!
//! A connection string's own `options` are kept; the pinned settings come after them, so they win (PostgreSQL
//! applies repeated `-c` switches in order).

/// The pinned settings, in the order they are sent.
pub const PINNED: &[(&str, &str)] = &[
    ("DateStyle", "ISO, MDY"),
    ("IntervalStyle", "postgres"),
    ("extra_float_digits", "3"),
    ("bytea_output", "hex"),
    ("standard_conforming_strings", "on"),
    ("xmloption", "content"),
];

/// The start-up packet's `options` for a connection string whose own `options` are `existing`: those first,
/// then a `-c name=value` switch per pinned setting. Spaces inside a value are escaped with a backslash, as
/// the server's `pg_split_opts` reads them.
pub fn options(existing: Option<&str>) -> String {
    let pinned = PINNED
        .iter()
        .map(|(name, value)| format!("-c {name}={}", value.replace(' ', "\\ ")))
        .collect::<Vec<_>>()
        .join(" ");
    match existing.map(str::trim) {
        Some(existing) if !existing.is_empty() => format!("{existing} {pinned}"),
        _ => pinned,
    }
}

/// Puts the pinned settings into `config`'s start-up options.
pub fn pin(config: &mut tokio_postgres::Config) {
    let options = options(config.get_options());
    config.options(&options);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pinned_settings_follow_the_connection_strings_own_options() {
        let pinned = "-c DateStyle=ISO,\\ MDY -c IntervalStyle=postgres -c extra_float_digits=3 -c bytea_output=hex \
                      -c standard_conforming_strings=on -c xmloption=content";
        assert_eq!(options(None), pinned);
        assert_eq!(options(Some("  ")), pinned);
        assert_eq!(options(Some("-c TimeZone=UTC")), format!("-c TimeZone=UTC {pinned}"));
    }
}
