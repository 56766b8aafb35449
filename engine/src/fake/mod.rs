//! In-memory [`ContainerEngine`](crate::ContainerEngine) for in-process tests of handlers and
//! session logic.
//!
//! Commands are "run" by a scriptable responder; every call is recorded so tests can assert what
//! the control plane asked of the engine. Nothing here claims to test Docker.
//!
//! This file holds the fake's state and what tests turn and read: the responder, scripted
//! faults, clocks and image ids, and the recorded calls. How it answers each engine call is in
//! `emulation`; its session helper (a host build of the real one) in `helper`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::{ContainerSpec, ContainerStatus, EngineError, NetworkSpec};

mod emulation;
mod helper;
mod layers;

pub use helper::host_helper;

/// What a fake (unattached) exec produces: output chunks, then an exit code. Commands and fs
/// ops go through the host helper instead (see `helper`); these execs are the gateway's
/// acknowledgement and the CA install.
#[derive(Clone, Debug, Default)]
pub struct FakeExec {
    pub chunks: Vec<Vec<u8>>,
    pub exit_code: i64,
}

type Responder = dyn Fn(&str) -> FakeExec + Send + Sync;

/// A regular file's content (`None` for a directory) and its (mode, uid, gid).
type FakeFile = (Option<Vec<u8>>, (u32, u64, u64));

#[derive(Default)]
struct State {
    containers: HashMap<String, (ContainerSpec, ContainerStatus)>,
    networks: HashMap<String, NetworkSpec>,
    /// (network, container, ip) attachments beyond the create-time network.
    attachments: Vec<(String, String, Option<std::net::IpAddr>)>,
    execs: HashMap<String, i64>,
    calls: Vec<String>,
    next_id: u64,
    engine_down: bool,
    /// Calls whose description starts with one of these fail (scripted faults).
    failing: Vec<String>,
    /// Calls whose description starts with one of these wait until their [`Hold`] is released.
    holds: Vec<(String, Arc<HoldState>)>,
    /// Per-container (created unix secs, FinishedAt) overrides, for the reaper's tests.
    times: HashMap<String, (Option<i64>, Option<String>)>,
    /// Per-network created unix secs overrides.
    network_created: HashMap<String, i64>,
    missing_images: Vec<String>,
    /// Image reference → the labels `ensure_image` answers for it.
    image_labels: HashMap<String, HashMap<String, String>>,
    /// Cancelled when the container stops or goes: its helpers die with it, as in Docker.
    alive: HashMap<String, tokio_util::sync::CancellationToken>,
    /// Containers whose process supervisor (the helper's `init`) runs on the host, with the
    /// `alive` token it dies with.
    supervised: HashMap<String, tokio_util::sync::CancellationToken>,
    /// Container filesystems as far as the archive calls saw them: (container, absolute path) →
    /// regular-file content (`None` for a directory) and (mode, uid, gid).
    files: HashMap<(String, String), FakeFile>,
    /// Container id → its current name.
    names: HashMap<String, String>,
    /// Container id → the id of the image it was created from.
    container_images: HashMap<String, String>,
    /// Image reference → the id it resolves to (default `sha256:<reference>`).
    image_ids: HashMap<String, String>,
    /// Named volumes (their content is a host directory: see `layers`).
    volumes: HashMap<String, crate::VolumeInfo>,
    /// `overlay` volumes: their lower directories (top first) and upper directory.
    overlays: HashMap<String, (Vec<std::path::PathBuf>, std::path::PathBuf)>,
    /// Committed images by reference (see `layers`).
    images: HashMap<String, crate::ImageInfo>,
    /// Container id → the counters `stats` answers (default: a quiet container).
    stats: HashMap<String, crate::ContainerStats>,
    /// Whether mounting an `overlay` volume fails, as on a kernel without overlayfs.
    overlay_mounts_fail: bool,
    /// Container id → its anonymous volumes, made as named ones (Docker's 64-hex names) for a
    /// state session, whose snapshots copy them by name; removed with it.
    anonymous: HashMap<String, Vec<String>>,
    /// Container id → its spec as asked for, where the fake changed its own copy (its
    /// anonymous volumes named).
    asked: HashMap<String, ContainerSpec>,
    /// What the helper's `writable-paths` finds in every image (none by default).
    writable_paths: Vec<String>,
}

#[derive(Clone)]
pub struct FakeEngine {
    state: Arc<Mutex<State>>,
    responder: Arc<Responder>,
    /// This engine's host directories (its containers' own files, its volumes), apart from
    /// those of the other engines in the same test binary (each counts its ids from 1).
    dirs: Arc<Dirs>,
}

/// Where an engine's host directories live: removed with the engine's last clone.
struct Dirs {
    root: std::path::PathBuf,
    /// Names its containers' process supervisors (abstract sockets) apart, likewise.
    prefix: String,
}

impl Dirs {
    fn new() -> Self {
        static INSTANCES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = INSTANCES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let prefix = format!("daiv-fake-{}-{n}", std::process::id());
        Self {
            root: std::env::temp_dir().join(&prefix),
            prefix,
        }
    }
}

