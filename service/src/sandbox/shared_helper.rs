//! The helper binary every sandbox on an engine shares: one read-only volume per helper build and
//! deployment, mounted at [`layout::HELPER_DIR`], with [`layout::HELPER`] a link into it. A copy
//! in each container's layer put 3.7 MB on the engine's disk for every sandbox, fork and pool
//! member, for as long as it lived.
//!
//! The volume is written once, through a container that is created and never started (the engine
//! extracts an archive into the volumes a container mounts), under a file name of the writer's
//! own: two replicas writing at once never touch each other's file. A marker volume, made last,
//! names the file that counts in its label; a replica that finds the marker uses that file, and
//! one that loses the race to make it uses the winner's. So a sandbox never runs a helper being
//! written.
//!
//! A sandbox mounts the volume by name, and the engine makes an empty volume for a name that is
//! gone (removed by hand, or by a replica's shutdown while this one ran): every create looks for
//! the marker and the data volume again (two inspects), and writes them anew if either is gone.

use std::collections::HashMap;
use std::sync::Arc;

use crate::archive::{Archive, ROOT, entry_name};
use crate::engine::{
    ContainerEngine, ContainerSpec, DEPLOYMENT_LABEL, EngineError, MANAGED_LABEL, NetworkAttach,
    ROLE_LABEL, VolumeInfo, VolumeSpec,
};
use crate::layout;
use crate::shared_file::SharedFile;

/// The role of the volume holding the helper.
pub const ROLE_HELPER: &str = "helper";
/// The role of its marker: present once the helper is whole.
pub const ROLE_HELPER_READY: &str = "helper-ready";
/// The role of the container that writes it (never started).
pub const ROLE_HELPER_WRITER: &str = "helper-writer";
/// The helper build (its fingerprint) a volume, marker or writer is for.
pub const BUILD_LABEL: &str = "daiv.sandbox.helper.build";
/// On the marker: the file in the volume that is the helper.
pub const FILE_LABEL: &str = "daiv.sandbox.helper.file";

/// Where the writer mounts the volume.
const WRITER_MOUNT: &str = "/daiv-helper";

/// The engine's shared copy of this build's helper (see the module docs).
pub struct SharedHelper {
    engine: Arc<dyn ContainerEngine>,
    helper: SharedFile,
    deployment: String,
    /// This build's fingerprint, as labels carry it.
    build: String,
    /// The data volume's name; the marker's is it with `-ready`.
    volume: String,
    /// The file this replica writes, should it be the one to write.
    own_file: String,
    /// Serializes this replica's writes: concurrent first creates write once.
    writing: tokio::sync::Mutex<()>,
}

/// What a sandbox mounts: the volume, and the file in it that is the helper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mounted {
    pub volume: String,
    pub file: String,
}

impl Mounted {
    /// The sandbox's mounts: the volume, read-only, at [`layout::HELPER_DIR`].
    pub fn mount(&self) -> (String, String) {
        (self.volume.clone(), layout::HELPER_DIR.to_string())
    }

    /// Where [`layout::HELPER`] points in a sandbox.
    pub fn target(&self) -> String {
        format!("{}/{}", layout::HELPER_DIR, self.file)
    }
}

impl SharedHelper {
    pub fn new(engine: Arc<dyn ContainerEngine>, helper: SharedFile, deployment: &str) -> Self {
        let build = format!("{:016x}", helper.fingerprint());
        let volume = format!(
            "daiv-sandbox-helper-{build}-{:016x}",
            crate::ids::fnv(deployment.as_bytes())
        );
        Self {
            engine,
            helper,
            deployment: deployment.to_string(),
            own_file: format!("daiv-sandbox-helper-{}", crate::ids::random_token()),
            build,
            volume,
            writing: tokio::sync::Mutex::new(()),
        }
    }

    fn marker(&self) -> String {
        format!("{}-ready", self.volume)
    }

    fn labels(&self, role: &str) -> HashMap<String, String> {
        HashMap::from([
            (MANAGED_LABEL.to_string(), "true".to_string()),
            (ROLE_LABEL.to_string(), role.to_string()),
            (DEPLOYMENT_LABEL.to_string(), self.deployment.clone()),
            (BUILD_LABEL.to_string(), self.build.clone()),
        ])
    }

