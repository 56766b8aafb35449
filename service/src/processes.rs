//! Background processes and streaming runs: what the routes under `/processes/` and a run with
//! `Accept: application/x-ndjson` do, over the session runtime. Processes work through the
//! session's [`Workspace`] (its helper's channel, the settings, the metrics); a streaming run
//! through [`Sessions::run_streaming`].
//!
//! Processes live in the sandbox, supervised by its `init` helper (see the `sandbox-helper`
//! crate's `procs`): every replica and every channel sees the same ones, and they
//! die with the container. This module validates requests, speaks the supervisor's requests and
//! turns its byte output into text without ever splitting a character.

use std::collections::BTreeMap;
use std::time::Duration;

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::api::RunStreamLine as Line;
use crate::runtime::RunEvent;
use sandbox_protocol::files::validate_any_path;
use sandbox_protocol::message::{
    PROCESS_ID_MAX, PollInfo, ProcEvent, ProcEvents, ProcInfo, ProcList, ProcRequest, ProcStarted,
    PtySize, valid_process_id,
};

use crate::api::{
    OutputStream, ProcessEvent, ProcessEventType, ProcessInfo, ProcessList, ProcessOutput,
    ProcessSignal, StartProcessRequest, TerminalSize,
};
use crate::layout;
use crate::runtime::HelperError;
use crate::sessions::{SessionError, SessionId, Sessions, Workspace};

/// Most bytes one stdin request may carry (the helper enforces the same bound).
pub const MAX_STDIN_BYTES: usize = 1024 * 1024;
/// Output bytes one round of an event stream takes from the helper at most.
const EVENTS_MAX_BYTES: u64 = 1024 * 1024;
/// Longest tag.
const MAX_TAG_CHARS: usize = 256;

/// Why a process request was not done. The texts are what a client is told; the HTTP status
/// of each is decided in [`crate::error`].
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// Why the workdir is not a path.
    #[error("workdir: {0}")]
    InvalidWorkdir(String),
    #[error("process_id must be 1 to {PROCESS_ID_MAX} of [A-Za-z0-9._-], not starting with a dot")]
    InvalidProcessId,
    #[error("tag must be at most {MAX_TAG_CHARS} characters, none a control character")]
    InvalidTag,
    #[error("a terminal's cols and rows must be between 1 and 1000")]
    InvalidTerminalSize,
    /// A variable that breaks the one rule of every environment ([`crate::api::Environment`]).
    #[error(transparent)]
    InvalidEnvironment(#[from] crate::api::InvalidEnvironment),
    #[error("command must not be empty")]
    EmptyCommand,
    #[error("command contains a NUL byte")]
    NulInCommand,
    #[error("wait must be a number of seconds, at least 0")]
    InvalidWait,
    /// A process id the supervisor could never have given.
    #[error("no such process")]
    NoSuchProcess,
    #[error("stdin writes are limited to {MAX_STDIN_BYTES} bytes per request")]
    StdinTooLarge,
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error(transparent)]
    Helper(#[from] HelperError),
}

/// Text of `bytes`, keeping back an incomplete UTF-8 sequence at the end for the next chunk.
#[derive(Debug, Default)]
pub struct Utf8Carry {
    pending: Vec<u8>,
}

impl Utf8Carry {
    /// Decodes what is complete of `pending + bytes` (invalid bytes become U+FFFD).
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let keep = incomplete_tail(&self.pending);
        let rest = self.pending.split_off(self.pending.len() - keep);
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending = rest;
        text
    }

    /// Whatever is held back, decoded as is (the stream ended).
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

use sandbox_protocol::text::incomplete_tail;

/// A process's working directory: any absolute path without `..` (the process runs as the
/// sandbox user, so where it may go is the user's to have).
fn workdir(raw: Option<&str>) -> Result<String, ProcessError> {
    let Some(raw) = raw else {
        return Ok(layout::REPO.to_string());
    };
    validate_any_path(raw).map_err(|e| ProcessError::InvalidWorkdir(e.message))
}

/// A process's variables follow the rule of a session's ([`crate::api::Environment`]): a name is
/// anything without `=` or NUL, as the engine and `execve` take it.
fn environment(
    env: &Option<BTreeMap<String, String>>,
) -> Result<Vec<(String, String)>, ProcessError> {
    let Some(env) = env else {
        return Ok(Vec::new());
    };
    let env = crate::api::Environment::new(env.clone())?;
    Ok(env.into_inner().into_iter().collect())
}

