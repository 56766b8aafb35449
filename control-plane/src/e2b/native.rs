//! The native API, called in-process: every E2B call becomes one or more requests to the
//! service's own router (no socket, no serialisation beyond the bodies), so the key check,
//! admission, the session lock, metrics and every error class are the native routes' own, and
//! what E2B's SDK sees is what the native API would answer.

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, Request, StatusCode, header};
use axum::response::Response;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tower::ServiceExt;

use crate::auth::HEADER as API_KEY;

/// A native answer that was not a success: its status and its `detail`.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub status: StatusCode,
    pub detail: String,
}

impl Refusal {
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Self {
            status,
            detail: detail.into(),
        }
    }
}

/// The service's own router and the key to call it with.
#[derive(Clone)]
pub struct Native {
    app: Router,
    key: HeaderValue,
    /// Paused sessions stay paused: a call that would thaw one is refused instead (envd's: a
    /// paused E2B sandbox is not running until `connect` resumes it).
    keep_paused: bool,
}

impl Native {
    pub fn new(app: Router, key: HeaderValue) -> Self {
        Self {
            app,
            key,
            keep_paused: false,
        }
    }

    /// The same router, keeping paused sessions paused (see [`crate::sessions::keep_paused`]).
    pub fn keeping_paused(self) -> Self {
        Self {
            keep_paused: true,
            ..self
        }
    }

    /// One request; the key is the deployment's unless `key` (a control-API caller's own, which
    /// the native check then judges) is given.
    pub async fn send(
        &self,
        method: Method,
        uri: &str,
        body: Body,
        content_type: Option<&str>,
        key: Option<&HeaderValue>,
    ) -> Response {
        let mut headers = HeaderMap::new();
        if let Some(ct) = content_type.and_then(|ct| HeaderValue::from_str(ct).ok()) {
            headers.insert(header::CONTENT_TYPE, ct);
        }
        self.send_with(method, uri, body, headers, key).await
    }

    /// [`Native::send`] with headers of the caller's (`Range`, `Accept-Encoding`, ...).
    pub async fn send_with(
        &self,
        method: Method,
        uri: &str,
        body: Body,
        headers: HeaderMap,
        key: Option<&HeaderValue>,
    ) -> Response {
        let mut req = Request::builder().method(method).uri(uri);
        if let Some(h) = req.headers_mut() {
            h.extend(headers);
            h.insert(API_KEY, key.unwrap_or(&self.key).clone());
        }
        // Counted as the E2B door's traffic, not the REST API's.
        let req = req.extension(crate::routes::observe::Door::E2b);
        let req = match req.body(body) {
            Ok(r) => r,
            Err(e) => {
                return error_response(StatusCode::BAD_REQUEST, &format!("bad request: {e}"));
            }
        };
        let answer = self.app.clone().oneshot(req);
        match crate::sessions::keep_paused_if(self.keep_paused, answer).await {
            Ok(r) => r,
            Err(never) => match never {},
        }
    }

    /// A JSON request (`body` `None`: no body) answered with JSON (or nothing: `Value::Null`).
    pub async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        uri: &str,
        body: Option<&Value>,
        key: Option<&HeaderValue>,
    ) -> Result<T, Refusal> {
        let (body, ct) = match body {
            Some(v) => (Body::from(v.to_string()), Some("application/json")),
            None => (Body::empty(), None),
        };
        let resp = self.send(method, uri, body, ct, key).await;
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 64 * 1024 * 1024)
            .await
            .map_err(|e| Refusal::new(StatusCode::BAD_GATEWAY, format!("answer cut off: {e}")))?;
        if !status.is_success() {
            return Err(refusal(status, &bytes));
        }
        let bytes = if bytes.is_empty() {
            &b"null"[..]
        } else {
            &bytes[..]
        };
        serde_json::from_slice(bytes).map_err(|e| {
            Refusal::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("unexpected answer: {e}"),
            )
        })
    }
}

/// Whether `r` is the native refusal of a paused session to a caller that keeps it paused.
pub fn is_paused(r: &Refusal) -> bool {
    r.status == StatusCode::CONFLICT && r.detail.starts_with("Session is paused")
}

/// The refusal a native error body carries (`{"detail"}`), else the status's reason.
pub fn refusal(status: StatusCode, body: &[u8]) -> Refusal {
    let detail = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("detail").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_else(|| status.canonical_reason().unwrap_or("error").to_string());
    Refusal::new(status, detail)
}

fn error_response(status: StatusCode, detail: &str) -> Response {
    let mut r = Response::new(Body::from(
        serde_json::json!({ "detail": detail }).to_string(),
    ));
    *r.status_mut() = status;
    r
}

/// `k=v&...` with every value percent-encoded.
pub fn query<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        s.append_pair(k.as_ref(), v.as_ref());
    }
    s.finish()
}

/// A sandbox id as it may appear in a native path: what a session id can be (hex, and a fleet
/// engine's name before a dot), so nothing a client sends can change the path.
pub fn path_id(id: &str) -> Option<&str> {
    let ok = !id.is_empty()
        && id.len() <= 200
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_')
        && !id.contains("..");
    ok.then_some(id)
}
