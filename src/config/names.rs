//! The names configuration turns into storage paths: function and app names (parts of state keys and URLs)
//! and the state container's name. Checked by configuration loading and the partitions commands.

/// Function and app names become parts of state keys and URLs.
pub(crate) fn valid_path_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s != "."
        && s != ".."
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A blob container name as Azure Storage accepts it.
pub(super) fn valid_container_name(s: &str) -> bool {
    (3..=63).contains(&s.len())
        && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
        && !s.contains("--")
}
