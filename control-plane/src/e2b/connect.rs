//! The Connect protocol as envd speaks it to E2B's SDK, JSON codec only: unary calls are a JSON
//! body each way (an error is its HTTP status and `{code, message}`); a server stream answers
//! HTTP 200 with enveloped messages (a flags byte, a big-endian length, the JSON) and ends with
//! an end-of-stream envelope (flags `0x02`) that carries `{}` or `{"error": {code, message}}`.
//! A request whose envelope is compressed, malformed or too big is refused with a Connect error,
//! never a hang.

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::refusal::Refusal;

/// The largest request message read (a `SendInput`'s bytes, base64 in JSON, are the biggest).
pub const MAX_MESSAGE: usize = 8 * 1024 * 1024;

const FLAG_COMPRESSED: u8 = 0x01;
const FLAG_END: u8 = 0x02;

/// A Connect error code (its wire name and, for unary calls, its HTTP status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Unimplemented,
    Internal,
    Unavailable,
    Unauthenticated,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The status a unary error is sent with (Connect's table).
    pub fn http_status(self) -> StatusCode {
        match self {
            Code::Canceled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            Code::Unknown | Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }
}

/// A call's failure.
#[derive(Debug, Clone)]
pub struct RpcError {
    pub code: Code,
    pub message: String,
    /// A stream answering it is cut (no end-of-stream envelope): what a client sees when the
    /// sandbox goes mid-stream, which E2B's SDK checks against the sandbox's health.
    pub cut: bool,
}

impl RpcError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            cut: false,
        }
    }

    /// The sandbox went while a stream was answering: the connection is dropped, as envd's is.
    pub fn cut(message: impl Into<String>) -> Self {
        Self {
            cut: true,
            ..Self::new(Code::Unavailable, message)
        }
    }

    fn body(&self) -> Value {
        json!({ "code": self.code.as_str(), "message": self.message })
    }
}

/// A refusal as the Connect code the SDK turns into the matching exception.
impl From<Refusal> for RpcError {
    fn from(r: Refusal) -> Self {
        use super::refusal::{GONE, PAUSED, Sandbox};
        match r.sandbox {
            // The session itself is gone: envd's "sandbox not found", which the SDK reads as a
            // sandbox that is not running (not as a missing file).
            Sandbox::Gone => return RpcError::new(Code::Unavailable, GONE),
            Sandbox::Paused => return RpcError::new(Code::Unavailable, PAUSED),
            Sandbox::Running => {}
        }
        let code = match r.status.as_u16() {
            400 | 422 => Code::InvalidArgument,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 | 410 => Code::NotFound,
            409 => Code::FailedPrecondition,
            413 | 429 | 507 => Code::ResourceExhausted,
            416 => Code::InvalidArgument,
            503 => Code::Unavailable,
            504 => Code::DeadlineExceeded,
            _ => Code::Internal,
        };
        RpcError::new(code, r.detail)
    }
}

/// An operation's error, as the native route would have refused it (logged as it logs).
impl From<crate::error::ApiError> for RpcError {
    fn from(e: crate::error::ApiError) -> Self {
        use crate::error::ApiError;
        match e {
            // A process the sandbox does not have (gone between a listing and the call).
            ApiError::NoSuchProcess => {
                e.log();
                RpcError::new(Code::NotFound, "process not found")
            }
            e => Refusal::from(e).into(),
        }
    }
}

impl IntoResponse for RpcError {
    /// A unary call's error.
    fn into_response(self) -> Response {
        (
            self.code.http_status(),
            [(header::CONTENT_TYPE, "application/json")],
            self.body().to_string(),
        )
            .into_response()
    }
}

/// A unary call's answer.
pub fn unary(value: Value) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

/// Whether the request is a streaming call's (`application/connect+json`).
pub fn is_streaming(headers: &HeaderMap) -> bool {
    content_type(headers).starts_with("application/connect+")
}

fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// Refuses a call in another codec than JSON (protobuf), whatever its method reads.
pub fn check_codec(headers: &HeaderMap) -> Result<(), RpcError> {
    let ct = content_type(headers);
    if ct.is_empty()
        || ct.starts_with("application/json")
        || ct.starts_with("application/connect+json")
    {
        return Ok(());
    }
    Err(RpcError::new(
        Code::Unimplemented,
        format!("content type {ct:?} is not served: only Connect's JSON codec"),
    ))
}

