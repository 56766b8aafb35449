//! The tools: what each one does, through the same operations as its REST route
//! ([`crate::ops`]: runs, the file tools, the background processes, a session's life, its
//! snapshots and forks, ports), so the admission class, the lock and the running check are the
//! route's, taken once. A tool's own failure is a [`ToolFailure`]; arguments that are not the
//! tool's are [`ArgsError`] (a protocol error naming the field).
//!
//! # Layout
//! - [`args`]: each tool's arguments (its JSON schema, written for a model) and the tool list.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine as _;
use rmcp::model::JsonObject;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::errors::ToolFailure;
use crate::api::{
    Environment, ForkRequest, RunRequest, RunResult, RunStreamLine, StartProcessRequest,
    StartSessionRequest,
};
use crate::config::Config;
use crate::error::ApiError;
use crate::ids::SessionId;
use crate::layout;
use crate::ops::processes::{self as op, Target};
use crate::ops::snapshots::TakeSnapshot;
use crate::ops::{Ops, fs, lifecycle, runs};
use sandbox_protocol::wire::*;

pub mod args;

pub use args::*;

/// Arguments that are not the tool's, or a tool that does not exist: the caller's mistake in
/// speaking the protocol, answered as a JSON-RPC error (invalid params) that names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ArgsError {
    #[error("unknown tool: {0:?} (tools/list names the tools)")]
    UnknownTool(String),
    #[error("{tool}: invalid arguments: {detail}")]
    Invalid { tool: &'static str, detail: String },
}

/// What a tool answers: its structured value, the text a model reads, and images (MIME type,
/// base64) it sees.
#[derive(Debug, Clone)]
pub struct Answer {
    pub value: Value,
    pub text: String,
    pub images: Vec<(String, String)>,
}

