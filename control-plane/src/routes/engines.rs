//! `GET /engines/`: the fleet's engines as placement sees them.

use axum::Json;
use axum::extract::State;

use crate::api::EngineList;
use crate::error::ErrorBody;
use crate::ops::Ops;

/// The engines sessions are placed on, each `up`, `down` or `draining`, with the sessions it
/// holds (warm-pool members included) and its cap. Without a fleet, the one engine (`default`).
#[utoipa::path(get, path = "/engines/", tag = "engines", operation_id = "list_engines",
    security(("api_key" = [])),
    responses((status = 200, body = EngineList), (status = 403, body = ErrorBody)))]
pub async fn list(State(ops): State<Ops>) -> Json<EngineList> {
    Json(EngineList {
        engines: ops.engines(),
    })
}
