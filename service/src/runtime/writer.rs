//! Service files: the one way the service writes a file it owns (root's, or the gateway user's)
//! into a container — a claim's environment, the seed marker, a claim's egress policy:
//!
//! 1. the helper's `write-file` exec opened ahead ([`ServiceFile::open`], a warm-pool member's
//!    before its claim, the seed marker's beside the archives), which costs a write on an open
//!    stream;
//! 2. else a fresh `write-file` exec;
//! 3. else an archive upload ([`ServiceFile::upload`]; the engine starts a process of its own,
//!    ~100 ms), owner and mode from the archive.
//!
//! `write-file`'s answer is read back as a typed [`WriteAnswer`]: the write, then the exit code
//! of the command that followed it (a policy's acknowledgement).
//!
//! # Fallbacks kept for containers made by older builds
//! Step 3 for a sandbox, the seed marker asked of the engine when the helper has no `seeded` op
//! (`workspace::seed`), and a session without the `daiv.sandbox.helper-user` label run as the
//! sandbox user (`runtime`) exist only for containers created by a build from before the
//! helper's header-line `write-file`, its `seeded` op and its own uid. They can go once no such
//! container can be alive: `SESSION_MAX_LIFETIME_SECONDS` after the last instance running such
//! a build was upgraded (warm-pool members are replaced at start-up, their spec hash changed).
//! Step 3 for a gateway stays: a gateway created on the cold path has no helper, so a policy
//! refresh uploads directly.

use std::time::Duration;

use futures::StreamExt;
use sandbox_protocol::write_file::{WriteAnswer, WriteHeader};
use tokio::io::AsyncWriteExt;

use crate::archive::{Archive, Owner, ROOT, entry_name};
use crate::engine::{AttachedExec, ContainerEngine, EngineError, ExecSpec};
use crate::layout::HELPER;

/// Most of a `write-file` exec's output worth keeping.
const ANSWER_MAX: usize = 4096;

/// A file the service owns inside a container, and how it gets there.
#[derive(Debug, Clone)]
pub struct ServiceFile {
    /// The absolute path `write-file` replaces.
    pub path: String,
    pub mode: u32,
    /// Its owner; `write-file` runs as this user, the upload's entry says it.
    pub owner: Owner,
    /// Where an upload puts the file instead, when that is not `path` (a gateway stages its
    /// policy and renames it over the live one itself).
    pub upload_path: Option<String>,
    /// Run by `write-file` after the write (with the write's `args` appended); its exit code is
    /// in the answer.
    pub then: Vec<String>,
    /// Longest one `write-file` attempt may take, the command after it included.
    pub deadline: Duration,
}

/// How a [`ServiceFile`] got written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// By the helper, which answered this.
    ByHelper(WriteAnswer),
    /// By an archive upload: the command after the write (if any) did not run.
    Uploaded,
}

impl ServiceFile {
    /// A root-owned file at `path`, nothing run after it.
    pub fn root(path: &str, mode: u32) -> Self {
        Self {
            path: path.to_string(),
            mode,
            owner: ROOT,
            upload_path: None,
            then: Vec::new(),
            deadline: Duration::from_secs(30),
        }
    }

    /// A root-owned program at `path` (uploaded: it may be what `write-file` would run from).
    pub fn executable(path: &str) -> Self {
        Self::root(path, 0o755)
    }

    /// Opens the `write-file` exec ahead of the write (step 1).
    pub async fn open(
        &self,
        engine: &dyn ContainerEngine,
        id: &str,
    ) -> Result<Writer, EngineError> {
        let mut cmd = vec![
            HELPER.to_string(),
            "write-file".to_string(),
            self.path.clone(),
            format!("{:o}", self.mode),
        ];
        if !self.then.is_empty() {
            cmd.push("--".to_string());
            cmd.extend(self.then.iter().cloned());
        }
        let spec = ExecSpec {
            cmd,
            user: format!("{}:{}", self.owner.0, self.owner.1),
            workdir: None,
            env: Vec::new(),
        };
        let exec = engine.exec_attached(id, &spec).await?;
        Ok(Writer { exec })
    }

    /// Writes `content` into container `id`: through `ahead` when given, else a fresh
    /// `write-file`, else an upload (see the module's doc). `args` go to the command after the
    /// write. An error only when the upload failed too.
    pub async fn write(
        &self,
        engine: &dyn ContainerEngine,
        id: &str,
        content: &[u8],
        args: &[String],
        ahead: Option<Writer>,
    ) -> Result<Written, EngineError> {
        let mut attempt = match ahead {
            Some(writer) => self.through(writer, content, args).await,
            None => Err(Failed::Lost(EngineError::NotFound)),
        };
        // A writer opened ahead can be lost (its exec ended, its container restarted): another
        // is opened. One that did not answer in time is not tried again.
        if let Err(Failed::Lost(_)) = attempt {
            attempt = match self.open(engine, id).await {
                Ok(writer) => self.through(writer, content, args).await,
                Err(e) => Err(Failed::Lost(e)),
            };
        }
        match attempt {
            Ok(answer) => return Ok(Written::ByHelper(answer)),
            Err(e) => {
                tracing::debug!(container = %id, path = %self.path, error = %e, "not written by the helper; uploading it");
            }
        }
        self.upload(engine, id, content).await?;
        Ok(Written::Uploaded)
    }

