//! A tool's own failure, as the model reads it: `{code, cause, remediation}` in a result with
//! `isError: true`, never a protocol error. The causes are the REST API's error texts (the same
//! [`ApiError`] the handlers answer with, so nothing secret and no daemon message reaches them);
//! the codes are the fs error codes where an fs op said why, and one word per HTTP class
//! otherwise; the remediation says what to do next.

use serde::Serialize;

use crate::error::ApiError;
use sandbox_protocol::wire::{FsError, FsErrorCode};

/// Why a tool call did not do its work.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolFailure {
    /// Machine-branchable: an fs code (`not_found`, `already_exists`, `string_not_found`, ...)
    /// or `not_found`, `busy`, `conflict`, `bad_request`, `invalid_argument`, `too_large`,
    /// `too_many_requests`, `unavailable`, `internal`.
    pub code: String,
    /// What happened, in the service's words.
    pub cause: String,
    /// What the caller can do about it.
    pub remediation: String,
}

impl ToolFailure {
    pub fn new(code: &str, cause: impl Into<String>, remediation: impl Into<String>) -> Self {
        Self {
            code: code.to_string(),
            cause: cause.into(),
            remediation: remediation.into(),
        }
    }

    /// The session is gone (or never was).
    pub fn session_gone() -> Self {
        Self::new(
            "not_found",
            ApiError::NotFound.to_string(),
            "Create a new session with session_create and use the session_id it returns.",
        )
    }

    /// A process id the session does not have.
    pub fn process_gone() -> Self {
        Self::new(
            "not_found",
            "No such process in this session",
            "Use the process_id that process_start returned; start the process again with \
             process_start if it is gone.",
        )
    }
}

impl From<ApiError> for ToolFailure {
    fn from(e: ApiError) -> Self {
        let cause = e.to_string();
        match e {
            ApiError::NotFound => Self::session_gone(),
            ApiError::NoSuchProcess => Self::process_gone(),
            ApiError::NotFoundDetail(_) => Self::new(
                "not_found",
                cause,
                "Check the id; a snapshot may have expired or been deleted.",
            ),
            ApiError::Busy => Self::new(
                "busy",
                cause,
                "Another call holds this session (a run, a write, a snapshot): retry once it \
                 ends.",
            ),
            ApiError::Conflict(_) | ApiError::Paused => Self::new(
                "conflict",
                cause,
                "The session is not in a state that allows this; read the cause, change the \
                 session (or create a new one) and retry.",
            ),
            ApiError::BadRequest(_) => Self::new(
                "bad_request",
                cause,
                "Fix the request as the cause says (an image that can be pulled, a snapshot's \
                 own base image) and call again.",
            ),
            ApiError::Unprocessable(_) => Self::new(
                "invalid_argument",
                cause,
                "Fix the argument the cause names and call again.",
            ),
            ApiError::PortClosed(_) => Self::new(
                "port_closed",
                cause,
                "Start the server in the sandbox (a background process), wait until it listens \
                 on that port, then call again.",
            ),
            ApiError::Gone(_) => Self::new(
                "gone",
                cause,
                "What was asked for is no longer kept; read what is still there and go on from it.",
            ),
            ApiError::PayloadTooLarge(_) => Self::new(
                "too_large",
                cause,
                "Send less in one call: split the content or write it in parts.",
            ),
            ApiError::InsufficientStorage(_) => Self::new(
                "no_space",
                cause,
                "Free space first: delete snapshots you no longer need (or close forks), then \
                 retry.",
            ),
            ApiError::TooManyRequests { retry_after, .. } => {
                let when = retry_after
                    .map(|d| format!("in {} s", d.as_secs_f64().ceil().max(1.0) as u64))
                    .unwrap_or_else(|| "once one of the session's processes has ended".into());
                Self::new("too_many_requests", cause, format!("Retry {when}."))
            }
            ApiError::Unavailable(_) | ApiError::Outage(_) => Self::new(
                "unavailable",
                cause,
                "The sandbox service is having trouble; retry in a few seconds.",
            ),
            ApiError::MissingApiKey | ApiError::InvalidApiKey | ApiError::Forbidden(_) => {
                Self::new(
                    "unauthorized",
                    cause,
                    "Configure the MCP client with the deployment's API key.",
                )
            }
            ApiError::Internal(ref source) => {
                tracing::error!(error = ?source, "MCP tool call failed");
                Self::new(
                    "internal",
                    cause,
                    "Retry; if it keeps failing, report it to the operator.",
                )
            }
        }
    }
}

/// An fs op's own answer about the path or the content.
impl From<FsError> for ToolFailure {
    fn from(e: FsError) -> Self {
        use FsErrorCode as C;
        let remediation = match e.code {
            C::InvalidPath => {
                "Give an absolute path under /workspace (the repository is /workspace/repo), without '..'."
            }
            C::NotFound => "Check the path with ls or glob; create the file with write.",
            C::NotADirectory => "Give a directory path (ls lists directories; read reads files).",
            C::IsADirectory => "Give a file path; list the directory with ls.",
            C::NotATextFile => {
                "The file is binary: read returns it base64-encoded; edit only changes text files."
            }
            C::StringNotFound => {
                "Read the file and copy the exact text to replace, whitespace included."
            }
            C::MultipleOccurrences => {
                "Give more surrounding text so old is unique, or set replace_all."
            }
            C::AlreadyExists => {
                "write only creates files: change an existing one with edit, or remove it first (run `rm`)."
            }
            C::TooLarge => "Read it in pages (offset, limit), or work on it with run.",
            C::InvalidOffset => "Give an offset below the file's total_lines.",
            C::PermissionDenied => {
                "The sandbox user may not do this here; pick a path it owns (under /workspace/repo)."
            }
            C::ExecFailed => {
                "The operation could not run in the sandbox; retry, or do it with run."
            }
            C::InvalidPattern => {
                "Fix the pattern (grep: POSIX extended regex; glob: *, ?, **, [abc])."
            }
            // The data plane's codes (never answered by the seven fs ops the tools use).
            C::NotEmpty => "Empty the directory first, or pick another destination.",
            C::NoSpace => "The sandbox's disk is full: remove files (run `rm`) and retry.",
            C::InvalidRange => "Ask for a range inside the file's size.",
        };
        Self::new(&e.code.label(), e.message, remediation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_has_a_code_and_a_remediation() {
        for e in [
            ApiError::NotFound,
            ApiError::Busy,
            ApiError::Paused,
            ApiError::Conflict("c".into()),
            ApiError::BadRequest("b".into()),
            ApiError::Unprocessable("u".into()),
            ApiError::PayloadTooLarge("p".into()),
            ApiError::TooManyRequests {
                detail: "t".into(),
                retry_after: Some(std::time::Duration::from_millis(1500)),
            },
            ApiError::Unavailable("x".into()),
            ApiError::Internal(anyhow::anyhow!("/secret/path")),
        ] {
            let f = ToolFailure::from(e);
            assert!(!f.code.is_empty() && !f.remediation.is_empty(), "{f:?}");
            assert!(!f.cause.contains("/secret/path"), "{f:?}");
        }
        let f = ToolFailure::from(ApiError::NotFound);
        assert_eq!(f.code, "not_found");
        assert!(f.remediation.contains("session_create"));
        let f = ToolFailure::from(FsError::new(FsErrorCode::AlreadyExists, "exists"));
        assert_eq!(f.code, "already_exists");
        assert_eq!(f.cause, "exists");
    }
}
