//! `GET /session/{id}/watch?path=…&recursive=`: a directory's changes as NDJSON, from inotify in
//! the session's helper (ours, additive). The first line says the watch is armed; the answer
//! ends when the client goes (which ends the watch in the helper) or the directory does.

use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use sandbox_protocol::files::validate_any_path;
use sandbox_protocol::message::{ChangeKind, Event};

use super::extract::Session;
use super::files::refused;
use crate::api::{WatchEvent, WatchEventType, WatchQuery};
use crate::error::{ApiError, ApiQuery, ErrorBody};
use crate::runtime::WatchOpen;

fn line(kind: WatchEventType) -> WatchEvent {
    WatchEvent {
        kind,
        path: None,
        entry: None,
        watches: None,
    }
}

/// A helper's change as the line the client reads.
fn to_line(ev: Event) -> Option<WatchEvent> {
    match ev {
        Event::Change {
            change,
            path,
            entry,
        } => Some(WatchEvent {
            path: Some(path),
            entry,
            ..line(match change {
                ChangeKind::Create => WatchEventType::Create,
                ChangeKind::Write => WatchEventType::Write,
                ChangeKind::Remove => WatchEventType::Remove,
                ChangeKind::Rename => WatchEventType::Rename,
                ChangeKind::Chmod => WatchEventType::Chmod,
            })
        }),
        Event::Overflow => Some(line(WatchEventType::Overflow)),
        _ => None,
    }
}

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
pub async fn watch(s: Session, ApiQuery(q): ApiQuery<WatchQuery>) -> Result<Response, ApiError> {
    let path = match validate_any_path(&q.path) {
        Ok(p) => p,
        Err(e) => return Ok(refused(e)),
    };
    let ws = s.sessions.workspace(&s.id);
    ws.beside().await?;
    let (watches, changes) = match ws.runtime.watch(ws.id, &path, q.recursive).await? {
        WatchOpen::Armed { watches, changes } => (watches, changes),
        WatchOpen::Refused(e) => return Ok(refused(e)),
    };
    let armed = WatchEvent {
        watches: Some(watches),
        ..line(WatchEventType::Armed)
    };
    let stream =
        futures::stream::unfold((Some(armed), changes), |(first, mut changes)| async move {
            let event = match first {
                Some(a) => a,
                None => loop {
                    if let Some(l) = to_line(changes.recv().await?) {
                        break l;
                    }
                },
            };
            let mut bytes = serde_json::to_vec(&event).unwrap_or_default();
            bytes.push(b'\n');
            Some((Ok::<_, std::convert::Infallible>(bytes), (None, changes)))
        });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response())
}
