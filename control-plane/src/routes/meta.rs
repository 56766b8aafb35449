//! Health, version and the OpenAPI document.

use axum::Json;
use axum::extract::State;
use axum::response::IntoResponse;
use utoipa::OpenApi;

use std::sync::Arc;

use crate::api::{HealthResponse, VersionResponse};
use crate::error::ApiError;
use crate::sessions::SessionError;
use crate::sessions::Sessions;

/// Healthcheck: 200 while Docker answers, 503 otherwise.
#[utoipa::path(get, path = "/-/health/", tag = "meta",
    responses((status = 200, body = HealthResponse), (status = 503, body = crate::error::ErrorBody)))]
pub async fn health(
    State(sessions): State<Arc<Sessions>>,
) -> Result<Json<HealthResponse>, ApiError> {
    sessions
        .engine()
        .ping()
        .await
        .map_err(SessionError::EngineNotResponding)?;
    Ok(Json(HealthResponse {
        status: "ok".to_string(),
    }))
}

/// The running version.
#[utoipa::path(get, path = "/-/version/", tag = "meta", responses((status = 200, body = VersionResponse)))]
pub async fn version() -> Json<VersionResponse> {
    Json(VersionResponse {
        version: crate::VERSION.to_string(),
    })
}

pub async fn openapi(State(sessions): State<Arc<Sessions>>) -> impl IntoResponse {
    let mut doc = crate::openapi::ApiDoc::openapi();
    doc.servers = Some(vec![utoipa::openapi::Server::new(
        sessions.config().server.api_v1_str.clone(),
    )]);
    Json(doc)
}
