//! The code interpreter's native routes: `POST /session/{id}/code` takes E2B's `/execute` body
//! (`{code, context_id?, language?, env_vars?, timeout?}`) and answers its NDJSON lines, and
//! `/session/{id}/code/contexts[/{context_id}[/restart|/interrupt]]` are its contexts. Each is
//! relayed, as it is, to the interpreter the session's image starts on
//! [`CODE_INTERPRETER_PORT`] (the same server E2B's SDK reaches through ingress), so a native
//! client needs no second format. The API key lets them in; it never reaches the sandbox.

use axum::extract::{Path, Request, State};
use axum::response::Response;

use super::render::respond;
use crate::error::ApiError;
use crate::ids::SessionId;
use crate::ops::Ops;
use crate::ops::ports::CODE_INTERPRETER_PORT;

async fn relay(ops: Ops, session_id: &str, path: String, req: Request) -> Response {
    let Ok(id) = SessionId::parse(session_id) else {
        return respond(ApiError::NotFound);
    };
    super::ports::forward_with_key(ops, id, CODE_INTERPRETER_PORT, path, req).await
}

/// `POST /session/{session_id}/code`: runs code, answered as NDJSON lines as they come.
pub async fn execute(
    State(ops): State<Ops>,
    Path(session_id): Path<String>,
    req: Request,
) -> Response {
    relay(ops, &session_id, "/execute".into(), req).await
}

/// `GET` and `POST /session/{session_id}/code/contexts`: the contexts, and a new one.
pub async fn contexts(
    State(ops): State<Ops>,
    Path(session_id): Path<String>,
    req: Request,
) -> Response {
    relay(ops, &session_id, "/contexts".into(), req).await
}

/// Context ids are the interpreter's (UUIDs): anything else is never relayed as a path.
fn context_path(context_id: &str, tail: &str) -> Result<String, ApiError> {
    if context_id.is_empty()
        || context_id.len() > 64
        || !context_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(ApiError::NotFound);
    }
    Ok(format!("/contexts/{context_id}{tail}"))
}

/// `DELETE /session/{session_id}/code/contexts/{context_id}`.
pub async fn context(
    State(ops): State<Ops>,
    Path((session_id, context_id)): Path<(String, String)>,
    req: Request,
) -> Response {
    match context_path(&context_id, "") {
        Ok(path) => relay(ops, &session_id, path, req).await,
        Err(e) => respond(e),
    }
}

/// `POST /session/{session_id}/code/contexts/{context_id}/{restart|interrupt}`.
pub async fn context_action(
    State(ops): State<Ops>,
    Path((session_id, context_id, action)): Path<(String, String, String)>,
    req: Request,
) -> Response {
    if action != "restart" && action != "interrupt" {
        return respond(ApiError::NotFound);
    }
    match context_path(&context_id, &format!("/{action}")) {
        Ok(path) => relay(ops, &session_id, path, req).await,
        Err(e) => respond(e),
    }
}

/// Most bytes of an execution's NDJSON a caller that collects it (the MCP tool) reads; past it,
/// the rest is dropped (and said to be).
pub const COLLECT_MAX_BYTES: usize = 32 * 1024 * 1024;

/// An execution's lines, collected: `body` (E2B's `/execute` body) sent to the session's code
/// interpreter, its NDJSON read to its end (or to [`COLLECT_MAX_BYTES`]), each line parsed.
/// Returns the lines and whether some were dropped.
pub async fn execute_collected(
    ops: &Ops,
    id: &SessionId,
    body: &serde_json::Value,
) -> Result<(Vec<serde_json::Value>, bool), ApiError> {
    use http_body_util::BodyExt;
    let conn = ops.open_code_interpreter(id).await?;
    let failed =
        |what: &str| ApiError::PortClosed(format!("the code interpreter {what}; retry the call"));
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(conn))
            .await
            .map_err(|_| failed("did not answer"))?;
    tokio::spawn(connection);
    let req = axum::http::Request::post("/execute")
        .header(axum::http::header::CONTENT_TYPE, "application/json")
        .header(axum::http::header::HOST, "localhost")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.to_string(),
        )))
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let response = sender
        .send_request(req)
        .await
        .map_err(|_| failed("closed the connection"))?;
    let status = response.status();
    let mut body = response.into_body();
    let mut buf = Vec::new();
    let mut dropped = false;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| failed("closed the connection mid-answer"))?;
        if let Some(data) = frame.data_ref() {
            if buf.len() + data.len() > COLLECT_MAX_BYTES {
                dropped = true;
                break;
            }
            buf.extend_from_slice(data);
        }
    }
    if !status.is_success() {
        let detail = serde_json::from_slice::<serde_json::Value>(&buf)
            .ok()
            .and_then(|v| v.get("detail").and_then(|d| d.as_str()).map(String::from))
            .unwrap_or_else(|| format!("the code interpreter answered {status}"));
        return Err(if status.is_client_error() {
            ApiError::Unprocessable(detail)
        } else {
            ApiError::PortClosed(detail)
        });
    }
    let lines = buf
        .split(|b| *b == b'\n')
        .filter_map(|l| serde_json::from_slice(l).ok())
        .collect();
    Ok((lines, dropped))
}
