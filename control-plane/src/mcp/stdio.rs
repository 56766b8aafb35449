//! `daiv-sandbox mcp --url URL --key-file FILE`: an MCP server on stdio for clients that only
//! speak stdio, bridging each message to a running service's `/mcp` over streamable HTTP.
//!
//! Each line read is one JSON-RPC message, POSTed with the key, the MCP session id the service
//! gave at initialisation and the negotiated protocol version; each message of the answer (a
//! JSON body, or the events of an SSE stream: progress, then the result) is written as a line.
//! Notifications are sent in order before the next line is read; requests run side by side, so
//! a `notifications/cancelled` reaches the service while its call runs (and the bridge drops
//! that call's stream too, which cancels it on a stateless service). An HTTP failure of a
//! request becomes a JSON-RPC error for its id, so a client never waits for an answer that will
//! not come. At end of input the MCP session is deleted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{HeaderValue, Method, Request, StatusCode, header};
use futures::StreamExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

const USAGE: &str = "usage: daiv-sandbox mcp --url http://HOST:PORT/mcp [--key-file FILE]\n\
  Serves MCP on stdin/stdout, bridged to a running daiv-sandbox's /mcp endpoint.\n\
  The API key is read from FILE, else from DAIV_SANDBOX_API_KEY.";

/// Most bytes of one line read from the client.
const MAX_LINE_BYTES: usize = 64 * 1024 * 1024;

/// What [`read_line`] read.
enum Line {
    /// A line (its newline removed) is in the buffer.
    Message,
    /// Over [`MAX_LINE_BYTES`]: skipped up to its newline, never held whole.
    TooLong,
    End,
}

/// Reads the next line of `input` into `buf`, holding at most [`MAX_LINE_BYTES`] + 1 bytes of
/// it: a client cannot make the bridge buffer a line of any size before it is refused.
async fn read_line<R>(input: &mut R, buf: &mut Vec<u8>) -> std::io::Result<Line>
where
    R: tokio::io::AsyncBufRead + Unpin,
{
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    buf.clear();
    let cap = MAX_LINE_BYTES as u64 + 1;
    if (&mut *input).take(cap).read_until(b'\n', buf).await? == 0 {
        return Ok(Line::End);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
        return Ok(Line::Message);
    }
    if buf.len() <= MAX_LINE_BYTES {
        // The last line, without a newline.
        return Ok(Line::Message);
    }
    // Skip the rest of the line, a bounded chunk at a time.
    loop {
        buf.clear();
        let n = (&mut *input).take(64 * 1024).read_until(b'\n', buf).await?;
        if n == 0 || buf.last() == Some(&b'\n') {
            buf.clear();
            return Ok(Line::TooLong);
        }
    }
}

#[derive(Debug, PartialEq)]
pub struct Args {
    pub url: String,
    pub key: String,
}

/// The command line (after `mcp`) and the key it points to.
pub fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut url = None;
    let mut key_file = None;
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (a.clone(), None),
        };
        let mut value = || inline.clone().or_else(|| it.next());
        match name.as_str() {
            "--url" => url = Some(value().ok_or("--url needs a value")?),
            "--key-file" => key_file = Some(value().ok_or("--key-file needs a value")?),
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    let url = url.ok_or_else(|| format!("--url is required\n{USAGE}"))?;
    if !url.starts_with("http://") {
        return Err(format!(
            "--url must be an http:// URL of the service's /mcp (got {url:?}); for TLS, put \
             the stdio bridge next to the service or use an HTTP MCP client"
        ));
    }
    let key = match key_file {
        Some(f) => std::fs::read_to_string(&f)
            .map_err(|e| format!("--key-file {f}: {e}"))?
            .trim()
            .to_string(),
        None => std::env::var("DAIV_SANDBOX_API_KEY").unwrap_or_default(),
    };
    if key.is_empty() {
        return Err(format!(
            "no API key: give --key-file or set DAIV_SANDBOX_API_KEY\n{USAGE}"
        ));
    }
    Ok(Args { url, key })
}

/// The subcommand's entry point: its exit code.
pub async fn main(args: impl IntoIterator<Item = String>) -> i32 {
    let args = match parse_args(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("daiv-sandbox mcp: {e}");
            return 2;
        }
    };
    match bridge(args, tokio::io::stdin(), tokio::io::stdout()).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("daiv-sandbox mcp: {e}");
            1
        }
    }
}

/// What every request carries once the service has said it.
#[derive(Default)]
struct Negotiated {
    session: Option<HeaderValue>,
    version: Option<HeaderValue>,
}

