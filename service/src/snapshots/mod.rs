//! Snapshots: a session's whole filesystem at one instant, kept as Docker objects, and the
//! copy-on-write workspaces of sessions made from one.
//!
//! A snapshot is three objects, all labelled with the deployment (so every replica sees them and
//! a restart loses nothing), but its image where it commits nothing:
//! - its **image** `daiv-sandbox-snapshot:<id>`: for a session that keeps everything its user
//!   can write on volumes of its own (`layout::STATE`), its base image by another name (a tag:
//!   its container's layer holds only what the service put there); else, or where the image
//!   lets the user write elsewhere (see `Snapshots::commits_nothing`), `docker commit` of the
//!   session's container (its home directory, the seed marker, whatever it changed outside the
//!   workspace);
//! - its **data volume** `daiv-snapshot-<id>-data`: its layer (see `layers`): a copy of those
//!   volumes, each under its key, or of `/workspace` alone;
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
    ROLE_SNAPSHOT_DATA, ROLE_WORKSPACE, SANDBOX_USER_LABEL, SNAPSHOT_LABEL, STATE_LABEL,
    STATE_VOLUMES, SandboxUser, VolumeInfo, VolumeSpec, WORKSPACE_LABEL,
};
use crate::layout;
use crate::time::unix_now;

mod budget;
mod cow;
mod flatten;
mod layers;
mod probe;
mod record;
mod sweep;
mod take;
mod worker;

use budget::Ledger;
pub use budget::Pin;
pub use flatten::{FLATTEN_AT, ROLE_LAYER_VIEW, ROLE_SNAPSHOT_FLAT};
pub use layers::{MAX_DEPTH, ROLE_LAYER_COPIER};
pub use probe::{LayerSupport, ROLE_LAYER_PROBE};
pub use worker::ROLE_LAYER_WORKER;

/// The repository every snapshot image is tagged in; the tag is the snapshot id.
pub const IMAGE_REPOSITORY: &str = "daiv-sandbox-snapshot";
/// Role of the short-lived container whose volume mount receives a workspace copy.
pub const ROLE_SNAPSHOT_HOLDER: &str = "snapshot-holder";
/// Role of the empty volume that says a deleted snapshot's layer is still held (a layer or a
/// session above it needs it) and how many bytes it counts for.
const ROLE_SNAPSHOT_HELD: &str = "snapshot-held";

const NAME_LABEL: &str = "daiv.sandbox.snapshot.name";
const SOURCE_LABEL: &str = "daiv.sandbox.snapshot.source";
const CREATED_LABEL: &str = "daiv.sandbox.snapshot.created";
const EXPIRES_LABEL: &str = "daiv.sandbox.snapshot.expires";
const SIZE_LABEL: &str = "daiv.sandbox.snapshot.size";
/// Names of the source's environment given an empty value in the image (see [`CommitSpec`]).
const BLANKED_LABEL: &str = "daiv.sandbox.snapshot.blanked-env";

pub use crate::api::{SNAPSHOT_NAME_MAX as MAX_NAME, SNAPSHOT_TTL_MAX_SECS as MAX_TTL_SECS};

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
    /// The layer copy refused the session's tree (the helper's `copy-tree`: deeper than it
    /// walks, or a device node no sandbox can make); the service's log names the entry.
    #[error(
        "the session's changes could not be copied into the snapshot: a directory tree deeper \
         than {depth} levels, or a device node (the service's log names it)"
    )]
    Uncopyable { depth: usize },
    /// The snapshot is a stack of layers, which this engine can no longer mount as an overlay
    /// (its probe says so): only a base layer can be copied whole.
    #[error(
        "the snapshot is {layers} layers deep and this engine cannot mount overlay volumes \
         (GET /engines/ says why); create the session on an engine that can, or from a \
         snapshot taken here"
    )]
    LayersUnmountable { layers: usize },
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
    /// Whom its files belong to: its source's sandbox user (`None` for a snapshot recorded
    /// before snapshots said it: `RUN_UID`'s). Sessions from it run as this user.
    pub user: Option<SandboxUser>,
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

fn held_volume(id: &str) -> String {
    format!("daiv-snapshot-{id}-held")
}

/// The three volumes of a copy-on-write workspace: merged (mounted), upper, work.
fn workspace_volumes(token: &str) -> [String; 3] {
    ["merged", "upper", "work"].map(|part| format!("daiv-ws-{token}-{part}"))
}

/// [`workspace_volumes`] of the state directory `key` (`layout::STATE`): `/workspace`'s keep
/// their names from before the other directories had any.
fn state_volumes(token: &str, key: &str) -> [String; 3] {
    if key == "workspace" {
        return workspace_volumes(token);
    }
    ["merged", "upper", "work"].map(|part| format!("daiv-ws-{token}-{key}-{part}"))
}

/// The directories a workspace holds, with their keys: every state directory, or `/workspace`.
fn state_keys(state: bool) -> &'static [(&'static str, &'static str)] {
    match state {
        true => &crate::layout::STATE,
        false => &crate::layout::STATE[..1],
    }
}