    /// Step 3 alone: `content` as an archive extracted in the file's directory (which exists:
    /// the service made it when it made the container).
    pub async fn upload(
        &self,
        engine: &dyn ContainerEngine,
        id: &str,
        content: &[u8],
    ) -> Result<(), EngineError> {
        let (dir, tar) = self.archive(content)?;
        let body = futures::stream::once(async move { Ok::<_, std::io::Error>(tar) }).boxed();
        engine.put_archive(id, dir, body).await
    }

    /// The upload: the directory it is extracted in, and the archive holding the file alone.
    fn archive(&self, content: &[u8]) -> Result<(&str, bytes::Bytes), EngineError> {
        let target = self.upload_path.as_deref().unwrap_or(&self.path);
        let (dir, name) = target.rsplit_once('/').unwrap_or(("", target));
        let dir = if dir.is_empty() { "/" } else { dir };
        let mut tar = Archive::new();
        tar.file(entry_name(name), self.mode, self.owner, content);
        let tar = tar
            .finish()
            .map_err(|e| EngineError::Unavailable(format!("archive for {}: {e}", self.path)))?;
        Ok((dir, tar))
    }

    /// One `write-file` attempt: written, or why not (an answer that says it did not write is
    /// a failure, so the next step is tried).
    async fn through(
        &self,
        writer: Writer,
        content: &[u8],
        args: &[String],
    ) -> Result<WriteAnswer, Failed> {
        let answer = tokio::time::timeout(self.deadline, writer.finish(content, args.to_vec()))
            .await
            .map_err(|_| Failed::Slow)?
            .map_err(Failed::Lost)?;
        if answer.written {
            Ok(answer)
        } else {
            Err(Failed::Refused(answer.last_other.unwrap_or_default()))
        }
    }
}

/// Why a `write-file` attempt did not write.
#[derive(Debug, thiserror::Error)]
enum Failed {
    #[error("write-file could not be reached: {0}")]
    Lost(EngineError),
    #[error("write-file did not answer in time")]
    Slow,
    #[error("write-file did not write: {0}")]
    Refused(String),
}

/// A `write-file` exec waiting for its content. Dropped unused, it writes nothing (its input
/// ends before a complete header and content).
pub struct Writer {
    exec: AttachedExec,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Writer")
    }
}

impl Writer {
    /// Writes `content` (the command after it gets `args`) and reads the answer to its end.
    async fn finish(
        mut self,
        content: &[u8],
        args: Vec<String>,
    ) -> Result<WriteAnswer, EngineError> {
        let broken = |e: std::io::Error| EngineError::Unavailable(format!("write-file: {e}"));
        let framed = WriteHeader::frame(content, args);
        self.exec.input.write_all(&framed).await.map_err(broken)?;
        self.exec.input.flush().await.map_err(broken)?;
        // Nothing more will come; the helper needs no end of input, the engine may want one.
        let _ = self.exec.input.shutdown().await;
        // The answer's first line and its last: the head, and a tail past it (the command in
        // between may print any amount).
        let mut head = Vec::new();
        let mut tail: Vec<u8> = Vec::new();
        while let Some(chunk) = self.exec.output.next().await {
            let mut chunk = &chunk?[..];
            if head.len() < ANSWER_MAX {
                let n = chunk.len().min(ANSWER_MAX - head.len());
                head.extend_from_slice(&chunk[..n]);
                chunk = &chunk[n..];
            }
            tail.extend_from_slice(chunk);
            if tail.len() > ANSWER_MAX {
                tail.drain(..tail.len() - ANSWER_MAX);
            }
        }
        Ok(WriteAnswer::parse_cut(&head, &tail))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upload_holds_the_file_alone_with_its_owner_and_mode()
    -> Result<(), Box<dyn std::error::Error>> {
        let mut file = ServiceFile::root(crate::layout::ENV_FILE, 0o644);
        let (dir, tar) = file.archive(b"[]")?;
        assert_eq!(dir, crate::layout::SESSION_DIR);
        let mut archive = tar::Archive::new(&tar[..]);
        let mut entries = archive.entries()?;
        let entry = entries.next().ok_or("empty")??;
        assert_eq!(entry.path()?.to_str(), Some("environment"));
        assert_eq!((entry.header().uid()?, entry.header().mode()?), (0, 0o644));
        drop(entry);
        assert!(entries.next().is_none());
        // A staged upload goes where the gateway renames it from, as the gateway's user.
        file.upload_path = Some("/etc/gw/policy.json.staging".into());
        file.owner = (1000, 1000);
        let (dir, tar) = file.archive(b"{}")?;
        assert_eq!(dir, "/etc/gw");
        let mut archive = tar::Archive::new(&tar[..]);
        let entry = archive.entries()?.next().ok_or("empty")??;
        assert_eq!(entry.path()?.to_str(), Some("policy.json.staging"));
        assert_eq!(entry.header().uid()?, 1000);
        Ok(())
    }
}
