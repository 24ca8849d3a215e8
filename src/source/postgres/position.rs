//! Stored positions whose texts were written before the session contract (`db::postgres::session`).
//!
//! A position holds the cursor's and the key's text as PostgreSQL wrote it. Since the contract every session
//! writes a date or time as ISO (`2024-01-02 03:04:05+05:30`), and reads one back under `DateStyle` `ISO, MDY`.
//! A position stored by an earlier handler on a database whose sessions defaulted to another `DateStyle`
//! (`02/01/2024 03:04:05 IST` under `SQL, DMY`) would read back as another instant (February the 1st; `IST` as
//! Israel time): it is refused, naming the fix, rather than moved silently.

/// Whether `text`, a date or time column's text, is ISO: a year of four or more digits and a `-`, or an
/// infinity.
fn iso(text: &str) -> bool {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    (digits >= 4 && text.as_bytes().get(digits) == Some(&b'-')) || text == "infinity" || text == "-infinity"
}

/// Whether `ty` (as `format_type` spells it) writes its text by `DateStyle`.
fn dated(ty: &str) -> bool {
    ty.starts_with("date") || ty.starts_with("timestamp")
}

/// The first date or time text of `texts` (in the order of `types`) that is not ISO, with its type.
fn non_iso<'a, 't>(
    types: impl IntoIterator<Item = &'a String>,
    texts: &'t [String],
) -> Option<(&'a String, &'t String)> {
    types.into_iter().zip(texts).find(|(ty, text)| dated(ty) && !iso(text))
}

/// What a checked text was stored as, which says how an operator goes on when it is refused.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Stored {
    /// A function's checkpoint (cursor and key): reset it to the same position written as ISO.
    Checkpoint,
    /// A backfill's key position or bound: the backfill is walked again from its start.
    Backfill,
}

impl Stored {
    fn what(self) -> &'static str {
        match self {
            Self::Checkpoint => "position",
            Self::Backfill => "backfill position",
        }
    }

    fn fix(self) -> &'static str {
        match self {
            Self::Checkpoint => "Reset the function to the same position written as ISO (YYYY-MM-DD hh:mm:ss+hh:mm): handler state reset <function> --to '<position>' --confirm",
            Self::Backfill => "Cancel the backfill (handler state backfill <function> --cancel) and start it again",
        }
    }
}

/// Refuses a `stored` text set of `table` (texts in the order of `types`) with a date or time text that is not
/// ISO: it would be read as another time. The refusal names the value and how to go on.
pub(crate) fn check_iso<'a>(
    stored: Stored,
    table: &str,
    types: impl IntoIterator<Item = &'a String>,
    texts: &[String],
) -> Result<(), String> {
    match non_iso(types, texts) {
        None => Ok(()),
        Some((ty, text)) => Err(format!(
            "the stored {} of {table} holds the {ty} {text:?}, written in a DateStyle other than ISO by an earlier handler; every session now writes and reads dates as ISO, so it would be read as another time. {}",
            stored.what(),
            stored.fix()
        )),
    }
}

/// The texts of a stored checkpoint of a table of `shape` (`table`, as messages name it), checked against the
/// position's arity (the cursor and the key) and the session contract ([`check_iso`]).
pub(super) fn checkpoint_texts(
    shape: &super::sql::Shape,
    table: &str,
    p: &crate::source::Position,
) -> Result<Vec<String>, crate::source::SourceError> {
    use crate::source::SourceError;
    let texts: Option<Vec<String>> =
        p.as_array().and_then(|a| a.iter().map(|v| v.as_str().map(str::to_string)).collect());
    match texts {
        Some(t) if t.len() == shape.position_arity() => {
            let types = std::iter::once(&shape.cursor_type).chain(shape.key.iter().map(|(_, ty)| ty));
            check_iso(Stored::Checkpoint, table, types, &t).map_err(SourceError::Invalid)?;
            Ok(t)
        }
        _ => Err(SourceError::Invalid(format!(
            "stored position {p} does not fit {table} (expected {} values); reset the function's state",
            shape.position_arity()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(ty: &str, text: &str) -> Result<(), String> {
        check_iso(
            Stored::Checkpoint,
            "public.t",
            [&ty.to_string(), &"bigint".to_string()],
            &[text.to_string(), "7".to_string()],
        )
    }

    #[test]
    fn iso_dates_and_times_and_other_types_pass() {
        for (ty, text) in [
            ("timestamp with time zone", "2024-01-02 08:34:05+05:30"),
            ("timestamp(3) without time zone", "12345-01-01 00:00:00"),
            ("date", "4713-01-01 BC"),
            ("date", "infinity"),
            ("timestamp with time zone", "-infinity"),
            ("xid8", "12345"),
            ("text", "02/01/2024"),
        ] {
            assert_eq!(check(ty, text), Ok(()), "{ty} {text}");
        }
    }

    #[test]
    fn a_date_or_time_written_in_another_date_style_is_refused_with_the_fix() {
        for (ty, text) in [
            ("timestamp with time zone", "02/01/2024 03:04:05 UTC"),
            ("date", "02.01.2024"),
            ("timestamp without time zone", "Tue Jan 02 03:04:05 2024"),
        ] {
            let refused = check(ty, text).expect_err(text);
            assert!(
                refused.contains(text) && refused.contains("public.t") && refused.contains("handler state reset"),
                "{refused}"
            );
        }
    }

    #[test]
    fn a_backfill_position_is_checked_alike_and_refused_with_the_backfill_fix() {
        let types = ["bigint".to_string(), "date".to_string()];
        let texts = |day: &str| ["7".to_string(), day.to_string()];
        assert_eq!(check_iso(Stored::Backfill, "public.t", &types, &texts("2024-01-02")), Ok(()));
        let refused = check_iso(Stored::Backfill, "public.t", &types, &texts("02/01/2024")).expect_err("not ISO");
        assert_eq!(
            refused,
            "the stored backfill position of public.t holds the date \"02/01/2024\", written in a DateStyle other than ISO by an earlier handler; every session now writes and reads dates as ISO, so it would be read as another time. Cancel the backfill (handler state backfill <function> --cancel) and start it again"
        );
    }
}
