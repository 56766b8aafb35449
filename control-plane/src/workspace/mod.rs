//! The workspace: seeding it from archives ([`seed`]) and the Python-free file operations
//! ([`fs`]), over [`ContainerEngine`] only.
//!
//! Content moves through the archive API (`get_archive`/`put_archive`, whose tar entries carry
//! the sandbox's uid/gid, so nothing needs `chown`); listing and searching run POSIX `find`,
//! `grep -E`, `rm` and `mkdir` as `RUN_UID:RUN_GID`, never root, so the container's own
//! permissions apply. The scripts use only what busybox and GNU both provide, and pass every
//! request value as a positional argument: nothing from a request is ever spliced into a script.
//!
//! # Layout
//! - [`wire`]: request and response types (DAIV validates responses against its schemas).
//! - [`sanitize`]: the synchronous tar sanitiser behind seeding.
//! - [`seed`]: the streaming seed pipeline and its one-shot marker.
//! - [`fs`]: `ls`, `read`, `grep`, `glob`, `write`, `edit`, `delete`.

use std::io::{self, Read, Write};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use tokio::sync::mpsc;

use crate::engine::{ContainerEngine, ExecSpec};
use crate::error::ApiError;

pub mod fs;
pub mod sanitize;
pub mod seed;
pub mod wire;

/// Root of everything the fs ops may touch.
pub const WORKSPACE: &str = "/workspace";

/// Most bytes kept from one helper script's output; the rest is drained and dropped, so a huge
/// listing cannot grow the service's memory.
const SCRIPT_OUTPUT_MAX: usize = 16 * 1024 * 1024;

/// Exit codes the helper scripts use to say what went wrong (stderr is discarded, and tools
/// reuse 1 and 2 for several conditions). None collide with `test`/`find`/`grep`/`xargs`.
pub(crate) mod exit {
    pub const BAD_PATTERN: i64 = 6;
    pub const ABSENT: i64 = 7;
    pub const WRONG_TYPE: i64 = 8;
    pub const DENIED: i64 = 9;
    pub const EXISTS: i64 = 10;
    pub const PARENT_NOT_DIR: i64 = 11;
    // 12: any other failure, reported as `exec_failed`.
}

/// A lexically validated absolute path under [`WORKSPACE`]: no `..`, NUL, CR or LF; repeated
/// slashes, `.` components and a trailing slash removed. Symlinks are not resolved (the README's
/// "path confinement is lexical"): the container, not this prefix, is the trust boundary.
pub fn validate_path(path: &str, allow_root: bool) -> Result<String, String> {
    if path.contains(['\0', '\n', '\r']) {
        return Err(format!(
            "path must not contain NUL or newline characters: {path:?}"
        ));
    }
    if !path.starts_with('/') {
        return Err(format!("path must be absolute, got: {path:?}"));
    }
    let comps: Vec<&str> = path
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    if comps.contains(&"..") {
        return Err(format!("path must not contain '..' segments: {path:?}"));
    }
    let canonical = format!("/{}", comps.join("/"));
    if canonical == WORKSPACE {
        if allow_root {
            return Ok(canonical);
        }
        return Err(format!(
            "path must name a file under {WORKSPACE}, not the root itself: {path:?}"
        ));
    }
    if canonical.starts_with(&format!("{WORKSPACE}/")) {
        return Ok(canonical);
    }
    Err(format!("path must be under {WORKSPACE}, got: {path:?}"))
}

/// What a helper script printed and how it ended.
pub(crate) struct ScriptOutput {
    pub code: i64,
    pub stdout: Vec<u8>,
    /// The output went over [`SCRIPT_OUTPUT_MAX`] and was cut.
    pub cut: bool,
}

