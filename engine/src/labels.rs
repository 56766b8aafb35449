//! The labels every Docker object the service creates carries: how sessions, their egress
//! parts, pool members and snapshots are found again without a database.

/// Label carried by every container the service creates; sessions are found again through it, so
/// a restarted control plane needs no database.
pub const MANAGED_LABEL: &str = "daiv.sandbox.managed";
/// What a managed container is: [`ROLE_SANDBOX`] or the egress sidecar.
pub const ROLE_LABEL: &str = "daiv.sandbox.role";
pub const ROLE_SANDBOX: &str = "sandbox";
pub const ROLE_EGRESS_GATEWAY: &str = "egress-gateway";
pub const ROLE_EGRESS_NETWORK: &str = "egress-network";
/// The deployment (`DAIV_SANDBOX_DEPLOYMENT`) that created a container or network.
pub const DEPLOYMENT_LABEL: &str = "daiv.sandbox.deployment";
/// Base image the session was asked for (diagnostics and the reaper's logs).
pub const IMAGE_LABEL: &str = "daiv.sandbox.image";
/// The memory limit (bytes) a sandbox was created with, when it has one: what a fleet's engine
/// counts against its `memory_bytes` without an inspect per session.
pub const MEMORY_LABEL: &str = "daiv.sandbox.memory";
/// Token shared by the three parts of an egress session (sandbox, gateway, internal network), so
/// each can be found from the others and orphans can be swept.
pub const EGRESS_LABEL: &str = "daiv.sandbox.egress";
/// Unix milliseconds a sandbox was created at: the listing's order within one second (Docker's
/// own creation time, in a listing, has whole seconds).
pub const CREATED_MS_LABEL: &str = "daiv.sandbox.created-ms";
/// `uid:gid` of the sandbox's helper, on sandboxes whose helper has a uid of its own (see
/// `sandbox_helper::identity`); its channel is opened as root with this and
/// [`SANDBOX_USER_LABEL`]. Sandboxes without it (created by earlier versions) run their helper as
/// the sandbox user.
pub const HELPER_USER_LABEL: &str = "daiv.sandbox.helper-user";
/// `uid:gid` commands run as in the sandbox ([`SandboxUser`]); on a snapshot's record, the user
/// its files belong to.
pub const SANDBOX_USER_LABEL: &str = "daiv.sandbox.sandbox-user";

/// The user a sandbox's commands run as, as [`SANDBOX_USER_LABEL`] says it: `uid:gid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxUser {
    pub uid: u32,
    pub gid: u32,
}

impl SandboxUser {
    /// The user of a [`SANDBOX_USER_LABEL`] value.
    pub fn parse(label: &str) -> Option<Self> {
        let (u, g) = label.split_once(':')?;
        Some(Self {
            uid: u.parse().ok()?,
            gid: g.parse().ok()?,
        })
    }
}

impl std::fmt::Display for SandboxUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.uid, self.gid)
    }
}
/// On a snapshot's Docker objects: the snapshot id; on a session made from a snapshot: the
/// snapshot it was made from (see the control plane's `snapshots`).
pub const SNAPSHOT_LABEL: &str = "daiv.sandbox.snapshot";
/// On a session whose workspace is a copy-on-write overlay over a snapshot, and on the overlay's
/// volumes: the token naming those volumes, so they go with the session.
pub const WORKSPACE_LABEL: &str = "daiv.sandbox.workspace";
/// On a session whose writable directories are all on volumes of its own (`layout::STATE`), so
/// that a snapshot of it copies them and commits nothing: [`STATE_VOLUMES`].
pub const STATE_LABEL: &str = "daiv.sandbox.state";
pub const STATE_VOLUMES: &str = "volumes";
pub const ROLE_SNAPSHOT: &str = "snapshot";
pub const ROLE_SNAPSHOT_DATA: &str = "snapshot-data";
pub const ROLE_WORKSPACE: &str = "workspace";
/// On a warm-pool member: which pool (`isolated` or `egress`) it was made for. Labels cannot
/// change after create, so whether a member was claimed is told by its name (see
/// the control plane's `pool`).
pub const POOL_LABEL: &str = "daiv.sandbox.pool";
/// On a warm-pool member: a hash of everything its spec was built from (image, runtime, user,
/// limits, helper, egress settings); a member whose hash is not the current one is replaced.
pub const POOL_SPEC_LABEL: &str = "daiv.sandbox.pool.spec";
/// On a sandbox: its CPU limit in nano-CPUs, when it has one (with [`MEMORY_LABEL`], what the
/// session listing reports without an inspect per session).
pub const CPUS_LABEL: &str = "daiv.sandbox.cpus";
/// A session's record (a volume of this role): what a caller attached to a session after the
/// container was made (its metadata, its deadline), where every replica and a restart see it.
pub const ROLE_SESSION_RECORD: &str = "session-record";
/// On a session's record: the session id.
pub const SESSION_LABEL: &str = "daiv.sandbox.session";
/// On a session's record: its metadata, a JSON object of strings.
pub const METADATA_LABEL: &str = "daiv.sandbox.metadata";
/// On a session's record: Unix seconds after which the reaper ends the session.
pub const DEADLINE_LABEL: &str = "daiv.sandbox.deadline";
/// On a session's record: what ending means (`remove` or `pause`).
pub const ON_TIMEOUT_LABEL: &str = "daiv.sandbox.on-timeout";
/// On a session's record: the length in seconds of the deadline last set (at create or by a
/// timeout), what a thaw arms again after the deadline paused the session.
pub const TIMEOUT_LABEL: &str = "daiv.sandbox.timeout";
/// On a session's record: `true` once its deadline paused it (the deadline is then cleared; the
/// thaw that follows arms a new one).
pub const DEADLINE_PAUSED_LABEL: &str = "daiv.sandbox.deadline-paused";
/// On a session's record: Unix milliseconds it was written; the newest record of a session is
/// its record (a deadline moves by writing a new one, then removing the old).
pub const WRITTEN_LABEL: &str = "daiv.sandbox.written";
