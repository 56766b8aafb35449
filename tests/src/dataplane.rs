//! The data plane's scenarios (issue 35), each over a service and a session id, so the same
//! checks run on this machine's engine and on a fleet's remote one with egress on: a large file
//! up and down with the service's memory sampled, a process's stdout and stderr apart, a watch
//! seeing a thousand creates, and a real terminal over the WebSocket.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use futures::{SinkExt, StreamExt};
use reqwest::Method;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::ControlPlane;

/// The unit a test file is written and compared in.
pub const CHUNK: usize = 1024 * 1024;

/// Chunk `i` of a test file: its index in every 8 bytes, so any misplaced byte shows.
pub fn chunk(i: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(CHUNK);
    while v.len() < CHUNK {
        v.extend_from_slice(&i.to_le_bytes());
    }
    v
}

/// The service's resident memory around a transfer (KiB).
#[derive(Debug, Clone, Copy)]
pub struct Transfer {
    pub before_kib: u64,
    pub up_peak_kib: u64,
    pub down_peak_kib: u64,
    pub up: Duration,
    pub down: Duration,
}

/// Samples process `pid`'s resident memory every 50 ms until `stop`; the peak (KiB).
fn sample(pid: u32, stop: Arc<AtomicBool>) -> (Arc<AtomicU64>, std::thread::JoinHandle<()>) {
    let peak = Arc::new(AtomicU64::new(0));
    let p = peak.clone();
    let t = std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status"))
                && let Some(kib) = s
                    .lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|v| v.parse::<u64>().ok())
            {
                p.fetch_max(kib, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    (peak, t)
}

/// `PUT` then `GET` a file of `mib` MiB at `path` in session `sid`, streamed both ways and
/// compared chunk by chunk, with the service's memory sampled throughout.
pub async fn round_trip(cp: &ControlPlane, sid: &str, path: &str, mib: u64) -> Result<Transfer> {
    let route = format!("/session/{sid}/files?path={path}");
    let size = mib * CHUNK as u64;
    let before_kib = cp.rss_kib().unwrap_or(0);
    let stop = Arc::new(AtomicBool::new(false));
    let (peak, sampler) = sample(cp.pid(), stop.clone());

    let t = std::time::Instant::now();
    let body = futures::stream::iter((0..mib).map(|i| Ok::<_, std::io::Error>(chunk(i))));
    let r = cp
        .request(Method::PUT, &route)
        .header("content-length", size.to_string())
        .body(reqwest::Body::wrap_stream(body))
        .send()
        .await?;
    let status = r.status().as_u16();
    let text = r.text().await?;
    ensure!(status == 200, "PUT: {status} {text}");
    let up = t.elapsed();
    let up_peak_kib = peak.swap(0, Ordering::Relaxed);

    let t = std::time::Instant::now();
    let r = cp.request(Method::GET, &route).send().await?;
    ensure!(r.status().as_u16() == 200, "GET: {}", r.status());
    ensure!(r.content_length() == Some(size), "{:?}", r.content_length());
    let mut stream = r.bytes_stream();
    let (mut at, mut pending) = (0u64, Vec::new());
    while let Some(b) = stream.next().await {
        pending.extend_from_slice(&b?);
        while pending.len() >= CHUNK {
            let rest = pending.split_off(CHUNK);
            ensure!(pending == chunk(at), "chunk {at} differs");
            pending = rest;
            at += 1;
        }
    }
    ensure!(
        at == mib && pending.is_empty(),
        "{at} chunks, {} bytes over",
        pending.len()
    );
    let down = t.elapsed();
    let down_peak_kib = peak.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    Ok(Transfer {
        before_kib,
        up_peak_kib,
        down_peak_kib,
        up,
        down,
    })
}

/// Lines of an NDJSON stream as they come.
pub struct Lines {
    body: futures::stream::BoxStream<'static, reqwest::Result<Vec<u8>>>,
    buf: Vec<u8>,
}

impl Lines {
    pub fn of(resp: reqwest::Response) -> Self {
        Lines {
            body: resp.bytes_stream().map(|r| r.map(|b| b.to_vec())).boxed(),
            buf: Vec::new(),
        }
    }

    /// The next line, `None` at the end of the stream; an error after 30 s without one.
    pub async fn next(&mut self) -> Result<Option<Value>> {
        loop {
            if let Some(nl) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=nl).collect();
                return Ok(Some(serde_json::from_slice(&line[..nl])?));
            }
            match tokio::time::timeout(Duration::from_secs(30), self.body.next()).await {
                Ok(Some(chunk)) => self.buf.extend_from_slice(&chunk?),
                Ok(None) => return Ok(None),
                Err(_) => bail!("no line in 30 s"),
            }
        }
    }
}