fn process_id(raw: &str) -> Result<(), ProcessError> {
    // Anything else cannot exist.
    if !valid_process_id(raw) {
        return Err(ProcessError::NoSuchProcess);
    }
    Ok(())
}

/// One request to the session's supervisor, beside whatever else runs in the session.
async fn call(
    ws: &Workspace<'_>,
    request: ProcRequest,
    input: Option<Bytes>,
) -> Result<crate::runtime::Answer, ProcessError> {
    ws.beside().await?;
    Ok(ws.runtime.process(ws.id, request, input).await?)
}

/// Starts a process; `existing` when the request named a process the session already has.
pub async fn start(
    ws: &Workspace<'_>,
    req: &StartProcessRequest,
) -> Result<ProcStarted, ProcessError> {
    if req.command.trim().is_empty() {
        return Err(ProcessError::EmptyCommand);
    }
    if req.command.contains('\0') {
        return Err(ProcessError::NulInCommand);
    }
    if let Some(id) = &req.process_id
        && !valid_process_id(id)
    {
        return Err(ProcessError::InvalidProcessId);
    }
    if let Some(tag) = &req.tag
        && (tag.chars().count() > MAX_TAG_CHARS || tag.chars().any(char::is_control))
    {
        return Err(ProcessError::InvalidTag);
    }
    let request = ProcRequest::Start {
        command: req.command.clone(),
        workdir: workdir(req.workdir.as_deref())?,
        env: environment(&req.environment)?,
        max_live: ws.config.sessions.max_processes,
        buffer_bytes: ws.config.sessions.process_output_bytes,
        process_id: req.process_id.clone(),
        tag: req.tag.clone(),
        pty: req.pty.map(terminal_size).transpose()?,
    };
    let started: ProcStarted = call(ws, request, None).await?.parse()?;
    if !started.existing {
        ws.metrics.processes.started.inc();
    }
    Ok(started)
}

pub async fn list(ws: &Workspace<'_>) -> Result<ProcessList, ProcessError> {
    let list: ProcList = call(ws, ProcRequest::List, None).await?.parse()?;
    let running = list.processes.iter().filter(|p| p.running).count();
    ws.metrics.processes.observe(ws.id, Some(running as u64));
    Ok(ProcessList {
        processes: list.processes.into_iter().map(process_info).collect(),
    })
}

/// A listed process as the API shows it.
fn process_info(p: ProcInfo) -> ProcessInfo {
    ProcessInfo {
        process_id: p.process_id,
        command: p.command,
        pid: p.pid,
        tag: p.tag,
        pty: p.pty,
        running: p.running,
        exit_code: p.exit_code,
        duration_ms: p.usage.duration_ms,
        cpu_ms: p.usage.cpu_ms,
        max_rss_bytes: p.usage.max_rss_bytes,
    }
}

pub async fn poll(
    ws: &Workspace<'_>,
    pid: &str,
    offset: u64,
    wait: f64,
) -> Result<ProcessOutput, ProcessError> {
    process_id(pid)?;
    if !wait.is_finite() || wait < 0.0 {
        return Err(ProcessError::InvalidWait);
    }
    let settings = &ws.config.sessions;
    let wait = Duration::from_secs_f64(wait.min(3600.0)).min(settings.process_wait_max);
    let request = ProcRequest::Poll {
        process_id: pid.to_string(),
        offset,
        wait_ms: wait.as_millis() as u64,
        max_bytes: settings.process_output_bytes,
    };
    let answer = call(ws, request, None).await?;
    let info: PollInfo = answer.parse()?;
    let running = info.running;
    let from = info.offset;
    let mut bytes: &[u8] = &answer.output;
    // A character cut at the end comes whole with the next poll; once the process ended and
    // this answer holds the rest of the buffer, the bytes are what they are.
    let more_to_come = running || bytes.len() as u64 >= settings.process_output_bytes;
    let cut = incomplete_tail(bytes);
    if cut > 0 && more_to_come {
        bytes = &bytes[..bytes.len() - cut];
    }
    Ok(ProcessOutput {
        process_id: pid.to_string(),
        running,
        exit_code: info.exit_code,
        output: String::from_utf8_lossy(bytes).into_owned(),
        offset: from,
        next_offset: from + bytes.len() as u64,
        truncated: info.truncated,
        duration_ms: info.usage.duration_ms,
        cpu_ms: info.usage.cpu_ms,
        max_rss_bytes: info.usage.max_rss_bytes,
    })
}

