//! Fleet fixtures: three Docker-in-Docker engines reached over mutual TLS
//! (`scripts/fleet-engines.sh`), engines files the service reads, and what a test asks of an
//! engine (its docker CLI, its leftovers).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::{BUSYBOX, DEBIAN};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/fleet-engines.sh")
}

/// Runs `scripts/fleet-engines.sh` with `args` (and `FLEET_IMAGES` when given); stdout trimmed.
pub fn run_script(args: &[&str], images: Option<&str>) -> Result<String> {
    let mut cmd = Command::new(script());
    cmd.args(args);
    if let Some(images) = images {
        cmd.env("FLEET_IMAGES", images);
    }
    let out = cmd.output().context("run scripts/fleet-engines.sh")?;
    if !out.status.success() {
        bail!(
            "fleet-engines.sh {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The engines `a`, `b` and `c` running and answering, with the busybox sandbox, Debian and the
/// gateway images loaded (idempotent: engines already up are left alone). Their entries, as an
/// engines file lists them.
pub fn up() -> Result<Vec<Value>> {
    let images = format!("{BUSYBOX} {DEBIAN} {}", crate::egress::gateway_image());
    let out = run_script(&["up", "a", "b", "c"], Some(&images))?;
    let file: Value = serde_json::from_str(&out).context("engines JSON from fleet-engines.sh")?;
    file["engines"]
        .as_array()
        .cloned()
        .context("no engines in fleet-engines.sh's output")
}

/// The entry of engine `name` among `engines`, with `extra` fields merged in.
pub fn engine(engines: &[Value], name: &str, extra: Value) -> Value {
    let mut e = engines
        .iter()
        .find(|e| e["name"] == name)
        .cloned()
        .unwrap_or_else(|| json!({ "name": name }));
    if let (Some(e), Some(extra)) = (e.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            e.insert(k.clone(), v.clone());
        }
    }
    e
}

/// The local engine (this machine's dockerd), as the fleet's default engine.
pub fn local_engine(extra: Value) -> Value {
    let mut e =
        json!({"name": "local", "endpoint": "unix:///var/run/docker.sock", "default": true});
    if let (Some(e), Some(extra)) = (e.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            e.insert(k.clone(), v.clone());
        }
    }
    e
}

/// An engines file the service reads; rewritten whole (write then rename, as an operator's
/// tooling should) by [`EnginesFile::write`].
pub struct EnginesFile {
    pub path: PathBuf,
}

impl EnginesFile {
    pub fn new(engines: &[Value]) -> Result<Self> {
        let path = std::env::temp_dir().join(format!(
            "daiv-e2e-engines-{}-{}.json",
            std::process::id(),
            crate::free_port()
        ));
        let f = Self { path };
        f.write(engines)?;
        Ok(f)
    }

    pub fn write(&self, engines: &[Value]) -> Result<()> {
        self.write_raw(&serde_json::to_vec(&json!({ "engines": engines }))?)
    }

    pub fn write_raw(&self, bytes: &[u8]) -> Result<()> {
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, &self.path)?;
        Ok(())
    }

    pub fn path_str(&self) -> String {
        self.path.display().to_string()
    }
}

impl Drop for EnginesFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The docker CLI against fleet engine `name` (`local` is this machine's engine).
pub fn engine_docker(name: &str, args: &[&str]) -> Result<String> {
    if name == "local" {
        return crate::docker(args);
    }
    run_script(&[&["docker", name][..], args].concat(), None)
}

/// The engine a session id names (`local` for an id without a prefix).
pub fn engine_of(session_id: &str) -> &str {
    match session_id.split_once('.') {
        Some((engine, _)) => engine,
        None => "local",
    }
}

/// What deployment `deployment` left on engine `name`: containers, networks and volumes.
pub fn leftovers(name: &str, deployment: &str) -> Result<Vec<String>> {
    let label = format!("label=daiv.sandbox.deployment={deployment}");
    let mut left = Vec::new();
    for (kind, args) in [
        ("container", &["ps", "-aq", "--filter", &label][..]),
        ("network", &["network", "ls", "-q", "--filter", &label][..]),
        ("volume", &["volume", "ls", "-q", "--filter", &label][..]),
        ("image", &["images", "-q", "--filter", &label][..]),
    ] {
        for id in engine_docker(name, args)?.split_whitespace() {
            // The engine's shared copy of the helper stays while the service runs.
            if kind == "volume" && id.starts_with("daiv-sandbox-helper-") {
                continue;
            }
            left.push(format!("{kind} {id}"));
        }
    }
    Ok(left)
}

/// Removes everything of a deployment from every engine named, pass or fail.
pub struct FleetGuard {
    pub deployment: String,
    pub engines: Vec<String>,
}

impl FleetGuard {
    pub fn new(deployment: &str, engines: &[&str]) -> Self {
        Self {
            deployment: deployment.to_string(),
            engines: engines.iter().map(|e| e.to_string()).collect(),
        }
    }
}

impl Drop for FleetGuard {
    fn drop(&mut self) {
        let label = format!("label=daiv.sandbox.deployment={}", self.deployment);
        for name in &self.engines {
            // An engine a test stopped is started again first: its objects are removed too.
            if name != "local" {
                let _ = run_script(&["start", name], None);
            }
            // Just restarted, an engine's address may not route for a moment.
            let mut ids = String::new();
            for _ in 0..10 {
                match engine_docker(name, &["ps", "-aq", "--filter", &label]) {
                    Ok(found) => {
                        ids = found;
                        break;
                    }
                    Err(_) => std::thread::sleep(std::time::Duration::from_secs(1)),
                }
            }
            for id in ids.split_whitespace() {
                let _ = engine_docker(name, &["rm", "-fv", id]);
            }
            let nets = engine_docker(name, &["network", "ls", "-q", "--filter", &label])
                .unwrap_or_default();
            for id in nets.split_whitespace() {
                let _ = engine_docker(name, &["network", "rm", id]);
            }
            let vols = engine_docker(name, &["volume", "ls", "-q", "--filter", &label])
                .unwrap_or_default();
            for id in vols.split_whitespace() {
                let _ = engine_docker(name, &["volume", "rm", "-f", id]);
            }
        }
    }
}