impl Answer {
    fn json(value: Value) -> Self {
        let text = value.to_string();
        Self {
            value,
            text,
            images: Vec::new(),
        }
    }
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
    pub ops: Ops,
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
            "port_url" => self.port_url(parse("port_url", args)?).await,
            "egress_update" => self.egress_update(parse("egress_update", args)?).await,
            "snapshot" => self.snapshot(parse("snapshot", args)?).await,
            "fork" => self.fork(parse("fork", args)?).await,
            "pause" => self.pause(parse("pause", args)?).await,
            "run_code" => self.run_code(parse("run_code", args)?).await,
            other => return Err(ArgsError::UnknownTool(other.to_string())),
        })
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
            environment: environment(a.environment)?,
            memory_bytes: a.memory_bytes,
            cpus: a.cpus,
            egress: a.egress,
            ..Default::default()
        };
        let session_id = self.ops.create(&req).await?;
        Ok(Answer::json(json!({ "session_id": session_id })))
    }

    /// `DELETE /session/{id}/` (`?force=true` unless `remove` is false).
    async fn close(&self, a: CloseArgs) -> Result<Answer, ToolFailure> {
        let id = session_id(&a.session_id)?;
        if a.remove {
            self.ops.apply(&id, lifecycle::Remove).await?;
        } else {
            self.ops.apply(&id, lifecycle::Stop).await?;
        }
        Ok(Answer::json(json!({ "closed": true, "removed": a.remove })))
    }

    /// `POST /session/{id}/` as a stream: output becomes progress, a dropped call (cancelled,
    /// or its client gone) drops the stream, which kills the command's process group.
    async fn run(&self, a: RunArgs, progress: Option<ProgressSink>) -> Result<Answer, ToolFailure> {
        let id = session_id(&a.session_id)?;
        let req = RunRequest {
            commands: a.commands,
            fail_fast: a.fail_fast,
            timeout: a.timeout,
        };
        let mut lines = self.ops.apply(&id, runs::StreamRun::new(req)?).await?.lines;
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
                Err(e) => return Err(crate::error::ApiError::from(e).into()),
            }
        }
        Err(ToolFailure::new(
            "unavailable",
            "the run ended without its results",
            "Retry; check the session with a short run first.",
        ))
    }

    async fn read(&self, a: ReadArgs) -> Result<Answer, ToolFailure> {
        let req = FsReadRequest {
            path: a.path,
            offset: a.offset,
            limit: a.limit,
        };
        let id = session_id(&a.session_id)?;
        let offset = req.offset;
        let r = self.ops.apply(&id, fs::Read(req)).await?.answer?;
        let mut text = r.content.clone().unwrap_or_default();
        if let (Some(end), Some(total)) = (r.end_line, r.total_lines)
            && (end < total || r.truncated)
        {
            text.push_str(&format!(
                "\n[lines {}-{end} of {total}; read on with offset={end}]",
                offset + 1
            ));
        }
        Ok(Answer {
            value: wire(&r),
            text,
            images: Vec::new(),
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
        let id = session_id(&a.session_id)?;
        let r = self.ops.apply(&id, fs::Write(req)).await?.answer?;
        Ok(Answer::json(wire(&r)))
    }

    async fn edit(&self, a: EditArgs) -> Result<Answer, ToolFailure> {
        let req = FsEditRequest {
            path: a.path,
            old: a.old,
            new: a.new,
            replace_all: a.replace_all,
        };
        let id = session_id(&a.session_id)?;
        let r = self.ops.apply(&id, fs::Edit(req)).await?.answer?;
        Ok(Answer::json(wire(&r)))
    }

    async fn grep(&self, a: GrepArgs) -> Result<Answer, ToolFailure> {
        let req = FsGrepRequest {
            pattern: a.pattern,
            path: a.path.unwrap_or_else(|| layout::REPO.to_string()),
            glob: a.glob,
            exclude: a.exclude,
        };
        let id = session_id(&a.session_id)?;
        let r = self.ops.apply(&id, fs::Grep(req)).await?.answer?;
        Ok(Answer::json(wire(&r)))
    }

    async fn glob(&self, a: GlobArgs) -> Result<Answer, ToolFailure> {
        let req = FsGlobRequest {
            pattern: a.pattern,
            path: a.path.unwrap_or_else(|| layout::REPO.to_string()),
            exclude: a.exclude,
        };
        let id = session_id(&a.session_id)?;
        let found = self.ops.apply(&id, fs::Glob(req)).await?.answer?;
        let r = FsGlobResponse {
            matches: found.collect().await.map_err(ApiError::from)?,
            error: None,
        };
        Ok(Answer::json(wire(&r)))
    }

    async fn ls(&self, a: LsArgs) -> Result<Answer, ToolFailure> {
        let req = FsLsRequest {
            path: a.path.unwrap_or_else(|| layout::REPO.to_string()),
        };
        let id = session_id(&a.session_id)?;
        let listed = self.ops.apply(&id, fs::Ls(req)).await?.answer?;
        let r = FsLsResponse {
            entries: listed.collect().await.map_err(ApiError::from)?,
            error: None,
        };
        Ok(Answer::json(wire(&r)))
    }

    /// The door every session operation of [`crate::ops`] goes through.
    fn ops(&self) -> Ops {
        self.ops.clone()
    }

    async fn process_start(&self, a: ProcessStartArgs) -> Result<Answer, ToolFailure> {
        let id = session_id(&a.session_id)?;
        let req = StartProcessRequest {
            command: a.command,
            environment: a.environment,
            workdir: a.workdir,
            process_id: None,
            tag: None,
            pty: None,
        };
        let started = self.ops().apply(&id, op::Start(req)).await?;
        Ok(Answer::json(json!({ "process_id": started.process_id })))
    }

    async fn process_output(&self, a: ProcessOutputArgs) -> Result<Answer, ToolFailure> {
        let id = session_id(&a.session_id)?;
        let (target, offset, wait) = (Target::Id(a.process_id), a.offset, a.wait);
        let out = self
            .ops()
            .apply(
                &id,
                op::Poll {
                    target,
                    offset,
                    wait,
                },
            )
            .await?;
        Ok(Answer::json(wire(&out)))
    }

    async fn process_kill(&self, a: ProcessKillArgs) -> Result<Answer, ToolFailure> {
        let id = session_id(&a.session_id)?;
        let target = Target::Id(a.process_id);
        self.ops().apply(&id, op::Kill { target }).await?;
        Ok(Answer::json(json!({ "killed": true })))
    }

    /// `POST /session/{id}/ports/{port}/token`: the port's URL (the preview host, else the
    /// path route under the service), its token, and the URL with the token for a browser.
    async fn port_url(&self, a: PortUrlArgs) -> Result<Answer, ToolFailure> {
        let id = session_id(&a.session_id)?;
        crate::ops::ports::check_port(a.port)?;
        self.ops().exists(&id).await?;
        let grant = crate::routes::ports::issue(
            &self.config,
            &id,
            a.port,
            a.ttl_seconds,
            &axum::http::HeaderMap::new(),
        )?;
        let sep = if grant.url.contains('?') { '&' } else { '?' };
        let with_token = format!(
            "{}{sep}{}={}",
            grant.url,
            crate::auth::port_token::QUERY,
            grant.token
        );
        Ok(Answer::json(json!({
            "url": grant.url,
            "token": grant.token,
            "url_with_token": with_token,
            "expires_at": grant.expires_at,
        })))
    }

    /// `POST /session/{id}/code`, collected: the transcript as text, each chart as an image.
    /// Bounded in time: the execution's `timeout` (or [`CODE_TIMEOUT`]), which interrupts the
    /// kernel, and a grace past it for the answer.
    async fn run_code(&self, a: RunCodeArgs) -> Result<Answer, ToolFailure> {
        let id = session_id(&a.session_id)?;
        let timeout = match a.timeout {
            None => CODE_TIMEOUT,
            Some(t) if t.is_finite() && t > 0.0 => t.min(CODE_TIMEOUT_MAX),
            Some(_) => {
                return Err(ToolFailure::new(
                    "invalid_argument",
                    "timeout must be a number of seconds above 0",
                    "Give timeout in seconds, e.g. 60, or omit it.",
                ));
            }
        };
        let body = json!({
            "code": a.code,
            "language": a.language,
            "context_id": a.context_id,
            "env_vars": a.env_vars,
            "timeout": timeout,
        });
        let deadline = std::time::Duration::from_secs_f64(timeout) + CODE_GRACE;
        let (lines, dropped) =
            crate::routes::code::execute_collected(&self.ops, &id, &body, deadline).await?;
        Ok(render_code(
            &lines,
            dropped,
            self.config.mcp.run_output_bytes,
        ))
    }

    /// `PUT /session/{id}/egress/`: the answer says only that it was done (never the secrets).
    async fn egress_update(&self, a: EgressArgs) -> Result<Answer, ToolFailure> {
        let id = session_id(&a.session_id)?;
        let op = lifecycle::RefreshEgress { policy: a.egress };
        self.ops.apply(&id, op).await?;
        Ok(Answer::json(json!({ "updated": true })))
    }

    async fn snapshot(&self, a: SnapshotArgs) -> Result<Answer, ToolFailure> {
        let id = session_id(&a.session_id)?;
        let op = TakeSnapshot {
            name: a.name,
            ttl_seconds: a.ttl_seconds,
        };
        let s = self.ops.apply(&id, op).await?;
        Ok(Answer::json(json!({
            "snapshot_id": s.snapshot_id,
            "name": s.name,
            "created_at": s.created_at,
            "size_bytes": s.size_bytes,
        })))
    }

    /// `POST /session/{id}/fork/`: the request checked once, then the fork (see [`Ops::fork`]).
    async fn fork(&self, a: ForkArgs) -> Result<Answer, ToolFailure> {
        let id = session_id(&a.session_id)?;
        let req = ForkRequest {
            count: a.count,
            environment: environment(a.environment)?,
            metadata: None,
            timeout_seconds: None,
            on_timeout: None,
        };
        let session_ids = self.ops.fork(&id, req).await?;
        Ok(Answer::json(json!({ "session_ids": session_ids })))
    }

    async fn pause(&self, a: SessionArgs) -> Result<Answer, ToolFailure> {
        let id = session_id(&a.session_id)?;
        self.ops.apply(&id, lifecycle::Pause).await?;
        Ok(Answer::json(json!({ "paused": true })))
    }
}

/// The session a tool names: an id that cannot be a session's is not found, as an unknown
/// one is.
fn session_id(id: &str) -> Result<SessionId, ToolFailure> {
    Ok(SessionId::parse(id).map_err(|_| ApiError::NotFound)?)
}

/// A tool's environment argument, held to the rule of a request's (a tool failure, as the
/// REST API's 422).
fn environment(env: Option<BTreeMap<String, String>>) -> Result<Option<Environment>, ToolFailure> {
    Ok(env
        .map(Environment::new)
        .transpose()
        .map_err(ApiError::from)?)
}

/// A wire response without its `error` (a failure never gets this far).
fn wire<T: serde::Serialize>(v: &T) -> Value {
    let mut v = serde_json::to_value(v).unwrap_or(Value::Null);
    if let Some(o) = v.as_object_mut() {
        o.remove("error");
    }
    v
}

/// Most bytes of images one `run_code` answer carries (base64); later ones are named, not sent.
const CODE_IMAGES_MAX_BYTES: usize = 8 * 1024 * 1024;
/// Seconds a `run_code` without a timeout may run before its kernel is interrupted.
const CODE_TIMEOUT: f64 = 600.0;
/// The longest `timeout` a `run_code` may ask for.
const CODE_TIMEOUT_MAX: f64 = 3600.0;
/// How long past its timeout a `run_code` waits for the interrupted execution's answer.
const CODE_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

/// An execution's lines as a model reads them: output in order, each result's text, an error
/// with its traceback (terminal colours taken out), within `budget` bytes of text; PNG and JPEG
/// results as images (within [`CODE_IMAGES_MAX_BYTES`]). Every text field is bounded.
pub fn render_code(
    lines: &[crate::routes::code::CodeLine],
    dropped: bool,
    budget: usize,
) -> Answer {
    let mut text = String::new();
    let mut images = Vec::new();
    let mut image_bytes = 0usize;
    let (mut stdout, mut stderr, mut results) = (String::new(), String::new(), Vec::new());
    let mut error = Value::Null;
    let mut execution_count = Value::Null;
    let field = |v: &Option<String>| v.as_deref().map(|s| json!(bounded(s, budget).0));
    for line in lines {
        match line.kind.as_str() {
            kind @ ("stdout" | "stderr") => {
                let t = line.text.as_deref().unwrap_or("");
                text.push_str(t);
                if kind == "stdout" {
                    stdout.push_str(t);
                } else {
                    stderr.push_str(t);
                }
            }
            "result" => {
                let mut shown = serde_json::Map::new();
                for (name, data) in [("png", &line.png), ("jpeg", &line.jpeg)] {
                    let Some(data) = data else { continue };
                    if image_bytes + data.len() <= CODE_IMAGES_MAX_BYTES {
                        image_bytes += data.len();
                        images.push((format!("image/{name}"), data.clone()));
                        shown.insert(name.into(), json!(format!("[image {}]", images.len())));
                    } else {
                        shown.insert(name.into(), json!("[image not sent: too large]"));
                    }
                }
                for (name, v) in [
                    ("text", &line.text),
                    ("html", &line.html),
                    ("markdown", &line.markdown),
                    ("svg", &line.svg),
                    ("latex", &line.latex),
                ] {
                    if let Some(v) = field(v) {
                        shown.insert(name.into(), v);
                    }
                }
                shown.insert("is_main_result".into(), json!(line.is_main_result));
                if let Some(t) = &line.text {
                    text.push_str(if line.is_main_result { "Out: " } else { "" });
                    text.push_str(t);
                    text.push('\n');
                }
                results.push(Value::Object(shown));
            }
            "error" => {
                let name = line.name.as_deref().unwrap_or("Error");
                let value = line.value.as_deref().unwrap_or("");
                let tb = strip_ansi(line.traceback.as_deref().unwrap_or(""));
                if tb.trim().is_empty() {
                    text.push_str(&format!("{name}: {value}\n"));
                } else {
                    text.push_str(&tb);
                    text.push('\n');
                }
                error = json!({
                    "name": bounded(name, budget).0,
                    "value": bounded(value, budget).0,
                    "traceback": bounded(&tb, budget).0,
                });
            }
            "number_of_executions" => {
                execution_count = json!(line.execution_count);
            }
            _ => {}
        }
    }
    let (shown, truncated) = bounded(&text, budget);
    let mut text = shown;
    if dropped {
        text.push_str("\n[the rest of the output was too large and is not shown]\n");
    }
    if text.is_empty() {
        text = "[no output]".into();
    }
    let value = json!({
        "stdout": bounded(&stdout, budget).0,
        "stderr": bounded(&stderr, budget).0,
        "results": results,
        "error": error,
        "execution_count": execution_count,
        "output_truncated": truncated || dropped,
    });
    Answer {
        value,
        text,
        images,
    }
}

/// `s` without terminal escape sequences (IPython colours its tracebacks).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
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
        images: Vec::new(),
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
        assert_eq!(tools.len(), 18);
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
