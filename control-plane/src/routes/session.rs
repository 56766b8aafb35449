//! `/session/...`: create, run commands, status, close.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::extract::Id;
use super::render::{ApiJson, ApiQuery, HttpError};
use crate::api::{
    CloseQuery, RunRequest, RunResponse, RunStreamLine, StartSessionRequest, StartSessionResponse,
};
use crate::error::{ApiError, ErrorBody};
use crate::ops::{Ops, lifecycle, runs};

/// Start a sandbox session and return its id.
#[utoipa::path(post, path = "/session/", tag = "session", request_body = StartSessionRequest,
    security(("api_key" = [])),
    responses((status = 200, body = StartSessionResponse),
        (status = 400, body = ErrorBody, description = "The image cannot be pulled, egress is not configured, or `base_image` is not the snapshot's"),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "No such snapshot (`snapshot_id`)"),
        (status = 422, body = ErrorBody),
        (status = 429, body = ErrorBody, description = "Too many creates in progress; retry after `Retry-After` seconds",
            headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
        (status = 503, body = ErrorBody)))]
pub async fn create(
    State(ops): State<Ops>,
    ApiJson(req): ApiJson<StartSessionRequest>,
) -> Result<Json<StartSessionResponse>, HttpError> {
    let session_id = ops.create(&req).await?;
    Ok(Json(StartSessionResponse { session_id }))
}

/// Run commands on a session, in order, in `/workspace/repo`. With `Accept:
/// application/x-ndjson` the answer streams as the commands print (one `RunStreamLine` per line).
#[utoipa::path(post, path = "/session/{session_id}/", tag = "session", request_body = RunRequest,
    security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id")),
    responses((status = 200, body = RunResponse, content_type = "application/json",
            headers(("X-Daiv-Sandbox-Warning" = String, description = "Present when a command failed and the probe of the sandboxes' runtime found commands failing in this session's image (see `runtime_warning` in the session's info)"))),
        (status = 200, body = RunStreamLine, content_type = "application/x-ndjson",
            headers(("X-Daiv-Sandbox-Warning" = String, description = "Present when the probe of the sandboxes' runtime found commands failing in this session's image"))),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn run(
    State(ops): State<Ops>,
    Id(id): Id,
    headers: HeaderMap,
    ApiJson(req): ApiJson<RunRequest>,
) -> Result<Response, HttpError> {
    if wants_ndjson(&headers) {
        let streaming = ops.apply(&id, runs::StreamRun::new(req)?).await?;
        let mut resp = ([(header::CONTENT_TYPE, NDJSON)], ndjson(streaming.lines)).into_response();
        if let Some(w) = streaming.warning {
            warn(&mut resp, &w);
        }
        return Ok(resp);
    }
    let ran = ops.apply(&id, runs::Run::new(req)?).await?;
    let mut resp = Json(ran.response).into_response();
    if let Some(w) = ran.warning {
        warn(&mut resp, &w);
    }
    Ok(resp)
}

/// The response header that carries the runtime's warning about the session's image.
pub const WARNING_HEADER: &str = "x-daiv-sandbox-warning";

/// Sets [`WARNING_HEADER`] to `warning`, as visible ASCII (the reason quotes what the sandbox's
/// own tools printed).
fn warn(resp: &mut Response, warning: &str) {
    let ascii: String = warning
        .chars()
        .map(|c| {
            if c == ' ' || c.is_ascii_graphic() {
                c
            } else {
                '?'
            }
        })
        .take(1024)
        .collect();
    if let Ok(v) = header::HeaderValue::from_str(&ascii) {
        resp.headers_mut()
            .insert(header::HeaderName::from_static(WARNING_HEADER), v);
    }
}

const NDJSON: &str = "application/x-ndjson";

/// The body of a streaming run: one JSON line per item, a failure as the `error` line with the
/// detail a plain request would have had in its error body.
fn ndjson(lines: crate::ops::runs::RunLines) -> axum::body::Body {
    let stream = futures::stream::unfold(lines, |mut rx| async move {
        let line = match rx.recv().await? {
            Ok(line) => line,
            Err(e) => RunStreamLine::Error {
                detail: ApiError::from(e).to_string(),
            },
        };
        let mut bytes = serde_json::to_vec(&line).unwrap_or_default();
        bytes.push(b'\n');
        Some((Ok::<_, std::convert::Infallible>(bytes), rx))
    });
    axum::body::Body::from_stream(stream)
}

/// `Accept` names NDJSON (alone or among others, with any parameters).
fn wants_ndjson(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|m| {
            m.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case(NDJSON))
        })
}

/// 204 when the session exists (restarting it if stopped), else 404.
#[utoipa::path(get, path = "/session/{session_id}/", tag = "session", security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id")),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn status(State(ops): State<Ops>, Id(id): Id) -> Result<StatusCode, HttpError> {
    ops.apply(&id, lifecycle::EnsureRunning).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Close a session: stop it (kept warm for reuse), or remove it with `?force=true`.
#[utoipa::path(delete, path = "/session/{session_id}/", tag = "session", security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id"),
        ("force" = Option<bool>, Query, description = "Remove instead of stop")),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn close(
    ApiQuery(q): ApiQuery<CloseQuery>,
    State(ops): State<Ops>,
    Id(id): Id,
) -> Result<StatusCode, HttpError> {
    // A removal does not wait behind a busy session (see `Access::Removal`).
    if q.force {
        ops.apply(&id, lifecycle::Remove).await?;
    } else {
        ops.apply(&id, lifecycle::Stop).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}
