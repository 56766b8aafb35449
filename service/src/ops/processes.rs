//! The background processes' operations (see [`crate::processes`]): none waits for a running
//! command of the session, so none takes its lock.

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::{Access, Admit, Op, Reached};
use crate::api::{
    ProcessEvent, ProcessInfo, ProcessList, ProcessOutput, ProcessSignal, StartProcessRequest,
    StartProcessResponse, TerminalSize,
};
use crate::error::ApiError;
use crate::processes;

/// Which process an operation is on: the id the service gave it, or (E2B's selectors) its pid
/// in the sandbox or its tag, a running one first (pids are reused), the oldest of a tag's.
#[derive(Debug, Clone)]
pub enum Target {
    Id(String),
    Pid(u32),
    Tag(String),
}

impl Target {
    /// The process's id: one listing of the session for a pid or a tag.
    async fn resolve(&self, at: &Reached) -> Result<String, ApiError> {
        match self {
            Target::Id(id) => Ok(id.clone()),
            other => Ok(other.find(&at.workspace()).await?.process_id),
        }
    }

    async fn find(&self, ws: &crate::sessions::Workspace<'_>) -> Result<ProcessInfo, ApiError> {
        let all = processes::list(ws).await?.processes;
        let mut matching: Vec<ProcessInfo> = all
            .into_iter()
            .filter(|p| match self {
                Target::Id(id) => &p.process_id == id,
                Target::Pid(pid) => p.pid == Some(*pid),
                Target::Tag(tag) => p.tag.as_deref() == Some(tag.as_str()),
            })
            .collect();
        // The listing's order (oldest first), the running ones before the ended.
        matching.sort_by_key(|p| !p.running);
        matching.into_iter().next().ok_or_else(|| {
            ApiError::NotFoundDetail(match self {
                Target::Id(id) => format!("process {id} not found"),
                Target::Pid(pid) => format!("process with pid {pid} not found"),
                Target::Tag(tag) => format!("process with tag {tag:?} not found"),
            })
        })
    }
}

/// Starts a process; `existing` when the request named one the session already has.
pub struct Start(pub StartProcessRequest);

impl Op for Start {
    type Output = StartProcessResponse;
    const ADMIT: Admit = Admit::Free;
    const ACCESS: Access = Access::Beside;

    async fn apply(self, at: Reached) -> Result<StartProcessResponse, ApiError> {
        let started = processes::start(&at.workspace(), &self.0).await?;
        Ok(StartProcessResponse {
            process_id: started.process_id,
            existing: started.existing,
        })
    }
}

/// Starts a process and follows its events from the first (E2B's `Start`): one operation, so
/// one check of the session. `default_workdir` is tried when the request names none, and left
/// to the service's default when the sandbox refuses it (an image without that directory).
/// Without `keep_stdin` the process reads an empty stdin.
pub struct StartFollowed {
    pub req: StartProcessRequest,
    pub default_workdir: Option<String>,
    pub keep_stdin: bool,
}

/// A started process and its events.
pub struct Followed {
    pub started: StartProcessResponse,
    pub events: mpsc::Receiver<ProcessEvent>,
}

impl Op for StartFollowed {
    type Output = Followed;
    const ADMIT: Admit = Admit::Free;
    const ACCESS: Access = Access::Beside;

    async fn apply(self, at: Reached) -> Result<Followed, ApiError> {
        let ws = at.workspace();
        let mut req = self.req;
        let started = match (&req.workdir, self.default_workdir) {
            (None, Some(default)) => {
                let with = StartProcessRequest {
                    workdir: Some(default),
                    ..req.clone()
                };
                match processes::start(&ws, &with).await.map_err(ApiError::from) {
                    Err(ApiError::Unprocessable(_)) => {
                        req.workdir = None;
                        processes::start(&ws, &req).await?
                    }
                    other => other?,
                }
            }
            _ => processes::start(&ws, &req).await?,
        };
        let pid = started.process_id;
        // A process that already ended has no stdin left to close (409): nothing to do.
        if !self.keep_stdin
            && req.pty.is_none()
            && let Err(e) = processes::stdin(&ws, &pid, Bytes::new(), true).await
        {
            match ApiError::from(e) {
                ApiError::Conflict(_) => {}
                e => return Err(e),
            }
        }
        let events = follow(&at, &pid, None, true).await?;
        Ok(Followed {
            started: StartProcessResponse {
                process_id: pid,
                existing: started.existing,
            },
            events,
        })
    }
}

