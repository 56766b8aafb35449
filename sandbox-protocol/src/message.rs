//! Messages: the JSON payloads of REQUEST, EVENT and RESPONSE frames, and the `ok` values of
//! the answers that are not fs wire types ([`crate::wire`]). The crate docs give each one's JSON;
//! `tests/snapshot.rs` pins it.

use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::layout;

/// Default `deadline_ms` of fs requests.
pub const DEFAULT_DEADLINE_MS: u64 = 30_000;

fn default_deadline() -> u64 {
    DEFAULT_DEADLINE_MS
}

fn default_limit() -> u64 {
    2000
}

fn default_mode() -> u32 {
    0o644
}

fn default_output_cap() -> u64 {
    16 * 1024 * 1024
}

fn default_depth() -> u32 {
    1
}

fn default_true() -> bool {
    true
}

fn default_workdir() -> String {
    layout::REPO.to_string()
}

/// A REQUEST frame's payload. Paths are wire paths (`/workspace/...`), validated again by the
/// helper.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Ping,
    /// Whether the session was seeded: the root-owned [`SEED_MARKER`](crate::layout::SEED_MARKER)
    /// exists (the one path outside the workspace the helper looks at). Answers [`SeededInfo`].
    Seeded,
    Run {
        commands: Vec<String>,
        #[serde(default)]
        fail_fast: bool,
        /// Per command, from its start; `null` or 0: no limit.
        #[serde(default)]
        timeout_ms: Option<u64>,
        /// Output bytes sent per command; the rest is only counted (`omitted`).
        #[serde(default = "default_output_cap")]
        output_cap: u64,
        #[serde(default = "default_workdir")]
        workdir: String,
        /// Overrides on top of the helper's own environment.
        #[serde(default)]
        env: Vec<(String, String)>,
    },
    Ls {
        path: String,
        #[serde(default = "default_deadline")]
        deadline_ms: u64,
    },
    Read {
        path: String,
        #[serde(default)]
        offset: u64,
        #[serde(default = "default_limit")]
        limit: u64,
        #[serde(default = "default_deadline")]
        deadline_ms: u64,
    },
    Grep {
        pattern: String,
        path: String,
        #[serde(default)]
        glob: Option<String>,
        /// Directory basename globs pruned at any depth (server list + request `exclude`).
        #[serde(default)]
        prune: Vec<String>,
        #[serde(default = "default_deadline")]
        deadline_ms: u64,
    },
    Glob {
        pattern: String,
        path: String,
        #[serde(default)]
        prune: Vec<String>,
        #[serde(default = "default_deadline")]
        deadline_ms: u64,
    },
    /// Content follows as DATA frames, then EOF.
    Write {
        path: String,
        #[serde(default = "default_mode")]
        mode: u32,
        #[serde(default = "default_deadline")]
        deadline_ms: u64,
    },
    Edit {
        path: String,
        old: String,
        new: String,
        #[serde(default)]
        replace_all: bool,
        #[serde(default = "default_deadline")]
        deadline_ms: u64,
    },
    Delete {
        path: String,
        #[serde(default = "default_deadline")]
        deadline_ms: u64,
    },
    /// A sanitised tar stream follows as DATA frames, then EOF. No deadline unless given.
    Extract {
        dest: String,
        #[serde(default)]
        deadline_ms: Option<u64>,
    },
    /// Empties `dest` (keeps `dest` itself). No deadline unless given.
    Clear {
        dest: String,
        #[serde(default)]
        deadline_ms: Option<u64>,
    },
    /// `stat` of a path anywhere in the container (not following a final symlink). Answers
    /// [`files::FsStatResponse`](crate::files::FsStatResponse).
    Stat {
        path: String,
        #[serde(default = "default_deadline")]
        deadline_ms: u64,
    },
    /// A directory anywhere; `parents` creates the missing ones on the way (and an existing
    /// directory is then fine). Answers [`files::FsMkdirResponse`](crate::files::FsMkdirResponse).
    Mkdir {
        path: String,
        #[serde(default)]
        parents: bool,
        #[serde(default = "default_deadline")]
        deadline_ms: u64,
    },
    /// `rename(2)` anywhere (a file or directory; an existing destination file is replaced).
    /// Answers [`files::FsMoveResponse`](crate::files::FsMoveResponse).
    Move {
        source: String,
        destination: String,
        #[serde(default = "default_deadline")]
        deadline_ms: u64,
    },
    /// Entries under a directory anywhere, `depth` levels down (1: its own entries), never
    /// through a symlink. Answers [`files::FsListResponse`](crate::files::FsListResponse).
    List {
        path: String,
        #[serde(default = "default_depth")]
        depth: u32,
        #[serde(default = "default_deadline")]
        deadline_ms: u64,
    },
    /// A regular file's bytes, anywhere: an [`Event::File`] (its size and the part sent), then
    /// that part as DATA frames, then ok [`files::FileAnswer`](crate::files::FileAnswer). No
    /// deadline (the client's pace sets it; CANCEL stops it).
    FileRead {
        path: String,
        #[serde(default)]
        range: Option<ByteRange>,
    },
    /// A file's new content as DATA frames, then EOF: written to a temporary file beside it and
    /// renamed over it (a reader sees the old or the new file, never half), as the sandbox user.
    /// `mode` null keeps an existing file's permission bits (else 0o644); more than `max_bytes`
    /// is refused (`too_large`) and nothing is left behind. Answers
    /// [`files::FileAnswer`](crate::files::FileAnswer).
    FileWrite {
        path: String,
        #[serde(default)]
        mode: Option<u32>,
        #[serde(default = "default_true")]
        parents: bool,
        max_bytes: u64,
    },
    /// A background process request, relayed to the container's process supervisor. For
    /// `stdin`, the bytes follow as DATA frames, then EOF; a `poll` answers with one DATA frame
    /// of output before its RESPONSE.
    Proc {
        request: ProcRequest,
    },
}

