//! Snapshots: a session's whole filesystem at one instant, kept as Docker objects, and the
//! copy-on-write workspaces of sessions made from one.
//!
//! A snapshot is three objects, all labelled with the deployment (so every replica sees them and
//! a restart loses nothing):
//! - its **image** `daiv-sandbox-snapshot:<id>`: `docker commit` of the session's container (its
//!   home directory, the seed marker, whatever it changed outside the workspace);
//! - its **data volume** `daiv-snapshot-<id>-data`: a copy of the session's `/workspace` volume;
//! - its **record**, the empty volume `daiv-snapshot-<id>`, whose labels say everything the API
//!   answers (name, source, sizes, expiry). It is made last, so a snapshot exists exactly when
//!   its record does: a crash half-way leaves payload without a record, which the reaper's
//!   [`Snapshots::sweep`] collects.
//!
//! Taking one freezes the session (the cgroup freezer, `docker pause`) only while the commit and
//! the workspace copy run side by side, then thaws it. Running processes are not kept (they are
//! in memory). Neither the gateway nor its policy is ever part of one: the sandbox never holds
//! them, and the image's config is written here, not copied from the container (see
//! [`CommitSpec`]).
//!
//! A session from a snapshot starts from its image and gets a workspace that is an overlay
//! volume (the local driver's `type=overlay`): the data volume as the lower layer, two empty
//! volumes of its own as upper and work directories. Nothing is copied, whatever the snapshot's
//! size; the session's writes land in its upper volume only. Those three volumes carry the
//! session's [`WORKSPACE_LABEL`] token and go with it ([`Snapshots::remove_workspace`]).
//!
//! Deleting a snapshot removes its record at once; its image and data volume follow as soon as
//! no session uses them (the reaper retries): sessions made from it keep working. Forks use a
//! snapshot without a record, which is therefore collected once the forks are gone.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use futures::StreamExt;

use crate::config::Config;
use crate::engine::{
    CommitSpec, ContainerEngine, ContainerInfo, ContainerSpec, DEPLOYMENT_LABEL, EngineError,
    IMAGE_LABEL, MANAGED_LABEL, NetworkAttach, ROLE_LABEL, ROLE_SANDBOX, ROLE_SNAPSHOT,
    ROLE_SNAPSHOT_DATA, ROLE_WORKSPACE, SNAPSHOT_LABEL, VolumeInfo, VolumeSpec, WORKSPACE_LABEL,
};
use crate::layout;
use crate::time::unix_now;

/// The repository every snapshot image is tagged in; the tag is the snapshot id.
pub const IMAGE_REPOSITORY: &str = "daiv-sandbox-snapshot";
/// Role of the short-lived container whose volume mount receives a workspace copy.
pub const ROLE_SNAPSHOT_HOLDER: &str = "snapshot-holder";

const NAME_LABEL: &str = "daiv.sandbox.snapshot.name";
const SOURCE_LABEL: &str = "daiv.sandbox.snapshot.source";
const CREATED_LABEL: &str = "daiv.sandbox.snapshot.created";
const EXPIRES_LABEL: &str = "daiv.sandbox.snapshot.expires";
const SIZE_LABEL: &str = "daiv.sandbox.snapshot.size";
/// Names of the source's environment given an empty value in the image (see [`CommitSpec`]).
const BLANKED_LABEL: &str = "daiv.sandbox.snapshot.blanked-env";

