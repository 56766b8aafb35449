//! Layer workers: one long-lived copier per image and engine, so that a snapshot's layer copy is
//! one exec in a running container, not a container made, started and removed per snapshot (a
//! few hundred milliseconds of the request, most of a snapshot that copies little).
//!
//! A worker binds the engine's volume directory (`<DockerRootDir>/volumes`, found from a plain
//! volume's mountpoint) at [`VOLUMES_AT`], without the mounts under it: it reads the plain
//! volumes a copy needs (a session's upper volumes, or its own volumes for a first snapshot) and
//! writes the new layer's data volume by path, each made after the worker started. An overlay
//! (the merged view a base layer of a deep stack copies) is a mount, which it does not see:
//! those copies keep a copier of their own ([`Snapshots::create_copier`]).
//!
//! It is the copier's container otherwise: the session's image (so the image's `writable-paths`
//! walk runs there too), root with the few capabilities a faithful copy needs, no network, runc.
//! It sees every volume of the engine, where a copier saw only its session's: what it runs is
//! the helper's `copy-tree`, which walks the sandbox's tree by descriptors and never follows a
//! link of it (see `sandbox_helper::copy_tree`), on paths the service builds from volume names.
//!
//! A worker pins its image: one unused for [`IDLE`] is removed (the stack's task, every
//! [`IDLE`]/2), one older than [`MAX_AGE`] is replaced at its next use, and the reaper's sweep
//! removes another replica's past twice that (a replica that died). A worker that stopped is
//! replaced at the next snapshot.

use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use super::layers::{Busy, Copier, Layering};

use super::*;

/// Role of a layer worker.
pub const ROLE_LAYER_WORKER: &str = "layer-worker";
/// Where a worker sees the engine's volume directory.
const VOLUMES_AT: &str = "/vols";
/// A worker unused this long is removed: it pins its image.
pub const IDLE: Duration = Duration::from_secs(60);
/// A worker this old is replaced at its next use; another replica's twice as old is swept.
pub const MAX_AGE: Duration = Duration::from_secs(30 * 60);
/// How long a worker replaced for its age is kept for the copies it may still run.
const RETIRE_AFTER: Duration = Duration::from_secs(5 * 60);
/// A worker's memory: copies side by side, each its buffers and the hard links it has seen.
const WORKER_MEMORY: i64 = 2 * 1024 * 1024 * 1024;

/// This replica's worker of one image.
#[derive(Debug)]
pub(super) struct Worker {
    id: String,
    /// The engine's volume directory it binds.
    root: String,
    made: Instant,
    used: Instant,
    /// Copies handed out and not yet done ([`Busy`]): an idle retirement waits for none.
    busy: Arc<AtomicUsize>,
}

impl Worker {
    fn idle(&self) -> bool {
        self.busy.load(Ordering::SeqCst) == 0
    }
}

/// The engine's volume directory, from a plain volume's mountpoint (`<root>/<name>/_data`, as
/// Docker's local driver has it); `None` for any other layout.
fn volume_root(v: &VolumeInfo) -> Option<String> {
    let suffix = format!("/{}/_data", v.name);
    let root = v.mountpoint.strip_suffix(&suffix)?;
    (root.starts_with('/') && root.len() > 1).then(|| root.to_string())
}

/// Where a worker sees plain volume `name`.
fn in_worker(name: &str) -> String {
    format!("{VOLUMES_AT}/{name}/_data")
}

