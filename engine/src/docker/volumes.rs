//! Named volumes of the local driver: snapshots' data and records, copy-on-write workspaces.

use super::DockerEngine;
use super::convert::{managed_filter, map_err, unix_seconds};
use crate::{EngineError, VolumeInfo, VolumeSpec};

pub(super) async fn create_volume(
    engine: &DockerEngine,
    spec: &VolumeSpec,
) -> Result<VolumeInfo, EngineError> {
    let v = engine
        .docker
        .create_volume(bollard::models::VolumeCreateRequest {
            name: Some(spec.name.clone()),
            driver: Some("local".to_string()),
            driver_opts: (!spec.driver_opts.is_empty()).then(|| spec.driver_opts.clone()),
            labels: Some(spec.labels.clone()),
            ..Default::default()
        })
        .await
        .map_err(map_err)?;
    Ok(volume_info(v))
}

pub(super) async fn inspect_volume(
    engine: &DockerEngine,
    name: &str,
) -> Result<VolumeInfo, EngineError> {
    let v = engine.docker.inspect_volume(name).await.map_err(map_err)?;
    Ok(volume_info(v))
}

pub(super) async fn list_volumes(
    engine: &DockerEngine,
    labels: &[(&str, &str)],
) -> Result<Vec<VolumeInfo>, EngineError> {
    let found = engine
        .docker
        .list_volumes(Some(bollard::query_parameters::ListVolumesOptions {
            filters: Some(managed_filter(labels)),
        }))
        .await
        .map_err(map_err)?;
    Ok(found
        .volumes
        .unwrap_or_default()
        .into_iter()
        .map(volume_info)
        .collect())
}

pub(super) async fn remove_volume(engine: &DockerEngine, name: &str) -> Result<(), EngineError> {
    engine
        .docker
        .remove_volume(
            name,
            Some(bollard::query_parameters::RemoveVolumeOptions { force: false }),
        )
        .await
        .map_err(map_err)
}

fn volume_info(v: bollard::models::Volume) -> VolumeInfo {
    VolumeInfo {
        name: v.name,
        mountpoint: v.mountpoint,
        labels: v.labels,
        created: v.created_at.as_deref().and_then(unix_seconds),
    }
}
