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
use futures::StreamExt;
use tokio::time::Instant;

use crate::api::{RunRequest, RunResponse, RunResult, StartSessionRequest, WORKDIR};
use crate::batch::{self, BatchParser, Event};
use crate::config::Config;
use crate::egress::{self, Created, Egress, SandboxPlan, Triad};
use crate::engine::{
    ContainerEngine, ContainerInfo, ContainerSpec, DEPLOYMENT_LABEL, EngineError, ExecSpec,
    IMAGE_LABEL, MANAGED_LABEL, NetworkAttach, ROLE_LABEL, ROLE_SANDBOX,
};
use crate::error::ApiError;

/// Home of the sandbox user: writable, outside the workspace so seeds and `git status` stay clean.
pub const HOME: &str = "/home/sandbox";

/// Exit code of a command killed at its timeout (as coreutils' `timeout`).
pub const TIMEOUT_EXIT_CODE: i64 = 124;

/// Keeps the container alive without depending on anything but a POSIX shell and `sleep`, which
/// every distro image has. PID 1 is Docker's init (tini), which forwards SIGTERM here: stops are
/// prompt instead of waiting out the stop timeout.
const KEEPALIVE: &str = "while :; do sleep 86400; done";

/// Kills a whole process group (the wrapper's), falling back to the single pid. `kill -9 -PGID`
/// is the one spelling dash, bash and busybox all accept (dash and busybox reject `--`).
const KILL_GROUP: &str = r#"kill -9 "-$1" 2>/dev/null || kill -9 "$1" 2>/dev/null; exit 0"#;

/// How long to wait for the rest of the output once a timed-out command was killed.
const DRAIN_AFTER_KILL: Duration = Duration::from_secs(5);

pub struct Sessions {
    engine: Arc<dyn ContainerEngine>,
    config: Arc<Config>,
    /// `None` when no egress CA is configured: egress sessions are then refused with 400.
    egress: Option<Egress>,
}

/// Docker's own lower bound for a memory limit.
const MIN_MEMORY_BYTES: i64 = 6 * 1024 * 1024;

impl Sessions {
    pub fn new(
        engine: Arc<dyn ContainerEngine>,
        config: Arc<Config>,
        egress: Option<Egress>,
    ) -> Self {
        Self {
            engine,
            config,
            egress,
        }
    }

    pub fn engine(&self) -> &dyn ContainerEngine {
        &*self.engine
    }

    fn user(&self) -> String {
        format!("{}:{}", self.config.run_uid, self.config.run_gid)
    }

    /// Creates and starts an isolated session; nothing is left behind when any step fails.
    /// `egress_token` names the egress triad's parts (unused for an isolated session).
    pub async fn create(
        &self,
        req: &StartSessionRequest,
        egress_token: &str,
    ) -> Result<String, ApiError> {
        validate_start(req)?;
        let Some(egress_body) = &req.egress else {
            self.engine.ensure_image(&req.base_image).await?;
            let spec = self.sandbox_spec(req, None);
            let id = self.engine.create(&spec).await?;
            if let Err(e) = self.engine.start(&id).await {
                let _ = self.engine.remove(&id).await;
                return Err(e.into());
            }
            tracing::info!(session_id = %id, image = %req.base_image, "session created");
            return Ok(id);
        };
        let egress = self.egress_or_400()?;
        let policy = egress::parse_policy(egress_body)?;
        self.engine.ensure_image(&req.base_image).await?;
        let mut created = Created::default();
        let mut sandbox = None;
        let result = async {
            let plan = egress.prepare(egress_token, &policy, &mut created).await?;
            let triad = plan.triad.clone();
            let spec = self.sandbox_spec(req, Some(&plan));
            let sandbox_up = async {
                let id = self.engine.create(&spec).await?;
                sandbox = Some(id.clone());
                self.engine.start(&id).await?;
                Ok::<_, ApiError>(id)
            };
            let (gateway_up, sandbox_up) = tokio::join!(egress.start_gateway(&triad), sandbox_up);
            gateway_up?;
            let id = sandbox_up?;
            egress.finish(&id, &triad).await?;
            Ok::<_, ApiError>(id)
        }
        .await;
        match result {
            Ok(id) => {
                tracing::info!(session_id = %id, image = %req.base_image, "egress session created");
                Ok(id)
            }
            Err(e) => {
                if let Some(id) = &sandbox {
                    let _ = self.engine.remove(id).await;
                }
                egress.teardown(&created).await;
                Err(e)
            }
        }
    }

