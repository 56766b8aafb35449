//! `PUT /session/{id}/egress/`: refresh a live session's egress policy and secrets.

use axum::extract::State;
use axum::http::StatusCode;

use super::extract::Id;
use super::render::{ApiJson, HttpError};
use crate::error::ErrorBody;
use crate::ops::{Ops, lifecycle};

/// Replace the session's egress policy (same body as `egress` on create); takes effect without
/// restarting anything.
#[utoipa::path(put, path = "/session/{session_id}/egress/", tag = "session",
    security(("api_key" = [])), request_body = Object,
    params(("session_id" = String, Path, description = "The session id")),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn refresh(
    State(ops): State<Ops>,
    Id(id): Id,
    ApiJson(policy): ApiJson<serde_json::Value>,
) -> Result<StatusCode, HttpError> {
    ops.apply(&id, lifecycle::RefreshEgress { policy }).await?;
    Ok(StatusCode::NO_CONTENT)
}
