//! Session lifecycle and command execution, over [`ContainerEngine`] only.
//!
//! A session is one container labelled [`MANAGED_LABEL`]; its id is the container id. All state
//! lives in the container and its labels, so any replica (or a restarted control plane) can serve
//! any session.
//!
//! Docker round trips per operation: create = inspect image + create + put skeleton + start (4);
//! each command = exec create + exec start + exec inspect (3), plus one more exec to kill the
//! process group on timeout; status = inspect (+ start when stopped); close = inspect + stop/remove.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::api::{RunRequest, RunResponse, StartSessionRequest};
use crate::archive::{Archive, ROOT, entry_name};
use crate::config::Config;
use crate::egress::{self, Egress, SandboxPlan, Triad};
use crate::engine::{
    ContainerEngine, ContainerInfo, ContainerSpec, DEPLOYMENT_LABEL, EngineError,
    HELPER_USER_LABEL, IMAGE_LABEL, MANAGED_LABEL, NetworkAttach, ROLE_LABEL, ROLE_SANDBOX,
    SANDBOX_USER_LABEL,
};
use crate::ids::is_container_id;
use crate::layout;
use crate::pool::{MemberTag, Pool};
use crate::runtime::{HelperRuntime, RunSpec, SessionRuntime};
use crate::telemetry::metrics::Metrics;
use shared_policy::PolicyFile;

mod error;

pub use error::SessionError;

/// Home of the sandbox user: writable, outside the workspace so seeds and `git status` stay clean.
pub const HOME: &str = "/home/sandbox";

/// Exit code of a command killed at its timeout (as coreutils' `timeout`).
pub const TIMEOUT_EXIT_CODE: i64 = crate::runtime::TIMEOUT_EXIT_CODE;

/// Longest per-command timeout a request may ask for (a week); larger values overflow deadline
/// arithmetic and mean "none" anyway, which `0` says.
pub const MAX_TIMEOUT_SECS: u64 = 7 * 24 * 3600;

pub struct Sessions {
    pub(crate) engine: Arc<dyn ContainerEngine>,
    runtime: Arc<dyn SessionRuntime>,
    /// The static helper binary every sandbox gets in its skeleton (`None` only in-process
    /// tests, whose fake engine runs a host build of the helper).
    pub(crate) helper: Option<Bytes>,
    pub(crate) config: Arc<Config>,
    /// `None` when no egress CA is configured: egress sessions are then refused with 400.
    pub(crate) egress: Option<Egress>,
    /// The warm pool (inert when none is configured).
    pub(crate) pool: Pool,
    /// The skeleton of every sandbox without files of its own (all but egress ones), built on
    /// first use and shared: the helper binary is most of it (~3 MB, ~6 MB while the archive
    /// grows), and a burst of creates each building its own copy made the service's peak memory
    /// grow with the burst. Its entries carry the time it was built, not the session's.
    shared_skeleton: std::sync::OnceLock<Bytes>,
}

/// Docker's own lower bound for a memory limit.
pub(crate) const MIN_MEMORY_BYTES: i64 = 6 * 1024 * 1024;