    fn egress_or_400(&self) -> Result<&Egress, ApiError> {
        self.egress.as_ref().ok_or_else(|| {
            ApiError::BadRequest(
                "egress not configured: set DAIV_SANDBOX_EGRESS_CA_CERT_FILE and DAIV_SANDBOX_EGRESS_CA_KEY_FILE"
                    .to_string(),
            )
        })
    }

    /// `PUT /session/{id}/egress/`: a new policy for a live session, without restarting anything.
    pub async fn refresh_egress(&self, id: &str, body: &serde_json::Value) -> Result<(), ApiError> {
        let info = self.find(id).await?;
        let Some(triad) = Triad::of(&info) else {
            return Err(ApiError::Conflict(
                "session has no egress proxy: a network-isolated session has nothing to refresh"
                    .to_string(),
            ));
        };
        let policy = egress::parse_policy(body)?;
        let egress = self.egress.as_ref().ok_or_else(|| {
            ApiError::Unavailable("egress is not configured on this instance".to_string())
        })?;
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
        ]);
        labels.extend(extra_labels.iter().cloned());
        ContainerSpec {
            image: req.base_image.clone(),
            // The image's entrypoint would wrap the keep-alive in something unknown.
            entrypoint: Some(Vec::new()),
            cmd: Some(vec!["/bin/sh".into(), "-c".into(), KEEPALIVE.into()]),
            env,
            labels,
            user: Some(self.user()),
            // tini as PID 1: forwards SIGTERM (prompt stops) and reaps orphaned zombies.
            init: true,
            runtime: c.runtime.as_str().to_string(),
            memory_bytes: req.memory_bytes,
            nano_cpus: req.cpus.map(|c| (c * 1e9).round() as i64),
            pids_limit: c.pids_limit,
            network,
            skeleton: Some(skeleton_tar(c.run_uid, c.run_gid, extra_files)),
        }
    }

    /// The managed sandbox container behind `id`, or 404. Ids are full container ids only: a name
    /// or a prefix could reach a container that is not a session.
    pub async fn find(&self, id: &str) -> Result<ContainerInfo, ApiError> {
        if !is_container_id(id) {
            return Err(ApiError::NotFound);
        }
        let info = self.engine.inspect(id).await?;
        if !info.is_managed()
            || info.labels.get(ROLE_LABEL).map(String::as_str) != Some(ROLE_SANDBOX)
        {
            return Err(ApiError::NotFound);
        }
        Ok(info)
    }

    /// Starts a stopped session so the next operation finds it warm.
    pub async fn ensure_running(&self, id: &str) -> Result<ContainerInfo, ApiError> {
        let info = self.find(id).await?;
        if info.is_running() {
            return Ok(info);
        }
        // The gateway first, listening before the sandbox's first command runs.
        if let Some(triad) = Triad::of(&info) {
            self.egress
                .as_ref()
                .ok_or_else(|| {
                    ApiError::Unavailable("egress is not configured on this instance".to_string())
                })?
                .ensure_gateway(&triad)
                .await?;
        }
        match self.engine.start(id).await {
            Ok(()) => Ok(info),
            Err(EngineError::NotFound) => Err(ApiError::NotFound),
            Err(e) => Err(ApiError::Unavailable(format!(
                "session could not be restarted: {e}"
            ))),
        }
    }

    /// Stops the session (kept warm for reuse), or removes it with `force`.
    pub async fn close(&self, id: &str, force: bool) -> Result<(), ApiError> {
        let info = self.find(id).await?;
        let triad = Triad::of(&info);
        let result = if force {
            self.engine.remove(id).await
        } else {
            self.engine.stop(id, self.config.stop_timeout).await
        };
        match result {
            Ok(()) | Err(EngineError::NotFound) => {}
            Err(e) => return Err(e.into()),
        }
        if let (Some(triad), Some(egress)) = (triad, &self.egress) {
            if force {
                egress
                    .teardown(&Created {
                        network: Some(triad.network.clone()),
                        gateway: Some(triad.gateway.clone()),
                    })
                    .await;
            } else {
                egress.stop(&triad).await;
            }
        }
        Ok(())
    }

    /// Runs the commands in order, all in one exec (see [`crate::batch`]). A timed-out command
    /// ends the request: it and everything it started are killed, the rest are skipped.
    pub async fn run(&self, id: &str, req: &RunRequest) -> Result<RunResponse, ApiError> {
        if let Some(bad) = req.commands.iter().find(|c| c.contains('\0')) {
            return Err(ApiError::Unprocessable(format!(
                "command contains a NUL byte: {:?}",
                bad.replace('\0', "\\0")
            )));
        }
        self.ensure_running(id).await?;
        let timeout = match req.timeout {
            Some(0) => None,
            Some(secs) => Some(Duration::from_secs(secs)),
            None => self.config.command_timeout,
        };
        let mut results = Vec::with_capacity(req.commands.len());
        for batch in batch::batches(&req.commands) {
            let stop = self
                .run_batch(id, batch, req.fail_fast, timeout, &mut results)
                .await?;
            if stop {
                break;
            }
        }
        Ok(RunResponse { results })
    }

    /// Runs one batch; `Ok(true)` when the request must stop (timeout or fail-fast).
    async fn run_batch(
        &self,
        id: &str,
        commands: &[String],
        fail_fast: bool,
        timeout: Option<Duration>,
        results: &mut Vec<RunResult>,
    ) -> Result<bool, ApiError> {
        let nonce = batch::nonce();
        let mut cmd = vec![
            "/bin/sh".to_string(),
            "-c".into(),
            batch::DRIVER.into(),
            "daiv-sandbox".into(),
            nonce.clone(),
            if fail_fast { "1" } else { "0" }.into(),
        ];
        cmd.extend(commands.iter().cloned());
        let spec = ExecSpec {
            cmd,
            user: self.user(),
            workdir: Some(WORKDIR.to_string()),
            env: Vec::new(),
        };
        let mut exec = self.engine.exec(id, &spec).await?;
        let mut parser = BatchParser::new(&nonce, self.config.output_max_bytes);
        let mut deadline: Option<Instant> = None;
        let first = results.len();
        let mut timed_out = false;
        loop {
            let next = match deadline {
                Some(d) => match tokio::time::timeout_at(d, exec.output.next()).await {
                    Ok(n) => n,
                    Err(_) => {
                        timed_out = true;
                        break;
                    }
                },
                None => exec.output.next().await,
            };
            let chunk = match next {
                Some(Ok(chunk)) => chunk,
                Some(Err(e)) => return Err(e.into()),
                None => break,
            };
            for event in parser.push(&chunk) {
                match event {
                    Event::Started => deadline = timeout.map(|t| Instant::now() + t),
                    Event::Finished { output, exit_code } => {
                        deadline = None;
                        let command = commands
                            .get(results.len() - first)
                            .cloned()
                            .unwrap_or_default();
                        results.push(RunResult {
                            command,
                            output,
                            exit_code,
                            workdir: WORKDIR.to_string(),
                        });
                    }
                }
            }
        }
        let finished = results.len() - first;
        if timed_out {
            if let Some(pid) = parser.pid() {
                self.kill_group(id, pid).await;
            }
            let drain = async {
                while let Some(Ok(chunk)) = exec.output.next().await {
                    parser.push(&chunk);
                }
            };
            let _ = tokio::time::timeout(DRAIN_AFTER_KILL, drain).await;
            results.push(RunResult {
                command: commands.get(finished).cloned().unwrap_or_default(),
                output: parser.take_unfinished().unwrap_or_default(),
                exit_code: TIMEOUT_EXIT_CODE,
                workdir: WORKDIR.to_string(),
            });
            return Ok(true);
        }
        if parser.in_command() {
            // The driver ended mid-command (killed, or the container stopped): report what the
            // engine says of the exec, and stop.
            let exit_code = self.exit_code(&exec.exec_id).await.unwrap_or(-1);
            results.push(RunResult {
                command: commands.get(finished).cloned().unwrap_or_default(),
                output: parser.take_unfinished().unwrap_or_default(),
                exit_code,
                workdir: WORKDIR.to_string(),
            });
            return Ok(true);
        }
        let failed = results[first..].last().is_some_and(|r| r.exit_code != 0);
        Ok(finished < commands.len() || (fail_fast && failed))
    }

    /// The exit code once the output stream ended; the daemon may take a moment to record it.
    async fn exit_code(&self, exec_id: &str) -> Result<i64, ApiError> {
        for attempt in 0..50u32 {
            if let Some(code) = self.engine.exec_exit_code(exec_id).await? {
                return Ok(code);
            }
            tokio::time::sleep(Duration::from_millis(5 * u64::from(attempt.min(20)) + 1)).await;
        }
        Err(ApiError::Unavailable(
            "the command's exit code was not reported by the container engine".to_string(),
        ))
    }

    async fn kill_group(&self, id: &str, pid: u32) {
        let spec = ExecSpec {
            cmd: vec![
                "/bin/sh".into(),
                "-c".into(),
                KILL_GROUP.into(),
                "daiv-kill".into(),
                pid.to_string(),
            ],
            user: self.user(),
            workdir: None,
            env: Vec::new(),
        };
        match self.engine.exec(id, &spec).await {
            Ok(mut kill) => while kill.output.next().await.is_some() {},
            Err(e) => {
                tracing::warn!(session_id = %id, error = %e, "could not kill timed-out command")
            }
        }
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
pub fn skeleton_tar(uid: u32, gid: u32, root_files: &[(String, Bytes)]) -> Bytes {
    let dirs = [
        "workspace/",
        "workspace/repo/",
        "workspace/skills/",
        "workspace/tmp/",
        "home/sandbox/",
        "home/sandbox/.config/",
        "home/sandbox/.cache/",
        "home/sandbox/.local/",
        "home/sandbox/.local/share/",
        "home/sandbox/.local/state/",
    ];
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut builder = tar::Builder::new(Vec::new());
    for dir in dirs {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(0o755);
        header.set_uid(u64::from(uid));
        header.set_gid(u64::from(gid));
        header.set_size(0);
        header.set_mtime(now);
        // Writing to a Vec cannot fail; the path is a short constant.
        let _ = builder.append_data(&mut header, dir, std::io::empty());
    }
    // Root-owned, world-readable: the sandbox user can read but not replace them.
    for (path, data) in root_files {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(0o644);
        header.set_uid(0);
        header.set_gid(0);
        header.set_size(data.len() as u64);
        header.set_mtime(now);
        let _ = builder.append_data(&mut header, path, &data[..]);
    }
    Bytes::from(builder.into_inner().unwrap_or_default())
}

pub fn is_container_id(id: &str) -> bool {
    id.len() == 64
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn validate_start(req: &StartSessionRequest) -> Result<(), ApiError> {
    let image = req.base_image.trim();
    if image.is_empty()
        || image.len() > 512
        || image.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(ApiError::Unprocessable(format!(
            "base_image is not a valid image reference: {:?}",
            req.base_image
        )));
    }
    if let Some(m) = req.memory_bytes
        && m < MIN_MEMORY_BYTES
    {
        return Err(ApiError::Unprocessable(format!(
            "memory_bytes must be at least {MIN_MEMORY_BYTES} (6 MiB)"
        )));
    }
    if let Some(c) = req.cpus
        && !(c.is_finite() && c > 0.0 && c <= 1024.0)
    {
        return Err(ApiError::Unprocessable(
            "cpus must be a positive number".to_string(),
        ));
    }
    if let Some(env) = &req.environment {
        for (k, v) in env {
            if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
                return Err(ApiError::Unprocessable(format!(
                    "environment variable {k:?}: names must be non-empty without '=' or NUL, values without NUL"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids_are_full_lowercase_hex() {
        assert!(is_container_id(&"a".repeat(64)));
        assert!(!is_container_id(&"a".repeat(12)));
        assert!(!is_container_id(&"A".repeat(64)));
        assert!(!is_container_id("../../etc"));
    }

    #[test]
    fn skeleton_entries_carry_the_sandbox_owner() -> std::io::Result<()> {
        let tar_bytes = skeleton_tar(1234, 5678, &[]);
        let mut archive = tar::Archive::new(&tar_bytes[..]);
        let mut names = Vec::new();
        for entry in archive.entries()? {
            let entry = entry?;
            assert_eq!(entry.header().uid()?, 1234);
            assert_eq!(entry.header().gid()?, 5678);
            names.push(entry.path()?.display().to_string());
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
        Ok(())
    }
}
