//! `GET /session/{id}/watch?path=…&recursive=`: a directory's changes as NDJSON, from inotify in
//! the session's helper (ours, additive). The first line says the watch is armed; the answer
//! ends when the client goes (which ends the watch in the helper) or the directory does.

use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;

use super::extract::Id;
use super::files::refused;
use super::render::{ApiQuery, HttpError};
use crate::api::{WatchEvent, WatchQuery};
use crate::error::ErrorBody;
use crate::ops::Ops;
use crate::ops::files;

/// Watch a directory (`recursive`: and everything below it). NDJSON `WatchEvent` lines: first
/// `armed`, then one per change; `overflow` where changes were lost (a client reading too slowly
/// included: it never holds the session up). 404 `not_found` for a missing directory, 409
/// `not_a_directory`, 403 `permission_denied`, 422 `invalid_path`.
#[utoipa::path(get, path = "/session/{session_id}/watch", tag = "fs", operation_id = "watch",
    security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id"), WatchQuery),
    responses((status = 200, body = WatchEvent, content_type = "application/x-ndjson"),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn watch(
    State(ops): State<Ops>,
    Id(id): Id,
    ApiQuery(q): ApiQuery<WatchQuery>,
) -> Result<Response, HttpError> {
    let op = match files::Watch::new(&q.path, q.recursive) {
        Ok(op) => op,
        Err(e) => return Ok(refused(e)),
    };
    let events = match ops.apply(&id, op).await? {
        files::Watching::Armed(events) => events,
        files::Watching::Refused(e) => return Ok(refused(e)),
    };
    let stream = events.map(|event| {
        let mut bytes = serde_json::to_vec(&event).unwrap_or_default();
        bytes.push(b'\n');
        Ok::<_, std::convert::Infallible>(bytes)
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response())
}
