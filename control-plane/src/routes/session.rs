//! `/session/...`: create, run commands, status, close.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use std::sync::Arc;

use crate::api::{
    CloseQuery, RunRequest, RunResponse, RunStreamLine, StartSessionRequest, StartSessionResponse,
};
use crate::error::{ApiError, ApiJson, ApiQuery, ErrorBody};
use crate::fleet::Fleet;
use crate::telemetry::metrics::{ModeLabels, observe_duration};

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
    State(fleet): State<Arc<Fleet>>,
    ApiJson(req): ApiJson<StartSessionRequest>,
) -> Result<Json<StartSessionResponse>, ApiError> {
    let session_id = fleet.create(&req).await?;
    let sessions = fleet.at(&session_id)?;
    // A session claimed from the warm pool was created long before: its idle time starts now.
    sessions.activity().touch(&session_id).await;
    sessions.metrics().sessions_created.inc();
    Ok(Json(StartSessionResponse { session_id }))
}

/// Run commands on a session, in order, in `/workspace/repo`. With `Accept:
/// application/x-ndjson` the answer streams as the commands print (one `RunStreamLine` per line).
#[utoipa::path(post, path = "/session/{session_id}/", tag = "session", request_body = RunRequest,
    security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id")),
    responses((status = 200, body = RunResponse, content_type = "application/json"),
        (status = 200, body = RunStreamLine, content_type = "application/x-ndjson"),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn run(
    State(fleet): State<Arc<Fleet>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<RunRequest>,
) -> Result<Response, ApiError> {
    let sessions = fleet.at(&id)?;
    if wants_ndjson(&headers) {
        let held = sessions.lock(&id).await?;
        let spec = sessions.run_spec(&id, &req).await?;
        let lines = match spec {
            Some(spec) => crate::processes::stream_run(sessions.clone(), id, spec, held),
            None => {
                let (tx, rx) = tokio::sync::mpsc::channel(1);
                let _ = tx.try_send(Ok(RunStreamLine::Done {
                    results: Vec::new(),
                }));
                rx
            }
        };
        return Ok(([(header::CONTENT_TYPE, NDJSON)], ndjson(lines)).into_response());
    }
    let _held = sessions.lock(&id).await?;
    let started = std::time::Instant::now();
    let ran = sessions.run(&id, &req).await;
    observe_duration(&sessions.metrics().command_batches, started.elapsed());
    let ran = ran?;
    sessions.metrics().commands.inc_by(ran.results.len() as u64);
    Ok(Json(ran).into_response())
}

const NDJSON: &str = "application/x-ndjson";

/// The body of a streaming run: one JSON line per item, a failure as the `error` line with the
/// detail a plain request would have had in its error body.
fn ndjson(
    lines: tokio::sync::mpsc::Receiver<Result<RunStreamLine, crate::runtime::HelperError>>,
) -> axum::body::Body {
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
pub async fn status(
    State(fleet): State<Arc<Fleet>>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let sessions = fleet.at(&id)?;
    let _held = sessions.lock(&id).await?;
    sessions.ensure_running(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Close a session: stop it (kept warm for reuse), or remove it with `?force=true`.
#[utoipa::path(delete, path = "/session/{session_id}/", tag = "session", security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id"),
        ("force" = Option<bool>, Query, description = "Remove instead of stop")),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn close(
    State(fleet): State<Arc<Fleet>>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<CloseQuery>,
) -> Result<StatusCode, ApiError> {
    let sessions = fleet.at(&id)?;
    let _held = if q.force {
        sessions.lock_to_remove(&id).await?
    } else {
        Some(sessions.lock(&id).await?)
    };
    sessions.close(&id, q.force).await?;
    // Its processes died with it.
    sessions.metrics().observe_processes(&id, None);
    let mode = if q.force { "remove" } else { "stop" };
    sessions
        .metrics()
        .sessions_closed
        .get_or_create(&ModeLabels { mode })
        .inc();
    Ok(StatusCode::NO_CONTENT)
}
