//! The data plane beyond DAIV's contract (ours, additive): raw files of any size anywhere the
//! sandbox user may go (`GET`/`PUT /session/{id}/files?path=…`), and `fs/stat`, `fs/mkdir`,
//! `fs/move`, `fs/list` (operations of [`crate::ops::fs`]). Everything goes through the session's helper as the sandbox user, so the
//! kernel decides; the service's own directory is refused under any name.
//!
//! Raw files stream through the helper's channel a frame at a time: a read holds at most its
//! request's inbox (64 frames of 64 KiB), a write the channel's outbox, whatever the file's size.
//! Their failures are HTTP statuses with `{"detail", "code"}`: 422 `invalid_path`, 403
//! `permission_denied`, 404 `not_found`, 409 `is_a_directory` / `not_a_directory`, 413
//! `too_large`, 416 `invalid_range`, 507 `no_space`.

use std::io::Write;

use axum::Json;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt;
use sandbox_protocol::files::*;
use sandbox_protocol::wire::{FsError, FsErrorCode};
use serde::Deserialize;
use serde_json::json;

use axum::extract::State;

use super::extract::Id;
use super::render::{ApiJson, ApiQuery, HttpError};
use crate::error::{ApiError, ErrorBody};
use crate::ops::files::ByteRange;
use crate::ops::{Ops, files, fs};

/// An fs-level refusal as an HTTP status and `{"detail", "code"}`.
pub(super) fn refused(e: FsError) -> Response {
    (
        fs_status(e.code),
        Json(json!({"detail": e.message, "code": e.code.label()})),
    )
        .into_response()
}

/// The HTTP status of an fs-level refusal (every door that answers over HTTP says the same).
pub fn fs_status(code: FsErrorCode) -> StatusCode {
    match code {
        FsErrorCode::InvalidPath => StatusCode::UNPROCESSABLE_ENTITY,
        FsErrorCode::PermissionDenied => StatusCode::FORBIDDEN,
        FsErrorCode::NotFound => StatusCode::NOT_FOUND,
        FsErrorCode::IsADirectory
        | FsErrorCode::NotADirectory
        | FsErrorCode::AlreadyExists
        | FsErrorCode::NotEmpty => StatusCode::CONFLICT,
        FsErrorCode::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        FsErrorCode::InvalidRange => StatusCode::RANGE_NOT_SATISFIABLE,
        FsErrorCode::NoSpace => StatusCode::INSUFFICIENT_STORAGE,
        _ => StatusCode::UNPROCESSABLE_ENTITY,
    }
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FileQuery {
    /// Absolute path anywhere in the container, without `..`.
    #[param(pattern = r"^(/(?!\.\.(/|$))[^/\x00\n\r]*)+$")]
    pub path: String,
    /// `PUT`: the file's mode (0..=0o7777, as a decimal number), of which its permission bits
    /// (0o777) are applied, as `fs/write` does; default: the replaced file's, else 0o644.
    #[serde(default)]
    #[param(minimum = 0, maximum = 4095)]
    pub mode: Option<u32>,
    /// `PUT`: create missing parent directories (default true).
    #[serde(default)]
    pub parents: Option<bool>,
    /// `PUT`: `false` writes the file in place, truncated first, as a shell's `>` does (a
    /// watcher sees the file's own create and write; a reader may see it half-written, and a
    /// body cut short or over the limit leaves what was written). Default true: a temporary
    /// file renamed over it, so a reader sees the old file or the new one, never half.
    #[serde(default)]
    pub atomic: Option<bool>,
}

/// `Range: bytes=first-last | first- | -suffix`; `None` for no header, a multi-range or one
/// that is not bytes (the whole file is served, as RFC 9110 allows).
pub fn parse_range(headers: &HeaderMap) -> Option<ByteRange> {
    let v = headers.get(header::RANGE)?.to_str().ok()?.trim();
    let spec = v.strip_prefix("bytes=")?;
    if spec.contains(',') {
        return None;
    }
    let (a, b) = spec.split_once('-')?;
    let (a, b) = (a.trim(), b.trim());
    let first = if a.is_empty() {
        None
    } else {
        Some(a.parse().ok()?)
    };
    let last = if b.is_empty() {
        None
    } else {
        Some(b.parse().ok()?)
    };
    if first.is_none() && last.is_none() {
        return None;
    }
    Some(ByteRange { first, last })
}

pub fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|enc| {
            let mut parts = enc.split(';');
            let name = parts.next().unwrap_or("").trim();
            let q_zero = parts.any(|p| {
                p.trim()
                    .strip_prefix("q=")
                    .is_some_and(|q| q.trim().parse::<f32>().is_ok_and(|q| q == 0.0))
            });
            name.eq_ignore_ascii_case("gzip") && !q_zero
        })
}

