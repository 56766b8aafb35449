//! `POST /session/{id}/fs/{op}`: the Python-free file operations. fs-level problems come back
//! as HTTP 200 with `error`; HTTP statuses are for auth (403), the session (404), its lock (409),
//! a body that is not the op's request (422), admission (429: too many fs operations in flight)
//! and the engine or the helper (503).
//!
//! `ls`, `read`, `grep` and `glob` change nothing, so they run beside a command of the same
//! session instead of waiting for its lock; `write`, `edit` and `delete` keep the session's order
//! with commands and seeds.

use axum::Json;

use super::extract::Session;
use crate::error::{ApiError, ApiJson, ErrorBody};
use crate::workspace::fs::{Fs, respond};
use crate::workspace::wire::*;

/// Makes sure the session runs (one inspect) before the op, once its body is read; writers also
/// hold the session lock ([`Workspace::ordered`](crate::sessions::Workspace::ordered)).
macro_rules! fs_handler {
    ($name:ident, $op:ident, $req:ty, $resp:ty, $path:literal, $writes:literal) => {
        #[utoipa::path(post, path = $path, tag = "fs", request_body = $req,
                    security(("api_key" = [])),
                    params(("session_id" = String, Path, description = "The session id")),
                    responses((status = 200, body = $resp), (status = 403, body = ErrorBody),
                        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
                        (status = 422, body = ErrorBody),
                        (status = 429, body = ErrorBody, description = "Too many fs operations in progress (on this session or in total); retry after `Retry-After` seconds",
                            headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
                        (status = 503, body = ErrorBody)))]
        pub async fn $name(
            s: Session,
            ApiJson(req): ApiJson<$req>,
        ) -> Result<Json<$resp>, ApiError> {
            let ws = s.sessions.workspace(&s.id);
            let _held = if $writes {
                Some(ws.ordered().await?)
            } else {
                ws.beside().await?;
                None
            };
            let r = Fs::new(&ws).$op(&req).await;
            Ok(Json(respond(r, |v: &mut $resp, e| v.error = Some(e))?))
        }
    };
}

fs_handler!(
    ls,
    ls,
    FsLsRequest,
    FsLsResponse,
    "/session/{session_id}/fs/ls",
    false
);
fs_handler!(
    read,
    read,
    FsReadRequest,
    FsReadResponse,
    "/session/{session_id}/fs/read",
    false
);
fs_handler!(
    grep,
    grep,
    FsGrepRequest,
    FsGrepResponse,
    "/session/{session_id}/fs/grep",
    false
);
fs_handler!(
    glob,
    glob,
    FsGlobRequest,
    FsGlobResponse,
    "/session/{session_id}/fs/glob",
    false
);
fs_handler!(
    write,
    write,
    FsWriteRequest,
    FsWriteResponse,
    "/session/{session_id}/fs/write",
    true
);
fs_handler!(
    edit,
    edit,
    FsEditRequest,
    FsEditResponse,
    "/session/{session_id}/fs/edit",
    true
);
fs_handler!(
    delete,
    delete,
    FsDeleteRequest,
    FsDeleteResponse,
    "/session/{session_id}/fs/delete",
    true
);
