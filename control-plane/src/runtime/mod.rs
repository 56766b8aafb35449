//! The session runtime: how commands, fs ops and seed extraction reach a session's files.
//!
//! Handlers and session logic see [`SessionRuntime`] only. Its implementation, [`HelperRuntime`],
//! talks to `daiv-sandbox-helper` inside the container (the `sandbox-helper` crate) in the
//! typed protocol both share (the `sandbox-protocol` crate), over one long-lived attached exec
//! per session and replica ([`channel`]): no Docker round trip per operation, and every
//! operation runs as the sandbox user, so permissions are the kernel's and nothing running as
//! root acts on a path the sandbox can change. [`ContainerEngine`] keeps container and network
//! lifecycle only.
//!
//! Channels open lazily on first use and again after the helper or its container went away;
//! a request that never reached a helper is retried once on a fresh channel, and a read-only
//! one also when the helper died under it. Anything else answers 503 (retryable): never a
//! wrong answer.
//!
//! [`helper_binary`] (in `helper_bin`) finds the static helper binary the sandboxes are given;
//! [`HelperError`] (in `error`) says why an operation through the helper did not complete;
//! [`ServiceFile`] (in `writer`) is how a file the service owns (root's or the gateway user's)
//! gets into a container, through the helper's `write-file` where it can.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use sandbox_protocol::frame::{MAX_DATA_CHUNK, MAX_PAYLOAD};
use sandbox_protocol::message::{
    ErrorKind, Event, ExtractStats, ProcRequest, Request, Response, ResponseError, SeededInfo,
};
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use tokio::sync::mpsc;

use crate::api::RunResult;
use crate::engine::{
    ContainerEngine, EngineError, ExecSpec, HELPER_USER_LABEL, SANDBOX_USER_LABEL,
};
pub mod channel;
mod error;
mod helper_bin;
mod writer;

use channel::{Caps, Channel, ChannelError, Incoming, RequestHandle, Violation};
pub use error::HelperError;
pub use helper_bin::helper_binary;
pub use writer::{ServiceFile, Writer, Written};

/// Exit code reported for a command whose helper vanished under it (it was killed, or the
/// container stopped): the command's fate is unknown.
pub const LOST_EXIT_CODE: i64 = -1;
/// Server-side deadline of one fs op; the helper stops the op (and its walk) past it.
pub const FS_DEADLINE: Duration = Duration::from_secs(30);
/// How long past its own deadline (or its wait) an answer may take before the call gives up:
/// a helper that does not answer costs a request this much, never more.
const ANSWER_GRACE: Duration = Duration::from_secs(10);
/// How long the engine may take to answer whether it is still there, when a helper's channel
/// was lost mid-command (a hung engine is as good as a dead one).
const ENGINE_CHECK: Duration = Duration::from_secs(3);
/// Longest a process request (but a poll's wait) or a `seeded` check may take.
const SHORT_CALL: Duration = Duration::from_secs(20);
/// Longest an emptying of a failed seed's destination may take.
const CLEAR_DEADLINE: Duration = Duration::from_secs(120);
/// Longest a seed's extraction may go without taking a chunk or, at the end, answering.
const EXTRACT_STALL: Duration = Duration::from_secs(60);
/// After a helper broke the protocol, how long its session gets 503s before a channel is
/// opened again (a flooding helper costs one open per period).
const QUIET_AFTER_VIOLATION: Duration = Duration::from_secs(30);
/// Largest `read` answer: 512,000 bytes of content, even escaped character by character.
const READ_ANSWER_MAX: usize = 4 * 1024 * 1024;

/// A request's commands, as the run route received them.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub commands: Vec<String>,
    pub fail_fast: bool,
    pub timeout: Option<Duration>,
    pub output_cap: usize,
    /// Output bytes kept for the whole request: a batch of many commands costs at most this.
    pub run_output_cap: usize,
    pub workdir: String,
    pub env: Vec<(String, String)>,
}