impl Sessions {
    pub fn new(
        engine: Arc<dyn ContainerEngine>,
        config: Arc<Config>,
        egress: Option<Egress>,
        helper: Option<Bytes>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let runtime = Arc::new(HelperRuntime::new(
            engine.clone(),
            config.sessions.run_uid,
            config.sessions.run_gid,
        ));
        let pool = Pool::new(&config, helper.as_ref(), egress.as_ref(), metrics);
        Self {
            engine,
            runtime,
            helper,
            config,
            egress,
            pool,
            shared_skeleton: std::sync::OnceLock::new(),
        }
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub fn engine(&self) -> &dyn ContainerEngine {
        &*self.engine
    }

    /// Whether sandboxes get the helper (the service refuses to start without it).
    pub fn has_helper(&self) -> bool {
        self.helper.is_some()
    }

    pub fn runtime(&self) -> &dyn SessionRuntime {
        &*self.runtime
    }

    /// Opens the session's helper channel in the background: the first command or fs op then
    /// finds it ready instead of paying for the exec that opens it.
    pub(crate) fn warm(&self, id: &str) {
        let runtime = self.runtime.clone();
        let id = id.to_string();
        tokio::spawn(async move { runtime.warm(&id).await });
    }

    /// `uid:gid` commands run as.
    fn user(&self) -> String {
        format!(
            "{}:{}",
            self.config.sessions.run_uid, self.config.sessions.run_gid
        )
    }

    /// `uid:gid` the helper takes for itself.
    fn helper_user(&self) -> String {
        let h = self.config.sessions.helper_uid;
        format!("{h}:{h}")
    }

    /// Creates and starts a session: a ready warm-pool member when one matches the request
    /// (see [`crate::pool`]), else a cold create; nothing is left behind when any step fails.
    /// `egress_token` names a cold egress triad's parts (unused for an isolated session).
    pub async fn create(
        &self,
        req: &StartSessionRequest,
        egress_token: &str,
    ) -> Result<String, SessionError> {
        validate_start(req)?;
        let policy = match &req.egress {
            Some(body) => {
                self.egress_or_400()?;
                Some(egress::parse_policy(body)?)
            }
            None => None,
        };
        if let Some(id) = self.claim(req, policy.as_ref()).await {
            tracing::info!(session_id = %id, image = %req.base_image, "session claimed from the warm pool");
            self.warm(&id);
            return Ok(id);
        }
        let id = self.build(req, policy.as_ref(), egress_token, None).await?;
        tracing::info!(session_id = %id, image = %req.base_image, egress = policy.is_some(), "session created");
        self.warm(&id);
        Ok(id)
    }

    /// Creates and starts a sandbox (with its triad when `policy` is given): a cold session, or
    /// a pool member with `tag`'s name and labels.
    pub(crate) async fn build(
        &self,
        req: &StartSessionRequest,
        policy: Option<&PolicyFile>,
        egress_token: &str,
        tag: Option<&MemberTag>,
    ) -> Result<String, SessionError> {
        let tagged = |mut spec: ContainerSpec| {
            if let Some(tag) = tag {
                spec.name = Some(tag.name.clone());
                spec.labels.extend(tag.labels.iter().cloned());
            }
            spec
        };
        let Some(policy) = policy else {
            self.engine.ensure_image(&req.base_image).await?;
            let spec = tagged(self.sandbox_spec(req, None));
            let id = self.engine.create(&spec).await?;
            if let Err(e) = self.engine.start(&id).await {
                let _ = self.engine.remove(&id).await;
                return Err(e.into());
            }
            return Ok(id);
        };
        let egress = self.egress_or_400()?;
        self.engine.ensure_image(&req.base_image).await?;
        // A pool member's gateway gets the helper: its claim installs the policy with it.
        let helper = tag.and(self.helper.as_ref());
        egress
            .create(egress_token, policy, helper, |plan| {
                tagged(self.sandbox_spec(req, Some(plan)))
            })
            .await
            .map_err(Into::into)
    }

    pub(crate) fn egress_or_400(&self) -> Result<&Egress, SessionError> {
        self.egress
            .as_ref()
            .ok_or(SessionError::EgressNotConfigured)
    }

    /// `PUT /session/{id}/egress/`: a new policy for a live session, without restarting anything.
    pub async fn refresh_egress(
        &self,
        id: &str,
        body: &serde_json::Value,
    ) -> Result<(), SessionError> {
        let info = self.find(id).await?;
        let Some(triad) = Triad::of(&info) else {
            return Err(SessionError::NoEgressProxy);
        };
        let policy = egress::parse_policy(body)?;
        let egress = self
            .egress
            .as_ref()
            .ok_or(SessionError::EgressUnavailableHere)?;
        egress.refresh(&triad, &policy).await?;
        tracing::info!(session_id = %id, "egress policy refreshed");
        Ok(())
    }

    /// The container spec of a sandbox: isolation defaults, workspace skeleton and environment.
    /// `extra_env` (the egress proxy settings) wins over the caller's environment.
    pub fn sandbox_spec(
        &self,
        req: &StartSessionRequest,
        plan: Option<&SandboxPlan>,
    ) -> ContainerSpec {
        let (network, extra_env, extra_labels, extra_files) = match plan {
            Some(p) => (p.network.clone(), &p.env[..], &p.labels[..], &p.files[..]),
            None => (NetworkAttach::None, &[][..], &[][..], &[][..]),
        };
        let c = &self.config;
        let mut env: Vec<(String, String)> = base_env();
        if let Some(user_env) = &req.environment {
            for (k, v) in user_env {
                env.retain(|(ek, _)| ek != k);
                env.push((k.clone(), v.clone()));
            }
        }
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
            (SANDBOX_USER_LABEL.to_string(), self.user()),
        ]);
        labels.extend(extra_labels.iter().cloned());
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
                self.user(),
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
            nano_cpus: req.cpus.map(|c| (c * 1e9).round() as i64),
            pids_limit: c.sessions.pids_limit,
            network,
            // The workspace on a volume: no copy-up, no overlay lookups (on fuse-overlayfs, grep
            // and extraction are 5-20x faster there). Anonymous: removed with the container.
            volumes: vec![layout::WORKSPACE.to_string()],
            log_options: Vec::new(),
            skeleton: Some(self.skeleton(extra_files)),
        }
    }

    /// The skeleton archive of a sandbox with `extra_files` (the shared one when there are none).
    fn skeleton(&self, extra_files: &[(String, Bytes)]) -> Bytes {
        let (uid, gid) = (self.config.sessions.run_uid, self.config.sessions.run_gid);
        let build = || skeleton_tar(uid, gid, extra_files, self.helper.as_ref());
        if extra_files.is_empty() {
            self.shared_skeleton.get_or_init(build).clone()
        } else {
            build()
        }
    }

    /// The managed sandbox container behind `id`, or 404. Ids are full container ids only: a name
    /// or a prefix could reach a container that is not a session.
    pub async fn find(&self, id: &str) -> Result<ContainerInfo, SessionError> {
        if !is_container_id(id) {
            return Err(SessionError::NotFound);
        }
        let info = self.engine.inspect(id).await?;
        // Another deployment's session is not ours to run, read or delete, even on a shared
        // engine with a shared key: it is simply not found. Nor is a warm-pool member until it
        // is claimed (its name says so: labels cannot change).
        if !info.is_managed()
            || info.labels.get(ROLE_LABEL).map(String::as_str) != Some(ROLE_SANDBOX)
            || info.labels.get(DEPLOYMENT_LABEL) != Some(&self.config.deployment)
            || crate::pool::is_unclaimed(&info)
        {
            return Err(SessionError::NotFound);
        }
        Ok(info)
    }

    /// Starts a stopped session so the next operation finds it warm. An egress session's
    /// gateway is checked even when the sandbox runs: one killed behind the service's back is
    /// started again (its policy file, the latest one, is kept in its container), so the sandbox
    /// never stays cut off.
    pub async fn ensure_running(&self, id: &str) -> Result<ContainerInfo, SessionError> {
        let info = self.find(id).await?;
        let triad = Triad::of(&info);
        if info.is_running() && triad.is_none() {
            return Ok(info);
        }
        // The gateway first, listening before the sandbox's first command runs.
        if let Some(triad) = triad {
            self.egress
                .as_ref()
                .ok_or(SessionError::EgressUnavailableHere)?
                .ensure_gateway(&triad)
                .await?;
        }
        if info.is_running() {
            return Ok(info);
        }
        match self.engine.start(id).await {
            Ok(()) => {
                self.warm(id);
                Ok(info)
            }
            Err(EngineError::NotFound) => Err(SessionError::NotFound),
            Err(e) => Err(SessionError::RestartFailed(e)),
        }
    }

    /// Whether everything the running session `info` needs runs: its gateway, if it has one.
    pub async fn gateway_up(&self, info: &ContainerInfo) -> Result<bool, SessionError> {
        match (Triad::of(info), self.egress.as_ref()) {
            (None, _) => Ok(true),
            (Some(triad), Some(egress)) => Ok(egress.gateway_running(&triad).await?),
            (Some(_), None) => Ok(false),
        }
    }

    /// Stops the session (kept warm for reuse), or removes it with `force`.
    pub async fn close(&self, id: &str, force: bool) -> Result<(), SessionError> {
        let info = self.find(id).await?;
        let triad = Triad::of(&info);
        self.runtime.forget(id);
        let result = if force {
            self.engine.remove(id).await
        } else {
            self.engine
                .stop(id, self.config.sessions.stop_timeout)
                .await
        };
        match result {
            Ok(()) | Err(EngineError::NotFound) => {}
            Err(e) => return Err(e.into()),
        }
        // Removal needs only the engine, so it happens even where egress is not configured.
        match (triad, &self.egress) {
            (Some(triad), _) if force => {
                egress::teardown(&*self.engine, &triad.parts()).await;
            }
            (Some(triad), Some(egress)) => egress.stop(&triad).await,
            _ => {}
        }
        Ok(())
    }

    /// Runs the commands in order through the session's helper. A timed-out command ends the
    /// request: it and everything it started are killed, the rest are skipped.
    pub async fn run(&self, id: &str, req: &RunRequest) -> Result<RunResponse, SessionError> {
        let Some(spec) = self.run_spec(id, req).await? else {
            return Ok(RunResponse {
                results: Vec::new(),
            });
        };
        let results = self.runtime.run(id, &spec).await?;
        Ok(RunResponse { results })
    }

    /// Checks a run request and makes sure the session runs; `None` when there is nothing to run.
    pub async fn run_spec(
        &self,
        id: &str,
        req: &RunRequest,
    ) -> Result<Option<RunSpec>, SessionError> {
        if let Some(bad) = req.commands.iter().find(|c| c.contains('\0')) {
            return Err(SessionError::NulInCommand(crate::workspace::shown(
                &bad.replace('\0', "\\0"),
            )));
        }
        let timeout = match req.timeout {
            Some(0) => None,
            Some(secs) if secs > MAX_TIMEOUT_SECS => {
                return Err(SessionError::TimeoutTooLong);
            }
            Some(secs) => Some(Duration::from_secs(secs)),
            None => self.config.sessions.command_timeout,
        };
        self.ensure_running(id).await?;
        if req.commands.is_empty() {
            return Ok(None);
        }
        Ok(Some(RunSpec {
            commands: req.commands.clone(),
            fail_fast: req.fail_fast,
            timeout,
            output_cap: self.config.sessions.output_max_bytes,
            run_output_cap: self.config.sessions.run_output_max_bytes,
            workdir: layout::REPO.to_string(),
            env: Vec::new(),
        }))
    }
}

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

