//! `PUT /session/{id}/egress/`: refresh a live session's egress policy and secrets.

use axum::extract::{Path, State};
use axum::http::StatusCode;

use std::sync::Arc;

use crate::error::{ApiError, ApiJson, ErrorBody};
use crate::fleet::Fleet;

/// Replace the session's egress policy (same body as `egress` on create); takes effect without
/// restarting anything.
#[utoipa::path(put, path = "/session/{session_id}/egress/", tag = "session",
    security(("api_key" = [])), request_body = Object,
    params(("session_id" = String, Path, description = "The session id")),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn refresh(
    State(fleet): State<Arc<Fleet>>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<serde_json::Value>,
) -> Result<StatusCode, ApiError> {
    let sessions = fleet.at(&id)?;
    let _held = sessions.lock(&id).await?;
    sessions.refresh_egress(&id, &body).await?;
    Ok(StatusCode::NO_CONTENT)
}