impl Drop for Dirs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

impl Default for FakeEngine {
    fn default() -> Self {
        Self::new(|cmd| FakeExec {
            chunks: vec![format!("ran: {cmd}\n").into_bytes()],
            exit_code: 0,
        })
    }
}

impl FakeEngine {
    /// `responder` receives an exec's last argument and says what it "prints".
    pub fn new(responder: impl Fn(&str) -> FakeExec + Send + Sync + 'static) -> Self {
        Self {
            state: Arc::default(),
            responder: Arc::new(responder),
            dirs: Arc::new(Dirs::new()),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        // A poisoned lock means an earlier test panicked; keep going with its state.
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard)
    }

    pub fn calls(&self) -> Vec<String> {
        self.with(|s| s.calls.clone())
    }

    /// Container `id`'s spec as it was asked for.
    pub fn spec(&self, id: &str) -> Option<ContainerSpec> {
        self.with(|s| {
            let mut spec = s.containers.get(id).map(|(spec, _)| spec.clone())?;
            if let Some(asked) = s.asked.get(id) {
                spec.volumes.clone_from(&asked.volumes);
                spec.named_volumes.clone_from(&asked.named_volumes);
            }
            Some(spec)
        })
    }

    /// Sets what `stats` answers for container `id` while it runs.
    pub fn set_stats(&self, id: &str, stats: crate::ContainerStats) {
        self.with(|s| s.stats.insert(id.to_string(), stats));
    }

    pub fn status(&self, id: &str) -> Option<ContainerStatus> {
        self.with(|s| s.containers.get(id).map(|(_, st)| st.clone()))
    }

    pub fn network_specs(&self) -> Vec<NetworkSpec> {
        self.with(|s| s.networks.values().cloned().collect())
    }

    pub fn networks(&self) -> Vec<String> {
        self.with(|s| s.networks.keys().cloned().collect())
    }

    pub fn attachments(&self) -> Vec<(String, String, Option<std::net::IpAddr>)> {
        self.with(|s| s.attachments.clone())
    }

    /// The names of the volumes that exist.
    pub fn volumes(&self) -> Vec<String> {
        self.with(|s| s.volumes.keys().cloned().collect())
    }

    /// The references of the committed images that exist.
    pub fn images(&self) -> Vec<String> {
        self.with(|s| s.images.keys().cloned().collect())
    }

    pub fn container_ids(&self) -> Vec<String> {
        self.with(|s| s.containers.keys().cloned().collect())
    }

    /// Sets a container's creation time (Unix seconds) and `FinishedAt` (RFC 3339).
    pub fn set_times(&self, id: &str, created: Option<i64>, finished_at: Option<&str>) {
        self.with(|s| {
            s.times
                .insert(id.to_string(), (created, finished_at.map(str::to_string)))
        });
    }

    /// Sets a network's creation time (Unix seconds).
    pub fn set_network_created(&self, name: &str, created: i64) {
        self.with(|s| s.network_created.insert(name.to_string(), created));
    }

    /// Makes every later call whose description starts with `prefix` (for example
    /// `"start "` or `"create_network"`) fail as if the engine had.
    pub fn fail_on(&self, prefix: &str) {
        self.with(|s| s.failing.push(prefix.to_string()));
    }

    /// Makes every mount of an `overlay` volume fail (a container's start, an archive call on
    /// it), as on an engine whose kernel cannot mount one; creating the volume still works, as
    /// the local driver only records its options.
    pub fn fail_overlay_mounts(&self) {
        self.with(|s| s.overlay_mounts_fail = true);
    }

    /// Makes the helper's `writable-paths` find `paths` in every image, as in one where the
    /// sandbox user can write outside its volumes.
    pub fn set_writable_paths(&self, paths: &[&str]) {
        self.with(|s| s.writable_paths = paths.iter().map(|p| p.to_string()).collect());
    }

    /// Fails when container `id` mounts an `overlay` volume and such mounts fail.
    fn mount_volumes(&self, id: &str) -> Result<(), EngineError> {
        self.with(|s| {
            let mounts_overlay = s.overlay_mounts_fail
                && s.containers.get(id).is_some_and(|(spec, _)| {
                    spec.named_volumes
                        .iter()
                        .any(|(name, _)| s.overlays.contains_key(name))
                });
            if mounts_overlay {
                return Err(EngineError::Unavailable(
                    "error while mounting volume: invalid argument".into(),
                ));
            }
            Ok(())
        })
    }

    /// Ends every fault [`FakeEngine::fail_on`] scripted.
    pub fn heal(&self) {
        self.with(|s| s.failing.clear());
    }

    /// The host directory standing in for a container's `/workspace` for the helper
    /// (`serve --root`): `/workspace/x` in the container is `<dir>/x`. The directory of the
    /// named volume mounted there, if any (a session from a snapshot), else the container's own.
    pub fn workspace_dir(&self, id: &str) -> std::path::PathBuf {
        match self.mounted_volume(id, sandbox_protocol::layout::WORKSPACE) {
            Some(volume) => self.volume_dir(&volume),
            None => self.own_dir(id),
        }
    }

