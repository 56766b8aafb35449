//! The tools: each one's arguments (its JSON schema, written for a model), and what it does,
//! through the same domain calls as its REST route ([`crate::fleet::Fleet`] to find the
//! session's stack, the session lock where the route takes it, the admission slots, then
//! [`crate::sessions`], [`crate::workspace::fs`], [`crate::processes`]). A tool's own failure is
//! a [`ToolFailure`]; arguments that are not the tool's are [`ArgsError`] (a protocol error
//! naming the field).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::OnceLock;

use base64::Engine as _;
use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::errors::ToolFailure;
use crate::admission::{Admission, Slot};
use crate::api::{RunRequest, RunResult, RunStreamLine, StartProcessRequest, StartSessionRequest};
use crate::config::Config;
use crate::coordination::lock::LockGuard;
use crate::fleet::Fleet;
use crate::layout;
use crate::processes;
use crate::sessions::{SessionError, Sessions};
use crate::telemetry::metrics::ModeLabels;
use crate::workspace::fs::{Fs, OpError};
use crate::workspace::wire::*;

/// Arguments that are not the tool's, or a tool that does not exist: the caller's mistake in
/// speaking the protocol, answered as a JSON-RPC error (invalid params) that names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ArgsError {
    #[error("unknown tool: {0:?} (tools/list names the tools)")]
    UnknownTool(String),
    #[error("{tool}: invalid arguments: {detail}")]
    Invalid { tool: &'static str, detail: String },
}

/// What a tool answers: its structured value and the text a model reads.
#[derive(Debug, Clone)]
pub struct Answer {
    pub value: Value,
    pub text: String,
}

impl Answer {
    fn json(value: Value) -> Self {
        let text = value.to_string();
        Self { value, text }
    }
}

// === arguments ===