/// The request's one message: the JSON body of a unary call, the first envelope of a streaming
/// one. Protobuf, compression and oversized or malformed messages are refused.
pub fn message<T: DeserializeOwned>(headers: &HeaderMap, body: &[u8]) -> Result<T, RpcError> {
    let ct = content_type(headers);
    let json: &[u8] = if ct.starts_with("application/connect+json") {
        let Envelope { flags, payload, .. } = envelope(body)?
            .ok_or_else(|| RpcError::new(Code::InvalidArgument, "the request has no message"))?;
        if flags & FLAG_COMPRESSED != 0 {
            return Err(RpcError::new(
                Code::Unimplemented,
                "compressed messages are not supported (send them uncompressed)",
            ));
        }
        payload
    } else if ct.starts_with("application/json") || ct.is_empty() {
        body
    } else {
        return Err(RpcError::new(
            Code::Unimplemented,
            format!("content type {ct:?} is not served: only Connect's JSON codec"),
        ));
    };
    let json = if json.is_empty() { &b"{}"[..] } else { json };
    serde_json::from_slice(json)
        .map_err(|e| RpcError::new(Code::InvalidArgument, format!("malformed message: {e}")))
}

/// One enveloped message and what follows it in the buffer.
pub struct Envelope<'a> {
    pub flags: u8,
    pub payload: &'a [u8],
    pub rest: &'a [u8],
}

/// The first envelope of `buf`; `None` for an empty buffer. A truncated envelope or one over
/// [`MAX_MESSAGE`] is an error.
pub fn envelope(buf: &[u8]) -> Result<Option<Envelope<'_>>, RpcError> {
    if buf.is_empty() {
        return Ok(None);
    }
    if buf.len() < 5 {
        return Err(RpcError::new(Code::InvalidArgument, "truncated envelope"));
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if len > MAX_MESSAGE {
        return Err(RpcError::new(
            Code::ResourceExhausted,
            format!("message of {len} bytes is over the limit of {MAX_MESSAGE}"),
        ));
    }
    let rest = &buf[5..];
    if rest.len() < len {
        return Err(RpcError::new(Code::InvalidArgument, "truncated envelope"));
    }
    Ok(Some(Envelope {
        flags: buf[0],
        payload: &rest[..len],
        rest: &rest[len..],
    }))
}

/// One envelope.
pub fn frame(flags: u8, payload: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + payload.len());
    out.push(flags);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    Bytes::from(out)
}

/// The end-of-stream envelope.
pub fn end(error: Option<&RpcError>) -> Bytes {
    let body = match error {
        Some(e) => json!({ "error": e.body() }),
        None => json!({}),
    };
    frame(FLAG_END, body.to_string().as_bytes())
}

/// A server stream's answer: each message enveloped as it comes, the first error (or the
/// stream's end) closing it with the end-of-stream envelope; a [`RpcError::cut`] drops it.
pub fn stream<S>(messages: S) -> Response
where
    S: Stream<Item = Result<Value, RpcError>> + Send + 'static,
{
    let body = futures::stream::unfold(
        (Box::pin(messages), false),
        |(mut messages, done)| async move {
            if done {
                return None;
            }
            match messages.next().await {
                Some(Ok(v)) => Some((Ok(frame(0, v.to_string().as_bytes())), (messages, false))),
                Some(Err(e)) if e.cut => {
                    Some((Err(std::io::Error::other(e.message)), (messages, true)))
                }
                Some(Err(e)) => Some((Ok(end(Some(&e))), (messages, true))),
                None => Some((Ok(end(None)), (messages, true))),
            }
        },
    );
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/connect+json")],
        Body::from_stream(body),
    )
        .into_response()
}

/// A streaming call refused before its first message: HTTP 200 and the end-of-stream error.
pub fn stream_error(e: RpcError) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/connect+json")],
        end(Some(&e)),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(ct: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, ct.parse().expect("a value"));
        h
    }

    #[test]
    fn an_envelope_is_read_back_and_bad_ones_are_refused() {
        let f = frame(0, br#"{"path":"/tmp"}"#);
        let v: Value = message(&headers("application/connect+json"), &f).expect("a value");
        assert_eq!(v["path"], "/tmp");
        let mut compressed = f.to_vec();
        compressed[0] = FLAG_COMPRESSED;
        let e = message::<Value>(&headers("application/connect+json"), &compressed)
            .expect_err("an error");
        assert_eq!(e.code, Code::Unimplemented);
        let e =
            message::<Value>(&headers("application/connect+json"), &f[..7]).expect_err("an error");
        assert_eq!(e.code, Code::InvalidArgument);
        let mut huge = vec![0u8, 0xff, 0xff, 0xff, 0xff];
        huge.extend_from_slice(b"{}");
        let e =
            message::<Value>(&headers("application/connect+json"), &huge).expect_err("an error");
        assert_eq!(e.code, Code::ResourceExhausted);
        let e = message::<Value>(&headers("application/proto"), b"").expect_err("an error");
        assert_eq!(e.code, Code::Unimplemented);
    }

    #[test]
    fn the_end_of_a_stream_carries_its_error() {
        let e = end(Some(&RpcError::new(Code::NotFound, "gone")));
        assert_eq!(e[0], FLAG_END);
        let v: Value = serde_json::from_slice(&e[5..]).expect("a value");
        assert_eq!(
            v,
            json!({"error": {"code": "not_found", "message": "gone"}})
        );
        assert_eq!(&end(None)[5..], b"{}");
    }
}
