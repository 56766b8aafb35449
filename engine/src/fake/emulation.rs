//! How the fake answers each [`ContainerEngine`] call, over the fake's state: containers,
//! networks and archives in memory, execs from the responder, and attached execs (the session
//! helper) served by a host build of the real `daiv-sandbox-helper`.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;

use crate::{
    AttachedExec, CommitSpec, ContainerEngine, ContainerInfo, ContainerSpec, ContainerStatus,
    EngineError, ExecSpec, ExecStream, ImageInfo, NetworkInfo, NetworkSpec, VolumeInfo, VolumeSpec,
};

use super::{FakeEngine, State};
use sandbox_common::archive::Archive;

/// The service's snapshot images' repository (`snapshots::IMAGE_REPOSITORY`, which this crate
/// cannot import): a reference in it that was not committed is gone.
const SNAPSHOT_IMAGES: &str = "daiv-sandbox-snapshot:";

#[async_trait::async_trait]
impl ContainerEngine for FakeEngine {
    async fn ping(&self) -> Result<(), EngineError> {
        self.check_up("ping".into()).await
    }

    async fn info(&self) -> Result<crate::EngineInfo, EngineError> {
        self.check_up("info".into()).await?;
        Ok(crate::EngineInfo {
            runtimes: vec!["runc".into(), "runsc".into()],
            images: Vec::new(),
        })
    }

    async fn ensure_image(&self, image: &str) -> Result<ImageInfo, EngineError> {
        self.check_up(format!("ensure_image {image}")).await?;
        if self.with(|s| s.missing_images.iter().any(|m| m == image)) {
            return Err(EngineError::ImageUnavailable {
                image: image.to_string(),
                failure: crate::PullFailure::Denied,
                reason: "pull access denied".into(),
            });
        }
        // Every name resolves to an image carrying it (the engine's own check is Docker's).
        let tag = match image.rsplit('/').next() {
            Some(last) if last.contains(':') || image.contains('@') => image.to_string(),
            _ => format!("{image}:latest"),
        };
        Ok(self.with(|s| ImageInfo {
            id: image_id_of(s, image),
            tags: vec![tag],
            labels: s.image_labels.get(image).cloned().unwrap_or_default(),
            ..Default::default()
        }))
    }

    async fn create(&self, spec: &ContainerSpec) -> Result<String, EngineError> {
        self.check_up(format!("create {}", spec.image)).await?;
        // Docker's 404 for an image that is not there: a snapshot's that is gone, or one made
        // missing (every other name stands for an image sessions are made from).
        let gone = spec.image.starts_with(SNAPSHOT_IMAGES) && self.committed(&spec.image).is_none();
        if gone || self.with(|s| s.missing_images.contains(&spec.image)) {
            return Err(EngineError::NotFound);
        }
        let id = self.with(|s| {
            if let Some(name) = &spec.name
                && s.names.values().any(|n| n == name)
            {
                return Err(EngineError::Conflict(format!("name {name} is in use")));
            }
            s.next_id += 1;
            let id = format!("{:064x}", s.next_id);
            let name = spec
                .name
                .clone()
                .unwrap_or_else(|| format!("fake-{}", s.next_id));
            let image_id = image_id_of(s, &spec.image);
            s.names.insert(id.clone(), name);
            s.container_images.insert(id.clone(), image_id);
            s.containers
                .insert(id.clone(), (spec.clone(), ContainerStatus::Created));
            Ok::<_, EngineError>(id)
        })?;
        if spec.labels.get(crate::STATE_LABEL).map(String::as_str) == Some(crate::STATE_VOLUMES) {
            self.name_anonymous_volumes(&id)?;
        }
        // The skeleton is extracted before the start, as Docker does.
        let skeleton = spec
            .skeleton_archive()
            .map_err(|e| EngineError::Rejected(e.to_string()))?;
        if let Some(skeleton) = skeleton {
            self.extracted(&id, "/", &skeleton)?;
        }
        Ok(id)
    }

    async fn start(&self, id: &str) -> Result<(), EngineError> {
        self.check_up(format!("start {id}")).await?;
        self.mount_volumes(id)?;
        self.with(|s| match s.containers.get_mut(id) {
            Some((_, st)) => {
                *st = ContainerStatus::Running;
                Ok(())
            }
            None => Err(EngineError::NotFound),
        })
    }

