//! The session contract: the settings every SQL Server connection the handler opens (the change-tracking and
//! rowversion sources, their backfills, status and the state CLI, the SQL Server sink) pins right after login,
//! before its first statement, so that no text a consumer receives and no value the handler parses back
//! depends on the login's default language or on what the server was configured with.
//!
//! A TDS login carries no language, so a session starts in its login's default language (`CREATE LOGIN ...
//! WITH DEFAULT_LANGUAGE = Deutsch`, or the server's `default language` option), and the language brings its
//! own DATEFORMAT and DATEFIRST. Each pinned setting, and what it changes in the handler's statements:
//!
//! | setting | pinned to | what it decides |
//! |---|---|---|
//! | `LANGUAGE` | `us_english` | month names in a style-less `CONVERT(NVARCHAR(MAX), x)` of a `datetime`/`smalldatetime` key (the keyset positions the sources record and compare: `Mär  1 2024` under Deutsch), and the language of the server's error messages the handler quotes in its own |
//! | `DATEFORMAT` | `ymd` | how text is read into `datetime`/`smalldatetime`: the sink's `OPENJSON ... WITH` reads `2024-01-02 03:04:05` into a `datetime` column as 2 January only under `ymd` (under `dmy`, Deutsch's and British's, it is 1 February) |
//! | `DATEFIRST` | `7` | the first day of the week (`DATEPART(weekday, ...)`), which a `filter` or a partition expression may use |
//! | `TEXTSIZE` | `2147483647` | how much of an `nvarchar(max)`/`varbinary(max)` value a `SELECT` returns: the sources' `FOR JSON` rows and recorded keys are `nvarchar(max)`. The ODBC and OLE DB drivers and tedious send the same on connect; tiberius sends none |
//! | `ANSI_WARNINGS` | `ON` | a value too long for its column, or an arithmetic overflow, is an error rather than silently truncated or made NULL (the sink's writes) |
//! | `NUMERIC_ROUNDABORT` | `OFF` | a decimal rounded to its column's scale is rounded, not refused (the server's `user options` can turn it on for every login) |
//!
//! `SET LANGUAGE` sets DATEFORMAT and DATEFIRST to the language's own, so it comes first and the two after it.
//! The batch is sent as a plain batch, not through `sp_executesql`: a `SET` inside a procedure (which
//! `sp_executesql` is) ends with it, a `SET` in a batch holds for the session. tiberius resets nothing between
//! the pool's uses of a connection (no `sp_reset_connection`), so once per connection is enough.
//!
//! Not pinned: the collation (a column's own decides comparisons; the sources compare keys under it), and the
//! `ANSI_NULLS`, `ANSI_PADDING`, `QUOTED_IDENTIFIER` and `CONCAT_NULL_YIELDS_NULL` options, which the server
//! turns on for every login that, like tiberius, sets the ODBC flag of the login packet.

/// The batch every connection sends after login, before anything else (golden text:
/// `tests/golden/mssql_session/session.sql`).
pub const BATCH: &str = "SET LANGUAGE us_english; SET DATEFORMAT ymd; SET DATEFIRST 7; SET TEXTSIZE 2147483647; \
                         SET ANSI_WARNINGS ON; SET NUMERIC_ROUNDABORT OFF;";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_batch_is_the_reviewed_golden_text() {
        let golden = include_str!("../../../tests/golden/mssql_session/session.sql");
        let text = golden.lines().filter(|l| !l.starts_with("--")).collect::<Vec<_>>().join("\n");
        assert_eq!(BATCH, text.trim_end());
    }

    #[test]
    fn the_language_comes_before_the_settings_it_would_reset() {
        let at = |s: &str| BATCH.find(s).unwrap_or_else(|| panic!("{s} is pinned"));
        assert!(at("SET LANGUAGE") < at("SET DATEFORMAT"));
        assert!(at("SET LANGUAGE") < at("SET DATEFIRST"));
    }
}
