//! What a claim applies to its member: the request's environment, limits and egress policy.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use futures::StreamExt;
use shared_policy::PolicyFile;
use tokio::io::AsyncWriteExt;

use super::{Kind, Member, Prepared};
use crate::api::StartSessionRequest;
use crate::archive::{Archive, ROOT};
use crate::engine::{AttachedExec, ContainerEngine, EngineError, ExecSpec};
use crate::layout::{ENV_FILE, HELPER, SERVICE_DIR};
use crate::session::{SessionError, Sessions};
use sandbox_helper::protocol::WriteHeader;

/// The claim's environment as the helper reads it (a JSON list of pairs): the caller's
/// variables, minus those the egress settings set (they win, as at a cold create).
pub(crate) fn env_json(req: &StartSessionRequest, kind: Kind) -> Option<Bytes> {
    let env: Vec<(&String, &String)> = req
        .environment
        .iter()
        .flatten()
        .filter(|(k, _)| kind == Kind::Isolated || !crate::egress::sets_env(k))
        .collect();
    if env.is_empty() {
        return None;
    }
    serde_json::to_vec(&env).ok().map(Bytes::from)
}

/// The environment file as an archive for the service directory: root's, world-readable (the
/// sandbox user reads it, never replaces it).
pub(crate) fn env_tar(json: Bytes) -> Bytes {
    let name = ENV_FILE.rsplit('/').next().unwrap_or("environment");
    let mut tar = Archive::new();
    tar.file(name, 0o644, ROOT, &json);
    tar.finish().unwrap_or_default()
}

/// Replaces `path` in container `id` with `content`, written as `user` by the session helper's
/// `write-file` (one exec; an archive upload costs the engine a process of its own, ~100 ms).
/// Done once the helper says `ok`, which it prints after the rename.
pub async fn write_by_helper(
    engine: &dyn ContainerEngine,
    id: &str,
    user: &str,
    path: &str,
    mode: u32,
    content: Bytes,
) -> Result<(), EngineError> {
    let writer = Writer::open(engine, id, user, path, mode, &[]).await?;
    writer.finish(&content, Vec::new()).await.map(|_| ())
}

/// A `write-file` exec waiting for its content: opened ahead of a warm-pool claim so that the
/// claim costs a write on an open stream instead of an exec's create and start. Dropped unused,
/// it writes nothing (its input ends before a complete header and content).
pub struct Writer {
    exec: AttachedExec,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Writer")
    }
}

impl Writer {
    pub async fn open(
        engine: &dyn ContainerEngine,
        id: &str,
        user: &str,
        path: &str,
        mode: u32,
        then: &[String],
    ) -> Result<Self, EngineError> {
        let mut cmd = vec![
            HELPER.to_string(),
            "write-file".to_string(),
            path.to_string(),
            format!("{mode:o}"),
        ];
        if !then.is_empty() {
            cmd.push("--".to_string());
            cmd.extend(then.iter().cloned());
        }
        let spec = ExecSpec {
            cmd,
            user: user.to_string(),
            workdir: None,
            env: Vec::new(),
        };
        let exec = engine.exec_attached(id, &spec).await?;
        Ok(Self { exec })
    }

    /// Writes `content`; `ok` or an error.
    pub async fn finish(self, content: &[u8], args: Vec<String>) -> Result<(), EngineError> {
        let said = self.finish_then(content, args).await?;
        if said == "ok\n" {
            Ok(())
        } else {
            Err(EngineError::Unavailable(format!(
                "write-file answered {said:?}"
            )))
        }
    }

    /// Writes `content` (the command after it gets `args`); what the exec printed.
    pub async fn finish_then(
        mut self,
        content: &[u8],
        args: Vec<String>,
    ) -> Result<String, EngineError> {
        let broken = |e: std::io::Error| EngineError::Unavailable(format!("write-file: {e}"));
        let framed = WriteHeader::frame(content, args);
        self.exec.input.write_all(&framed).await.map_err(broken)?;
        self.exec.input.flush().await.map_err(broken)?;
        // This helper needs no end of input; one from before the framed input (a session
        // created by an older version) reads to the end, so end it where the engine can.
        let _ = self.exec.input.shutdown().await;
        let mut said = Vec::new();
        while let Some(chunk) = self.exec.output.next().await {
            let chunk = chunk?;
            if said.len() < 4096 {
                said.extend_from_slice(&chunk);
            }
        }
        Ok(String::from_utf8_lossy(&said).into_owned())
    }
}

/// Who writes the environment file: root, the owner of the service directory.
pub const ROOT_USER: &str = "0:0";

impl Sessions {
    /// Opens what a claim of `member` writes through (see [`Prepared`]); what cannot be opened
    /// is opened at the claim instead.
    pub(crate) async fn prepare(&self, member: &Member) -> Prepared {
        let env = Writer::open(&*self.engine, &member.id, ROOT_USER, ENV_FILE, 0o644, &[]);
        let policy = async {
            match (&member.triad, &self.egress) {
                (Some(triad), Some(egress)) => egress.installer(triad).await.ok(),
                _ => None,
            }
        };
        let (env, policy) = tokio::join!(env, policy);
        Prepared {
            env: env.ok(),
            policy,
        }
    }

    /// Applies the request to a claimed member: environment, limits and policy, side by side.
    pub(super) async fn apply(
        &self,
        member: &Member,
        req: &StartSessionRequest,
        policy: Option<&PolicyFile>,
        kind: Kind,
        prepared: Prepared,
    ) -> Result<(), SessionError> {
        let id = member.id.as_str();
        let Prepared {
            env: env_writer,
            policy: installer,
        } = prepared;
        let env = async {
            let Some(json) = env_json(req, kind) else {
                return Ok(());
            };
            let mut by_helper = Err(EngineError::NotFound);
            if let Some(writer) = env_writer {
                by_helper = writer.finish(&json, Vec::new()).await;
            }
            if by_helper.is_err() {
                by_helper =
                    write_by_helper(&*self.engine, id, ROOT_USER, ENV_FILE, 0o644, json.clone())
                        .await;
            }
            if let Err(e) = by_helper {
                tracing::debug!(session_id = %id, error = %e, "environment not written by the helper; uploading it");
                let tar = env_tar(json);
                let body = futures::stream::once(async move { Ok(tar) }).boxed();
                self.engine.put_archive(id, SERVICE_DIR, body).await?;
            }
            Ok::<_, SessionError>(())
        };
        let limits = async {
            if req.memory_bytes.is_none() && req.cpus.is_none() {
                return Ok(());
            }
            let nano_cpus = req.cpus.map(|c| (c * 1e9).round() as i64);
            match self
                .engine
                .update_limits(id, req.memory_bytes, nano_cpus)
                .await
            {
                Ok(()) => Ok(()),
                Err(e) => {
                    if !matches!(e, EngineError::NotFound) {
                        self.pool.limits_refused.store(true, Ordering::Relaxed);
                    }
                    Err(SessionError::from(e))
                }
            }
        };
        let policy = async {
            match (policy, &member.triad, &self.egress) {
                (None, _, _) => Ok(()),
                (Some(policy), Some(triad), Some(egress)) => {
                    Ok(egress.install(triad, policy, installer).await?)
                }
                _ => Err(SessionError::MemberWithoutGateway),
            }
        };
        let (env, limits, policy) = tokio::join!(env, limits, policy);
        env.and(limits).and(policy)
    }
}