/// `/workspace/{repo,skills,tmp}` and the home directory, owned by the sandbox user through the
/// archive entries themselves: no `chown` runs in the container (gVisor gives `exec -u root` no
/// capabilities).
pub fn skeleton_tar(
    uid: u32,
    gid: u32,
    root_files: &[(String, Bytes)],
    helper: Option<&Bytes>,
) -> Bytes {
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
    // The service's own directory and the helper: root-owned, so the sandbox user can run the
    // helper but never replace it (it serves every fs op).
    tar.dir(entry_name(layout::SERVICE_DIR), 0o755, ROOT);
    if let Some(bin) = helper {
        tar.file(entry_name(layout::HELPER), 0o755, ROOT, bin);
    }
    // Root-owned, world-readable: the sandbox user can read but not replace them.
    for (path, data) in root_files {
        tar.file(path, 0o644, ROOT, data);
    }
    // The names are constants or the egress plan's paths: nothing `tar` refuses.
    tar.finish().unwrap_or_default()
}

fn validate_start(req: &StartSessionRequest) -> Result<(), SessionError> {
    let image = req.base_image.trim();
    if image.is_empty()
        || image.len() > 512
        || image.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(SessionError::InvalidImage(req.base_image.clone()));
    }
    if let Some(m) = req.memory_bytes
        && m < MIN_MEMORY_BYTES
    {
        return Err(SessionError::MemoryTooSmall);
    }
    // Docker takes nano-CPUs: anything that rounds to 0 would mean "unlimited".
    if let Some(c) = req.cpus
        && !(c.is_finite() && (0.01..=1024.0).contains(&c))
    {
        return Err(SessionError::InvalidCpus);
    }
    if let Some(env) = &req.environment {
        for (k, v) in env {
            if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
                return Err(SessionError::InvalidEnvironment(k.clone()));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skeleton_entries_carry_the_sandbox_owner() -> std::io::Result<()> {
        let tar_bytes = skeleton_tar(1234, 5678, &[], Some(&Bytes::from_static(b"bin")));
        let mut archive = tar::Archive::new(&tar_bytes[..]);
        let mut names = Vec::new();
        for entry in archive.entries()? {
            let entry = entry?;
            let name = entry.path()?.display().to_string();
            if name.starts_with(entry_name(layout::SERVICE_DIR)) {
                // The helper and its directory stay root's: the sandbox cannot swap them.
                assert_eq!(entry.header().uid()?, 0, "{name}");
            } else {
                assert_eq!(entry.header().uid()?, 1234);
                assert_eq!(entry.header().gid()?, 5678);
            }
            names.push(name);
        }
        assert!(
            names.iter().any(|n| n == entry_name(layout::HELPER)),
            "{names:?}"
        );
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
        Ok(())
    }
}
