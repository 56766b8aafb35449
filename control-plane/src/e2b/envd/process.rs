//! envd's `process.Process` service over the native background processes, through the
//! operations every door uses ([`crate::ops::processes`]): `Start` is one operation (start, close
//! stdin, follow the events: one check of the sandbox), `Connect` follows the events again, the
//! unary calls select a process by its pid (or tag) within their one operation. A call's
//! `Connect-Timeout-Ms` bounds a `Start`: at the deadline the process is killed, as envd does; a
//! client that goes away leaves it running (the SDK's `disconnect`), as the native event stream
//! does.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::super::connect::{self, Code, RpcError};
use super::super::state::E2b;
use super::shell::{quote, unquote};
use super::{HOME, absolute, caller, message};
use crate::api::{
    ProcessEvent, ProcessEventType, ProcessSignal, StartProcessRequest, TerminalSize,
};
use crate::ops::processes::{self as op, Target};

#[derive(Debug, Deserialize)]
struct ProcessConfig {
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    #[serde(default)]
    cwd: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Size {
    #[serde(default)]
    cols: u16,
    #[serde(default)]
    rows: u16,
}

#[derive(Debug, Deserialize)]
struct Pty {
    size: Option<Size>,
}

#[derive(Debug, Deserialize)]
struct StartRequest {
    process: ProcessConfig,
    #[serde(default)]
    pty: Option<Pty>,
    #[serde(default)]
    tag: Option<String>,
    #[serde(default)]
    stdin: Option<bool>,
}

/// `{pid}` or `{tag}`.
#[derive(Debug, Default, Deserialize)]
struct Selector {
    #[serde(default)]
    pid: Option<u32>,
    #[serde(default)]
    tag: Option<String>,
}

impl Selector {
    /// The process it names, a pid before a tag.
    fn target(&self) -> Result<Target, RpcError> {
        match (self.pid, &self.tag) {
            (Some(pid), _) => Ok(Target::Pid(pid)),
            (None, Some(tag)) => Ok(Target::Tag(tag.clone())),
            (None, None) => Err(RpcError::new(
                Code::NotFound,
                "a process selector needs pid or tag",
            )),
        }
    }
}

#[derive(Debug, Deserialize)]
struct Selected {
    #[serde(default)]
    process: Selector,
}

#[derive(Debug, Deserialize)]
struct Input {
    #[serde(default)]
    stdin: Option<String>,
    #[serde(default)]
    pty: Option<String>,
}

#[derive(Debug, Deserialize)]
struct SendInput {
    #[serde(default)]
    process: Selector,
    input: Input,
}

#[derive(Debug, Deserialize)]
struct SendSignal {
    #[serde(default)]
    process: Selector,
    signal: Value,
}

#[derive(Debug, Deserialize)]
struct Update {
    #[serde(default)]
    process: Selector,
    #[serde(default)]
    pty: Option<Pty>,
}

/// `POST /process.Process/{method}`.
pub async fn call(
    State(e): State<E2b>,
    Path(method): Path<String>,
    req: axum::extract::Request,
) -> Response {
    let (parts, body) = req.into_parts();
    let headers = parts.headers;
    let streaming = connect::is_streaming(&headers);
    let result = async {
        connect::check_codec(&headers)?;
        let who = caller(&e, &headers)?;
        let id = who.id.as_str();
        if method == "StreamInput" {
            return stream_input(&e, id, body).await;
        }
        let body: Bytes = axum::body::to_bytes(body, connect::MAX_MESSAGE + 64 * 1024)
            .await
            .map_err(|err| {
                RpcError::new(Code::ResourceExhausted, format!("request body: {err}"))
            })?;
        match method.as_str() {
            "Start" => start(&e, id, &headers, message(&headers, &body)?).await,
            "Connect" => {
                let sel: Selected = message(&headers, &body)?;
                let events = op::Events {
                    target: sel.process.target()?,
                    after: None,
                    follow: true,
                };
                let watched = e.apply(id, events).await?;
                let pty = watched.process.pty;
                Ok(connect::stream(envd_events(
                    &e,
                    id,
                    &watched.process.process_id,
                    pty,
                    watched.events,
                    deadline(&headers),
                    false,
                )))
            }
            "List" => list(&e, id).await,
            "SendInput" => {
                let req: SendInput = message(&headers, &body)?;
                send_input(&e, id, req.process.target()?, req.input).await?;
                Ok(connect::unary(json!({})))
            }
            "CloseStdin" => {
                let sel: Selected = message(&headers, &body)?;
                let target = sel.process.target()?;
                let bytes = Bytes::new();
                e.apply(
                    id,
                    op::Stdin {
                        target,
                        bytes,
                        eof: true,
                    },
                )
                .await?;
                Ok(connect::unary(json!({})))
            }
            "SendSignal" => {
                let req: SendSignal = message(&headers, &body)?;
                let target = req.process.target()?;
                let signal = match &req.signal {
                    Value::String(s) if s == "SIGNAL_SIGKILL" => ProcessSignal::Kill,
                    Value::Number(n) if n.as_u64() == Some(9) => ProcessSignal::Kill,
                    Value::String(s) if s == "SIGNAL_SIGTERM" => ProcessSignal::Term,
                    Value::Number(n) if n.as_u64() == Some(15) => ProcessSignal::Term,
                    other => {
                        return Err(RpcError::new(
                            Code::InvalidArgument,
                            format!("signal {other}: SIGNAL_SIGTERM or SIGNAL_SIGKILL"),
                        ));
                    }
                };
                e.apply(id, op::Signal { target, signal }).await?;
                Ok(connect::unary(json!({})))
            }
            "Update" => {
                let req: Update = message(&headers, &body)?;
                let target = req.process.target()?;
                let Some(size) = req.pty.and_then(|p| p.size) else {
                    // Nothing to change: the process must still exist.
                    e.apply(id, op::Find(target)).await?;
                    return Ok(connect::unary(json!({})));
                };
                let size = TerminalSize {
                    cols: size.cols,
                    rows: size.rows,
                };
                e.apply(id, op::Resize { target, size }).await?;
                Ok(connect::unary(json!({})))
            }
            other => Err(RpcError::new(
                Code::Unimplemented,
                format!("process.Process/{other} is not served"),
            )),
        }
    }
    .await;
    match result {
        Ok(r) => r,
        Err(err) if streaming => connect::stream_error(err),
        Err(err) => err.into_response(),
    }
}

#[derive(Debug, Deserialize)]
struct InputStart {
    #[serde(default)]
    process: Selector,
}

#[derive(Debug, Deserialize)]
struct InputData {
    input: Input,
}

/// One message of `StreamInput` (a oneof).
#[derive(Debug, Deserialize)]
struct InputMessage {
    #[serde(default)]
    start: Option<InputStart>,
    #[serde(default)]
    data: Option<InputData>,
}

/// `StreamInput`, client streaming: a `start` naming the process, then `data` messages written
/// to its stdin as they arrive (keepalives ignored); answered with one `{}` and the end.
async fn stream_input(e: &E2b, id: &str, body: Body) -> Result<Response, RpcError> {
    let mut chunks = body.into_data_stream();
    let mut buf: Vec<u8> = Vec::new();
    let mut target: Option<Target> = None;
    loop {
        while let Some(connect::Envelope {
            flags,
            payload,
            rest,
        }) = connect::envelope(&buf).or_else(|err| {
            // An envelope still arriving is not an error yet.
            if err.code == Code::InvalidArgument {
                Ok(None)
            } else {
                Err(err)
            }
        })? {
            if flags & 0x01 != 0 {
                return Err(RpcError::new(
                    Code::Unimplemented,
                    "compressed messages are not supported",
                ));
            }
            let msg: InputMessage =
                serde_json::from_slice(if payload.is_empty() { b"{}" } else { payload }).map_err(
                    |err| RpcError::new(Code::InvalidArgument, format!("malformed message: {err}")),
                )?;
            let used = buf.len() - rest.len();
            if let Some(start) = msg.start {
                let found = e.apply(id, op::Find(start.process.target()?)).await?;
                target = Some(Target::Id(found.process_id));
            } else if let Some(data) = msg.data {
                let Some(target) = &target else {
                    return Err(RpcError::new(Code::InvalidArgument, "data before start"));
                };
                send_input(e, id, target.clone(), data.input).await?;
            }
            buf.drain(..used);
        }
        match chunks.next().await {
            Some(Ok(chunk)) => buf.extend_from_slice(&chunk),
            Some(Err(err)) => {
                return Err(RpcError::new(
                    Code::Canceled,
                    format!("input stream cut: {err}"),
                ));
            }
            None if buf.is_empty() => break,
            None => return Err(RpcError::new(Code::InvalidArgument, "truncated envelope")),
        }
    }
    Ok(connect::stream(futures::stream::iter([Ok(json!({}))])))
}

/// `Connect-Timeout-Ms`, when the call has one.
fn deadline(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
}

/// `input` (its stdin, or what is typed into its terminal) written to the target's stdin.
async fn send_input(e: &E2b, id: &str, target: Target, input: Input) -> Result<(), RpcError> {
    let bytes = decode(&input.stdin.or(input.pty).unwrap_or_default())?;
    let eof = false;
    e.apply(id, op::Stdin { target, bytes, eof }).await
}

/// Base64 input, as envd's messages carry it.
fn decode(text: &str) -> Result<Bytes, RpcError> {
    B64.decode(text.as_bytes())
        .map(Bytes::from)
        .map_err(|err| RpcError::new(Code::InvalidArgument, format!("input is not base64: {err}")))
}

async fn start(
    e: &E2b,
    id: &str,
    headers: &HeaderMap,
    req: StartRequest,
) -> Result<Response, RpcError> {
    let mut words = vec![quote(&req.process.cmd)];
    words.extend(req.process.args.iter().map(|a| quote(a)));
    let explicit_cwd = req.process.cwd.as_deref().filter(|c| !c.is_empty());
    let pty = req.pty.as_ref().map(|p| match &p.size {
        Some(s) => TerminalSize {
            cols: s.cols.max(1),
            rows: s.rows.max(1),
        },
        None => TerminalSize { cols: 80, rows: 24 },
    });
    let start = op::StartFollowed {
        req: StartProcessRequest {
            command: words.join(" "),
            environment: (!req.process.envs.is_empty()).then_some(req.process.envs),
            workdir: explicit_cwd.map(absolute),
            process_id: None,
            tag: req.tag,
            pty,
        },
        // The user's home, unless the image has none: then the native default.
        default_workdir: explicit_cwd.is_none().then(|| HOME.to_string()),
        // Without `stdin: true` a command reads an empty stdin, as under envd.
        keep_stdin: req.stdin == Some(true),
    };
    let followed = e.apply(id, start).await?;
    Ok(connect::stream(envd_events(
        e,
        id,
        &followed.started.process_id,
        pty.is_some(),
        followed.events,
        deadline(headers),
        true,
    )))
}

/// A process's events as envd's `StartResponse`/`ConnectResponse` messages; with a deadline,
/// the stream ends there (and, for `kill_at_deadline`, the process is killed).
fn envd_events(
    e: &E2b,
    id: &str,
    process_id: &str,
    pty: bool,
    events: mpsc::Receiver<ProcessEvent>,
    deadline: Option<Duration>,
    kill_at_deadline: bool,
) -> impl Stream<Item = Result<Value, RpcError>> + Send + 'static {
    let lines = futures::stream::unfold(events, |mut rx| async move {
        rx.recv().await.map(|ev| (ev, rx))
    });
    let ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = ended.clone();
    let messages = lines
        .filter_map(move |ev| {
            if ev.kind == ProcessEventType::End {
                seen.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            futures::future::ready(event(&ev, pty).map(|v| Ok(json!({ "event": v }))))
        })
        // The events stopped before the process's end: its sandbox went (killed, or past its
        // timeout) and the stream is cut, as envd's connection is.
        .chain(futures::stream::iter([()]).filter_map(move |()| {
            let ended = ended.load(std::sync::atomic::Ordering::Relaxed);
            async move {
                (!ended).then(|| Err(RpcError::cut("the sandbox went before the process ended")))
            }
        }));
    let until = deadline.map(|d| tokio::time::Instant::now() + d);
    let (e, id, pid) = (e.clone(), id.to_string(), process_id.to_string());
    futures::stream::unfold(
        (Box::pin(messages), until, false),
        move |(mut messages, until, done)| {
            let (e, id, pid) = (e.clone(), id.clone(), pid.clone());
            async move {
                if done {
                    return None;
                }
                let next = match until {
                    Some(at) => match tokio::time::timeout_at(at, messages.next()).await {
                        Ok(n) => n,
                        Err(_) => {
                            if kill_at_deadline {
                                let target = Target::Id(pid);
                                let _ = e.apply(&id, op::Kill { target }).await;
                            }
                            return Some((
                                Err(RpcError::new(
                                    Code::DeadlineExceeded,
                                    "the command's timeout passed: it was killed",
                                )),
                                (messages, until, true),
                            ));
                        }
                    },
                    None => messages.next().await,
                };
                next.map(|item| (item, (messages, until, false)))
            }
        },
    )
}

/// One native event as envd's `ProcessEvent` (without its `event` wrapper).
fn event(ev: &ProcessEvent, pty: bool) -> Option<Value> {
    Some(match ev.kind {
        ProcessEventType::Start => json!({ "start": { "pid": ev.pid.unwrap_or(0) } }),
        ProcessEventType::Stdout => {
            let data = B64.encode(ev.data.as_deref().unwrap_or("").as_bytes());
            if pty {
                json!({ "data": { "pty": data } })
            } else {
                json!({ "data": { "stdout": data } })
            }
        }
        ProcessEventType::Stderr => {
            json!({ "data": { "stderr": B64.encode(ev.data.as_deref().unwrap_or("").as_bytes()) } })
        }
        ProcessEventType::Keepalive => json!({ "keepalive": {} }),
        ProcessEventType::End => {
            let (code, status) = match (&ev.signal, ev.exit_code) {
                (Some(sig), _) => (-1, format!("signal: {}", signal_word(sig))),
                (None, Some(c)) => (c, format!("exit status {c}")),
                (None, None) => (-1, "unknown".to_string()),
            };
            let mut end =
                json!({ "exitCode": code, "exited": ev.signal.is_none(), "status": status });
            if code != 0 {
                end["error"] = json!(status);
            }
            json!({ "end": end })
        }
    })
}

/// Go's words for a signal, as envd's `status` says them.
fn signal_word(sig: &str) -> &str {
    match sig {
        "KILL" => "killed",
        "TERM" => "terminated",
        "INT" => "interrupt",
        "HUP" => "hangup",
        other => other,
    }
}

async fn list(e: &E2b, id: &str) -> Result<Response, RpcError> {
    let processes: Vec<Value> = e
        .apply(id, op::List)
        .await?
        .processes
        .into_iter()
        .filter(|p| p.running)
        .map(|p| {
            let words = unquote(&p.command)
                .unwrap_or_else(|| vec!["/bin/bash".into(), "-c".into(), p.command.clone()]);
            let mut v = json!({
                "config": {
                    "cmd": words.first().cloned().unwrap_or_default(),
                    "args": words.get(1..).unwrap_or(&[]),
                    "envs": {},
                },
                "pid": p.pid.unwrap_or(0),
            });
            if let Some(tag) = &p.tag {
                v["tag"] = json!(tag);
            }
            v
        })
        .collect();
    Ok(connect::unary(json!({ "processes": processes })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_end_by_a_signal_is_envds() {
        let mut ev = ProcessEvent::new(3, ProcessEventType::End);
        ev.exit_code = Some(137);
        ev.signal = Some("KILL".into());
        let v = event(&ev, false).expect("a value");
        assert_eq!(v["end"]["status"], "signal: killed");
        assert_eq!(v["end"]["exited"], false);
        ev.signal = None;
        ev.exit_code = Some(0);
        let v = event(&ev, false).expect("a value");
        assert_eq!(v["end"]["exitCode"], 0);
        assert!(v["end"].get("error").is_none());
    }
}
