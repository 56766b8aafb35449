//! Fakes for the operations tests: a Sentry ingestion endpoint that records envelopes, and a
//! Docker API endpoint that answers health probes but fails everything else (a deterministic
//! engine error behind a 5xx). Both are minimal HTTP/1.1 servers on loopback; every response
//! closes its connection, so no client ever reuses a half-read one.
//!
//! Also extends [`ControlPlane`] with what these tests need beyond `DAIV_SANDBOX_*` settings:
//! extra process environment (`DOCKER_HOST`) and a graceful stop (SIGTERM), after which every
//! report the service queued has been flushed.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use crate::ControlPlane;

/// One request as the fake server saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

type Responder = dyn Fn(&Recorded) -> (u16, &'static str, String) + Send + Sync;

/// A loopback HTTP server that records every request and answers with `respond`.
pub struct FakeHttp {
    pub port: u16,
    seen: Arc<Mutex<Vec<Recorded>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeHttp {
    pub async fn start(
        respond: impl Fn(&Recorded) -> (u16, &'static str, String) + Send + Sync + 'static,
    ) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let respond: Arc<Responder> = Arc::new(respond);
        let log = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let log = log.clone();
                let respond = respond.clone();
                tokio::spawn(async move {
                    let _ = serve_one(conn, log, respond).await;
                });
            }
        });
        Ok(Self { port, seen, task })
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.seen.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

impl Drop for FakeHttp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve_one(
    conn: tokio::net::TcpStream,
    log: Arc<Mutex<Vec<Recorded>>>,
    respond: Arc<Responder>,
) -> Result<()> {
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    reader.read_line(&mut line).await?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let path = parts.next().unwrap_or_default().to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).await? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
        if let Some((k, v)) = h.trim_end().split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if let Some(len) = header("content-length").and_then(|l| l.parse::<usize>().ok()) {
        body.resize(len, 0);
        reader.read_exact(&mut body).await?;
    } else if header("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).await?;
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            let mut chunk = vec![0; n + 2];
            reader.read_exact(&mut chunk).await?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    }
    let req = Recorded {
        method,
        path,
        headers,
        body,
    };
    let (status, content_type, text) = respond(&req);
    if let Ok(mut v) = log.lock() {
        v.push(req);
    }
    let mut conn = reader.into_inner();
    let head = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        text.len()
    );
    conn.write_all(head.as_bytes()).await?;
    conn.write_all(text.as_bytes()).await?;
    conn.shutdown().await?;
    Ok(())
}

/// A Sentry ingestion endpoint: accepts every envelope.
pub struct FakeSentry {
    http: FakeHttp,
}

impl FakeSentry {
    pub async fn start() -> Result<Self> {
        let http = FakeHttp::start(|_| (200, "application/json", "{}".to_string())).await?;
        Ok(Self { http })
    }

    /// The DSN for project 1 on this server.
    pub fn dsn(&self) -> String {
        format!("http://publickey@127.0.0.1:{}/1", self.http.port)
    }

    /// Every envelope received, raw (as sent over the wire).
    pub fn envelopes(&self) -> Vec<Recorded> {
        self.http.requests()
    }

    /// The `event` items of every envelope, parsed.
    pub fn events(&self) -> Vec<Value> {
        let mut events = Vec::new();
        for env in self.envelopes() {
            let text = String::from_utf8_lossy(&env.body).into_owned();
            let mut lines = text.lines().skip(1); // envelope header
            while let Some(item_header) = lines.next() {
                let Ok(h) = serde_json::from_str::<Value>(item_header) else {
                    continue;
                };
                let Some(payload) = lines.next() else { break };
                if h["type"] == "event"
                    && let Ok(v) = serde_json::from_str::<Value>(payload)
                {
                    events.push(v);
                }
            }
        }
        events
    }

    /// Waits (bounded) until at least `n` events arrived.
    pub async fn wait_for_events(&self, n: usize, within: Duration) -> Result<Vec<Value>> {
        let deadline = Instant::now() + within;
        loop {
            let events = self.events();
            if events.len() >= n {
                return Ok(events);
            }
            if Instant::now() > deadline {
                bail!(
                    "{} event(s) after {within:?}, wanted {n}; envelopes: {:?}",
                    events.len(),
                    self.envelopes().len()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A Docker API that is up (`/_ping`, `/version`) but fails every other call with a 500.
pub async fn failing_docker() -> Result<FakeHttp> {
    FakeHttp::start(|req| {
        let path = req.path.split('?').next().unwrap_or_default();
        if path.ends_with("/_ping") {
            (200, "text/plain", "OK".to_string())
        } else if path.ends_with("/version") {
            (
                200,
                "application/json",
                r#"{"ApiVersion":"1.41","MinAPIVersion":"1.12","Version":"20.10.24"}"#.to_string(),
            )
        } else {
            (
                500,
                "application/json",
                r#"{"message":"fake engine failure"}"#.to_string(),
            )
        }
    })
    .await
}

impl ControlPlane {
    /// SIGTERM, then waits for the process to exit: a graceful shutdown, which flushes queued
    /// error reports. Returns whether it exited successfully.
    pub fn terminate(&mut self) -> Result<bool> {
        let pid = self.child.id().to_string();
        Command::new("kill")
            .args(["-TERM", &pid])
            .stdout(Stdio::null())
            .status()
            .context("kill -TERM")?;
        let status = self.child.wait().context("wait for the service")?;
        Ok(status.success())
    }
}
