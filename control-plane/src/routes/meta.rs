//! Health and version (the OpenAPI document is [`super::openapi`]'s).

use axum::Json;
use axum::extract::State;

use std::sync::Arc;

use super::render::HttpError;
use crate::api::{HealthResponse, VersionResponse};
use crate::engine::EngineError;
use crate::fleet::{Fleet, FleetError};
use crate::telemetry::runtime_probe::RuntimeHealth;

/// Healthcheck: 200 while Docker answers (in a fleet: while an engine is up), 503 otherwise.
/// Under `runsc`, `runtime` says whether the start-up probe found `ls` and `stat` working: an
/// unsound runtime is a warning to operators, not a failed check.
#[utoipa::path(get, path = "/-/health/", tag = "meta",
    responses((status = 200, body = HealthResponse), (status = 503, body = crate::error::ErrorBody)))]
pub async fn health(
    State(fleet): State<Arc<Fleet>>,
    State(runtime): State<Arc<RuntimeHealth>>,
) -> Result<Json<HealthResponse>, HttpError> {
    let cells = fleet.cells();
    if fleet.is_fleet() {
        // The health checks already ping every engine each second.
        if !cells.iter().any(|c| c.is_up()) {
            return Err(FleetError::EngineNotResponding(EngineError::Unavailable(
                "no engine of the fleet is up".into(),
            ))
            .into());
        }
    } else if let Some(cell) = cells.first() {
        cell.engine()
            .ping()
            .await
            .map_err(FleetError::EngineNotResponding)?;
    }
    Ok(Json(HealthResponse {
        status: "ok".to_string(),
        runtime: runtime.report(),
    }))
}

/// The running version.
#[utoipa::path(get, path = "/-/version/", tag = "meta", responses((status = 200, body = VersionResponse)))]
pub async fn version() -> Json<VersionResponse> {
    Json(VersionResponse {
        version: crate::VERSION.to_string(),
    })
}
