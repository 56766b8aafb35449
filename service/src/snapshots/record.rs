//! A snapshot's record (its labels say what the API answers), its listing and its removal.

use super::*;

impl Snapshots {
    pub(super) async fn write_record(&self, s: &Snapshot) -> Result<(), EngineError> {
        let mut labels = self.labels(ROLE_SNAPSHOT, &s.id);
        labels.insert(SOURCE_LABEL.to_string(), s.source.clone());
        labels.insert(IMAGE_LABEL.to_string(), s.base_image.clone());
        labels.insert(CREATED_LABEL.to_string(), s.created.to_string());
        labels.insert(SIZE_LABEL.to_string(), s.size.to_string());
        if let Some(n) = &s.name {
            labels.insert(NAME_LABEL.to_string(), n.clone());
        }
        if let Some(e) = s.expires {
            labels.insert(EXPIRES_LABEL.to_string(), e.to_string());
        }
        if let Some(u) = s.user {
            labels.insert(SANDBOX_USER_LABEL.to_string(), u.to_string());
        }
        self.engine
            .create_volume(&VolumeSpec {
                name: record_volume(&s.id),
                labels,
                driver_opts: HashMap::new(),
            })
            .await
            .map(drop)
    }

    /// This deployment's snapshot `id`, or [`SnapshotError::NotFound`].
    pub async fn get(&self, id: &str) -> Result<Snapshot, SnapshotError> {
        // Another engine's snapshot is not on this one.
        if !is_snapshot_id(id) || crate::ids::split_engine(id).0 != self.engine.id_prefix() {
            return Err(SnapshotError::NotFound);
        }
        let v = match self.engine.inspect_volume(&record_volume(id)).await {
            Ok(v) => v,
            Err(EngineError::NotFound) => return Err(SnapshotError::NotFound),
            Err(e) => return Err(e.into()),
        };
        self.parse_record(&v).ok_or(SnapshotError::NotFound)
    }

    fn parse_record(&self, v: &VolumeInfo) -> Option<Snapshot> {
        let l = &v.labels;
        if l.get(MANAGED_LABEL).map(String::as_str) != Some("true")
            || l.get(ROLE_LABEL).map(String::as_str) != Some(ROLE_SNAPSHOT)
            || l.get(DEPLOYMENT_LABEL) != Some(&self.config.deployment)
        {
            return None;
        }
        let id = l.get(SNAPSHOT_LABEL)?.clone();
        if v.name != record_volume(&id) {
            return None;
        }
        Some(Snapshot {
            name: l.get(NAME_LABEL).cloned(),
            source: l.get(SOURCE_LABEL).cloned().unwrap_or_default(),
            base_image: l.get(IMAGE_LABEL).cloned().unwrap_or_default(),
            created: l.get(CREATED_LABEL)?.parse().ok()?,
            expires: l.get(EXPIRES_LABEL).and_then(|e| e.parse().ok()),
            size: l.get(SIZE_LABEL).and_then(|s| s.parse().ok()).unwrap_or(0),
            user: l
                .get(SANDBOX_USER_LABEL)
                .and_then(|u| SandboxUser::parse(u)),
            id,
        })
    }

    /// This deployment's snapshots, newest first.
    pub async fn list(&self) -> Result<Vec<Snapshot>, SnapshotError> {
        let found = self.engine.list_volumes(&self.mine(ROLE_SNAPSHOT)).await?;
        let mut all: Vec<Snapshot> = found.iter().filter_map(|v| self.parse_record(v)).collect();
        all.sort_by(|a, b| b.created.cmp(&a.created).then_with(|| a.id.cmp(&b.id)));
        Ok(all)
    }

    /// Deletes snapshot `id`: its record now, its payload as soon as nothing uses it.
    pub async fn delete(&self, id: &str) -> Result<(), SnapshotError> {
        let s = self.get(id).await?;
        match self.engine.remove_volume(&record_volume(id)).await {
            Ok(()) | Err(EngineError::NotFound) => {}
            Err(e) => return Err(e.into()),
        }
        self.release(id).await;
        // Its layer stays while a layer or a session above it needs it: its bytes still count
        // against the deployment's cap ([`Snapshots::reserve`]) until the layer goes.
        if self.engine.inspect_volume(&data_volume(id)).await.is_ok() {
            let mut labels = self.labels(ROLE_SNAPSHOT_HELD, id);
            labels.insert(SIZE_LABEL.to_string(), s.size.to_string());
            let held = VolumeSpec {
                name: held_volume(id),
                labels,
                driver_opts: HashMap::new(),
            };
            if let Err(e) = self.engine.create_volume(&held).await {
                tracing::warn!(snapshot_id = id, error = %e, "a held layer not recorded");
            }
        }
        Ok(())
    }

