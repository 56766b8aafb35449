//! `/session/{id}/processes/...`: background processes. None of these waits for a running
//! command of the same session (see [`crate::processes`]).

use axum::Json;
use axum::body::Bytes;
use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;

use super::extract::{Session, param};
use crate::api::{
    PollQuery, ProcessList, ProcessOutput, StartProcessRequest, StartProcessResponse, StdinQuery,
};
use crate::error::{ApiError, ApiJson, ApiQuery, ErrorBody};
use crate::processes;

/// The path's `{process_id}` (checked by [`processes`]: one that cannot exist is 404).
pub struct Pid(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Pid {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Ok(Self(
            param(parts, state, "process_id")
                .await
                .ok_or(ApiError::NotFound)?,
        ))
    }
}

/// Start a background process; it outlives the request and dies with the session.
#[utoipa::path(post, path = "/session/{session_id}/processes/", tag = "processes",
    request_body = StartProcessRequest, security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id")),
    responses((status = 201, body = StartProcessResponse), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 429, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn start(
    s: Session,
    ApiJson(req): ApiJson<StartProcessRequest>,
) -> Result<(StatusCode, Json<StartProcessResponse>), ApiError> {
    let process_id = processes::start(&s.sessions.workspace(&s.id), &req).await?;
    Ok((
        StatusCode::CREATED,
        Json(StartProcessResponse { process_id }),
    ))
}

/// The session's background processes, running and recently ended, oldest first.
#[utoipa::path(get, path = "/session/{session_id}/processes/", tag = "processes",
    security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id")),
    responses((status = 200, body = ProcessList), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn list(s: Session) -> Result<Json<ProcessList>, ApiError> {
    Ok(Json(processes::list(&s.sessions.workspace(&s.id)).await?))
}

/// A process's state and output from `offset`, waiting up to `wait` seconds for new output.
#[utoipa::path(get, path = "/session/{session_id}/processes/{process_id}/", tag = "processes",
    security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id"),
        ("process_id" = String, Path, description = "The process id"), PollQuery),
    responses((status = 200, body = ProcessOutput), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn poll(
    s: Session,
    Pid(pid): Pid,
    ApiQuery(q): ApiQuery<PollQuery>,
) -> Result<Json<ProcessOutput>, ApiError> {
    let ws = s.sessions.workspace(&s.id);
    Ok(Json(processes::poll(&ws, &pid, q.offset, q.wait).await?))
}

/// Write the raw body to the process's stdin (`eof=true` closes it afterwards).
#[utoipa::path(post, path = "/session/{session_id}/processes/{process_id}/stdin",
    tag = "processes", security(("api_key" = [])),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    params(("session_id" = String, Path, description = "The session id"),
        ("process_id" = String, Path, description = "The process id"), StdinQuery),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn stdin(
    s: Session,
    Pid(pid): Pid,
    ApiQuery(q): ApiQuery<StdinQuery>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    processes::stdin(&s.sessions.workspace(&s.id), &pid, body, q.eof).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Kill the process's whole process group.
#[utoipa::path(delete, path = "/session/{session_id}/processes/{process_id}/", tag = "processes",
    security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id"),
        ("process_id" = String, Path, description = "The process id")),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn kill(s: Session, Pid(pid): Pid) -> Result<StatusCode, ApiError> {
    processes::kill(&s.sessions.workspace(&s.id), &pid).await?;
    Ok(StatusCode::NO_CONTENT)
}
