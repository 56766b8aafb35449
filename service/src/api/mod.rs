//! Wire types, shaped exactly like the reference's (DAIV validates our responses against its
//! schemas). Unknown request fields are ignored, never rejected: DAIV sends extra ones.
//! [`ErrorBody`] is every error response's body; which status carries it is decided in the HTTP
//! layer (`error.rs`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

mod processes;
pub use processes::*;

#[derive(Debug, Default, Deserialize, ToSchema)]
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
    #[schema(value_type = Option<BTreeMap<String, String>>)]
    pub environment: Option<Environment>,
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
    /// Strings of your choosing kept with the session, returned by the listing and filterable
    /// there; never interpreted, never in the sandbox's environment.
    #[serde(default)]
    #[schema(value_type = Option<BTreeMap<String, String>>)]
    pub metadata: Option<Metadata>,
    /// The session ends this long after it is created unless `POST /session/{id}/timeout/`
    /// moves its deadline; none when omitted (the deployment's idle and lifetime limits apply).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 2592000)]
    pub timeout_seconds: Option<u64>,
    /// What ending at the deadline means: `remove` (the default) or `pause`.
    #[serde(default)]
    pub on_timeout: Option<OnTimeout>,
}

/// Longest `timeout_seconds` a session may be given (30 days).
pub const MAX_SESSION_TIMEOUT_SECS: u64 = 30 * 24 * 3600;

/// What a session's deadline does to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    /// Removed, as a force close does.
    #[default]
    Remove,
    /// Paused (then reaped as a paused session is, after the grace period from its pause).
    Pause,
}

impl OnTimeout {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Remove => "remove",
            Self::Pause => "pause",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "remove" => Some(Self::Remove),
            "pause" => Some(Self::Pause),
            _ => None,
        }
    }
}

/// A session's metadata: at most [`Metadata::MAX_PAIRS`] pairs, keys of 1 to 64 bytes of
/// `[A-Za-z0-9._-]`, values of at most 512 bytes. Checked as it is read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Metadata(BTreeMap<String, String>);

impl Metadata {
    pub const MAX_PAIRS: usize = 32;
    pub const MAX_KEY: usize = 64;
    pub const MAX_VALUE: usize = 512;
    pub const KEY_PATTERN: &str = r"^[A-Za-z0-9._-]{1,64}$";

    pub fn new(pairs: BTreeMap<String, String>) -> Result<Self, String> {
        if pairs.len() > Self::MAX_PAIRS {
            return Err(format!("metadata: at most {} pairs", Self::MAX_PAIRS));
        }
        for (k, v) in &pairs {
            if !Self::valid_key(k) {
                return Err(format!(
                    "metadata key {k:?}: 1 to {} bytes of [A-Za-z0-9._-]",
                    Self::MAX_KEY
                ));
            }
            if v.len() > Self::MAX_VALUE {
                return Err(format!(
                    "metadata value of {k:?}: at most {} bytes",
                    Self::MAX_VALUE
                ));
            }
        }
        Ok(Self(pairs))
    }

    pub fn valid_key(k: &str) -> bool {
        !k.is_empty()
            && k.len() <= Self::MAX_KEY
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    }

    /// Whether `key` is set.
    pub fn contains_key(&self, key: &str) -> bool {
        self.0.contains_key(key)
    }

    /// Without `key` (a door's own marker, kept out of what its clients see).
    pub fn without(&self, key: &str) -> Self {
        let mut m = self.0.clone();
        m.remove(key);
        Self(m)
    }

    pub fn into_inner(self) -> BTreeMap<String, String> {
        self.0
    }
}

