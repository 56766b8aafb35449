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
use sandbox_protocol::message::{PollInfo, ProcInfo, ProcList, ProcRequest, ProcStarted};

use crate::api::{ProcessInfo, ProcessList, ProcessOutput, StartProcessRequest};
use crate::layout::{self, WORKSPACE};
use crate::runtime::HelperError;
use crate::sessions::{SessionError, SessionId, Sessions, Workspace};

/// Most bytes one stdin request may carry (the helper enforces the same bound).
pub const MAX_STDIN_BYTES: usize = 1024 * 1024;

/// Why a process request was not done. The texts are what a client is told; the HTTP status
/// of each is decided in [`crate::error`].
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("workdir must be {} or a directory below it, without '..'", WORKSPACE)]
    InvalidWorkdir,
    /// The offending name.
    #[error(
        "environment: {0:?} is not a variable name (letters, digits, '_'; not starting with a digit)"
    )]
    InvalidVariableName(String),
    /// The variable whose value has a NUL.
    #[error("environment: the value of {0} contains a NUL byte")]
    NulInVariable(String),
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

/// Length of an incomplete (but so far valid) UTF-8 sequence at the end of `b`, 0..=3: what
/// the decoder reports as an unexpected end (`error_len() == None`), past any invalid bytes
/// before it.
pub fn incomplete_tail(b: &[u8]) -> usize {
    let mut rest = b;
    loop {
        match std::str::from_utf8(rest) {
            Ok(_) => return 0,
            Err(e) => match e.error_len() {
                None => return rest.len() - e.valid_up_to(),
                Some(bad) => rest = &rest[e.valid_up_to() + bad..],
            },
        }
    }
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// A process's working directory: `/workspace` or below it, absolute, no `..`.
fn workdir(raw: Option<&str>) -> Result<String, ProcessError> {
    let Some(raw) = raw else {
        return Ok(layout::REPO.to_string());
    };
    let ok = (raw == WORKSPACE
        || raw
            .strip_prefix(WORKSPACE)
            .is_some_and(|r| r.starts_with('/')))
        && !raw.split('/').any(|c| c == "..")
        && !raw.contains('\0');
    if ok {
        Ok(raw.to_string())
    } else {
        Err(ProcessError::InvalidWorkdir)
    }
}

fn environment(
    env: &Option<BTreeMap<String, String>>,
) -> Result<Vec<(String, String)>, ProcessError> {
    let Some(env) = env else {
        return Ok(Vec::new());
    };
    env.iter()
        .map(|(k, v)| {
            if !valid_name(k) {
                return Err(ProcessError::InvalidVariableName(k.clone()));
            }
            if v.contains('\0') {
                return Err(ProcessError::NulInVariable(k.clone()));
            }
            Ok((k.clone(), v.clone()))
        })
        .collect()
}

fn process_id(raw: &str) -> Result<(), ProcessError> {
    // Ids are the supervisor's (`p<n>-<hex>`); anything else cannot exist.
    if raw.is_empty()
        || raw.len() > 64
        || !raw.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
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

pub async fn start(ws: &Workspace<'_>, req: &StartProcessRequest) -> Result<String, ProcessError> {
    if req.command.trim().is_empty() {
        return Err(ProcessError::EmptyCommand);
    }
    if req.command.contains('\0') {
        return Err(ProcessError::NulInCommand);
    }
    let request = ProcRequest::Start {
        command: req.command.clone(),
        workdir: workdir(req.workdir.as_deref())?,
        env: environment(&req.environment)?,
        max_live: ws.config.sessions.max_processes,
        buffer_bytes: ws.config.sessions.process_output_bytes,
    };
    let started: ProcStarted = call(ws, request, None).await?.parse()?;
    ws.metrics.processes_started.inc();
    Ok(started.process_id)
}

pub async fn list(ws: &Workspace<'_>) -> Result<ProcessList, ProcessError> {
    let list: ProcList = call(ws, ProcRequest::List, None).await?.parse()?;
    let running = list.processes.iter().filter(|p| p.running).count();
    ws.metrics.observe_processes(ws.id, Some(running as u64));
    Ok(ProcessList {
        processes: list.processes.into_iter().map(process_info).collect(),
    })
}

/// A listed process as the API shows it.
fn process_info(p: ProcInfo) -> ProcessInfo {
    ProcessInfo {
        process_id: p.process_id,
        command: p.command,
        running: p.running,
        exit_code: p.exit_code,
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
    })
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

pub async fn kill(ws: &Workspace<'_>, pid: &str) -> Result<(), ProcessError> {
    process_id(pid)?;
    let request = ProcRequest::Kill {
        process_id: pid.to_string(),
    };
    call(ws, request, None).await?;
    ws.metrics.processes_killed.inc();
    Ok(())
}

/// A streaming run: its lines as the commands print and end, heartbeats in silences, `done`
/// with the plain response's results last, or the failure that ended it (which the route words
/// as its `error` line), a heartbeat after each `heartbeat` of silence. `held` (the session
/// lock) is kept until the batch ends; a client that goes away drops the receiver, which cancels
/// the batch.
pub fn stream_run(
    sessions: Arc<Sessions>,
    id: SessionId,
    spec: crate::runtime::RunSpec,
    held: crate::coordination::lock::LockGuard,
    heartbeat: Duration,
) -> mpsc::Receiver<Result<Line, HelperError>> {
    let (out_tx, out_rx) = mpsc::channel::<Result<Line, HelperError>>(32);
    tokio::spawn(async move {
        let _held = held;
        let (ev_tx, mut ev_rx) = mpsc::channel::<RunEvent>(64);
        let mut run = Box::pin(sessions.run_streaming(&id, &spec, ev_tx));
        let mut carry: Option<(usize, Utf8Carry)> = None;
        let mut finished = None;
        loop {
            let next = tokio::select! {
                biased;
                _ = out_tx.closed() => return, // the client left: dropping `run` cancels it
                ev = ev_rx.recv() => match ev {
                    Some(RunEvent::Output { index, data }) => {
                        let c = match &mut carry {
                            Some((i, c)) if *i == index => c,
                            _ => &mut carry.insert((index, Utf8Carry::default())).1,
                        };
                        let text = c.push(&data);
                        if text.is_empty() { continue; }
                        Some(Line::Output { index, data: text })
                    }
                    Some(RunEvent::Result { index, result }) => {
                        if let Some((i, mut c)) = carry.take() {
                            let rest = c.finish();
                            if i == index && !rest.is_empty()
                                && out_tx.send(Ok(Line::Output { index, data: rest })).await.is_err() {
                                return;
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
    fn incomplete_tails_are_measured() {
        assert_eq!(incomplete_tail(b"abc"), 0);
        assert_eq!(incomplete_tail("é".as_bytes()), 0);
        assert_eq!(incomplete_tail(&"é".as_bytes()[..1]), 1);
        assert_eq!(incomplete_tail(&"🦀".as_bytes()[..3]), 3);
        assert_eq!(incomplete_tail(b"\x80\x80\x80"), 0);
    }

    #[test]
    fn workdirs_stay_in_the_workspace() {
        assert_eq!(workdir(None).expect("default"), "/workspace/repo");
        assert!(workdir(Some("/workspace/tmp")).is_ok());
        assert!(workdir(Some("/etc")).is_err());
        assert!(workdir(Some("/workspace/../etc")).is_err());
        assert!(workdir(Some("/workspacex")).is_err());
    }

    #[test]
    fn environment_names_are_checked() {
        let ok: BTreeMap<String, String> = [("A_1".to_string(), "x".to_string())].into();
        assert_eq!(
            environment(&Some(ok)).expect("valid"),
            vec![("A_1".into(), "x".into())]
        );
        let bad: BTreeMap<String, String> = [("1A".to_string(), "x".to_string())].into();
        assert!(environment(&Some(bad)).is_err());
    }
}