/// A background-process request: what `serve` relays to the container's process supervisor
/// (the helper's `init`), there answered on an abstract unix socket in the same frames.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum ProcRequest {
    Start {
        command: String,
        /// Already a path the helper can use (serve maps `/workspace/...` under its root).
        workdir: String,
        #[serde(default)]
        env: Vec<(String, String)>,
        /// Live processes allowed at once; more is a `limit` error.
        max_live: u32,
        /// Output kept per process; older bytes are dropped.
        buffer_bytes: u64,
    },
    List,
    Poll {
        process_id: String,
        #[serde(default)]
        offset: u64,
        #[serde(default)]
        wait_ms: u64,
        max_bytes: u64,
    },
    /// The bytes follow (on the channel as DATA frames then EOF, on the supervisor's socket as
    /// one DATA frame); `eof` closes the process's stdin afterwards.
    Stdin {
        process_id: String,
        #[serde(default)]
        eof: bool,
    },
    Kill {
        process_id: String,
    },
}

/// The answer to [`ProcRequest::Start`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcStarted {
    pub process_id: String,
}

/// The answer to [`ProcRequest::List`]: every process the supervisor remembers, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcList {
    pub processes: Vec<ProcInfo>,
}

/// One process as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcInfo {
    pub process_id: String,
    pub command: String,
    pub running: bool,
    pub exit_code: Option<i64>,
    /// Once it ended: what it cost (protocol 2).
    #[serde(flatten)]
    pub usage: Usage,
}

/// A poll's answer; the output itself is the DATA frame before it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PollInfo {
    pub process_id: String,
    pub running: bool,
    pub exit_code: Option<i64>,
    /// Where the returned output starts (later than asked when older bytes were dropped).
    pub offset: u64,
    pub next_offset: u64,
    /// Bytes before `offset` were dropped from the buffer.
    pub truncated: bool,
    /// Once it ended: what it cost (protocol 2).
    #[serde(flatten)]
    pub usage: Usage,
}