/// Longest snapshot name.
pub const MAX_NAME: usize = 128;
/// Longest `ttl_seconds` (ten years).
pub const MAX_TTL_SECS: u64 = 10 * 365 * 24 * 3600;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("Snapshot not found")]
    NotFound,
    #[error("name must be 1 to {MAX_NAME} printable characters")]
    InvalidName,
    #[error("ttl_seconds must be between 1 and {MAX_TTL_SECS}")]
    InvalidTtl,
    /// The engine cannot mount the snapshot's volume as an overlay lower layer.
    #[error("the snapshot's data volume has a mount point the overlay cannot use")]
    UnusableMountpoint,
    /// Over the per-snapshot cap, measured before the freeze or counted during the copy.
    #[error(
        "the snapshot would hold more than {cap} bytes (DAIV_SANDBOX_SNAPSHOT_SIZE_MAX_BYTES; \
         files count at their apparent size, sparse ones included): {found} bytes {where_}; \
         remove large or sparse files from the session and retry"
    )]
    TooLarge {
        cap: u64,
        found: u64,
        where_: &'static str,
    },
    /// The deployment's snapshots (forks' included) leave no room for this one.
    #[error(
        "no room for the snapshot: this deployment's snapshots hold {held} of {cap} bytes \
         (DAIV_SANDBOX_SNAPSHOT_MAX_BYTES) and it needs at least {need}; delete snapshots or \
         close forks, then retry"
    )]
    NoRoom { held: u64, need: u64, cap: u64 },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// What a snapshot is, as its record says.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub id: String,
    pub name: Option<String>,
    /// The session it was taken from.
    pub source: String,
    /// The base image the source session was asked for.
    pub base_image: String,
    /// Unix seconds.
    pub created: i64,
    /// Unix seconds; `None`: kept until deleted or evicted.
    pub expires: Option<i64>,
    /// Bytes held: the image's own layer and the workspace copy.
    pub size: u64,
}

impl Snapshot {
    /// The image sessions from it start from.
    pub fn image(&self) -> String {
        image_ref(&self.id)
    }
}

pub use crate::ids::is_snapshot_id;

/// A fresh snapshot id on the engine whose ids carry `prefix`.
fn new_id(prefix: Option<&str>) -> String {
    let raw = format!(
        "{:016x}{:016x}",
        rand::random::<u64>(),
        rand::random::<u64>()
    );
    crate::ids::with_engine(prefix, &raw)
}

pub fn image_ref(id: &str) -> String {
    format!("{IMAGE_REPOSITORY}:{id}")
}

fn record_volume(id: &str) -> String {
    format!("daiv-snapshot-{id}")
}

fn data_volume(id: &str) -> String {
    format!("daiv-snapshot-{id}-data")
}

/// The three volumes of a copy-on-write workspace: merged (mounted), upper, work.
fn workspace_volumes(token: &str) -> [String; 3] {
    ["merged", "upper", "work"].map(|part| format!("daiv-ws-{token}-{part}"))
}

/// Whether the snapshot gets a record (an API snapshot) or not (a fork's, collected when the
/// forks are gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    Recorded,
    ForForks,
}

/// What a request asks of a snapshot.
#[derive(Debug, Clone, Default)]
pub struct SnapshotRequest {
    pub name: Option<String>,
    pub ttl: Option<Duration>,
}

/// A copy-on-write workspace made for a new session: mount `merged` at `/workspace`.
#[derive(Debug, Clone)]
pub struct Workspace {
    pub token: String,
    pub merged: String,
}

/// Where the time of a snapshot went, for the log and the benchmark.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timings {
    pub frozen: Duration,
    pub commit: Duration,
    pub copy: Duration,
}

pub struct Snapshots {
    engine: Arc<dyn ContainerEngine>,
    config: Arc<Config>,
    /// What this replica holds against `SNAPSHOT_MAX_BYTES` beyond the records: snapshots being
    /// taken, and forks' payloads (no record says their size) until they are removed.
    ledger: std::sync::Mutex<Ledger>,
}

/// Bytes reserved in this process (see [`Snapshots::reserve`]).
#[derive(Debug, Default)]
struct Ledger {
    in_flight: HashMap<String, u64>,
    forks: HashMap<String, u64>,
}

impl Ledger {
    fn total(&self) -> u64 {
        self.in_flight
            .values()
            .chain(self.forks.values())
            .fold(0u64, |a, b| a.saturating_add(*b))
    }
}

/// What a snapshot being taken may hold, reserved against the deployment's total until it is
/// recorded or discarded.
struct Reservation<'a> {
    snapshots: &'a Snapshots,
    id: String,
    /// The writable layer's bytes, as measured.
    layer: u64,
    /// What the deployment's snapshots held when it was made.
    held: u64,
    /// Most bytes the workspace copy may add to the writable layer's.
    copy_budget: u64,
}

