//! Building a sandbox: what a cold create and a warm-pool member have in common.
//!
//! [`SandboxFactory`] validates a create request, writes the container spec of its sandbox
//! (isolation defaults, the workspace skeleton with the helper, the environment) and builds one:
//! the image (pulled when missing), the container, and for egress the whole triad through
//! [`Egress::create`]. The cold path of `POST /session/` and the pool's refill both build here, so
//! a claimed member and a cold session are the same container.
//!
//! A sandbox is one container labelled [`MANAGED_LABEL`]; its id is the session id. Everything
//! the service needs to know about it is on its labels. Docker round trips of a build: inspect
//! image + create + put skeleton + start (4); for egress, see [`crate::egress`].
//!
//! The caller's `environment` is never in the container's config (its `Env`, its labels), which
//! a `docker commit` keeps in the image twice (the image's config, and the committing
//! container's own as `container_config`), nor in its layer: it is a file
//! ([`layout::ENV_FILE`]) on the session's own anonymous volume ([`layout::SESSION_DIR`]), written
//! by the skeleton at a create (no round trip of its own) and by the claim of a warm-pool member,
//! read by the helper for every command and background process. A snapshot keeps none of it; a
//! fork reads it from the source's file and gets a file of its own.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use shared_policy::PolicyFile;

use crate::api::StartSessionRequest;
use crate::archive::{Archive, Part, ROOT, entry_name};
use crate::config::Config;
use crate::egress::{self, Egress, Reservation, SandboxPlan};
use crate::engine::{
    CPUS_LABEL, CREATED_MS_LABEL, ContainerEngine, ContainerSpec, DEPLOYMENT_LABEL,
    HELPER_USER_LABEL, IMAGE_LABEL, MANAGED_LABEL, MEMORY_LABEL, NetworkAttach, ROLE_LABEL,
    ROLE_SANDBOX, ROLE_SNAPSHOT, SANDBOX_USER_LABEL, SNAPSHOT_LABEL, STATE_LABEL, STATE_VOLUMES,
    SandboxUser, WORKSPACE_LABEL,
};
use crate::layout;
use crate::shared_file::SharedFile;
use crate::snapshots::{Snapshot, SnapshotError, Snapshots, Workspace};
use shared_helper::{Mounted, SharedHelper};

mod error;
pub mod shared_helper;
mod users;
mod validation;

pub use error::SessionError;
pub use users::{SandboxUsers, UserError};
pub use validation::ValidationError;
use validation::validate_start;

pub use crate::layout::HOME;

/// Docker's own lower bound for a memory limit.
pub const MIN_MEMORY_BYTES: i64 = 6 * 1024 * 1024;

/// Longest per-command timeout a request may ask for (a week); larger values overflow deadline
/// arithmetic and mean "none" anyway, which `0` says.
pub const MAX_TIMEOUT_SECS: u64 = 7 * 24 * 3600;

/// A sandbox's name and extra labels (a warm-pool member's); a cold session has neither.
#[derive(Debug, Clone)]
pub struct Naming {
    pub name: String,
    pub labels: Vec<(String, String)>,
}

/// A create's egress policy, checked, with the egress that builds its triad: whether egress is
/// configured here is asked once per request ([`SandboxFactory::validate`], or a fork's source),
/// never again per build.
pub struct EgressPolicy {
    pub egress: Arc<Egress>,
    pub policy: PolicyFile,
}