/// The events of a process after `after` (every kept one without it), following until its
/// `end` with `follow`, keepalives in silences. The first round answers before this returns:
/// a missing process, or events that left its buffer, are the operation's error.
async fn follow(
    at: &Reached,
    pid: &str,
    after: Option<u64>,
    follow: bool,
) -> Result<mpsc::Receiver<ProcessEvent>, ApiError> {
    let first = processes::events(&at.workspace(), pid, after, std::time::Duration::ZERO).await?;
    let keepalive = at.workspace().config.sessions.stream_heartbeat;
    Ok(processes::follow_events(
        at.sessions.clone(),
        at.id.clone(),
        pid.to_string(),
        first,
        after,
        follow,
        keepalive,
    ))
}

/// A process's events (see [`follow`]).
pub struct Events {
    pub target: Target,
    pub after: Option<u64>,
    pub follow: bool,
}

/// A followed process: its listing entry, and its events.
pub struct Watched {
    pub process: ProcessInfo,
    pub events: mpsc::Receiver<ProcessEvent>,
}

impl Op for Events {
    type Output = Watched;
    const ADMIT: Admit = Admit::Free;
    const ACCESS: Access = Access::Beside;

    async fn apply(self, at: Reached) -> Result<Watched, ApiError> {
        let process = match &self.target {
            // The id alone: the events say the rest (no listing on the native route).
            Target::Id(id) => ProcessInfo {
                process_id: id.clone(),
                command: String::new(),
                pid: None,
                tag: None,
                pty: false,
                running: true,
                exit_code: None,
                duration_ms: None,
                cpu_ms: None,
                max_rss_bytes: None,
            },
            other => other.find(&at.workspace()).await?,
        };
        let events = follow(&at, &process.process_id, self.after, self.follow).await?;
        Ok(Watched { process, events })
    }
}

/// The process a target names, from the session's listing.
pub struct Find(pub Target);

impl Op for Find {
    type Output = ProcessInfo;
    const ADMIT: Admit = Admit::Free;
    const ACCESS: Access = Access::Beside;

    async fn apply(self, at: Reached) -> Result<ProcessInfo, ApiError> {
        self.0.find(&at.workspace()).await
    }
}

/// The session's processes, running and recently ended, oldest first.
pub struct List;

impl Op for List {
    type Output = ProcessList;
    const ADMIT: Admit = Admit::Free;
    const ACCESS: Access = Access::Beside;

    async fn apply(self, at: Reached) -> Result<ProcessList, ApiError> {
        Ok(processes::list(&at.workspace()).await?)
    }
}

/// A process's state and output from `offset`, waiting up to `wait` seconds for more.
pub struct Poll {
    pub target: Target,
    pub offset: u64,
    pub wait: f64,
}

impl Op for Poll {
    type Output = ProcessOutput;
    const ADMIT: Admit = Admit::Free;
    const ACCESS: Access = Access::Beside;

    async fn apply(self, at: Reached) -> Result<ProcessOutput, ApiError> {
        let pid = self.target.resolve(&at).await?;
        Ok(processes::poll(&at.workspace(), &pid, self.offset, self.wait).await?)
    }
}

/// Writes to a process's stdin, closing it afterwards with `eof`.
pub struct Stdin {
    pub target: Target,
    pub bytes: Bytes,
    pub eof: bool,
}

impl Op for Stdin {
    type Output = ();
    const ADMIT: Admit = Admit::Free;
    const ACCESS: Access = Access::Beside;

    async fn apply(self, at: Reached) -> Result<(), ApiError> {
        let pid = self.target.resolve(&at).await?;
        Ok(processes::stdin(&at.workspace(), &pid, self.bytes, self.eof).await?)
    }
}

/// Sends a signal to a process's group; one that ended is a conflict.
pub struct Signal {
    pub target: Target,
    pub signal: ProcessSignal,
}

impl Op for Signal {
    type Output = ();
    const ADMIT: Admit = Admit::Free;
    const ACCESS: Access = Access::Beside;

    async fn apply(self, at: Reached) -> Result<(), ApiError> {
        let pid = self.target.resolve(&at).await?;
        Ok(processes::signal(&at.workspace(), &pid, self.signal).await?)
    }
}