/// What a streaming run reports while it works (see [`SessionRuntime::run_streaming`]).
#[derive(Debug)]
pub enum RunEvent {
    /// Output of command `index`, as the helper forwarded it (within the output cap).
    Output { index: usize, data: Bytes },
    /// Command `index` ended; `result` is its entry of the final results.
    Result { index: usize, result: RunResult },
}

/// A helper's answer: its `ok` value, still JSON until the caller parses it into the op's own
/// type ([`Answer::parse`], no intermediate `Value`), and a poll's output bytes.
#[derive(Debug)]
pub struct Answer {
    ok: Box<RawValue>,
    pub output: Bytes,
}

impl Answer {
    /// The `ok` value as `T`; another shape is a helper that does not speak the protocol.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, HelperError> {
        serde_json::from_str(self.ok.get()).map_err(|e| {
            tracing::warn!(error = %e, "session helper answered with an unexpected shape");
            HelperError::UnexpectedAnswer
        })
    }
}

#[async_trait::async_trait]
pub trait SessionRuntime: Send + Sync + 'static {
    /// Runs the commands in order; a timed-out command ends the batch (exit code 124).
    async fn run(&self, id: &str, spec: &RunSpec) -> Result<Vec<RunResult>, HelperError> {
        self.run_streaming(id, spec, None).await
    }
    /// [`Self::run`], also reporting output and each command's end on `events` as they happen.
    /// Dropping the future cancels the batch (the helper kills the running command's group).
    async fn run_streaming(
        &self,
        id: &str,
        spec: &RunSpec,
        events: Option<mpsc::Sender<RunEvent>>,
    ) -> Result<Vec<RunResult>, HelperError>;
    /// One background-process request; `input` is stdin for a `stdin` request. A poll's
    /// output is the answer's `output`.
    async fn process(
        &self,
        id: &str,
        request: ProcRequest,
        input: Option<Bytes>,
    ) -> Result<Answer, HelperError>;
    /// One fs op (`ls`, `read`, `grep`, `glob`, `write`, `edit`, `delete`), `input` its content
    /// (write). The answer is the op's complete wire response (with its own `error` field).
    async fn fs(
        &self,
        id: &str,
        request: Request,
        input: Option<Bytes>,
    ) -> Result<Answer, HelperError>;
    /// Extracts a (sanitised) tar stream under `dest`, as the sandbox user.
    /// A producer that fails sends `Err` (and its own error is what the caller reports).
    async fn extract(
        &self,
        id: &str,
        dest: &str,
        tar: mpsc::Receiver<std::io::Result<Bytes>>,
    ) -> Result<ExtractStats, HelperError>;
    /// Empties `dest` (a failed seed leaves nothing behind).
    async fn clear(&self, id: &str, dest: &str) -> Result<(), HelperError>;
    /// Whether the session was seeded (its root-owned marker exists).
    async fn seeded(&self, id: &str) -> Result<bool, HelperError>;
    /// Opens the session's channel ahead of its first use (best effort).
    async fn warm(&self, id: &str);
    /// Drops the session's channel (the session is being removed or stopped).
    fn forget(&self, id: &str);
}

/// Opens `id`'s helper channel in the background: the first command or fs op then finds it
/// ready instead of paying for the exec that opens it.
pub fn warm_in_background(runtime: &Arc<dyn SessionRuntime>, id: &str) {
    let runtime = runtime.clone();
    let id = id.to_string();
    tokio::spawn(async move { runtime.warm(&id).await });
}

/// A session's channel, opened once under its own async lock.
#[derive(Default)]
struct SlotState {
    channel: Option<Arc<Channel>>,
    /// Where `serve` runs from when not [`crate::layout::HELPER`]: this build's helper, put
    /// beside a helper that speaks another protocol.
    serve_from: Option<String>,
    /// After a protocol violation: no channel is opened before this.
    quiet_until: Option<Instant>,
}

type Slot = Arc<tokio::sync::Mutex<SlotState>>;

/// Where this build's helper goes in a session whose own helper speaks another protocol.
pub fn own_helper_path() -> String {
    format!("{}-p{}", crate::layout::HELPER, sandbox_protocol::VERSION)
}