/// `GET /session/{sid}/watch?{query}`: its status and its lines.
pub async fn watch(cp: &ControlPlane, sid: &str, query: &str) -> Result<(u16, Lines)> {
    let resp = cp
        .request(Method::GET, &format!("/session/{sid}/watch?{query}"))
        .send()
        .await?;
    Ok((resp.status().as_u16(), Lines::of(resp)))
}

/// Runs one command in session `sid`; its exit code and output.
async fn sh(cp: &ControlPlane, sid: &str, command: &str) -> Result<(i64, String)> {
    let r = cp.api().sh(sid, command).await?;
    Ok((r.exit_code, r.output))
}

/// A recursive watch on `dir` (made empty first, with a subdirectory `old`), armed before a
/// command creates 1,000 files, a directory with a file in it and a file in `old`: every create
/// is seen, none lost.
pub async fn a_watch_sees_a_thousand_creates(
    cp: &ControlPlane,
    sid: &str,
    dir: &str,
) -> Result<()> {
    let (code, out) = sh(cp, sid, &format!("rm -rf {dir} && mkdir -p {dir}/old")).await?;
    ensure!(code == 0, "{out}");
    let (status, mut lines) = watch(cp, sid, &format!("path={dir}&recursive=true")).await?;
    ensure!(status == 200, "watch: {status}");
    let armed = lines.next().await?.unwrap_or_default();
    ensure!(armed["type"] == "armed" && armed["watches"] == 2, "{armed}");
    let (code, out) = sh(
        cp,
        sid,
        &format!(
            "cd {dir} && i=0; while [ $i -lt 1000 ]; do : > f$i; i=$((i+1)); done; \
             mkdir sub && echo hi > sub/x && echo more >> old/y"
        ),
    )
    .await?;
    ensure!(code == 0, "{out}");
    let mut seen = std::collections::BTreeSet::new();
    let want = |p: &str| {
        p.strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with("/f") || rest == "/sub/x" || rest == "/old/y")
    };
    while seen.len() < 1002 {
        let Some(l) = lines.next().await? else {
            bail!("the stream ended after {} creates", seen.len());
        };
        ensure!(
            l["type"] != "overflow",
            "changes lost after {} creates",
            seen.len()
        );
        let path = l["path"].as_str().unwrap_or_default().to_string();
        if l["type"] == "create" && want(&path) {
            ensure!(l["entry"]["path"] == path, "{l}");
            ensure!(seen.insert(path), "{l} seen twice");
        }
    }
    Ok(())
}

/// A process started as `sh -c 'echo a; echo b >&2'` (under the client's id `pid`): its event
/// stream carries stdout and stderr apart, then its end with exit code 0.
pub async fn a_process_keeps_its_streams_apart(
    cp: &ControlPlane,
    sid: &str,
    pid: &str,
) -> Result<()> {
    let body = json!({"command": "sh -c 'echo a; echo b >&2; echo c'", "process_id": pid});
    let (status, r) = cp
        .call(
            Method::POST,
            &format!("/session/{sid}/processes/"),
            Some(body),
        )
        .await?;
    ensure!(status == 201, "start: {status} {r}");
    let resp = cp
        .request(
            Method::GET,
            &format!("/session/{sid}/processes/{pid}/events?follow=true"),
        )
        .send()
        .await?;
    ensure!(resp.status().as_u16() == 200, "events: {}", resp.status());
    let mut lines = Lines::of(resp);
    let (mut out, mut err, mut seqs) = (String::new(), String::new(), Vec::new());
    let end = loop {
        let Some(e) = lines.next().await? else {
            bail!("the events ended without an end: {out:?} {err:?}");
        };
        seqs.push(e["seq"].as_u64().context("no seq")?);
        match e["type"].as_str() {
            Some("stdout") => out.push_str(e["data"].as_str().unwrap_or_default()),
            Some("stderr") => err.push_str(e["data"].as_str().unwrap_or_default()),
            Some("end") => break e,
            _ => {}
        }
    };
    ensure!(
        (out.as_str(), err.as_str()) == ("a\nc\n", "b\n"),
        "{out:?} {err:?}"
    );
    ensure!(end["exit_code"] == 0, "{end}");
    ensure!(seqs.windows(2).all(|w| w[1] > w[0]), "{seqs:?}");
    Ok(())
}