/// A poll's raw bytes (a terminal's output is not cut at characters: the terminal decodes it),
/// with what the supervisor said of the process.
pub async fn poll_bytes(
    ws: &Workspace<'_>,
    pid: &str,
    offset: u64,
    wait: Duration,
) -> Result<(PollInfo, Bytes), ProcessError> {
    process_id(pid)?;
    let request = ProcRequest::Poll {
        process_id: pid.to_string(),
        offset,
        wait_ms: wait.as_millis() as u64,
        max_bytes: ws.config.sessions.process_output_bytes,
    };
    let answer = call(ws, request, None).await?;
    let info: PollInfo = answer.parse()?;
    Ok((info, answer.output))
}

/// Whether process `pid` exists and was started in a terminal.
pub async fn has_terminal(ws: &Workspace<'_>, pid: &str) -> Result<bool, ProcessError> {
    process_id(pid)?;
    let list: ProcList = call(ws, ProcRequest::List, None).await?.parse()?;
    match list.processes.iter().find(|p| p.process_id == pid) {
        Some(p) => Ok(p.pty),
        None => Err(ProcessError::NoSuchProcess),
    }
}

pub async fn stdin(
    ws: &Workspace<'_>,
    pid: &str,
    body: Bytes,
    eof: bool,
) -> Result<(), ProcessError> {
    process_id(pid)?;
    if body.len() > MAX_STDIN_BYTES {
        return Err(ProcessError::StdinTooLarge);
    }
    let request = ProcRequest::Stdin {
        process_id: pid.to_string(),
        eof,
    };
    call(ws, request, Some(body)).await.map(|_| ())
}

fn terminal_size(t: TerminalSize) -> Result<PtySize, ProcessError> {
    let ok = |n: u16| (1..=1000).contains(&n);
    if ok(t.cols) && ok(t.rows) {
        Ok(PtySize {
            cols: t.cols,
            rows: t.rows,
        })
    } else {
        Err(ProcessError::InvalidTerminalSize)
    }
}

/// Resizes the terminal of a process started in one; one without a terminal, or that ended,
/// is a conflict.
pub async fn resize(ws: &Workspace<'_>, pid: &str, size: TerminalSize) -> Result<(), ProcessError> {
    process_id(pid)?;
    let request = ProcRequest::Resize {
        process_id: pid.to_string(),
        size: terminal_size(size)?,
    };
    call(ws, request, None).await.map(|_| ())
}

/// Sends `signal` to the process's group; one that ended is a conflict.
pub async fn signal(
    ws: &Workspace<'_>,
    pid: &str,
    signal: ProcessSignal,
) -> Result<(), ProcessError> {
    process_id(pid)?;
    let request = ProcRequest::Signal {
        process_id: pid.to_string(),
        signal: signal.name().to_string(),
    };
    call(ws, request, None).await.map(|_| ())
}

/// One round of a process's events, as the API shows them.
#[derive(Debug)]
pub struct EventBatch {
    pub events: Vec<ProcessEvent>,
    /// The last event's `end`.
    pub ended: bool,
}

/// The events after `after` (every kept one without it), waiting up to `wait` while there is
/// none newer and the process runs. Events that left the buffer: [`HelperError::ProcessGone`].
pub async fn events(
    ws: &Workspace<'_>,
    pid: &str,
    after: Option<u64>,
    wait: Duration,
) -> Result<EventBatch, ProcessError> {
    process_id(pid)?;
    let request = ProcRequest::Events {
        process_id: pid.to_string(),
        after,
        wait_ms: wait.as_millis() as u64,
        max_bytes: EVENTS_MAX_BYTES,
    };
    let answer = call(ws, request, None).await?;
    let got: ProcEvents = answer.parse()?;
    let mut data: &[u8] = &answer.output;
    let mut events = Vec::with_capacity(got.events.len());
    let mut ended = false;
    for e in got.events {
        let event = match e {
            ProcEvent::Start { seq, pid } => ProcessEvent {
                pid: Some(pid),
                ..ProcessEvent::new(seq, ProcessEventType::Start)
            },
            ProcEvent::Stdout { seq, len } | ProcEvent::Stderr { seq, len } => {
                let kind = if matches!(e, ProcEvent::Stderr { .. }) {
                    ProcessEventType::Stderr
                } else {
                    ProcessEventType::Stdout
                };
                let Some((chunk, rest)) = data.split_at_checked(len as usize) else {
                    return Err(HelperError::UnexpectedAnswer.into());
                };
                data = rest;
                ProcessEvent {
                    data: Some(String::from_utf8_lossy(chunk).into_owned()),
                    ..ProcessEvent::new(seq, kind)
                }
            }
            ProcEvent::End {
                seq,
                exit_code,
                signal,
                usage,
            } => {
                ended = true;
                ProcessEvent {
                    exit_code: Some(exit_code),
                    signal,
                    duration_ms: usage.duration_ms,
                    cpu_ms: usage.cpu_ms,
                    max_rss_bytes: usage.max_rss_bytes,
                    ..ProcessEvent::new(seq, ProcessEventType::End)
                }
            }
        };
        events.push(event);
    }
    Ok(EventBatch { events, ended })
}