/// [`SessionRuntime`] over the in-container helper.
pub struct HelperRuntime {
    engine: Arc<dyn ContainerEngine>,
    user: String,
    /// This build's helper binary, put into a session whose helper speaks another protocol.
    helper: Option<Bytes>,
    /// One slot per session: the async lock makes concurrent first uses open one channel.
    channels: Mutex<HashMap<String, Slot>>,
}

/// Why a call on a channel failed.
enum CallError {
    /// The channel closed; `reached` says whether the helper had answered anything yet.
    Lost {
        reached: bool,
    },
    Helper(HelperError),
}

impl From<HelperError> for CallError {
    fn from(e: HelperError) -> Self {
        CallError::Helper(e)
    }
}

impl HelperRuntime {
    pub fn new(engine: Arc<dyn ContainerEngine>, run_uid: u32, run_gid: u32) -> Self {
        Self {
            engine,
            user: format!("{run_uid}:{run_gid}"),
            helper: None,
            channels: Mutex::default(),
        }
    }

    /// Gives the runtime this build's helper binary (see [`HelperRuntime::channel`]).
    pub fn with_helper(mut self, helper: Option<Bytes>) -> Self {
        self.helper = helper;
        self
    }

    fn slot(&self, id: &str) -> Slot {
        let mut map = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        // Slots of closed channels are dropped here, so the map holds live sessions only.
        let now = Instant::now();
        map.retain(|k, v| {
            k == id
                || v.try_lock()
                    .map(|s| {
                        s.channel.as_ref().is_some_and(|c| !c.is_closed())
                            || s.quiet_until.is_some_and(|t| t > now)
                    })
                    .unwrap_or(true)
        });
        map.entry(id.to_string()).or_default().clone()
    }

    async fn channel(&self, id: &str) -> Result<Arc<Channel>, HelperError> {
        let slot = self.slot(id);
        let mut held = slot.lock().await;
        if let Some(c) = held.channel.as_ref() {
            if !c.is_closed() {
                return Ok(c.clone());
            }
            if let Some(v) = c.violation() {
                held.channel = None;
                held.quiet_until = Some(Instant::now() + QUIET_AFTER_VIOLATION);
                tracing::warn!(session_id = %id, violation = %v, quiet = ?QUIET_AFTER_VIOLATION,
                    "session helper broke the protocol; its session gets no channel for a while");
            }
        }
        if held.quiet_until.is_some_and(|t| t > Instant::now()) {
            return Err(HelperError::Untrusted);
        }
        let unstartable = |e: ChannelError| {
            tracing::warn!(session_id = %id, error = %e, "session helper unavailable");
            HelperError::Unstartable(e)
        };
        let spec = self.serve_spec(id, held.serve_from.as_deref()).await?;
        let exec = self.engine.exec_attached(id, &spec).await?;
        let chan = match Channel::open(exec).await {
            Ok(chan) => chan,
            // A session made by a build of another protocol: its helper is left alone (its
            // supervisor may run background processes) and this build's is put beside it,
            // root-owned in the root-owned service directory, to serve from instead.
            Err(e @ ChannelError::Version { .. }) if held.serve_from.is_none() => {
                let Some(bin) = &self.helper else {
                    tracing::warn!(session_id = %id, error = %e, "session helper speaks another protocol");
                    return Err(HelperError::OtherProtocol(e));
                };
                let path = own_helper_path();
                tracing::warn!(session_id = %id, error = %e, path, "session helper speaks another protocol; serving from this build's helper");
                // The same `serve`, from this build's helper (no second inspect). Put there by
                // an earlier channel (of this replica or another) already?
                let mut spec = spec;
                spec.cmd[0] = path.clone();
                let exec = self.engine.exec_attached(id, &spec).await?;
                let chan = match Channel::open(exec).await {
                    Ok(chan) => chan,
                    Err(_) => {
                        if let Err(put) = ServiceFile::executable(&path)
                            .upload(&*self.engine, id, bin)
                            .await
                        {
                            tracing::warn!(session_id = %id, error = %put, "this build's helper could not be put into the session");
                            return Err(HelperError::OtherProtocol(e));
                        }
                        let exec = self.engine.exec_attached(id, &spec).await?;
                        Channel::open(exec).await.map_err(unstartable)?
                    }
                };
                held.serve_from = Some(path);
                chan
            }
            Err(e) => return Err(unstartable(e)),
        };
        held.channel = Some(chan.clone());
        held.quiet_until = None;
        Ok(chan)
    }

