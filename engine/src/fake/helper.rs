//! The fake's session helper: attached execs are served by a host build of the real
//! `daiv-sandbox-helper` (`serve --root <dir>`) over its stdin and stdout, so in-process tests
//! drive the real protocol and ops; `write-file` execs are emulated.

use bytes::Bytes;
use futures::StreamExt;
use sandbox_protocol::layout;

use super::FakeEngine;
use crate::{AttachedExec, ContainerStatus, EngineError, ExecSpec};

impl FakeEngine {
    /// Runs a host build of the real helper (`daiv-sandbox-helper serve --root <dir>`) with its
    /// stdin and stdout as the channel: in-process tests drive the real protocol and ops.
    pub(super) async fn serve_helper(&self, id: &str) -> Result<AttachedExec, EngineError> {
        self.check_up(format!("exec_attached {id}")).await?;
        let running = self.with(|s| {
            s.containers
                .get(id)
                .map(|(_, st)| *st == ContainerStatus::Running)
        });
        match running {
            None => return Err(EngineError::NotFound),
            Some(false) => return Err(EngineError::Conflict("container is not running".into())),
            Some(true) => {}
        }
        let root = self.workspace_dir(id);
        for dir in [layout::REPO, layout::SKILLS, layout::TMP] {
            let sub = dir.strip_prefix(layout::WORKSPACE).unwrap_or(dir);
            std::fs::create_dir_all(root.join(sub.trim_start_matches('/')))
                .map_err(|e| EngineError::Unavailable(e.to_string()))?;
        }
        // The service directory's files (the claim's environment, the seed marker) where the
        // host helper finds them (a sandbox's helper reads them from its root-owned directory).
        let service_dir = self.service_dir(id)?;
        for file in [layout::ENV_FILE, layout::SEED_MARKER] {
            let claimed = self.with(|s| {
                let key = (id.to_string(), file.to_string());
                s.files.get(&key).and_then(|(content, _)| content.clone())
            });
            let host = service_dir.join(service_relative(file));
            match claimed {
                Some(content) => std::fs::create_dir_all(host.parent().unwrap_or(&service_dir))
                    .and_then(|()| std::fs::write(&host, content)),
                None => std::fs::remove_file(&host).or(Ok(())),
            }
            .map_err(|e| EngineError::Unavailable(e.to_string()))?;
        }
        let alive = self.with(|s| s.alive.entry(id.to_string()).or_default().clone());
        let processes = self.supervisor(id, &alive).await?;
        let mut child = tokio::process::Command::new(host_helper())
            .arg("serve")
            .arg("--root")
            .arg(&root)
            .arg("--service-dir")
            .arg(&service_dir)
            .arg("--processes")
            .arg(&processes)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                EngineError::Unavailable(format!(
                    "cannot run the host helper {}: {e} (build it: cargo build -p sandbox-helper)",
                    host_helper().display()
                ))
            })?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(EngineError::Unavailable("helper pipes missing".into()));
        };
        let dies = alive.clone();
        let output = tokio_util::io::ReaderStream::new(stdout)
            .map(|r| r.map_err(|e| EngineError::Unavailable(e.to_string())))
            .take_until(alive.cancelled_owned())
            // Keeps the child (and so the helper) alive as long as the stream is; a container
            // that stops takes its helper with it.
            .chain(
                futures::stream::once(async move {
                    tokio::select! {
                        _ = child.wait() => {}
                        () = dies.cancelled() => {
                            let _ = child.kill().await;
                        }
                    }
                    Err(EngineError::Unavailable("helper exited".into()))
                })
                .filter(|_| async { false }),
            )
            .boxed();
        // Held here (`hold("serving <id>")`), a test can stop or remove the container under an
        // exec that has started: its stream then ends before the helper says it is ready.
        self.holdable(&format!("serving {id}")).await;
        Ok(AttachedExec {
            output,
            input: Box::pin(stdin),
        })
    }

    /// The abstract socket of container `id`'s process supervisor: a host build of the helper's
    /// `init`, started with the container's first channel and killed when the container stops
    /// or goes (`alive`), as a container's keep-alive is. Background processes then run on the
    /// host, as the test's user.
    async fn supervisor(
        &self,
        id: &str,
        alive: &tokio_util::sync::CancellationToken,
    ) -> Result<String, EngineError> {
        let name = format!("{}-{id}", self.dirs.prefix);
        let fresh = self.with(|s| match s.supervised.get(id) {
            Some(running) if !running.is_cancelled() => false,
            _ => {
                s.supervised.insert(id.to_string(), alive.clone());
                true
            }
        });
        if !fresh {
            return Ok(name);
        }
        let child = tokio::process::Command::new(host_helper())
            .arg("init")
            .arg("--processes")
            .arg(&name)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                self.with(|s| s.supervised.remove(id));
                return Err(EngineError::Unavailable(format!(
                    "cannot run the host helper: {e}"
                )));
            }
        };
        let (me, key, alive) = (self.clone(), id.to_string(), alive.clone());
        tokio::spawn(async move {
            alive.cancelled().await;
            let _ = child.kill().await;
            me.with(|s| {
                if s.supervised.get(&key).is_some_and(|t| t.is_cancelled()) {
                    s.supervised.remove(&key);
                }
            });
        });
        // Bound once `/proc/net/unix` lists it (`@name`): a process request before that would
        // find nobody answering.
        let listed = format!("@{name}");
        for _ in 0..500 {
            let table = tokio::fs::read_to_string("/proc/net/unix")
                .await
                .unwrap_or_default();
            if table
                .lines()
                .any(|l| l.split_whitespace().last() == Some(listed.as_str()))
            {
                return Ok(name);
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        Err(EngineError::Unavailable(
            "the host process supervisor did not start".into(),
        ))
    }

    /// The host directory standing in for container `id`'s service directory.
    fn service_dir(&self, id: &str) -> Result<std::path::PathBuf, EngineError> {
        let dir = self.own_dir(id).with_extension("service");
        std::fs::create_dir_all(&dir).map_err(|e| EngineError::Unavailable(e.to_string()))?;
        Ok(dir)
    }

    /// The helper's `write-file PATH MODE`: the content after stdin's header line becomes the
    /// file (as the exec's user), and the answer is `ok`; input cut short writes nothing.
    pub(super) async fn write_file(
        &self,
        id: &str,
        spec: &ExecSpec,
    ) -> Result<AttachedExec, EngineError> {
        let path = spec.cmd.get(2).cloned().unwrap_or_default();
        self.check_up(format!("exec_attached {id} write-file {path}"))
            .await?;
        if !self.with(|s| s.containers.contains_key(id)) {
            return Err(EngineError::NotFound);
        }
        let mode = spec
            .cmd
            .get(3)
            .and_then(|m| u32::from_str_radix(m, 8).ok())
            .unwrap_or(0o644);
        let (uid, gid) = spec
            .user
            .split_once(':')
            .map(|(u, g)| (u.parse().unwrap_or(0), g.parse().unwrap_or(0)))
            .unwrap_or((0, 0));
        let then = spec.cmd.iter().any(|a| a == "--");
        let (input, reader) = tokio::io::duplex(64 * 1024);
        let (tx, rx) = tokio::sync::oneshot::channel::<Bytes>();
        let me = self.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            use tokio::io::{AsyncBufReadExt, AsyncReadExt};
            let mut reader = tokio::io::BufReader::new(reader);
            let mut line = Vec::new();
            let header = match reader.read_until(b'\n', &mut line).await {
                Ok(_) => serde_json::from_slice::<sandbox_protocol::write_file::WriteHeader>(
                    line.strip_suffix(b"\n").unwrap_or(b"not a line"),
                )
                .ok(),
                Err(_) => None,
            };
            let Some(header) = header else { return };
            let mut content = vec![
                0;
                usize::try_from(header.len)
                    .unwrap_or(usize::MAX)
                    .min(1 << 24)
            ];
            if reader.read_exact(&mut content).await.is_ok() {
                // An open channel reads these as they are now (the environment per run, the
                // seed marker per seed), from the host directory the serving helper was given.
                if path.starts_with(&format!("{}/", layout::SERVICE_DIR)) {
                    let Ok(dir) = me.service_dir(&id) else { return };
                    let host = dir.join(service_relative(&path));
                    let written = std::fs::create_dir_all(host.parent().unwrap_or(&dir))
                        .and_then(|()| std::fs::write(&host, &content));
                    if written.is_err() {
                        return;
                    }
                }
                me.with(|s| {
                    s.files
                        .insert((id, path), (Some(content), (mode, uid, gid)))
                });
                // With `-- CMD`, the command "runs" and succeeds.
                let said: &'static [u8] = if then { b"ok\nexit 0\n" } else { b"ok\n" };
                let _ = tx.send(Bytes::from_static(said));
            }
        });
        let output = futures::stream::once(async move {
            rx.await
                .map_err(|_| EngineError::Unavailable("write-file failed".into()))
        })
        .boxed();
        Ok(AttachedExec {
            output,
            input: Box::pin(input),
        })
    }
}

/// A path of the service directory relative to it (as the helper's `--service-dir` maps it).
fn service_relative(path: &str) -> &str {
    path.strip_prefix(layout::SERVICE_DIR)
        .unwrap_or(path)
        .trim_start_matches('/')
}

/// The host build of `daiv-sandbox-helper` next to the test binary (`target/<profile>/`).
pub fn host_helper() -> std::path::PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| {
            exe.ancestors()
                .skip(1)
                .map(|d| d.join("daiv-sandbox-helper"))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| std::path::PathBuf::from("daiv-sandbox-helper"))
}
