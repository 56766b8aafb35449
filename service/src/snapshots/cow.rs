//! Copy-on-write workspaces: a session from a snapshot mounts an overlay over its layers (see
//! `layers`).

use super::layers::{COPIED, LAYERED_LABEL, uses_label};
use super::probe::LayerSupport;
use super::*;

/// The longest overlay option string the kernel takes (one page, less room for what the
/// local driver adds).
const OPTIONS_MAX: usize = 4000;

impl Snapshots {
    /// A copy-on-write workspace over snapshot `s`'s layers for a new session.
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
        let [merged, upper, work] = workspace_volumes(&token);
        let mut labels = self.labels(ROLE_WORKSPACE, &s.id);
        labels.insert(WORKSPACE_LABEL.to_string(), token.clone());
        // A probe that could not run (the image gone meanwhile, the engine down) says nothing:
        // the overlay is tried, and the build answers for what is missing.
        if let Ok(LayerSupport::Copies(_)) = self.layer_support(&s.image()).await {
            return self.copied_workspace(s, &stack, token, labels, pins).await;
        }
        labels.insert(LAYERED_LABEL.to_string(), "userxattr".to_string());
        for layer in &stack {
            if let Some(id) = layer.labels.get(SNAPSHOT_LABEL) {
                labels.insert(uses_label(id), "true".to_string());
            }
        }
        let mut made: Vec<String> = Vec::new();
        let result = async {
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
            let paths: Vec<&str> = stack
                .iter()
                .map(|v| v.mountpoint.as_str())
                .chain(dirs.iter().map(String::as_str))
                .collect();
            // The overlay's option string is split on commas and colons.
            if paths
                .iter()
                .any(|p| p.is_empty() || p.contains([',', ':', '\\']) || !p.starts_with('/'))
            {
                return Err(SnapshotError::UnusableMountpoint);
            }
            let lowers = paths[..stack.len()].join(":");
            let spec = overlay_volume(&merged, labels.clone(), &lowers, &dirs[0], &dirs[1]);
            if spec.driver_opts.get("o").map_or(0, String::len) > OPTIONS_MAX {
                return Err(SnapshotError::UnusableMountpoint);
            }
            self.engine.create_volume(&spec).await?;
            made.push(merged.clone());
            Ok(())
        }
        .await;
        match result {
            Ok(()) => Ok(Workspace {
                token,
                merged,
                _pins: pins,
            }),
            Err(e) => {
                for name in made.iter().rev() {
                    let _ = self.engine.remove_volume(name).await;
                }
                Err(e)
            }
        }
    }

    /// A workspace that is a copy of the snapshot's layer, for an engine without overlays:
    /// there every snapshot is a base layer (see `layering`), so one copy is the whole tree.
    async fn copied_workspace<'a>(
        &'a self,
        s: &Snapshot,
        stack: &[VolumeInfo],
        token: String,
        mut labels: HashMap<String, String>,
        pins: Vec<Pin<'a>>,
    ) -> Result<Workspace<'a>, SnapshotError> {
        let [layer] = stack else {
            // Layers taken while this engine mounted overlays, which it no longer does.
            return Err(SnapshotError::LayersUnmountable {
                layers: stack.len(),
            });
        };
        let [merged, ..] = workspace_volumes(&token);
        labels.insert(LAYERED_LABEL.to_string(), COPIED.to_string());
        // It needs nothing of the snapshot once copied: no label keeps the snapshot's layer
        // (`release` reads a workspace's snapshot label as a use).
        labels.remove(SNAPSHOT_LABEL);
        self.engine
            .create_volume(&VolumeSpec {
                name: merged.clone(),
                labels,
                driver_opts: HashMap::new(),
            })
            .await?;
        if let Err(e) = self
            .copy_into(&token, &s.image(), &layer.name, &merged)
            .await
        {
            let _ = self.engine.remove_volume(&merged).await;
            return Err(e);
        }
        Ok(Workspace {
            token,
            merged,
            _pins: pins,
        })
    }

    /// Removes a session's copy-on-write workspace (after its container is gone).
    pub async fn remove_workspace(&self, token: &str) {
        for name in workspace_volumes(token) {
            match self.engine.remove_volume(&name).await {
                Ok(()) | Err(EngineError::NotFound) => {}
                Err(e) => {
                    tracing::warn!(volume = %name, error = %e, "workspace volume not removed")
                }
            }
        }
    }
}
