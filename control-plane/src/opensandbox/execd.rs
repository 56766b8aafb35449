//! OpenSandbox's execd (the daemon its SDK reaches at a sandbox's endpoint for port 44772),
//! served at `/execd/{id}/...` over the native operations: a command is a background process
//! whose events are rendered as execd's server-sent events; files and directories are the data
//! plane's raw files and fs operations; `/metrics` is the session's last sample.
//!
//! Events are execd's framing: one JSON object per event, each followed by a blank line, every
//! one with its `timestamp` (Unix ms; the SDK drops an event without one). Output comes a line
//! per event, without its newline, as execd sends it; a quiet command gets a `ping` every
//! [`PING_EVERY`] (the SDK gives up after 30 s of silence). A foreground command's stream ends
//! with its last event: `execution_complete` for an exit of 0, else `error` (`CommandExecError`,
//! the exit code as `evalue` and `exit_code`; 128 + the signal for one killed by a signal).

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::{StreamExt, TryStreamExt};
use sandbox_protocol::files::{
    EntryType, FileEntry, FsListRequest, FsMkdirRequest, FsMoveRequest, FsStatRequest,
    LIST_MAX_DEPTH, validate_any_path,
};
use sandbox_protocol::wire::{FsError, FsErrorCode, LIST_MAX_ENTRIES};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{Answer, Failure, OpenSandbox, session_id};
use crate::api::{
    ProcessEvent, ProcessEventType, ProcessSignal, SessionState, StartProcessRequest,
};
use crate::ops::Held;
use crate::ops::files::{
    GuardedMultipart, Read, ReadFile, ReplaceText, Replaced, Tripwire, Write, WriteFile,
};
use crate::ops::fs;
use crate::ops::processes::{self as op, Target};
use crate::routes::files as files_route;

/// How often a quiet command's stream says it is alive.
pub const PING_EVERY: Duration = Duration::from_secs(10);
/// A line longer than this is sent in pieces of it.
const MAX_LINE: usize = 64 * 1024;
/// The cursor header of a background command's logs.
const CURSOR_HEADER: &str = "EXECD-COMMANDS-TAIL-CURSOR";
/// How long a stream's reader may leave an event untaken before the stream is given up.
const STALL: Duration = Duration::from_secs(60);
/// Most paths one info or removal request names.
const MAX_PATHS: usize = 100;
/// Most bytes of an upload's metadata part.
const MAX_METADATA_PART: usize = 64 * 1024;
/// Most entries a search walks below its path, a directory at a time.
const SEARCH_MAX_ENTRIES: usize = 100_000;

pub(super) fn now_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

/// One event, as execd frames it.
pub(super) fn frame(mut v: Value) -> Bytes {
    v["timestamp"] = json!(now_ms());
    let mut b = serde_json::to_vec(&v).unwrap_or_default();
    b.extend_from_slice(b"\n\n");
    Bytes::from(b)
}

/// An fs-level refusal as the status the native route answers it with.
fn fs_failure(e: FsError) -> Failure {
    Failure::new(files_route::fs_status(e.code), e.message)
}

/// `GET /ping`: 200 while the sandbox runs (the SDK polls it until then); a paused one is a
/// 409 until `resume`.
pub async fn ping(State(s): State<OpenSandbox>, Path(id): Path<String>) -> Answer {
    let info = s.ops.info(&session_id(&id)?).await?;
    if info.state != SessionState::Running {
        return Err(Failure::new(
            StatusCode::CONFLICT,
            "the sandbox is not running (paused): resume it",
        ));
    }
    Ok((StatusCode::OK, "pong").into_response())
}

#[derive(Debug, Deserialize)]
struct RunCommand {
    #[serde(default)]
    command: Option<String>,
    #[serde(default)]
    argv: Option<Vec<String>>,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    background: bool,
    /// Milliseconds.
    #[serde(default)]
    timeout: Option<u64>,
    #[serde(default)]
    uid: Option<u32>,
    #[serde(default)]
    gid: Option<u32>,
    #[serde(default)]
    envs: Option<BTreeMap<String, String>>,
}

