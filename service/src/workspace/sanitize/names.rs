//! Member names and modes, normalised before anything is emitted. Names are the first of the
//! three escape guards in the parent module's docs: an absolute name or a `..` component refuses
//! the whole archive.

use super::{PATH_MAX, SanitizeError, shown};

/// `name` split into components, or `None` for the root itself (`.`, `./`).
pub(super) fn normalize(raw: &[u8]) -> Result<Option<Vec<&[u8]>>, SanitizeError> {
    if raw.len() as u64 >= PATH_MAX {
        return Err(SanitizeError::NameTooLong);
    }
    if raw.starts_with(b"/") {
        return Err(SanitizeError::Absolute(shown(raw)));
    }
    let comps: Vec<&[u8]> = raw
        .split(|b| *b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .collect();
    if comps.iter().any(|c| *c == b"..") {
        return Err(SanitizeError::Traversal(shown(raw)));
    }
    Ok((!comps.is_empty()).then_some(comps))
}

/// Modes as `chmod a+rX,u+w`, special bits cleared.
pub fn normalize_mode(mode: u32, is_dir: bool) -> u32 {
    let base = mode & 0o777;
    let mut m = base | 0o444 | 0o200;
    if is_dir || base & 0o111 != 0 {
        m |= 0o111;
    }
    m
}
