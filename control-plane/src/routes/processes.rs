//! `/session/{id}/processes/...`: background processes. None of these waits for a running
//! command of the same session (see [`crate::ops::processes`]).

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::extract::{Id, param};
use super::render::{ApiJson, ApiQuery, HttpError};
use crate::api::{
    EventsQuery, PollQuery, ProcessEvent, ProcessList, ProcessOutput, PtyQuery, SignalRequest,
    StartProcessRequest, StartProcessResponse, StdinQuery, TerminalSize,
};
use crate::error::{ApiError, ErrorBody};
use crate::ops::Ops;
use crate::ops::processes::{self as op, Target};

/// The path's `{process_id}` (checked by the operation: one that cannot exist is 404).
pub struct Pid(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Pid {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, HttpError> {
        Ok(Self(
            param(parts, state, "process_id")
                .await
                .ok_or(ApiError::NotFound)?,
        ))
    }
}

/// Start a background process; it outlives the request and dies with the session. With your
/// own `process_id`, a start repeated answers the same process (200).
#[utoipa::path(post, path = "/session/{session_id}/processes/", tag = "processes",
    request_body = StartProcessRequest, security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id")),
    responses((status = 201, body = StartProcessResponse),
        (status = 200, body = StartProcessResponse, description = "The process of that `process_id`, already started"),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 422, body = ErrorBody),
        (status = 429, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn start(
    State(ops): State<Ops>,
    Id(id): Id,
    ApiJson(req): ApiJson<StartProcessRequest>,
) -> Result<(StatusCode, Json<StartProcessResponse>), HttpError> {
    let started = ops.apply(&id, op::Start(req)).await?;
    let status = if started.existing {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(started)))
}

/// A process's events as NDJSON, one `ProcessEvent` per line: `start`, its `stdout` and
/// `stderr` chunks apart, `end`; with `follow=true` until `end`, keepalives in silences. After a
/// disconnect, `after=` the last `seq` seen resumes with nothing lost or repeated; 410 once
/// those events have left the process's bounded buffer (`PROCESS_OUTPUT_BYTES`).
#[utoipa::path(get, path = "/session/{session_id}/processes/{process_id}/events",
    tag = "processes", security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id"),
        ("process_id" = String, Path, description = "The process id"), EventsQuery),
    responses((status = 200, body = ProcessEvent, content_type = "application/x-ndjson"),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 410, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn events(
    State(ops): State<Ops>,
    Id(id): Id,
    Pid(pid): Pid,
    ApiQuery(q): ApiQuery<EventsQuery>,
) -> Result<Response, HttpError> {
    // The first round answers before the body starts: a missing process or lost events are a
    // status, not a cut stream.
    let events = op::Events {
        target: Target::Id(pid),
        after: q.after,
        follow: q.follow,
    };
    let rx = ops.apply(&id, events).await?.events;
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        let event = rx.recv().await?;
        let mut bytes = serde_json::to_vec(&event).unwrap_or_default();
        bytes.push(b'\n');
        Some((Ok::<_, std::convert::Infallible>(bytes), rx))
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response())
}

