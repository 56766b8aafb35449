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

fn default_list_max_bytes() -> u64 {
    crate::wire::LIST_MAX_BYTES
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
    /// The workspace's disk: its filesystem's size and the bytes allocated under it. Answers
    /// [`DiskInfo`] (protocol 3).
    Disk,
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
        /// stdout and stderr in pipes of their own, stderr's bytes as STDERR frames (protocol 4).
        /// Without it both share one pipe, so their interleaving is exactly the order written.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        split: bool,
    },
    /// One directory level, streamed (protocol 6): an [`Event::Listing`], the entries as DATA
    /// frames (each a JSON array of [`FsEntry`](crate::wire::FsEntry)), then ok `{}`; or,
    /// before any of that, ok [`FsLsResponse`](crate::wire::FsLsResponse) with its `error`.
    Ls {
        path: String,
        /// Largest listing sent, in bytes of its entries' JSON (with a comma each); a larger
        /// one is the error `too_large` and nothing of it is sent (protocol 6).
        #[serde(default = "default_list_max_bytes")]
        max_bytes: u64,
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
    /// Paths matching a glob, streamed as [`Request::Ls`] streams (protocol 6); its error
    /// answer is an [`FsGlobResponse`](crate::wire::FsGlobResponse).
    Glob {
        pattern: String,
        path: String,
        #[serde(default)]
        prune: Vec<String>,
        /// As [`Request::Ls`]'s.
        #[serde(default = "default_list_max_bytes")]
        max_bytes: u64,
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
    /// is refused (`too_large`) and nothing is left behind. `in_place` (protocol 5) writes the
    /// file itself instead, truncated first, as a shell's `>` does: a watcher sees the file's
    /// own create and write, a reader may see it half-written, and content over `max_bytes`
    /// leaves what was written. `metadata` (protocol 8), when given, becomes the file's
    /// `user.e2b.<key>` extended attributes, every other `user.e2b.` one removed (so an empty map
    /// clears them); absent, they are left as they are. Answers
    /// [`files::FileAnswer`](crate::files::FileAnswer).
    FileWrite {
        path: String,
        #[serde(default)]
        mode: Option<u32>,
        #[serde(default = "default_true")]
        parents: bool,
        max_bytes: u64,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        in_place: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        metadata: Option<std::collections::BTreeMap<String, String>>,
    },
    /// Changes under a directory anywhere, from inotify, as the sandbox user (protocol 4): an
    /// [`Event::Armed`] once every watch is in place (no change after it is missed), then an
    /// [`Event::Change`] per change (an [`Event::Overflow`] where some were lost), until CANCEL
    /// or the directory goes; then ok [`files::FileAnswer`](crate::files::FileAnswer) (`bytes`:
    /// the changes sent). A path that cannot be watched: no event, the answer's `error`.
    Watch {
        path: String,
        #[serde(default)]
        recursive: bool,
    },
    /// A background process request, relayed to the container's process supervisor. For
    /// `stdin`, the bytes follow as DATA frames, then EOF; a `poll` answers with one DATA frame
    /// of output before its RESPONSE.
    Proc {
        request: ProcRequest,
    },
    /// A byte stream to `127.0.0.1:port` inside the sandbox (protocol 7): the helper connects
    /// and sends [`Event::Connected`] with the bytes of DATA it takes before it grants more;
    /// then DATA both ways, each side sending at most what the other granted with WINDOW
    /// frames (`window` is the client's first grant), EOF both ways for a half close. Ok `{}`
    /// once both directions ended; nothing listening: `refused`, and no event.
    Connect {
        port: u16,
        window: u32,
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
        /// The client's id for it (protocol 4): a start with the id of a known process answers
        /// that process when the command is the same (`existing`), `conflict` otherwise.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        process_id: Option<String>,
        /// The client's label, shown in the list (protocol 4).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tag: Option<String>,
        /// Started in a terminal of this size (protocol 4): its stdin, stdout and stderr are the
        /// terminal, its output comes as `stdout` events.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pty: Option<PtySize>,
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
    /// The events after `after` (protocol 4): one DATA frame with the output events' bytes, one
    /// after the other, then ok [`ProcEvents`]. Waits up to `wait_ms` while there is none and
    /// the process runs. Events no longer kept: `gone`.
    Events {
        process_id: String,
        #[serde(default)]
        after: Option<u64>,
        #[serde(default)]
        wait_ms: u64,
        /// Output bytes answered at most (at least one event is, whatever its size).
        max_bytes: u64,
    },
    /// A new size for the terminal of a process started with one (protocol 4); one without a
    /// terminal, or that ended: `conflict`.
    Resize {
        process_id: String,
        size: PtySize,
    },
    /// A signal to the process's group (protocol 4): `TERM`, `KILL`, `INT` or `HUP`. One that
    /// has ended: `conflict`.
    Signal {
        process_id: String,
        signal: String,
    },
}

/// A terminal's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySize {
    pub cols: u16,
    pub rows: u16,
}

/// One event of a process (protocol 4): `seq` counts from 1 (its `start`); output events' bytes
/// are in the DATA frame before the answer, `len` each, in order; `end` is the last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ProcEvent {
    Start {
        seq: u64,
        pid: u32,
    },
    Stdout {
        seq: u64,
        len: u32,
    },
    Stderr {
        seq: u64,
        len: u32,
    },
    End {
        seq: u64,
        /// The exit status; 128 + the signal when a signal ended it.
        exit_code: i64,
        /// The signal that ended it, by name (`KILL`, `TERM`, ...).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<String>,
        #[serde(flatten)]
        usage: Usage,
    },
}