struct Bridge {
    client: Client<HttpConnector, Body>,
    url: String,
    key: HeaderValue,
    negotiated: Mutex<Negotiated>,
    out: mpsc::Sender<String>,
}

/// Bridges `input` to the service at `args.url`, writing its messages to `output`.
pub async fn bridge(
    args: Args,
    input: impl tokio::io::AsyncRead + Unpin,
    output: impl tokio::io::AsyncWrite + Unpin + Send + 'static,
) -> Result<(), String> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector);
    let key = HeaderValue::from_str(&args.key).map_err(|_| "the API key is not a header value")?;
    let (out, mut out_rx) = mpsc::channel::<String>(64);
    let writer = tokio::spawn(async move {
        let mut output = output;
        while let Some(line) = out_rx.recv().await {
            if output.write_all(line.as_bytes()).await.is_err()
                || output.write_all(b"\n").await.is_err()
                || output.flush().await.is_err()
            {
                return;
            }
        }
    });
    let bridge = Arc::new(Bridge {
        client,
        url: args.url,
        key,
        negotiated: Mutex::new(Negotiated::default()),
        out,
    });
    let mut calls: HashMap<String, tokio::task::AbortHandle> = HashMap::new();
    let mut input = tokio::io::BufReader::new(input);
    let mut buf = Vec::new();
    loop {
        let line = match read_line(&mut input, &mut buf).await {
            Ok(Line::Message) => &buf[..],
            Ok(Line::End) => break,
            Ok(Line::TooLong) => {
                let why = format!("a message over {MAX_LINE_BYTES} bytes");
                let _ = bridge
                    .out
                    .send(error_line(&Value::Null, -32600, &why))
                    .await;
                continue;
            }
            Err(e) => return Err(format!("stdin: {e}")),
        };
        if line.trim_ascii().is_empty() {
            continue;
        }
        // JSON is UTF-8: a line that parses is one.
        let parsed = serde_json::from_slice::<Value>(line).and_then(|v| {
            let text = String::from_utf8(line.to_vec()).map_err(serde::de::Error::custom)?;
            Ok((v, text))
        });
        let (message, line) = match parsed {
            Ok(v) => v,
            Err(e) => {
                let _ = bridge
                    .out
                    .send(error_line(
                        &Value::Null,
                        -32700,
                        &format!("parse error: {e}"),
                    ))
                    .await;
                continue;
            }
        };
        calls.retain(|_, h| !h.is_finished());
        let id = message.get("id").cloned();
        let is_request = message.get("method").is_some() && id.is_some();
        if message.get("method").and_then(Value::as_str) == Some("notifications/cancelled")
            && let Some(target) = message.pointer("/params/requestId")
            && let Some(call) = calls.remove(&target.to_string())
        {
            // Forwarded too (a stateful service cancels by it); the dropped stream is what
            // cancels a stateless one.
            call.abort();
        }
        if is_request {
            let b = bridge.clone();
            let id = id.unwrap_or(Value::Null);
            let key = id.to_string();
            let task = tokio::spawn(async move { b.send(line, Some(id)).await });
            calls.insert(key, task.abort_handle());
        } else {
            // Notifications and responses, in order (e.g. `initialized` before any request).
            bridge.send(line, None).await;
        }
    }
    // The client is gone: so is its MCP session.
    let session = bridge
        .negotiated
        .lock()
        .map(|n| n.session.clone())
        .ok()
        .flatten();
    if let Some(session) = session {
        let mut req = Request::builder()
            .method(Method::DELETE)
            .uri(&bridge.url)
            .header(crate::auth::HEADER, bridge.key.clone())
            .header("mcp-session-id", session);
        if let Some(v) = bridge
            .negotiated
            .lock()
            .ok()
            .and_then(|n| n.version.clone())
        {
            req = req.header("mcp-protocol-version", v);
        }
        if let Ok(req) = req.body(Body::empty()) {
            let _ = bridge.client.request(req).await;
        }
    }
    for (_, call) in calls {
        call.abort();
    }
    drop(bridge);
    let _ = writer.await;
    Ok(())
}

impl Bridge {
    /// POSTs one message and writes what comes back; for a request (`id`), a failure is its
    /// JSON-RPC error.
    async fn send(&self, body: String, id: Option<Value>) {
        if let Err(e) = self.exchange(body, id.is_some()).await
            && let Some(id) = id
        {
            let _ = self.out.send(error_line(&id, -32603, &e)).await;
        }
    }

