//! Whether an engine mounts the overlay volumes layered workspaces need, found once per engine.
//!
//! The probe makes what a session from a snapshot makes (two plain volumes as lower and upper,
//! one as overlay's work directory, and a `type=overlay` volume over them with `userxattr`),
//! then asks the daemon for an archive of it through a never-started container: the daemon
//! mounts a container's volumes for that, so a kernel or a volume driver that cannot mount the
//! overlay fails there. Everything it made goes, pass or fail.
//!
//! It runs when the engine's stack starts, in the background, with an image the engine has
//! (`RUNTIME_PROBE_IMAGE`, the first warm-pool image, else any of this deployment's snapshot
//! images); without one, on the first session from a snapshot, with that snapshot's image.
//! A verdict is kept for the process's life, and only a failed mount is one (the daemon's
//! answer names the mount); a probe that could not run (the engine down or slow, no image, its
//! objects removed meanwhile) says nothing and runs again next time. What a crash left of a
//! probe is the sweep's, past its age guard (another replica may be probing meanwhile). An engine that cannot mount overlays (or a
//! deployment with `SNAPSHOT_LAYERS=copy`) gives each session from a snapshot a copy of its
//! layer instead, and says so in `GET /engines/` and `/-/health/`.

use futures::StreamExt;
use tokio::sync::OnceCell;

use super::*;
use crate::api::{SnapshotLayerMode, SnapshotLayerSupport};
use crate::config::SnapshotLayers;

/// Role of the probe's volumes and container (the sweep's, should a crash leave them).
pub const ROLE_LAYER_PROBE: &str = "layer-probe";
/// The longest a probe may take; past it, it could not run.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// What an engine does for sessions from snapshots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayerSupport {
    /// Overlays over the snapshot's layers: nothing copied.
    Overlay,
    /// A copy of the snapshot's layer per session, and why.
    Copies(String),
}

/// The verdict, once known.
#[derive(Default)]
pub(super) struct Probe {
    verdict: OnceCell<LayerSupport>,
}

impl Snapshots {
    /// What this engine does for sessions from snapshots, probing it first if no probe has
    /// said yet (with `image`, one the engine has). An error: the probe could not run.
    pub(super) async fn layer_support(&self, image: &str) -> Result<LayerSupport, EngineError> {
        if self.config.snapshots.layers == SnapshotLayers::Copy {
            return Ok(LayerSupport::Copies(
                "DAIV_SANDBOX_SNAPSHOT_LAYERS=copy".to_string(),
            ));
        }
        self.probe
            .verdict
            .get_or_try_init(|| async {
                tokio::time::timeout(PROBE_TIMEOUT, self.probe_overlay(image))
                    .await
                    .unwrap_or_else(|_| {
                        Err(EngineError::Unavailable(
                            "the overlay probe timed out".into(),
                        ))
                    })
            })
            .await
            .cloned()
    }

    /// Probes at start-up, with an image this engine is known to have; without one, the first
    /// session from a snapshot probes with its image.
    pub async fn probe_layers_at_start(&self) {
        if self.config.snapshots.layers == SnapshotLayers::Copy {
            return;
        }
        let image = match crate::telemetry::runtime_probe::probe_image(&self.config) {
            Some(i) => Some(i),
            None => self
                .engine
                .list_images(&[(DEPLOYMENT_LABEL, self.config.deployment.as_str())])
                .await
                .ok()
                .and_then(|images| images.into_iter().find_map(|i| i.tags.into_iter().next())),
        };
        let Some(image) = image else { return };
        if let Err(e) = self.layer_support(&image).await {
            tracing::info!(error = %e, "snapshot layers: the start-up probe could not run; the first session from a snapshot probes again");
        }
    }

    /// The probe's verdict, if one was reached.
    pub(super) fn probed(&self) -> Option<LayerSupport> {
        self.probe.verdict.get().cloned()
    }

    /// What `GET /engines/` and `/-/health/` say of this engine.
    pub fn layer_report(&self) -> SnapshotLayerSupport {
        let verdict = if self.config.snapshots.layers == SnapshotLayers::Copy {
            Some(LayerSupport::Copies(
                "DAIV_SANDBOX_SNAPSHOT_LAYERS=copy".to_string(),
            ))
        } else {
            self.probe.verdict.get().cloned()
        };
        match verdict {
            Some(LayerSupport::Overlay) => SnapshotLayerSupport {
                mode: SnapshotLayerMode::Overlay,
                reason: None,
            },
            Some(LayerSupport::Copies(why)) => SnapshotLayerSupport {
                mode: SnapshotLayerMode::Copies,
                reason: Some(why),
            },
            None => SnapshotLayerSupport {
                mode: SnapshotLayerMode::Unknown,
                reason: Some("not probed yet (no image to probe with; the first session from a snapshot probes)".to_string()),
            },
        }
    }

