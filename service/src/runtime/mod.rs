//! The session runtime: how commands, fs ops and seed extraction reach a session's files.
//!
//! Handlers and session logic see [`SessionRuntime`] only. Its implementation, [`HelperRuntime`],
//! talks to `daiv-sandbox-helper` inside the container (the `sandbox-helper` crate) in the
//! typed protocol both share (the `sandbox-protocol` crate), over one long-lived attached exec
//! per session and replica ([`channel`]): no Docker round trip per operation, and every
//! operation runs as the sandbox user, so permissions are the kernel's and nothing running as
//! root acts on a path the sandbox can change. [`ContainerEngine`] keeps container and network
//! lifecycle only.
//!
//! Channels open lazily on first use and again after the helper or its container went away;
//! a request that never reached a helper is retried once on a fresh channel, and a read-only
//! one also when the helper died under it. Anything else answers 503 (retryable): never a
//! wrong answer.
//!
//! [`HelperRuntime`] (in `helper`: a channel per session, retries; in `calls`: each call as
//! requests and answers) implements it. [`helper_binary`] (in `helper_bin`) finds the static helper binary the sandboxes are given;
//! [`HelperError`] (in `error`) says why an operation through the helper did not complete;
//! [`ServiceFile`] (in `writer`) is how a file the service owns (root's or the gateway user's)
//! gets into a container, through the helper's `write-file` where it can.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sandbox_protocol::files::FileAnswer;
use sandbox_protocol::message::{ByteRange, DiskInfo, ExtractStats, ProcRequest, Request};
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use tokio::sync::mpsc;

use crate::api::RunResult;

mod calls;
pub mod channel;
mod error;
mod files;
mod helper;
mod helper_bin;
mod listing;
mod ports;
mod watch;
mod writer;

pub use error::HelperError;
pub use files::{FileRead, FileStream};
pub use helper::{HelperRuntime, own_helper_path};
pub use helper_bin::helper_binary;
pub use listing::{Listing, ListingStream};
pub use ports::{PORT_WINDOW, PortStream, PortTraffic};
pub use watch::{WATCH_QUEUE, WatchOpen};
pub use writer::{ServiceFile, Writer, Written};

/// Exit code reported for a command whose helper vanished under it (it was killed, or the
/// container stopped): the command's fate is unknown.
pub const LOST_EXIT_CODE: i64 = -1;
/// Server-side deadline of one fs op; the helper stops the op (and its walk) past it.
pub const FS_DEADLINE: Duration = Duration::from_secs(30);
/// How long past its own deadline (or its wait) an answer may take before the call gives up:
/// a helper that does not answer costs a request this much, never more.
const ANSWER_GRACE: Duration = Duration::from_secs(10);
/// How long the engine may take to answer whether it is still there, when a helper's channel
/// was lost mid-command (a hung engine is as good as a dead one).
const ENGINE_CHECK: Duration = Duration::from_secs(3);
/// Longest a process request (but a poll's wait) or a `seeded` check may take.
const SHORT_CALL: Duration = Duration::from_secs(20);
/// Longest the workspace's disk walk may take (a sample skips its disk past it).
const DISK_CALL: Duration = Duration::from_secs(10);
/// Longest an emptying of a failed seed's destination may take.
const CLEAR_DEADLINE: Duration = Duration::from_secs(120);
/// Longest a seed's extraction may go without taking a chunk or, at the end, answering.
const EXTRACT_STALL: Duration = Duration::from_secs(60);
/// Longest a streamed run's client may leave its output unread before the run is given up
/// (cancelled in the helper): until then the session's other requests wait behind it.
const STREAM_STALL: Duration = Duration::from_secs(10);
/// After a helper broke the protocol, how long its session gets 503s before a channel is
/// opened again (a flooding helper costs one open per period).
const QUIET_AFTER_VIOLATION: Duration = Duration::from_secs(30);
/// Largest `read` answer: 512,000 bytes of content, even escaped character by character.
const READ_ANSWER_MAX: usize = 4 * 1024 * 1024;

/// A request's commands, as the run route received them.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub commands: Vec<String>,
    pub fail_fast: bool,
    pub timeout: Option<Duration>,
    pub output_cap: usize,
    /// Output bytes kept for the whole request: a batch of many commands costs at most this.
    pub run_output_cap: usize,
    pub workdir: String,
    pub env: Vec<(String, String)>,
}

/// What a streaming run reports while it works (see [`SessionRuntime::run_streaming`]).
#[derive(Debug)]
pub enum RunEvent {
    /// Output of command `index`, as the helper forwarded it (within the output cap).
    Output {
        index: usize,
        data: Bytes,
        /// From the command's stderr (else its stdout).
        stderr: bool,
    },
    /// Command `index` ended; `result` is its entry of the final results.
    Result { index: usize, result: RunResult },
}

/// A helper's answer: its `ok` value, still JSON until the caller parses it into the op's own
/// type ([`Answer::parse`], no intermediate `Value`), and a poll's output bytes.
#[derive(Debug)]
pub struct Answer {
    ok: Box<RawValue>,
    pub output: Bytes,
}

