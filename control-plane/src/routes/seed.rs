//! `POST /session/{id}/seed/`: one-shot seeding of `/workspace/repo` and `/workspace/skills`.

use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::extract::Id;
use super::render::HttpError;
use crate::error::ErrorBody;
use crate::ops::Ops;
use crate::ops::seed::{SKIPPED_HEADER, Seed};

/// Seed the workspace from `repo_archive` and/or `skills_archive` (tar, optionally gz/bz2/xz/zst).
///
/// 204 on success, with `X-Seed-Skipped-Members` counting members the sanitiser dropped.
///
/// The service parses the body as it streams in: part headers and parts are bounded, and going
/// over them is a 422 saying which.
#[utoipa::path(post, path = "/session/{session_id}/seed/", tag = "session",
    security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id")),
    request_body(content_type = "multipart/form-data", description = "Fields `repo_archive` and/or `skills_archive`"),
    responses((status = 204, headers(("X-Seed-Skipped-Members" = u64, description = "Archive members dropped by the sanitiser"))),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 429, body = ErrorBody, description = "Too many seeds in progress; retry after `Retry-After` seconds",
            headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
        (status = 503, body = ErrorBody)))]
pub async fn seed(
    State(ops): State<Ops>,
    Id(id): Id,
    request: Request,
) -> Result<Response, HttpError> {
    let (parts, body) = request.into_parts();
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let op = Seed::new(content_type, body.into_data_stream());
    let outcome = ops.apply(&id, op).await?;
    let mut resp = StatusCode::NO_CONTENT.into_response();
    resp.headers_mut().insert(
        HeaderName::from_static(SKIPPED_HEADER),
        HeaderValue::from(outcome.skipped),
    );
    Ok(resp)
}
