//! Layered workspaces: a snapshot's data is a stack of immutable layers, and a snapshot of a
//! session from a snapshot copies only what the session changed.
//!
//! A snapshot's data volume holds its own layer. The first snapshot of a session copies the
//! whole workspace (a base layer, with the same copier); a session from snapshot `S` mounts an overlay (the local
//! driver's `type=overlay`, with `userxattr`) whose lower directories are `S`'s layer and every
//! layer below it, top first, over an empty upper volume of its own. A snapshot of that session
//! copies the upper alone into its new layer: overlay's own records of what changed (whiteouts,
//! 0/0 character devices, for deletions; `user.overlay.opaque` for a directory replaced) travel
//! with it, so the layer means the same over the same stack.
//!
//! The copy runs in a throwaway container of the session's image (no network, root with the
//! few capabilities a faithful copy needs, never `CAP_SYS_ADMIN`): the static helper's
//! `copy-tree`, which never follows a link of the tree it copies (the sandbox wrote it), keeps
//! holes, ownership, modes, times, hard links and user extended attributes, and stops at the
//! snapshot's byte budget.
//!
//! Who uses a layer is on labels, because the overlay names its lower directories by path and
//! Docker does not count that as a use: every volume whose mount needs layer `X` (a session's
//! workspace, a snapshot's layer above it) carries [`uses_label`]`(X)`. A layer goes only when
//! no volume carries its label ([`Snapshots::release`]).
//!
//! Deep stacks are flattened in the background (see `flatten`). Past [`MAX_DEPTH`] layers
//! (overlay's option string is one page), should that not have landed yet, a snapshot copies
//! the whole workspace again as the session sees it (its overlay's view), a new base layer.

use super::probe::LayerSupport;
use super::*;
use crate::archive::{Archive, ROOT, entry_name};
use crate::shared_file::SharedFile;

/// On a snapshot's data volume: the ids of the layers below its own, top first (comma
/// separated; absent or empty for a base layer).
pub(super) const LOWERS_LABEL: &str = "daiv.sandbox.snapshot.lowers";
/// On a workspace's volumes: how its overlay keeps its own records (`userxattr`); a workspace
/// made before layers has none, and its snapshots copy the whole workspace.
pub(super) const LAYERED_LABEL: &str = "daiv.sandbox.workspace.layered";
/// [`LAYERED_LABEL`]'s value on a workspace that is a copy of its snapshot's layer (an engine
/// without overlays): its snapshots copy it whole, a base layer.
pub(super) const COPIED: &str = "copy";
/// On a snapshot's data volume: [`LAYOUT_STATE`] when the layer holds every state directory
/// (`layout::STATE`) under its key, and the snapshot's image is its base image's (nothing
/// committed); absent when it holds `/workspace` at its root.
pub(super) const LAYOUT_LABEL: &str = "daiv.sandbox.snapshot.layout";
pub(super) const LAYOUT_STATE: &str = "state";
/// On a state layer: its source had been seeded (the marker is the service's, in no layer).
pub(super) const SEEDED_LABEL: &str = "daiv.sandbox.snapshot.seeded";
const USES_PREFIX: &str = "daiv.sandbox.layer.";
/// Most layers a workspace's overlay stacks; a snapshot that would make more copies everything.
pub const MAX_DEPTH: usize = 16;
/// Role of the short-lived container that copies a session's changes into a layer.
pub const ROLE_LAYER_COPIER: &str = "layer-copier";
/// Exit status of `copy-tree` when the tree is over its byte budget.
const OVER_BUDGET: i64 = 3;
/// Exit status of `copy-tree` when it refuses the tree's shape (too deep, a device node).
const REFUSED: i64 = 4;
/// The copier's memory: its buffers and the hard links it has seen.
const COPIER_MEMORY: i64 = 512 * 1024 * 1024;
/// The deepest tree `copy-tree` walks (`sandbox_helper::copy_tree::MAX_DEPTH`).
pub(super) const COPY_DEPTH_MAX: usize = 256;
/// Where the copier sees the session's changes, and the new layer.
pub(super) const COPY_FROM: &str = "/from";
pub(super) const COPY_TO: &str = "/to";