/// Resize the terminal of a process started with `pty`.
#[utoipa::path(post, path = "/session/{session_id}/processes/{process_id}/resize",
    tag = "processes", request_body = TerminalSize, security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id"),
        ("process_id" = String, Path, description = "The process id")),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "Not started in a terminal, or ended"),
        (status = 422, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn resize(
    State(ops): State<Ops>,
    Id(id): Id,
    Pid(pid): Pid,
    ApiJson(size): ApiJson<TerminalSize>,
) -> Result<StatusCode, HttpError> {
    let target = Target::Id(pid);
    ops.apply(&id, op::Resize { target, size }).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Send a signal (`TERM`, `KILL`, `INT`, `HUP`) to the process's whole process group.
#[utoipa::path(post, path = "/session/{session_id}/processes/{process_id}/signal",
    tag = "processes", request_body = SignalRequest, security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id"),
        ("process_id" = String, Path, description = "The process id")),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "The process has ended"),
        (status = 422, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn signal(
    State(ops): State<Ops>,
    Id(id): Id,
    Pid(pid): Pid,
    ApiJson(req): ApiJson<SignalRequest>,
) -> Result<StatusCode, HttpError> {
    let (target, signal) = (Target::Id(pid), req.signal);
    ops.apply(&id, op::Signal { target, signal }).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The session's background processes, running and recently ended, oldest first.
#[utoipa::path(get, path = "/session/{session_id}/processes/", tag = "processes",
    security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id")),
    responses((status = 200, body = ProcessList), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn list(State(ops): State<Ops>, Id(id): Id) -> Result<Json<ProcessList>, HttpError> {
    Ok(Json(ops.apply(&id, op::List).await?))
}

/// A process's state and output from `offset`, waiting up to `wait` seconds for new output.
#[utoipa::path(get, path = "/session/{session_id}/processes/{process_id}/", tag = "processes",
    security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id"),
        ("process_id" = String, Path, description = "The process id"), PollQuery),
    responses((status = 200, body = ProcessOutput), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn poll(
    State(ops): State<Ops>,
    Id(id): Id,
    Pid(pid): Pid,
    ApiQuery(q): ApiQuery<PollQuery>,
) -> Result<Json<ProcessOutput>, HttpError> {
    let (target, offset, wait) = (Target::Id(pid), q.offset, q.wait);
    Ok(Json(
        ops.apply(
            &id,
            op::Poll {
                target,
                offset,
                wait,
            },
        )
        .await?,
    ))
}

/// Write the raw body to the process's stdin (`eof=true` closes it afterwards).
#[utoipa::path(post, path = "/session/{session_id}/processes/{process_id}/stdin",
    tag = "processes", security(("api_key" = [])),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    params(("session_id" = String, Path, description = "The session id"),
        ("process_id" = String, Path, description = "The process id"), StdinQuery),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn stdin(
    State(ops): State<Ops>,
    Id(id): Id,
    Pid(pid): Pid,
    ApiQuery(q): ApiQuery<StdinQuery>,
    bytes: Bytes,
) -> Result<StatusCode, HttpError> {
    let (target, eof) = (Target::Id(pid), q.eof);
    ops.apply(&id, op::Stdin { target, bytes, eof }).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Kill the process's whole process group.
#[utoipa::path(delete, path = "/session/{session_id}/processes/{process_id}/", tag = "processes",
    security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id"),
        ("process_id" = String, Path, description = "The process id")),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn kill(
    State(ops): State<Ops>,
    Id(id): Id,
    Pid(pid): Pid,
) -> Result<StatusCode, HttpError> {
    ops.apply(
        &id,
        op::Kill {
            target: Target::Id(pid),
        },
    )
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// How long a terminal's WebSocket client may leave output unread before it is closed.
const TERMINAL_STALL: std::time::Duration = std::time::Duration::from_secs(30);

/// The terminal of a process started with `pty`, over a WebSocket, both ways: the terminal's
/// output as binary messages, what the client sends (binary or text) typed into it. `since`
/// replays the output from that byte offset (a reconnect passes the bytes it has seen); without
/// it, output from now on. Closed with 1000 when the process ends; a client that stops reading
/// for 30 s is closed with 1008 (nothing is held for it meanwhile).
#[utoipa::path(get, path = "/session/{session_id}/processes/{process_id}/pty",
    tag = "processes", security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id"),
        ("process_id" = String, Path, description = "The process id"), PtyQuery),
    responses((status = 101, description = "Switching to the WebSocket protocol"),
        (status = 400, body = ErrorBody, description = "Not a WebSocket upgrade request"),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "Not started in a terminal"),
        (status = 422, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn pty(
    State(ops): State<Ops>,
    Id(id): Id,
    Pid(pid): Pid,
    ApiQuery(q): ApiQuery<PtyQuery>,
    upgrade: Result<
        axum::extract::ws::WebSocketUpgrade,
        axum::extract::ws::rejection::WebSocketUpgradeRejection,
    >,
) -> Result<Response, HttpError> {
    let open = op::OpenTerminal {
        process_id: pid,
        since: q.since,
    };
    let term = ops.apply(&id, open).await?;
    let upgrade = upgrade.map_err(|r| {
        ApiError::BadRequest(format!(
            "connect with a WebSocket (Upgrade: websocket): {}",
            r.body_text()
        ))
    })?;
    Ok(upgrade
        .max_message_size(1 << 20)
        .on_upgrade(move |socket| terminal(socket, term)))
}

async fn terminal(socket: axum::extract::ws::WebSocket, mut term: op::Terminal) {
    use axum::extract::ws::{CloseFrame, Message};
    use futures::{SinkExt, StreamExt};
    let (mut tx, mut rx) = socket.split();
    let close = |code: u16, why: &'static str| {
        Message::Close(Some(CloseFrame {
            code,
            reason: why.into(),
        }))
    };
    loop {
        tokio::select! {
            msg = rx.next() => {
                let input = match msg {
                    Some(Ok(Message::Binary(b))) => b,
                    Some(Ok(Message::Text(t))) => Bytes::copy_from_slice(t.as_bytes()),
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                    _ => return, // closed, or gone
                };
                if term.type_in(input).await.is_err() {
                    let _ = tx.send(close(1011, "the terminal does not take input")).await;
                    return;
                }
            }
            read = term.read() => match read {
                Err(_) => {
                    let _ = tx.send(close(1011, "the process is gone")).await;
                    return;
                }
                Ok(op::TerminalOutput::Ended) => {
                    let _ = tx.send(close(1000, "the process ended")).await;
                    return;
                }
                Ok(op::TerminalOutput::Bytes(bytes)) if bytes.is_empty() => {}
                Ok(op::TerminalOutput::Bytes(bytes)) => {
                    let sent = tokio::time::timeout(TERMINAL_STALL, tx.send(Message::Binary(bytes))).await;
                    match sent {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => return,
                        Err(_) => {
                            let _ = tx.send(close(1008, "the client stopped reading")).await;
                            return;
                        }
                    }
                }
            }
        }
    }
}