impl Snapshots {
    /// A worker of `image` for a copy of `layering` into `data`, made or reused; `None` where a
    /// worker cannot do it (an overlay to copy, a volume layout it does not know), and the
    /// caller makes a copier. A worker that cannot be made is not an error: a copier is.
    pub(super) async fn worker_for(
        &self,
        image: &str,
        data: &VolumeInfo,
        layering: &Layering,
    ) -> Option<Copier> {
        if !layering.plain {
            return None;
        }
        let root = volume_root(data)?;
        let to = in_worker(&data.name);
        let pairs = layering
            .from
            .iter()
            .map(|(key, v)| {
                let dest = if layering.state {
                    format!("{to}/{key}")
                } else {
                    to.clone()
                };
                (in_worker(v), dest)
            })
            .collect();
        let (id, busy) = match self.worker(image, &root).await {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "snapshot: no layer worker; a copier copies");
                return None;
            }
        };
        Some(Copier::Worker {
            id,
            pairs,
            _busy: busy,
        })
    }

    /// This replica's running worker of `image`, or a new one, counted busy.
    async fn worker(&self, image: &str, root: &str) -> Result<(String, Busy), EngineError> {
        let mut workers = self.workers.lock().await;
        if let Some(w) = workers.get_mut(image) {
            let fresh = w.root == root && w.made.elapsed() < MAX_AGE;
            // One inspect (a few milliseconds) says it still runs: removed or stopped behind
            // the service's back, it is replaced rather than failing a frozen copy.
            let running = fresh
                && matches!(self.engine.inspect(&w.id).await, Ok(i) if i.is_running() && !i.is_paused());
            if running {
                w.used = Instant::now();
                return Ok((w.id.clone(), Busy::new(&w.busy)));
            }
            if let Some(old) = workers.remove(image) {
                // Past its age it may still run another snapshot's copy: it goes later.
                let after = if fresh { Duration::ZERO } else { RETIRE_AFTER };
                self.retire(old.id, after);
            }
        }
        let id = self.create_worker(image, root).await?;
        let now = Instant::now();
        let busy = Arc::new(AtomicUsize::new(0));
        let guard = Busy::new(&busy);
        workers.insert(
            image.to_string(),
            Worker {
                id: id.clone(),
                root: root.to_string(),
                made: now,
                used: now,
                busy,
            },
        );
        Ok((id, guard))
    }

    async fn create_worker(&self, image: &str, root: &str) -> Result<String, EngineError> {
        let mut spec = self.copier_spec(image, Vec::new());
        spec.labels = HashMap::from([
            (MANAGED_LABEL.to_string(), "true".to_string()),
            (ROLE_LABEL.to_string(), ROLE_LAYER_WORKER.to_string()),
            (DEPLOYMENT_LABEL.to_string(), self.config.deployment.clone()),
        ]);
        spec.host_dirs = vec![(root.to_string(), VOLUMES_AT.to_string())];
        spec.memory_bytes = Some(WORKER_MEMORY);
        spec.pids_limit = 256;
        let id = self.engine.create(&spec).await?;
        if let Err(e) = self.engine.start(&id).await {
            let _ = self.engine.remove(&id).await;
            return Err(e);
        }
        tracing::info!(worker = %id, image, "snapshot: layer worker started");
        Ok(id)
    }

    /// Removes a worker off the caller's path, `after` a while (a copy still running in it
    /// would fail, and its snapshot with it).
    fn retire(&self, id: String, after: Duration) {
        let engine = self.engine.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            if let Err(e) = engine.remove(&id).await
                && !matches!(e, EngineError::NotFound)
            {
                tracing::warn!(worker = %id, error = %e, "snapshot: a layer worker not removed; the sweep retries");
            }
        });
    }

    /// Removes this replica's workers unused for [`IDLE`] and copying nothing (all of them
    /// with `all`: shutdown).
    pub async fn retire_idle_workers(&self, all: bool) {
        self.retire_workers(|_, w| all || (w.idle() && w.used.elapsed() >= IDLE))
            .await;
    }

    /// Removes this replica's worker of image `reference` if it copies nothing: a snapshot
    /// being released has its image pinned by the worker that copied its sessions' changes.
    /// Whether one went.
    pub(super) async fn retire_worker_of(&self, reference: &str) -> bool {
        let Ok(image) = self.engine.inspect_image(reference).await else {
            return false;
        };
        self.retire_workers(|of, w| w.idle() && of == image.id)
            .await
            > 0
    }

    /// Removes this replica's workers `which` picks; how many it picked.
    async fn retire_workers(&self, which: impl Fn(&str, &Worker) -> bool) -> usize {
        let idle: Vec<Worker> = {
            let mut workers = self.workers.lock().await;
            let images: Vec<String> = workers
                .iter()
                .filter(|(i, w)| which(i, w))
                .map(|(i, _)| i.clone())
                .collect();
            images.iter().filter_map(|i| workers.remove(i)).collect()
        };
        let removals = idle.iter().map(|w| self.engine.remove(&w.id));
        for (w, r) in idle.iter().zip(futures::future::join_all(removals).await) {
            match r {
                Ok(()) | Err(EngineError::NotFound) => {
                    tracing::debug!(worker = %w.id, "snapshot: idle layer worker removed")
                }
                Err(e) => {
                    tracing::warn!(worker = %w.id, error = %e, "snapshot: a layer worker not removed; the sweep retries")
                }
            }
        }
        idle.len()
    }

    /// Every [`IDLE`]/2, the idle workers go (the stack's task, aborted at shutdown).
    pub async fn run_worker_expiry(self: Arc<Self>) {
        let mut tick = tokio::time::interval(IDLE / 2);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.retire_idle_workers(false).await;
        }
    }

    /// The sweep's part: workers of this deployment that are not this replica's and older than
    /// twice [`MAX_AGE`] (their replica died), or not running past `guard` (a create in flight
    /// is not yet running). Returns how many went.
    pub(super) async fn sweep_workers(&self, now: i64, guard: i64) -> Result<usize, EngineError> {
        let found = self.engine.list(&self.mine(ROLE_LAYER_WORKER)).await?;
        let ours: HashSet<String> = self
            .workers
            .lock()
            .await
            .values()
            .map(|w| w.id.clone())
            .collect();
        let limit = i64::try_from((2 * MAX_AGE).as_secs()).unwrap_or(i64::MAX);
        let mut removed = 0;
        for c in found.iter().filter(|c| !ours.contains(&c.id)) {
            let past = |age: i64| c.created.is_some_and(|t| t.saturating_add(age) <= now);
            if (past(limit) || (!c.is_running() && past(guard)))
                && self.engine.remove(&c.id).await.is_ok()
            {
                removed += 1;
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker copying for a snapshot is not taken for its image's release while the copy
    /// runs (its [`Busy`] lives); once done, it is.
    #[tokio::test]
    async fn a_worker_is_not_retired_while_it_copies() -> Result<(), Box<dyn std::error::Error>> {
        let engine = Arc::new(crate::engine::fake::FakeEngine::new(|_| {
            crate::engine::fake::FakeExec::default()
        }));
        let s = Snapshots::new(engine, crate::config::for_tests("k", &[]), None);
        let image = s.engine.inspect_image("img").await?.id;
        let data = s
            .engine
            .create_volume(&VolumeSpec {
                name: "daiv-snapshot-x-data".into(),
                labels: HashMap::new(),
                driver_opts: HashMap::new(),
            })
            .await?;
        let layering = Layering {
            from: vec![("workspace", "src".into())],
            lowers: Vec::new(),
            state: false,
            plain: true,
        };
        let copier = s
            .worker_for(&image, &data, &layering)
            .await
            .ok_or("no worker")?;
        let id = copier.id().to_string();
        assert!(!s.retire_worker_of("img").await, "retired while it copies");
        s.retire_idle_workers(false).await;
        assert!(s.engine.inspect(&id).await.is_ok());
        drop(copier);
        assert!(s.retire_worker_of("img").await);
        assert!(matches!(
            s.engine.inspect(&id).await,
            Err(EngineError::NotFound)
        ));
        Ok(())
    }

    #[test]
    fn the_volume_directory_is_found_from_a_plain_volume_only_in_the_local_layout() {
        let v = |name: &str, mountpoint: &str| VolumeInfo {
            name: name.into(),
            mountpoint: mountpoint.into(),
            labels: HashMap::new(),
            created: None,
        };
        assert_eq!(
            volume_root(&v("d", "/var/lib/docker/volumes/d/_data")).as_deref(),
            Some("/var/lib/docker/volumes")
        );
        assert_eq!(volume_root(&v("d", "/data/d")), None);
        assert_eq!(
            volume_root(&v("d", "/var/lib/docker/volumes/e/_data")),
            None
        );
        assert_eq!(volume_root(&v("d", "/d/_data")), None);
    }
}