/// gzip over a byte stream, chunk by chunk (nothing but the encoder's window is held).
fn gzip(
    body: futures::stream::BoxStream<'static, std::io::Result<Bytes>>,
) -> impl futures::Stream<Item = std::io::Result<Bytes>> + Send {
    let enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    futures::stream::unfold((body, Some(enc)), |(mut body, enc)| async move {
        let mut enc = enc?;
        match body.next().await {
            Some(Ok(chunk)) => {
                let r = enc
                    .write_all(&chunk)
                    .map(|()| Bytes::from(std::mem::take(enc.get_mut())));
                Some((r, (body, Some(enc))))
            }
            Some(Err(e)) => Some((Err(e), (body, None))),
            None => Some((enc.finish().map(Bytes::from), (body, None))),
        }
    })
}

/// `GET /session/{id}/files?path=…`: the file's bytes.
#[utoipa::path(get, path = "/session/{session_id}/files", tag = "files", operation_id = "get_file",
    security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id"), FileQuery,
        ("Range" = Option<String>, Header, description = "bytes=first-last, first- or -suffix: answered 206"),
        ("Accept-Encoding" = Option<String>, Header, description = "gzip: the body is gzip-compressed")),
    responses((status = 200, description = "The file's bytes", content_type = "application/octet-stream"),
        (status = 206, description = "The range asked for", content_type = "application/octet-stream"),
        (status = 403, description = "permission_denied"), (status = 404, description = "not_found, or no such session"),
        (status = 409, description = "is_a_directory"), (status = 416, description = "invalid_range"),
        (status = 422, description = "invalid_path"), (status = 503, body = ErrorBody)))]
pub async fn get_file(
    State(ops): State<Ops>,
    Id(id): Id,
    ApiQuery(q): ApiQuery<FileQuery>,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    let range = parse_range(&headers);
    let op = match files::ReadFile::new(&q.path, range) {
        Ok(op) => op,
        Err(e) => return Ok(refused(e)),
    };
    let read = ops.apply(&id, op).await?;
    let answer = file_answer(read.answer, range.is_some(), accepts_gzip(&headers))?;
    Ok(super::admit::holding(answer, read.hold))
}

/// A read as its HTTP answer (also envd's `GET /files`): the bytes with their length, a range
/// as 206 with its `Content-Range`, gzip when the client takes it (not for a range); a
/// refusal as its status, a 416 saying how large the file is.
pub fn file_answer(read: files::Read, partial: bool, gz: bool) -> Result<Response, ApiError> {
    let stream = match read {
        files::Read::Stream(s) => s,
        files::Read::Refused { error, size } => {
            let mut r = refused(error);
            if let Some(size) = size
                && let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}"))
            {
                r.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            return Ok(r);
        }
    };
    let gz = gz && !partial;
    let mut builder = Response::builder()
        .status(if partial {
            StatusCode::PARTIAL_CONTENT
        } else {
            StatusCode::OK
        })
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::ACCEPT_RANGES, "bytes");
    if partial && stream.length > 0 {
        builder = builder.header(
            header::CONTENT_RANGE,
            format!(
                "bytes {}-{}/{}",
                stream.start,
                stream.start + stream.length - 1,
                stream.size
            ),
        );
    }
    let body = if gz {
        builder = builder
            .header(header::CONTENT_ENCODING, "gzip")
            .header(header::VARY, "accept-encoding");
        Body::from_stream(gzip(stream.body))
    } else {
        builder = builder.header(header::CONTENT_LENGTH, stream.length);
        Body::from_stream(stream.body)
    };
    builder.body(body).map_err(|e| ApiError::Internal(e.into()))
}

/// `PUT /session/{id}/files?path=…&mode=…&parents=…`: the raw body becomes the file, replacing
/// an existing one atomically.
#[utoipa::path(put, path = "/session/{session_id}/files", tag = "files", operation_id = "put_file",
    security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id"), FileQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 200, body = FileAnswer, description = "Written: its size"),
        (status = 403, description = "permission_denied"), (status = 404, description = "not_found (a parent, with parents=false), or no such session"),
        (status = 409, description = "is_a_directory, not_a_directory"),
        (status = 413, description = "too_large: over DAIV_SANDBOX_FILE_MAX_BYTES; nothing was written"),
        (status = 422, description = "invalid_path"), (status = 507, description = "no_space: the sandbox's disk is full"),
        (status = 503, body = ErrorBody)))]
