//! Harness for the end-to-end tests: starts the real `daiv-sandbox` binary against the real
//! Docker engine and talks to it over HTTP, like a client would.
//!
//! One harness for every test binary: the service ([`ControlPlane`]) and its API client
//! ([`api::Client`], on the control plane's own wire types), sessions and their clean-up, the
//! docker CLI ([`docker`], [`docker_quietly`], [`inspect`]) and polling ([`eventually`]); the
//! modules add fixtures (workspace archives, the egress stack: upstreams, CAs and the settings
//! that point a service at them ([`egress::EgressStack`]), Redis, a registry, a fake Sentry).
//!
//! Nothing here skips: a missing Docker engine or local image fails the test with the command
//! that fixes it. Every session a test creates is force-removed when its guard drops, pass or
//! fail, so `scripts/check-leaks.sh` can prove nothing is left behind.

pub mod api;

pub mod workspace;

pub mod egress;

pub mod fleet;

pub mod redis;

pub mod registry;

pub mod fake_sentry;

pub mod scan;

pub mod python;

pub mod dataplane;

use std::io::Read;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// Local images built by `make images` (no registry on the test machines).
pub const BUSYBOX: &str = "daiv-sandbox-busybox:local";
pub const DEBIAN: &str = "daiv-sandbox-debian:local";

/// Panics with instructions unless Docker answers and `image` exists locally.
pub fn require_image(image: &str) {
    assert!(
        docker(&["info", "--format", "{{.ServerVersion}}"]).is_ok(),
        "Docker engine not answering: run `scripts/ensure-docker.sh` (or `make test`)"
    );
    let found = docker(&["image", "inspect", image]).is_ok();
    assert!(found, "image {image} missing: run `make images`");
}

fn binary() -> PathBuf {
    if let Ok(p) = std::env::var("DAIV_SANDBOX_BIN") {
        return PathBuf::from(p);
    }
    // target/<profile>/deps/<test> -> target/<profile>/daiv-sandbox
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe
        .parent()
        .and_then(|p| p.parent())
        .map(PathBuf::from)
        .unwrap_or_default();
    dir.join("daiv-sandbox")
}

/// A loopback port free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

/// A running control plane on a loopback port, killed on drop.
pub struct ControlPlane {
    child: Child,
    pub base: String,
    pub key: String,
    /// Its `DAIV_SANDBOX_DEPLOYMENT`.
    pub deployment: String,
    log: PathBuf,
    api: api::Client,
}

impl ControlPlane {
    pub async fn start() -> Result<Self> {
        Self::start_with(&[]).await
    }

    /// `env` adds or overrides `DAIV_SANDBOX_*` settings (names without the prefix).
    pub async fn start_with(env: &[(&str, &str)]) -> Result<Self> {
        Self::start_with_process_env(env, &[]).await
    }

