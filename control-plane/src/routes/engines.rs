//! `GET /engines/`: the fleet's engines as placement sees them.

use axum::Json;
use axum::extract::State;
use serde::Serialize;

use std::sync::Arc;

use crate::error::ErrorBody;
use crate::fleet::{EngineStatus, Fleet};

/// The engines sessions may be on.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EngineList {
    pub engines: Vec<EngineStatus>,
}

/// The engines sessions are placed on, each `up`, `down` or `draining`, with the sessions it
/// holds (warm-pool members included) and its cap. Without a fleet, the one engine (`default`).
#[utoipa::path(get, path = "/engines/", tag = "engines", operation_id = "list_engines",
    security(("api_key" = [])),
    responses((status = 200, body = EngineList), (status = 403, body = ErrorBody)))]
pub async fn list(State(fleet): State<Arc<Fleet>>) -> Json<EngineList> {
    Json(EngineList {
        engines: fleet.statuses(),
    })
}