    /// The bytes of deleted snapshots whose layers are still held.
    pub(super) async fn held_bytes(&self) -> Result<u64, EngineError> {
        let held = self
            .engine
            .list_volumes(&self.mine(ROLE_SNAPSHOT_HELD))
            .await?;
        Ok(held
            .iter()
            .filter_map(|v| v.labels.get(SIZE_LABEL)?.parse::<u64>().ok())
            .fold(0u64, u64::saturating_add))
    }

    /// Removes the held-layer records whose layer is gone (a crash between the two).
    pub(super) async fn sweep_held(&self) -> Result<(), EngineError> {
        for v in self
            .engine
            .list_volumes(&self.mine(ROLE_SNAPSHOT_HELD))
            .await?
        {
            let Some(id) = v.labels.get(SNAPSHOT_LABEL) else {
                continue;
            };
            if let Err(EngineError::NotFound) = self.engine.inspect_volume(&data_volume(id)).await {
                let _ = self.engine.remove_volume(&v.name).await;
            }
        }
        Ok(())
    }

    /// Removes a snapshot's payload where nothing uses it any more; what is still used stays
    /// for a later sweep. Its layer goes once no volume's mount needs it (see `layers`); the
    /// layers below it that have no record follow, as far as nothing else needs them.
    pub async fn release(&self, id: &str) {
        let mut next = vec![id.to_string()];
        // Each layer has fewer below it than the last: the walk ends within the deepest stack.
        while let Some(id) = next.pop() {
            next.extend(self.release_one(&id).await);
        }
    }

    /// [`Snapshots::release`] of one snapshot: the record-less layers below a layer it
    /// removed.
    async fn release_one(&self, id: &str) -> Vec<String> {
        // Being taken, or about to be mounted by a workspace this replica is making.
        if self.ledger().protected().contains(id) {
            return Vec::new();
        }
        let mut removed = self.engine.remove_image(&image_ref(id)).await;
        // This replica's layer worker of sessions from it may be what holds it.
        if matches!(removed, Err(EngineError::Conflict(_)))
            && self.retire_worker_of(&image_ref(id)).await
        {
            removed = self.engine.remove_image(&image_ref(id)).await;
        }
        match removed {
            Ok(()) | Err(EngineError::NotFound) => {}
            Err(e) => {
                tracing::debug!(snapshot_id = id, error = %e, "snapshot image still in use; kept")
            }
        }
        let deployment = self.config.deployment.as_str();
        let uses = layers::uses_label(id);
        // A workspace from before layers names its snapshot only.
        let legacy = [
            (ROLE_LABEL, ROLE_WORKSPACE),
            (DEPLOYMENT_LABEL, deployment),
            (SNAPSHOT_LABEL, id),
        ];
        let needing = [(DEPLOYMENT_LABEL, deployment), (uses.as_str(), "true")];
        let (workspaces, above) = tokio::join!(
            self.engine.list_volumes(&legacy),
            self.engine.list_volumes(&needing),
        );
        let unused =
            matches!((&workspaces, &above), (Ok(w), Ok(a)) if w.is_empty() && a.is_empty());
        if !unused {
            return Vec::new();
        }
        let below = match self.engine.inspect_volume(&data_volume(id)).await {
            Ok(v) => layers::lowers_of(&v),
            Err(_) => Vec::new(),
        };
        match self.engine.remove_volume(&data_volume(id)).await {
            Ok(()) | Err(EngineError::NotFound) => {
                self.ledger().forks.remove(id);
                let _ = self.engine.remove_volume(&held_volume(id)).await;
            }
            Err(e) => {
                tracing::debug!(snapshot_id = id, error = %e, "snapshot data still in use; kept");
                return Vec::new();
            }
        }
        let pinned = self.ledger().protected();
        let mut orphans = Vec::new();
        // Its flat copy (see `flatten`) goes as far as nothing mounts it.
        if let Some(flat) = self.unmark_flat(id).await
            && !pinned.contains(&flat)
        {
            orphans.push(flat);
        }
        for l in below {
            if pinned.contains(&l) {
                continue;
            }
            if let Err(EngineError::NotFound) = self.engine.inspect_volume(&record_volume(&l)).await
            {
                orphans.push(l);
            }
        }
        orphans
    }

    /// Everything of a snapshot that failed half-way.
    pub(super) async fn discard(&self, id: &str) {
        let _ = self.engine.remove_volume(&record_volume(id)).await;
        let _ = self.engine.remove_image(&image_ref(id)).await;
        let _ = self.engine.remove_volume(&data_volume(id)).await;
    }
}
