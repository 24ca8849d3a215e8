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

/// Refuses a stored position of `table` (texts in the order of `types`) with a date or time text that is not
/// ISO, saying how to go on.
pub(super) fn check_iso<'a>(
    table: &str,
    types: impl IntoIterator<Item = &'a String>,
    texts: &[String],
) -> Result<(), String> {
    match types.into_iter().zip(texts).find(|(ty, text)| dated(ty) && !iso(text)) {
        None => Ok(()),
        Some((ty, text)) => Err(format!(
            "the stored position of {table} holds the {ty} {text:?}, written in a DateStyle other than ISO by an earlier handler; every session now writes and reads dates as ISO, so it would be read as another time. Reset the function to the same position written as ISO (YYYY-MM-DD hh:mm:ss+hh:mm): handler state reset <function> --to '<position>' --confirm"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(ty: &str, text: &str) -> Result<(), String> {
        check_iso("public.t", [&ty.to_string(), &"bigint".to_string()], &[text.to_string(), "7".to_string()])
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
}