impl Reservation<'_> {
    /// The refusal for a copy that passed its budget after `copied` bytes: the per-snapshot
    /// cap's or the deployment's, whichever it passed.
    fn refusal(&self, copied: u64) -> SnapshotError {
        let caps = &self.snapshots.config.snapshots;
        let found = self.layer.saturating_add(copied);
        if found > caps.size_max {
            SnapshotError::TooLarge {
                cap: caps.size_max,
                found,
                where_: "at least, counted as the workspace was copied",
            }
        } else {
            SnapshotError::NoRoom {
                held: self.held,
                need: found,
                cap: caps.max_bytes,
            }
        }
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.snapshots.ledger().in_flight.remove(&self.id);
    }
}

impl Snapshots {
    pub fn new(engine: Arc<dyn ContainerEngine>, config: Arc<Config>) -> Self {
        Self {
            engine,
            config,
            ledger: std::sync::Mutex::default(),
        }
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Measures the session's writable layer (its home, `/tmp`, whatever it changed outside
    /// the workspace: what the commit writes) and refuses up front what the caps cannot hold:
    /// over `SNAPSHOT_SIZE_MAX_BYTES`, or more than the room `SNAPSHOT_MAX_BYTES` leaves (the
    /// records, this replica's forks and snapshots in flight counted). The workspace is bounded
    /// as it is copied ([`Reservation::copy_budget`]).
    async fn reserve(
        &self,
        id: &str,
        info: &ContainerInfo,
    ) -> Result<Reservation<'_>, SnapshotError> {
        let caps = &self.config.snapshots;
        let layer = self.engine.writable_bytes(&info.id).await?.unwrap_or(0);
        if layer > caps.size_max {
            return Err(SnapshotError::TooLarge {
                cap: caps.size_max,
                found: layer,
                where_: "outside /workspace (the container's own files)",
            });
        }
        let recorded = self
            .list()
            .await?
            .iter()
            .fold(0u64, |a, s| a.saturating_add(s.size));
        let mut ledger = self.ledger();
        let held = recorded.saturating_add(ledger.total());
        let room = caps.max_bytes.saturating_sub(held);
        if layer >= room {
            return Err(SnapshotError::NoRoom {
                held,
                need: layer.max(1),
                cap: caps.max_bytes,
            });
        }
        ledger.in_flight.insert(id.to_string(), layer);
        let copy_budget = (caps.size_max - layer).min(room - layer);
        Ok(Reservation {
            snapshots: self,
            id: id.to_string(),
            layer,
            held,
            copy_budget,
        })
    }

    fn labels(&self, role: &str, id: &str) -> HashMap<String, String> {
        HashMap::from([
            (MANAGED_LABEL.to_string(), "true".to_string()),
            (ROLE_LABEL.to_string(), role.to_string()),
            (DEPLOYMENT_LABEL.to_string(), self.config.deployment.clone()),
            (SNAPSHOT_LABEL.to_string(), id.to_string()),
        ])
    }

