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
//! A verdict is kept for the process's life; a probe that could not run (the engine down, no
//! image) says nothing and runs again next time. An engine that cannot mount overlays (or a
//! deployment with `SNAPSHOT_LAYERS=copy`) gives each session from a snapshot a copy of its
//! layer instead, and says so in `GET /engines/` and `/-/health/`.

use futures::StreamExt;
use tokio::sync::OnceCell;

use super::*;
use crate::api::{SnapshotLayerMode, SnapshotLayerSupport};
use crate::config::SnapshotLayers;

/// Role of the probe's volumes and container (swept by the next probe should one be left).
pub const ROLE_LAYER_PROBE: &str = "layer-probe";

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
            .get_or_try_init(|| self.probe_overlay(image))
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
        self.remove_probe_leftovers().await;
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
            .create_volume(&VolumeSpec {
                name: merged.clone(),
                labels: labels.clone(),
                driver_opts: HashMap::from([
                    ("type".to_string(), "overlay".to_string()),
                    ("device".to_string(), "overlay".to_string()),
                    (
                        "o".to_string(),
                        format!(
                            "lowerdir={},upperdir={},workdir={},userxattr",
                            dirs[0], dirs[1], dirs[2]
                        ),
                    ),
                ]),
            })
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
            // An engine that stopped answering says nothing of overlays.
            Err(e) if self.engine.ping().await.is_err() => return Err(e),
            Err(e) => {
                // The daemon's words stay in the log.
                tracing::warn!(error = %e, "snapshot layers: the overlay volume did not mount");
                LayerSupport::Copies(
                    "an overlay volume (userxattr) does not mount on this engine".to_string(),
                )
            }
        })
    }

    /// Removes what a probe interrupted by a crash left.
    async fn remove_probe_leftovers(&self) {
        let mine = self.mine(ROLE_LAYER_PROBE);
        if let Ok(list) = self.engine.list(&mine).await {
            for c in list {
                let _ = self.engine.remove(&c.id).await;
            }
        }
        if let Ok(list) = self.engine.list_volumes(&mine).await {
            // The overlay first: it is mounted over the others.
            let (merged, plain): (Vec<_>, Vec<_>) =
                list.into_iter().partition(|v| v.name.ends_with("-merged"));
            for v in merged.into_iter().chain(plain) {
                let _ = self.engine.remove_volume(&v.name).await;
            }
        }
    }
}