    async fn inspect(&self, id: &str) -> Result<ContainerInfo, EngineError> {
        self.check_up(format!("inspect {id}")).await?;
        self.with(|s| match s.containers.get(id) {
            Some((spec, st)) => Ok(ContainerInfo {
                id: id.to_string(),
                name: s.names.get(id).cloned().unwrap_or_default(),
                image_id: s.container_images.get(id).cloned(),
                status: st.clone(),
                created: s.times.get(id).map_or(Some(0), |t| t.0),
                labels: spec.labels.clone(),
                finished_at: s.times.get(id).and_then(|t| t.1.clone()),
                memory_bytes: spec.memory_bytes,
                nano_cpus: spec.nano_cpus,
                env: spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
                volumes: spec
                    .named_volumes
                    .iter()
                    .map(|(name, at)| (at.clone(), name.clone()))
                    .collect(),
            }),
            None => Err(EngineError::NotFound),
        })
    }

    async fn stats(&self, id: &str) -> Result<Option<crate::ContainerStats>, EngineError> {
        self.check_up(format!("stats {id}")).await?;
        self.with(|s| match s.containers.get(id) {
            Some((_, ContainerStatus::Running | ContainerStatus::Paused)) => Ok(Some(
                s.stats.get(id).copied().unwrap_or(crate::ContainerStats {
                    cpu_total_ns: 1,
                    online_cpus: 2,
                    mem_usage: 8 << 20,
                    mem_cache: 1 << 20,
                    mem_limit: 1 << 30,
                }),
            )),
            Some(_) => Ok(None),
            None => Err(EngineError::NotFound),
        })
    }

    async fn stop(&self, id: &str, _grace: Duration) -> Result<(), EngineError> {
        self.check_up(format!("stop {id}")).await?;
        self.with(|s| {
            if let Some(t) = s.alive.remove(id) {
                t.cancel();
            }
        });
        self.with(|s| match s.containers.get_mut(id) {
            Some((_, st)) => {
                *st = ContainerStatus::Exited;
                Ok(())
            }
            None => Err(EngineError::NotFound),
        })
    }

    async fn remove(&self, id: &str) -> Result<(), EngineError> {
        self.check_up(format!("remove {id}")).await?;
        // Its own files; a named volume's outlive it.
        let _ = std::fs::remove_dir_all(self.own_dir(id));
        let _ = std::fs::remove_dir_all(self.own_dir(id).with_extension("service"));
        self.with(|s| {
            if let Some(t) = s.alive.remove(id) {
                t.cancel();
            }
            s.names.remove(id);
            s.asked.remove(id);
            s.container_images.remove(id);
            s.containers
                .remove(id)
                .map(|_| ())
                .ok_or(EngineError::NotFound)
        })?;
        // Its anonymous volumes, but one another container mounts (Docker's `rm -v` fails on
        // those and leaves them).
        for v in self.with(|s| s.anonymous.remove(id)).unwrap_or_default() {
            let _ = self.drop_volume(&v);
        }
        Ok(())
    }

    async fn rename(&self, current: &str, new: &str) -> Result<(), EngineError> {
        self.check_up(format!("rename {current} {new}")).await?;
        self.with(|s| {
            let Some(id) = s
                .names
                .iter()
                .find(|(id, name)| *name == current || *id == current)
                .map(|(id, _)| id.clone())
            else {
                return Err(EngineError::NotFound);
            };
            match s.names.iter().find(|(_, name)| *name == new) {
                Some((other, _)) if *other == id => {
                    return Err(EngineError::Rejected("same name".into()));
                }
                Some(_) => return Err(EngineError::Conflict(format!("name {new} is in use"))),
                None => {}
            }
            s.names.insert(id, new.to_string());
            Ok(())
        })
    }

    async fn update_limits(
        &self,
        id: &str,
        memory_bytes: Option<i64>,
        nano_cpus: Option<i64>,
    ) -> Result<(), EngineError> {
        self.check_up(format!("update_limits {id}")).await?;
        self.with(|s| match s.containers.get_mut(id) {
            Some((spec, _)) => {
                spec.memory_bytes = memory_bytes.or(spec.memory_bytes);
                spec.nano_cpus = nano_cpus.or(spec.nano_cpus);
                Ok(())
            }
            None => Err(EngineError::NotFound),
        })
    }

    async fn image_id(&self, image: &str) -> Result<String, EngineError> {
        self.check_up(format!("image_id {image}")).await?;
        if self.with(|s| s.missing_images.iter().any(|m| m == image)) {
            return Err(EngineError::NotFound);
        }
        Ok(self.with(|s| image_id_of(s, image)))
    }

