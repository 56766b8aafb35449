//! `write-file` execs: how the service writes a root-owned file into a container (a claim's
//! environment, the seed marker, a pool member's policy) without an archive upload, through the
//! helper binary every sandbox and gateway has.

use bytes::Bytes;
use futures::StreamExt;
use sandbox_protocol::write_file::WriteHeader;
use tokio::io::AsyncWriteExt;

use crate::engine::{AttachedExec, ContainerEngine, EngineError, ExecSpec};
use crate::layout::HELPER;

/// Root, the owner of the service directory.
pub const ROOT_USER: &str = "0:0";

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
    writer.finish(&content, Vec::new()).await
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
