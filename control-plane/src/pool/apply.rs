//! What a claim applies to its member: the request's environment, limits and egress policy.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use futures::StreamExt;
use shared_policy::PolicyFile;
use tokio::io::AsyncWriteExt;

use super::{Kind, Member};
use crate::api::StartSessionRequest;
use crate::archive::{Archive, ROOT};
use crate::engine::{ContainerEngine, EngineError, ExecSpec};
use crate::layout::{ENV_FILE, HELPER, SERVICE_DIR};
use crate::session::{SessionError, Sessions};

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
    let said = write_then(engine, id, user, path, mode, content, &[]).await?;
    if said == "ok\n" {
        Ok(())
    } else {
        Err(EngineError::Unavailable(format!(
            "write-file answered {said:?}"
        )))
    }
}

/// [`write_by_helper`], then `then` (a command in the container) in the same exec: returns what
/// the exec printed (at most 4 KiB): `ok` after the write, then `then`'s output, then
/// `exit N`.
pub async fn write_then(
    engine: &dyn ContainerEngine,
    id: &str,
    user: &str,
    path: &str,
    mode: u32,
    content: Bytes,
    then: &[String],
) -> Result<String, EngineError> {
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
    let mut exec = engine.exec_attached(id, &spec).await?;
    let broken = |e: std::io::Error| EngineError::Unavailable(format!("write-file: {e}"));
    exec.input.write_all(&content).await.map_err(broken)?;
    exec.input.shutdown().await.map_err(broken)?;
    let mut said = Vec::new();
    while let Some(chunk) = exec.output.next().await {
        let chunk = chunk?;
        if said.len() < 4096 {
            said.extend_from_slice(&chunk);
        }
    }
    Ok(String::from_utf8_lossy(&said).into_owned())
}

impl Sessions {
    /// Applies the request to a claimed member: environment, limits and policy, side by side.
    pub(super) async fn apply(
        &self,
        member: &Member,
        req: &StartSessionRequest,
        policy: Option<&PolicyFile>,
        kind: Kind,
    ) -> Result<(), SessionError> {
        let id = member.id.as_str();
        let env = async {
            let Some(json) = env_json(req, kind) else {
                return Ok(());
            };
            let by_helper =
                write_by_helper(&*self.engine, id, "0:0", ENV_FILE, 0o644, json.clone()).await;
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
                    Ok(egress.install(triad, policy).await?)
                }
                _ => Err(SessionError::MemberWithoutGateway),
            }
        };
        let (env, limits, policy) = tokio::join!(env, limits, policy);
        env.and(limits).and(policy)
    }
}