/// How much longer than its wait a round of followed events may take before the session is
/// checked again (see [`follow_events`]).
pub(crate) const ROUND_GRACE: Duration = Duration::from_secs(5);

/// The rest of an event stream after its `first` round: with `follow`, rounds until `end`, a
/// keepalive after each `keepalive` without an event; the stream closes when the client goes, or
/// when the events can no longer be followed (the session went away, events left the buffer
/// between two rounds: a resume from the last `seq` says which with its status).
pub fn follow_events(
    sessions: Arc<Sessions>,
    id: SessionId,
    pid: String,
    first: EventBatch,
    after: Option<u64>,
    follow: bool,
    keepalive: Duration,
) -> mpsc::Receiver<ProcessEvent> {
    let (tx, rx) = mpsc::channel::<ProcessEvent>(16);
    // A caller that keeps paused sessions paused (E2B's envd) does so while it follows too.
    let keep_paused = crate::sessions::keeping_paused();
    tokio::spawn(crate::sessions::keep_paused_if(keep_paused, async move {
        let mut last = first.events.last().map(|e| e.seq).or(after).unwrap_or(0);
        let mut ended = first.ended;
        for e in first.events {
            if tx.send(e).await.is_err() {
                return;
            }
        }
        // The session was found running by the first round's operation: the next rounds trust
        // it (no inspect each) while they answer in time. One that does not (the session was
        // paused under it, its helper frozen) is dropped, and the next checks the session
        // first: thawing it, or ending the stream for a door that keeps it paused.
        let mut trusted = true;
        while follow && !ended {
            let ws = if trusted {
                sessions.workspace(&id).checked()
            } else {
                sessions.workspace(&id)
            };
            let round = tokio::select! {
                _ = tx.closed() => return,
                r = tokio::time::timeout(keepalive + ROUND_GRACE, events(&ws, &pid, Some(last), keepalive)) => r,
            };
            let Ok(round) = round else {
                trusted = false;
                continue;
            };
            trusted = true;
            let Ok(batch) = round else { return };
            ended = batch.ended;
            if batch.events.is_empty() {
                let alive = ProcessEvent::new(last, ProcessEventType::Keepalive);
                if tx.send(alive).await.is_err() {
                    return;
                }
            }
            for e in batch.events {
                last = e.seq;
                if tx.send(e).await.is_err() {
                    return;
                }
            }
        }
    }));
    rx
}

pub async fn kill(ws: &Workspace<'_>, pid: &str) -> Result<(), ProcessError> {
    process_id(pid)?;
    let request = ProcRequest::Kill {
        process_id: pid.to_string(),
    };
    call(ws, request, None).await?;
    ws.metrics.processes.killed.inc();
    Ok(())
}

/// A streaming run's lines as they come, ending with its results or the helper's failure
/// (which a door renders through [`crate::error::ApiError`]).
pub type RunLines = mpsc::Receiver<Result<Line, HelperError>>;

