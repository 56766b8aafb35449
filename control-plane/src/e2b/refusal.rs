//! A refusal as E2B's doors answer it: a status and a sentence, rendered by each door its own
//! way (the control API's `{code, message}`, envd's Connect codes and `/files` errors).

use axum::http::StatusCode;

use crate::error::ApiError;

/// A refusal: its status, its `detail`, and what it says of the sandbox itself.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub status: StatusCode,
    pub detail: String,
    pub sandbox: Sandbox,
}

/// What a refusal says of the sandbox: envd answers a sandbox that is not running as E2B's
/// proxy does, whatever was asked of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sandbox {
    /// The refusal is about the request (a path, a value, a limit).
    Running,
    /// The sandbox is gone (killed, or past its timeout).
    Gone,
    /// Paused (by the caller or at its timeout) and kept so: not running until `connect`.
    Paused,
}

/// What envd says of a sandbox that is gone.
pub const GONE: &str = "the sandbox was not found: it is not running (killed, or past its timeout)";

/// What envd says of a paused sandbox (E2B's proxy: it is not running).
pub const PAUSED: &str =
    "the sandbox is paused: it is not running until Sandbox.connect resumes it";

impl Refusal {
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Self {
            status,
            detail: detail.into(),
            sandbox: Sandbox::Running,
        }
    }
}

/// An operation's error class as E2B's doors refuse it (logged as the native route logs it):
/// by its class, never its wording.
impl From<ApiError> for Refusal {
    fn from(e: ApiError) -> Self {
        e.log();
        let sandbox = match e {
            ApiError::NotFound => Sandbox::Gone,
            ApiError::Paused => Sandbox::Paused,
            _ => Sandbox::Running,
        };
        Self {
            sandbox,
            ..Self::new(e.status(), e.to_string())
        }
    }
}

/// A sandbox id as what a session id can be (hex, and a fleet engine's name before a dot);
/// anything else names no sandbox.
pub fn path_id(id: &str) -> Option<&str> {
    let ok = !id.is_empty()
        && id.len() <= 200
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_')
        && !id.contains("..");
    ok.then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_not_running_is_told_by_the_class_never_the_wording() {
        assert_eq!(Refusal::from(ApiError::NotFound).sandbox, Sandbox::Gone);
        assert_eq!(Refusal::from(ApiError::Paused).sandbox, Sandbox::Paused);
        // The same words under another class say nothing of the sandbox.
        let words = ApiError::NotFound.to_string();
        let other = Refusal::from(ApiError::NotFoundDetail(words));
        assert_eq!(other.sandbox, Sandbox::Running);
        assert_eq!(other.status, StatusCode::NOT_FOUND);
        let paused_words = ApiError::Paused.to_string();
        let conflict = Refusal::from(ApiError::Conflict(paused_words));
        assert_eq!(conflict.sandbox, Sandbox::Running);
        // The REST API's answer for a paused session is unchanged: 409, its own sentence.
        assert_eq!(ApiError::Paused.status(), StatusCode::CONFLICT);
    }
}
