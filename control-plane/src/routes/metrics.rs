//! `GET /metrics`: Prometheus text format 0.0.4, which every Prometheus version scrapes. Needs
//! the API key unless `DAIV_SANDBOX_METRICS_PUBLIC=true` (for scrapers that cannot send headers;
//! then keep the port off the internet: the numbers reveal load, not secrets).

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use crate::ops::Ops;
use crate::telemetry::metrics::CONTENT_TYPE;

pub async fn metrics(State(ops): State<Ops>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        ops.metrics_page().await,
    )
}
