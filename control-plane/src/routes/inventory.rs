//! The deployment's sessions: `GET /sessions/` (filtered, paged: [`crate::ops::inventory`]),
//! `GET /session/{id}/info/`, `POST /session/{id}/timeout/` (a session's deadline moved) and
//! `GET /session/{id}/metrics/`.

use axum::Json;
use axum::extract::State;

use super::extract::Id;
use super::render::{ApiJson, ApiQuery, HttpError};
use crate::api::{
    MetricsQuery, SessionInfo, SessionList, SessionMetrics, SessionState, TimeoutRequest,
};
use crate::error::ErrorBody;
use crate::ops::inventory::ListQuery;
use crate::ops::{Ops, lifecycle};

/// List the deployment's sessions, on every engine that answers, oldest first (or newest).
#[utoipa::path(get, path = "/sessions/", tag = "session", operation_id = "list_sessions",
    security(("api_key" = [])),
    params(
        ("state" = Option<SessionState>, Query, description = "Only sessions in this state (repeat for several)"),
        ("metadata" = Option<String>, Query, pattern = r"^[A-Za-z0-9._-]{1,64}=", description = "`key=value`: only sessions whose metadata has it (repeat: all of them)"),
        ("image" = Option<String>, Query, min_length = 1, description = "Only sessions of this base image"),
        ("created_after" = Option<i64>, Query, description = "Only sessions created (or claimed) at or after this Unix second"),
        ("order" = Option<String>, Query, pattern = "^(asc|desc)$", description = "`asc` (oldest first, the default) or `desc`"),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "Sessions per page (100)"),
        ("next" = Option<String>, Query, description = "The `next` of the previous page")),
    responses((status = 200, body = SessionList), (status = 403, body = ErrorBody),
        (status = 422, body = ErrorBody, description = "An unknown parameter, a bad value or a cursor not of this listing"),
        (status = 503, body = ErrorBody)))]
pub async fn list(
    State(ops): State<Ops>,
    ApiQuery(pairs): ApiQuery<Vec<(String, String)>>,
) -> Result<Json<SessionList>, HttpError> {
    let query = ListQuery::parse(&pairs)?;
    Ok(Json(ops.list(&query).await?))
}

/// One session as the listing shows it (`GET /session/{id}/` stays the reference's bare 204).
#[utoipa::path(get, path = "/session/{session_id}/info/", tag = "session",
    operation_id = "session_info", security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id")),
    responses((status = 200, body = SessionInfo), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn info(State(ops): State<Ops>, Id(id): Id) -> Result<Json<SessionInfo>, HttpError> {
    Ok(Json(ops.info(&id).await?))
}

/// Move the session's deadline to now plus `timeout_seconds` (shorter or longer); a session
/// without one gets one (`on_timeout` as its create said, else `remove`).
#[utoipa::path(post, path = "/session/{session_id}/timeout/", tag = "session",
    operation_id = "set_session_timeout", request_body = TimeoutRequest,
    security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id")),
    responses((status = 200, body = SessionInfo, description = "The session with its new deadline"),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn timeout(
    State(ops): State<Ops>,
    Id(id): Id,
    ApiJson(req): ApiJson<TimeoutRequest>,
) -> Result<Json<SessionInfo>, HttpError> {
    let op = lifecycle::SetTimeout {
        seconds: req.timeout_seconds,
    };
    Ok(Json(ops.apply(&id, op).await?))
}

/// The session's CPU, memory and disk, sampled every `SESSION_METRICS_INTERVAL_SECONDS` while
/// it runs; the last `SESSION_METRICS_SAMPLES` are kept.
#[utoipa::path(get, path = "/session/{session_id}/metrics/", tag = "session",
    operation_id = "session_metrics", security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id"), MetricsQuery),
    responses((status = 200, body = SessionMetrics), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn metrics(
    State(ops): State<Ops>,
    Id(id): Id,
    ApiQuery(q): ApiQuery<MetricsQuery>,
) -> Result<Json<SessionMetrics>, HttpError> {
    let samples = ops.metrics(&id, q.start, q.end).await?;
    Ok(Json(SessionMetrics { samples }))
}
