//! Wire types, shaped exactly like the reference's (DAIV validates our responses against its
//! schemas). Unknown request fields are ignored, never rejected: DAIV sends extra ones.
//! [`ErrorBody`] is every error response's body; which status carries it is decided in the HTTP
//! layer (`error.rs`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Deserialize, ToSchema)]
pub struct StartSessionRequest {
    /// Docker image to be used as the base image for the sandbox. Required unless
    /// `snapshot_id` is given; with it, it must be the snapshot's base image.
    #[serde(default)]
    #[schema(
        max_length = 512,
        pattern = r"^[^\x00-\x20\x7f-\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]*$"
    )]
    pub base_image: String,
    /// Start from this snapshot's filesystem and workspace (seeded state included) instead of
    /// a fresh image; `environment`, limits and `egress` are this request's.
    #[serde(default)]
    pub snapshot_id: Option<String>,
    /// Environment variables to set in the container at startup.
    #[serde(default)]
    pub environment: Option<BTreeMap<String, String>>,
    /// Memory in bytes to be used for the sandbox (at least 6 MiB).
    #[serde(default)]
    #[schema(minimum = 6291456)]
    pub memory_bytes: Option<i64>,
    /// CPUs to be used for the sandbox (Docker also refuses more than the host has).
    #[serde(default)]
    #[schema(minimum = 0.01, maximum = 1024.0)]
    pub cpus: Option<f64>,
    /// Egress policy + secrets. Omit for a network-isolated sandbox (network_mode=none).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub egress: Option<serde_json::Value>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct StartSessionResponse {
    /// Unique identifier for the session.
    pub session_id: String,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct RunRequest {
    /// List of bash commands to be executed in the sandbox.
    pub commands: Vec<String>,
    /// Stop execution immediately if any command fails (exit_code != 0).
    #[serde(default)]
    pub fail_fast: bool,
    /// Maximum execution time in seconds for each command; overrides the server default
    /// (DAIV_SANDBOX_COMMAND_TIMEOUT). 0 means no timeout; at most 7 days.
    #[serde(default)]
    #[schema(maximum = 604800)]
    pub timeout: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RunResult {
    /// Command that was executed.
    pub command: String,
    /// Output of the command: stdout and stderr interleaved as produced.
    pub output: String,
    /// Exit code of the command (124 when it hit its timeout).
    pub exit_code: i64,
    /// Working directory of the command.
    pub workdir: String,
    /// Wall time of the command, in milliseconds (absent from sessions whose helper predates it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// CPU time (user + system) of the command's process tree, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<u64>,
    /// Peak resident memory of the largest process of the command, in bytes (sampled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rss_bytes: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RunResponse {
    /// List of results of each command.
    pub results: Vec<RunResult>,
}

/// One line of a streaming run (`Accept: application/x-ndjson`), tagged by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RunStreamLine {
    /// Output of command `index` as it is printed (UTF-8, lossy; a character split across
    /// chunks is never broken).
    Output { index: usize, data: String },
    /// Command `index` ended; the fields are its entry of `done.results`.
    Result {
        index: usize,
        command: String,
        exit_code: i64,
        workdir: String,
    },
    /// Nothing else was sent for a while; the run goes on.
    Heartbeat,
    /// The last line: exactly what the plain JSON response would have been.
    Done { results: Vec<RunResult> },
    /// The run could not go on (the session went away); the last line instead of `done`.
    Error { detail: String },
}

#[derive(Debug, Deserialize, ToSchema)]
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
    /// Working directory: /workspace or below it, without '..' (default /workspace/repo).
    #[serde(default)]
    #[schema(pattern = r"^/workspace(/(?!\.\.(/|$))[^/\x00]*)*$")]
    pub workdir: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct StartProcessResponse {
    pub process_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProcessInfo {
    pub process_id: String,
    pub command: String,
    pub running: bool,
    /// `null` while it runs; 128 + the signal when a signal ended it (137 once killed).
    pub exit_code: Option<i64>,
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

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StdinQuery {
    /// Close the process's stdin after writing the body.
    #[serde(default)]
    pub eof: bool,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct HealthResponse {
    pub status: String,
    /// Beyond the reference: what the start-up probe found of the sandboxes' runtime, by
    /// runtime (`runsc`); absent when none was probed (runc).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub runtime: BTreeMap<String, RuntimeSoundness>,
}

/// Whether the commands agents run work under a runtime, as its start-up probe found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RuntimeSoundness {
    /// `true`: `ls` and `stat` worked; `false`: they failed (see `reason`); `null`: not known
    /// (the probe is running, could not run, or had no image).
    pub sound: Option<bool>,
    /// Why it is not sound, or not known; absent when sound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The probe's commands that failed (`ls`, `stat`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failing: Vec<String>,
    /// The image it probed with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct VersionResponse {
    pub version: String,
}

#[derive(Debug, Deserialize)]
pub struct CloseQuery {
    #[serde(default)]
    pub force: bool,
}

/// Every error response's body, as FastAPI writes it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub detail: String,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct SnapshotRequest {
    /// A name of your choosing (1 to 128 characters).
    #[serde(default)]
    #[schema(min_length = 1, max_length = 128)]
    pub name: Option<String>,
    /// Seconds the snapshot is kept; the server default (DAIV_SANDBOX_SNAPSHOT_TTL_SECONDS)
    /// when omitted.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub ttl_seconds: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SnapshotCreated {
    pub snapshot_id: String,
    pub name: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// Bytes the snapshot holds: its image layer and its workspace copy.
    pub size_bytes: u64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SnapshotInfo {
    pub snapshot_id: String,
    pub name: Option<String>,
    /// The session it was taken from.
    pub source_session_id: String,
    /// The base image of that session.
    pub base_image: String,
    /// The Docker image holding its filesystem.
    pub image: String,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339; null: kept until deleted or evicted by the retention caps.
    pub expires_at: Option<String>,
    pub size_bytes: u64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SnapshotList {
    /// Newest first.
    pub snapshots: Vec<SnapshotInfo>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct ForkRequest {
    /// How many forks (1 to DAIV_SANDBOX_FORK_MAX_COUNT).
    #[schema(minimum = 1)]
    pub count: u32,
    /// The forks' environment; the source's when omitted.
    #[serde(default)]
    pub environment: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ForkResponse {
    pub session_ids: Vec<String>,
}