    async fn exec(&self, id: &str, spec: &ExecSpec) -> Result<ExecStream, EngineError> {
        let user_cmd = spec.cmd.last().cloned().unwrap_or_default();
        self.check_up(format!("exec {id} {user_cmd}")).await?;
        let result = match spec.cmd.get(1).map(String::as_str) {
            Some("copy-tree") => self.copy_tree_exec(id, &spec.cmd[2..]),
            Some("writable-paths") => {
                let paths = self.with(|s| s.writable_paths.clone());
                let out = serde_json::json!({"paths": paths, "truncated": false, "deep": false});
                super::FakeExec {
                    chunks: vec![format!("{out}\n").into_bytes()],
                    exit_code: 0,
                }
            }
            _ => (self.responder)(&user_cmd),
        };
        let exec_id = self.with(|s| {
            let exec_id = format!("exec-{}", s.execs.len());
            s.execs.insert(exec_id.clone(), result.exit_code);
            exec_id
        });
        let output = futures::stream::iter(
            result
                .chunks
                .into_iter()
                .map(|c| Ok::<_, EngineError>(Bytes::from(c))),
        )
        .boxed();
        Ok(ExecStream { exec_id, output })
    }

    /// The session helper's channel (see `helper`), or its `write-file`.
    async fn exec_attached(&self, id: &str, spec: &ExecSpec) -> Result<AttachedExec, EngineError> {
        if spec.cmd.get(1).map(String::as_str) == Some("write-file") {
            return self.write_file(id, spec).await;
        }
        self.serve_helper(id).await
    }

    async fn exec_exit_code(&self, exec_id: &str) -> Result<Option<i64>, EngineError> {
        self.check_up(format!("exec_exit_code {exec_id}")).await?;
        Ok(self.with(|s| s.execs.get(exec_id).copied()))
    }

    async fn put_archive(
        &self,
        id: &str,
        path: &str,
        mut tar: BoxStream<'static, Result<Bytes, std::io::Error>>,
    ) -> Result<(), EngineError> {
        self.check_up(format!("put_archive {id} {path}")).await?;
        self.mount_volumes(id)?;
        let mut whole = Vec::new();
        while let Some(chunk) = tar.next().await {
            whole.extend_from_slice(&chunk.map_err(|e| EngineError::Rejected(e.to_string()))?);
        }
        if !self.with(|s| s.containers.contains_key(id)) {
            return Err(EngineError::NotFound);
        }
        let rest = self.extract_into_volumes(id, path, &whole)?;
        self.extracted(id, path, &rest)
    }