/// Resizes the terminal of a process started in one.
pub struct Resize {
    pub target: Target,
    pub size: TerminalSize,
}

impl Op for Resize {
    type Output = ();
    const ADMIT: Admit = Admit::Free;
    const ACCESS: Access = Access::Beside;

    async fn apply(self, at: Reached) -> Result<(), ApiError> {
        let pid = self.target.resolve(&at).await?;
        Ok(processes::resize(&at.workspace(), &pid, self.size).await?)
    }
}

/// Kills a process's group.
pub struct Kill {
    pub target: Target,
}

impl Op for Kill {
    type Output = ();
    const ADMIT: Admit = Admit::Free;
    const ACCESS: Access = Access::Beside;

    async fn apply(self, at: Reached) -> Result<(), ApiError> {
        let pid = self.target.resolve(&at).await?;
        Ok(processes::kill(&at.workspace(), &pid).await?)
    }
}

/// Opens the terminal of a process started with `pty` (see [`Terminal`]): 409 for a process
/// that has none. `since` is the byte offset its output is read from (a reconnect passes what it
/// has seen); without it, from now on.
pub struct OpenTerminal {
    pub process_id: String,
    pub since: Option<u64>,
}

impl Op for OpenTerminal {
    type Output = Terminal;
    const ADMIT: Admit = Admit::Free;
    const ACCESS: Access = Access::Beside;

    async fn apply(self, at: Reached) -> Result<Terminal, ApiError> {
        let ws = at.workspace();
        if !processes::has_terminal(&ws, &self.process_id).await? {
            return Err(ApiError::Conflict(
                "the process was not started in a terminal (start it with \"pty\")".into(),
            ));
        }
        let offset = match self.since {
            Some(n) => n,
            None => {
                let now = Duration::ZERO;
                processes::poll_bytes(&ws, &self.process_id, u64::MAX, now)
                    .await?
                    .0
                    .next_offset
            }
        };
        let wait = ws.config.sessions.stream_heartbeat;
        Ok(Terminal {
            sessions: at.sessions.clone(),
            id: at.id.clone(),
            pid: self.process_id,
            offset,
            wait,
            trusted: true,
        })
    }
}

/// An open terminal: its output read as it comes, keystrokes typed in. Held by a door for as
/// long as its client stays (a WebSocket), so each read is not an operation of its own: the
/// session was found running when it opened, and the reads trust that while they answer in
/// time (as a followed process's events do); one that does not (the session was paused under
/// it) makes the next read check the session first.
pub struct Terminal {
    sessions: std::sync::Arc<crate::sessions::Sessions>,
    id: crate::ids::SessionId,
    pid: String,
    offset: u64,
    wait: Duration,
    trusted: bool,
}

/// What a read of a [`Terminal`] found.
pub enum TerminalOutput {
    /// Output (none when the wait passed without any).
    Bytes(Bytes),
    /// The process ended and every byte of its output was read.
    Ended,
}

impl Terminal {
    fn workspace(&self) -> crate::sessions::Workspace<'_> {
        let ws = self.sessions.workspace(&self.id);
        if self.trusted { ws.checked() } else { ws }
    }

    /// Types `input` into the terminal, the session checked first as for any request (a paused
    /// one is thawed): a keystroke into a frozen helper would wait for no one.
    pub async fn type_in(&self, input: Bytes) -> Result<(), ApiError> {
        let ws = self.sessions.workspace(&self.id);
        Ok(processes::stdin(&ws, &self.pid, input, false).await?)
    }

    /// The terminal's next output, waiting up to the stream heartbeat for some.
    pub async fn read(&mut self) -> Result<TerminalOutput, ApiError> {
        let polled = {
            let ws = self.workspace();
            let round = processes::poll_bytes(&ws, &self.pid, self.offset, self.wait);
            tokio::time::timeout(self.wait + processes::ROUND_GRACE, round).await
        };
        let Ok(polled) = polled else {
            self.trusted = false;
            return Ok(TerminalOutput::Bytes(Bytes::new()));
        };
        self.trusted = true;
        let (info, bytes) = polled?;
        self.offset = info.offset + bytes.len() as u64;
        if bytes.is_empty() && !info.running {
            return Ok(TerminalOutput::Ended);
        }
        Ok(TerminalOutput::Bytes(bytes))
    }
}