/// The session every tool but `session_create` works on.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionArgs {
    /// The id session_create (or fork) returned.
    pub session_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateArgs {
    /// Docker image of the sandbox (e.g. "python:3.12"); required unless snapshot_id is given.
    #[serde(default)]
    pub image: Option<String>,
    /// Start from this snapshot's filesystem instead of a fresh image (from the snapshot tool).
    #[serde(default)]
    pub snapshot_id: Option<String>,
    /// Environment variables set in the sandbox for every command. Never put credentials here:
    /// give them to egress as secrets, which the sandbox never sees.
    #[serde(default)]
    pub environment: Option<BTreeMap<String, String>>,
    /// Memory limit in bytes (at least 6 MiB); the server default when omitted.
    #[serde(default)]
    pub memory_bytes: Option<i64>,
    /// CPU limit (e.g. 1.5); the server default when omitted.
    #[serde(default)]
    pub cpus: Option<f64>,
    /// Network access. Omit it for a sandbox with no network at all. Otherwise
    /// {"policy": {"default": "deny", "rules": [{"host": "api.github.com", "methods": ["GET"],
    /// "inject": "gh"}]}, "secrets": {"gh": {"header": "Authorization", "value": "Bearer ..."}}}:
    /// only hosts with a rule are reachable (host globs such as "*.pypi.org", optional methods
    /// and paths), and a rule's `inject` names a secret whose header is added to its requests
    /// outside the sandbox, so the sandbox never holds the credential.
    #[serde(default)]
    #[schemars(with = "Option<JsonObject>")]
    pub egress: Option<Value>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CloseArgs {
    /// The session to close.
    pub session_id: String,
    /// true (default): remove the sandbox and its files. false: only stop it; any later call
    /// on it restarts it with its files.
    #[serde(default = "yes")]
    pub remove: bool,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunArgs {
    /// The session to run in.
    pub session_id: String,
    /// Bash commands, run one after the other in /workspace/repo (each in its own shell; cd
    /// does not carry over: chain with &&).
    pub commands: Vec<String>,
    /// Stop at the first command that exits non-zero (the rest are skipped).
    #[serde(default)]
    pub fail_fast: bool,
    /// Seconds each command may run (0: no limit); the server default when omitted. A command
    /// past it is killed with everything it started and exits 124.
    #[serde(default)]
    pub timeout: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadArgs {
    pub session_id: String,
    /// Absolute path of a file under /workspace (the repository is /workspace/repo).
    pub path: String,
    /// First line to read, 0-indexed (to continue a page: the previous answer's end_line).
    #[serde(default)]
    pub offset: u64,
    /// Most lines to read (default 2000).
    #[serde(default = "default_lines")]
    pub limit: u64,
}

fn default_lines() -> u64 {
    2000
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteArgs {
    pub session_id: String,
    /// Absolute path of a new file under /workspace; missing directories are created. An
    /// existing file is never overwritten (already_exists): change it with edit.
    pub path: String,
    /// The whole content of the file.
    pub content: String,
    /// "utf-8" (default): content is the text. "base64": content is base64 of the bytes.
    #[serde(default)]
    pub encoding: Option<String>,
    /// POSIX mode bits, e.g. 420 (0o644, the default) or 493 (0o755) for a script.
    #[serde(default)]
    pub mode: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditArgs {
    pub session_id: String,
    /// Absolute path of a text file under /workspace.
    pub path: String,
    /// The exact text to replace (whitespace included); it must occur exactly once unless
    /// replace_all.
    pub old: String,
    /// The text to put instead.
    pub new: String,
    /// Replace every occurrence.
    #[serde(default)]
    pub replace_all: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrepArgs {
    pub session_id: String,
    /// POSIX extended regular expression searched in every line.
    pub pattern: String,
    /// Directory (or file) to search under /workspace; default /workspace/repo.
    #[serde(default)]
    pub path: Option<String>,
    /// Only files whose name matches this glob (e.g. "*.py").
    #[serde(default)]
    pub glob: Option<String>,
    /// Directory names to skip on top of the server's list (.git, node_modules, ...).
    #[serde(default)]
    pub exclude: Option<Vec<String>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GlobArgs {
    pub session_id: String,
    /// `*` and `?` within a path segment, `**` across segments, `[abc]`: e.g. "**/*.rs".
    pub pattern: String,
    /// Directory to match under; default /workspace/repo.
    #[serde(default)]
    pub path: Option<String>,
    /// Directory names to skip on top of the server's list.
    #[serde(default)]
    pub exclude: Option<Vec<String>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LsArgs {
    pub session_id: String,
    /// Directory under /workspace; default /workspace/repo.
    #[serde(default)]
    pub path: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessStartArgs {
    pub session_id: String,
    /// Shell command run in the background (a server, a watcher, a long build); it outlives
    /// this call and dies with the session.
    pub command: String,
    /// Variables added to the session's environment for this process.
    #[serde(default)]
    pub environment: Option<BTreeMap<String, String>>,
    /// Working directory under /workspace; default /workspace/repo.
    #[serde(default)]
    pub workdir: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessOutputArgs {
    pub session_id: String,
    /// The id process_start returned.
    pub process_id: String,
    /// Byte offset to read from: 0 first, then the previous answer's next_offset.
    #[serde(default)]
    pub offset: u64,
    /// Seconds to wait for new output when there is none yet (capped by the server).
    #[serde(default)]
    pub wait: f64,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessKillArgs {
    pub session_id: String,
    /// The id process_start returned.
    pub process_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressArgs {
    /// A session created with egress.
    pub session_id: String,
    /// The new policy and secrets, as session_create's egress; replaces the old one at once.
    #[schemars(with = "JsonObject")]
    pub egress: Value,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotArgs {
    pub session_id: String,
    /// A name of your choosing (1 to 128 characters).
    #[serde(default)]
    pub name: Option<String>,
    /// Seconds the snapshot is kept; the server default when omitted.
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkArgs {
    pub session_id: String,
    /// How many copies (default 1).
    #[serde(default = "one")]
    pub count: u32,
    /// The copies' environment; the source's when omitted.
    #[serde(default)]
    pub environment: Option<BTreeMap<String, String>>,
}

fn one() -> u32 {
    1
}

// === the tool list ===

/// Every tool, in the order `tools/list` gives them.
pub fn list() -> &'static [Tool] {
    static TOOLS: OnceLock<Vec<Tool>> = OnceLock::new();
    TOOLS.get_or_init(|| {
        let ro = |t: Tool| t.annotate(ToolAnnotations::new().read_only(true));
        vec![
            tool::<CreateArgs>(
                "session_create",
                "Create a sandbox: a Linux container with bash, its repository directory \
                 /workspace/repo, and no network unless egress allows hosts. Returns its \
                 session_id, which every other tool takes. Give credentials only as egress \
                 secrets: they are added to matching requests outside the sandbox and never \
                 appear in it.",
            ),
            tool::<CloseArgs>(
                "session_close",
                "Close a session when done with it: removes the sandbox and its files (or, \
                 with remove=false, only stops it).",
            ),
            tool::<RunArgs>(
                "run",
                "Run bash commands in the sandbox, in order, in /workspace/repo, and return \
                 each one's exit code and output (stdout and stderr interleaved). Output past \
                 the per-call bound keeps its start and end with a marker in between: redirect \
                 long output to a file and read or grep it. Progress notifications carry the \
                 output as it is printed; cancelling the call kills the command.",
            ),
            ro(tool::<ReadArgs>(
                "read",
                "Read a file of the sandbox by lines (a page of at most limit lines and \
                 512000 bytes; continue with offset=end_line). Binary files come base64-encoded.",
            )),
            tool::<WriteArgs>(
                "write",
                "Create a new file in the sandbox with the given content (missing directories \
                 are created). Refuses to overwrite an existing file: use edit for that.",
            ),
            tool::<EditArgs>(
                "edit",
                "Replace an exact piece of text in a file of the sandbox (once, or everywhere \
                 with replace_all). Returns how many replacements were made.",
            ),
            ro(tool::<GrepArgs>(
                "grep",
                "Search file contents with a POSIX extended regex; returns path, line number \
                 and text of each match (at most 200: narrow the search past that).",
            )),
            ro(tool::<GlobArgs>(
                "glob",
                "Find files by path pattern (e.g. **/*.py) under a directory of the sandbox.",
            )),
            ro(tool::<LsArgs>(
                "ls",
                "List one directory of the sandbox: directories first, then files.",
            )),
            tool::<ProcessStartArgs>(
                "process_start",
                "Start a background process (a dev server, a watcher) that keeps running \
                 after this call; read its output with process_output and stop it with \
                 process_kill.",
            ),
            ro(tool::<ProcessOutputArgs>(
                "process_output",
                "A background process's state (running, exit_code) and its output from \
                 offset; pass next_offset as the next call's offset. Set wait to block a few \
                 seconds for new output.",
            )),
            tool::<ProcessKillArgs>(
                "process_kill",
                "Kill a background process and everything it started.",
            ),
            tool::<EgressArgs>(
                "egress_update",
                "Replace the network policy and secrets of a session created with egress, \
                 without restarting anything.",
            ),
            tool::<SnapshotArgs>(
                "snapshot",
                "Save the session's whole filesystem as a snapshot; session_create with \
                 snapshot_id starts new sessions from it. Running processes and egress secrets \
                 are not kept.",
            ),
            tool::<ForkArgs>(
                "fork",
                "Copy a running session into count new sessions (files as they are now, the \
                 same egress policy), e.g. to try alternatives side by side. Returns their \
                 session_ids.",
            ),
            tool::<SessionArgs>(
                "pause",
                "Freeze a session, keeping its memory and processes, to save resources while \
                 it is not needed; the next call on it resumes it.",
            ),
        ]
    })
}

fn tool<T: JsonSchema + 'static>(name: &'static str, description: &'static str) -> Tool {
    let schema = rmcp::handler::server::common::schema_for_input::<T>()
        .unwrap_or_else(|e| panic!("{name}: its arguments' schema is not an object: {e}"));
    Tool::new(name, description, schema)
}

/// `args` as the tool's arguments, or the error naming the field.
fn parse<T: DeserializeOwned>(
    tool: &'static str,
    args: Option<JsonObject>,
) -> Result<T, ArgsError> {
    let value = Value::Object(args.unwrap_or_default());
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        let detail = if path == "." || path.is_empty() {
            inner
        } else {
            format!("{path}: {inner}")
        };
        ArgsError::Invalid { tool, detail }
    })
}

// === the tools ===

/// What the tools reach: the same objects the REST handlers take from the state.
pub struct Tools {
    pub fleet: Arc<Fleet>,
    pub admission: Arc<Admission>,
    pub config: Arc<Config>,
}

/// Output of a run as it is printed (for progress notifications), best effort: a client that
/// does not read them does not slow the command.
pub type ProgressSink = mpsc::Sender<String>;

/// Most bytes of output one run streams as progress; the rest is in its result.
const PROGRESS_MAX_BYTES: usize = 1024 * 1024;
/// Most bytes of one progress notification.
const PROGRESS_CHUNK_BYTES: usize = 8 * 1024;

impl Tools {
    /// Calls tool `name`: `Err` for arguments that are not its own (or no such tool),
    /// `Ok(Err)` for the tool's own failure.
    pub async fn call(
        &self,
        name: &str,
        args: Option<JsonObject>,
        progress: Option<ProgressSink>,
    ) -> Result<Result<Answer, ToolFailure>, ArgsError> {
        Ok(match name {
            "session_create" => self.create(parse("session_create", args)?).await,
            "session_close" => self.close(parse("session_close", args)?).await,
            "run" => self.run(parse("run", args)?, progress).await,
            "read" => self.read(parse("read", args)?).await,
            "write" => self.write(parse("write", args)?).await,
            "edit" => self.edit(parse("edit", args)?).await,
            "grep" => self.grep(parse("grep", args)?).await,
            "glob" => self.glob(parse("glob", args)?).await,
            "ls" => self.ls(parse("ls", args)?).await,
            "process_start" => self.process_start(parse("process_start", args)?).await,
            "process_output" => self.process_output(parse("process_output", args)?).await,
            "process_kill" => self.process_kill(parse("process_kill", args)?).await,
            "egress_update" => self.egress_update(parse("egress_update", args)?).await,
            "snapshot" => self.snapshot(parse("snapshot", args)?).await,
            "fork" => self.fork(parse("fork", args)?).await,
            "pause" => self.pause(parse("pause", args)?).await,
            other => return Err(ArgsError::UnknownTool(other.to_string())),
        })
    }

    fn at(&self, id: &str) -> Result<Arc<Sessions>, ToolFailure> {
        Ok(self.fleet.at(id)?)
    }

    /// `POST /session/`.
    async fn create(&self, a: CreateArgs) -> Result<Answer, ToolFailure> {
        if a.image.as_deref().is_none_or(str::is_empty) && a.snapshot_id.is_none() {
            return Err(ToolFailure::new(
                "invalid_argument",
                "session_create needs image (a Docker image) or snapshot_id",
                "Give image, e.g. \"python:3.12\", or the snapshot_id of a snapshot.",
            ));
        }
        let req = StartSessionRequest {
            base_image: a.image.unwrap_or_default(),
            snapshot_id: a.snapshot_id,
            environment: a.environment,
            memory_bytes: a.memory_bytes,
            cpus: a.cpus,
            egress: a.egress,
        };
        let _slot = self.admission.create().await?;
        let session_id = self.fleet.create(&req).await?;
        let sessions = self.at(&session_id)?;
        sessions.activity().touch(&session_id).await;
        sessions.metrics().sessions_created.inc();
        Ok(Answer::json(json!({ "session_id": session_id })))
    }

    /// `DELETE /session/{id}/` (`?force=true` unless `remove` is false).
    async fn close(&self, a: CloseArgs) -> Result<Answer, ToolFailure> {
        let id = a.session_id;
        let sessions = self.at(&id)?;
        let _held = if a.remove {
            sessions.lock_to_remove(&id).await?
        } else {
            Some(sessions.lock(&id).await?)
        };
        sessions.close(&id, a.remove).await?;
        sessions.metrics().observe_processes(&id, None);
        let mode = if a.remove { "remove" } else { "stop" };
        sessions
            .metrics()
            .sessions_closed
            .get_or_create(&ModeLabels { mode })
            .inc();
        Ok(Answer::json(json!({ "closed": true, "removed": a.remove })))
    }

    /// `POST /session/{id}/` as a stream: output becomes progress, a dropped call (cancelled,
    /// or its client gone) drops the stream, which kills the command's process group.
    async fn run(&self, a: RunArgs, progress: Option<ProgressSink>) -> Result<Answer, ToolFailure> {
        let id = a.session_id;
        let sessions = self.at(&id)?;
        let req = RunRequest {
            commands: a.commands,
            fail_fast: a.fail_fast,
            timeout: a.timeout,
        };
        let held = sessions.lock(&id).await?;
        let Some(spec) = sessions.run_spec(&id, &req).await? else {
            return Ok(render_run(Vec::new(), self.config.mcp.run_output_bytes));
        };
        let mut lines = processes::stream_run(sessions.clone(), id, spec, held);
        let mut streamed = 0usize;
        while let Some(line) = lines.recv().await {
            match line {
                Ok(RunStreamLine::Output { data, .. }) => {
                    if let Some(p) = &progress
                        && streamed < PROGRESS_MAX_BYTES
                    {
                        for chunk in chunks(&data, PROGRESS_CHUNK_BYTES) {
                            streamed += chunk.len();
                            let _ = p.try_send(chunk.to_string());
                        }
                        if streamed >= PROGRESS_MAX_BYTES {
                            let _ = p.try_send(
                                "\n[... further output is not streamed; it is in the result]\n"
                                    .to_string(),
                            );
                        }
                    }
                }
                Ok(RunStreamLine::Done { results }) => {
                    return Ok(render_run(results, self.config.mcp.run_output_bytes));
                }
                Ok(RunStreamLine::Error { detail }) => {
                    return Err(ToolFailure::new(
                        "unavailable",
                        detail,
                        "Retry; check the session with a short run first.",
                    ));
                }
                Ok(RunStreamLine::Result { .. } | RunStreamLine::Heartbeat) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Err(ToolFailure::new(
            "unavailable",
            "the run ended without its results",
            "Retry; check the session with a short run first.",
        ))
    }

    /// What an fs op holds, as its route does: an fs slot and the session running (writers
    /// also under its lock).
    async fn fs_ctx(&self, id: &str, writes: bool) -> Result<FsCtx, ToolFailure> {
        let sessions = self.at(id)?;
        let slot = self.admission.fs(id).await?;
        let held = if writes {
            let held = sessions.lock(id).await?;
            sessions.ensure_running(id).await?;
            Some(held)
        } else {
            sessions.running_unlocked(id).await?;
            None
        };
        Ok(FsCtx {
            sessions,
            _slot: slot,
            _held: held,
        })
    }

    async fn read(&self, a: ReadArgs) -> Result<Answer, ToolFailure> {
        let req = FsReadRequest {
            path: a.path,
            offset: a.offset,
            limit: a.limit,
        };
        let c = self.fs_ctx(&a.session_id, false).await?;
        let r = outcome(c.fs(&a.session_id).read(&req).await)?;
        let mut text = r.content.clone().unwrap_or_default();
        if let (Some(end), Some(total)) = (r.end_line, r.total_lines)
            && (end < total || r.truncated)
        {
            text.push_str(&format!(
                "\n[lines {}-{end} of {total}; read on with offset={end}]",
                req.offset + 1
            ));
        }
        Ok(Answer {
            value: wire(&r),
            text,
        })
    }

    async fn write(&self, a: WriteArgs) -> Result<Answer, ToolFailure> {
        let content = match a.encoding.as_deref() {
            None | Some("utf-8") | Some("utf8") | Some("text") => {
                base64::engine::general_purpose::STANDARD.encode(a.content.as_bytes())
            }
            Some("base64") => a.content,
            Some(other) => {
                return Err(ToolFailure::new(
                    "invalid_argument",
                    format!("encoding must be \"utf-8\" or \"base64\", got {other:?}"),
                    "Omit encoding for text, or give \"base64\" with base64 content.",
                ));
            }
        };
        let req = FsWriteRequest {
            path: a.path,
            content,
            mode: a.mode.unwrap_or(0o644),
        };
        let c = self.fs_ctx(&a.session_id, true).await?;
        let r = outcome(c.fs(&a.session_id).write(&req).await)?;
        Ok(Answer::json(wire(&r)))
    }

    async fn edit(&self, a: EditArgs) -> Result<Answer, ToolFailure> {
        let req = FsEditRequest {
            path: a.path,
            old: a.old,
            new: a.new,
            replace_all: a.replace_all,
        };
        let c = self.fs_ctx(&a.session_id, true).await?;
        let r = outcome(c.fs(&a.session_id).edit(&req).await)?;
        Ok(Answer::json(wire(&r)))
    }

    async fn grep(&self, a: GrepArgs) -> Result<Answer, ToolFailure> {
        let req = FsGrepRequest {
            pattern: a.pattern,
            path: a.path.unwrap_or_else(|| layout::REPO.to_string()),
            glob: a.glob,
            exclude: a.exclude,
        };
        let c = self.fs_ctx(&a.session_id, false).await?;
        let r = outcome(c.fs(&a.session_id).grep(&req).await)?;
        Ok(Answer::json(wire(&r)))
    }

    async fn glob(&self, a: GlobArgs) -> Result<Answer, ToolFailure> {
        let req = FsGlobRequest {
            pattern: a.pattern,
            path: a.path.unwrap_or_else(|| layout::REPO.to_string()),
            exclude: a.exclude,
        };
        let c = self.fs_ctx(&a.session_id, false).await?;
        let r = outcome(c.fs(&a.session_id).glob(&req).await)?;
        Ok(Answer::json(wire(&r)))
    }

    async fn ls(&self, a: LsArgs) -> Result<Answer, ToolFailure> {
        let req = FsLsRequest {
            path: a.path.unwrap_or_else(|| layout::REPO.to_string()),
        };
        let c = self.fs_ctx(&a.session_id, false).await?;
        let r = outcome(c.fs(&a.session_id).ls(&req).await)?;
        Ok(Answer::json(wire(&r)))
    }

    async fn process_start(&self, a: ProcessStartArgs) -> Result<Answer, ToolFailure> {
        let sessions = self.at(&a.session_id)?;
        let req = StartProcessRequest {
            command: a.command,
            environment: a.environment,
            workdir: a.workdir,
        };
        let process_id = processes::start(&sessions, &a.session_id, &req).await?;
        Ok(Answer::json(json!({ "process_id": process_id })))
    }

    async fn process_output(&self, a: ProcessOutputArgs) -> Result<Answer, ToolFailure> {
        let sessions = self.at(&a.session_id)?;
        let out =
            processes::poll(&sessions, &a.session_id, &a.process_id, a.offset, a.wait).await?;
        Ok(Answer::json(wire(&out)))
    }

    async fn process_kill(&self, a: ProcessKillArgs) -> Result<Answer, ToolFailure> {
        let sessions = self.at(&a.session_id)?;
        processes::kill(&sessions, &a.session_id, &a.process_id).await?;
        Ok(Answer::json(json!({ "killed": true })))
    }

    /// `PUT /session/{id}/egress/`: the answer says only that it was done (never the secrets).
    async fn egress_update(&self, a: EgressArgs) -> Result<Answer, ToolFailure> {
        let sessions = self.at(&a.session_id)?;
        let _held = sessions.lock(&a.session_id).await?;
        sessions.refresh_egress(&a.session_id, &a.egress).await?;
        Ok(Answer::json(json!({ "updated": true })))
    }

    async fn snapshot(&self, a: SnapshotArgs) -> Result<Answer, ToolFailure> {
        let sessions = self.at(&a.session_id)?;
        let req = sessions
            .snapshots()
            .validate(a.name.as_deref(), a.ttl_seconds)?;
        let _slot = self.admission.create().await?;
        let _held = sessions.lock(&a.session_id).await?;
        let (s, _) = sessions.snapshot(&a.session_id, &req).await?;
        Ok(Answer::json(json!({
            "snapshot_id": s.id,
            "name": s.name,
            "created_at": rfc3339(s.created),
            "size_bytes": s.size,
        })))
    }

    async fn fork(&self, a: ForkArgs) -> Result<Answer, ToolFailure> {
        let sessions = self.fleet.at_for_new(&a.session_id, a.count)?;
        let cap = sessions.config().snapshots.fork_max;
        if !(1..=cap).contains(&a.count) {
            return Err(SessionError::ForkCount(cap).into());
        }
        for (k, v) in a.environment.iter().flatten() {
            if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
                return Err(SessionError::InvalidEnvironment(k.clone()).into());
            }
        }
        let _slot = self.admission.create().await?;
        let (_more, more) = self
            .admission
            .more_creates(a.count.saturating_sub(1) as usize);
        let _held = sessions.lock(&a.session_id).await?;
        let session_ids = sessions
            .fork(&a.session_id, a.count, a.environment, 1 + more)
            .await?;
        for fork in &session_ids {
            sessions.activity().touch(fork).await;
        }
        sessions
            .metrics()
            .sessions_created
            .inc_by(session_ids.len() as u64);
        Ok(Answer::json(json!({ "session_ids": session_ids })))
    }

    async fn pause(&self, a: SessionArgs) -> Result<Answer, ToolFailure> {
        let sessions = self.at(&a.session_id)?;
        let _held = sessions.lock(&a.session_id).await?;
        sessions.pause(&a.session_id).await?;
        Ok(Answer::json(json!({ "paused": true })))
    }
}

/// An fs op's context (see [`Tools::fs_ctx`]).
struct FsCtx {
    sessions: Arc<Sessions>,
    _slot: Slot,
    _held: Option<LockGuard>,
}

impl FsCtx {
    fn fs<'a>(&'a self, id: &'a str) -> Fs<'a> {
        Fs {
            runtime: self.sessions.runtime(),
            config: self.sessions.config(),
            id,
        }
    }
}

/// An fs op's outcome: its answer, or why not (about the path: the fs code).
fn outcome<T>(r: Result<T, OpError>) -> Result<T, ToolFailure> {
    match r {
        Ok(v) => Ok(v),
        Err(OpError::Fs(e)) => Err(e.into()),
        Err(OpError::Failed(e)) => Err(e.into()),
    }
}

/// A wire response without its `error` (a failure never gets this far).
fn wire<T: serde::Serialize>(v: &T) -> Value {
    let mut v = serde_json::to_value(v).unwrap_or(Value::Null);
    if let Some(o) = v.as_object_mut() {
        o.remove("error");
    }
    v
}

/// A run's results with each command's output within its share of `budget`, and the
/// transcript a model reads.
pub fn render_run(results: Vec<RunResult>, budget: usize) -> Answer {
    let share = budget / results.len().max(1);
    let mut text = String::new();
    let mut shown = Vec::with_capacity(results.len());
    for r in results {
        let (output, truncated) = bounded(&r.output, share);
        text.push_str(&format!("$ {}\n{}", r.command, output));
        if !output.is_empty() && !output.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&format!("[exit code {}]\n", r.exit_code));
        shown.push(json!({
            "command": r.command,
            "exit_code": r.exit_code,
            "output": output,
            "output_truncated": truncated,
            "workdir": r.workdir,
        }));
    }
    if shown.is_empty() {
        text.push_str("(no commands)\n");
    }
    Answer {
        value: json!({ "results": shown }),
        text,
    }
}

/// `s` within `max` bytes: its start and its end around a marker saying how much was left out.
pub fn bounded(s: &str, max: usize) -> (String, bool) {
    if s.len() <= max {
        return (s.to_string(), false);
    }
    let keep = max.saturating_sub(200) / 2;
    let head = floor_char(s, keep);
    let tail = ceil_char(s, s.len() - keep);
    let omitted = tail - head;
    (
        format!(
            "{}\n[... {omitted} bytes of output omitted ({} in all): redirect the output to a \
             file and read or grep it ...]\n{}",
            &s[..head],
            s.len(),
            &s[tail..]
        ),
        true,
    )
}

fn floor_char(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_char(s: &str, mut i: usize) -> usize {
    while i < s.len() && !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

/// `s` in pieces of at most `max` bytes, never splitting a character.
fn chunks(s: &str, max: usize) -> impl Iterator<Item = &str> {
    let mut rest = s;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut cut = floor_char(rest, max.min(rest.len()));
        if cut == 0 {
            cut = ceil_char(rest, 1);
        }
        let (a, b) = rest.split_at(cut);
        rest = b;
        Some(a)
    })
}

fn rfc3339(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_output_keeps_its_ends_around_a_marker() {
        let s = format!("{}{}", "a".repeat(5000), "é".repeat(5000));
        let (out, cut) = bounded(&s, 2000);
        assert!(cut);
        assert!(out.len() <= 2000 + 200, "{}", out.len());
        assert!(out.starts_with('a') && out.ends_with('é'));
        assert!(out.contains("bytes of output omitted"));
        assert_eq!(bounded("short", 2000), ("short".to_string(), false));
        let pieces: Vec<&str> = chunks("héllo wörld", 3).collect();
        assert_eq!(pieces.concat(), "héllo wörld");
        assert!(pieces.iter().all(|p| p.len() <= 3));
    }

    #[test]
    fn every_tool_has_an_object_schema_and_a_description() {
        let tools = list();
        assert_eq!(tools.len(), 16);
        for t in tools {
            assert_eq!(
                t.input_schema.get("type").and_then(Value::as_str),
                Some("object"),
                "{}",
                t.name
            );
            assert!(t.description.as_ref().is_some_and(|d| d.len() > 20));
        }
    }

    #[test]
    fn bad_arguments_name_their_field() {
        let args = |v: Value| v.as_object().cloned();
        let e = parse::<RunArgs>("run", args(json!({"session_id": "x", "commands": "ls"})))
            .expect_err("a string is not a list");
        assert!(e.to_string().contains("commands"), "{e}");
        let e = parse::<RunArgs>("run", args(json!({"session_id": "x"}))).expect_err("missing");
        assert!(e.to_string().contains("commands"), "{e}");
        let e = parse::<LsArgs>("ls", args(json!({"session_id": "x", "pth": "/"})))
            .expect_err("unknown field");
        assert!(e.to_string().contains("pth"), "{e}");
    }

    /// docs/api/mcp.md lists exactly the served tools, in order.
    #[test]
    fn the_documented_tool_list_is_the_served_one() {
        let doc = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/api/mcp.md"));
        let section = doc
            .split("<!-- tools:")
            .nth(1)
            .and_then(|s| s.split("<!-- /tools -->").next())
            .expect("the tools section");
        let documented: Vec<&str> = section
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split('`').next())
            .collect();
        let served: Vec<&str> = list().iter().map(|t| t.name.as_ref()).collect();
        assert_eq!(documented, served);
    }
}
