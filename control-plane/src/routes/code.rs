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

/// Most bytes of an execution's NDJSON a caller that collects it (the MCP tool) reads: charts
/// and text; past it, the rest is dropped (and said to be).
pub const COLLECT_MAX_BYTES: usize = 12 * 1024 * 1024;

/// One line of an execution, as a collector keeps it: the strings it shows, nothing else (a
/// result's `json`, `data` or `extra` are skipped unread, so no line costs more than its bytes).
#[derive(Debug, Default, Clone, serde::Deserialize)]
#[serde(default)]
pub struct CodeLine {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    pub html: Option<String>,
    pub markdown: Option<String>,
    pub svg: Option<String>,
    pub latex: Option<String>,
    pub png: Option<String>,
    pub jpeg: Option<String>,
    pub is_main_result: bool,
    pub name: Option<String>,
    pub value: Option<String>,
    pub traceback: Option<String>,
    pub execution_count: Option<u64>,
}

/// An execution's lines, collected: `body` (E2B's `/execute` body) sent to the session's code
/// interpreter, its NDJSON read to its end, to [`COLLECT_MAX_BYTES`] or to `deadline`,
/// whichever comes first. Returns the lines and whether some were dropped. What the
/// interpreter says when it refuses is its own, and labelled so: it runs in the sandbox.
pub async fn execute_collected(
    ops: &Ops,
    id: &SessionId,
    body: &serde_json::Value,
    deadline: std::time::Duration,
) -> Result<(Vec<CodeLine>, bool), ApiError> {
    let late = || {
        ApiError::Unavailable(format!(
            "the code interpreter did not finish within {} s; its kernel was interrupted",
            deadline.as_secs()
        ))
    };
    tokio::time::timeout(deadline, collect(ops, id, body))
        .await
        .map_err(|_| late())?
}

async fn collect(
    ops: &Ops,
    id: &SessionId,
    body: &serde_json::Value,
) -> Result<(Vec<CodeLine>, bool), ApiError> {
    use http_body_util::BodyExt;
    let conn = ops.open_code_interpreter(id).await?;
    let failed = |what: &str| ApiError::Unavailable(format!("the code interpreter {what}"));
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
        .map_err(|_| failed("closed the connection without an answer"))?;
    let status = response.status();
    let mut body = response.into_body();
    let (mut lines, mut pending, mut read) = (Vec::new(), Vec::new(), 0usize);
    let mut dropped = false;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| failed("closed the connection mid-answer"))?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        read += data.len();
        if read > COLLECT_MAX_BYTES {
            dropped = true;
            break;
        }
        pending.extend_from_slice(data);
        while let Some(at) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=at).collect();
            if let Ok(l) = serde_json::from_slice::<CodeLine>(&line) {
                lines.push(l);
            }
        }
    }
    if !status.is_success() {
        #[derive(serde::Deserialize)]
        struct Detail {
            detail: String,
        }
        let said = serde_json::from_slice::<Detail>(&pending)
            .map(|d| d.detail)
            .unwrap_or_default();
        let said: String = said.chars().take(500).collect();
        return Err(if status.is_client_error() {
            ApiError::Unprocessable(format!("the code interpreter refused the call: {said}"))
        } else {
            failed(&format!("failed ({status})"))
        });
    }
    Ok((lines, dropped))
}