    async fn exchange(&self, body: String, is_request: bool) -> Result<(), String> {
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(&self.url)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream")
            .header(crate::auth::HEADER, self.key.clone());
        if let Ok(n) = self.negotiated.lock() {
            if let Some(s) = &n.session {
                req = req.header("mcp-session-id", s.clone());
            }
            if let Some(v) = &n.version {
                req = req.header("mcp-protocol-version", v.clone());
            }
        }
        let req = req
            .body(Body::from(body))
            .map_err(|e| format!("request: {e}"))?;
        let resp = self
            .client
            .request(req)
            .await
            .map_err(|e| format!("cannot reach the service at {}: {e}", self.url))?;
        let status = resp.status();
        if let Some(s) = resp.headers().get("mcp-session-id")
            && let Ok(mut n) = self.negotiated.lock()
        {
            n.session = Some(s.clone());
        }
        let is_sse = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let mut stream = Body::new(resp.into_body()).into_data_stream();
        if is_sse && status.is_success() {
            let mut events = SseEvents::default();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| format!("the service's stream broke: {e}"))?;
                for data in events.push(&chunk) {
                    self.forward(data).await;
                }
            }
            return Ok(());
        }
        let mut bytes = Vec::new();
        while let Some(chunk) = stream.next().await {
            bytes
                .extend_from_slice(&chunk.map_err(|e| format!("the service's answer broke: {e}"))?);
        }
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if status == StatusCode::ACCEPTED || (status.is_success() && text.trim().is_empty()) {
            return Ok(());
        }
        // A JSON-RPC message (a result, or an error the service worded) goes through as it is.
        if let Ok(v) = serde_json::from_str::<Value>(&text)
            && v.get("jsonrpc").is_some()
        {
            self.forward(text).await;
            return Ok(());
        }
        if !is_request && status.is_success() {
            return Ok(());
        }
        Err(format!(
            "the service answered HTTP {status}: {}",
            text.trim()
        ))
    }

    /// Writes one message, noting the protocol version an initialisation settled on.
    async fn forward(&self, data: String) {
        if let Ok(v) = serde_json::from_str::<Value>(&data)
            && let Some(version) = v.pointer("/result/protocolVersion").and_then(Value::as_str)
            && v.pointer("/result/serverInfo").is_some()
            && let Ok(version) = HeaderValue::from_str(version)
            && let Ok(mut n) = self.negotiated.lock()
        {
            n.version = Some(version);
        }
        let _ = self.out.send(data).await;
    }
}

fn error_line(id: &Value, code: i64, message: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}).to_string()
}

/// The `data` of each event of a `text/event-stream`, as the bytes arrive.
#[derive(Default)]
pub struct SseEvents {
    buf: Vec<u8>,
}

impl SseEvents {
    pub fn push(&mut self, chunk: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        loop {
            let text = &self.buf;
            let end = find(text, b"\n\n")
                .map(|i| (i, 2))
                .into_iter()
                .chain(find(text, b"\r\n\r\n").map(|i| (i, 4)))
                .min_by_key(|(i, _)| *i);
            let Some((at, sep)) = end else { break };
            let event: Vec<u8> = self.buf.drain(..at + sep).collect();
            let event = String::from_utf8_lossy(&event[..at]).into_owned();
            let data: Vec<&str> = event
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            let data = data.join("\n");
            if !data.trim().is_empty() {
                out.push(data);
            }
        }
        out
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_are_split_as_they_arrive() {
        let mut e = SseEvents::default();
        assert!(e.push(b"id: 0\nretry: 3000\ndata:\n\n").is_empty());
        assert!(e.push(b"data: {\"a\"").is_empty());
        assert_eq!(e.push(b":1}\n\ndata: {}\r\n\r\n"), vec!["{\"a\":1}", "{}"]);
    }

    #[test]
    fn arguments_need_an_http_url_and_a_key() {
        assert!(parse_args(["--key-file".into(), "/nonexistent".into()]).is_err());
        assert!(parse_args(["--url".into(), "https://x/mcp".into()]).is_err());
        assert!(parse_args(["--bogus".into()]).is_err());
        let dir = std::env::temp_dir().join(format!("mcp-key-{}", std::process::id()));
        std::fs::write(&dir, "k3y\n").expect("write the key");
        let a = parse_args([
            "--url=http://127.0.0.1:1/mcp".to_string(),
            "--key-file".to_string(),
            dir.display().to_string(),
        ])
        .expect("valid");
        assert_eq!(a.key, "k3y");
        let _ = std::fs::remove_file(dir);
    }
}
