//! `fs/*` wire types, shaped like DAIV's client schemas (`Fs*Request`/`Fs*Response`). Every
//! response carries `error` (null on success); problems with the request's path or content are
//! reported there with HTTP 200, HTTP statuses being reserved for 403/404/409/503.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Stable, machine-branchable error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FsEntry {
    /// Absolute path of the entry.
    pub path: String,
    pub is_dir: bool,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct FsLsRequest {
    pub path: String,
}

#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct FsLsResponse {
    pub entries: Vec<FsEntry>,
    pub error: Option<FsError>,
}

fn default_limit() -> u64 {
    2000
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct FsReadRequest {
    pub path: String,
    /// 0-indexed start line (text files only).
    #[serde(default)]
    pub offset: u64,
    /// Maximum number of lines (text files only), at least 1.
    #[serde(default = "default_limit")]
    pub limit: u64,
}

#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct FsReadResponse {
    /// UTF-8 text or base64 binary; for an empty file, a human-readable sentinel.
    pub content: Option<String>,
    /// `utf-8` or `base64`.
    pub encoding: Option<String>,
    /// Total source lines (text reads only).
    pub total_lines: Option<u64>,
    /// 1-indexed last complete line in `content` (text reads only).
    pub end_line: Option<u64>,
    /// The page was cut at the byte cap; the text past `end_line` is a partial line.
    pub truncated: bool,
    pub error: Option<FsError>,
}

#[derive(Debug, Deserialize, ToSchema)]
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FsGrepMatch {
    pub path: String,
    /// 1-indexed line number.
    pub line: u64,
    pub text: String,
}

#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct FsGrepResponse {
    pub matches: Vec<FsGrepMatch>,
    /// Matches were capped; narrow the search to see the rest.
    pub truncated: bool,
    pub error: Option<FsError>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct FsGlobRequest {
    /// `*` and `?` within a segment, `**` across segments, `[abc]`.
    pub pattern: String,
    pub path: String,
    #[serde(default)]
    pub exclude: Option<Vec<String>>,
}

#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct FsGlobResponse {
    pub matches: Vec<FsEntry>,
    pub error: Option<FsError>,
}

fn default_mode() -> u32 {
    0o644
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct FsWriteRequest {
    pub path: String,
    /// Base64-encoded full file content.
    pub content: String,
    /// POSIX mode bits, 0..=4095 (setuid/setgid/sticky are cleared).
    #[serde(default = "default_mode")]
    pub mode: u32,
}

#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct FsWriteResponse {
    pub ok: bool,
    pub error: Option<FsError>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct FsEditRequest {
    pub path: String,
    pub old: String,
    pub new: String,
    #[serde(default)]
    pub replace_all: bool,
}

#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct FsEditResponse {
    /// Number of replacements made.
    pub occurrences: Option<u64>,
    pub error: Option<FsError>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct FsDeleteRequest {
    pub path: String,
}

#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct FsDeleteResponse {
    pub ok: bool,
    /// A file was removed; false when it was already absent.
    pub removed: bool,
    pub error: Option<FsError>,
}