/// Builds sandboxes (see the module docs).
pub struct SandboxFactory {
    engine: Arc<dyn ContainerEngine>,
    snapshots: Arc<Snapshots>,
    config: Arc<Config>,
    /// `None` when no egress CA is configured: egress sessions are then refused with 400.
    egress: Option<Arc<Egress>>,
    /// The static helper binary every sandbox gets in its skeleton (`None` only in-process
    /// tests, whose fake engine runs a host build of the helper): a private copy on disk, read
    /// as each skeleton is sent, never held in memory.
    helper: Option<SharedFile>,
    /// Who each new sandbox's commands run as.
    users: SandboxUsers,
    /// The service's part of every sandbox's skeleton (its directories and the helper), built on
    /// first use and shared. Its parts hold `helper` itself, the file, not its bytes: the
    /// binary (3.7 MB) is read from the kernel's cache as each create sends it, and is never
    /// in the service's memory, however many creates are in flight (held whole, it was most of
    /// an idle service's private memory). The sandbox user's directories go before it and the sandbox's own
    /// files (its environment, egress files) after it, each a small part of its own
    /// ([`ContainerSpec::skeleton`]'s parts). Its entries carry the time it was built, not the
    /// session's.
    service_skeleton: OnceLock<Vec<Part>>,
    /// The engine's one copy of `helper`, which sandboxes mount instead of carrying their own
    /// (`None` without a helper).
    shared_helper: Option<Arc<SharedHelper>>,
}

impl SandboxFactory {
    pub fn new(
        engine: Arc<dyn ContainerEngine>,
        config: Arc<Config>,
        egress: Option<Arc<Egress>>,
        helper: Option<SharedFile>,
    ) -> Self {
        let sessions = &config.sessions;
        let users = SandboxUsers::new(
            SandboxUser {
                uid: sessions.run_uid,
                gid: sessions.run_gid,
            },
            sessions.run_uid_range,
        );
        let shared_helper = helper
            .clone()
            .map(|h| Arc::new(SharedHelper::new(engine.clone(), h, &config.deployment)));
        Self {
            shared_helper,
            snapshots: Arc::new(Snapshots::new(
                engine.clone(),
                config.clone(),
                helper.clone(),
            )),
            engine,
            config,
            egress,
            helper,
            users,
            service_skeleton: OnceLock::new(),
        }
    }

    pub fn snapshots(&self) -> &Arc<Snapshots> {
        &self.snapshots
    }

    pub fn engine(&self) -> &Arc<dyn ContainerEngine> {
        &self.engine
    }

    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    pub fn egress(&self) -> Option<&Arc<Egress>> {
        self.egress.as_ref()
    }

    /// The helper binary sandboxes get.
    pub fn helper(&self) -> Option<&SharedFile> {
        self.helper.as_ref()
    }

    /// The engine's shared copy of the helper (the reaper sweeps its other builds).
    pub fn shared_helper(&self) -> Option<&Arc<SharedHelper>> {
        self.shared_helper.as_ref()
    }

