//! What Blob Storage accepts as a container name and a blob name, checked before any request.

use crate::state::StoreError;

/// Container names: 3-63 characters of lowercase letters, digits and single hyphens, starting and ending with
/// a letter or digit.
pub(super) fn validate_container_name(name: &str) -> Result<(), StoreError> {
    let valid = (3..=63).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--");
    if valid {
        Ok(())
    } else {
        Err(StoreError::Refused(format!(
            "invalid blob container name {name:?}: use 3-63 lowercase letters, digits and single hyphens"
        )))
    }
}

/// Keys come from the engine, but a store must not trust that: reject what Blob Storage would rename or
/// refuse (empty, too long, control characters, `.`/`..` or empty path segments, a trailing dot).
pub(super) fn validate_key(key: &str) -> Result<(), StoreError> {
    let valid = !key.is_empty()
        && key.len() <= 1024
        && !key.chars().any(|c| c.is_control() || c == '\\')
        && key.split('/').all(|part| !part.is_empty() && part != "." && part != "..")
        && !key.ends_with('.');
    if valid {
        Ok(())
    } else {
        Err(StoreError::Refused(format!("invalid state key {key:?}")))
    }
}