/// Reads the terminal `ws` until it has shown `want`; what it showed.
async fn until<S>(ws: &mut S, seen: &mut Vec<u8>, want: &str) -> Result<String>
where
    S: futures::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    while !String::from_utf8_lossy(seen).contains(want) {
        match tokio::time::timeout(Duration::from_secs(20), ws.next()).await {
            Ok(Some(Ok(Message::Binary(b)))) => seen.extend_from_slice(&b),
            Ok(Some(Ok(_))) => {}
            other => bail!(
                "{want:?} not shown: {other:?}; shown {:?}",
                String::from_utf8_lossy(seen)
            ),
        }
    }
    Ok(String::from_utf8_lossy(seen).into_owned())
}

/// A terminal over the WebSocket, driven as a person would: an interactive `bash` (a Debian
/// session) with its size, line editing, a full-screen program (`top`) drawn and quit, a file
/// written in `vi`; a reconnect replays from `since=0`, and the socket closes (1000) when the
/// shell exits. `gvisor`: Debian's runsc refuses `top`'s terminal set-up (documented in
/// docs/api/processes.md); the terminal must stay usable after it.
pub async fn a_terminal_over_a_websocket(cp: &ControlPlane, sid: &str, gvisor: bool) -> Result<()> {
    let body =
        json!({"command": "bash --norc -i", "process_id": "tty", "pty": {"cols": 80, "rows": 24}});
    let (status, r) = cp
        .call(
            Method::POST,
            &format!("/session/{sid}/processes/"),
            Some(body),
        )
        .await?;
    ensure!(status == 201, "start: {status} {r}");
    let connect = |since: &str| {
        let url = cp
            .url(&format!("/session/{sid}/processes/tty/pty?{since}"))
            .replacen("http://", "ws://", 1);
        let key = cp.key.clone();
        async move {
            let mut req = url.into_client_request()?;
            req.headers_mut().insert("X-API-Key", key.parse()?);
            let (ws, _) = tokio_tungstenite::connect_async(req).await?;
            anyhow::Ok(ws)
        }
    };
    let mut ws = connect("since=0").await?;
    ws.send(Message::Binary("echo hi-$((40+2)); stty size\n".into()))
        .await?;
    let mut seen = Vec::new();
    until(&mut ws, &mut seen, "hi-42").await?;
    until(&mut ws, &mut seen, "24 80").await?;
    // Line editing: a typo rubbed out with backspace before Enter.
    ws.send(Message::Binary("echo abX\x7fd\n".into())).await?;
    until(&mut ws, &mut seen, "abd\r\n").await?;
    // A full-screen program: drawn (its header), then quit with its key.
    ws.send(Message::Binary("top\n".into())).await?;
    let want = if gvisor {
        "failed tty set"
    } else {
        "load average"
    };
    until(&mut ws, &mut seen, want).await?;
    if !gvisor {
        ws.send(Message::Binary("q".into())).await?;
    }
    ws.send(Message::Binary("echo back-$((1+1))\n".into()))
        .await?;
    until(&mut ws, &mut seen, "back-2").await?;
    // An editor: a file opened, text typed in insert mode, written and quit with `:wq`.
    ws.send(Message::Binary("vi /tmp/note.txt\n".into()))
        .await?;
    until(&mut ws, &mut seen, "note.txt\"").await?;
    ws.send(Message::Binary("ihello-\x1b:wq\r".into())).await?;
    // Typed before vi has quit, the next line would be vi's input (a loaded machine shows it).
    until(&mut ws, &mut seen, "written").await?;
    ws.send(Message::Binary(
        "echo \"[$(cat /tmp/note.txt)vi]\"\n".into(),
    ))
    .await?;
    until(&mut ws, &mut seen, "[hello-vi]").await?;
    drop(ws);
    // A reconnect from the start replays what the terminal showed.
    let mut ws = connect("since=0").await?;
    until(&mut ws, &mut Vec::new(), "hi-42").await?;
    ws.send(Message::Text("exit\n".into())).await?;
    let closed = loop {
        match tokio::time::timeout(Duration::from_secs(20), ws.next()).await {
            Ok(Some(Ok(Message::Close(frame)))) => break frame,
            Ok(Some(Ok(_))) => {}
            other => bail!("no close frame: {other:?}"),
        }
    };
    ensure!(
        closed.as_ref().map(|f| u16::from(f.code)) == Some(1000),
        "{closed:?}"
    );
    Ok(())
}