/// An HTTP byte range of a [`Request::FileRead`]: `first..=last`; `first` absent: the last
/// `last` bytes; `last` absent: to the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ByteRange {
    #[serde(default)]
    pub first: Option<u64>,
    #[serde(default)]
    pub last: Option<u64>,
}

/// Why a request produced no `ok` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request (JSON, kind, fields) is malformed.
    BadRequest,
    /// CANCEL arrived before the answer.
    Cancelled,
    /// `deadline_ms` passed.
    Deadline,
    /// The operation failed on the helper's side (I/O, response too large, ...).
    Io,
    /// A bug in the helper.
    Internal,
    /// The thing named (a background process) does not exist.
    NotFound,
    /// The request does not fit the target's state (stdin of a process that ended).
    Conflict,
    /// A per-session limit (live background processes) is reached.
    Limit,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseError {
    pub kind: ErrorKind,
    pub message: String,
}

impl fmt::Display for ResponseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

impl std::error::Error for ResponseError {}

/// A RESPONSE frame's payload: `{"ok": value}` or `{"error": {"kind", "message"}}`.
///
/// The helper builds `ok` as a JSON value ([`Response::ok`]); a client may take it as
/// `Response<Box<serde_json::value::RawValue>>` instead, reading the envelope once and the
/// value into the op's own type when it knows which that is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response<T = serde_json::Value> {
    Ok(T),
    Error(ResponseError),
}

impl Response {
    /// `{"ok": value}`.
    pub fn ok<T: Serialize>(value: &T) -> Response {
        match serde_json::to_value(value) {
            Ok(v) => Response::Ok(v),
            Err(e) => Response::error(ErrorKind::Internal, format!("serialising: {e}")),
        }
    }

    /// `{"ok": {}}`.
    pub fn empty() -> Response {
        Response::Ok(serde_json::Value::Object(serde_json::Map::new()))
    }

    /// `{"error": {"kind", "message"}}`.
    pub fn error(kind: ErrorKind, message: impl Into<String>) -> Response {
        Response::Error(ResponseError {
            kind,
            message: message.into(),
        })
    }

    /// The `ok` value as `T`; an error response, or an `ok` not shaped like `T`, is an `Err`.
    pub fn into_result<T: DeserializeOwned>(self) -> Result<T, ResponseError> {
        match self {
            Response::Ok(v) => serde_json::from_value(v).map_err(|e| ResponseError {
                kind: ErrorKind::Internal,
                message: format!("unexpected ok value: {e}"),
            }),
            Response::Error(e) => Err(e),
        }
    }
}

/// An EVENT frame's payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// Sent once on id 0 when the helper starts.
    Ready {
        protocol: u32,
        version: String,
        pid: u32,
    },
    /// Command `index` of a `run` began; DATA frames that follow are its output.
    Started { index: u32 },
    /// A `file_read` found its file: `size` bytes, of which `length` from `start` follow as
    /// DATA frames.
    File { size: u64, start: u64, length: u64 },
    /// Command `index` ended.
    Finished {
        index: u32,
        /// Exit code, 128 + signal when killed, 124 on timeout, 127 without a shell.
        exit_code: i64,
        /// Output bytes over `output_cap`, counted but not sent.
        omitted: u64,
        timed_out: bool,
        /// What the command cost (protocol 2; absent from older helpers).
        #[serde(flatten)]
        usage: Usage,
    },
}

/// What a command or an ended background process cost: wall time, CPU time (user + system of
/// its process tree: the shell and every descendant it waited for, as `wait4` counts them) and
/// peak resident memory (the largest of its process group's processes, sampled while it ran).
/// Each field is absent where the helper could not measure it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rss_bytes: Option<u64>,
}

/// The `ok` value of `extract`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtractStats {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    /// Bytes of regular-file content written.
    pub bytes: u64,
    /// Members refused (a symlink or non-directory in the way, unsupported type, bad name).
    #[serde(default)]
    pub skipped: u64,
}

/// The `ok` value of [`Request::Seeded`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeededInfo {
    pub seeded: bool,
}
