//! What the deployment as a whole answers, over every engine: its health, its engines as
//! placement sees them, and its metrics page with the live session count.

use super::Ops;
use crate::api::EngineStatus;
use crate::engine::{ContainerStatus, EngineError, ROLE_LABEL, ROLE_SANDBOX};
use crate::error::ApiError;
use crate::fleet::FleetError;
use crate::telemetry::metrics::SessionGauge;

impl Ops {
    /// Whether the deployment can serve: its one engine answers a ping, or (a fleet) an engine
    /// is up, as its health checks (every second) last found.
    pub async fn health(&self) -> Result<(), ApiError> {
        let cells = self.fleet.cells();
        if self.fleet.is_fleet() {
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
        Ok(())
    }

    /// The fleet's engines as placement sees them (never an endpoint or TLS files).
    pub fn engines(&self) -> Vec<EngineStatus> {
        self.fleet.statuses()
    }

    /// The metrics page (Prometheus text), with the sessions counted from one engine listing
    /// per engine that is up: the live count across every replica and restart, which no
    /// in-process counter could know. Left out of the page when no engine answers.
    pub async fn metrics_page(&self) -> String {
        let cells = self.fleet.up_cells();
        let lists = futures::future::join_all(
            cells
                .iter()
                .map(|c| async { c.engine().list(&[(ROLE_LABEL, ROLE_SANDBOX)]).await }),
        )
        .await;
        let listed: Vec<_> = lists.into_iter().filter_map(Result::ok).collect();
        let gauge = (!listed.is_empty()).then(|| {
            // Unclaimed warm-pool members are not sessions (they are `daiv_sandbox_pool_size`).
            let list: Vec<_> = listed
                .into_iter()
                .flatten()
                .filter(|c| !crate::pool::is_unclaimed(c))
                .collect();
            let running = list.iter().filter(|c| c.is_running()).count() as u64;
            let stopped = list
                .iter()
                .filter(|c| matches!(c.status, ContainerStatus::Exited | ContainerStatus::Created))
                .count() as u64;
            SessionGauge { running, stopped }
        });
        self.fleet.metrics().render(gauge)
    }
}
