//! The session runtime: how commands, fs ops and seed extraction reach a session's files.
//!
//! Handlers and session logic see [`SessionRuntime`] only. Its implementation, [`HelperRuntime`],
//! talks to `daiv-sandbox-helper` inside the container (the `sandbox-helper` crate) over one
//! long-lived attached exec per session and replica ([`channel`]): no Docker round trip per
//! operation, and every operation runs as the sandbox user, so permissions are the kernel's and
//! nothing running as root acts on a path the sandbox can change. [`ContainerEngine`] keeps
//! container and network lifecycle only.
//!
//! Channels open lazily on first use and again after the helper or its container went away;
//! a request that never reached a helper is retried once on a fresh channel, and a read-only
//! one also when the helper died under it. Anything else answers 503 (retryable): never a
//! wrong answer.
//!
//! [`helper_binary`] (in `helper_bin`) finds the static helper binary the sandboxes are given;
//! [`HelperError`] (in `error`) says why an operation through the helper did not complete.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::api::RunResult;
use crate::engine::{ContainerEngine, ExecSpec, HELPER_USER_LABEL, SANDBOX_USER_LABEL};
pub mod channel;
mod error;
mod helper_bin;
mod writer;

use channel::{Channel, ChannelError, Incoming, RequestHandle};
pub use error::HelperError;
pub use helper_bin::helper_binary;
pub use writer::{ROOT_USER, Writer, write_by_helper};

/// Exit code of a command killed at its timeout (as coreutils' `timeout`).
pub const TIMEOUT_EXIT_CODE: i64 = 124;
/// Exit code reported for a command whose helper vanished under it (it was killed, or the
/// container stopped): the command's fate is unknown.
pub const LOST_EXIT_CODE: i64 = -1;
/// Server-side deadline of one fs op; the helper stops the op (and its walk) past it.
pub const FS_DEADLINE: Duration = Duration::from_secs(30);

/// A request's commands, as the run route received them.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub commands: Vec<String>,
    pub fail_fast: bool,
    pub timeout: Option<Duration>,
    pub output_cap: usize,
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

/// A background-process answer: the supervisor's `ok` value and, for a poll, the output bytes.
#[derive(Debug)]
pub struct ProcessAnswer {
    pub value: Value,
    pub output: Bytes,
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
    /// One background-process request (`sandbox_helper::ops::procs::ProcRequest` as JSON);
    /// `input` is stdin for a `stdin` request.
    async fn process(
        &self,
        id: &str,
        request: Value,
        input: Option<Bytes>,
    ) -> Result<ProcessAnswer, HelperError>;
    /// One fs op: `request` is the helper's request object, `input` its content (write).
    /// Returns the op's complete wire response (with its own `error` field).
    async fn fs(
        &self,
        id: &str,
        request: Value,
        input: Option<Bytes>,
    ) -> Result<Value, HelperError>;
    /// Extracts a (sanitised) tar stream under `dest`, as the sandbox user.
    /// A producer that fails sends `Err` (and its own error is what the caller reports).
    async fn extract(
        &self,
        id: &str,
        dest: &str,
        tar: mpsc::Receiver<std::io::Result<Bytes>>,
    ) -> Result<Value, HelperError>;
    /// Empties `dest` (a failed seed leaves nothing behind).
    async fn clear(&self, id: &str, dest: &str) -> Result<(), HelperError>;
    /// Whether the session was seeded (its root-owned marker exists).
    async fn seeded(&self, id: &str) -> Result<bool, HelperError>;
    /// Opens the session's channel ahead of its first use (best effort).
    async fn warm(&self, id: &str);
    /// Drops the session's channel (the session is being removed or stopped).
    fn forget(&self, id: &str);
}

/// A session's channel, opened once under its own async lock.
type Slot = Arc<tokio::sync::Mutex<Option<Arc<Channel>>>>;