    /// How to start `serve` in the session: as root, told to take the helper's own uid, where
    /// the sandbox says its helper has one (its labels); else as the sandbox user, as sandboxes
    /// created before that did. (One inspect per channel opened.)
    async fn serve_spec(&self, id: &str, from: Option<&str>) -> Result<ExecSpec, HelperError> {
        let info = self.engine.inspect(id).await?;
        let helper = from.unwrap_or(crate::layout::HELPER);
        let mut cmd = vec![helper.to_string(), "serve".to_string()];
        let user = match (
            info.labels.get(HELPER_USER_LABEL),
            info.labels.get(SANDBOX_USER_LABEL),
        ) {
            (Some(helper), Some(sandbox)) => {
                cmd.extend([
                    "--user".to_string(),
                    sandbox.clone(),
                    "--helper-user".to_string(),
                    helper.clone(),
                ]);
                "0:0".to_string()
            }
            _ => self.user.clone(),
        };
        Ok(ExecSpec {
            cmd,
            user,
            workdir: Some("/".to_string()),
            env: Vec::new(),
        })
    }

    /// Runs `call` on the session's channel, once more on a fresh one when the first never
    /// reached a helper (or, with `idempotent`, when the helper died under it).
    async fn with_retry<T, F>(&self, id: &str, idempotent: bool, call: F) -> Result<T, HelperError>
    where
        F: for<'a> Fn(&'a Arc<Channel>) -> futures::future::BoxFuture<'a, Result<T, CallError>>,
    {
        for attempt in 0..2 {
            let chan = self.channel(id).await?;
            match call(&chan).await {
                Ok(v) => return Ok(v),
                Err(CallError::Helper(e)) => return Err(e),
                Err(CallError::Lost { reached }) => {
                    if attempt == 0 && (!reached || idempotent) {
                        tracing::info!(session_id = %id, "session helper channel lost; reopening");
                        continue;
                    }
                    break;
                }
            }
        }
        Err(HelperError::Lost)
    }
}

/// A RESPONSE payload as the op's `ok` value, or the helper's error in `map`'s words. A payload
/// that is no reply at all condemns the channel.
fn answer(
    h: &RequestHandle,
    payload: &[u8],
    map: fn(ResponseError) -> HelperError,
) -> Result<Box<RawValue>, CallError> {
    match serde_json::from_slice::<Response<Box<RawValue>>>(payload) {
        Ok(Response::Ok(ok)) => Ok(ok),
        Ok(Response::Error(e)) => Err(CallError::Helper(map(e))),
        Err(_) => {
            h.channel().condemn(Violation::BadAnswer);
            Err(CallError::Helper(HelperError::UnexpectedAnswer))
        }
    }
}

/// The helper's refusal of an fs op, a run, a seed.
fn op_error(e: ResponseError) -> HelperError {
    use ErrorKind as K;
    match e.kind {
        K::BadRequest => HelperError::Rejected(e.message),
        K::Deadline => HelperError::DeadlineExceeded,
        kind => {
            tracing::warn!(?kind, message = %e.message, "session helper error");
            HelperError::Failed
        }
    }
}

/// The supervisor's refusals keep their meaning.
fn process_error(e: ResponseError) -> HelperError {
    use ErrorKind as K;
    match e.kind {
        K::NotFound => HelperError::NoSuchProcess,
        K::Conflict => HelperError::ProcessConflict(e.message),
        K::Limit => HelperError::ProcessLimit(e.message),
        K::Io => HelperError::ProcessIo(e.message),
        _ => op_error(e),
    }
}