/// The local driver's `type=overlay` volume `name` over `lowers` (host directories, top first,
/// `:`-separated), with `upper` and `work`: what a session from a snapshot mounts, and what the
/// probe checks the engine can mount. `userxattr`: overlay keeps its records (opaque
/// directories) as `user.overlay.*`, which a copy of the upper can carry without
/// `CAP_SYS_ADMIN`.
fn overlay_volume(
    name: &str,
    labels: HashMap<String, String>,
    lowers: &str,
    upper: &str,
    work: &str,
) -> VolumeSpec {
    VolumeSpec {
        name: name.to_string(),
        labels,
        driver_opts: HashMap::from([
            ("type".to_string(), "overlay".to_string()),
            ("device".to_string(), "overlay".to_string()),
            (
                "o".to_string(),
                format!("lowerdir={lowers},upperdir={upper},workdir={work},userxattr"),
            ),
        ]),
    }
}

/// The longest overlay option string the kernel takes (one page, less room for what the
/// local driver adds).
const OPTIONS_MAX: usize = 4000;

/// The host directories of `stack`'s layers for state directory `key`, top first (a state
/// layer holds each directory under its key).
fn lower_dirs(stack: &[VolumeInfo], state: bool, key: &str) -> Vec<String> {
    stack
        .iter()
        .map(|v| match state {
            true => format!("{}/{key}", v.mountpoint),
            false => v.mountpoint.clone(),
        })
        .collect()
}

/// Whether host directory `p` can go into an overlay's option string, which is split on commas
/// and colons.
fn usable_dir(p: &str) -> bool {
    !p.is_empty() && !p.contains([',', ':', '\\']) && p.starts_with('/')
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

/// A copy-on-write workspace made for a new session: mount `merged` at `/workspace`. The
/// sweep leaves it alone while this is held (keep it until the session's container exists).
#[derive(Debug)]
pub struct Workspace<'a> {
    pub token: String,
    /// Its volumes and where they are mounted: `/workspace` alone, or with `state` every
    /// directory of `layout::STATE`.
    pub mounts: Vec<(String, String)>,
    /// Whether its snapshot holds every state directory (`SNAPSHOT_STATE=volumes`), so the
    /// snapshot's image holds nothing of its source's.
    pub state: bool,
    /// Whether its snapshot's source had been seeded (with `state`: no image keeps the marker).
    pub seeded: bool,
    _pins: Vec<Pin<'a>>,
}

/// Where the time of a snapshot went, for the log and the benchmark.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timings {
    pub frozen: Duration,
    /// The commit (in the freeze), or the tag of the base image (before it).
    pub commit: Duration,
    pub copy: Duration,
}

pub struct Snapshots {
    engine: Arc<dyn ContainerEngine>,
    config: Arc<Config>,
    /// What this replica holds against `SNAPSHOT_MAX_BYTES` beyond the records: snapshots being
    /// taken, and forks' payloads (no record says their size) until they are removed.
    ledger: std::sync::Mutex<Ledger>,
    /// The static helper the layer copier runs (`None` in in-process tests: the fake engine
    /// copies itself).
    helper: Option<crate::shared_file::SharedFile>,
    /// Whether this engine mounts overlay volumes (see `probe`).
    probe: probe::Probe,
    /// Per image and sandbox users: whether they can write nothing outside the state
    /// directories (see `Snapshots::commits_nothing`).
    writable: std::sync::Mutex<HashMap<String, bool>>,
    /// This replica's layer workers, by image id (see `worker`).
    workers: tokio::sync::Mutex<HashMap<String, worker::Worker>>,
    /// Layers whose stacks are to be flattened, with an image their copier can run (see
    /// `flatten`), and the flattener's wake-up.
    flattening: std::sync::Mutex<HashMap<String, String>>,
    flatten_wake: tokio::sync::Notify,
}

impl Snapshots {
    pub fn new(
        engine: Arc<dyn ContainerEngine>,
        config: Arc<Config>,
        helper: Option<crate::shared_file::SharedFile>,
    ) -> Self {
        Self {
            engine,
            config,
            ledger: std::sync::Mutex::default(),
            helper,
            probe: probe::Probe::default(),
            writable: std::sync::Mutex::default(),
            workers: tokio::sync::Mutex::default(),
            flattening: std::sync::Mutex::default(),
            flatten_wake: tokio::sync::Notify::new(),
        }
    }

    pub(super) fn labels(&self, role: &str, id: &str) -> HashMap<String, String> {
        HashMap::from([
            (MANAGED_LABEL.to_string(), "true".to_string()),
            (ROLE_LABEL.to_string(), role.to_string()),
            (DEPLOYMENT_LABEL.to_string(), self.config.deployment.clone()),
            (SNAPSHOT_LABEL.to_string(), id.to_string()),
        ])
    }

    pub(super) fn mine<'a>(&'a self, role: &'a str) -> [(&'a str, &'a str); 2] {
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
            None,
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