impl Answer {
    /// The `ok` value as `T`; another shape is a helper that does not speak the protocol.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, HelperError> {
        serde_json::from_str(self.ok.get()).map_err(|e| {
            tracing::warn!(error = %e, "session helper answered with an unexpected shape");
            HelperError::UnexpectedAnswer
        })
    }
}

#[async_trait::async_trait]
pub trait SessionRuntime: Send + Sync + 'static {
    /// Runs the commands in order; a timed-out command ends the batch (exit code 124).
    async fn run(&self, id: &str, spec: &RunSpec) -> Result<Vec<RunResult>, HelperError> {
        self.run_streaming(id, spec, None).await
    }
    /// [`Self::run`], also reporting output and each command's end on `events` as they happen.
    /// Dropping the future cancels the batch (the helper kills the running command's group).
    async fn run_streaming(
        &self,
        id: &str,
        spec: &RunSpec,
        events: Option<mpsc::Sender<RunEvent>>,
    ) -> Result<Vec<RunResult>, HelperError>;
    /// One background-process request; `input` is stdin for a `stdin` request. A poll's
    /// output is the answer's `output`.
    async fn process(
        &self,
        id: &str,
        request: ProcRequest,
        input: Option<Bytes>,
    ) -> Result<Answer, HelperError>;
    /// One fs op (`read`, `grep`, `write`, `edit`, `delete`), `input` its content
    /// (write). The answer is the op's complete wire response (with its own `error` field).
    async fn fs(
        &self,
        id: &str,
        request: Request,
        input: Option<Bytes>,
    ) -> Result<Answer, HelperError>;
    /// An `ls` or `glob` (`request`): the listing streaming, or the helper's answer without one
    /// (the op's wire response with its `error`). The helper found every entry first, within the
    /// request's `max_bytes`.
    async fn listing(&self, id: &str, request: Request) -> Result<Listing, HelperError>;
    /// A raw read of `path` (anywhere in the container, as the sandbox user), streamed.
    async fn read_file(
        &self,
        id: &str,
        path: &str,
        range: Option<ByteRange>,
    ) -> Result<FileRead, HelperError>;
    /// A raw, atomic write (`request` a [`Request::FileWrite`]) of what `body` yields; a
    /// producer that fails sends `Err` and nothing is left written.
    async fn write_file(
        &self,
        id: &str,
        request: Request,
        body: mpsc::Receiver<std::io::Result<Bytes>>,
    ) -> Result<FileAnswer, HelperError>;
    /// Watches directory `path` (anywhere, as the sandbox user; `recursive`: everything below
    /// it too): armed when this answers. Dropping the changes' receiver ends the watch.
    async fn watch(&self, id: &str, path: &str, recursive: bool) -> Result<WatchOpen, HelperError>;
    /// Extracts a (sanitised) tar stream under `dest`, as the sandbox user.
    /// A producer that fails sends `Err` (and its own error is what the caller reports).
    async fn extract(
        &self,
        id: &str,
        dest: &str,
        tar: mpsc::Receiver<std::io::Result<Bytes>>,
    ) -> Result<ExtractStats, HelperError>;
    /// Empties `dest` (a failed seed leaves nothing behind).
    async fn clear(&self, id: &str, dest: &str) -> Result<(), HelperError>;
    /// Whether the session was seeded (its root-owned marker exists).
    async fn seeded(&self, id: &str) -> Result<bool, HelperError>;
    /// The workspace's filesystem size and the bytes allocated under it.
    async fn disk(&self, id: &str) -> Result<DiskInfo, HelperError>;
    /// A connection to `127.0.0.1:port` in the session's network namespace, over its
    /// channel (ingress); [`HelperError::PortClosed`] when nothing listens there.
    async fn connect(&self, id: &str, port: u16) -> Result<PortStream, HelperError>;
    /// Opens the session's channel ahead of its first use (best effort).
    async fn warm(&self, id: &str);
    /// Drops the session's channel (the session is being removed or stopped).
    fn forget(&self, id: &str);
}

/// Opens `id`'s helper channel in the background: the first command or fs op then finds it
/// ready instead of paying for the exec that opens it.
pub fn warm_in_background(runtime: &Arc<dyn SessionRuntime>, id: &str) {
    let runtime = runtime.clone();
    let id = id.to_string();
    tokio::spawn(async move { runtime.warm(&id).await });
}

#[cfg(test)]
mod tests {
    use super::calls::command_output;
    use super::*;

    #[test]
    fn truncated_output_says_how_much_was_dropped() {
        let spec = RunSpec {
            commands: Vec::new(),
            fail_fast: false,
            timeout: None,
            output_cap: 3,
            run_output_cap: 5,
            workdir: String::new(),
            env: Vec::new(),
        };
        let s = command_output(b"abc", 10, &spec);
        assert!(s.starts_with("abc\n[daiv-sandbox: output truncated: 10 bytes omitted"));
        assert!(s.contains("3 bytes per command and 5 per request"), "{s}");
        assert_eq!(command_output(b"abc", 0, &spec), "abc");
    }
}
