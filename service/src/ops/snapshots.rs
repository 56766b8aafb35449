//! A session's snapshots and forks. Each takes a create slot first (it builds Docker objects as
//! a create does), then the session's lock.

use super::{Access, Admit, Op, Ops, Reached};
use crate::error::ApiError;
use crate::ids::{SessionId, SnapshotId};
use crate::sessions::ForkPlan;
use crate::snapshots::Snapshot;

/// A snapshot of a session's whole filesystem at one instant (`name` and `ttl_seconds` as the
/// request gave them, checked under the lock).
pub struct TakeSnapshot {
    pub name: Option<String>,
    pub ttl_seconds: Option<u64>,
}

impl Op for TakeSnapshot {
    type Output = Snapshot;
    const ADMIT: Admit = Admit::Create;
    const ACCESS: Access = Access::Held;

    async fn apply(self, at: Reached) -> Result<Snapshot, ApiError> {
        let req = at
            .sessions
            .snapshot_request(self.name.as_deref(), self.ttl_seconds)?;
        let (snapshot, _) = at.sessions.snapshot(&at.id, &req).await?;
        Ok(snapshot)
    }
}

impl Ops {
    /// The deployment's snapshots, newest first: every engine's that answers (a fleet's down
    /// engine lists nothing until it is back).
    pub async fn snapshots(&self) -> Result<Vec<Snapshot>, ApiError> {
        let cells: Vec<_> = self
            .fleet
            .cells()
            .into_iter()
            .filter(|c| c.is_up())
            .collect();
        let lists = futures::future::join_all(cells.iter().map(|c| c.snapshots().list()));
        let mut all = Vec::new();
        for listed in lists.await {
            all.extend(listed?);
        }
        all.sort_by(|a, b| b.created.cmp(&a.created).then_with(|| a.id.cmp(&b.id)));
        Ok(all)
    }

    /// Deletes snapshot `id`: sessions made from it keep working; its image and data go once
    /// none uses them.
    pub async fn delete_snapshot(&self, id: &SnapshotId) -> Result<(), ApiError> {
        Ok(self.fleet.cell_of(id)?.snapshots().delete(id).await?)
    }

    /// `plan.count()` new sessions from session `id`, all or none, on its engine: one create
    /// slot, then the engine's room for them all (refused without), as many more slots as are
    /// free (the forks are built that many at a time), then the session's lock.
    pub async fn fork(&self, id: &SessionId, plan: ForkPlan) -> Result<Vec<String>, ApiError> {
        let _slot = self.admission.create().await?;
        let sessions = self.fleet.at_for_new(id, plan.count())?;
        let (_more, more) = self
            .admission
            .more_creates(plan.count().saturating_sub(1) as usize);
        let _held = sessions.lock(id).await?;
        Ok(sessions.fork(id, plan, 1 + more).await?)
    }
}