    fn mine<'a>(&'a self, role: &'a str) -> [(&'a str, &'a str); 2] {
        [
            (ROLE_LABEL, role),
            (DEPLOYMENT_LABEL, self.config.deployment.as_str()),
        ]
    }

    /// Checks a request's name and TTL before anything is frozen.
    pub fn validate(
        &self,
        name: Option<&str>,
        ttl_secs: Option<u64>,
    ) -> Result<SnapshotRequest, SnapshotError> {
        if let Some(n) = name
            && (n.is_empty() || n.chars().count() > MAX_NAME || n.chars().any(char::is_control))
        {
            return Err(SnapshotError::InvalidName);
        }
        let ttl = match ttl_secs {
            None => self.config.snapshots.default_ttl,
            Some(s) if (1..=MAX_TTL_SECS).contains(&s) => Some(Duration::from_secs(s)),
            Some(_) => return Err(SnapshotError::InvalidTtl),
        };
        Ok(SnapshotRequest {
            name: name.map(str::to_string),
            ttl,
        })
    }

    /// Snapshots the session `info` (the caller holds its lock). A running session is frozen
    /// while its container is committed and its workspace copied, side by side; a stopped one is
    /// read as it is. On error nothing of the snapshot is left.
    pub async fn take(
        &self,
        info: &ContainerInfo,
        req: &SnapshotRequest,
        keep: Keep,
    ) -> Result<(Snapshot, Timings), SnapshotError> {
        let id = new_id(self.engine.id_prefix());
        let reservation = self.reserve(&id, info).await?;
        let base_image = info.labels.get(IMAGE_LABEL).cloned().unwrap_or_default();
        let source_image = info
            .image_id
            .clone()
            .ok_or_else(|| EngineError::Unavailable("the session has no image id".into()))?;
        let data = self
            .engine
            .create_volume(&VolumeSpec {
                name: data_volume(&id),
                labels: self.labels(ROLE_SNAPSHOT_DATA, &id),
                driver_opts: HashMap::new(),
            })
            .await?;
        let made = self
            .capture(info, &id, &source_image, &base_image, &data, &reservation)
            .await;
        let (image_bytes, workspace_bytes, timings) = match made {
            Ok(m) => m,
            Err(e) => {
                self.discard(&id).await;
                return Err(e);
            }
        };
        let created = unix_now();
        let snapshot = Snapshot {
            id: id.clone(),
            name: req.name.clone(),
            source: info.id.clone(),
            base_image,
            created,
            expires: req
                .ttl
                .map(|t| created.saturating_add(i64::try_from(t.as_secs()).unwrap_or(i64::MAX))),
            size: image_bytes.saturating_add(workspace_bytes),
        };
        if keep == Keep::Recorded
            && let Err(e) = self.write_record(&snapshot).await
        {
            self.discard(&id).await;
            return Err(e.into());
        }
        if keep == Keep::ForForks {
            // No record says a fork's size: this replica counts it until its payload goes.
            self.ledger().forks.insert(id.clone(), snapshot.size);
        }
        drop(reservation);
        Ok((snapshot, timings))
    }

    /// The freeze, the commit and the copy; the bytes of the image's own layer and of the copy.
    async fn capture(
        &self,
        info: &ContainerInfo,
        id: &str,
        source_image: &str,
        base_image: &str,
        data: &VolumeInfo,
        reservation: &Reservation<'_>,
    ) -> Result<(u64, u64, Timings), SnapshotError> {
        // Everything that does not need the freeze is done before it: the source image (its
        // environment for the commit's config, its size for ours) and the holder.
        let source = self.engine.inspect_image(source_image).await?;
        let spec = self.commit_spec(info, id, &source.env, base_image);
        let holder = self
            .engine
            .create(&self.holder_spec(id, source_image, &data.name))
            .await?;
        let freeze = info.is_running();
        let started = std::time::Instant::now();
        if freeze && let Err(e) = self.engine.pause(&info.id).await {
            let _ = self.engine.remove(&holder).await;
            return Err(e.into());
        }
        let size_max = self.config.snapshots.size_max;
        let commit = async {
            let t = std::time::Instant::now();
            // Measured again frozen: what the sandbox wrote since the first measure (a sparse
            // file is made in an instant) cannot slip past the cap.
            if freeze {
                let layer = self.engine.writable_bytes(&info.id).await?.unwrap_or(0);
                if layer > size_max {
                    return Err(SnapshotError::TooLarge {
                        cap: size_max,
                        found: layer,
                        where_: "outside /workspace (the container's own files)",
                    });
                }
            }
            let image = self.engine.commit(&info.id, &spec).await?;
            Ok::<_, SnapshotError>((image, t.elapsed()))
        };
        let copy = async {
            let t = std::time::Instant::now();
            let bytes = self.copy_workspace(&info.id, &holder, reservation).await?;
            Ok::<_, SnapshotError>((bytes, t.elapsed()))
        };
        let (committed, copied) = tokio::join!(commit, copy);
        let frozen = started.elapsed();
        if freeze && let Err(e) = self.engine.unpause(&info.id).await {
            // Left frozen, the session would hang: say so loudly (the next request thaws it).
            tracing::error!(session_id = %info.id, error = %e, "snapshot: could not thaw the session");
        }
        let _ = self.engine.remove(&holder).await;
        let (image, commit_time) = committed?;
        let (workspace_bytes, copy_time) = copied?;
        let own = self.engine.inspect_image(&image).await?.size;
        let base = source.size;
        let image_bytes = u64::try_from(own.saturating_sub(base)).unwrap_or(0);
        Ok((
            image_bytes,
            workspace_bytes,
            Timings {
                frozen,
                commit: commit_time,
                copy: copy_time,
            },
        ))
    }

    /// A never-started container with the data volume at `/workspace`: the daemon mounts its
    /// volumes for an archive upload, which is how the copy lands in the volume.
    fn holder_spec(&self, id: &str, image: &str, volume: &str) -> ContainerSpec {
        ContainerSpec {
            name: None,
            image: image.to_string(),
            entrypoint: Some(Vec::new()),
            cmd: Some(vec![layout::HELPER.to_string()]),
            env: Vec::new(),
            labels: self.labels(ROLE_SNAPSHOT_HOLDER, id),
            user: Some("0:0".to_string()),
            cap_add: Vec::new(),
            sysctls: Vec::new(),
            init: false,
            runtime: "runc".to_string(),
            memory_bytes: None,
            nano_cpus: None,
            pids_limit: 16,
            network: NetworkAttach::None,
            volumes: Vec::new(),
            named_volumes: vec![(volume.to_string(), layout::WORKSPACE.to_string())],
            log_options: Vec::new(),
            skeleton: None,
        }
    }

    /// The image's config: the base image's environment plus the sandbox's own variables, and
    /// every other variable of the container's (the caller's, the egress settings) blanked,
    /// because Docker merges the container's environment into a committed image's.
    fn commit_spec(
        &self,
        info: &ContainerInfo,
        id: &str,
        image_env: &[String],
        base_image: &str,
    ) -> CommitSpec {
        let mut env: Vec<(String, String)> =
            image_env.iter().filter_map(|kv| split_env(kv)).collect();
        let mut blanked = Vec::new();
        for kv in &info.env {
            let Some((k, _)) = split_env(kv) else {
                continue;
            };
            if env.iter().any(|(ek, _)| *ek == k) {
                continue;
            }
            blanked.push(k.clone());
            env.push((k, String::new()));
        }
        // The container's own labels (its triad, its pool, its workspace) would otherwise be
        // the image's, and every session made from it would carry them: each is given an empty
        // value, which the service reads as absent ([`ContainerInfo::label`]). The base image's
        // labels stay.
        let mut labels: HashMap<String, String> = info
            .labels
            .keys()
            .filter(|k| k.starts_with("daiv.sandbox."))
            .map(|k| (k.clone(), String::new()))
            .collect();
        labels.extend(self.labels(ROLE_SNAPSHOT, id));
        labels.insert(IMAGE_LABEL.to_string(), base_image.to_string());
        labels.insert(BLANKED_LABEL.to_string(), blanked.join(","));
        CommitSpec {
            reference: image_ref(id),
            labels,
            env,
            entrypoint: Vec::new(),
            cmd: vec![layout::HELPER.to_string(), "init".to_string()],
            user: "0:0".to_string(),
        }
    }

    /// Streams the session's `/workspace` into the holder's volume; the bytes streamed. The
    /// stream is cut once it passes the reservation's budget (the archive writes a sparse
    /// file's holes as zeros): the snapshot is refused and its partial copy discarded.
    async fn copy_workspace(
        &self,
        session: &str,
        holder: &str,
        reservation: &Reservation<'_>,
    ) -> Result<u64, SnapshotError> {
        let budget = reservation.copy_budget;
        let counted = Arc::new(AtomicU64::new(0));
        let seen = counted.clone();
        let tar = self
            .engine
            .get_archive(session, layout::WORKSPACE)
            .await?
            .map(move |chunk| {
                let chunk = chunk.map_err(std::io::Error::other)?;
                let total =
                    seen.fetch_add(chunk.len() as u64, Ordering::Relaxed) + chunk.len() as u64;
                if total > budget {
                    return Err(std::io::Error::other("snapshot over its size cap"));
                }
                Ok(chunk)
            })
            .boxed();
        let put = self.engine.put_archive(holder, "/", tar).await;
        let total = counted.load(Ordering::Relaxed);
        if total > budget {
            return Err(reservation.refusal(total));
        }
        put?;
        Ok(total)
    }

    async fn write_record(&self, s: &Snapshot) -> Result<(), EngineError> {
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
        self.get(id).await?;
        match self.engine.remove_volume(&record_volume(id)).await {
            Ok(()) | Err(EngineError::NotFound) => {}
            Err(e) => return Err(e.into()),
        }
        self.release(id).await;
        Ok(())
    }

    /// Removes a snapshot's payload where nothing uses it any more; what is still used stays
    /// for a later sweep.
    pub async fn release(&self, id: &str) {
        match self.engine.remove_image(&image_ref(id)).await {
            Ok(()) | Err(EngineError::NotFound) => {}
            Err(e) => {
                tracing::debug!(snapshot_id = id, error = %e, "snapshot image still in use; kept")
            }
        }
        let users = self
            .engine
            .list_volumes(&[
                (ROLE_LABEL, ROLE_WORKSPACE),
                (DEPLOYMENT_LABEL, self.config.deployment.as_str()),
                (SNAPSHOT_LABEL, id),
            ])
            .await;
        if matches!(&users, Ok(u) if u.is_empty()) {
            match self.engine.remove_volume(&data_volume(id)).await {
                Ok(()) | Err(EngineError::NotFound) => {
                    self.ledger().forks.remove(id);
                }
                Err(e) => {
                    tracing::debug!(snapshot_id = id, error = %e, "snapshot data still in use; kept")
                }
            }
        }
    }

    /// Everything of a snapshot that failed half-way.
    async fn discard(&self, id: &str) {
        let _ = self.engine.remove_volume(&record_volume(id)).await;
        let _ = self.engine.remove_image(&image_ref(id)).await;
        let _ = self.engine.remove_volume(&data_volume(id)).await;
    }

    /// A copy-on-write workspace over snapshot `s`'s data for a new session.
    pub async fn workspace(&self, s: &Snapshot) -> Result<Workspace, SnapshotError> {
        let lower = self
            .engine
            .inspect_volume(&data_volume(&s.id))
            .await
            .map_err(|e| match e {
                EngineError::NotFound => SnapshotError::NotFound,
                e => e.into(),
            })?;
        let token = crate::ids::random_token();
        let [merged, upper, work] = workspace_volumes(&token);
        let mut labels = self.labels(ROLE_WORKSPACE, &s.id);
        labels.insert(WORKSPACE_LABEL.to_string(), token.clone());
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
            let paths = [
                lower.mountpoint.as_str(),
                dirs[0].as_str(),
                dirs[1].as_str(),
            ];
            // The overlay's option string is split on commas and colons.
            if paths
                .iter()
                .any(|p| p.is_empty() || p.contains([',', ':', '\\']) || !p.starts_with('/'))
            {
                return Err(SnapshotError::UnusableMountpoint);
            }
            self.engine
                .create_volume(&VolumeSpec {
                    name: merged.clone(),
                    labels: labels.clone(),
                    driver_opts: HashMap::from([
                        ("type".to_string(), "overlay".to_string()),
                        ("device".to_string(), "overlay".to_string()),
                        (
                            "o".to_string(),
                            format!(
                                "lowerdir={},upperdir={},workdir={}",
                                paths[0], paths[1], paths[2]
                            ),
                        ),
                    ]),
                })
                .await?;
            made.push(merged.clone());
            Ok(())
        }
        .await;
        match result {
            Ok(()) => Ok(Workspace { token, merged }),
            Err(e) => {
                for name in made.iter().rev() {
                    let _ = self.engine.remove_volume(name).await;
                }
                Err(e)
            }
        }
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

    /// The reaper's part: retention (expired snapshots, then the oldest beyond the count and
    /// byte caps), then the payload of snapshots without a record and the workspaces of
    /// sessions that are gone, once older than `guard` (a snapshot or session being made has
    /// them before its record or container). Returns the ids of the snapshots deleted.
    pub async fn sweep(
        &self,
        now: SystemTime,
        guard: Duration,
    ) -> Result<Vec<String>, EngineError> {
        let now = crate::time::unix_secs(now);
        let guard = i64::try_from(guard.as_secs()).unwrap_or(i64::MAX);
        let mut all = match self.list().await {
            Ok(all) => all,
            Err(SnapshotError::Engine(e)) => return Err(e),
            Err(_) => Vec::new(),
        };
        // Newest first: keep from the front, evict from the back.
        let mut deleted = Vec::new();
        all.retain(|s| {
            let expired = s.expires.is_some_and(|e| e <= now);
            if expired {
                deleted.push(s.id.clone());
            }
            !expired
        });
        let caps = &self.config.snapshots;
        let mut bytes: u64 = 0;
        let mut kept = Vec::new();
        for (i, s) in all.into_iter().enumerate() {
            bytes = bytes.saturating_add(s.size);
            if i >= caps.max_count as usize || (bytes > caps.max_bytes && i > 0) {
                deleted.push(s.id.clone());
            } else {
                kept.push(s.id);
            }
        }
        for id in &deleted {
            match self.delete(id).await {
                Ok(()) | Err(SnapshotError::NotFound) => {
                    tracing::info!(snapshot_id = %id, "reaper: snapshot removed (retention)")
                }
                Err(e) => {
                    tracing::warn!(snapshot_id = %id, error = %e, "reaper: snapshot not removed")
                }
            }
        }
        let live: HashSet<String> = kept.into_iter().collect();
        let old = |created: Option<i64>| created.unwrap_or(now).saturating_add(guard) <= now;

        // Holders left by a crash mid-snapshot.
        for c in self.engine.list(&self.mine(ROLE_SNAPSHOT_HOLDER)).await? {
            if old(c.created) {
                let _ = self.engine.remove(&c.id).await;
            }
        }
        // Workspaces whose session is gone.
        let sessions = self.engine.list(&self.mine(ROLE_SANDBOX)).await?;
        let tokens: HashSet<&str> = sessions
            .iter()
            .filter_map(|c| c.label(WORKSPACE_LABEL))
            .collect();
        let workspaces = self.engine.list_volumes(&self.mine(ROLE_WORKSPACE)).await?;
        let mut gone: Vec<&str> = workspaces
            .iter()
            .filter(|v| old(v.created))
            .filter_map(|v| v.labels.get(WORKSPACE_LABEL).map(String::as_str))
            .filter(|t| !tokens.contains(t))
            .collect();
        gone.sort_unstable();
        gone.dedup();
        for token in gone {
            self.remove_workspace(token).await;
        }
        // Payload without a record.
        let mut orphans: HashSet<String> = HashSet::new();
        for i in self.engine.list_images(&self.mine(ROLE_SNAPSHOT)).await? {
            if let Some(id) = i.labels.get(SNAPSHOT_LABEL)
                && !live.contains(id)
                && old(i.created)
            {
                orphans.insert(id.clone());
            }
        }
        for v in self
            .engine
            .list_volumes(&self.mine(ROLE_SNAPSHOT_DATA))
            .await?
        {
            if let Some(id) = v.labels.get(SNAPSHOT_LABEL)
                && !live.contains(id)
                && old(v.created)
            {
                orphans.insert(id.clone());
            }
        }
        for id in orphans {
            self.release(&id).await;
        }
        Ok(deleted)
    }
}