/// Runs `script` with `/bin/sh` as the sandbox user, `args` as `$1...`. Three Docker round trips
/// (exec create, start, inspect). Output is stdout and stderr merged; scripts silence stderr.
pub(crate) async fn run_script(
    engine: &dyn ContainerEngine,
    id: &str,
    user: &str,
    script: &str,
    args: &[&str],
) -> Result<ScriptOutput, ApiError> {
    let mut cmd = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        script.to_string(),
        "daiv-fs".to_string(),
    ];
    cmd.extend(args.iter().map(|a| a.to_string()));
    let spec = ExecSpec {
        cmd,
        user: user.to_string(),
        workdir: Some("/".to_string()),
        // Tools' messages in one language: scripts match on them.
        env: vec![("LC_ALL".to_string(), "C".to_string())],
    };
    let mut exec = engine.exec(id, &spec).await?;
    let mut stdout = Vec::new();
    let mut cut = false;
    while let Some(chunk) = exec.output.next().await {
        let chunk = chunk?;
        let room = SCRIPT_OUTPUT_MAX.saturating_sub(stdout.len());
        if chunk.len() > room {
            cut = true;
        }
        stdout.extend_from_slice(&chunk[..room.min(chunk.len())]);
    }
    for attempt in 0..50u32 {
        if let Some(code) = engine.exec_exit_code(&exec.exec_id).await? {
            return Ok(ScriptOutput { code, stdout, cut });
        }
        tokio::time::sleep(Duration::from_millis(5 * u64::from(attempt.min(20)) + 1)).await;
    }
    Err(ApiError::Unavailable(
        "the helper's exit code was not reported by the container engine".to_string(),
    ))
}

/// Lexically joins a symlink's `target` onto the directory holding `link` (Docker resolves `..`
/// lexically as well).
pub(crate) fn join_link(link: &str, target: &str) -> String {
    let mut comps: Vec<&str> = if target.starts_with('/') {
        Vec::new()
    } else {
        let parent = link.rsplit_once('/').map(|(p, _)| p).unwrap_or("");
        parent.split('/').filter(|c| !c.is_empty()).collect()
    };
    for c in target.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                comps.pop();
            }
            c => comps.push(c),
        }
    }
    format!("/{}", comps.join("/"))
}

// === impl ChannelReader / ChannelWriter ===

/// The blocking end of an async → sync byte pipe: a bounded channel, so the producer waits when
/// the sanitiser is behind and memory stays at a few chunks.
pub(crate) struct ChannelReader {
    rx: mpsc::Receiver<Bytes>,
    cur: Bytes,
}

impl ChannelReader {
    pub fn new(rx: mpsc::Receiver<Bytes>) -> Self {
        Self {
            rx,
            cur: Bytes::new(),
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                Some(b) => self.cur = b,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur[..n]);
        let _ = self.cur.split_to(n);
        Ok(n)
    }
}

/// The blocking start of a sync → async byte pipe, batching writes into 64 KiB chunks.
pub(crate) struct ChannelWriter {
    tx: mpsc::Sender<io::Result<Bytes>>,
    buf: BytesMut,
}

const WRITE_CHUNK: usize = 64 * 1024;

impl ChannelWriter {
    pub fn new(tx: mpsc::Sender<io::Result<Bytes>>) -> Self {
        Self {
            tx,
            buf: BytesMut::with_capacity(WRITE_CHUNK),
        }
    }

    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = self.buf.split().freeze();
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "archive consumer went away"))
    }

    /// Makes the consumer's stream fail, so a half-written archive is never taken as complete.
    pub fn abort(self, why: &str) {
        let _ = self
            .tx
            .blocking_send(Err(io::Error::other(why.to_string())));
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= WRITE_CHUNK {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_validated_lexically() {
        assert_eq!(
            validate_path("/workspace//repo/./a/", false).as_deref(),
            Ok("/workspace/repo/a")
        );
        assert_eq!(
            validate_path("/workspace", true).as_deref(),
            Ok("/workspace")
        );
        assert_eq!(
            validate_path("/workspace/", true).as_deref(),
            Ok("/workspace")
        );
        for bad in [
            "/workspace",
            "workspace/repo",
            "/workspace/../etc",
            "/workspace/repo/a\nb",
            "/workspace/a\0",
            "/workspacex/a",
            "/etc/passwd",
            "",
        ] {
            assert!(validate_path(bad, false).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn link_targets_join_lexically() {
        assert_eq!(join_link("/workspace/repo/l", "a/b"), "/workspace/repo/a/b");
        assert_eq!(join_link("/workspace/repo/l", "../x"), "/workspace/x");
        assert_eq!(join_link("/workspace/repo/l", "/etc/hosts"), "/etc/hosts");
        assert_eq!(join_link("/a/l", "../../../x"), "/x");
    }
}