/// `POST /command`: the command started as a background process of the sandbox; its events as
/// execd's stream. A background one's stream ends once it started (`init`, then
/// `execution_complete`); its status and logs are asked for by its id.
pub async fn command(
    State(s): State<OpenSandbox>,
    Path(id): Path<String>,
    raw: axum::body::Bytes,
) -> Answer {
    let req: RunCommand =
        serde_json::from_slice(&raw).map_err(|e| Failure::bad_request(format!("body: {e}")))?;
    if req.uid.is_some() || req.gid.is_some() {
        return Err(Failure::bad_request(
            "uid/gid: commands run as the sandbox user here; nothing runs as another user",
        ));
    }
    let command = match (req.command, req.argv) {
        (Some(c), None) if !c.trim().is_empty() => c,
        (None, Some(argv)) if !argv.is_empty() => argv
            .iter()
            .map(|w| super::lifecycle::shell_quote(w))
            .collect::<Vec<_>>()
            .join(" "),
        _ => {
            return Err(Failure::bad_request(
                "give command (a shell command line) or argv (its words), not both",
            ));
        }
    };
    let started = op::StartFollowed {
        req: StartProcessRequest {
            command,
            environment: req.envs.filter(|e| !e.is_empty()),
            workdir: req.cwd.filter(|c| !c.is_empty()),
            process_id: None,
            tag: None,
            pty: None,
        },
        default_workdir: None,
        keep_stdin: false,
    };
    let followed = s.reach(&id, started).await?;
    let pid = followed.started.process_id.clone();
    // Its timeout (ms) holds whether or not its stream is read, background or not.
    let ended = tokio_util::sync::CancellationToken::new();
    if let Some(at) = deadline(req.timeout) {
        kill_at(&s, &id, &pid, at, ended.clone());
    }
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(32);
    if req.background {
        // Left to run: its events are asked for by its id (status, logs).
        drop(followed.events);
        let _ = tx.try_send(Ok(frame(json!({ "type": "init", "text": pid }))));
        let _ = tx.try_send(Ok(frame(
            json!({ "type": "execution_complete", "execution_time": 0 }),
        )));
        drop(tx);
    } else {
        tokio::spawn(follow(followed.events, pid, ended, tx));
    }
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Ok((
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

/// A stream's pending partial line.
#[derive(Default)]
pub(super) struct Lines {
    pending: String,
}

impl Lines {
    /// The whole lines of `data` (with what came before), each without its newline; one longer
    /// than [`MAX_LINE`] in pieces of it. Linear in `data`: only the last partial line is kept.
    pub(super) fn push(&mut self, data: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut rest = data;
        while let Some(at) = rest.find('\n') {
            let mut line = std::mem::take(&mut self.pending);
            line.push_str(&rest[..at]);
            pieces(line, &mut out, true);
            rest = &rest[at + 1..];
        }
        self.pending.push_str(rest);
        if self.pending.len() > MAX_LINE {
            let long = std::mem::take(&mut self.pending);
            self.pending = pieces(long, &mut out, false);
        }
        out
    }

    pub(super) fn rest(&mut self) -> Option<String> {
        (!self.pending.is_empty()).then(|| std::mem::take(&mut self.pending))
    }
}

/// `line` into `out` in pieces of at most [`MAX_LINE`] bytes (cut at character boundaries);
/// unless `whole`, the last piece is not sent but answered (a line still to be finished).
fn pieces(line: String, out: &mut Vec<String>, whole: bool) -> String {
    if line.len() <= MAX_LINE {
        if whole {
            out.push(line);
            return String::new();
        }
        return line;
    }
    let mut start = 0;
    while line.len() - start > MAX_LINE {
        let mut cut = start + MAX_LINE;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        out.push(line[start..cut].to_string());
        start = cut;
    }
    let last = line[start..].to_string();
    if whole {
        out.push(last);
        String::new()
    } else {
        last
    }
}

/// A timeout in milliseconds as a deadline from now (0: none); one past what the clock holds is
/// none rather than a panic.
pub(super) fn deadline(ms: Option<u64>) -> Option<tokio::time::Instant> {
    let ms = ms.filter(|ms| *ms > 0)?;
    tokio::time::Instant::now().checked_add(Duration::from_millis(ms))
}

/// Kills process `pid` of sandbox `id` at `at`, unless `ended` is cancelled first (its end was
/// seen): a command's timeout holds whether or not anyone still reads its stream.
pub(super) fn kill_at(
    s: &OpenSandbox,
    id: &str,
    pid: &str,
    at: tokio::time::Instant,
    ended: tokio_util::sync::CancellationToken,
) {
    let (s, id, pid) = (s.clone(), id.to_string(), pid.to_string());
    tokio::spawn(async move {
        tokio::select! {
            () = ended.cancelled() => {}
            () = tokio::time::sleep_until(at) => {
                let _ = s.reach(&id, op::Kill { target: Target::Id(pid) }).await;
            }
        }
    });
}

/// Sends one event; `false` once its reader is gone or has not taken one for [`STALL`].
pub(super) async fn send_event(tx: &mpsc::Sender<Result<Bytes, Infallible>>, v: Value) -> bool {
    matches!(
        tokio::time::timeout(STALL, tx.send(Ok(frame(v)))).await,
        Ok(Ok(()))
    )
}

/// Follows a foreground command: its output a line per event, a ping while it is quiet, its
/// end (which cancels `ended`). A client that goes away, or stops reading for [`STALL`], leaves
/// it running (its timeout still holds), as the native event stream does.
async fn follow(
    mut events: mpsc::Receiver<ProcessEvent>,
    pid: String,
    ended: tokio_util::sync::CancellationToken,
    tx: mpsc::Sender<Result<Bytes, Infallible>>,
) {
    if !send_event(&tx, json!({ "type": "init", "text": pid })).await {
        return;
    }
    let (mut out, mut err) = (Lines::default(), Lines::default());
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
    loop {
        let ev = tokio::select! {
            ev = events.recv() => ev,
            _ = ping.tick() => {
                if !send_event(&tx, json!({ "type": "ping", "text": "pong" })).await {
                    return;
                }
                continue;
            }
        };
        let Some(ev) = ev else {
            // The events stopped before the command's end: its sandbox went.
            ended.cancel();
            let _ = send_event(&tx, gone("the sandbox went before the command ended")).await;
            return;
        };
        ping.reset();
        let (kind, lines) = match ev.kind {
            ProcessEventType::Stdout => ("stdout", out.push(ev.data.as_deref().unwrap_or(""))),
            ProcessEventType::Stderr => ("stderr", err.push(ev.data.as_deref().unwrap_or(""))),
            ProcessEventType::End => {
                // Ended: its deadline's killer stands down.
                ended.cancel();
                for (kind, rest) in [("stdout", out.rest()), ("stderr", err.rest())] {
                    if let Some(text) = rest
                        && !send_event(&tx, json!({ "type": kind, "text": text })).await
                    {
                        return;
                    }
                }
                let _ = send_event(&tx, end(&ev)).await;
                return;
            }
            ProcessEventType::Start | ProcessEventType::Keepalive => continue,
        };
        for text in lines {
            if !send_event(&tx, json!({ "type": kind, "text": text })).await {
                return;
            }
        }
    }
}

/// execd's error event for a command whose end is not known.
pub(super) fn gone(why: &str) -> Value {
    json!({
        "type": "error",
        "error": {
            "ename": "CommandExecError",
            "evalue": "-1",
            "traceback": [why],
            "exit_code": -1,
        },
    })
}

/// The last event of a command: `execution_complete` for an exit of 0, else execd's `error`.
pub(super) fn end(ev: &ProcessEvent) -> Value {
    let code = match (&ev.signal, ev.exit_code) {
        (Some(sig), _) => 128 + signal_number(sig),
        (None, Some(c)) => c,
        (None, None) => -1,
    };
    if code == 0 {
        return json!({ "type": "execution_complete", "execution_time": ev.duration_ms.unwrap_or(0) });
    }
    let why = match &ev.signal {
        Some(sig) => format!("killed by SIG{sig}"),
        None => format!("exit status {code}"),
    };
    json!({
        "type": "error",
        "error": {
            "ename": "CommandExecError",
            "evalue": code.to_string(),
            "traceback": [why],
            "exit_code": code,
        },
    })
}

fn signal_number(sig: &str) -> i64 {
    match sig {
        "HUP" => 1,
        "INT" => 2,
        "QUIT" => 3,
        "KILL" => 9,
        "PIPE" => 13,
        "ALRM" => 14,
        "TERM" => 15,
        _ => 0,
    }
}

/// `GET /command/status/{cmd}`.
pub async fn status(
    State(s): State<OpenSandbox>,
    Path((id, cmd)): Path<(String, String)>,
) -> Answer {
    let p = s.reach(&id, op::Find(Target::Id(cmd))).await?;
    let mut v = json!({
        "id": p.process_id,
        "content": p.command,
        "running": p.running,
    });
    if let Some(code) = p.exit_code {
        v["exit_code"] = json!(code);
    }
    Ok(Json(v).into_response())
}

#[derive(Debug, Deserialize)]
pub struct Cursor {
    #[serde(default)]
    cursor: Option<u64>,
}

/// `GET /command/{cmd}/logs?cursor=`: its output from `cursor` (bytes; stdout and stderr as
/// they came), and the cursor to ask from next in `EXECD-COMMANDS-TAIL-CURSOR`.
pub async fn logs(
    State(s): State<OpenSandbox>,
    Path((id, cmd)): Path<(String, String)>,
    Query(q): Query<Cursor>,
) -> Answer {
    let polled = s
        .reach(
            &id,
            op::Poll {
                target: Target::Id(cmd),
                offset: q.cursor.unwrap_or(0),
                wait: 0.0,
            },
        )
        .await?;
    let mut r = (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        polled.output,
    )
        .into_response();
    r.headers_mut()
        .insert(CURSOR_HEADER, HeaderValue::from(polled.next_offset));
    Ok(r)
}

#[derive(Debug, Deserialize)]
pub struct CommandId {
    id: String,
}

/// `DELETE /command?id=`: the command interrupted (SIGINT).
pub async fn interrupt(
    State(s): State<OpenSandbox>,
    Path(id): Path<String>,
    Query(q): Query<CommandId>,
) -> Answer {
    let signal = op::Signal {
        target: Target::Id(q.id),
        signal: ProcessSignal::Int,
    };
    s.reach(&id, signal).await?;
    Ok(StatusCode::OK.into_response())
}

#[derive(Debug, Deserialize)]
struct UploadMeta {
    path: String,
    #[serde(default)]
    owner: Option<String>,
    #[serde(default)]
    group: Option<String>,
    #[serde(default)]
    mode: Option<u32>,
}

/// Refuses an owner or group: files belong to the sandbox user here.
fn no_owner(owner: &Option<String>, group: &Option<String>) -> Result<(), Failure> {
    if owner.is_some() || group.is_some() {
        return Err(Failure::bad_request(
            "owner/group: files belong to the sandbox user here; nothing is given to another",
        ));
    }
    Ok(())
}

/// execd's `mode`: an integer whose decimal digits are the octal permissions (755).
fn octal(mode: u32) -> Result<u32, Failure> {
    u32::from_str_radix(&mode.to_string(), 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| {
            Failure::bad_request(format!(
                "mode {mode}: octal permission digits such as 644 or 755"
            ))
        })
}

/// A mode as execd writes it: its octal digits as a decimal integer (0o644 is 644).
fn digits(mode: u32) -> u64 {
    format!("{:o}", mode & 0o7777).parse().unwrap_or(0)
}

/// `POST /files/upload`: multipart, each file a `metadata` part (`{path, owner, group, mode}`)
/// and the `file` part after it, written through the native raw write (parents made).
pub async fn upload(
    State(s): State<OpenSandbox>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Answer {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let boundary = multer::parse_boundary(ct)
        .map_err(|e| Failure::bad_request(format!("multipart/form-data expected: {e}")))?;
    // Bounded before multer buffers anything (a part's headers, the preamble, the parts).
    let tripwire = Tripwire::default();
    let guarded = GuardedMultipart::new(body.into_data_stream(), &boundary, tripwire.clone());
    let mut form = multer::Multipart::new(guarded, boundary);
    let mut meta: Option<UploadMeta> = None;
    let mut written = 0usize;
    let bad = |e: multer::Error| match tripwire.get() {
        Some(v) => Failure::new(StatusCode::PAYLOAD_TOO_LARGE, v.to_string()),
        None => Failure::bad_request(format!("multipart: {e}")),
    };
    while let Some(mut field) = form.next_field().await.map_err(bad)? {
        match field.name() {
            Some("metadata") => {
                let mut raw = Vec::new();
                while let Some(chunk) = field.chunk().await.map_err(bad)? {
                    raw.extend_from_slice(&chunk);
                    if raw.len() > MAX_METADATA_PART {
                        return Err(Failure::bad_request("a metadata part over 64 KiB"));
                    }
                }
                let m: UploadMeta = serde_json::from_slice(&raw)
                    .map_err(|e| Failure::bad_request(format!("metadata: {e}")))?;
                no_owner(&m.owner, &m.group)?;
                meta = Some(m);
            }
            Some("file") => {
                let m = meta.take().ok_or_else(|| {
                    Failure::bad_request("a file part without the metadata part before it")
                })?;
                let mode = m.mode.map(octal).transpose()?;
                let stream = field.map_err(std::io::Error::other).boxed();
                let op = WriteFile::new(&m.path, mode, stream)
                    .map_err(fs_failure)?
                    .parents(true);
                match s.reach(&id, op).await? {
                    Write::Written(_) => written += 1,
                    Write::Refused(e) => return Err(fs_failure(e)),
                }
            }
            other => {
                return Err(Failure::bad_request(format!(
                    "multipart part {other:?}: metadata and file parts only"
                )));
            }
        }
    }
    if written == 0 || meta.is_some() {
        return Err(Failure::bad_request(
            "each file is a metadata part and a file part",
        ));
    }
    Ok(StatusCode::OK.into_response())
}

/// `GET /files/download?path=`: the file's bytes (`Range` honoured: 206).
pub async fn download(
    State(s): State<OpenSandbox>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    match download_inner(&s, &id, &headers, &q).await {
        Ok(r) => r,
        Err(f) => f.into_response(),
    }
}

async fn download_inner(
    s: &OpenSandbox,
    id: &str,
    headers: &HeaderMap,
    q: &HashMap<String, String>,
) -> Answer {
    let path = q
        .get("path")
        .filter(|p| !p.is_empty())
        .ok_or_else(|| Failure::bad_request("path is required"))?;
    let line = |k: &str| -> Result<Option<u64>, Failure> {
        q.get(k)
            .map(|v| {
                v.parse::<u64>()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| Failure::bad_request(format!("{k} {v:?}: a line count from 1")))
            })
            .transpose()
    };
    let (offset, limit) = (line("offset")?, line("limit")?);
    if offset.is_some() || limit.is_some() {
        if headers.contains_key(header::RANGE) {
            return Err(Failure::bad_request(
                "offset/limit (lines) or a Range (bytes), not both",
            ));
        }
        return read_lines(s, id, path, offset.unwrap_or(1), limit).await;
    }
    let range = files_route::parse_range(headers);
    let op = ReadFile::new(path, range).map_err(fs_failure)?;
    let (read, hold) = match s.reach(id, op).await? {
        Held {
            answer: Read::Refused { error, .. },
            ..
        } => return Err(fs_failure(error)),
        Held { answer, hold } => (answer, hold),
    };
    let answer = files_route::file_answer(read, range.is_some(), false).map_err(Failure::from)?;
    Ok(crate::routes::admit::holding(answer, hold))
}

/// A line-based read (`offset`, 1-based, and `limit` lines; to the end without one): those
/// lines of the file, each with its newline, streamed as the file is read and its read stopped
/// after the last one.
async fn read_lines(
    s: &OpenSandbox,
    id: &str,
    path: &str,
    offset: u64,
    limit: Option<u64>,
) -> Answer {
    let op = ReadFile::new(path, None).map_err(fs_failure)?;
    let (stream, hold) = match s.reach(id, op).await? {
        Held {
            answer: Read::Stream(stream),
            hold,
        } => (stream, hold),
        Held {
            answer: Read::Refused { error, .. },
            ..
        } => return Err(fs_failure(error)),
    };
    let body = Body::from_stream(lines_of(stream.body, offset, limit));
    let answer = ([(header::CONTENT_TYPE, "application/octet-stream")], body).into_response();
    Ok(crate::routes::admit::holding(answer, hold))
}

/// Where a line-based read stands: newlines still to pass before its first line, and to send
/// (`None`: every one to the end).
struct Cut {
    body: futures::stream::BoxStream<'static, std::io::Result<Bytes>>,
    skip: u64,
    left: Option<u64>,
    done: bool,
}

/// `data` from `from` past `count` newlines at most: where that is, and how many it passed.
fn past_newlines(data: &[u8], from: usize, count: u64) -> (usize, u64) {
    let (mut at, mut passed) = (from, 0);
    while passed < count {
        match data[at..].iter().position(|b| *b == b'\n') {
            Some(p) => {
                at += p + 1;
                passed += 1;
            }
            None => return (data.len(), passed),
        }
    }
    (at, passed)
}

/// Lines `offset` (1-based) to `offset + limit - 1` of `body`, each with its newline; the last
/// line of a file without a final newline as it is. The body is not read past them.
fn lines_of(
    body: futures::stream::BoxStream<'static, std::io::Result<Bytes>>,
    offset: u64,
    limit: Option<u64>,
) -> impl futures::Stream<Item = std::io::Result<Bytes>> + Send + 'static {
    let cut = Cut {
        body,
        skip: offset.saturating_sub(1),
        left: limit,
        done: false,
    };
    futures::stream::unfold(cut, |mut cut| async move {
        while !cut.done {
            let chunk = match cut.body.next().await? {
                Ok(c) => c,
                Err(e) => {
                    cut.done = true;
                    return Some((Err(e), cut));
                }
            };
            let (start, passed) = past_newlines(&chunk, 0, cut.skip);
            cut.skip -= passed;
            if cut.skip > 0 {
                continue;
            }
            let mut end = chunk.len();
            if let Some(left) = cut.left {
                let (at, sent) = past_newlines(&chunk, start, left);
                cut.left = Some(left - sent);
                if left == sent {
                    end = at;
                    cut.done = true;
                }
            }
            if start < end {
                return Some((Ok(chunk.slice(start..end)), cut));
            }
        }
        None
    })
}

/// execd's `FileInfo` of an entry.
fn file_info(e: &FileEntry) -> Value {
    let at = crate::time::rfc3339(e.mtime);
    json!({
        "path": e.path,
        "size": e.size,
        "modified_at": at,
        "created_at": at,
        "owner": e.owner,
        "group": e.group,
        "mode": digits(e.mode),
        "type": match e.entry_type {
            EntryType::File => "file",
            EntryType::Directory => "directory",
            EntryType::Symlink => "symlink",
            EntryType::Other => "other",
        },
    })
}

/// The `path` parameters of a query (`?path=a&path=b`).
fn paths(q: Option<String>) -> Result<Vec<String>, Failure> {
    let paths: Vec<String> = form_urlencoded::parse(q.unwrap_or_default().as_bytes())
        .filter(|(k, _)| k == "path")
        .map(|(_, v)| v.into_owned())
        .collect();
    if paths.is_empty() {
        return Err(Failure::bad_request("path is required"));
    }
    if paths.len() > MAX_PATHS {
        return Err(Failure::bad_request(format!("at most {MAX_PATHS} paths")));
    }
    Ok(paths)
}

/// `GET /files/info?path=a&path=b`: `{path: FileInfo}`.
pub async fn info(
    State(s): State<OpenSandbox>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Answer {
    let mut out = serde_json::Map::new();
    for path in paths(q)? {
        let r = s
            .reach(&id, fs::Stat(FsStatRequest { path: path.clone() }))
            .await?;
        match (r.entry, r.error) {
            (Some(entry), None) => out.insert(path, file_info(&entry)),
            (_, Some(e)) => return Err(fs_failure(e)),
            (None, None) => {
                return Err(Failure::new(
                    StatusCode::NOT_FOUND,
                    format!("{path}: no such file or directory"),
                ));
            }
        };
    }
    Ok(Json(Value::Object(out)).into_response())
}

/// A glob over a name, as execd's search matches one (`*`, `?`, `[...]`, `{a,b}`; `**` is any
/// name); an invalid one is a 400.
fn name_glob(pattern: &str) -> Result<globset::GlobMatcher, Failure> {
    globset::GlobBuilder::new(pattern)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| Failure::bad_request(format!("pattern {pattern:?}: {e}")))
}

/// The entries below `path`, every level down (never through a symlink, nor into a directory
/// the sandbox user cannot read), sorted by path: one listing of [`LIST_MAX_DEPTH`] levels, then
/// a directory at a time below those (or from `path`, past what one listing answers), at most
/// [`SEARCH_MAX_ENTRIES`].
async fn walk(s: &OpenSandbox, id: &str, path: &str) -> Result<Vec<FileEntry>, Failure> {
    let list = |path: String, depth: u32| async move {
        s.reach(id, fs::List(FsListRequest { path, depth })).await
    };
    let whole = list(path.to_string(), LIST_MAX_DEPTH).await?;
    if let Some(e) = whole.error {
        return Err(fs_failure(e));
    }
    let (mut found, mut dirs) = if whole.truncated {
        (Vec::new(), vec![path.to_string()])
    } else {
        // The directories the listing reached the last level of: walked on from there.
        let root = validate_any_path(path).map_err(fs_failure)?;
        let prefix = format!("{}/", root.trim_end_matches('/'));
        let deepest: Vec<String> = whole
            .entries
            .iter()
            .filter(|e| e.entry_type == EntryType::Directory)
            .filter(|e| {
                e.path.strip_prefix(&prefix).is_some_and(|rel| {
                    rel.split('/').count() >= usize::try_from(LIST_MAX_DEPTH).unwrap_or(usize::MAX)
                })
            })
            .map(|e| e.path.clone())
            .collect();
        (whole.entries, deepest)
    };
    let too_many = || {
        Failure::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "more entries below {path} than a search walks (at most {SEARCH_MAX_ENTRIES}, \
                 {LIST_MAX_ENTRIES} in one directory): search a narrower path"
            ),
        )
    };
    while let Some(dir) = dirs.pop() {
        let level = list(dir, 1).await?;
        match level.error {
            None => {}
            // Gone, or not the user's to read, since it was seen: passed, as a listing passes
            // a directory it cannot read.
            Some(FsError {
                code:
                    FsErrorCode::NotFound | FsErrorCode::PermissionDenied | FsErrorCode::NotADirectory,
                ..
            }) if !found.is_empty() => continue,
            Some(e) => return Err(fs_failure(e)),
        }
        if level.truncated {
            return Err(too_many());
        }
        for e in level.entries {
            if e.entry_type == EntryType::Directory {
                dirs.push(e.path.clone());
            }
            found.push(e);
        }
        if found.len() > SEARCH_MAX_ENTRIES {
            return Err(too_many());
        }
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(found)
}

/// `GET /files/search?path=&pattern=`: the files below `path`, every level down, whose name
/// matches the glob `pattern` (`**`, every one, by default), as `FileInfo`s sorted by path.
/// Directories are walked, not answered; a symlink is answered, not followed.
pub async fn search(
    State(s): State<OpenSandbox>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let path = q
        .get("path")
        .filter(|p| !p.is_empty())
        .ok_or_else(|| Failure::bad_request("path is required"))?;
    let pattern = q
        .get("pattern")
        .filter(|p| !p.is_empty())
        .map_or("**", String::as_str);
    let matcher = name_glob(pattern)?;
    let found: Vec<Value> = walk(&s, &id, path)
        .await?
        .iter()
        .filter(|e| e.entry_type != EntryType::Directory && matcher.is_match(&e.name))
        .map(file_info)
        .collect();
    Ok(Json(found).into_response())
}

#[derive(Debug, Deserialize)]
struct Rename {
    src: String,
    dest: String,
}

/// `POST /files/mv [{src, dest}]`: each renamed in turn (`rename(2)`: the destination's
/// directory must exist; a file there is replaced).
pub async fn rename(
    State(s): State<OpenSandbox>,
    Path(id): Path<String>,
    raw: axum::body::Bytes,
) -> Answer {
    let moves: Vec<Rename> =
        serde_json::from_slice(&raw).map_err(|e| Failure::bad_request(format!("body: {e}")))?;
    if moves.len() > MAX_PATHS {
        return Err(Failure::bad_request(format!("at most {MAX_PATHS} moves")));
    }
    for m in moves {
        let req = FsMoveRequest {
            source: m.src,
            destination: m.dest,
        };
        if let Some(e) = s.reach(&id, fs::Move(req)).await?.error {
            return Err(fs_failure(e));
        }
    }
    Ok(StatusCode::OK.into_response())
}

/// execd's `Permission`: `mode` 755 unless given.
#[derive(Debug, Deserialize)]
struct Permission {
    #[serde(default = "default_mode")]
    mode: u32,
    #[serde(default)]
    owner: Option<String>,
    #[serde(default)]
    group: Option<String>,
}

fn default_mode() -> u32 {
    755
}

/// `POST /files/permissions {path: {mode, owner, group}}`: each path's mode set (octal digits;
/// its permission bits, as every mode here), as the sandbox user. An owner or group is refused:
/// files belong to the sandbox user. Every entry is checked before any is applied.
pub async fn chmod(
    State(s): State<OpenSandbox>,
    Path(id): Path<String>,
    raw: axum::body::Bytes,
) -> Answer {
    let asked: BTreeMap<String, Permission> =
        serde_json::from_slice(&raw).map_err(|e| Failure::bad_request(format!("body: {e}")))?;
    if asked.len() > MAX_PATHS {
        return Err(Failure::bad_request(format!("at most {MAX_PATHS} paths")));
    }
    let mut modes = Vec::with_capacity(asked.len());
    for (path, p) in asked {
        no_owner(&p.owner, &p.group)?;
        modes.push((path, octal(p.mode)?));
    }
    for (path, mode) in modes {
        match s
            .reach(
                &id,
                fs::Chmod {
                    path: path.clone(),
                    mode,
                },
            )
            .await?
        {
            fs::Chmodded::Done => {}
            fs::Chmodded::Refused(e) => return Err(fs_failure(e)),
            fs::Chmodded::Failed(out) if out.contains("Operation not permitted") => {
                return Err(Failure::new(
                    StatusCode::FORBIDDEN,
                    format!("{path}: not the sandbox user's to change"),
                ));
            }
            fs::Chmodded::Failed(_) => {
                return Err(Failure::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("{path}: its mode could not be changed"),
                ));
            }
        }
    }
    Ok(StatusCode::OK.into_response())
}