    /// The shared helper a sandbox of `image` mounts; `None` (the sandbox then gets its own
    /// copy, as before there was one) when there is no helper or it cannot be written.
    async fn mounted_helper(&self, image: &str) -> Option<Mounted> {
        let shared = self.shared_helper.as_ref()?;
        match shared.ensure(image).await {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::warn!(error = %e, "shared helper unavailable; the sandbox gets its own copy");
                None
            }
        }
    }

    /// The egress of this instance, or the 400 of a request for egress where none is configured.
    pub fn egress_or_400(&self) -> Result<&Arc<Egress>, ValidationError> {
        self.egress
            .as_ref()
            .ok_or(ValidationError::EgressNotConfigured)
    }

    /// Checks a create request before anything is asked of the engine; its egress policy, parsed
    /// and validated, with the egress that enforces it, when it has one.
    pub fn validate(
        &self,
        req: &StartSessionRequest,
    ) -> Result<Option<EgressPolicy>, SessionError> {
        validate_start(req)?;
        match &req.egress {
            Some(body) => Ok(Some(EgressPolicy {
                egress: self.egress_or_400()?.clone(),
                policy: egress::parse_policy(body)?,
            })),
            None => Ok(None),
        }
    }

    /// Creates and starts a sandbox: isolated, or with its triad when `egress` gives the policy
    /// (and its egress) and the reserved token naming the triad's parts; named by `naming` if
    /// given. Nothing is left behind when a step fails.
    ///
    /// `from` makes the sandbox from a snapshot: its image, and a copy-on-write workspace over
    /// the snapshot's (removed again when the build fails).
    pub async fn build(
        &self,
        req: &StartSessionRequest,
        egress: Option<(&EgressPolicy, &Reservation)>,
        naming: Option<&Naming>,
        from: Option<&Snapshot>,
    ) -> Result<String, SessionError> {
        let Some(snapshot) = from else {
            return self.build_on(req, egress, naming, None).await;
        };
        let workspace = self.snapshots.workspace(snapshot).await?;
        let built = self
            .build_on(req, egress, naming, Some((snapshot, &workspace)))
            .await;
        match built {
            Ok(id) => Ok(id),
            Err(e) => {
                self.snapshots.remove_workspace(&workspace.token).await;
                // The engine's 404 here is the snapshot's image, deleted meanwhile.
                Err(match e {
                    SessionError::NotFound
                    | SessionError::Engine(crate::engine::EngineError::NotFound) => {
                        SnapshotError::NotFound.into()
                    }
                    e => e,
                })
            }
        }
    }

    async fn build_on(
        &self,
        req: &StartSessionRequest,
        egress: Option<(&EgressPolicy, &Reservation)>,
        naming: Option<&Naming>,
        from: Option<(&Snapshot, &Workspace<'_>)>,
    ) -> Result<String, SessionError> {
        // A snapshot's files are its source's user's: sessions from it run as that user.
        let user = match from {
            Some((s, _)) => s.user.unwrap_or(self.users.fixed()),
            None => self.users.pick(&*self.engine).await?,
        };
        let named = |mut spec: ContainerSpec| {
            if let Some((snapshot, workspace)) = from {
                spec.image = snapshot.image();
                // Its writable directories are the workspace's overlays; a snapshot from before
                // `SNAPSHOT_STATE=volumes` has all but `/workspace` in its image.
                spec.volumes
                    .retain(|v| !layout::STATE.iter().any(|(_, p)| p == v));
                spec.named_volumes = workspace.mounts.clone();
                if workspace.state {
                    spec.labels
                        .insert(STATE_LABEL.to_string(), STATE_VOLUMES.to_string());
                } else {
                    spec.labels.remove(STATE_LABEL);
                }
                spec.labels
                    .insert(SNAPSHOT_LABEL.to_string(), snapshot.id.clone());
                spec.labels
                    .insert(WORKSPACE_LABEL.to_string(), workspace.token.clone());
                // The snapshot's workspace is already there: its directories keep their owners
                // and modes. Only the helper (this build's) and the service's files are put.
                if let Some(head) = spec.skeleton.first_mut() {
                    *head = snapshot_user_dirs(user, workspace).into();
                }
            }
            if let Some(n) = naming {
                spec.name = Some(n.name.clone());
                spec.labels.extend(n.labels.iter().cloned());
            }
            spec
        };
        if from.is_none() {
            self.ensure_base_image(&req.base_image).await?;
        }
        let image = from.map_or_else(|| req.base_image.clone(), |(s, _)| s.image());
        let helper = self.mounted_helper(&image).await;
        let helper = helper.as_ref();
        let Some((plan, reservation)) = egress else {
            let spec = named(self.spec(req, None, user, helper));
            let mut id = self.engine.create(&spec).await?;
            // The shared helper removed between its check and this create (another replica's
            // stop, by hand) was made again by the engine, empty: this sandbox gets its own copy.
            if let (Some(_), Some(shared)) = (helper, &self.shared_helper)
                && !shared.still_ours().await
            {
                tracing::warn!("shared helper went during a create; the sandbox gets its own copy");
                let _ = self.engine.remove(&id).await;
                id = self
                    .engine
                    .create(&named(self.spec(req, None, user, None)))
                    .await?;
            }
            if let Err(e) = self.engine.start(&id).await {
                let _ = self.engine.remove(&id).await;
                return Err(e.into());
            }
            return Ok(id);
        };
        // A pool member's gateway gets the helper: its claim installs the policy with it.
        let gateway_helper = naming.and(self.helper.as_ref());
        plan.egress
            .create(
                reservation.token(),
                &plan.policy,
                gateway_helper,
                |sandbox| named(self.spec(req, Some(sandbox), user, helper)),
            )
            .await
            .map_err(Into::into)
    }

    /// Makes the base image available, refusing a snapshot's image however it is named: a
    /// snapshot is reached only through `snapshot_id`, which checks the deployment.
    async fn ensure_base_image(&self, image: &str) -> Result<(), SessionError> {
        // A snapshot that committed nothing is its base image by another name, without labels.
        let repository = image.rsplit_once(':').map_or(image, |(r, _)| r);
        if repository == crate::snapshots::IMAGE_REPOSITORY {
            return Err(ValidationError::SnapshotAsImage.into());
        }
        let found = self.engine.ensure_image(image).await?;
        let snapshot = found.labels.get(ROLE_LABEL).map(String::as_str) == Some(ROLE_SNAPSHOT)
            || found
                .labels
                .get(SNAPSHOT_LABEL)
                .is_some_and(|v| !v.is_empty());
        if snapshot {
            return Err(ValidationError::SnapshotAsImage.into());
        }
        Ok(())
    }

    /// `uid:gid` the helper takes for itself.
    fn helper_user(&self) -> String {
        let h = self.config.sessions.helper_uid;
        format!("{h}:{h}")
    }

    /// The container spec of a sandbox: isolation defaults, workspace skeleton and environment.
    /// The container's own environment is the service's (home, and `extra_env`: the egress proxy
    /// settings); the caller's is in the skeleton's environment file (see the module's doc),
    /// on top of it, where the egress settings still win.
    pub fn spec(
        &self,
        req: &StartSessionRequest,
        plan: Option<&SandboxPlan>,
        user: SandboxUser,
        helper: Option<&Mounted>,
    ) -> ContainerSpec {
        let (network, extra_env, extra_labels, extra_files) = match plan {
            Some(p) => (p.network.clone(), &p.env[..], &p.labels[..], &p.files[..]),
            None => (NetworkAttach::None, &[][..], &[][..], &[][..]),
        };
        let c = &self.config;
        let mut env: Vec<(String, String)> = base_env();
        for (k, v) in extra_env {
            env.retain(|(ek, _)| ek != k);
            env.push((k.clone(), v.clone()));
        }
        let mut labels = HashMap::from([
            (MANAGED_LABEL.to_string(), "true".to_string()),
            (ROLE_LABEL.to_string(), ROLE_SANDBOX.to_string()),
            (IMAGE_LABEL.to_string(), req.base_image.clone()),
            (DEPLOYMENT_LABEL.to_string(), c.deployment.clone()),
            (HELPER_USER_LABEL.to_string(), self.helper_user()),
            (SANDBOX_USER_LABEL.to_string(), user.to_string()),
            (
                CREATED_MS_LABEL.to_string(),
                crate::time::unix_millis().to_string(),
            ),
        ]);
        if let Some(m) = req.memory_bytes {
            labels.insert(MEMORY_LABEL.to_string(), m.to_string());
        }
        let nano_cpus = req.cpus.map(crate::api::nano_cpus);
        if let Some(c) = nano_cpus {
            labels.insert(CPUS_LABEL.to_string(), c.to_string());
        }
        labels.extend(extra_labels.iter().cloned());
        // Everything the sandbox user can write on volumes of its own: a snapshot copies them
        // and commits nothing (see `snapshots`).
        let state = c.snapshots.state == crate::config::SnapshotState::Volumes;
        if state {
            labels.insert(STATE_LABEL.to_string(), STATE_VOLUMES.to_string());
        }
        ContainerSpec {
            name: None,
            image: req.base_image.clone(),
            // The image's entrypoint would wrap the keep-alive in something unknown. The helper
            // keeps the container alive: no shell needed, so shell-less images work.
            entrypoint: Some(Vec::new()),
            cmd: Some(vec![
                layout::HELPER.into(),
                "init".into(),
                "--user".into(),
                user.to_string(),
                "--helper-user".into(),
                self.helper_user(),
            ]),
            env,
            labels,
            // Root only until the helper takes its own uid, first thing (see
            // `sandbox_helper::identity`); commands and processes run as `RUN_UID:RUN_GID`.
            user: Some("0:0".to_string()),
            // What the helper keeps: starting commands as the sandbox user, killing their
            // process groups. A command has none of them after its `execve`.
            cap_add: ["SETUID", "SETGID", "KILL"].map(String::from).to_vec(),
            // Without an IPv6 address, the host's link-local address on the session's bridge is
            // unreachable whatever the engine's version does by default.
            sysctls: vec![(
                "net.ipv6.conf.all.disable_ipv6".to_string(),
                "1".to_string(),
            )],
            // tini as PID 1: forwards SIGTERM (prompt stops) and reaps orphaned zombies.
            init: true,
            runtime: c.sessions.runtime.as_str().to_string(),
            memory_bytes: req.memory_bytes,
            nano_cpus,
            pids_limit: c.sessions.pids_limit,
            network,
            // The workspace on a volume: no copy-up, no overlay lookups (on fuse-overlayfs, grep
            // and extraction are 5-20x faster there). The session's own state (the caller's
            // environment) on another, outside the layer a snapshot commits. Anonymous: removed
            // with the container.
            volumes: [layout::WORKSPACE, layout::SESSION_DIR]
                .into_iter()
                .chain(
                    state
                        .then_some(&layout::STATE[1..])
                        .into_iter()
                        .flatten()
                        .map(|(_, p)| *p),
                )
                .map(String::from)
                .collect(),
            named_volumes: Vec::new(),
            read_only_volumes: helper.map(Mounted::mount).into_iter().collect(),
            host_dirs: Vec::new(),
            log_options: Vec::new(),
            auto_remove: false,
            skeleton: [user_dirs(user, state).into()]
                .into_iter()
                .chain(self.service_skeleton(helper))
                .chain([skeleton_tail(
                    &env_json(req.environment.as_deref(), plan.is_some()).unwrap_or_default(),
                    extra_files,
                )
                .into()])
                .collect(),
        }
    }

    /// The service's part of a sandbox's skeleton: with a link to the shared helper `helper`,
    /// or else with its own copy (see [`service_skeleton`]).
    fn service_skeleton(&self, helper: Option<&Mounted>) -> Vec<Part> {
        if let Some(m) = helper {
            return linked_service_skeleton(m);
        }
        let build = || service_skeleton(self.helper.as_ref());
        self.service_skeleton.get_or_init(build).clone()
    }
}