impl ProcEvent {
    pub fn seq(&self) -> u64 {
        match self {
            Self::Start { seq, .. }
            | Self::Stdout { seq, .. }
            | Self::Stderr { seq, .. }
            | Self::End { seq, .. } => *seq,
        }
    }
}

/// The answer to [`ProcRequest::Events`]. Every output event's bytes are whole UTF-8 characters
/// (the supervisor holds a cut character back for the next event), unless the bytes are not
/// UTF-8 at all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcEvents {
    pub events: Vec<ProcEvent>,
    /// The newest event's `seq` so far.
    pub last_seq: u64,
}

/// The signals a client may send, by name.
pub const SIGNALS: [&str; 4] = ["TERM", "KILL", "INT", "HUP"];

/// Longest process id, in bytes.
pub const PROCESS_ID_MAX: usize = 64;

/// Whether `id` can name a process: 1 to [`PROCESS_ID_MAX`] of `[A-Za-z0-9._-]`, not starting
/// with a dot (so never `.` or `..`, which a URL path would collapse). The supervisor takes a
/// client's id (protocol 4) only if it is one, and its own (`p<n>-<hex>`) always are, so a peer
/// may answer "no such process" for anything else without asking.
pub fn valid_process_id(id: &str) -> bool {
    (1..=PROCESS_ID_MAX).contains(&id.len())
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The answer to [`ProcRequest::Start`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcStarted {
    pub process_id: String,
    /// A start with the client's id of a process it already has: that one (protocol 4).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub existing: bool,
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
    /// Its process id in the sandbox (protocol 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The client's label (protocol 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Started in a terminal (protocol 4).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pty: bool,
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
    /// What was asked for is no longer kept (a process's events past its buffer; protocol 4).
    Gone,
    /// Nothing accepted a `connect` to its port (protocol 7).
    Refused,
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
    /// An `ls` or `glob` found everything it answers (protocol 6): `entries` entries follow as
    /// DATA frames, `bytes` of JSON (each entry's, with a comma each).
    Listing { entries: u64, bytes: u64 },
    /// A `watch` is in place: `watches` directories (protocol 4).
    Armed { watches: u32 },
    /// A `connect` reached its port (protocol 7): the client may send `window` bytes of DATA
    /// before a WINDOW frame grants more.
    Connected { window: u32 },
    /// A change a `watch` saw (protocol 4). `entry` where the path still exists (not for
    /// `remove` and `rename`, which name the path that went).
    Change {
        change: ChangeKind,
        path: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        entry: Option<Box<crate::files::FileEntry>>,
    },
    /// A `watch` lost changes (the kernel's queue overflowed, or a directory past its limit of
    /// watches was not watched): what is there now is the truth (protocol 4).
    Overflow,
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

/// What changed, as a watch reports it (the names of Go's fsnotify, which E2B's envd and most
/// watch APIs use: a move out is a `rename` of the old path, a move in a `create`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Create,
    Write,
    Remove,
    Rename,
    Chmod,
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

/// The `ok` value of [`Request::Disk`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskInfo {
    /// The size of the filesystem holding the workspace.
    pub total_bytes: u64,
    /// Bytes allocated to what is under the workspace (holes not counted; a walk of at most
    /// [`DiskInfo::MAX_ENTRIES`] entries, so a lower bound beyond that).
    pub used_bytes: u64,
}

impl DiskInfo {
    pub const MAX_ENTRIES: u64 = 200_000;
}

/// The `ok` value of [`Request::Seeded`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeededInfo {
    pub seeded: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_ids_are_the_supervisors_or_a_clients() {
        let longest = "a".repeat(PROCESS_ID_MAX);
        for ok in [
            "p1-0a1b2c3d4e5f",
            "dev-server",
            "web_1.v2",
            "a..b",
            &longest,
        ] {
            assert!(valid_process_id(ok), "{ok}");
        }
        let too_long = "a".repeat(PROCESS_ID_MAX + 1);
        for bad in [
            "", ".", "..", ".x", "a/b", "a b", "a\0b", "a%2fb", "é", &too_long,
        ] {
            assert!(!valid_process_id(bad), "{bad}");
        }
    }
}