/// Sends a request and its input (then EOF), if any.
async fn start(
    chan: &Arc<Channel>,
    request: &Request,
    caps: Caps,
    input: Option<Bytes>,
) -> Result<RequestHandle, CallError> {
    let mut h = chan
        .request(request, caps)
        .await
        .map_err(|e| lost(e, false))?;
    if let Some(data) = input {
        h.send_data(&data).await.map_err(|e| lost(e, true))?;
        h.send_eof().await.map_err(|e| lost(e, true))?;
    }
    Ok(h)
}

fn lost(e: ChannelError, reached: bool) -> CallError {
    match e {
        ChannelError::Closed => CallError::Lost { reached },
        other => CallError::Helper(HelperError::Channel(other)),
    }
}

/// Waits, at most `within`, for the request's final response (progress frames are ignored;
/// a poll's output is kept), answered in `map`'s words.
async fn response(
    h: &mut RequestHandle,
    within: Duration,
    map: fn(ResponseError) -> HelperError,
) -> Result<Answer, CallError> {
    let wait = async {
        let mut output = Bytes::new();
        loop {
            match h.recv().await {
                Ok(Incoming::Response(payload)) => {
                    let ok = answer(h, &payload, map)?;
                    return Ok(Answer { ok, output });
                }
                Ok(Incoming::Data(d)) => output = d,
                Ok(Incoming::Event(_)) => {}
                Err(e) => return Err(lost(e, false)),
            }
        }
    };
    match tokio::time::timeout(within, wait).await {
        Ok(r) => r,
        Err(_) => Err(CallError::Helper(HelperError::NoAnswer)),
    }
}

/// What one fs op may take from the helper: listings and matches are capped by count in the
/// helper, a read by bytes; the rest answer a few fields.
fn fs_caps(request: &Request) -> Caps {
    let response = match request {
        Request::Ls { .. } | Request::Glob { .. } | Request::Grep { .. } => MAX_PAYLOAD,
        Request::Read { .. } => READ_ANSWER_MAX,
        _ => Caps::SMALL.response,
    };
    Caps { data: 0, response }
}

/// Output of one command as the run result shows it: lossy UTF-8, plus the truncation line
/// when bytes were dropped past the command's cap or the request's budget.
fn command_output(bytes: &[u8], omitted: u64, spec: &RunSpec) -> String {
    let mut s = String::from_utf8_lossy(bytes).into_owned();
    if omitted > 0 {
        s.push_str(&format!(
            "\n[daiv-sandbox: output truncated: {omitted} bytes omitted; the limit is {} bytes per command and {} per request]\n",
            spec.output_cap, spec.run_output_cap
        ));
    }
    s
}