    async fn get_archive(
        &self,
        id: &str,
        path: &str,
    ) -> Result<BoxStream<'static, Result<Bytes, EngineError>>, EngineError> {
        self.check_up(format!("get_archive {id} {path}")).await?;
        self.mount_volumes(id)?;
        // `/workspace` is the directory the helper serves (the skeleton's entry for it says
        // nothing of what is in it).
        if path.trim_end_matches('/') == sandbox_protocol::layout::WORKSPACE
            && self.with(|s| s.containers.contains_key(id))
        {
            let tar = self.workspace_archive(id)?;
            return Ok(futures::stream::once(async move { Ok(tar) }).boxed());
        }
        let found = self.with(|s| s.files.get(&(id.to_string(), path.to_string())).cloned());
        let Some((content, (mode, uid, gid))) = found else {
            return Err(EngineError::NotFound);
        };
        let base = path.rsplit('/').next().unwrap_or_default();
        let owner = (
            u32::try_from(uid).unwrap_or(u32::MAX),
            u32::try_from(gid).unwrap_or(u32::MAX),
        );
        let mut tar = Archive::new();
        match &content {
            Some(data) => tar.file(base, mode, owner, data),
            None => tar.dir(base, mode, owner),
        };
        let bytes = tar
            .finish()
            .map_err(|e| EngineError::Unavailable(e.to_string()))?;
        Ok(futures::stream::once(async move { Ok(bytes) }).boxed())
    }

    async fn wait_for_log(
        &self,
        id: &str,
        _needle: &str,
        _timeout: Duration,
    ) -> Result<(), EngineError> {
        self.check_up(format!("wait_for_log {id}")).await?;
        match self.status(id) {
            Some(ContainerStatus::Running) => Ok(()),
            _ => Err(EngineError::Unavailable(format!("{id} is not running"))),
        }
    }

    async fn list(&self, labels: &[(&str, &str)]) -> Result<Vec<ContainerInfo>, EngineError> {
        self.check_up("list".into()).await?;
        Ok(self.with(|s| {
            s.containers
                .iter()
                .filter(|(_, (spec, _))| {
                    labels
                        .iter()
                        .all(|(k, v)| spec.labels.get(*k).map(String::as_str) == Some(*v))
                })
                .map(|(id, (spec, st))| ContainerInfo {
                    id: id.clone(),
                    name: s.names.get(id).cloned().unwrap_or_default(),
                    image_id: s.container_images.get(id).cloned(),
                    status: st.clone(),
                    created: s.times.get(id).map_or(Some(0), |t| t.0),
                    labels: spec.labels.clone(),
                    finished_at: None,
                    memory_bytes: spec.memory_bytes,
                    nano_cpus: spec.nano_cpus,
                    env: Vec::new(),
                    volumes: Vec::new(),
                })
                .collect()
        }))
    }

    async fn create_network(&self, spec: &NetworkSpec) -> Result<String, EngineError> {
        self.check_up(format!("create_network {}", spec.name))
            .await?;
        self.with(|s| {
            if s.networks.contains_key(&spec.name) {
                return Err(EngineError::Conflict(format!(
                    "network {} exists",
                    spec.name
                )));
            }
            s.networks.insert(spec.name.clone(), spec.clone());
            Ok(spec.name.clone())
        })
    }

    async fn remove_network(&self, id_or_name: &str) -> Result<(), EngineError> {
        self.check_up(format!("remove_network {id_or_name}"))
            .await?;
        self.with(|s| {
            s.attachments.retain(|(n, _, _)| n != id_or_name);
            s.networks
                .remove(id_or_name)
                .map(|_| ())
                .ok_or(EngineError::NotFound)
        })
    }

    async fn connect_network(
        &self,
        network: &str,
        container: &str,
        ip: Option<std::net::IpAddr>,
    ) -> Result<(), EngineError> {
        self.check_up(format!("connect_network {network} {container}"))
            .await?;
        self.with(|s| {
            if !s.containers.contains_key(container) {
                return Err(EngineError::NotFound);
            }
            s.attachments
                .push((network.to_string(), container.to_string(), ip));
            Ok(())
        })
    }

    async fn list_networks(
        &self,
        labels: &[(&str, &str)],
    ) -> Result<Vec<NetworkInfo>, EngineError> {
        self.check_up("list_networks".into()).await?;
        Ok(self.with(|s| {
            s.networks
                .values()
                .filter(|n| {
                    labels
                        .iter()
                        .all(|(k, v)| n.labels.get(*k).map(String::as_str) == Some(*v))
                })
                .map(|n| NetworkInfo {
                    id: n.name.clone(),
                    name: n.name.clone(),
                    labels: n.labels.clone(),
                    created: Some(s.network_created.get(&n.name).copied().unwrap_or(0)),
                })
                .collect()
        }))
    }

    async fn pause(&self, id: &str) -> Result<(), EngineError> {
        self.check_up(format!("pause {id}")).await?;
        self.set_status(id, ContainerStatus::Running, ContainerStatus::Paused)
    }

    async fn unpause(&self, id: &str) -> Result<(), EngineError> {
        self.check_up(format!("unpause {id}")).await?;
        self.set_status(id, ContainerStatus::Paused, ContainerStatus::Running)
    }

    // Images and volumes with content: see `layers`.
    async fn commit(&self, id: &str, spec: &CommitSpec) -> Result<String, EngineError> {
        self.check_up(format!("commit {id}")).await?;
        self.record_commit(id, spec)
    }

    /// Asked (the call recorded), never known: a walk of the layer is the daemon's.
    async fn writable_bytes(&self, id: &str) -> Result<Option<u64>, EngineError> {
        self.check_up(format!("writable_bytes {id}")).await?;
        Ok(None)
    }

    async fn tag_image(&self, source: &str, reference: &str) -> Result<(), EngineError> {
        self.check_up(format!("tag_image {source}")).await?;
        self.record_tag(source, reference)
    }

    /// A committed image; any other name or id resolves as `ensure_image` says (the images
    /// sessions are made from), but a snapshot's image that is gone.
    async fn inspect_image(&self, reference: &str) -> Result<ImageInfo, EngineError> {
        self.check_up(format!("inspect_image {reference}")).await?;
        if let Some(image) = self.committed(reference) {
            return Ok(image);
        }
        let snapshot_ref = reference.starts_with(SNAPSHOT_IMAGES);
        if snapshot_ref || self.with(|s| s.missing_images.iter().any(|m| m == reference)) {
            return Err(EngineError::NotFound);
        }
        Ok(self.with(|s| ImageInfo {
            id: if reference.starts_with("sha256:") {
                reference.to_string()
            } else {
                image_id_of(s, reference)
            },
            labels: s.image_labels.get(reference).cloned().unwrap_or_default(),
            ..Default::default()
        }))
    }

    async fn list_images(&self, labels: &[(&str, &str)]) -> Result<Vec<ImageInfo>, EngineError> {
        self.check_up("list_images".into()).await?;
        Ok(self.committed_with(labels))
    }

    async fn image_tags(&self, repository: &str) -> Result<Vec<String>, EngineError> {
        self.check_up("image_tags".into()).await?;
        let prefix = format!("{repository}:");
        Ok(self.with(|s| {
            s.images
                .values()
                .flat_map(|i| i.tags.iter())
                .filter(|t| t.starts_with(&prefix))
                .cloned()
                .collect()
        }))
    }

    async fn remove_image(&self, reference: &str) -> Result<(), EngineError> {
        self.check_up(format!("remove_image {reference}")).await?;
        self.drop_image(reference)
    }

    async fn create_volume(&self, spec: &VolumeSpec) -> Result<VolumeInfo, EngineError> {
        self.check_up(format!("create_volume {}", spec.name))
            .await?;
        self.make_volume(spec)
    }

    async fn inspect_volume(&self, name: &str) -> Result<VolumeInfo, EngineError> {
        self.check_up(format!("inspect_volume {name}")).await?;
        self.with(|s| s.volumes.get(name).cloned().ok_or(EngineError::NotFound))
    }

    async fn list_volumes(&self, labels: &[(&str, &str)]) -> Result<Vec<VolumeInfo>, EngineError> {
        self.check_up("list_volumes".into()).await?;
        Ok(self.with(|s| {
            s.volumes
                .values()
                .filter(|v| {
                    labels
                        .iter()
                        .all(|(k, val)| v.labels.get(*k).map(String::as_str) == Some(*val))
                })
                .cloned()
                .collect()
        }))
    }

    async fn remove_volume(&self, name: &str) -> Result<(), EngineError> {
        self.check_up(format!("remove_volume {name}")).await?;
        self.drop_volume(name)
    }
}