fn split_env(kv: &str) -> Option<(String, String)> {
    let (k, v) = kv.split_once('=')?;
    Some((k.to_string(), v.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_32_lowercase_hex_digits() {
        let id = new_id(None);
        assert!(is_snapshot_id(&id), "{id}");
        assert_ne!(id, new_id(None));
        let on_b = new_id(Some("b"));
        assert!(on_b.starts_with("b.") && is_snapshot_id(&on_b), "{on_b}");
        assert!(!is_snapshot_id(&"A".repeat(32)));
        assert!(!is_snapshot_id("../../x"));
        assert!(!is_snapshot_id(&"a".repeat(64)));
    }

    #[test]
    fn requests_are_validated() {
        let s = Snapshots::new(
            Arc::new(crate::engine::fake::FakeEngine::new(|_| {
                crate::engine::fake::FakeExec::default()
            })),
            crate::config::for_tests("k", &[("SNAPSHOT_TTL_SECONDS", "60")]),
        );
        assert_eq!(
            s.validate(None, None).ok().and_then(|r| r.ttl),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            s.validate(Some("x"), Some(5)).ok().and_then(|r| r.ttl),
            Some(Duration::from_secs(5))
        );
        assert!(matches!(
            s.validate(Some(""), None),
            Err(SnapshotError::InvalidName)
        ));
        assert!(matches!(
            s.validate(Some("a\nb"), None),
            Err(SnapshotError::InvalidName)
        ));
        assert!(matches!(
            s.validate(None, Some(0)),
            Err(SnapshotError::InvalidTtl)
        ));
    }
}