    /// One probe: a verdict, or the error that kept it from running.
    async fn probe_overlay(&self, image: &str) -> Result<LayerSupport, EngineError> {
        let mut volumes = Vec::new();
        let mut container = None;
        let verdict = self.try_overlay(image, &mut volumes, &mut container).await;
        if let Some(id) = container {
            let _ = self.engine.remove(&id).await;
        }
        for name in volumes.iter().rev() {
            let _ = self.engine.remove_volume(name).await;
        }
        match &verdict {
            Ok(LayerSupport::Overlay) => {
                tracing::info!("snapshot layers: overlay volumes mount on this engine")
            }
            Ok(LayerSupport::Copies(why)) => {
                tracing::warn!(reason = %why, "snapshot layers: sessions from snapshots get copies on this engine")
            }
            Err(_) => {}
        }
        verdict
    }

    async fn try_overlay(
        &self,
        image: &str,
        volumes: &mut Vec<String>,
        container: &mut Option<String>,
    ) -> Result<LayerSupport, EngineError> {
        let token = crate::ids::random_token();
        let labels = self.labels(ROLE_LAYER_PROBE, &token);
        let mut dirs = Vec::new();
        for part in ["lower", "upper", "work"] {
            let name = format!("daiv-layer-probe-{token}-{part}");
            let v = self
                .engine
                .create_volume(&VolumeSpec {
                    name: name.clone(),
                    labels: labels.clone(),
                    driver_opts: HashMap::new(),
                })
                .await?;
            volumes.push(name);
            dirs.push(v.mountpoint);
        }
        let merged = format!("daiv-layer-probe-{token}-merged");
        let made = self
            .engine
            .create_volume(&overlay_volume(
                &merged,
                labels.clone(),
                &dirs[0],
                &dirs[1],
                &dirs[2],
            ))
            .await;
        match made {
            Ok(_) => volumes.push(merged.clone()),
            // The driver refused the options themselves.
            Err(EngineError::Rejected(e)) => {
                tracing::debug!(error = %e, "snapshot layers: the overlay volume was refused");
                return Ok(LayerSupport::Copies(
                    "the engine refused an overlay volume".to_string(),
                ));
            }
            Err(e) => return Err(e),
        }
        let mut spec = self.holder_spec(&token, image, &merged);
        spec.labels = labels;
        *container = Some(self.engine.create(&spec).await?);
        let id = container.as_deref().unwrap_or_default();
        // The daemon mounts the volume to answer: a mount that fails is the answer's error.
        let listed = match self.engine.get_archive(id, layout::WORKSPACE).await {
            Ok(mut stream) => match stream.next().await {
                Some(Err(e)) => Err(e),
                _ => Ok(()),
            },
            Err(e) => Err(e),
        };
        Ok(match listed {
            Ok(()) => LayerSupport::Overlay,
            // Only the mount's failure says overlays do not work; anything else (the container
            // or a volume gone, the engine down or busy) says nothing of them.
            Err(e) if !is_mount_failure(&e) => return Err(e),
            Err(e) => {
                // The daemon's words stay in the log.
                tracing::warn!(error = %e, "snapshot layers: the overlay volume did not mount");
                LayerSupport::Copies(
                    "an overlay volume (userxattr) does not mount on this engine".to_string(),
                )
            }
        })
    }
}

/// Whether the daemon's error is a volume's mount failing (Docker: "error while mounting volume
/// ...", its local driver: "failed to mount local volume: ...").
fn is_mount_failure(e: &EngineError) -> bool {
    match e {
        EngineError::Unavailable(m) | EngineError::Rejected(m) | EngineError::Conflict(m) => {
            m.contains("mount")
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_mount_failure_is_a_verdict() {
        let daemon = "error while mounting volume '/var/lib/docker/volumes/x/_data': failed to \
                      mount local volume: mount overlay:/x, flags: 0x0, data: lowerdir=...: \
                      invalid argument";
        assert!(is_mount_failure(&EngineError::Unavailable(daemon.into())));
        for other in [
            EngineError::NotFound,
            EngineError::Unavailable("connection refused".into()),
            EngineError::Conflict("removal of container in progress".into()),
        ] {
            assert!(!is_mount_failure(&other), "{other}");
        }
    }
}