    /// The helper as a sandbox of `image` mounts it, written first if it is not whole on the
    /// engine. `image` must be on the engine: the writer is a container of it, never started.
    pub async fn ensure(&self, image: &str) -> Result<Mounted, EngineError> {
        if let Some(m) = self.found().await? {
            return Ok(m);
        }
        let _one = self.writing.lock().await;
        if let Some(m) = self.found().await? {
            return Ok(m);
        }
        self.write(image).await?;
        let marker = self
            .engine
            .create_volume(&VolumeSpec {
                name: self.marker(),
                labels: {
                    let mut l = self.labels(ROLE_HELPER_READY);
                    l.insert(FILE_LABEL.to_string(), self.own_file.clone());
                    l
                },
                driver_opts: HashMap::new(),
            })
            .await?;
        // Another replica's marker when it made one first: its file is the helper.
        match marker.labels.get(FILE_LABEL) {
            Some(file) if valid_file(file) => Ok(Mounted {
                volume: self.volume.clone(),
                file: file.clone(),
            }),
            _ => Err(EngineError::Unavailable(format!(
                "helper volume marker {} names no helper",
                self.marker()
            ))),
        }
    }

    /// Whether volume `v` is this build's helper volume as this service made it: the engine
    /// makes an empty, unlabelled one for a sandbox that names a volume that is gone.
    fn ours(&self, v: &VolumeInfo) -> bool {
        let is = |k: &str, want: &str| v.labels.get(k).map(String::as_str) == Some(want);
        is(ROLE_LABEL, ROLE_HELPER)
            && is(BUILD_LABEL, &self.build)
            && is(DEPLOYMENT_LABEL, &self.deployment)
    }

    /// Whether the volume a sandbox was just created with is still this service's: once a
    /// container names it, the engine refuses to remove it, so this holds for the sandbox's life.
    pub async fn still_ours(&self) -> bool {
        match self.engine.inspect_volume(&self.volume).await {
            Ok(v) => self.ours(&v),
            Err(_) => false,
        }
    }