#[async_trait::async_trait]
impl SessionRuntime for HelperRuntime {
    async fn run_streaming(
        &self,
        id: &str,
        spec: &RunSpec,
        events: Option<mpsc::Sender<RunEvent>>,
    ) -> Result<Vec<RunResult>, HelperError> {
        let request = Arc::new(Request::Run {
            commands: spec.commands.clone(),
            fail_fast: spec.fail_fast,
            timeout_ms: spec.timeout.map(|t| t.as_millis() as u64),
            output_cap: spec.output_cap.min(spec.run_output_cap) as u64,
            workdir: spec.workdir.clone(),
            env: spec.env.clone(),
        });
        let caps = Caps {
            data: MAX_DATA_CHUNK,
            response: Caps::SMALL.response,
        };
        let spec = Arc::new(spec.clone());
        let engine = self.engine.clone();
        self.with_retry(id, false, |chan| {
            let request = request.clone();
            let spec = spec.clone();
            let events = events.clone();
            let engine = engine.clone();
            Box::pin(async move {
                let mut h = chan
                    .request(&request, caps)
                    .await
                    .map_err(|e| lost(e, false))?;
                let mut results = Vec::with_capacity(spec.commands.len());
                // The running command: its index, its output kept, and its bytes dropped here
                // past the request's budget (the helper counts those past the command's cap).
                let mut current: Option<(usize, Vec<u8>, u64)> = None;
                let mut kept = 0usize;
                let mut reached = false;
                loop {
                    let msg = match h.recv().await {
                        Ok(m) => m,
                        Err(e) => {
                            let Some((index, out, dropped)) = current.take() else {
                                return Err(lost(e, reached));
                            };
                            // An engine that no longer answers (a fleet's engine marked down
                            // cuts the channel) leaves the command's fate unknown: retryable,
                            // not a result.
                            let answer = tokio::time::timeout(ENGINE_CHECK, engine.ping()).await;
                            let down = match answer {
                                Ok(Ok(())) => None,
                                Ok(Err(e)) => Some(e),
                                Err(_) => Some(EngineError::Unavailable(
                                    "the engine did not answer its ping".into(),
                                )),
                            };
                            if let Some(down) = down {
                                return Err(CallError::Helper(HelperError::Engine(down)));
                            }
                            // The helper vanished mid-command: report what it printed.
                            results.push(RunResult {
                                command: spec.commands.get(index).cloned().unwrap_or_default(),
                                output: command_output(&out, dropped, &spec),
                                exit_code: LOST_EXIT_CODE,
                                workdir: spec.workdir.clone(),
                            });
                            return Ok(results);
                        }
                    };
                    reached = true;
                    match msg {
                        Incoming::Data(bytes) => {
                            if let Some((index, out, dropped)) = current.as_mut() {
                                // The helper caps each command (this bound only guards against
                                // a bad one); the request's budget is kept here.
                                let room = (spec.output_cap + 64 * 1024)
                                    .saturating_sub(out.len())
                                    .min(spec.run_output_cap.saturating_sub(kept));
                                let take = room.min(bytes.len());
                                out.extend_from_slice(&bytes[..take]);
                                kept += take;
                                *dropped += (bytes.len() - take) as u64;
                                if let Some(tx) = &events
                                    && take > 0
                                {
                                    let data = bytes.slice(..take);
                                    let _ = tx
                                        .send(RunEvent::Output {
                                            index: *index,
                                            data,
                                        })
                                        .await;
                                }
                            }
                        }
                        Incoming::Event(ev) => match ev {
                            Event::Started { index } => {
                                current = Some((index as usize, Vec::new(), 0));
                            }
                            Event::Finished {
                                exit_code, omitted, ..
                            } => {
                                let (index, out, dropped) = current.take().unwrap_or_default();
                                let result = RunResult {
                                    command: spec.commands.get(index).cloned().unwrap_or_default(),
                                    output: command_output(&out, omitted + dropped, &spec),
                                    exit_code,
                                    workdir: spec.workdir.clone(),
                                };
                                if let Some(tx) = &events {
                                    let result = result.clone();
                                    let _ = tx.send(RunEvent::Result { index, result }).await;
                                }
                                results.push(result);
                            }
                            Event::Ready { .. } => {}
                        },
                        Incoming::Response(payload) => {
                            answer(&h, &payload, op_error)?;
                            return Ok(results);
                        }
                    }
                }
            })
        })
        .await
    }

    async fn fs(
        &self,
        id: &str,
        request: Request,
        input: Option<Bytes>,
    ) -> Result<Answer, HelperError> {
        let idempotent = matches!(
            request,
            Request::Ls { .. } | Request::Read { .. } | Request::Grep { .. } | Request::Glob { .. }
        );
        let caps = fs_caps(&request);
        let request = Arc::new(request);
        self.with_retry(id, idempotent, |chan| {
            let request = request.clone();
            let input = input.clone();
            Box::pin(async move {
                let mut h = start(chan, &request, caps, input).await?;
                // Past the helper's own deadline something is wrong with the channel: give up.
                response(&mut h, FS_DEADLINE + ANSWER_GRACE, op_error).await
            })
        })
        .await
    }

