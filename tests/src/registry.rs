//! A private container registry per test: Debian's `docker-registry` (the distribution registry)
//! on a free loopback port, with htpasswd (bcrypt) users and a temporary storage directory.
//!
//! The engine treats 127.0.0.0/8 as an insecure registry, so plain HTTP works. Images are pushed
//! with the test's own docker CLI config (never the machine's), and on drop the registry is
//! killed, its files removed, and every local tag of this registry (pushed or pulled) untagged.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use base64::Engine as _;

use crate::{docker, docker_quietly, free_port};

pub struct PrivateRegistry {
    port: u16,
    dir: PathBuf,
    child: Child,
}

impl PrivateRegistry {
    /// Starts a registry that lets in `users` (name, password) only; fails with the fix when the
    /// registry or `htpasswd` is not installed.
    pub fn start(users: &[(&str, &str)]) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "daiv-e2e-registry-{}-{:x}",
            std::process::id(),
            nanos()
        ));
        std::fs::create_dir_all(dir.join("data"))?;
        let htpasswd = dir.join("htpasswd");
        std::fs::write(&htpasswd, "")?;
        for (user, password) in users {
            let out = Command::new("htpasswd")
                .args(["-Bbn", user, password])
                .stdin(Stdio::null())
                .output();
            let out = match out {
                Ok(o) if o.status.success() => o.stdout,
                Ok(o) => bail!("htpasswd: {}", String::from_utf8_lossy(&o.stderr)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    bail!(
                        "htpasswd is not installed: run scripts/ensure-registry.sh (or `make registry`)"
                    )
                }
                Err(e) => return Err(e).context("htpasswd"),
            };
            let mut f = std::fs::OpenOptions::new().append(true).open(&htpasswd)?;
            f.write_all(String::from_utf8_lossy(&out).trim_end().as_bytes())?;
            f.write_all(b"\n")?;
        }
        let port = free_port();
        let config = dir.join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\n\
                 log: {{level: warn}}\n\
                 storage: {{filesystem: {{rootdirectory: {data}}}, delete: {{enabled: true}}}}\n\
                 http: {{addr: 127.0.0.1:{port}}}\n\
                 auth: {{htpasswd: {{realm: daiv-e2e, path: {htpasswd}}}}}\n",
                data = dir.join("data").display(),
                htpasswd = htpasswd.display(),
            ),
        )?;
        let log = std::fs::File::create(dir.join("registry.log"))?;
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                bail!(
                    "docker-registry is not installed: run scripts/ensure-registry.sh (or `make registry`)"
                )
            }
            Err(e) => return Err(e).context("spawn docker-registry"),
        };
        let registry = Self { port, dir, child };
        registry.wait_ready()?;
        Ok(registry)
    }

    /// `127.0.0.1:<port>`: the registry part of its image references.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `<host>/<repository>:<tag>`.
    pub fn image(&self, repository: &str, tag: &str) -> String {
        format!("{}/{repository}:{tag}", self.host())
    }

    /// Pushes local image `source` as `target` (a reference into this registry) with `user`'s
    /// credentials, then untags `target` locally, leaving `source` as it was.
    pub fn push(&self, source: &str, target: &str, user: (&str, &str)) -> Result<()> {
        let cli = self.dir.join("cli");
        std::fs::create_dir_all(&cli)?;
        let auth =
            base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", user.0, user.1));
        std::fs::write(
            cli.join("config.json"),
            format!(
                r#"{{"auths": {{"{}": {{"auth": "{auth}"}}}}}}"#,
                self.host()
            ),
        )?;
        docker(&["tag", source, target])?;
        let pushed = Command::new("docker")
            .arg("--config")
            .arg(&cli)
            .args(["push", target])
            .stdin(Stdio::null())
            .output()
            .context("docker push")?;
        docker_quietly(&["rmi", target]);
        if !pushed.status.success() {
            bail!(
                "docker push {target}: {}",
                String::from_utf8_lossy(&pushed.stderr).trim()
            );
        }
        Ok(())
    }

    /// Whether the local engine has `reference` (pulled, or left over).
    pub fn present_locally(reference: &str) -> bool {
        docker(&["image", "inspect", reference]).is_ok()
    }

    fn wait_ready(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            // The API root answers 401 to anonymous requests once the registry serves.
            if self.status_of("/v2/").is_some_and(|s| s.contains(" 401 ")) {
                return Ok(());
            }
            if Instant::now() > deadline {
                let log =
                    std::fs::read_to_string(self.dir.join("registry.log")).unwrap_or_default();
                bail!(
                    "docker-registry on port {} not ready in 20 s:\n{log}",
                    self.port
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn status_of(&self, path: &str) -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .ok()?;
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).ok()?;
        Some(
            String::from_utf8_lossy(&buf[..n])
                .lines()
                .next()?
                .to_string(),
        )
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for PrivateRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Every local tag of this registry: ours alone (its port is ours), pushed or pulled.
        let prefix = format!("{}/", self.host());
        let tags = docker(&["images", "--format", "{{.Repository}}:{{.Tag}}"]).unwrap_or_default();
        for tag in tags.lines().filter(|t| t.starts_with(&prefix)) {
            docker_quietly(&["rmi", tag]);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}