#[derive(Debug, Deserialize)]
struct Replacement {
    old: String,
    new: String,
}

/// `POST /files/replace[?verbose=true] {path: {old, new}}`: every occurrence of `old` in each
/// file replaced by `new` (its mode and owner kept); with `verbose`, how many per file
/// (`{path: {replacedCount}}`), else an empty 200. Every entry is checked before any is applied.
pub async fn replace(
    State(s): State<OpenSandbox>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    raw: axum::body::Bytes,
) -> Answer {
    let asked: BTreeMap<String, Replacement> =
        serde_json::from_slice(&raw).map_err(|e| Failure::bad_request(format!("body: {e}")))?;
    if asked.len() > MAX_PATHS {
        return Err(Failure::bad_request(format!("at most {MAX_PATHS} paths")));
    }
    let verbose = q.get("verbose").is_some_and(|v| v == "true");
    let mut ops = Vec::with_capacity(asked.len());
    for (path, r) in asked {
        if r.old.is_empty() {
            return Err(Failure::bad_request(format!(
                "{path}: old must not be empty: give the exact text to replace"
            )));
        }
        let op = ReplaceText::new(&path, &r.old, &r.new).map_err(fs_failure)?;
        ops.push((path, op));
    }
    let mut counts = serde_json::Map::new();
    for (path, op) in ops {
        match s.reach(&id, op).await? {
            Replaced::Count(n) => counts.insert(path, json!({ "replacedCount": n })),
            Replaced::Refused(e) => return Err(fs_failure(e)),
        };
    }
    if verbose {
        return Ok(Json(Value::Object(counts)).into_response());
    }
    Ok(StatusCode::OK.into_response())
}

