//! Wire types of the data plane beyond DAIV's seven fs ops: `stat`, `mkdir`, `move`, `list` (the
//! `fs/{op}` routes the HTTP API serves and the helper answers with) and the answers of raw file
//! reads and writes. Paths are absolute and may be anywhere in the container
//! ([`validate_any_path`]); the helper acts with the sandbox user's ids, so permissions are the
//! kernel's, and the service's own directory is out of reach. Errors use the codes of
//! [`FsErrorCode`], in `error` as the seven ops do.

use serde::{Deserialize, Serialize};

use crate::wire::{FsError, FsErrorCode};

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum EntryType {
    File,
    Directory,
    Symlink,
    /// A FIFO, socket or device.
    Other,
}

/// One entry, as `stat` and `list` describe it (a symlink itself, not its target).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileEntry {
    /// The last component of `path` (`/` for the root).
    pub name: String,
    /// Absolute path.
    pub path: String,
    #[serde(rename = "type")]
    pub entry_type: EntryType,
    /// Bytes (of a symlink: its target's length).
    pub size: u64,
    /// Permission bits, setuid/setgid/sticky included (0..=0o7777).
    pub mode: u32,
    /// `ls -l` style, e.g. `drwxr-xr-x`.
    pub permissions: String,
    /// The owner's name in the container's `/etc/passwd`, else the numeric uid.
    pub owner: String,
    /// The group's name in the container's `/etc/group`, else the numeric gid.
    pub group: String,
    /// Last modification, Unix seconds.
    pub mtime: i64,
    /// A symlink's target as stored; null for anything else.
    pub symlink_target: Option<String>,
    /// A file's or directory's metadata: its `user.e2b.<key>` extended attributes (E2B's file
    /// metadata), by key; absent when it has none.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub metadata: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FsStatRequest {
    pub path: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FsStatResponse {
    pub entry: Option<FileEntry>,
    pub error: Option<FsError>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FsMkdirRequest {
    pub path: String,
    /// Create missing parents too (then an existing directory is no error).
    #[serde(default)]
    pub parents: bool,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FsMkdirResponse {
    pub ok: bool,
    /// A directory was made (false: it already existed, with `parents`).
    pub created: bool,
    pub error: Option<FsError>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FsMoveRequest {
    pub source: String,
    pub destination: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FsMoveResponse {
    pub ok: bool,
    pub error: Option<FsError>,
}

fn default_depth() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FsListRequest {
    pub path: String,
    /// Levels listed: 1 is the directory's own entries (at most [`LIST_MAX_DEPTH`]).
    #[serde(default = "default_depth")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 32))]
    pub depth: u32,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FsListResponse {
    /// Sorted by path.
    pub entries: Vec<FileEntry>,
    /// More than [`crate::wire::LIST_MAX_ENTRIES`] entries: the walk stopped there.
    pub truncated: bool,
    pub error: Option<FsError>,
}

/// The answer of a raw read (after its data) or write.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileAnswer {
    /// Bytes sent or written.
    pub bytes: u64,
    pub error: Option<FsError>,
}

/// Deepest `list`.
pub const LIST_MAX_DEPTH: u32 = 32;

/// The one rule of a file's mode in a request (`fs/write`, `PUT /files`): 0 to `0o7777`, what
/// `chmod` takes; a file gets its permission bits only (`0o777`): no request sets a setuid,
/// setgid or sticky bit.
pub const MODE_MAX: u32 = 0o7777;

/// `mode`'s permission bits, or why it is no mode.
pub fn permission_bits(mode: u32) -> Result<u32, String> {
    if mode > MODE_MAX {
        return Err(format!(
            "mode must be between 0 and {MODE_MAX} (0o7777), got {mode}"
        ));
    }
    Ok(mode & 0o777)
}

/// A lexically validated absolute path anywhere: no NUL, CR or LF, no `..` component; repeated
/// slashes, `.` components and a trailing slash removed. The helper resolves symlinks itself.
pub fn validate_any_path(path: &str) -> Result<String, FsError> {
    let bad = |m: String| Err(FsError::new(FsErrorCode::InvalidPath, m));
    if path.contains(['\0', '\n', '\r']) {
        return bad(format!(
            "path must not contain NUL or newline characters: {path:?}"
        ));
    }
    if !path.starts_with('/') {
        return bad(format!("path must be absolute, got: {path:?}"));
    }
    let comps: Vec<&str> = path
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    if comps.contains(&"..") {
        return bad(format!("path must not contain '..' segments: {path:?}"));
    }
    Ok(format!("/{}", comps.join("/")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn any_absolute_path_is_accepted_lexically() {
        assert_eq!(validate_any_path("/etc//./x/").unwrap(), "/etc/x");
        assert_eq!(validate_any_path("/").unwrap(), "/");
        for bad in ["", "etc", "/a/../b", "/a\0", "/a\nb", "./a"] {
            assert_eq!(
                validate_any_path(bad).unwrap_err().code,
                FsErrorCode::InvalidPath,
                "{bad:?}"
            );
        }
    }
}