/// The first part of the skeleton of a sandbox from a snapshot: the workspace's root (a fresh
/// overlay's root is root's). The workspace's own directories come from the snapshot; the
/// service's part and the tail are any sandbox's.
fn snapshot_user_dirs(user: SandboxUser, workspace: &Workspace<'_>) -> Bytes {
    let mut tar = Archive::new();
    tar.dir(entry_name(layout::WORKSPACE), 0o755, (user.uid, user.gid));
    if workspace.state {
        // Each overlay's root is its fresh upper's: the roots are set as a new sandbox's are;
        // and the seed marker, which the service wrote and no layer holds, is written again.
        tar.dir(entry_name(layout::HOME), 0o755, (user.uid, user.gid));
        tar.dir(entry_name(layout::E2B_HOME), 0o755, (user.uid, user.gid));
        shared_tmp(&mut tar);
        if workspace.seeded {
            tar.dir(entry_name(layout::SERVICE_DIR), 0o755, ROOT);
            tar.file(entry_name(layout::SEED_MARKER), 0o644, ROOT, b"");
        }
    }
    tar.finish_head().unwrap_or_default()
}

/// [`layout::SHARED_TMP`], `root:root` `1777`.
fn shared_tmp(tar: &mut Archive) {
    for dir in layout::SHARED_TMP {
        tar.dir(entry_name(dir), 0o1777, ROOT);
    }
}