/// `DELETE /files?path=` and `DELETE /directories?path=`: each path removed, with what is
/// below it; one already gone is no error.
pub async fn remove(
    State(s): State<OpenSandbox>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Answer {
    for path in paths(q)? {
        match s.reach(&id, fs::RemoveTree { path: path.clone() }).await? {
            fs::Removal::Removed | fs::Removal::Absent => {}
            fs::Removal::Refused(e) => return Err(fs_failure(e)),
            fs::Removal::Failed(out) if out.contains("Permission denied") => {
                return Err(Failure::new(
                    StatusCode::FORBIDDEN,
                    format!("{path}: permission denied"),
                ));
            }
            fs::Removal::Failed(_) => {
                return Err(Failure::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("{path} could not be removed"),
                ));
            }
        }
    }
    Ok(StatusCode::OK.into_response())
}

#[derive(Debug, Deserialize)]
struct DirSpec {
    #[serde(default)]
    mode: Option<u32>,
    #[serde(default)]
    owner: Option<String>,
    #[serde(default)]
    group: Option<String>,
}

/// `POST /directories {path: {mode, owner, group}}`: each made with its parents (one that is
/// there is no error). Directories take the sandbox user's default mode; a `mode` is checked
/// as execd's, not applied.
pub async fn mkdirs(
    State(s): State<OpenSandbox>,
    Path(id): Path<String>,
    raw: axum::body::Bytes,
) -> Answer {
    let dirs: BTreeMap<String, DirSpec> =
        serde_json::from_slice(&raw).map_err(|e| Failure::bad_request(format!("body: {e}")))?;
    for (path, spec) in dirs {
        no_owner(&spec.owner, &spec.group)?;
        spec.mode.map(octal).transpose()?;
        let made = s
            .reach(
                &id,
                fs::Mkdir(FsMkdirRequest {
                    path,
                    parents: true,
                }),
            )
            .await?;
        if let Some(e) = made.error {
            return Err(fs_failure(e));
        }
    }
    Ok(StatusCode::OK.into_response())
}

