//! `GET /metrics`: Prometheus text format 0.0.4, which every Prometheus version scrapes. Needs
//! the API key unless `DAIV_SANDBOX_METRICS_PUBLIC=true` (for scrapers that cannot send headers;
//! then keep the port off the internet: the numbers reveal load, not secrets).

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use std::sync::Arc;

use crate::engine::{ContainerStatus, ROLE_LABEL, ROLE_SANDBOX};
use crate::fleet::Fleet;
use crate::telemetry::metrics::{CONTENT_TYPE, SessionGauge};

pub async fn metrics(State(fleet): State<Arc<Fleet>>) -> impl IntoResponse {
    // One engine list per scrape (per engine that is up, in a fleet): the live count across
    // every replica and restart, which no in-process counter could know. Left out of the page
    // when no engine answers.
    let cells: Vec<_> = fleet.cells().into_iter().filter(|c| c.is_up()).collect();
    let lists = futures::future::join_all(
        cells
            .iter()
            .map(|c| async { c.engine().list(&[(ROLE_LABEL, ROLE_SANDBOX)]).await }),
    )
    .await;
    let listed: Vec<_> = lists.into_iter().filter_map(Result::ok).collect();
    let gauge = (!listed.is_empty())
        .then(|| listed.into_iter().flatten().collect::<Vec<_>>())
        .map(|list| {
            // Unclaimed warm-pool members are not sessions (they are `daiv_sandbox_pool_size`).
            let list: Vec<_> = list
                .into_iter()
                .filter(|c| !crate::pool::is_unclaimed(c))
                .collect();
            let running = list.iter().filter(|c| c.is_running()).count() as u64;
            let stopped = list
                .iter()
                .filter(|c| matches!(c.status, ContainerStatus::Exited | ContainerStatus::Created))
                .count() as u64;
            SessionGauge { running, stopped }
        });
    (
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        fleet.metrics().render(gauge),
    )
}
