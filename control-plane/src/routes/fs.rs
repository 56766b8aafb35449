//! `POST /session/{id}/fs/{op}`: the Python-free file operations. fs-level problems come back
//! as HTTP 200 with `error`; HTTP statuses are for auth (403), the session (404), its lock (409),
//! a body that is not the op's request (422), admission (429: too many fs operations in flight)
//! and the engine or the helper (503).
//!
//! `ls`, `read`, `grep` and `glob` change nothing, so they run beside a command of the same
//! session instead of waiting for its lock; `write`, `edit` and `delete` keep the session's order
//! with commands and seeds.
//!
//! `ls` and `glob` answer every entry; their body is written as the entries stream from the
//! session ([`listing_body`]), so a listing of any size costs the service a chunk at a time.

use axum::Json;
use axum::body::Body;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt;

use axum::extract::State;

use super::admit::holding;
use super::extract::Id;
use super::render::{ApiJson, HttpError};
use crate::error::ErrorBody;
use crate::ops::Ops;
use crate::ops::fs::{self, Entries};
use sandbox_protocol::wire::*;

/// The OpenAPI entry every fs route shares, on `$item`.
macro_rules! fs_doc {
    ($req:ty, $resp:ty, $path:literal, $item:item) => {
        #[utoipa::path(post, path = $path, tag = "fs", request_body = $req,
                    security(("api_key" = [])),
                    params(("session_id" = String, Path, description = "The session id")),
                    responses((status = 200, body = $resp), (status = 403, body = ErrorBody),
                        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
                        (status = 422, body = ErrorBody),
                        (status = 429, body = ErrorBody, description = "Too many fs operations in progress (on this session or in total); retry after `Retry-After` seconds",
                            headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
                        (status = 503, body = ErrorBody)))]
        $item
    };
}

/// The body is read first, then the operation takes its fs slot, the session's running check
/// (one inspect) and, for a writer, its lock; the slot is held until the answer is sent.
macro_rules! fs_handler {
    ($name:ident, $op:ident, $req:ty, $resp:ty, $path:literal) => {
        fs_doc!(
            $req,
            $resp,
            $path,
            pub async fn $name(
                State(ops): State<Ops>,
                Id(id): Id,
                ApiJson(req): ApiJson<$req>,
            ) -> Result<Response, HttpError> {
                let done = ops.apply(&id, fs::$op(req)).await?;
                let answer = done.answer.unwrap_or_else(|e| {
                    let mut v = <$resp>::default();
                    v.error = Some(e);
                    v
                });
                Ok(holding(Json(answer).into_response(), done.hold))
            }
        );
    };
}

/// `ls` and `glob`: the entries streamed into `$key` of the op's response, or its fs error.
macro_rules! fs_listing_handler {
    ($name:ident, $op:ident, $req:ty, $resp:ty, $key:literal, $path:literal) => {
        fs_doc!(
            $req,
            $resp,
            $path,
            pub async fn $name(
                State(ops): State<Ops>,
                Id(id): Id,
                ApiJson(req): ApiJson<$req>,
            ) -> Result<Response, HttpError> {
                let done = ops.apply(&id, fs::$op(req)).await?;
                let response = match done.answer {
                    Ok(entries) => listing_body($key, entries),
                    Err(e) => {
                        let mut v = <$resp>::default();
                        v.error = Some(e);
                        Json(v).into_response()
                    }
                };
                Ok(holding(response, done.hold))
            }
        );
    };
}

/// `{"<key>":[entries],"error":null}`, written as the entries arrive. The helper found them all
/// before the first left it (a listing over the bound is an fs error, answered above), so this
/// is the whole listing; only a helper lost mid-way cuts the body, which the client then sees
/// as a broken response, never as a shorter list.
fn listing_body(key: &'static str, entries: Entries) -> Response {
    let head = Bytes::from(format!("{{\"{key}\":["));
    let mut first = true;
    let chunks = entries.chunks.map(move |chunk| {
        let chunk = chunk.map_err(|e| {
            tracing::warn!(error = %e, "a listing was cut short");
            std::io::Error::other(e.to_string())
        })?;
        let mut buf = Vec::with_capacity(chunk.len() * 64);
        for e in &chunk {
            if !std::mem::take(&mut first) {
                buf.push(b',');
            }
            serde_json::to_writer(&mut buf, e).map_err(std::io::Error::other)?;
        }
        Ok::<_, std::io::Error>(Bytes::from(buf))
    });
    let body = futures::stream::once(async move { Ok(head) })
        .chain(chunks)
        .chain(futures::stream::once(async {
            Ok(Bytes::from_static(b"],\"error\":null}"))
        }));
    (
        [(CONTENT_TYPE, "application/json")],
        Body::from_stream(body),
    )
        .into_response()
}

fs_listing_handler!(
    ls,
    Ls,
    FsLsRequest,
    FsLsResponse,
    "entries",
    "/session/{session_id}/fs/ls"
);
fs_handler!(
    read,
    Read,
    FsReadRequest,
    FsReadResponse,
    "/session/{session_id}/fs/read"
);
fs_handler!(
    grep,
    Grep,
    FsGrepRequest,
    FsGrepResponse,
    "/session/{session_id}/fs/grep"
);
fs_listing_handler!(
    glob,
    Glob,
    FsGlobRequest,
    FsGlobResponse,
    "matches",
    "/session/{session_id}/fs/glob"
);
fs_handler!(
    write,
    Write,
    FsWriteRequest,
    FsWriteResponse,
    "/session/{session_id}/fs/write"
);
fs_handler!(
    edit,
    Edit,
    FsEditRequest,
    FsEditResponse,
    "/session/{session_id}/fs/edit"
);
fs_handler!(
    delete,
    Delete,
    FsDeleteRequest,
    FsDeleteResponse,
    "/session/{session_id}/fs/delete"
);