    async fn extract(
        &self,
        id: &str,
        dest: &str,
        mut tar: mpsc::Receiver<std::io::Result<Bytes>>,
    ) -> Result<ExtractStats, HelperError> {
        // A stream cannot be replayed: one attempt, on a channel known to be open.
        let chan = self.channel(id).await?;
        let request = Request::Extract {
            dest: dest.to_string(),
            deadline_ms: None,
        };
        let mut h = chan
            .request(&request, Caps::SMALL)
            .await
            .map_err(|_| HelperError::Lost)?;
        while let Some(chunk) = tar.recv().await {
            let Ok(chunk) = chunk else {
                // Dropping the handle cancels the extraction in the helper.
                return Err(HelperError::ArchiveRefused);
            };
            // A helper that stops taking the stream does not hold the request for good.
            match tokio::time::timeout(EXTRACT_STALL, h.send_data(&chunk)).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(HelperError::Lost),
                Err(_) => return Err(HelperError::NoAnswer),
            }
        }
        h.send_eof().await.map_err(|_| HelperError::Lost)?;
        match response(&mut h, EXTRACT_STALL, op_error).await {
            Ok(a) => a.parse(),
            Err(CallError::Helper(e)) => Err(e),
            Err(CallError::Lost { .. }) => Err(HelperError::Lost),
        }
    }

    async fn process(
        &self,
        id: &str,
        request: ProcRequest,
        input: Option<Bytes>,
    ) -> Result<Answer, HelperError> {
        // Starting twice or writing stdin twice is not harmless; the rest may be retried.
        let idempotent = matches!(
            request,
            ProcRequest::List | ProcRequest::Poll { .. } | ProcRequest::Kill { .. }
        );
        let (caps, within) = match &request {
            ProcRequest::Poll {
                wait_ms, max_bytes, ..
            } => (
                Caps {
                    data: usize::try_from(*max_bytes).unwrap_or(usize::MAX),
                    response: Caps::SMALL.response,
                },
                Duration::from_millis(*wait_ms) + SHORT_CALL,
            ),
            // Each listed process carries its command.
            ProcRequest::List => (
                Caps {
                    data: 0,
                    response: MAX_PAYLOAD,
                },
                SHORT_CALL,
            ),
            _ => (Caps::SMALL, SHORT_CALL),
        };
        let request = Arc::new(Request::Proc { request });
        self.with_retry(id, idempotent, |chan| {
            let request = request.clone();
            let input = input.clone();
            Box::pin(async move {
                let mut h = start(chan, &request, caps, input).await?;
                response(&mut h, within, process_error).await
            })
        })
        .await
    }

    async fn clear(&self, id: &str, dest: &str) -> Result<(), HelperError> {
        let request = Arc::new(Request::Clear {
            dest: dest.to_string(),
            deadline_ms: Some(CLEAR_DEADLINE.as_millis() as u64),
        });
        self.with_retry(id, true, |chan| {
            let request = request.clone();
            Box::pin(async move {
                let mut h = start(chan, &request, Caps::SMALL, None).await?;
                response(&mut h, CLEAR_DEADLINE + ANSWER_GRACE, op_error)
                    .await
                    .map(|_| ())
            })
        })
        .await
    }

    async fn seeded(&self, id: &str) -> Result<bool, HelperError> {
        self.with_retry(id, true, |chan| {
            Box::pin(async move {
                let mut h = start(chan, &Request::Seeded, Caps::SMALL, None).await?;
                let a = response(&mut h, SHORT_CALL, op_error).await?;
                Ok(a.parse::<SeededInfo>()?.seeded)
            })
        })
        .await
    }

    async fn warm(&self, id: &str) {
        if let Err(e) = self.channel(id).await {
            tracing::debug!(session_id = %id, error = %e, "could not open the helper channel ahead of use");
        }
    }

    fn forget(&self, id: &str) {
        let mut map = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncated_output_says_how_much_was_dropped() {
        let spec = RunSpec {
            commands: Vec::new(),
            fail_fast: false,
            timeout: None,
            output_cap: 3,
            run_output_cap: 5,
            workdir: String::new(),
            env: Vec::new(),
        };
        let s = command_output(b"abc", 10, &spec);
        assert!(s.starts_with("abc\n[daiv-sandbox: output truncated: 10 bytes omitted"));
        assert!(s.contains("3 bytes per command and 5 per request"), "{s}");
        assert_eq!(command_output(b"abc", 0, &spec), "abc");
    }
}