    /// The helper, when its marker and its volume are both there; `Err` when a volume of its
    /// name that is not the service's is in use (a sandbox's, made while the real one was gone):
    /// sandboxes then get their own copies until it goes.
    async fn found(&self) -> Result<Option<Mounted>, EngineError> {
        let marker = match self.engine.inspect_volume(&self.marker()).await {
            Ok(v) => v,
            Err(EngineError::NotFound) => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some(file) = marker.labels.get(FILE_LABEL).filter(|f| valid_file(f)) else {
            let _ = self.engine.remove_volume(&self.marker()).await;
            return Ok(None);
        };
        match self.engine.inspect_volume(&self.volume).await {
            Ok(v) if self.ours(&v) => Ok(Some(Mounted {
                volume: self.volume.clone(),
                file: file.clone(),
            })),
            Ok(_) => {
                self.engine.remove_volume(&self.volume).await.map_err(|_| {
                    EngineError::Unavailable(format!(
                        "volume {} is not the service's helper and is in use",
                        self.volume
                    ))
                })?;
                let _ = self.engine.remove_volume(&self.marker()).await;
                Ok(None)
            }
            // The volume went without its marker: both are made again.
            Err(EngineError::NotFound) => {
                let _ = self.engine.remove_volume(&self.marker()).await;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Writes this replica's file into the volume (made if missing) through a container that
    /// mounts it and is removed again, started never.
    async fn write(&self, image: &str) -> Result<(), EngineError> {
        let volume = self
            .engine
            .create_volume(&VolumeSpec {
                name: self.volume.clone(),
                labels: self.labels(ROLE_HELPER),
                driver_opts: HashMap::new(),
            })
            .await?;
        if !self.ours(&volume) {
            return Err(EngineError::Unavailable(format!(
                "volume {} is not the service's helper",
                self.volume
            )));
        }
        let mut tar = Archive::new();
        let name = format!("{}/{}", entry_name(WRITER_MOUNT), self.own_file);
        tar.shared_file(&name, 0o755, ROOT, self.helper.clone());
        let parts = tar
            .finish_parts()
            .map_err(|e| EngineError::Unavailable(format!("helper archive: {e}")))?;
        let spec = ContainerSpec {
            name: None,
            image: image.to_string(),
            entrypoint: Some(Vec::new()),
            cmd: Some(vec![layout::HELPER.to_string()]),
            env: Vec::new(),
            labels: self.labels(ROLE_HELPER_WRITER),
            user: Some("0:0".to_string()),
            cap_add: Vec::new(),
            sysctls: Vec::new(),
            init: false,
            runtime: "runc".to_string(),
            memory_bytes: None,
            nano_cpus: None,
            pids_limit: 1,
            network: NetworkAttach::None,
            volumes: Vec::new(),
            named_volumes: vec![(self.volume.clone(), WRITER_MOUNT.to_string())],
            read_only_volumes: Vec::new(),
            host_dirs: Vec::new(),
            log_options: Vec::new(),
            auto_remove: false,
            skeleton: parts,
        };
        let id = self.engine.create(&spec).await?;
        // Read back where the writer put it: the image decides what the writer's paths are.
        let file = format!("{WRITER_MOUNT}/{}", self.own_file);
        let written = self.written_len(&id, &file).await;
        let removed = self.engine.remove(&id).await;
        if let Err(e) = removed {
            tracing::warn!(error = %e, "helper writer not removed; the sweep will");
        }
        match written {
            Ok(Some(len)) if len == self.helper.len() => Ok(()),
            Ok(_) => Err(EngineError::Unavailable(
                "the helper was not written whole into its volume".to_string(),
            )),
            Err(e) => Err(e),
        }
    }

    /// The size of regular file `path` in container `id` (its archive's first header), or
    /// `None` when it is anything else.
    async fn written_len(&self, id: &str, path: &str) -> Result<Option<u64>, EngineError> {
        use futures::StreamExt;
        let mut stream = self.engine.get_archive(id, path).await?;
        let mut head = Vec::with_capacity(512);
        while head.len() < 512 {
            match stream.next().await {
                Some(chunk) => head.extend_from_slice(&chunk?),
                None => return Ok(None),
            }
        }
        let mut header = tar::Header::new_old();
        header.as_mut_bytes().copy_from_slice(&head[..512]);
        Ok((header.entry_type() == tar::EntryType::Regular)
            .then(|| header.size().ok())
            .flatten())
    }

    /// The reaper's part: writers a crash left (older than `guard` seconds by `old`), and the
    /// volumes of other builds of the helper in this deployment that no container mounts (the
    /// engine refuses to remove one in use).
    pub async fn sweep(&self, old: impl Fn(Option<i64>) -> bool) -> Result<(), EngineError> {
        let mine = |role: &'static str| {
            [
                (ROLE_LABEL, role),
                (DEPLOYMENT_LABEL, self.deployment.as_str()),
            ]
        };
        for c in self.engine.list(&mine(ROLE_HELPER_WRITER)).await? {
            if old(c.created) {
                let _ = self.engine.remove(&c.id).await;
            }
        }
        let other = |v: &crate::engine::VolumeInfo| {
            v.labels.get(BUILD_LABEL) != Some(&self.build) && old(v.created)
        };
        let mut left = std::collections::HashSet::new();
        for v in self.engine.list_volumes(&mine(ROLE_HELPER)).await? {
            if !other(&v) || self.engine.remove_volume(&v.name).await.is_err() {
                left.insert(v.name);
            }
        }
        // A marker goes once its volume has: before, a replica of its build may use it.
        for m in self.engine.list_volumes(&mine(ROLE_HELPER_READY)).await? {
            let volume = m.name.strip_suffix("-ready").unwrap_or(&m.name);
            if other(&m) && !left.contains(volume) {
                let _ = self.engine.remove_volume(&m.name).await;
            }
        }
        Ok(())
    }

    /// At a clean stop: this build's volume and marker, unless a sandbox still mounts it (the
    /// engine refuses; sandboxes outlive the service).
    pub async fn remove_if_unused(&self) {
        if self.engine.remove_volume(&self.volume).await.is_ok() {
            let _ = self.engine.remove_volume(&self.marker()).await;
        }
    }
}

/// A file name a marker may give: one path component of this service's making.
fn valid_file(name: &str) -> bool {
    name.strip_prefix("daiv-sandbox-helper-")
        .is_some_and(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::fake::{FakeEngine, FakeExec};

    fn creates(engine: &FakeEngine) -> usize {
        engine
            .calls()
            .iter()
            .filter(|c| c.starts_with("create img"))
            .count()
    }

    /// The helper is written once per engine, whoever asks (replicas included), and mounted by
    /// the name of the file the marker gives; written again when its volume went.
    #[tokio::test]
    async fn the_helper_is_written_once_and_again_only_when_its_volume_went()
    -> Result<(), Box<dyn std::error::Error>> {
        let engine = Arc::new(FakeEngine::new(|_| FakeExec::default()));
        let bin = SharedFile::from_bytes(b"helper build 1")?;
        let a = SharedHelper::new(engine.clone(), bin.clone(), "dep");
        let first = a.ensure("img").await?;
        assert_eq!(first.file, a.own_file);
        assert_eq!(first.mount(), (a.volume.clone(), layout::HELPER_DIR.into()));
        assert_eq!(
            first.target(),
            format!("{}/{}", layout::HELPER_DIR, a.own_file)
        );
        assert_eq!(a.ensure("img").await?, first);
        // Another replica of the build uses the file the first wrote.
        let b = SharedHelper::new(engine.clone(), bin.clone(), "dep");
        assert_eq!(b.ensure("img").await?, first);
        assert_eq!(creates(&engine), 1, "{:?}", engine.calls());
        // The writer went; the volume and its marker stay, with what the sweep reads.
        assert!(
            engine
                .list(&[(ROLE_LABEL, ROLE_HELPER_WRITER)])
                .await?
                .is_empty()
        );
        let marker = engine.inspect_volume(&a.marker()).await?;
        assert_eq!(marker.labels.get(FILE_LABEL), Some(&first.file));
        assert_eq!(
            marker.labels.get(DEPLOYMENT_LABEL).map(String::as_str),
            Some("dep")
        );
        // Another deployment or build has a volume of its own.
        let other = SharedHelper::new(engine.clone(), bin.clone(), "other");
        assert_ne!(other.volume, a.volume);
        let rebuilt = SharedHelper::new(engine.clone(), SharedFile::from_bytes(b"build 2")?, "dep");
        assert_ne!(rebuilt.volume, a.volume);
        // Removed by hand (the engine would make an empty one for a sandbox that names it):
        // written again, by whoever asks next.
        engine.remove_volume(&a.volume).await?;
        let again = b.ensure("img").await?;
        assert_eq!(again.file, b.own_file);
        assert_eq!(creates(&engine), 2);
        Ok(())
    }

    /// A volume of the helper's name that the service did not make (the engine makes an empty
    /// one for a sandbox that names a volume that went) is never used: written anew when
    /// nothing mounts it, and while something does, sandboxes get their own copies.
    #[tokio::test]
    async fn a_volume_of_its_name_that_is_not_its_own_is_never_used()
    -> Result<(), Box<dyn std::error::Error>> {
        let engine = Arc::new(FakeEngine::new(|_| FakeExec::default()));
        let h = SharedHelper::new(engine.clone(), SharedFile::from_bytes(b"helper")?, "dep");
        h.ensure("img").await?;
        engine.remove_volume(&h.volume).await?;
        let empty = VolumeSpec {
            name: h.volume.clone(),
            labels: HashMap::new(),
            driver_opts: HashMap::new(),
        };
        engine.create_volume(&empty).await?;
        let dead = engine
            .create(&ContainerSpec {
                read_only_volumes: vec![(h.volume.clone(), layout::HELPER_DIR.into())],
                ..ContainerSpec::for_tests("img")
            })
            .await?;
        assert!(!h.still_ours().await);
        assert!(
            h.ensure("img").await.is_err(),
            "an empty volume in use was used"
        );
        engine.remove(&dead).await?;
        let m = h.ensure("img").await?;
        assert!(h.still_ours().await);
        assert_eq!(m.file, h.own_file);
        Ok(())
    }

    /// A clean stop leaves a volume a sandbox mounts; the sweep takes other builds' unused
    /// volumes with their markers, and writers a crash left.
    #[tokio::test]
    async fn what_goes_at_a_stop_and_a_sweep() -> Result<(), Box<dyn std::error::Error>> {
        let engine = Arc::new(FakeEngine::new(|_| FakeExec::default()));
        let old_build = SharedHelper::new(engine.clone(), SharedFile::from_bytes(b"old")?, "dep");
        let current = SharedHelper::new(engine.clone(), SharedFile::from_bytes(b"new")?, "dep");
        let mounted = current.ensure("img").await?;
        old_build.ensure("img").await?;
        let sandbox = engine
            .create(&ContainerSpec {
                read_only_volumes: vec![mounted.mount()],
                ..ContainerSpec::for_tests("img")
            })
            .await?;
        current.remove_if_unused().await;
        assert!(engine.inspect_volume(&current.volume).await.is_ok());
        assert!(engine.inspect_volume(&current.marker()).await.is_ok());
        // A writer a crash left, and the other build's volume: the sweep's.
        let writer = engine
            .create(&ContainerSpec {
                labels: current.labels(ROLE_HELPER_WRITER),
                ..ContainerSpec::for_tests("img")
            })
            .await?;
        current.sweep(|_| true).await?;
        assert!(engine.inspect(&writer).await.is_err());
        for gone in [old_build.volume.clone(), old_build.marker()] {
            assert!(engine.inspect_volume(&gone).await.is_err(), "{gone}");
        }
        assert!(engine.inspect_volume(&current.volume).await.is_ok());
        // Not while young: a replica of that build may be writing it.
        old_build.ensure("img").await?;
        current.sweep(|_| false).await?;
        assert!(engine.inspect_volume(&old_build.volume).await.is_ok());
        engine.remove(&sandbox).await?;
        current.remove_if_unused().await;
        for gone in [current.volume.clone(), current.marker()] {
            assert!(engine.inspect_volume(&gone).await.is_err(), "{gone}");
        }
        Ok(())
    }
}