impl FakeEngine {
    /// Moves a container from status `from` to `to`, as Docker's pause and unpause do (a
    /// container in any other state is a conflict).
    fn set_status(
        &self,
        id: &str,
        from: ContainerStatus,
        to: ContainerStatus,
    ) -> Result<(), EngineError> {
        self.with(|s| match s.containers.get_mut(id) {
            Some((_, st)) if *st == from => {
                *st = to;
                Ok(())
            }
            Some(_) => Err(EngineError::Conflict(format!(
                "container {id} is not {from:?}"
            ))),
            None => Err(EngineError::NotFound),
        })
    }
}

pub(super) fn image_id_of(s: &State, image: &str) -> String {
    s.image_ids
        .get(image)
        .cloned()
        .unwrap_or_else(|| format!("sha256:{image}"))
}

impl FakeEngine {
    /// Remembers what an archive extracted at `path` holds, so get_archive can serve it back
    /// (seed markers, fs ops) and the helper finds the service's files.
    fn extracted(&self, id: &str, path: &str, whole: &[u8]) -> Result<(), EngineError> {
        let mut archive = tar::Archive::new(whole);
        let entries = archive
            .entries()
            .map_err(|e| EngineError::Rejected(e.to_string()))?;
        for entry in entries {
            let mut entry = entry.map_err(|e| EngineError::Rejected(e.to_string()))?;
            let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            let full = format!(
                "{}/{}",
                path.trim_end_matches('/'),
                name.trim_end_matches('/')
            );
            let h = entry.header();
            let meta = (
                h.mode().unwrap_or(0o644),
                h.uid().unwrap_or(0),
                h.gid().unwrap_or(0),
            );
            let content = if entry.header().entry_type().is_dir() {
                None
            } else {
                let mut buf = Vec::new();
                std::io::Read::read_to_end(&mut entry, &mut buf)
                    .map_err(|e| EngineError::Rejected(e.to_string()))?;
                Some(buf)
            };
            self.with(|s| s.files.insert((id.to_string(), full), (content, meta)));
        }
        Ok(())
    }
}