/// The caller's environment as the helper reads it from [`layout::ENV_FILE`] (a JSON list of
/// pairs), minus what the egress settings set for an egress session (they win); `None` when
/// that leaves nothing. The one rule a create's skeleton and a warm-pool claim both apply.
pub fn env_json(
    environment: Option<&std::collections::BTreeMap<String, String>>,
    egress: bool,
) -> Option<Bytes> {
    let env: Vec<(&String, &String)> = egress::caller_env(environment, egress).collect();
    if env.is_empty() {
        return None;
    }
    serde_json::to_vec(&env).ok().map(Bytes::from)
}

/// The names [`base_env`] sets.
pub const BASE_ENV_NAMES: [&str; 5] = [
    "HOME",
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "XDG_DATA_HOME",
    "XDG_STATE_HOME",
];

/// HOME and XDG locations: tools such as uv, npm and pip need a writable home.
fn base_env() -> Vec<(String, String)> {
    [
        ("HOME", HOME.to_string()),
        ("XDG_CONFIG_HOME", format!("{HOME}/.config")),
        ("XDG_CACHE_HOME", format!("{HOME}/.cache")),
        ("XDG_DATA_HOME", format!("{HOME}/.local/share")),
        ("XDG_STATE_HOME", format!("{HOME}/.local/state")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The head of a sandbox's skeleton: [`user_dirs`], then [`service_skeleton`]. Without its end:
/// [`skeleton_tail`] follows it.
pub fn skeleton_head(uid: u32, gid: u32, helper: Option<&SharedFile>) -> std::io::Result<Bytes> {
    let mut parts = vec![user_dirs(SandboxUser { uid, gid }, false).into()];
    parts.extend(service_skeleton(helper));
    crate::archive::concat(&parts)
}

/// The first part of a sandbox's skeleton: `/workspace/{repo,skills,tmp}` and the home
/// directory, owned by the sandbox user through the archive entries themselves (no `chown` runs
/// in the container: gVisor gives `exec -u root` no capabilities). Without its end.
fn user_dirs(user: SandboxUser, state: bool) -> Bytes {
    let (uid, gid) = (user.uid, user.gid);
    let dirs = [
        layout::WORKSPACE,
        layout::REPO,
        layout::SKILLS,
        layout::TMP,
        "/home/sandbox",
        "/home/sandbox/.config",
        "/home/sandbox/.cache",
        "/home/sandbox/.local",
        "/home/sandbox/.local/share",
        "/home/sandbox/.local/state",
    ];
    let mut tar = Archive::new();
    for dir in dirs {
        tar.dir(entry_name(dir), 0o755, (uid, gid));
    }
    if state {
        tar.dir(entry_name(layout::E2B_HOME), 0o755, (uid, gid));
        shared_tmp(&mut tar);
    }
    // The names are constants: nothing `tar` refuses.
    tar.finish_head().unwrap_or_default()
}

/// The service's part of a sandbox's skeleton, the same for every sandbox. Without its end.
fn service_skeleton(helper: Option<&SharedFile>) -> Vec<Part> {
    let mut tar = Archive::new();
    service_dirs(&mut tar, helper);
    tar.finish_head_parts().unwrap_or_default()
}

/// The service's part of a sandbox's skeleton when it mounts the shared helper: the helper is a
/// root-owned link into the read-only volume. Without its end.
fn linked_service_skeleton(helper: &Mounted) -> Vec<Part> {
    let mut tar = Archive::new();
    service_dirs(&mut tar, None);
    tar.symlink(entry_name(layout::HELPER), &helper.target(), ROOT);
    tar.finish_head_parts().unwrap_or_default()
}

/// The service's own directory and the helper: root-owned, so the sandbox user can run the
/// helper but never replace it (it serves every fs op); and the session's directory (its own
/// volume), root-owned too.
fn service_dirs(tar: &mut Archive, helper: Option<&SharedFile>) {
    tar.dir(entry_name(layout::SERVICE_DIR), 0o755, ROOT);
    tar.dir(entry_name(layout::SESSION_DIR), 0o755, ROOT);
    // The service's one copy of the helper, not a copy per archive (3.7 MB).
    if let Some(bin) = helper {
        tar.shared_file(entry_name(layout::HELPER), 0o755, ROOT, bin.clone());
    }
}

/// The tail of a sandbox's skeleton, its own: the caller's environment `env_json` (`[]` when
/// empty: whatever the image holds there is never this session's) and `root_files` (the egress
/// plan's), root-owned and world-readable: the sandbox user can read but not replace them.
pub fn skeleton_tail(env_json: &[u8], root_files: &[(String, Bytes)]) -> Bytes {
    let env: &[u8] = if env_json.is_empty() { b"[]" } else { env_json };
    let mut tar = Archive::new();
    tar.file(entry_name(layout::ENV_FILE), 0o644, ROOT, env);
    for (path, data) in root_files {
        tar.file(path, 0o644, ROOT, data);
    }
    // The names are constants or the egress plan's paths: nothing `tar` refuses.
    tar.finish().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skeleton_entries_carry_the_sandbox_owner() -> std::io::Result<()> {
        let tar_bytes = [
            skeleton_head(1234, 5678, Some(&SharedFile::from_bytes(b"bin")?))?,
            skeleton_tail(br#"[["A","1"]]"#, &[]),
        ]
        .concat();
        let mut archive = tar::Archive::new(&tar_bytes[..]);
        let mut names = Vec::new();
        for entry in archive.entries()? {
            let mut entry = entry?;
            let name = entry.path()?.display().to_string();
            if name == entry_name(layout::ENV_FILE) {
                let mut env = String::new();
                std::io::Read::read_to_string(&mut entry, &mut env)?;
                assert_eq!(env, r#"[["A","1"]]"#);
            }
            if name.starts_with(entry_name(layout::SERVICE_DIR)) {
                // The helper and its directory stay root's: the sandbox cannot swap them.
                assert_eq!(entry.header().uid()?, 0, "{name}");
            } else {
                assert_eq!(entry.header().uid()?, 1234);
                assert_eq!(entry.header().gid()?, 5678);
            }
            names.push(name);
        }
        for service_file in [layout::HELPER, layout::SESSION_DIR, layout::ENV_FILE] {
            assert!(
                names
                    .iter()
                    .any(|n| n.trim_end_matches('/') == entry_name(service_file)),
                "{names:?}"
            );
        }
        for expected in [
            "workspace/repo",
            "workspace/skills",
            "workspace/tmp",
            "home/sandbox",
        ] {
            assert!(
                names.iter().any(|n| n.trim_end_matches('/') == expected),
                "{names:?}"
            );
        }
        // Nothing the caller gave: the file is still written, empty.
        let tail = skeleton_tail(b"", &[]);
        let mut archive = tar::Archive::new(&tail[..]);
        let mut entry = archive
            .entries()?
            .next()
            .ok_or(std::io::ErrorKind::NotFound)??;
        let mut env = String::new();
        std::io::Read::read_to_string(&mut entry, &mut env)?;
        assert_eq!(env, "[]");
        Ok(())
    }
}