/// [`SessionRuntime`] over the in-container helper.
pub struct HelperRuntime {
    engine: Arc<dyn ContainerEngine>,
    user: String,
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
            channels: Mutex::default(),
        }
    }

    fn slot(&self, id: &str) -> Slot {
        let mut map = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        // Slots of closed channels are dropped here, so the map holds live sessions only.
        map.retain(|k, v| {
            k == id
                || v.try_lock()
                    .map(|c| c.as_ref().is_some_and(|c| !c.is_closed()))
                    .unwrap_or(true)
        });
        map.entry(id.to_string()).or_default().clone()
    }

    async fn channel(&self, id: &str) -> Result<Arc<Channel>, HelperError> {
        let slot = self.slot(id);
        let mut held = slot.lock().await;
        if let Some(c) = held.as_ref()
            && !c.is_closed()
        {
            return Ok(c.clone());
        }
        let spec = self.serve_spec(id).await?;
        let exec = self.engine.exec_attached(id, &spec).await?;
        let chan = Channel::open(exec).await.map_err(|e| {
            tracing::warn!(session_id = %id, error = %e, "session helper unavailable");
            HelperError::Unstartable(e)
        })?;
        *held = Some(chan.clone());
        Ok(chan)
    }

    /// How to start `serve` in the session: as root, told to take the helper's own uid, where
    /// the sandbox says its helper has one (its labels); else as the sandbox user, as sandboxes
    /// created before that did. (One inspect per channel opened.)
    async fn serve_spec(&self, id: &str) -> Result<ExecSpec, HelperError> {
        let info = self.engine.inspect(id).await?;
        let mut cmd = vec![crate::layout::HELPER.to_string(), "serve".to_string()];
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

/// The `ok` value of a final response, or the helper's error.
fn ok_of(response: Value) -> Result<Value, HelperError> {
    if let Some(v) = response.get("ok") {
        return Ok(v.clone());
    }
    let err = response.get("error").cloned().unwrap_or(Value::Null);
    let kind = err
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("internal");
    let message = err
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("the session helper failed")
        .to_string();
    Err(match kind {
        "bad_request" => HelperError::Rejected(message),
        "deadline" => HelperError::DeadlineExceeded,
        _ => {
            tracing::warn!(kind, message = %message, "session helper error");
            HelperError::Failed
        }
    })
}

/// Sends a request and its input (then EOF), if any.
async fn start(
    chan: &Arc<Channel>,
    request: &Value,
    input: Option<Bytes>,
) -> Result<RequestHandle, CallError> {
    let mut h = chan.request(request).await.map_err(|e| lost(e, false))?;
    if let Some(data) = input {
        h.send_data(&data).await.map_err(|e| lost(e, true))?;
        h.send_eof().await.map_err(|e| lost(e, true))?;
    }
    Ok(h)
}

/// A process answer's `ok` value; the supervisor's own refusals keep their meaning.
fn process_ok(response: Value) -> Result<Value, HelperError> {
    let err = response.get("error");
    let kind = err.and_then(|e| e.get("kind")).and_then(Value::as_str);
    let message = || {
        err.and_then(|e| e.get("message"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    match kind {
        Some("not_found") => Err(HelperError::NoSuchProcess),
        Some("conflict") => Err(HelperError::ProcessConflict(message())),
        Some("limit") => Err(HelperError::ProcessLimit(message())),
        Some("io") => Err(HelperError::ProcessIo(message())),
        _ => ok_of(response),
    }
}

fn lost(e: ChannelError, reached: bool) -> CallError {
    match e {
        ChannelError::Closed => CallError::Lost { reached },
        other => CallError::Helper(HelperError::Channel(other)),
    }
}

/// Waits for the request's final response, ignoring progress frames.
async fn response(h: &mut RequestHandle) -> Result<Value, CallError> {
    loop {
        match h.recv().await {
            Ok(Incoming::Response(v)) => return Ok(ok_of(v)?),
            Ok(_) => {}
            Err(e) => return Err(lost(e, false)),
        }
    }
}

/// Output of one command as the run result shows it: lossy UTF-8, plus the truncation line
/// when the helper dropped bytes past the cap.
fn command_output(bytes: &[u8], omitted: u64, cap: usize) -> String {
    let mut s = String::from_utf8_lossy(bytes).into_owned();
    if omitted > 0 {
        s.push_str(&format!(
            "\n[daiv-sandbox: output truncated: {omitted} bytes omitted; the limit is {cap} bytes]\n"
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
        let request = json!({
            "op": "run",
            "commands": spec.commands,
            "fail_fast": spec.fail_fast,
            "timeout_ms": spec.timeout.map(|t| t.as_millis() as u64),
            "output_cap": spec.output_cap as u64,
            "workdir": spec.workdir,
            "env": spec.env,
        });
        let spec = Arc::new(spec.clone());
        self.with_retry(id, false, |chan| {
            let request = request.clone();
            let spec = spec.clone();
            let events = events.clone();
            Box::pin(async move {
                let mut h = chan.request(&request).await.map_err(|e| lost(e, false))?;
                let mut results = Vec::with_capacity(spec.commands.len());
                let mut current: Option<(usize, Vec<u8>)> = None;
                let mut reached = false;
                loop {
                    let msg = match h.recv().await {
                        Ok(m) => m,
                        Err(e) => {
                            let Some((index, out)) = current.take() else {
                                return Err(lost(e, reached));
                            };
                            // The helper vanished mid-command: report what it printed.
                            results.push(RunResult {
                                command: spec.commands.get(index).cloned().unwrap_or_default(),
                                output: command_output(&out, 0, spec.output_cap),
                                exit_code: LOST_EXIT_CODE,
                                workdir: spec.workdir.clone(),
                            });
                            return Ok(results);
                        }
                    };
                    reached = true;
                    match msg {
                        Incoming::Data(bytes) => {
                            if let Some((index, out)) = current.as_mut() {
                                // The helper caps; this bound only guards against a bad one.
                                let room = (spec.output_cap + 64 * 1024).saturating_sub(out.len());
                                let take = room.min(bytes.len());
                                out.extend_from_slice(&bytes[..take]);
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
                        Incoming::Event(ev) => match ev.get("type").and_then(Value::as_str) {
                            Some("started") => {
                                let index = ev.get("index").and_then(Value::as_u64).unwrap_or(0);
                                current = Some((index as usize, Vec::new()));
                            }
                            Some("finished") => {
                                let (index, out) = current.take().unwrap_or_default();
                                let exit_code =
                                    ev.get("exit_code").and_then(Value::as_i64).unwrap_or(-1);
                                let omitted =
                                    ev.get("omitted").and_then(Value::as_u64).unwrap_or(0);
                                let result = RunResult {
                                    command: spec.commands.get(index).cloned().unwrap_or_default(),
                                    output: command_output(&out, omitted, spec.output_cap),
                                    exit_code,
                                    workdir: spec.workdir.clone(),
                                };
                                if let Some(tx) = &events {
                                    let result = result.clone();
                                    let _ = tx.send(RunEvent::Result { index, result }).await;
                                }
                                results.push(result);
                            }
                            _ => {}
                        },
                        Incoming::Response(v) => {
                            ok_of(v)?;
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
        request: Value,
        input: Option<Bytes>,
    ) -> Result<Value, HelperError> {
        let op = request.get("op").and_then(Value::as_str).unwrap_or("");
        let idempotent = matches!(op, "ls" | "read" | "grep" | "glob");
        let mut request = request;
        if let Some(obj) = request.as_object_mut() {
            obj.insert(
                "deadline_ms".to_string(),
                json!(FS_DEADLINE.as_millis() as u64),
            );
        }
        self.with_retry(id, idempotent, |chan| {
            let request = request.clone();
            let input = input.clone();
            Box::pin(async move {
                let mut h = start(chan, &request, input).await?;
                // Past the helper's own deadline something is wrong with the channel: give up.
                match tokio::time::timeout(FS_DEADLINE + Duration::from_secs(10), response(&mut h))
                    .await
                {
                    Ok(r) => r,
                    Err(_) => Err(CallError::Helper(HelperError::NoAnswer)),
                }
            })
        })
        .await
    }

    async fn extract(
        &self,
        id: &str,
        dest: &str,
        mut tar: mpsc::Receiver<std::io::Result<Bytes>>,
    ) -> Result<Value, HelperError> {
        // A stream cannot be replayed: one attempt, on a channel known to be open.
        let chan = self.channel(id).await?;
        let mut h = chan
            .request(&json!({"op": "extract", "dest": dest}))
            .await
            .map_err(|_| HelperError::Lost)?;
        while let Some(chunk) = tar.recv().await {
            let Ok(chunk) = chunk else {
                // Dropping the handle cancels the extraction in the helper.
                return Err(HelperError::ArchiveRefused);
            };
            h.send_data(&chunk).await.map_err(|_| HelperError::Lost)?;
        }
        h.send_eof().await.map_err(|_| HelperError::Lost)?;
        match response(&mut h).await {
            Ok(v) => Ok(v),
            Err(CallError::Helper(e)) => Err(e),
            Err(CallError::Lost { .. }) => Err(HelperError::Lost),
        }
    }

    async fn process(
        &self,
        id: &str,
        request: Value,
        input: Option<Bytes>,
    ) -> Result<ProcessAnswer, HelperError> {
        let action = request.get("action").and_then(Value::as_str).unwrap_or("");
        // Starting twice or writing stdin twice is not harmless; the rest may be retried.
        let idempotent = matches!(action, "list" | "poll" | "kill");
        let request = json!({"op": "proc", "request": request});
        self.with_retry(id, idempotent, |chan| {
            let request = request.clone();
            let input = input.clone();
            Box::pin(async move {
                let mut h = start(chan, &request, input).await?;
                let mut output = Bytes::new();
                loop {
                    match h.recv().await.map_err(|e| lost(e, true))? {
                        Incoming::Data(d) => output = d,
                        Incoming::Event(_) => {}
                        Incoming::Response(v) => {
                            let value = process_ok(v)?;
                            return Ok(ProcessAnswer { value, output });
                        }
                    }
                }
            })
        })
        .await
    }

    async fn clear(&self, id: &str, dest: &str) -> Result<(), HelperError> {
        let request = json!({"op": "clear", "dest": dest});
        self.with_retry(id, true, |chan| {
            let request = request.clone();
            Box::pin(async move {
                let mut h = chan.request(&request).await.map_err(|e| lost(e, false))?;
                response(&mut h).await.map(|_| ())
            })
        })
        .await
    }

    async fn seeded(&self, id: &str) -> Result<bool, HelperError> {
        let request = json!({"op": "seeded"});
        self.with_retry(id, true, |chan| {
            let request = request.clone();
            Box::pin(async move {
                let mut h = chan.request(&request).await.map_err(|e| lost(e, false))?;
                let v = response(&mut h).await?;
                serde_json::from_value::<sandbox_helper::protocol::SeededInfo>(v)
                    .map(|i| i.seeded)
                    .map_err(|_| CallError::Helper(HelperError::NoAnswer))
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
        let s = command_output(b"abc", 10, 3);
        assert!(s.starts_with("abc\n[daiv-sandbox: output truncated: 10 bytes omitted"));
        assert_eq!(command_output(b"abc", 0, 3), "abc");
    }
}