    /// Like [`ControlPlane::start_with`], with extra process environment for the service (for
    /// example `DOCKER_HOST`), given as full variable names.
    pub async fn start_with_process_env(
        env: &[(&str, &str)],
        process_env: &[(&str, &str)],
    ) -> Result<Self> {
        let bin = binary();
        if !bin.is_file() {
            bail!(
                "{} not found: run `cargo build --workspace --bins` (make test does)",
                bin.display()
            );
        }
        let port = free_port();
        let key = format!("e2e-{}-{port}", std::process::id());
        let deployment = env
            .iter()
            .find(|(k, _)| *k == "DEPLOYMENT")
            .map(|(_, v)| v.to_string())
            .unwrap_or_else(|| format!("e2e-{}-{port}", std::process::id()));
        let log = std::env::temp_dir().join(format!("daiv-sandbox-e2e-{port}.log"));
        let log_file = std::fs::File::create(&log)?;
        let mut cmd = Command::new(&bin);
        cmd.env("DAIV_SANDBOX_API_KEY", &key)
            .env("DAIV_SANDBOX_HOST", "127.0.0.1")
            .env("DAIV_SANDBOX_PORT", port.to_string())
            .env("DAIV_SANDBOX_ENVIRONMENT", "local")
            .env("DAIV_SANDBOX_REAPER_ENABLED", "false")
            .env("DAIV_SANDBOX_LOG_LEVEL", "DEBUG")
            // Each instance its own deployment: a reaper under test never sweeps the sessions
            // of tests running beside it (replicas of one deployment pass the same value).
            .env("DAIV_SANDBOX_DEPLOYMENT", &deployment)
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .stdin(Stdio::null());
        for (k, v) in env {
            cmd.env(format!("DAIV_SANDBOX_{k}"), v);
        }
        for (k, v) in process_env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("spawn {}", bin.display()))?;
        let base = format!("http://127.0.0.1:{port}");
        let api = api::Client::new(&format!("{base}/api/v1"), &key)?;
        let cp = Self {
            child,
            base,
            key,
            deployment,
            log,
            api,
        };
        cp.wait_healthy().await?;
        Ok(cp)
    }

    async fn wait_healthy(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = self
                .http()
                .get(format!("{}/-/health/", self.base))
                .send()
                .await
                && r.status().is_success()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("control plane not healthy in 30 s; log:\n{}", self.logs());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The API client (`/api/v1`, this service's key).
    pub fn api(&self) -> &api::Client {
        &self.api
    }

    /// The API client for the routes at the root (`/-/health/`, `/metrics`, DAIV's bare URL).
    pub fn root(&self) -> api::Client {
        self.api.with_prefix(&self.base)
    }

    /// `GET /metrics` as text.
    pub async fn metrics(&self) -> Result<String> {
        let resp = self
            .root()
            .request(reqwest::Method::GET, "/metrics")
            .send()
            .await?;
        Ok(resp.text().await?)
    }

    /// Everything the service logged so far.
    pub fn logs(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// Resident memory of the service process now, from /proc (KiB).
    pub fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    }

    /// Peak resident memory of the service process, from /proc (KiB).
    pub fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    }

    pub fn url(&self, path: &str) -> String {
        self.api.url(path)
    }

    /// A request to `/api/v1{path}` with the API key (see [`api::Client::request`]).
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.api.request(method, path)
    }

    /// A request with the API key; returns status and JSON body (`Null` when empty).
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value)> {
        self.api.call(method, path, body).await
    }

    /// The HTTP client underneath (no key).
    pub fn http(&self) -> &reqwest::Client {
        self.api.http()
    }

    /// Creates a session; the guard force-removes it on drop.
    pub async fn session(&self, body: Value) -> Result<Session> {
        let created = self.api.create_session(body).await?;
        Ok(Session {
            id: created.session_id,
        })
    }

    pub async fn session_of(&self, image: &str) -> Result<Session> {
        self.session(json!({ "base_image": image })).await
    }

    /// `DELETE /session/{id}/?force=true`; returns the status.
    pub async fn force_close(&self, session: &Session) -> Result<u16> {
        self.api.force_close(&session.id).await
    }

    /// Runs commands; returns the `results` array.
    pub async fn run(&self, session: &Session, body: Value) -> Result<Vec<Value>> {
        let ran = self.api.run(&session.id, body).await?;
        ran.results
            .iter()
            .map(|r| serde_json::to_value(r).context("a run result"))
            .collect()
    }

    /// Runs one command and returns (exit_code, output).
    pub async fn sh(&self, session: &Session, command: &str) -> Result<(i64, String)> {
        let r = self.api.sh(&session.id, command).await?;
        Ok((r.exit_code, r.output))
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // Shown by the test runner only when the test fails: the service's side of the story.
        if let Ok(Some(status)) = self.child.try_wait() {
            eprintln!("--- daiv-sandbox exited early: {status}");
        }
        let logs = self.logs();
        let tail: Vec<&str> = logs.lines().rev().take(40).collect();
        eprintln!("--- daiv-sandbox log (last {} lines):", tail.len());
        for line in tail.iter().rev() {
            eprintln!("{line}");
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        remove_shared_helper(&self.deployment);
        // DAIV_E2E_KEEP_LOGS=1 keeps the whole log (its path is printed) for a post-mortem.
        if std::env::var_os("DAIV_E2E_KEEP_LOGS").is_some() {
            eprintln!("--- daiv-sandbox log kept: {}", self.log.display());
        } else {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

/// A session created by a test; force-removed (with its volumes) on drop, whatever happened.
pub struct Session {
    pub id: String,
}

impl Drop for Session {
    fn drop(&mut self) {
        // An egress session has a gateway and a network too: remove every part by its token.
        let token = inspect(&self.id).and_then(|c| {
            c["Config"]["Labels"]["daiv.sandbox.egress"]
                .as_str()
                .map(String::from)
        });
        docker_quietly(&["rm", "-fv", &self.id]);
        if let Some(token) = token {
            let filter = format!("label=daiv.sandbox.egress={token}");
            for kind in [&["ps", "-aq"][..], &["network", "ls", "-q"][..]] {
                let ids = docker(&[kind, &["--filter", &filter]].concat()).unwrap_or_default();
                for id in ids.split_whitespace() {
                    if kind[0] == "ps" {
                        docker_quietly(&["rm", "-fv", id]);
                    } else {
                        docker_quietly(&["network", "rm", id]);
                    }
                }
            }
        }
    }
}

/// Removes every container, network, volume and image labelled with a deployment when dropped:
/// for tests whose service leaves things behind on purpose (a warm pool is kept across restarts,
/// snapshots outlive their sessions).
pub struct DeploymentGuard(pub String);

impl Drop for DeploymentGuard {
    fn drop(&mut self) {
        remove_deployment(&self.0);
    }
}

/// Ids of the containers (`docker ps -a`) matching every `label=...` filter given.
pub fn containers_with(labels: &[&str]) -> Vec<String> {
    listed(&["ps", "-aq", "--no-trunc"], labels)
}

/// Ids of the containers matching every `label=...` filter given but the service's own
/// helpers, which a check for sessions left is not about: its layer workers (long-lived
/// copiers a replica keeps per image while snapshots are taken, removed once idle,
/// `docs/api/snapshots.md`) and a runtime probe of an image a session first used, which may
/// still be finishing in the background when the session is gone (its own tests check that it
/// goes).
pub fn containers_but_workers(labels: &[&str]) -> Vec<String> {
    let ours: Vec<String> = ["layer-worker", "runtime-probe"]
        .iter()
        .flat_map(|role| {
            let role = format!("daiv.sandbox.role={role}");
            let mut with_role = labels.to_vec();
            with_role.push(&role);
            containers_with(&with_role)
        })
        .collect();
    containers_with(labels)
        .into_iter()
        .filter(|c| !ours.contains(c))
        .collect()
}

/// Names of the networks matching every `label=...` filter given.
pub fn networks_with(labels: &[&str]) -> Vec<String> {
    listed(&["network", "ls", "--format", "{{.Name}}"], labels)
}

/// The words `docker <list>` prints with a `label=...` filter per label; none on failure.
fn listed(list: &[&str], labels: &[&str]) -> Vec<String> {
    let filters: Vec<String> = labels.iter().map(|l| format!("label={l}")).collect();
    let mut args = list.to_vec();
    for f in &filters {
        args.extend(["--filter", f.as_str()]);
    }
    docker(&args)
        .unwrap_or_default()
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// Ids of the images (`docker images -a`, dangling and untagged parents included) matching every
/// `label=...` filter given, each once.
pub fn images_with(labels: &[&str]) -> Vec<String> {
    let mut ids = listed(&["images", "-aq", "--no-trunc"], labels);
    ids.sort();
    ids.dedup();
    ids
}

/// Names of the volumes matching every `label=...` filter given.
pub fn volumes_with(labels: &[&str]) -> Vec<String> {
    listed(&["volume", "ls", "-q"], labels)
}

/// Names of the volumes matching every `label=...` filter given but the engine's shared copy of
/// the helper (its volume and marker): kept while the service runs, whatever sessions come
/// and go (`docs/operations/isolation.md`), which a check for what sessions and snapshots left
/// is not about.
pub fn volumes_but_shared_helper(labels: &[&str]) -> Vec<String> {
    let mut shared = Vec::new();
    for role in ["daiv.sandbox.role=helper", "daiv.sandbox.role=helper-ready"] {
        let mut with_role = labels.to_vec();
        with_role.push(role);
        shared.extend(volumes_with(&with_role));
    }
    volumes_with(labels)
        .into_iter()
        .filter(|v| !shared.contains(v))
        .collect()
}

/// What a clean stop of `deployment`'s service removes and a kill leaves: the engine's shared
/// copy of the helper (its volume and marker), unless a sandbox still mounts it.
pub fn remove_shared_helper(deployment: &str) {
    let label = format!("daiv.sandbox.deployment={deployment}");
    let volumes = volumes_with(&[&label, "daiv.sandbox.role=helper"]);
    for v in &volumes {
        docker_quietly(&["volume", "rm", v]);
    }
    let left = volumes_with(&[&label, "daiv.sandbox.role=helper"]);
    for m in volumes_with(&[&label, "daiv.sandbox.role=helper-ready"]) {
        let volume = m.strip_suffix("-ready").unwrap_or(&m);
        if !left.iter().any(|v| v == volume) {
            docker_quietly(&["volume", "rm", &m]);
        }
    }
}

/// Force-removes every container (with volumes), network, volume and image of `deployment`.
pub fn remove_deployment(deployment: &str) {
    let label = format!("daiv.sandbox.deployment={deployment}");
    for id in containers_with(&[&label]) {
        docker_quietly(&["rm", "-fv", &id]);
    }
    for net in networks_with(&[&label]) {
        docker_quietly(&["network", "rm", &net]);
    }
    // Overlay volumes first (`...-merged` mounts the others), then the rest.
    let mut volumes = volumes_with(&[&label]);
    volumes.sort_by_key(|v| !v.ends_with("-merged"));
    // A snapshot that committed nothing is its base image tagged, a tag that carries none of
    // the deployment's labels: found by its snapshot's layer, untagged (the image stays).
    for id in volumes
        .iter()
        .filter_map(|v| v.strip_prefix("daiv-snapshot-")?.strip_suffix("-data"))
    {
        docker_quietly(&["rmi", &format!("daiv-sandbox-snapshot:{id}")]);
    }
    for v in volumes {
        docker_quietly(&["volume", "rm", "-f", &v]);
    }
    // An image made from a session of another snapshot is that image's child: a parent goes
    // only once its children have, so a few passes.
    for _ in 0..4 {
        let images = images_with(&[&label]);
        if images.is_empty() {
            break;
        }
        for id in images {
            docker_quietly(&["rmi", "-f", &id]);
        }
    }
}

/// Runs the docker CLI; stdout trimmed, or an error with stderr.
pub fn docker(args: &[&str]) -> Result<String> {
    let out = Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("docker CLI")?;
    if !out.status.success() {
        bail!(
            "docker {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Runs the docker CLI for a clean-up, ignoring output and failure (the thing may be gone).
pub fn docker_quietly(args: &[&str]) {
    let _ = Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// `docker inspect` of a container, `None` when it does not exist.
pub fn inspect(id: &str) -> Option<Value> {
    let v: Value = serde_json::from_str(&docker(&["inspect", id]).ok()?).ok()?;
    v.as_array()?.first().cloned()
}

/// Polls `check` every 100 ms until it yields a value or `within` passes.
pub async fn eventually<T, F, Fut>(what: &str, within: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("{what}: not within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
