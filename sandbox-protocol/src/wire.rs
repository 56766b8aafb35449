//! `fs/*` wire types, shaped like DAIV's client schemas (`Fs*Request`/`Fs*Response`). Every
//! response carries `error` (null on success); problems with the request's path or content are
//! reported there with HTTP 200, HTTP statuses being reserved for 403/404/409/503.
//!
//! Shared by the control plane (which re-exports it as its wire module) and the helper, with the
//! constants and the lexical path check both sides apply.

use serde::{Deserialize, Serialize};

use crate::layout::WORKSPACE;

/// Stable, machine-branchable error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum FsErrorCode {
    InvalidPath,
    NotFound,
    NotADirectory,
    IsADirectory,
    NotATextFile,
    StringNotFound,
    MultipleOccurrences,
    AlreadyExists,
    TooLarge,
    InvalidOffset,
    PermissionDenied,
    ExecFailed,
    InvalidPattern,
    /// The data plane's routes only (never the seven ops): a directory in the way is not empty.
    NotEmpty,
    /// The data plane's routes only: the disk is full (HTTP 507).
    NoSpace,
    /// The data plane's routes only: a byte range past the end of the file (HTTP 416).
    InvalidRange,
}

impl FsErrorCode {
    /// The wire spelling (`not_found`, ...), e.g. as a metrics label.
    pub fn label(self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_else(|| format!("{self:?}"))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FsError {
    pub code: FsErrorCode,
    /// Human-readable hint the agent can act on (never empty).
    pub message: String,
}

impl FsError {
    pub fn new(code: FsErrorCode, message: impl Into<String>) -> Self {
        let mut message = message.into();
        if message.is_empty() {
            message = format!("{code:?}");
        }
        Self { code, message }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FsEntry {
    /// Absolute path of the entry.
    pub path: String,
    pub is_dir: bool,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FsLsRequest {
    pub path: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FsLsResponse {
    pub entries: Vec<FsEntry>,
    pub error: Option<FsError>,
}

fn default_limit() -> u64 {
    2000
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FsReadRequest {
    pub path: String,
    /// 0-indexed start line (text files only).
    #[serde(default)]
    pub offset: u64,
    /// Maximum number of lines (text files only), at least 1.
    #[serde(default = "default_limit")]
    pub limit: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FsReadResponse {
    /// UTF-8 text or base64 binary; for an empty file, a human-readable sentinel.
    pub content: Option<String>,
    /// `utf-8` or `base64`.
    pub encoding: Option<String>,
    /// Total source lines (text reads only). Counting stops 64 MiB past the page: for a file
    /// longer than that, the lines counted up to there (a lower bound).
    pub total_lines: Option<u64>,
    /// 1-indexed last complete line in `content` (text reads only).
    pub end_line: Option<u64>,
    /// The page was cut at the byte cap; the text past `end_line` is a partial line.
    pub truncated: bool,
    pub error: Option<FsError>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FsGrepRequest {
    /// POSIX extended regular expression.
    pub pattern: String,
    pub path: String,
    /// Basename glob restricting which files are searched.
    #[serde(default)]
    pub glob: Option<String>,
    /// Directory basenames/globs pruned on top of the server's list.
    #[serde(default)]
    pub exclude: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FsGrepMatch {
    pub path: String,
    /// 1-indexed line number.
    pub line: u64,
    pub text: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FsGrepResponse {
    pub matches: Vec<FsGrepMatch>,
    /// Matches were capped; narrow the search to see the rest.
    pub truncated: bool,
    pub error: Option<FsError>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FsGlobRequest {
    /// `*` and `?` within a segment, `**` across segments, `[abc]`.
    pub pattern: String,
    pub path: String,
    #[serde(default)]
    pub exclude: Option<Vec<String>>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FsGlobResponse {
    pub matches: Vec<FsEntry>,
    pub error: Option<FsError>,
}

fn default_mode() -> u32 {
    0o644
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FsWriteRequest {
    pub path: String,
    /// Base64-encoded full file content.
    pub content: String,
    /// POSIX mode bits, 0..=4095 (setuid/setgid/sticky are cleared).
    #[serde(default = "default_mode")]
    #[cfg_attr(feature = "openapi", schema(maximum = 4095))]
    pub mode: u32,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FsWriteResponse {
    pub ok: bool,
    pub error: Option<FsError>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FsEditRequest {
    pub path: String,
    pub old: String,
    pub new: String,
    #[serde(default)]
    pub replace_all: bool,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FsEditResponse {
    /// Number of replacements made.
    pub occurrences: Option<u64>,
    pub error: Option<FsError>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FsDeleteRequest {
    pub path: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FsDeleteResponse {
    pub ok: bool,
    /// A file was removed; false when it was already absent.
    pub removed: bool,
    pub error: Option<FsError>,
}

// === shared constants ===

/// A single read response is capped at this many bytes (the reference's and deepagents' cap).
pub const READ_MAX_BYTES: usize = 512_000;
/// What an empty file reads as (deepagents' sentinel, which DAIV's client expects verbatim).
pub const EMPTY_FILE_SENTINEL: &str = "System reminder: File exists but has empty contents";
/// Appended to a text page cut at [`READ_MAX_BYTES`].
pub const TRUNCATION_MARKER: &str = "\n\n[... output truncated: this page exceeded the 512000-byte read limit. Continue reading from `end_line` (offset=end_line) or use a smaller limit.]";
/// Most matches one grep returns; more sets `truncated`.
pub const GREP_MAX_MATCHES: usize = 200;
/// Most entries the data plane's `list` answers (ours, with `truncated: true` past it). `ls` and
/// `glob` answer every entry, as the reference does, streamed, up to [`LIST_MAX_BYTES`].
pub const LIST_MAX_ENTRIES: usize = 1000;
/// Default bound on an `ls` or `glob` answer, in bytes of its entries' JSON (each with its
/// comma): a repository of 100,000 files with 100-byte paths is about 13 MB. Past it the
/// answer is the error `too_large` and nothing of the listing is sent.
pub const LIST_MAX_BYTES: u64 = 64 * 1024 * 1024;
/// What an `ls` or `glob` packs into one DATA frame: whole entries, this many bytes of JSON
/// at most (one larger entry goes alone).
pub const LISTING_CHUNK: usize = 64 * 1024;
/// Largest DATA frame of a listing: one entry with a path this long is `too_large` (paths are
/// at most 4,096 bytes where the kernel resolves them; a walk below can go deeper).
pub const LISTING_FRAME_MAX: usize = 1024 * 1024;
/// Largest file `edit` rewrites: edits are read-modify-write in memory.
pub const EDIT_MAX_BYTES: u64 = 16 * 1024 * 1024;

/// A lexically validated absolute path under [`WORKSPACE`]: no `..`, NUL, CR or LF; repeated
/// slashes, `.` components and a trailing slash removed. Symlinks are not resolved here: the
/// helper resolves them itself, confined to the workspace.
pub fn validate_path(path: &str, allow_root: bool) -> Result<String, String> {
    if path.contains(['\0', '\n', '\r']) {
        return Err(format!(
            "path must not contain NUL or newline characters: {path:?}"
        ));
    }
    if !path.starts_with('/') {
        return Err(format!("path must be absolute, got: {path:?}"));
    }
    let comps: Vec<&str> = path
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    if comps.contains(&"..") {
        return Err(format!("path must not contain '..' segments: {path:?}"));
    }
    let canonical = format!("/{}", comps.join("/"));
    if canonical == WORKSPACE {
        if allow_root {
            return Ok(canonical);
        }
        return Err(format!(
            "path must name a file under {WORKSPACE}, not the root itself: {path:?}"
        ));
    }
    if canonical.starts_with(&format!("{WORKSPACE}/")) {
        return Ok(canonical);
    }
    Err(format!("path must be under {WORKSPACE}, got: {path:?}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn paths_are_validated_lexically() {
        assert_eq!(
            validate_path("/workspace//repo/./a/", false).as_deref(),
            Ok("/workspace/repo/a")
        );
        assert_eq!(
            validate_path("/workspace", true).as_deref(),
            Ok("/workspace")
        );
        assert_eq!(
            validate_path("/workspace/", true).as_deref(),
            Ok("/workspace")
        );
        for bad in [
            "/workspace",
            "workspace/repo",
            "/workspace/../etc",
            "/workspace/repo/a\nb",
            "/workspace/repo/a\rb",
            "/workspace/a\0",
            "/workspacex/a",
            "/etc/passwd",
            "",
        ] {
            assert!(validate_path(bad, false).is_err(), "{bad:?}");
        }
        assert!(
            validate_path("/workspace/../etc", true)
                .unwrap_err()
                .contains("'..'")
        );
    }

    #[test]
    fn error_codes_have_wire_labels() {
        assert_eq!(FsErrorCode::NotADirectory.label(), "not_a_directory");
        assert_eq!(FsError::new(FsErrorCode::NotFound, "").message, "NotFound");
    }
}
