//! Wire types of the data plane beyond DAIV's: background processes (their event streams and
//! terminals), streamed output's streams, and watches. Re-exported by [`crate::api`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Which of a command's output streams a chunk is from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OutputStream {
    Stdout,
    Stderr,
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct StartProcessRequest {
    /// Shell command, run in the background like a command of a run (same shell, user, limits).
    /// Not blank, no NUL.
    #[schema(
        pattern = r"^[^\x00]*[^\x00\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000][^\x00]*$"
    )]
    pub command: String,
    /// Variables added to the session's environment for this process.
    #[serde(default)]
    pub environment: Option<BTreeMap<String, String>>,
    /// Working directory: an absolute path without '..' (default /workspace/repo). The process
    /// runs as the sandbox user: a directory it may not enter is a 422.
    #[serde(default)]
    #[schema(pattern = r"^(/(?!\.\.(/|$))[^/\x00\n\r]*)+$")]
    pub workdir: Option<String>,
    /// Your id for the process (1 to 64 of `[A-Za-z0-9._-]`, not starting with a dot; default:
    /// one is chosen). Starting again with the id of a process the session has answers that
    /// process (200, `existing`) when the command is the same, 409 when it is not: a retried start
    /// never starts it twice.
    #[serde(default)]
    #[schema(pattern = r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$")]
    pub process_id: Option<String>,
    /// A label of yours, shown in the list (at most 256 characters, none a control character).
    #[serde(default)]
    #[schema(max_length = 256, pattern = r"^[^\x00-\x1f\x7f-\x9f]*$")]
    pub tag: Option<String>,
    /// Start it in a terminal of this size: its stdin, stdout and stderr are the terminal (its
    /// output comes as `stdout` events), `…/stdin` types into it, `…/resize` resizes it.
    #[serde(default)]
    pub pty: Option<TerminalSize>,
}

/// A terminal's size, in characters.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
pub struct TerminalSize {
    #[schema(minimum = 1, maximum = 1000)]
    pub cols: u16,
    #[schema(minimum = 1, maximum = 1000)]
    pub rows: u16,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct StartProcessResponse {
    pub process_id: String,
    /// The start named a process the session already has (answered 200, not 201).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub existing: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProcessInfo {
    pub process_id: String,
    pub command: String,
    /// Its process id in the sandbox (its process group's too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The label it was started with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// It was started in a terminal.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pty: bool,
    pub running: bool,
    /// `null` while it runs; 128 + the signal when a signal ended it (137 once killed).
    pub exit_code: Option<i64>,
    /// Once it ended: its wall time in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Once it ended: CPU time (user + system) of its process tree, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<u64>,
    /// Once it ended: peak resident memory of its largest process, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rss_bytes: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ProcessList {
    pub processes: Vec<ProcessInfo>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ProcessOutput {
    pub process_id: String,
    pub running: bool,
    pub exit_code: Option<i64>,
    /// Output from `offset` on (UTF-8, lossy; a character is never split at the end).
    pub output: String,
    /// Byte offset `output` starts at: later than asked when older bytes were dropped.
    pub offset: u64,
    /// Pass it as the next poll's `offset`.
    pub next_offset: u64,
    /// Output before `offset` was dropped from the bounded buffer.
    pub truncated: bool,
    /// Once it ended: its wall time in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Once it ended: CPU time (user + system) of its process tree, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<u64>,
    /// Once it ended: peak resident memory of its largest process, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rss_bytes: Option<u64>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PollQuery {
    /// Byte offset to read from (a previous `next_offset`).
    #[serde(default)]
    pub offset: u64,
    /// Seconds to wait for new output when there is none yet (capped by the server).
    #[serde(default)]
    #[param(minimum = 0.0)]
    pub wait: f64,
}

/// What a line of a watch's stream is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum WatchEventType {
    /// The first line: every watch is in place; no change after it is missed.
    Armed,
    Create,
    Write,
    Remove,
    Rename,
    Chmod,
    /// Changes were lost (the client read too slowly, the kernel's queue overflowed, or a
    /// directory past the watch's limit was not watched): list what is there now.
    Overflow,
}

/// One line of `GET /session/{id}/watch` (NDJSON). The names are Go fsnotify's: a move out is a
/// `rename` of the old path, a move in a `create` of the new one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WatchEvent {
    #[serde(rename = "type")]
    pub kind: WatchEventType,
    /// The path that changed (absolute).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// What is at `path` now (not for `remove` and `rename`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<sandbox_protocol::files::FileEntry>,
    /// `armed`: how many directories are watched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watches: Option<u32>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WatchQuery {
    /// A directory: an absolute path without `..`, anywhere the sandbox user may read.
    #[param(pattern = r"^(/(?!\.\.(/|$))[^/\x00\n\r]*)+$")]
    pub path: String,
    /// Everything below it too, directories created later included.
    #[serde(default)]
    pub recursive: bool,
}

/// What a line of a process's event stream is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProcessEventType {
    /// The process started (`pid`); always `seq` 1.
    Start,
    /// Output on its stdout (`data`).
    Stdout,
    /// Output on its stderr (`data`).
    Stderr,
    /// It ended (`exit_code`, `signal`, `duration_ms`): the last event.
    End,
    /// Nothing happened for a while; `seq` is the last event's, so a resume from it loses nothing.
    Keepalive,
}

/// One line of `GET /session/{id}/processes/{pid}/events` (NDJSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ProcessEvent {
    /// The event's number, from 1, one per event: resume with `?after=` the last one seen.
    pub seq: u64,
    #[serde(rename = "type")]
    pub kind: ProcessEventType,
    /// An output chunk's text (UTF-8, lossy; a character is never split between chunks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// `start`: the process id in the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// `end`: the exit status (128 + the signal when a signal ended it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    /// `end`: the signal that ended it (`TERM`, `KILL`, ...), when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// `end`: its wall time in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// `end`: CPU time (user + system) of its process tree, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<u64>,
    /// `end`: peak resident memory of its largest process, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rss_bytes: Option<u64>,
}

impl ProcessEvent {
    pub fn new(seq: u64, kind: ProcessEventType) -> Self {
        Self {
            seq,
            kind,
            data: None,
            pid: None,
            exit_code: None,
            signal: None,
            duration_ms: None,
            cpu_ms: None,
            max_rss_bytes: None,
        }
    }
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Only the events after this `seq` (the last one seen); without it, every event still kept.
    /// 410 once events after it have left the process's bounded buffer.
    #[serde(default)]
    pub after: Option<u64>,
    /// Keep the stream open for the events to come, until `end` (keepalives in silences);
    /// without it, the events so far.
    #[serde(default)]
    pub follow: bool,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PtyQuery {
    /// Replay the terminal's output from this byte offset (what was kept of it: the process's
    /// bounded buffer); default: from now on.
    #[serde(default)]
    pub since: Option<u64>,
}

/// A signal for a process's group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum ProcessSignal {
    Term,
    Kill,
    Int,
    Hup,
}

impl ProcessSignal {
    /// Its name, as the helper takes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Term => "TERM",
            Self::Kill => "KILL",
            Self::Int => "INT",
            Self::Hup => "HUP",
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct SignalRequest {
    pub signal: ProcessSignal,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StdinQuery {
    /// Close the process's stdin after writing the body.
    #[serde(default)]
    pub eof: bool,
}
