//! Copy-on-write workspaces: a session from a snapshot mounts an overlay over its layers (see
//! `layers`).

use super::layers::{COPIED, LAYERED_LABEL, LAYOUT_LABEL, LAYOUT_STATE, SEEDED_LABEL, uses_label};
use super::probe::LayerSupport;
use super::*;

impl Snapshots {
    /// A copy-on-write workspace over snapshot `s`'s layers for a new session: an overlay per
    /// directory its layers hold (`/workspace`, or every state directory).
    pub async fn workspace(&self, s: &Snapshot) -> Result<Workspace<'_>, SnapshotError> {
        let token = crate::ids::random_token();
        // The snapshot and its layers are pinned too, until the session's container exists
        // (its volumes' labels say it needs them from then on): a delete of the snapshot
        // meanwhile keeps them. Pins are this replica's: another replica's delete at that
        // instant is the age guard's.
        let mut pins = vec![self.pin(&token), self.pin(&s.id)];
        let stack = self.stack(&s.id).await?;
        for layer in &stack {
            if let Some(id) = layer.labels.get(SNAPSHOT_LABEL) {
                pins.push(self.pin(id));
            }
        }
        let top = &stack[0].labels;
        let state = top.get(LAYOUT_LABEL).map(String::as_str) == Some(LAYOUT_STATE);
        let seeded = top.contains_key(SEEDED_LABEL);
        let keys = state_keys(state);
        let mut labels = self.labels(ROLE_WORKSPACE, &s.id);
        labels.insert(WORKSPACE_LABEL.to_string(), token.clone());
        // A probe that could not run (the image gone meanwhile, the engine down) says nothing:
        // the overlay is tried, and the build answers for what is missing.
        if let Ok(LayerSupport::Copies(_)) = self.layer_support(&s.image()).await {
            let mounts = self
                .copied_workspace(s, &stack, &token, labels, state)
                .await?;
            return Ok(Workspace {
                token,
                mounts,
                state,
                seeded,
                _pins: pins,
            });
        }
        labels.insert(LAYERED_LABEL.to_string(), "userxattr".to_string());
        for layer in &stack {
            if let Some(id) = layer.labels.get(SNAPSHOT_LABEL) {
                labels.insert(uses_label(id), "true".to_string());
            }
        }
        // The overlays of the directories side by side: each its upper and work volumes, then
        // the overlay over them. What a failure leaves made is removed.
        let one = |key: &'static str, at: &'static str| {
            let (labels, stack, token) = (&labels, &stack, &token);
            async move {
                let [merged, upper, work] = state_volumes(token, key);
                let mut made: Vec<String> = Vec::new();
                let mount = async {
                    let mut dirs = Vec::new();
                    for name in [&upper, &work] {
                        let v = self
                            .engine
                            .create_volume(&VolumeSpec {
                                name: name.clone(),
                                labels: labels.clone(),
                                driver_opts: HashMap::new(),
                            })
                            .await?;
                        made.push(name.clone());
                        dirs.push(v.mountpoint);
                    }
                    let lowers = lower_dirs(stack, state, key);
                    if !lowers.iter().chain(&dirs).all(|p| usable_dir(p)) {
                        return Err(SnapshotError::UnusableMountpoint);
                    }
                    let spec = overlay_volume(
                        &merged,
                        labels.clone(),
                        &lowers.join(":"),
                        &dirs[0],
                        &dirs[1],
                    );
                    if spec.driver_opts.get("o").map_or(0, String::len) > OPTIONS_MAX {
                        return Err(SnapshotError::UnusableMountpoint);
                    }
                    self.engine.create_volume(&spec).await?;
                    made.push(merged.clone());
                    Ok((merged.clone(), at.to_string()))
                }
                .await;
                (made, mount)
            }
        };
        let results = futures::future::join_all(keys.iter().map(|(key, at)| one(key, at))).await;
        let mut made: Vec<String> = Vec::new();
        let mut mounts = Vec::new();
        let mut failed = None;
        for (m, mount) in results {
            made.extend(m);
            match mount {
                Ok(mount) => mounts.push(mount),
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        match failed {
            None => Ok(Workspace {
                token,
                mounts,
                state,
                seeded,
                _pins: pins,
            }),
            Some(e) => {
                // The overlays before the volumes under them.
                let (overlays, under): (Vec<_>, Vec<_>) =
                    made.iter().partition(|n| n.ends_with("-merged"));
                for name in overlays.into_iter().chain(under) {
                    let _ = self.engine.remove_volume(name).await;
                }
                Err(e)
            }
        }
    }

    /// A workspace that is a copy of the snapshot's layer, for an engine without overlays:
    /// there every snapshot is a base layer (see `layering`), so one copy is the whole tree.
    /// Its volumes and where they go.
    async fn copied_workspace(
        &self,
        s: &Snapshot,
        stack: &[VolumeInfo],
        token: &str,
        mut labels: HashMap<String, String>,
        state: bool,
    ) -> Result<Vec<(String, String)>, SnapshotError> {
        let [layer] = stack else {
            // Layers taken while this engine mounted overlays, which it no longer does.
            return Err(SnapshotError::LayersUnmountable {
                layers: stack.len(),
            });
        };
        labels.insert(LAYERED_LABEL.to_string(), COPIED.to_string());
        // It needs nothing of the snapshot once copied: no label keeps the snapshot's layer
        // (`release` reads a workspace's snapshot label as a use).
        labels.remove(SNAPSHOT_LABEL);
        let mut mounts: Vec<(String, String)> = Vec::new();
        let mut into = Vec::new();
        for (key, at) in state_keys(state) {
            let [merged, ..] = state_volumes(token, key);
            let made = self
                .engine
                .create_volume(&VolumeSpec {
                    name: merged.clone(),
                    labels: labels.clone(),
                    driver_opts: HashMap::new(),
                })
                .await;
            if let Err(e) = made {
                for (name, _) in &mounts {
                    let _ = self.engine.remove_volume(name).await;
                }
                return Err(e.into());
            }
            into.push((state.then_some(*key), merged.clone()));
            mounts.push((merged, at.to_string()));
        }
        if let Err(e) = self.copy_into(token, &s.image(), &layer.name, &into).await {
            for (name, _) in &mounts {
                let _ = self.engine.remove_volume(name).await;
            }
            return Err(e);
        }
        Ok(mounts)
    }

    /// Removes a session's copy-on-write workspace (after its container is gone).
    pub async fn remove_workspace(&self, token: &str) {
        let volumes: Vec<[String; 3]> = crate::layout::STATE
            .iter()
            .map(|(key, _)| state_volumes(token, key))
            .collect();
        // Each overlay before the volumes it is mounted over; those of one kind side by side.
        let merged = volumes.iter().map(|[merged, _, _]| merged);
        let below = volumes.iter().flat_map(|[_, upper, work]| [upper, work]);
        for names in [merged.collect::<Vec<_>>(), below.collect()] {
            futures::future::join_all(names.into_iter().map(|name| async move {
                match self.engine.remove_volume(name).await {
                    Ok(()) | Err(EngineError::NotFound) => {}
                    Err(e) => {
                        tracing::warn!(volume = %name, error = %e, "workspace volume not removed")
                    }
                }
            }))
            .await;
        }
    }
}
