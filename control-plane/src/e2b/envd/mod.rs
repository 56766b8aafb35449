//! envd, the per-sandbox daemon E2B's SDK talks to, over the native data plane: the sandbox is
//! the `E2b-Sandbox-Id` header's, the caller proves it may act on it with that sandbox's access
//! token (`X-Access-Token`, or a signed `/files` URL), and the user is `Authorization: Basic`'s
//! (only the sandbox user: commands never run as root here).

pub mod files;
pub mod filesystem;
pub mod process;
pub mod shell;
pub mod watch;
pub mod watchers;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use axum::routing::{get, post};
use base64::Engine;
use serde::de::DeserializeOwned;

use super::connect::{Code, RpcError};
use super::refusal::{Refusal, path_id};
use super::state::E2b;

/// The sandbox user's home: where relative paths and a command's default directory are.
pub const HOME: &str = "/home/user";
/// The one user commands run as (the E2B SDK's default).
pub const USER: &str = "user";

/// The sandbox an envd call is for, once its token was checked.
#[derive(Debug, Clone)]
pub struct Caller {
    pub id: String,
}

pub fn router() -> Router<E2b> {
    Router::new()
        .route("/health", get(health))
        .route("/process.Process/{method}", post(process::call))
        .route("/filesystem.Filesystem/{method}", post(filesystem::call))
        .route("/files", get(files::download).post(files::upload))
}

/// `GET /health`: 204 while the sandbox runs; 502 once it is gone, paused, or past its deadline
/// though the reaper has yet to act (what the SDK's `is_running` and its error classification
/// read: E2B's proxy answers 502 for a sandbox that is not running).
async fn health(
    axum::extract::State(e): axum::extract::State<E2b>,
    headers: HeaderMap,
) -> Response {
    use axum::response::IntoResponse;
    let id = match caller(&e, &headers) {
        Ok(c) => c.id,
        Err(err) => return err.into_response(),
    };
    let found = match super::state::session_id(&id) {
        Ok(sid) => e.ops.info(&sid).await,
        Err(err) => Err(err),
    };
    let not_running = |why: &str| {
        http_error(&Refusal::new(
            StatusCode::BAD_GATEWAY,
            format!("the sandbox is not running: {why}"),
        ))
    };
    match found {
        Ok(s) if s.state != crate::api::SessionState::Running => not_running("it is paused"),
        Ok(s) if past(s.expires_at.as_deref()) => not_running("it is past its timeout"),
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(err) => api_http_error(err),
    }
}

/// Whether RFC 3339 time `at` has passed.
fn past(at: Option<&str>) -> bool {
    at.and_then(crate::time::parse_rfc3339)
        .is_some_and(|t| t.unix_timestamp() <= crate::time::unix_now())
}

/// The header's sandbox id, checked to be one a native path can carry.
pub fn sandbox_id(headers: &HeaderMap) -> Result<String, RpcError> {
    let raw = headers
        .get("e2b-sandbox-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    path_id(raw)
        .map(str::to_string)
        .ok_or_else(|| RpcError::new(Code::NotFound, format!("sandbox {raw:?} not found")))
}

/// The caller of an RPC: its sandbox, its token and its user checked.
pub fn caller(e: &E2b, headers: &HeaderMap) -> Result<Caller, RpcError> {
    let id = sandbox_id(headers)?;
    let token = headers
        .get("x-access-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !e.tokens.check(&id, token) {
        return Err(RpcError::new(
            Code::Unauthenticated,
            "invalid or missing access token (X-Access-Token: the envdAccessToken of the sandbox)",
        ));
    }
    check_user(basic_user(headers).as_deref())?;
    Ok(Caller { id })
}

/// The user of `Authorization: Basic base64("user:")`, if any.
pub fn basic_user(headers: &HeaderMap) -> Option<String> {
    let raw = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let b64 = raw.strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    Some(text.split(':').next().unwrap_or("").to_string())
}

/// Only the sandbox user (or none: the default) may act.
pub fn check_user(user: Option<&str>) -> Result<(), RpcError> {
    match user {
        None | Some("") | Some(USER) => Ok(()),
        Some("root") => Err(RpcError::new(
            Code::PermissionDenied,
            "commands and file operations never run as root in this service; use the default \
             user (\"user\")",
        )),
        Some(other) => Err(RpcError::new(
            Code::PermissionDenied,
            format!("user {other:?}: only \"user\" exists for this service's sandboxes"),
        )),
    }
}

/// A path as envd takes it: relative ones are in the user's home.
pub fn absolute(path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else if path.is_empty() || path == "~" {
        HOME.to_string()
    } else if let Some(rest) = path.strip_prefix("~/") {
        format!("{HOME}/{rest}")
    } else {
        format!("{HOME}/{path}")
    }
}

/// The request's one message (see [`super::connect::message`]).
pub fn message<T: DeserializeOwned>(headers: &HeaderMap, body: &[u8]) -> Result<T, RpcError> {
    super::connect::message(headers, body)
}

/// An operation's error as a plain envd HTTP error (logged as the native route logs it).
pub fn api_http_error(e: crate::error::ApiError) -> Response {
    http_error(&Refusal::from(e))
}

/// A native refusal as a plain envd HTTP error (`/files`): `{code, message}` with the status;
/// a sandbox that is not running as E2B's proxy answers it (502).
pub fn http_error(r: &Refusal) -> Response {
    use super::refusal::{GONE, PAUSED, Sandbox};
    match r.sandbox {
        Sandbox::Gone => return http_error(&Refusal::new(StatusCode::BAD_GATEWAY, GONE)),
        Sandbox::Paused => return http_error(&Refusal::new(StatusCode::BAD_GATEWAY, PAUSED)),
        Sandbox::Running => {}
    }
    let mut resp = Response::new(Body::from(
        serde_json::json!({ "code": r.status.as_u16(), "message": r.detail }).to_string(),
    ));
    *resp.status_mut() = r.status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_in_the_home() {
        assert_eq!(absolute("a/b"), "/home/user/a/b");
        assert_eq!(absolute("/etc"), "/etc");
        assert_eq!(absolute(""), "/home/user");
        assert_eq!(absolute("~/x"), "/home/user/x");
    }

    #[test]
    fn only_the_sandbox_user_acts() {
        assert!(check_user(None).is_ok());
        assert!(check_user(Some("user")).is_ok());
        assert_eq!(
            check_user(Some("root")).expect_err("an error").code,
            Code::PermissionDenied
        );
    }
}