impl std::ops::Deref for Metadata {
    type Target = BTreeMap<String, String>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl<'de> Deserialize<'de> for Metadata {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::new(BTreeMap::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// A session as the listing and `GET /session/{id}/info/` show it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionInfo {
    pub session_id: String,
    /// The image it was created from (a snapshot's base image for a session from a snapshot).
    pub base_image: String,
    /// The snapshot it was created from, if any.
    pub snapshot_id: Option<String>,
    /// `running`, `paused` or `stopped`.
    pub state: SessionState,
    /// RFC 3339: when the session was created (a warm-pool member: when it was claimed).
    pub created_at: String,
    /// RFC 3339: its deadline; null without one.
    pub expires_at: Option<String>,
    /// What the deadline does: `remove` or `pause`.
    pub on_timeout: OnTimeout,
    /// Its CPU limit; null without one.
    pub cpus: Option<f64>,
    /// Its memory limit; null without one.
    pub memory_bytes: Option<i64>,
    /// Whether it has an egress gateway.
    pub egress: bool,
    #[schema(value_type = BTreeMap<String, String>)]
    pub metadata: Metadata,
    /// The engine it runs on (`default` without a fleet).
    pub engine: String,
    /// Beyond the reference: present when the probe of the sandboxes' runtime found commands
    /// agents run failing in this session's image (gVisor's `statx` bug breaks `ls` and `stat`
    /// of GNU coreutils 9): what fails, and the fix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_warning: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    Running,
    Paused,
    Stopped,
}

impl SessionState {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "running" => Some(Self::Running),
            "paused" => Some(Self::Paused),
            "stopped" => Some(Self::Stopped),
            _ => None,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SessionList {
    /// Oldest first (by `created_at`, then `session_id`).
    pub sessions: Vec<SessionInfo>,
    /// Pass as `?next=` for the following page; null on the last page.
    pub next: Option<String>,
}

/// One reading of a session's resources (E2B's metric names, in snake case).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct MetricsSample {
    /// Unix seconds it was taken.
    pub timestamp_unix: i64,
    /// CPUs the session may use: its limit, else the host's.
    pub cpu_count: f64,
    /// CPU used since the previous sample, as a percentage of `cpu_count`.
    pub cpu_used_pct: f64,
    /// Memory in use, the reclaimable page cache excluded (as `docker stats` counts it), in bytes.
    pub mem_used: u64,
    /// Its memory limit, else the host's memory.
    pub mem_total: u64,
    /// Reclaimable page cache charged to it (inactive file pages).
    pub mem_cache: u64,
    /// Bytes allocated under `/workspace`.
    pub disk_used: u64,
    /// The size of the filesystem holding `/workspace`.
    pub disk_total: u64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SessionMetrics {
    /// Oldest first.
    pub samples: Vec<MetricsSample>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MetricsQuery {
    /// Only samples taken at or after this Unix second.
    #[serde(default)]
    pub start: Option<i64>,
    /// Only samples taken at or before this Unix second.
    #[serde(default)]
    pub end: Option<i64>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct TimeoutRequest {
    /// The session's deadline becomes now plus this (shorter or longer than before).
    #[schema(minimum = 1, maximum = 2592000)]
    pub timeout_seconds: u64,
}

/// A request's `cpus` as the engine counts them (billionths of a CPU): the one conversion
/// from the API to the engine.
pub fn nano_cpus(cpus: f64) -> i64 {
    (cpus * 1e9).round() as i64
}

/// The engine's billionths of a CPU as the API's `cpus`: the one conversion back.
pub fn cpus_of(nano_cpus: i64) -> f64 {
    nano_cpus as f64 / 1e9
}

/// A sandbox's environment variables (a create's, a fork's): names not empty, without `=` or
/// NUL; values without NUL (the engine would refuse some and take others wrongly: `A=B` becomes
/// `A`). Checked as it is read, so a request that holds one holds a valid one; the OpenAPI
/// document states the same rule with [`Environment::NAME_PATTERN`] and
/// [`Environment::VALUE_PATTERN`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Environment(BTreeMap<String, String>);

/// The variable of an environment that breaks [`Environment`]'s rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "environment variable {0:?}: names must be non-empty without '=' or NUL, values without NUL"
)]
pub struct InvalidEnvironment(pub String);

impl Environment {
    /// A variable's name, as a regular expression.
    pub const NAME_PATTERN: &str = r"^[^=\x00]+$";
    /// A variable's value, as a regular expression.
    pub const VALUE_PATTERN: &str = r"^[^\x00]*$";

    /// `vars`, or the first variable that breaks the rule.
    pub fn new(vars: BTreeMap<String, String>) -> Result<Self, InvalidEnvironment> {
        match vars.iter().find(|(k, v)| !Self::valid(k, v)) {
            Some((k, _)) => Err(InvalidEnvironment(k.clone())),
            None => Ok(Self(vars)),
        }
    }

    /// The variables of `vars` that follow the rule (for an environment read back from a
    /// container, which held a valid one: anything else is not the caller's).
    pub fn keeping_valid(mut vars: BTreeMap<String, String>) -> Self {
        vars.retain(|k, v| Self::valid(k, v));
        Self(vars)
    }

    fn valid(name: &str, value: &str) -> bool {
        !name.is_empty() && !name.contains(['=', '\0']) && !value.contains('\0')
    }

    pub fn into_inner(self) -> BTreeMap<String, String> {
        self.0
    }
}

impl std::ops::Deref for Environment {
    type Target = BTreeMap<String, String>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl<'de> Deserialize<'de> for Environment {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::new(BTreeMap::deserialize(d)?).map_err(serde::de::Error::custom)
    }
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
    /// chunks is never broken), from its `stream`. Streamed, stdout and stderr are read from
    /// pipes of their own: each in order, their interleaving in `done` as they were read.
    Output {
        index: usize,
        data: String,
        stream: OutputStream,
    },
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

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct HealthResponse {
    pub status: String,
    /// Beyond the reference: what the probes found of the sandboxes' runtime, by runtime
    /// (`runsc`); absent when none was probed (runc).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub runtime: BTreeMap<String, RuntimeSoundness>,
    /// Beyond the reference: how many engines give sessions from snapshots an overlay, copies,
    /// or are not probed yet (`overlay`, `copies`, `unknown`; the engines by name, and why, are
    /// in `GET /engines/`, behind the key).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub snapshot_layers: BTreeMap<SnapshotLayerMode, u32>,
}

/// Whether the commands agents run work under a runtime, as its probes found: the start-up
/// probe's and each image's that sessions used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RuntimeSoundness {
    /// `true`: `ls` and `stat` worked in every image probed; `false`: they failed in one (see
    /// `reason` and `images`); `null`: not known (a probe is running, could not run, or nothing
    /// was probed yet).
    pub sound: Option<bool>,
    /// Why it is not sound, or not known; absent when sound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The probe's commands that failed (`ls`, `stat`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failing: Vec<String>,
    /// The image it probed with: the start-up probe's, else the first one found unsound, else
    /// the first one probed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Each image sessions used (and the start-up probe's), probed on its first use on each
    /// engine; absent before the first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ImageSoundness>,
}

/// What the probe found in one image on one engine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ImageSoundness {
    /// The image as sessions named it (their `base_image`).
    pub image: String,
    /// The image's id: what the verdict is kept by (a tag moved to another image is probed
    /// again).
    pub image_id: String,
    /// The engine it was probed on (`default` without a fleet).
    pub engine: String,
    /// As for the runtime: `null` while the probe runs or when it could not tell.
    pub sound: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failing: Vec<String>,
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

/// Every error response's body, as FastAPI writes it; the routes beyond the reference's add
/// a stable `code` where a client acts on the cause (`port_closed`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub detail: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

/// Longest snapshot name.
pub const SNAPSHOT_NAME_MAX: usize = 128;
/// Longest `ttl_seconds` of a snapshot (ten years).
pub const SNAPSHOT_TTL_MAX_SECS: u64 = 10 * 365 * 24 * 3600;

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
    #[schema(value_type = Option<BTreeMap<String, String>>)]
    pub environment: Option<Environment>,
    /// The forks' metadata; the source's when omitted.
    #[serde(default)]
    #[schema(value_type = Option<BTreeMap<String, String>>)]
    pub metadata: Option<Metadata>,
    /// Each fork's lifetime, as at create; none when omitted.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 2592000)]
    pub timeout_seconds: Option<u64>,
    /// What each fork's deadline does (`remove` by default).
    #[serde(default)]
    pub on_timeout: Option<OnTimeout>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ForkResponse {
    pub session_ids: Vec<String>,
}

/// An engine's state for `GET /engines/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EngineState {
    Up,
    Down,
    Draining,
}

/// One engine in `GET /engines/` (never its endpoint or TLS files).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EngineStatus {
    pub name: String,
    pub state: EngineState,
    /// Sessions (warm-pool members included) it holds, as last counted.
    pub sessions: u32,
    pub max_sessions: Option<u32>,
    /// How sessions from snapshots get their workspace here.
    pub snapshot_layers: SnapshotLayerSupport,
}

/// How an engine gives sessions from snapshots their workspace, as its probe found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SnapshotLayerSupport {
    pub mode: SnapshotLayerMode,
    /// Why copies, or why not known; absent for overlays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `overlay`: an overlay over the snapshot's layers, nothing copied; `copies`: a copy of the
/// snapshot's layer per session (the engine cannot mount overlay volumes, or
/// `SNAPSHOT_LAYERS=copy`); `unknown`: not probed yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotLayerMode {
    Overlay,
    Copies,
    Unknown,
}

/// The engines sessions may be on.
#[derive(Debug, Serialize, ToSchema)]
pub struct EngineList {
    pub engines: Vec<EngineStatus>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn environments_follow_one_rule_as_they_are_read() {
        for bad in [
            json!({"": "x"}),
            json!({"A=B": "x"}),
            json!({"A\u{0}": "x"}),
            json!({"A": "x\u{0}"}),
        ] {
            assert!(
                serde_json::from_value::<Environment>(bad.clone()).is_err(),
                "{bad}"
            );
        }
        let good = json!({"A": "", "b c": "=\n"});
        let env: Environment = serde_json::from_value(good.clone()).expect("valid");
        assert_eq!(serde_json::to_value(&env).ok(), Some(good));
        let err = Environment::new([("A=B".to_string(), String::new())].into());
        assert_eq!(err, Err(InvalidEnvironment("A=B".to_string())));
    }
}