    /// The host directory of container `id`'s own files (removed with it).
    fn own_dir(&self, id: &str) -> std::path::PathBuf {
        // The fake's ids are counters padded with zeros: their tail tells them apart.
        self.dirs
            .root
            .join(format!("c-{}", &id[id.len().saturating_sub(12)..]))
    }

    /// Makes every later call whose description starts with `prefix` (for example
    /// `"create "` or `"inspect <id>"`) wait until the returned [`Hold`] is released or dropped,
    /// as a slow engine would: the request making it stays in flight meanwhile.
    pub fn hold(&self, prefix: &str) -> Hold {
        let hold = Hold::default();
        self.with(|s| s.holds.push((prefix.to_string(), hold.0.clone())));
        hold
    }

    pub fn set_down(&self, down: bool) {
        self.with(|s| s.engine_down = down);
    }

    /// A regular file's content as the archive calls left it, if any.
    pub fn file(&self, id: &str, path: &str) -> Option<Vec<u8>> {
        self.with(|s| {
            s.files
                .get(&(id.to_string(), path.to_string()))
                .and_then(|(content, _)| content.clone())
        })
    }

    /// Makes `image` resolve to another id from now on (a re-tagged image).
    pub fn set_image_id(&self, image: &str, id: &str) {
        self.with(|s| s.image_ids.insert(image.to_string(), id.to_string()));
    }

    /// The container's current name.
    pub fn name(&self, id: &str) -> Option<String> {
        self.with(|s| s.names.get(id).cloned())
    }

    /// Marks a container exited, as if its process had died.
    pub fn kill(&self, id: &str) {
        self.with(|s| {
            if let Some(t) = s.alive.remove(id) {
                t.cancel();
            }
            if let Some((_, st)) = s.containers.get_mut(id) {
                *st = ContainerStatus::Exited;
            }
        });
    }

    pub fn set_missing_image(&self, image: &str) {
        self.with(|s| s.missing_images.push(image.to_string()));
    }

    /// The labels the image `reference` carries.
    pub fn set_image_labels(&self, reference: &str, labels: &[(&str, &str)]) {
        let labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.with(|s| s.image_labels.insert(reference.to_string(), labels));
    }

    /// Waits while a [`FakeEngine::hold`] matches `point`, without recording a call: a moment
    /// inside an operation a test can act at (see `serve_helper`).
    pub(super) async fn holdable(&self, point: &str) {
        let held: Vec<Arc<HoldState>> = self.with(|s| {
            s.holds
                .iter()
                .filter(|(p, _)| point.starts_with(p.as_str()))
                .map(|(_, h)| h.clone())
                .collect()
        });
        for hold in held {
            hold.pass().await;
        }
    }

    async fn check_up(&self, call: String) -> Result<(), EngineError> {
        let held: Vec<Arc<HoldState>> = self.with(|s| {
            s.holds
                .iter()
                .filter(|(p, _)| call.starts_with(p.as_str()))
                .map(|(_, h)| h.clone())
                .collect()
        });
        for hold in held {
            hold.pass().await;
        }
        self.with(|s| {
            let scripted = s.failing.iter().any(|p| call.starts_with(p.as_str()));
            s.calls.push(call);
            if s.engine_down || scripted {
                Err(EngineError::Unavailable("fake engine is down".into()))
            } else {
                Ok(())
            }
        })
    }
}

/// Calls held by [`FakeEngine::hold`]: they wait until [`Hold::release`], or until the hold is
/// dropped (so a failing test never leaves calls hanging).
#[derive(Debug)]
pub struct Hold(Arc<HoldState>);

impl Drop for Hold {
    fn drop(&mut self) {
        self.release();
    }
}

#[derive(Debug)]
struct HoldState {
    /// Closed on release: every waiter goes on.
    gate: tokio::sync::Semaphore,
    waiting: std::sync::atomic::AtomicUsize,
}

impl Default for Hold {
    fn default() -> Self {
        Self(Arc::new(HoldState {
            gate: tokio::sync::Semaphore::new(0),
            waiting: std::sync::atomic::AtomicUsize::new(0),
        }))
    }
}

impl Hold {
    /// Lets every held call, and every later one, through.
    pub fn release(&self) {
        self.0.gate.close();
    }

    /// Calls waiting at the hold now.
    pub fn waiting(&self) -> usize {
        self.0.waiting.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Waits until `n` calls wait at the hold (tests: until that many requests are in flight).
    pub async fn until_waiting(&self, n: usize) {
        while self.waiting() < n {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }
}

impl HoldState {
    async fn pass(&self) {
        /// Counts a waiter out however its wait ends (released, or its request dropped).
        struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        self.waiting
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let _counted = Waiting(&self.waiting);
        // Never granted: only the close on release ends the wait.
        let _ = self.gate.acquire().await;
    }
}