pub async fn put_file(
    State(ops): State<Ops>,
    Id(id): Id,
    ApiQuery(q): ApiQuery<FileQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, HttpError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let body = body
        .into_data_stream()
        .map(|c| c.map_err(|e| std::io::Error::other(e.to_string())))
        .boxed();
    let op = match files::WriteFile::new(&q.path, q.mode, body) {
        Ok(op) => op
            .parents(q.parents.unwrap_or(true))
            .atomic(q.atomic.unwrap_or(true))
            .declared(declared),
        Err(e) => return Ok(refused(e)),
    };
    Ok(match ops.apply(&id, op).await? {
        files::Write::Written(a) => Json(a).into_response(),
        files::Write::Refused(e) => refused(e),
    })
}

#[utoipa::path(post, path = "/session/{session_id}/fs/stat", tag = "fs", operation_id = "fs_stat", request_body = FsStatRequest,
    security(("api_key" = [])), params(("session_id" = String, Path, description = "The session id")),
    responses((status = 200, body = FsStatResponse), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn stat(
    State(ops): State<Ops>,
    Id(id): Id,
    ApiJson(req): ApiJson<FsStatRequest>,
) -> Result<Json<FsStatResponse>, HttpError> {
    Ok(Json(ops.apply(&id, fs::Stat(req)).await?))
}

#[utoipa::path(post, path = "/session/{session_id}/fs/mkdir", tag = "fs", operation_id = "fs_mkdir", request_body = FsMkdirRequest,
    security(("api_key" = [])), params(("session_id" = String, Path, description = "The session id")),
    responses((status = 200, body = FsMkdirResponse), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 422, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn mkdir(
    State(ops): State<Ops>,
    Id(id): Id,
    ApiJson(req): ApiJson<FsMkdirRequest>,
) -> Result<Json<FsMkdirResponse>, HttpError> {
    Ok(Json(ops.apply(&id, fs::Mkdir(req)).await?))
}

#[utoipa::path(post, path = "/session/{session_id}/fs/move", tag = "fs", operation_id = "fs_move", request_body = FsMoveRequest,
    security(("api_key" = [])), params(("session_id" = String, Path, description = "The session id")),
    responses((status = 200, body = FsMoveResponse), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 422, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn move_entry(
    State(ops): State<Ops>,
    Id(id): Id,
    ApiJson(req): ApiJson<FsMoveRequest>,
) -> Result<Json<FsMoveResponse>, HttpError> {
    Ok(Json(ops.apply(&id, fs::Move(req)).await?))
}

#[utoipa::path(post, path = "/session/{session_id}/fs/list", tag = "fs", operation_id = "fs_list", request_body = FsListRequest,
    security(("api_key" = [])), params(("session_id" = String, Path, description = "The session id")),
    responses((status = 200, body = FsListResponse), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn list(
    State(ops): State<Ops>,
    Id(id): Id,
    ApiJson(req): ApiJson<FsListRequest>,
) -> Result<Json<FsListResponse>, HttpError> {
    Ok(Json(ops.apply(&id, fs::List(req)).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_encodings_are_read_from_the_headers() {
        let h = |k: header::HeaderName, v: &str| {
            let mut m = HeaderMap::new();
            m.insert(
                k,
                HeaderValue::from_str(v).unwrap_or(HeaderValue::from_static("")),
            );
            m
        };
        let r = |first, last| Some(ByteRange { first, last });
        assert_eq!(
            parse_range(&h(header::RANGE, "bytes=0-9")),
            r(Some(0), Some(9))
        );
        assert_eq!(parse_range(&h(header::RANGE, "bytes=5-")), r(Some(5), None));
        assert_eq!(parse_range(&h(header::RANGE, "bytes=-5")), r(None, Some(5)));
        assert_eq!(parse_range(&h(header::RANGE, "bytes=0-1,3-4")), None);
        assert_eq!(parse_range(&h(header::RANGE, "items=0-1")), None);
        assert_eq!(parse_range(&HeaderMap::new()), None);
        assert!(accepts_gzip(&h(header::ACCEPT_ENCODING, "br, gzip;q=0.8")));
        assert!(!accepts_gzip(&h(header::ACCEPT_ENCODING, "gzip;q=0")));
        assert!(!accepts_gzip(&h(header::ACCEPT_ENCODING, "identity")));
    }
}
