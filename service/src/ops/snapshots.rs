//! A session's snapshots and forks. Each takes a create slot first (it builds Docker objects as
//! a create does), then the session's lock.

use super::{Access, Admit, Op, Ops, Reached};
use crate::api::{ForkRequest, SnapshotInfo};
use crate::error::ApiError;
use crate::ids::{SessionId, SnapshotId};
use crate::sessions::ForkPlan;
use crate::snapshots::{Snapshot, SnapshotError};
use crate::time::rfc3339;

/// A snapshot as the API lists it.
fn info(s: &Snapshot) -> SnapshotInfo {
    SnapshotInfo {
        snapshot_id: s.id.clone(),
        name: s.name.clone(),
        source_session_id: s.source.clone(),
        base_image: s.base_image.clone(),
        image: s.image(),
        created_at: rfc3339(s.created),
        expires_at: s.expires.map(rfc3339),
        size_bytes: s.size,
    }
}

/// A snapshot id as a path gives it: one that cannot be a snapshot's is not found, as an
/// unknown one is.
pub fn snapshot_id(raw: &str) -> Result<SnapshotId, ApiError> {
    SnapshotId::parse(raw).map_err(|_| SnapshotError::NotFound.into())
}

/// A snapshot of a session's whole filesystem at one instant (`name` and `ttl_seconds` as the
/// request gave them, checked under the lock).
pub struct TakeSnapshot {
    pub name: Option<String>,
    pub ttl_seconds: Option<u64>,
}

impl Op for TakeSnapshot {
    type Output = SnapshotInfo;
    const ADMIT: Admit = Admit::Create;
    const ACCESS: Access = Access::Held;

    async fn apply(self, at: Reached) -> Result<SnapshotInfo, ApiError> {
        let req = at
            .sessions
            .snapshot_request(self.name.as_deref(), self.ttl_seconds)?;
        let (snapshot, _) = at.sessions.snapshot(&at.id, &req).await?;
        Ok(info(&snapshot))
    }
}

impl Ops {
    /// The deployment's snapshots, newest first: every engine's that answers (a fleet's down
    /// engine lists nothing until it is back).
    pub async fn snapshots(&self) -> Result<Vec<SnapshotInfo>, ApiError> {
        let cells = self.fleet.up_cells();
        let lists = futures::future::join_all(cells.iter().map(|c| c.snapshots().list()));
        let mut all = Vec::new();
        for listed in lists.await {
            all.extend(listed?);
        }
        all.sort_by(|a, b| b.created.cmp(&a.created).then_with(|| a.id.cmp(&b.id)));
        Ok(all.iter().map(info).collect())
    }

    /// Snapshot `id`, on the engine holding it.
    pub async fn snapshot(&self, id: &SnapshotId) -> Result<SnapshotInfo, ApiError> {
        Ok(info(&self.fleet.cell_of(id)?.snapshots().get(id).await?))
    }

    /// Deletes snapshot `id`: sessions made from it keep working; its image and data go once
    /// none uses them.
    pub async fn delete_snapshot(&self, id: &SnapshotId) -> Result<(), ApiError> {
        Ok(self.fleet.cell_of(id)?.snapshots().delete(id).await?)
    }

    /// `req.count` new sessions from session `id`, all or none, on its engine: the request
    /// checked once (its environment was, as it was read), one create slot, then the engine's
    /// room for them all (refused without), as many more slots as are free (the forks are built
    /// that many at a time), then the session's lock.
    pub async fn fork(&self, id: &SessionId, req: ForkRequest) -> Result<Vec<String>, ApiError> {
        let plan = ForkPlan::new(req, self.fleet.config())?;
        let _slot = self.admission.create().await?;
        let sessions = self.fleet.at_for_new(id, plan.count())?;
        let (_more, more) = self
            .admission
            .more_creates(plan.count().saturating_sub(1) as usize);
        let _held = sessions.lock(id).await?;
        Ok(sessions.fork(id, plan, 1 + more).await?)
    }
}
