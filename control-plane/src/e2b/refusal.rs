//! A refusal as E2B's doors answer it: a status and a sentence, rendered by each door its own
//! way (the control API's `{code, message}`, envd's Connect codes and `/files` errors).

use axum::http::StatusCode;

/// A refusal: its status and its `detail`.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub status: StatusCode,
    pub detail: String,
}

impl Refusal {
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Self {
            status,
            detail: detail.into(),
        }
    }
}

/// Whether `r` is the refusal of a paused session to a caller that keeps it paused.
pub fn is_paused(r: &Refusal) -> bool {
    r.status == StatusCode::CONFLICT && r.detail.starts_with("Session is paused")
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
