//! `POST /session/{id}/seed/`: one-shot seeding of `/workspace/repo` and `/workspace/skills`.

use axum::extract::{Multipart, Path, State};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::AppState;
use crate::api::ErrorBody;
use crate::error::ApiError;
use crate::workspace::seed::{self, SKIPPED_HEADER};

/// Seed the workspace from `repo_archive` and/or `skills_archive` (tar, optionally gz/bz2/xz/zst).
///
/// 204 on success, with `X-Seed-Skipped-Members` counting members the sanitiser dropped.
#[utoipa::path(post, path = "/session/{session_id}/seed/", tag = "session",
    security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id")),
    request_body(content_type = "multipart/form-data", description = "Fields `repo_archive` and/or `skills_archive`"),
    responses((status = 204, headers(("X-Seed-Skipped-Members" = u64, description = "Archive members dropped by the sanitiser"))),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 422, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn seed(
    State(state): State<AppState>,
    Path(id): Path<String>,
    multipart: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Result<Response, ApiError> {
    let _held = state.lock(&id).await?;
    state.sessions.ensure_running(&id).await?;
    let multipart = multipart.map_err(|r| ApiError::Unprocessable(r.body_text()))?;
    let started = std::time::Instant::now();
    let outcome = seed::seed(state.sessions.engine(), &state.config, &id, multipart).await;
    let label = match &outcome {
        Ok(_) => "ok".to_string(),
        Err(e) => e.status().as_u16().to_string(),
    };
    state
        .metrics
        .seeds
        .with(&[&label])
        .observe(started.elapsed());
    let outcome = outcome?;
    state.metrics.seed_bytes.add(outcome.bytes);
    let mut resp = StatusCode::NO_CONTENT.into_response();
    resp.headers_mut().insert(
        HeaderName::from_static(SKIPPED_HEADER),
        HeaderValue::from(outcome.skipped),
    );
    Ok(resp)
}
