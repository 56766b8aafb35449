//! Health and version (the OpenAPI document is [`super::openapi`]'s).

use axum::Json;
use axum::extract::State;

use std::sync::Arc;

use super::render::HttpError;
use crate::api::{HealthResponse, VersionResponse};
use crate::ops::Ops;
use crate::telemetry::runtime_probe::RuntimeHealth;

/// Healthcheck: 200 while Docker answers (in a fleet: while an engine is up), 503 otherwise.
/// Under `runsc`, `runtime` says whether the start-up probe found `ls` and `stat` working: an
/// unsound runtime is a warning to operators, not a failed check. `snapshot_layers` counts the
/// engines whose sessions from snapshots get overlays, copies, or are not probed yet.
#[utoipa::path(get, path = "/-/health/", tag = "meta",
    responses((status = 200, body = HealthResponse), (status = 503, body = crate::error::ErrorBody)))]
pub async fn health(
    State(ops): State<Ops>,
    State(runtime): State<Arc<RuntimeHealth>>,
) -> Result<Json<HealthResponse>, HttpError> {
    ops.health().await?;
    Ok(Json(HealthResponse {
        status: "ok".to_string(),
        runtime: runtime.report(),
        snapshot_layers: ops.engines().into_iter().fold(
            std::collections::BTreeMap::new(),
            |mut by_mode, e| {
                *by_mode.entry(e.snapshot_layers.mode).or_default() += 1;
                by_mode
            },
        ),
    }))
}

/// The running version.
#[utoipa::path(get, path = "/-/version/", tag = "meta", responses((status = 200, body = VersionResponse)))]
pub async fn version() -> Json<VersionResponse> {
    Json(VersionResponse {
        version: crate::VERSION.to_string(),
    })
}
