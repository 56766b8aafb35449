//! Each runtime call as requests and answers on a session's channel: the run, the fs ops,
//! extraction, processes, and how a helper's refusals become [`HelperError`]s.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sandbox_protocol::frame::{MAX_DATA_CHUNK, MAX_PAYLOAD};
use sandbox_protocol::message::{
    DiskInfo, ErrorKind, Event, ExtractStats, ProcRequest, Request, Response, ResponseError,
    SeededInfo,
};
use serde_json::value::RawValue;
use tokio::sync::mpsc;

use super::channel::{Caps, Channel, ChannelError, Incoming, RequestHandle, Violation};
use super::helper::{CallError, HelperRuntime};
use super::*;
use crate::api::RunResult;
use crate::engine::EngineError;

/// A RESPONSE payload as the op's `ok` value, or the helper's error in `map`'s words. A payload
/// that is no reply at all condemns the channel.
pub(super) fn answer(
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
pub(super) fn op_error(e: ResponseError) -> HelperError {
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
        K::Gone => HelperError::ProcessGone(e.message),
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

pub(super) fn lost(e: ChannelError, reached: bool) -> CallError {
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
                Ok(
                    Incoming::Event(_) | Incoming::Stderr(_) | Incoming::Eof | Incoming::Window(_),
                ) => {}
                Err(e) => return Err(lost(e, false)),
            }
        }
    };
    match tokio::time::timeout(within, wait).await {
        Ok(r) => r,
        Err(_) => Err(CallError::Helper(HelperError::NoAnswer)),
    }
}

/// What one fs op may take from the helper: a page of matches and a data-plane listing are
/// capped by count in the helper, a read by bytes; the rest answer a few fields (`ls` and
/// `glob` stream: see `listing`).
fn fs_caps(request: &Request) -> Caps {
    let response = match request {
        Request::Grep { .. } | Request::List { .. } => MAX_PAYLOAD,
        Request::Read { .. } => READ_ANSWER_MAX,
        _ => Caps::SMALL.response,
    };
    Caps { data: 0, response }
}

/// Output of one command as the run result shows it: lossy UTF-8, plus the truncation line
/// when bytes were dropped past the command's cap or the request's budget.
pub(super) fn command_output(bytes: &[u8], omitted: u64, spec: &RunSpec) -> String {
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
            // Streamed, each stream is its own; the plain answer keeps one pipe, so its output
            // interleaves them exactly as written.
            split: events.is_some(),
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
                // A streamed run's consumer is a client: one that stops reading must not hold
                // up the session's channel, so its run is given up after a stall, as a download.
                let stall = events.is_some().then_some(STREAM_STALL);
                let mut h = chan
                    .request_abandoned_after(&request, caps, stall)
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
                                duration_ms: None,
                                cpu_ms: None,
                                max_rss_bytes: None,
                            });
                            return Ok(results);
                        }
                    };
                    reached = true;
                    let stderr = matches!(msg, Incoming::Stderr(_));
                    match msg {
                        Incoming::Data(bytes) | Incoming::Stderr(bytes) => {
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
                                            stderr,
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
                                exit_code,
                                omitted,
                                usage,
                                ..
                            } => {
                                let (index, out, dropped) = current.take().unwrap_or_default();
                                let result = RunResult {
                                    command: spec.commands.get(index).cloned().unwrap_or_default(),
                                    output: command_output(&out, omitted + dropped, &spec),
                                    exit_code,
                                    workdir: spec.workdir.clone(),
                                    duration_ms: usage.duration_ms,
                                    cpu_ms: usage.cpu_ms,
                                    max_rss_bytes: usage.max_rss_bytes,
                                };
                                if let Some(tx) = &events {
                                    let result = result.clone();
                                    let _ = tx.send(RunEvent::Result { index, result }).await;
                                }
                                results.push(result);
                            }
                            Event::Ready { .. }
                            | Event::File { .. }
                            | Event::Armed { .. }
                            | Event::Change { .. }
                            | Event::Overflow
                            | Event::Listing { .. }
                            | Event::Connected { .. } => {}
                        },
                        Incoming::Eof | Incoming::Window(_) => {}
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
            Request::Ls { .. }
                | Request::Read { .. }
                | Request::Grep { .. }
                | Request::Glob { .. }
                | Request::Stat { .. }
                | Request::List { .. }
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

    async fn listing(&self, id: &str, request: Request) -> Result<super::Listing, HelperError> {
        HelperRuntime::listing(self, id, request).await
    }

    async fn read_file(
        &self,
        id: &str,
        path: &str,
        range: Option<sandbox_protocol::message::ByteRange>,
    ) -> Result<super::FileRead, HelperError> {
        HelperRuntime::read_file(self, id, path, range).await
    }

    async fn watch(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<super::WatchOpen, HelperError> {
        HelperRuntime::watch(self, id, path, recursive).await
    }

    async fn connect(&self, id: &str, port: u16) -> Result<super::PortStream, HelperError> {
        self.connect_port(id, port).await
    }

    async fn write_file(
        &self,
        id: &str,
        request: Request,
        body: mpsc::Receiver<std::io::Result<Bytes>>,
    ) -> Result<sandbox_protocol::files::FileAnswer, HelperError> {
        HelperRuntime::write_file(self, id, request, body).await
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
            ProcRequest::List
                | ProcRequest::Poll { .. }
                | ProcRequest::Events { .. }
                | ProcRequest::Kill { .. }
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
            // Output up to `max_bytes` (more when its first event alone is larger), and a line
            // per event (thousands, for a process writing a few bytes at a time).
            ProcRequest::Events {
                wait_ms, max_bytes, ..
            } => (
                Caps {
                    data: usize::try_from(*max_bytes)
                        .unwrap_or(usize::MAX)
                        .max(MAX_DATA_CHUNK),
                    response: MAX_PAYLOAD,
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

    async fn disk(&self, id: &str) -> Result<DiskInfo, HelperError> {
        self.with_retry(id, true, |chan| {
            Box::pin(async move {
                let mut h = start(chan, &Request::Disk, Caps::SMALL, None).await?;
                let a = response(&mut h, DISK_CALL, op_error).await?;
                Ok(a.parse::<DiskInfo>()?)
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