/// A streaming run: its lines as the commands print and end, heartbeats in silences, `done`
/// with the plain response's results last, or the failure that ended it (which the route words
/// as its `error` line), a heartbeat after each `heartbeat` of silence. `held` (the session
/// lock and the operation's slot) is kept until the batch ends; a client that goes away drops
/// the receiver, which cancels the batch.
pub fn stream_run(
    sessions: Arc<Sessions>,
    id: SessionId,
    spec: crate::runtime::RunSpec,
    held: impl Send + 'static,
    heartbeat: Duration,
) -> RunLines {
    let (out_tx, out_rx) = mpsc::channel::<Result<Line, HelperError>>(32);
    tokio::spawn(async move {
        let _held = held;
        let (ev_tx, mut ev_rx) = mpsc::channel::<RunEvent>(64);
        let mut run = Box::pin(sessions.run_streaming(&id, &spec, ev_tx));
        // The running command's index, and what is held back of its stdout and stderr.
        let mut carry: Option<(usize, [Utf8Carry; 2])> = None;
        let mut finished = None;
        loop {
            let next = tokio::select! {
                biased;
                _ = out_tx.closed() => return, // the client left: dropping `run` cancels it
                ev = ev_rx.recv() => match ev {
                    Some(RunEvent::Output { index, data, stderr }) => {
                        let c = match &mut carry {
                            Some((i, c)) if *i == index => c,
                            _ => &mut carry.insert((index, [Utf8Carry::default(), Utf8Carry::default()])).1,
                        };
                        let text = c[usize::from(stderr)].push(&data);
                        if text.is_empty() { continue; }
                        Some(Line::Output { index, data: text, stream: stream_of(stderr) })
                    }
                    Some(RunEvent::Result { index, result }) => {
                        if let Some((i, mut c)) = carry.take() {
                            for (k, c) in c.iter_mut().enumerate() {
                                let rest = c.finish();
                                let line = Line::Output { index, data: rest, stream: stream_of(k == 1) };
                                if i == index && matches!(&line, Line::Output { data, .. } if !data.is_empty())
                                    && out_tx.send(Ok(line)).await.is_err() {
                                    return;
                                }
                            }
                        }
                        Some(Line::Result {
                            index,
                            command: result.command,
                            exit_code: result.exit_code,
                            workdir: result.workdir,
                        })
                    }
                    None => {
                        // The run ended: every event is in; its result is the last line.
                        let r = match finished.take() { Some(r) => r, None => (&mut run).await };
                        let last = r.map(|results| Line::Done { results });
                        let _ = out_tx.send(last).await;
                        return;
                    }
                },
                r = &mut run, if finished.is_none() => { finished = Some(r); continue; }
                _ = tokio::time::sleep(heartbeat) => Some(Line::Heartbeat),
            };
            if let Some(l) = next
                && out_tx.send(Ok(l)).await.is_err()
            {
                return;
            }
        }
    });
    out_rx
}

fn stream_of(stderr: bool) -> OutputStream {
    if stderr {
        OutputStream::Stderr
    } else {
        OutputStream::Stdout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_character_split_across_chunks_comes_out_whole() {
        let text = "héllo 🦀 wörld";
        let bytes = text.as_bytes();
        for split in 0..=bytes.len() {
            let mut c = Utf8Carry::default();
            let mut out = c.push(&bytes[..split]);
            out.push_str(&c.push(&bytes[split..]));
            out.push_str(&c.finish());
            assert_eq!(out, text, "split at {split}");
        }
    }

    #[test]
    fn invalid_bytes_are_replaced_not_held() {
        let mut c = Utf8Carry::default();
        assert_eq!(c.push(b"a\xffb"), "a\u{fffd}b");
        assert_eq!(c.push(b"\xe2\x82"), "");
        assert_eq!(c.finish(), "\u{fffd}");
    }

    #[test]
    fn workdirs_are_absolute_paths_without_dot_dot() {
        assert_eq!(workdir(None).expect("default"), "/workspace/repo");
        assert!(workdir(Some("/workspace/tmp")).is_ok());
        assert_eq!(workdir(Some("/srv//app/")).expect("any path"), "/srv/app");
        for bad in ["/workspace/../etc", "relative", "/a\0b", "/a\nb", ""] {
            assert!(workdir(Some(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn environment_names_are_checked() {
        let ok: BTreeMap<String, String> = [("A_1".to_string(), "x".to_string())].into();
        assert_eq!(
            environment(&Some(ok)).expect("valid"),
            vec![("A_1".into(), "x".into())]
        );
        // A session's rule: any name without `=` or NUL (a shell cannot name `1A` or `a.b`, a
        // program can read them).
        let odd: BTreeMap<String, String> =
            [("1A".into(), "x".into()), ("a.b".into(), "y".into())].into();
        assert_eq!(environment(&Some(odd)).expect("valid").len(), 2);
        for (k, v) in [("A=B", "x"), ("", "x"), ("A\0", "x"), ("A", "x\0y")] {
            let bad: BTreeMap<String, String> = [(k.to_string(), v.to_string())].into();
            assert!(environment(&Some(bad)).is_err(), "{k:?}={v:?}");
        }
    }
}
