//! `PUT /session/{id}/egress/`: refresh a live session's egress policy and secrets.

use axum::http::StatusCode;

use super::extract::Locked;
use crate::error::{ApiError, ApiJson, ErrorBody};

/// Replace the session's egress policy (same body as `egress` on create); takes effect without
/// restarting anything.
#[utoipa::path(put, path = "/session/{session_id}/egress/", tag = "session",
    security(("api_key" = [])), request_body = Object,
    params(("session_id" = String, Path, description = "The session id")),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn refresh(s: Locked<ApiJson<serde_json::Value>>) -> Result<StatusCode, ApiError> {
    let ApiJson(body) = &s.body;
    s.sessions.refresh_egress(&s.id, body).await?;
    Ok(StatusCode::NO_CONTENT)
}
