//! envd's `process.Process` service over the native background processes: `Start` starts one
//! and streams its events, `Connect` streams them again, the unary calls select a process by its
//! pid (or tag) in the native listing. A call's `Connect-Timeout-Ms` bounds a `Start`: at the
//! deadline the process is killed, as envd does; a client that goes away leaves it running (the
//! SDK's `disconnect`), as the native event stream does.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};

use super::super::connect::{self, Code, RpcError};
use super::super::native::query;
use super::super::state::E2b;
use super::shell::{quote, unquote};
use super::{HOME, absolute, caller, message, ndjson};
use crate::api::{ProcessEvent, ProcessEventType, ProcessInfo, ProcessList, StartProcessResponse};

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
                let p = select(&e, id, &sel.process).await?;
                Ok(connect::stream(
                    events(&e, id, &p, deadline(&headers), false).await?,
                ))
            }
            "List" => list(&e, id).await,
            "SendInput" => {
                let req: SendInput = message(&headers, &body)?;
                let p = select(&e, id, &req.process).await?;
                let data = req.input.stdin.or(req.input.pty).unwrap_or_default();
                let bytes = B64.decode(data.as_bytes()).map_err(|e| {
                    RpcError::new(Code::InvalidArgument, format!("input is not base64: {e}"))
                })?;
                stdin(&e, id, &p.process_id, bytes, false).await?;
                Ok(connect::unary(json!({})))
            }
            "CloseStdin" => {
                let sel: Selected = message(&headers, &body)?;
                let p = select(&e, id, &sel.process).await?;
                stdin(&e, id, &p.process_id, Vec::new(), true).await?;
                Ok(connect::unary(json!({})))
            }
            "SendSignal" => {
                let req: SendSignal = message(&headers, &body)?;
                let p = select(&e, id, &req.process).await?;
                let signal = match &req.signal {
                    Value::String(s) if s == "SIGNAL_SIGKILL" => "KILL",
                    Value::Number(n) if n.as_u64() == Some(9) => "KILL",
                    Value::String(s) if s == "SIGNAL_SIGTERM" => "TERM",
                    Value::Number(n) if n.as_u64() == Some(15) => "TERM",
                    other => {
                        return Err(RpcError::new(
                            Code::InvalidArgument,
                            format!("signal {other}: SIGNAL_SIGTERM or SIGNAL_SIGKILL"),
                        ));
                    }
                };
                let _: Value = e
                    .native
                    .json(
                        Method::POST,
                        &format!("/session/{id}/processes/{}/signal", p.process_id),
                        Some(&json!({ "signal": signal })),
                        None,
                    )
                    .await?;
                Ok(connect::unary(json!({})))
            }
            "Update" => {
                let req: Update = message(&headers, &body)?;
                let p = select(&e, id, &req.process).await?;
                let Some(size) = req.pty.and_then(|p| p.size) else {
                    return Ok(connect::unary(json!({})));
                };
                let _: Value = e
                    .native
                    .json(
                        Method::POST,
                        &format!("/session/{id}/processes/{}/resize", p.process_id),
                        Some(&json!({ "cols": size.cols, "rows": size.rows })),
                        None,
                    )
                    .await?;
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
    let mut target: Option<String> = None;
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
                target = Some(select(e, id, &start.process).await?.process_id);
            } else if let Some(data) = msg.data {
                let Some(pid) = &target else {
                    return Err(RpcError::new(Code::InvalidArgument, "data before start"));
                };
                let text = data.input.stdin.or(data.input.pty).unwrap_or_default();
                let bytes = B64.decode(text.as_bytes()).map_err(|err| {
                    RpcError::new(Code::InvalidArgument, format!("input is not base64: {err}"))
                })?;
                stdin(e, id, pid, bytes, false).await?;
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

async fn start(
    e: &E2b,
    id: &str,
    headers: &HeaderMap,
    req: StartRequest,
) -> Result<Response, RpcError> {
    let mut words = vec![quote(&req.process.cmd)];
    words.extend(req.process.args.iter().map(|a| quote(a)));
    let mut body = json!({ "command": words.join(" ") });
    if !req.process.envs.is_empty() {
        body["environment"] = json!(req.process.envs);
    }
    let explicit_cwd = req.process.cwd.as_deref().filter(|c| !c.is_empty());
    body["workdir"] = json!(
        explicit_cwd
            .map(absolute)
            .unwrap_or_else(|| HOME.to_string())
    );
    if let Some(tag) = &req.tag {
        body["tag"] = json!(tag);
    }
    let pty = req.pty.as_ref().map(|p| match &p.size {
        Some(s) => (s.cols.max(1), s.rows.max(1)),
        None => (80, 24),
    });
    if let Some((cols, rows)) = pty {
        body["pty"] = json!({ "cols": cols, "rows": rows });
    }
    let uri = format!("/session/{id}/processes/");
    let started: StartProcessResponse =
        match e.native.json(Method::POST, &uri, Some(&body), None).await {
            // An image without the user's home: the default directory is the native one.
            Err(r) if r.status.as_u16() == 422 && explicit_cwd.is_none() => {
                body.as_object_mut().map(|b| b.remove("workdir"));
                e.native.json(Method::POST, &uri, Some(&body), None).await?
            }
            other => other?,
        };
    // Without `stdin: true` a command reads an empty stdin, as under envd.
    // A command that already ended has no stdin left to close (409): nothing to do.
    if pty.is_none() && req.stdin != Some(true) {
        match stdin(e, id, &started.process_id, Vec::new(), true).await {
            Err(err) if err.code != Code::FailedPrecondition => return Err(err),
            _ => {}
        }
    }
    let info = ProcessInfo {
        process_id: started.process_id.clone(),
        command: String::new(),
        pid: None,
        tag: None,
        pty: pty.is_some(),
        running: true,
        exit_code: None,
        duration_ms: None,
        cpu_ms: None,
        max_rss_bytes: None,
    };
    Ok(connect::stream(
        events(e, id, &info, deadline(headers), true).await?,
    ))
}

async fn stdin(
    e: &E2b,
    id: &str,
    process_id: &str,
    bytes: Vec<u8>,
    eof: bool,
) -> Result<(), RpcError> {
    let uri = format!(
        "/session/{id}/processes/{process_id}/stdin?{}",
        query(&[("eof", if eof { "true" } else { "false" })])
    );
    let resp = e
        .native
        .send(
            Method::POST,
            &uri,
            Body::from(bytes),
            Some("application/octet-stream"),
            None,
        )
        .await;
    if resp.status().is_success() {
        return Ok(());
    }
    let status = resp.status();
    let body = axum::body::to_bytes(resp.into_body(), 64 * 1024)
        .await
        .unwrap_or_default();
    Err(super::super::native::refusal(status, &body).into())
}

/// The process's events as envd's `StartResponse`/`ConnectResponse` messages; with a deadline,
/// the stream ends there (and, for `kill_at_deadline`, the process is killed).
async fn events(
    e: &E2b,
    id: &str,
    p: &ProcessInfo,
    deadline: Option<Duration>,
    kill_at_deadline: bool,
) -> Result<impl Stream<Item = Result<Value, RpcError>> + Send + 'static, RpcError> {
    let uri = format!(
        "/session/{id}/processes/{}/events?{}",
        p.process_id,
        query(&[("follow", "true")])
    );
    let resp = e
        .native
        .send(Method::GET, &uri, Body::empty(), None, None)
        .await;
    let lines = ndjson::<ProcessEvent>(resp).await?;
    let pty = p.pty;
    let ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = ended.clone();
    let messages = lines
        .filter_map(move |ev| {
            let seen = seen.clone();
            async move {
                match ev {
                    Err(err) => Some(Err(err)),
                    Ok(ev) => {
                        if ev.kind == ProcessEventType::End {
                            seen.store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                        event(&ev, pty).map(|v| Ok(json!({ "event": v })))
                    }
                }
            }
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
    let (e, id, pid) = (e.clone(), id.to_string(), p.process_id.clone());
    Ok(futures::stream::unfold(
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
                                let _: Result<Value, _> = e
                                    .native
                                    .json(
                                        Method::DELETE,
                                        &format!("/session/{id}/processes/{pid}/"),
                                        None,
                                        None,
                                    )
                                    .await;
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
    ))
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

async fn native_list(e: &E2b, id: &str) -> Result<Vec<ProcessInfo>, RpcError> {
    let list: ProcessList = e
        .native
        .json(
            Method::GET,
            &format!("/session/{id}/processes/"),
            None,
            None,
        )
        .await?;
    Ok(list.processes)
}

/// The process a selector names: by pid the running one first (pids are reused), by tag the
/// newest running one.
async fn select(e: &E2b, id: &str, sel: &Selector) -> Result<ProcessInfo, RpcError> {
    let all = native_list(e, id).await?;
    let mut matching: Vec<ProcessInfo> = all
        .into_iter()
        .filter(|p| match (&sel.pid, &sel.tag) {
            (Some(pid), _) => p.pid == Some(*pid),
            (None, Some(tag)) => p.tag.as_deref() == Some(tag.as_str()),
            (None, None) => false,
        })
        .collect();
    matching.sort_by_key(|p| !p.running);
    matching.into_iter().next().ok_or_else(|| {
        RpcError::new(
            Code::NotFound,
            match (&sel.pid, &sel.tag) {
                (Some(pid), _) => format!("process with pid {pid} not found"),
                (None, Some(tag)) => format!("process with tag {tag:?} not found"),
                _ => "a process selector needs pid or tag".to_string(),
            },
        )
    })
}

async fn list(e: &E2b, id: &str) -> Result<Response, RpcError> {
    let processes: Vec<Value> = native_list(e, id)
        .await?
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