/// The label a volume carries while its mount needs layer `id`.
pub(super) fn uses_label(id: &str) -> String {
    format!("{USES_PREFIX}{id}")
}

/// The layers below a data volume's own, top first.
pub(super) fn lowers_of(v: &VolumeInfo) -> Vec<String> {
    v.labels
        .get(LOWERS_LABEL)
        .map(|l| {
            l.split(',')
                .filter(|id| is_snapshot_id(id))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// What copies a snapshot's layer: a copier of its own, or a worker.
#[derive(Debug)]
pub(super) enum Copier {
    /// Made for this snapshot (its volumes at `/from` and `/to`), removed after it.
    Own(String),
    /// A long-lived worker; the copy's `(from, to)` paths in it. It counts as busy (nothing
    /// retires it for being idle) until this is dropped, however the snapshot ends.
    Worker {
        id: String,
        pairs: Vec<(String, String)>,
        _busy: Busy,
    },
}

impl Copier {
    pub(super) fn id(&self) -> &str {
        match self {
            Self::Own(id) | Self::Worker { id, .. } => id,
        }
    }
}

/// One use of a worker, counted while it lives.
#[derive(Debug)]
pub(super) struct Busy(Arc<std::sync::atomic::AtomicUsize>);

impl Busy {
    pub(super) fn new(count: &Arc<std::sync::atomic::AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(count.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How a snapshot's layer is copied with `copy-tree`: a session's changes over the stack of the
/// snapshot it came from, or a whole workspace of its own (a base layer: no lowers).
#[derive(Debug, Clone)]
pub(super) struct Layering {
    /// The volumes copied: the session's upper volumes (what it changed), or its own; with
    /// `state`, one per state directory under its key, else `/workspace`'s alone.
    pub(super) from: Vec<(&'static str, String)>,
    /// The layers below the new one, top first: the session's snapshot, then its lowers.
    pub(super) lowers: Vec<String>,
    /// Whether the session keeps every state directory on volumes: the layer holds them
    /// all, and nothing is committed.
    pub(super) state: bool,
    /// Whether every volume copied is a plain one (not an overlay's merged view): a layer
    /// worker can copy it by path (see `worker`).
    pub(super) plain: bool,
}

impl Layering {
    /// The new layer's labels beyond the snapshot's own (none for a base layer).
    pub(super) fn labels(&self) -> impl Iterator<Item = (String, String)> + '_ {
        (!self.lowers.is_empty())
            .then(|| (LOWERS_LABEL.to_string(), self.lowers.join(",")))
            .into_iter()
            .chain(self.lowers.iter().map(|l| (uses_label(l), "true".into())))
            .chain(
                self.state
                    .then(|| (LAYOUT_LABEL.to_string(), LAYOUT_STATE.to_string())),
            )
    }
}

impl Snapshots {
    /// The layers of snapshot `id`'s workspace, top first: its own data volume, then the ones
    /// below it, as far as a flat copy (see `flatten`). [`SnapshotError::NotFound`] when one
    /// is gone.
    pub(super) async fn stack(&self, id: &str) -> Result<Vec<VolumeInfo>, SnapshotError> {
        let ids = self.stack_ids(id).await?;
        let found = |e| match e {
            EngineError::NotFound => SnapshotError::NotFound,
            e => e.into(),
        };
        let names: Vec<String> = ids.iter().map(|l| data_volume(l)).collect();
        let layers =
            futures::future::join_all(names.iter().map(|n| self.engine.inspect_volume(n))).await;
        layers.into_iter().map(|v| v.map_err(found)).collect()
    }

    /// How a snapshot of session `info` (as inspected) is copied by `copy-tree`: a layer over
    /// its snapshot's, or its whole volumes as a base layer (its own, a copy of its snapshot's,
    /// or at the deepest stack its overlays' view). `None` for a workspace from before layers,
    /// or one the inspect does not name: those go through the engine's archive API.
    pub(super) async fn layering(&self, info: &ContainerInfo) -> Option<Layering> {
        let state = info.label(STATE_LABEL) == Some(STATE_VOLUMES);
        let keys = state_keys(state);
        let (Some(token), Some(parent)) = (info.label(WORKSPACE_LABEL), info.label(SNAPSHOT_LABEL))
        else {
            // Volumes of its own.
            let from = keys
                .iter()
                .map(|(key, at)| {
                    let (_, v) = info.volumes.iter().find(|(m, _)| m == at)?;
                    Some((*key, v.clone()))
                })
                .collect::<Option<Vec<_>>>()?;
            return Some(Layering {
                from,
                lowers: Vec::new(),
                state,
                plain: true,
            });
        };
        let part = |i: usize| -> Vec<(&'static str, String)> {
            keys.iter()
                .map(|(key, _)| {
                    let names = state_volumes(token, key);
                    (*key, names[i].clone())
                })
                .collect()
        };
        let [merged, _, _] = workspace_volumes(token);
        let ws = self.engine.inspect_volume(&merged).await.ok()?;
        if ws.labels.get(LAYERED_LABEL).map(String::as_str) == Some(COPIED) {
            // A copy of its snapshot's layer (an engine without overlays): a base layer.
            return Some(Layering {
                from: part(0),
                lowers: Vec::new(),
                state,
                plain: true,
            });
        }
        if ws.labels.get(LAYERED_LABEL).map(String::as_str) != Some("userxattr") {
            return None;
        }
        // The stack a session from its snapshot mounts now (a flat copy ends it): the same
        // view as the one this session may have mounted before the copy was made.
        let lowers = self.stack_ids(parent).await.ok()?;
        // An engine that gives copies now (its probe, or the operator's setting) would refuse
        // a session from a layer over others: the session's whole view is a base layer.
        let copies = self.config.snapshots.layers == crate::config::SnapshotLayers::Copy
            || matches!(self.probed(), Some(LayerSupport::Copies(_)));
        Some(if lowers.len() < MAX_DEPTH && !copies {
            Layering {
                from: part(1),
                lowers,
                state,
                plain: true,
            }
        } else {
            // The deepest stack, or copies: the session's whole view (the overlays, mounted
            // for the copier as for the session) becomes a new base layer, whiteouts applied.
            Layering {
                from: part(0),
                lowers: Vec::new(),
                state,
                plain: false,
            }
        })
    }

    /// A copier for `from` into `to`, created and started before the freeze.
    pub(super) async fn create_copier(
        &self,
        id: &str,
        image: &str,
        from: &[(Option<&str>, String)],
        to: &[(Option<&str>, String)],
    ) -> Result<String, EngineError> {
        // A volume at `/from` (`/to`), or one under it per key.
        let at = |root: &str, (key, v): &(Option<&str>, String)| match key {
            Some(k) => (v.clone(), format!("{root}/{k}")),
            None => (v.clone(), root.to_string()),
        };
        let named_volumes = from
            .iter()
            .map(|m| at(COPY_FROM, m))
            .chain(to.iter().map(|m| at(COPY_TO, m)))
            .collect();
        let mut spec = self.copier_spec(image, named_volumes);
        spec.labels = self.labels(ROLE_LAYER_COPIER, id);
        let id = self.engine.create(&spec).await?;
        if let Err(e) = self.engine.start(&id).await {
            let _ = self.engine.remove(&id).await;
            return Err(e);
        }
        Ok(id)
    }

    /// A copier's container (a layer worker's too): the helper's keep-alive, root with what a
    /// faithful copy needs, no network, runc.
    pub(super) fn copier_spec(
        &self,
        image: &str,
        named_volumes: Vec<(String, String)>,
    ) -> ContainerSpec {
        ContainerSpec {
            name: None,
            image: image.to_string(),
            entrypoint: Some(Vec::new()),
            // The helper's keep-alive without an identity to take: it stays root.
            cmd: Some(vec![layout::HELPER.to_string(), "init".to_string()]),
            env: Vec::new(),
            labels: HashMap::new(),
            user: Some("0:0".to_string()),
            // What a faithful copy needs as root: owners, modes and times of any file,
            // whiteouts (character devices), reading whatever the sandbox made unreadable.
            cap_add: ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "MKNOD"]
                .map(String::from)
                .to_vec(),
            sysctls: Vec::new(),
            init: true,
            runtime: "runc".to_string(),
            memory_bytes: Some(COPIER_MEMORY),
            nano_cpus: None,
            pids_limit: 16,
            network: NetworkAttach::None,
            volumes: Vec::new(),
            named_volumes,
            read_only_volumes: Vec::new(),
            host_dirs: Vec::new(),
            log_options: Vec::new(),
            auto_remove: false,
            skeleton: copier_skeleton(self.helper.as_ref()),
        }
    }

    /// Copies the session's changes into the new layer (a copier's `/from` into its `/to`, or
    /// a worker's pairs), at most `budget` bytes counted (its files and a header per entry, as
    /// an archive of it weighs); the bytes counted, or the reservation's refusal past the budget.
    pub(super) async fn copy_layer(
        &self,
        copier: &Copier,
        reservation: &budget::Reservation<'_>,
    ) -> Result<u64, SnapshotError> {
        let budget = reservation.copy_budget;
        let pairs = match copier {
            Copier::Own(_) => vec![(COPY_FROM.to_string(), COPY_TO.to_string())],
            Copier::Worker { pairs, .. } => pairs.clone(),
        };
        match self.run_copy(copier.id(), &pairs, budget).await? {
            Ok(bytes) => Ok(bytes),
            Err(Copy::OverBudget) => Err(reservation.refusal(budget.saturating_add(1))),
            Err(Copy::Refused) => Err(SnapshotError::Uncopyable {
                depth: COPY_DEPTH_MAX,
            }),
            Err(Copy::Failed) => {
                Err(EngineError::Unavailable("the layer copy failed".into()).into())
            }
        }
    }

    /// Runs `copy-tree` in `copier`; the bytes counted, or why it stopped (its output logged:
    /// the helper names the sandbox's paths, which stay out of clients' bodies).
    pub(super) async fn run_copy(
        &self,
        copier: &str,
        pairs: &[(String, String)],
        budget: u64,
    ) -> Result<Result<u64, Copy>, EngineError> {
        let mut cmd = vec![layout::HELPER.to_string(), "copy-tree".to_string()];
        for (from, to) in pairs {
            cmd.extend([from.clone(), to.clone()]);
        }
        cmd.extend(["--max-bytes".to_string(), budget.to_string()]);
        let spec = crate::engine::ExecSpec {
            cmd,
            user: "0:0".to_string(),
            workdir: None,
            env: Vec::new(),
        };
        let exec = self.engine.exec(copier, &spec).await?;
        // Its output is one line, or one error line: a bounded read.
        let mut out = Vec::new();
        let mut stream = exec.output;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            if out.len() < 64 * 1024 {
                out.extend_from_slice(&chunk);
            }
        }
        let code = self.engine.exec_exit_code(&exec.exec_id).await?;
        let text = String::from_utf8_lossy(&out);
        Ok(match code {
            Some(0) => Ok(text
                .lines()
                .rev()
                .find_map(|l| serde_json::from_str::<Copied>(l.trim()).ok())
                .map(|c| c.bytes)
                .ok_or_else(|| {
                    EngineError::Unavailable("the layer copy answered nothing".into())
                })?),
            Some(OVER_BUDGET) => Err(Copy::OverBudget),
            Some(REFUSED) => {
                tracing::warn!(output = %text.trim(), "snapshot: the layer copy refused the tree");
                Err(Copy::Refused)
            }
            _ => {
                tracing::warn!(output = %text.trim(), code = ?code, "snapshot: the layer copy failed");
                Err(Copy::Failed)
            }
        })
    }

    /// Copies snapshot layer `layer` (a volume) into the plain volumes `into` (one per key of a
    /// state layer, or one for its root), for a session from a snapshot on an engine without
    /// overlays. Not capped: the layer was, when it was taken.
    pub(super) async fn copy_into(
        &self,
        token: &str,
        image: &str,
        layer: &str,
        into: &[(Option<&str>, String)],
    ) -> Result<u64, SnapshotError> {
        let copier = self
            .create_copier(token, image, &[(None, layer.to_string())], into)
            .await?;
        let mut total = Ok(0u64);
        for (key, _) in into {
            let (from, to) = match key {
                Some(k) => (format!("{COPY_FROM}/{k}"), format!("{COPY_TO}/{k}")),
                None => (COPY_FROM.to_string(), COPY_TO.to_string()),
            };
            let copied = self.run_copy(&copier, &[(from, to)], u64::MAX).await;
            total = match (total, copied) {
                (Ok(t), Ok(Ok(bytes))) => Ok(t.saturating_add(bytes)),
                (Err(e), _) => Err(e),
                (_, Err(e)) => Err(e.into()),
                (_, Ok(Err(_))) => {
                    Err(EngineError::Unavailable("the workspace copy failed".into()).into())
                }
            };
            if total.is_err() {
                break;
            }
        }
        let _ = self.engine.remove(&copier).await;
        total
    }
}

impl Snapshots {
    /// Whether no sandbox user can write anything of image `image` outside the state
    /// directories (`layout::STATE`), so that a state session's container layer holds only
    /// what the service put there: the helper's `writable-paths` walks the image's own files
    /// in `copier` (a fresh container of it), once per image and users. Anything it cannot
    /// tell is a no: the snapshot commits.
    pub(super) async fn commits_nothing(
        &self,
        copier: &str,
        image: &str,
        info: &ContainerInfo,
    ) -> bool {
        let s = &self.config.sessions;
        let user = info
            .label(SANDBOX_USER_LABEL)
            .and_then(SandboxUser::parse)
            .unwrap_or(SandboxUser {
                uid: s.run_uid,
                gid: s.run_gid,
            });
        let (first, last) = s.run_uid_range.unwrap_or((s.run_uid, s.run_uid));
        let uids = format!("{}-{}", first.min(user.uid), last.max(user.uid));
        let gids = format!("{0}-{0}", user.gid);
        let key = format!("{image} {uids} {gids}");
        if let Some(known) = self.known_writable(&key) {
            return known;
        }
        let except: Vec<&str> = layout::STATE.iter().map(|(_, p)| *p).collect();
        let spec = crate::engine::ExecSpec {
            cmd: vec![
                layout::HELPER.to_string(),
                "writable-paths".to_string(),
                "--uids".to_string(),
                uids,
                "--gids".to_string(),
                gids,
                "--except".to_string(),
                except.join(","),
            ],
            user: "0:0".to_string(),
            workdir: None,
            env: Vec::new(),
        };
        let found = async {
            let exec = self.engine.exec(copier, &spec).await.ok()?;
            let mut out = Vec::new();
            let mut stream = exec.output;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.ok()?;
                if out.len() < 64 * 1024 {
                    out.extend_from_slice(&chunk);
                }
            }
            let code = self.engine.exec_exit_code(&exec.exec_id).await.ok()?;
            let text = String::from_utf8_lossy(&out);
            if code != Some(0) {
                tracing::warn!(output = %text.trim(), code = ?code, "snapshot: the image's writable paths are unknown; committing");
                return None;
            }
            text.lines()
                .rev()
                .find_map(|l| serde_json::from_str::<Writable>(l.trim()).ok())
        }
        .await;
        let Some(found) = found else {
            return false;
        };
        let clean = found.paths.is_empty();
        if !clean {
            tracing::info!(image = %image, paths = ?found.paths, "snapshot: the sandbox user can write these outside its volumes; snapshots of its sessions commit them");
        }
        self.writable
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, clean);
        clean
    }

    fn known_writable(&self, key: &str) -> Option<bool> {
        let known = self.writable.lock().unwrap_or_else(|e| e.into_inner());
        known.get(key).copied()
    }
}

/// What `writable-paths` prints: the paths a sandbox user could change (a cut list when
/// there are many).
#[derive(serde::Deserialize)]
struct Writable {
    paths: Vec<String>,
}

/// Why a `copy-tree` stopped.
pub(super) enum Copy {
    OverBudget,
    Refused,
    Failed,
}

/// What `copy-tree` prints when it is done.
#[derive(serde::Deserialize)]
struct Copied {
    bytes: u64,
}

/// The copier's skeleton: the service's directory and the helper.
fn copier_skeleton(helper: Option<&SharedFile>) -> Vec<crate::archive::Part> {
    let Some(bin) = helper else {
        return Vec::new();
    };
    let mut tar = Archive::new();
    tar.dir(entry_name(layout::SERVICE_DIR), 0o755, ROOT);
    tar.shared_file(entry_name(layout::HELPER), 0o755, ROOT, bin.clone());
    tar.finish_parts().unwrap_or_default()
}