/// `GET /directories/list?path=&depth=`: the entries below `path`, `depth` levels down (1 by
/// default).
pub async fn list(
    State(s): State<OpenSandbox>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let path = q
        .get("path")
        .filter(|p| !p.is_empty())
        .cloned()
        .ok_or_else(|| Failure::bad_request("path is required"))?;
    let depth = match q.get("depth") {
        None => 1,
        Some(d) => d
            .parse::<u32>()
            .ok()
            .filter(|d| (1..=32).contains(d))
            .ok_or_else(|| Failure::bad_request(format!("depth {d:?}: 1 to 32")))?,
    };
    let listed = s
        .reach(&id, fs::List(FsListRequest { path, depth }))
        .await?;
    if let Some(e) = listed.error {
        return Err(fs_failure(e));
    }
    let entries: Vec<Value> = listed.entries.iter().map(file_info).collect();
    Ok(Json(entries).into_response())
}

/// `GET /metrics`: the session's last sample (CPU and memory), as execd's.
pub async fn metrics(State(s): State<OpenSandbox>, Path(id): Path<String>) -> Answer {
    let samples = s.ops.metrics(&session_id(&id)?, None, None).await?;
    const MIB: f64 = 1024.0 * 1024.0;
    let v = match samples.last() {
        Some(m) => json!({
            "cpu_count": m.cpu_count,
            "cpu_used_pct": m.cpu_used_pct,
            "mem_total_mib": m.mem_total as f64 / MIB,
            "mem_used_mib": m.mem_used as f64 / MIB,
            "timestamp": m.timestamp_unix * 1000,
        }),
        None => {
            return Err(Failure::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "no sample of the sandbox's resources yet; retry in a moment",
            ));
        }
    };
    Ok(Json(v).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_comes_a_line_per_event_without_its_newline() {
        let mut l = Lines::default();
        assert_eq!(l.push("a\nb"), vec!["a"]);
        assert_eq!(l.push("c\n\nd"), vec!["bc", ""]);
        assert_eq!(l.rest().as_deref(), Some("d"));
        assert_eq!(l.rest(), None);
        let long = "é".repeat(MAX_LINE);
        let pieces = l.push(&long);
        assert!(pieces.iter().all(|p| p.len() <= MAX_LINE));
        assert_eq!(pieces.concat() + &l.rest().unwrap_or_default(), long);
    }

    #[test]
    fn a_timeout_never_overflows_the_clock() {
        // (Far beyond any deadline tokio sleeps to, which it clamps: no panic either way.)
        let _ = deadline(Some(u64::MAX));
        assert!(deadline(Some(0)).is_none() && deadline(None).is_none());
        assert!(deadline(Some(1000)).is_some());
    }

    #[test]
    fn modes_are_octal_digits() {
        assert_eq!(octal(755).ok(), Some(0o755));
        assert_eq!(octal(644).ok(), Some(0o644));
        assert!(octal(789).is_err());
        assert!(octal(77777).is_err());
        assert_eq!(digits(0o100644), 644);
        assert_eq!(digits(0o755), 755);
    }

    /// `offset`/`limit` lines of a body whose chunks cut lines anywhere.
    async fn cut(offset: u64, limit: Option<u64>) -> String {
        let chunks = ["l1\nl", "2\n", "l3\nl4\n", "l5"];
        let body = futures::stream::iter(chunks.map(|c| Ok(Bytes::from_static(c.as_bytes()))));
        let lines: Vec<Bytes> = lines_of(body.boxed(), offset, limit)
            .map(|c| c.expect("bytes"))
            .collect()
            .await;
        String::from_utf8(lines.concat()).expect("utf-8")
    }

    #[tokio::test]
    async fn lines_are_read_by_number_across_chunks() {
        assert_eq!(cut(1, None).await, "l1\nl2\nl3\nl4\nl5");
        assert_eq!(cut(2, Some(1)).await, "l2\n");
        assert_eq!(cut(2, Some(3)).await, "l2\nl3\nl4\n");
        assert_eq!(cut(4, None).await, "l4\nl5");
        assert_eq!(cut(5, Some(10)).await, "l5");
        assert_eq!(cut(6, None).await, "");
        assert_eq!(cut(1, Some(1)).await, "l1\n");
    }

    #[test]
    fn a_search_matches_names_as_execd_does() {
        let m = |p: &str, name: &str| name_glob(p).expect("a glob").is_match(name);
        assert!(m("*.py", "a.py") && !m("*.py", "a.pyc"));
        assert!(m("**", "anything") && m("a?c", "abc") && m("{x,y}.txt", "y.txt"));
        assert!(m("[ab].md", "b.md") && !m("[ab].md", "c.md"));
        assert!(name_glob("[").is_err());
    }

    #[test]
    fn a_command_ends_as_execd_says_it() {
        let mut ev = ProcessEvent::new(3, ProcessEventType::End);
        ev.exit_code = Some(0);
        assert_eq!(end(&ev)["type"], "execution_complete");
        ev.exit_code = Some(3);
        let e = end(&ev);
        assert_eq!(e["type"], "error");
        assert_eq!(e["error"]["evalue"], "3");
        assert_eq!(e["error"]["exit_code"], 3);
        ev.exit_code = None;
        ev.signal = Some("KILL".into());
        assert_eq!(end(&ev)["error"]["exit_code"], 137);
    }
}
