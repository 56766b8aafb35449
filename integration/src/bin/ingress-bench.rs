//! ingress-bench: what reaching a server inside a sandbox through the service costs, beside the
//! same requests sent from inside the sandbox, in one run.
//!
//! ```text
//! ingress-bench --base http://127.0.0.1:8000 --key KEY [--image daiv-sandbox-debian:local]
//!               [--n 200] [--gib 1] [--pid PID]
//! ```
//! One session of `--image` (it needs python3) runs a small threaded HTTP server on its own
//! loopback (`GET /small`: 2 bytes; `GET /bytes/N`; `PUT`: read and counted) and a TCP echo
//! server beside it. Phases:
//! 1. `inside`: `GET /small` on a new connection each, timed by python inside the sandbox (the
//!    floor: the server's own cost);
//! 2. `relay`: the same request through `/session/{id}/ports/{port}/small` (the service's
//!    keep-alive connection; a new connection to the port each, as the relay opens one per
//!    request), interleaved with nothing else;
//! 3. `download` and `upload`: `--gib` GiB through the relay, MB/s; with `--pid` (the service's),
//!    its VmRSS sampled every 20 ms during each transfer (the peak reported);
//! 4. `slow reader`: 256 MiB read at about 8 MB/s for 3 s, the service's peak VmRSS (flat: the
//!    relay holds at most its window per connection);
//! 5. `websocket echo`: 1,000 messages of 32 bytes through raw TCP over a WebSocket
//!    (`/ports/{port}/tcp`) to the echo server, each waited for: p50 per message.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use integration::cp::{Client, rss_kib};
use serde_json::json;

#[derive(clap::Parser, Debug)]
#[command(about = "Ingress through the service against the same requests inside the sandbox")]
struct Args {
    #[arg(long)]
    base: String,
    #[arg(long, env = "DAIV_SANDBOX_API_KEY", hide_env_values = true)]
    key: String,
    #[arg(long, default_value = "daiv-sandbox-debian:local")]
    image: String,
    #[arg(long, default_value_t = 200)]
    n: usize,
    /// GiB moved each way.
    #[arg(long, default_value_t = 1)]
    gib: u64,
    /// The service's pid, to sample its memory.
    #[arg(long)]
    pid: Option<u32>,
}

const PORT: u16 = 8790;

const SERVER: &str = r#"
import http.server, socketserver, socket, sys, threading
PORT = int(sys.argv[1])
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        if self.path.startswith("/bytes/"):
            n = int(self.path[7:])
            self.send_response(200); self.send_header("Content-Length", str(n)); self.end_headers()
            chunk = b"x" * 262144
            while n > 0:
                k = min(n, len(chunk)); self.wfile.write(chunk[:k] if k < len(chunk) else chunk); n -= k
        else:
            self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers()
            self.wfile.write(b"ok")
    def do_PUT(self):
        n = int(self.headers.get("Content-Length", "0")); left = n
        while left > 0:
            d = self.rfile.read(min(left, 1 << 20))
            if not d: break
            left -= len(d)
        body = str(n - left).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
def echo():
    srv = socket.create_server(("127.0.0.1", PORT + 1))
    while True:
        c, _ = srv.accept()
        def h(c):
            while True:
                d = c.recv(65536)
                if not d: break
                c.sendall(d)
            c.close()
        threading.Thread(target=h, args=(c,), daemon=True).start()
threading.Thread(target=echo, daemon=True).start()
S(("127.0.0.1", PORT), H).serve_forever()
"#;

const INSIDE: &str = r#"
import http.client, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
ts = []
for i in range(n + 5):
    t = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port); c.request("GET", "/small")
    r = c.getresponse(); r.read(); c.close()
    if i >= 5: ts.append((time.perf_counter() - t) * 1000)
print(" ".join("%.4f" % x for x in ts))
"#;

/// `/api/v1/session/{id}/ports/{port}/{rest}` on `b`.
fn port_url(b: &Client, id: &str, port: u16, rest: &str) -> String {
    format!("{}/session/{id}/ports/{port}/{rest}", b.api)
}

/// The output of one command run in the session (an error if it fails).
async fn sh(b: &Client, id: &str, command: &str) -> Result<String> {
    let v = b.run_ok(id, &[command]).await?;
    Ok(v["results"][0]["output"].as_str().unwrap_or("").to_string())
}

/// Samples `pid`'s VmRSS (KiB) every 20 ms while `running`; the peak.
fn sample_rss(pid: Option<u32>, running: Arc<AtomicBool>) -> Arc<AtomicU64> {
    let peak = Arc::new(AtomicU64::new(0));
    let Some(pid) = pid else { return peak };
    let out = peak.clone();
    tokio::spawn(async move {
        while running.load(Ordering::Relaxed) {
            if let Some(kib) = rss_kib(pid, "VmRSS:") {
                out.fetch_max(kib, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    peak
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

#[tokio::main]
async fn main() -> Result<()> {
    let a = <Args as clap::Parser>::parse();
    let b = Client::new(&a.base, &a.key, Duration::from_secs(600))?;
    let id = b.create(&a.image).await?;
    let result = run(&a, &b, &id).await;
    let _ = b.delete(&id, true).await;
    result
}

async fn run(a: &Args, b: &Client, id: &str) -> Result<()> {
    use base64::Engine;
    let enc = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    sh(
        b,
        id,
        &format!(
            "echo {} | base64 -d > /tmp/server.py && echo {} | base64 -d > /tmp/inside.py",
            enc(SERVER),
            enc(INSIDE)
        ),
    )
    .await?;
    b.post(
        &format!("/session/{id}/processes/"),
        json!({ "command": format!("python3 /tmp/server.py {PORT}") }),
    )
    .await?;
    let small = port_url(b, id, PORT, "small");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = b.http.get(&small).header("X-API-Key", &b.key).send().await;
        if r.is_ok_and(|r| r.status() == 200) {
            break;
        }
        if Instant::now() > deadline {
            bail!("the server in the sandbox did not answer");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut report = Vec::new();

    // 1 and 2: the small request, inside and through the relay.
    let out = sh(b, id, &format!("python3 /tmp/inside.py {PORT} {}", a.n)).await?;
    let mut inside: Vec<f64> = out
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    let mut relay = Vec::new();
    for i in 0..a.n + 5 {
        let t = Instant::now();
        let r = b
            .http
            .get(&small)
            .header("X-API-Key", &b.key)
            .send()
            .await?;
        let _ = r.bytes().await?;
        if i >= 5 {
            relay.push(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    inside.sort_by(f64::total_cmp);
    relay.sort_by(f64::total_cmp);
    println!("{:<22} {:>6} {:>9} {:>9}", "phase", "n", "p50 ms", "p90 ms");
    for (name, v) in [
        ("small GET inside", &inside),
        ("small GET via relay", &relay),
    ] {
        println!(
            "{:<22} {:>6} {:>9.3} {:>9.3}",
            name,
            v.len(),
            pct(v, 0.5),
            pct(v, 0.9)
        );
        report.push(
            json!({"phase": name, "n": v.len(), "p50_ms": pct(v, 0.5), "p90_ms": pct(v, 0.9)}),
        );
    }
    println!(
        "relay over inside, p50: {:+.3} ms",
        pct(&relay, 0.5) - pct(&inside, 0.5)
    );

    // 3: a GiB each way.
    let bytes = a.gib * 1024 * 1024 * 1024;
    let idle_rss = a.pid.and_then(|p| rss_kib(p, "VmRSS:"));
    let running = Arc::new(AtomicBool::new(true));
    let peak = sample_rss(a.pid, running.clone());
    let t = Instant::now();
    let r = b
        .http
        .get(port_url(b, id, PORT, &format!("bytes/{bytes}")))
        .header("X-API-Key", &b.key)
        .send()
        .await?;
    let mut got = 0u64;
    let mut body = r.bytes_stream();
    while let Some(c) = body.next().await {
        got += c?.len() as u64;
    }
    let down = t.elapsed();
    running.store(false, Ordering::Relaxed);
    if got != bytes {
        bail!("downloaded {got} of {bytes} bytes");
    }
    let down_peak = peak.load(Ordering::Relaxed);

    let running = Arc::new(AtomicBool::new(true));
    let peak = sample_rss(a.pid, running.clone());
    let chunk = bytes::Bytes::from(vec![b'y'; 256 * 1024]);
    let pieces = bytes.div_ceil(chunk.len() as u64);
    let stream = futures::stream::iter((0..pieces).map(move |i| {
        let left = bytes - i * chunk.len() as u64;
        Ok::<_, std::io::Error>(chunk.slice(..(left.min(chunk.len() as u64) as usize)))
    }));
    let t = Instant::now();
    let r = b
        .http
        .put(port_url(b, id, PORT, "upload"))
        .header("X-API-Key", &b.key)
        .header("Content-Length", bytes.to_string())
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await?;
    let echoed: u64 = r.text().await?.trim().parse().unwrap_or(0);
    let up = t.elapsed();
    running.store(false, Ordering::Relaxed);
    if echoed != bytes {
        bail!("the server read {echoed} of {bytes} bytes");
    }
    let up_peak = peak.load(Ordering::Relaxed);
    let mbps = |d: Duration| bytes as f64 / 1e6 / d.as_secs_f64();
    println!(
        "download {} GiB: {:.0} MB/s; upload: {:.0} MB/s",
        a.gib,
        mbps(down),
        mbps(up)
    );
    if let Some(idle) = idle_rss {
        println!(
            "service VmRSS: {:.1} MiB before, peak {:.1} MiB downloading, {:.1} MiB uploading",
            idle as f64 / 1024.0,
            down_peak as f64 / 1024.0,
            up_peak as f64 / 1024.0
        );
    }
    report.push(json!({"phase": "download", "mb_s": mbps(down), "peak_rss_kib": down_peak}));
    report.push(json!({"phase": "upload", "mb_s": mbps(up), "peak_rss_kib": up_peak}));

    // 4: a slow reader.
    let running = Arc::new(AtomicBool::new(true));
    let peak = sample_rss(a.pid, running.clone());
    let r = b
        .http
        .get(port_url(b, id, PORT, &format!("bytes/{}", 256u64 << 20)))
        .header("X-API-Key", &b.key)
        .send()
        .await?;
    let mut body = r.bytes_stream();
    let t = Instant::now();
    let mut slow = 0u64;
    while t.elapsed() < Duration::from_secs(3) {
        match body.next().await {
            Some(c) => slow += c?.len() as u64,
            None => break,
        }
        tokio::time::sleep(Duration::from_millis(8)).await;
    }
    drop(body);
    running.store(false, Ordering::Relaxed);
    let slow_peak = peak.load(Ordering::Relaxed);
    println!(
        "slow reader: {:.1} MB in 3 s, service peak VmRSS {:.1} MiB",
        slow as f64 / 1e6,
        slow_peak as f64 / 1024.0
    );
    report.push(json!({"phase": "slow reader", "bytes": slow, "peak_rss_kib": slow_peak}));

    // 5: WebSocket echo over raw TCP.
    let ws_url = port_url(b, id, PORT + 1, "tcp").replacen("http://", "ws://", 1);
    let mut req =
        tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(ws_url)?;
    req.headers_mut().insert("x-api-key", b.key.parse()?);
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await?;
    use futures::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    let mut per = Vec::new();
    for i in 0..1005 {
        let t = Instant::now();
        ws.send(Message::Binary(vec![b'z'; 32].into())).await?;
        let mut n = 0;
        while n < 32 {
            match ws.next().await.context("the socket closed")?? {
                Message::Binary(b) => n += b.len(),
                _ => continue,
            }
        }
        if i >= 5 {
            per.push(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    let _ = ws.close(None).await;
    per.sort_by(f64::total_cmp);
    println!(
        "websocket echo x{}: p50 {:.3} ms, p90 {:.3} ms",
        per.len(),
        pct(&per, 0.5),
        pct(&per, 0.9)
    );
    report.push(json!({"phase": "websocket echo", "n": per.len(), "p50_ms": pct(&per, 0.5), "p90_ms": pct(&per, 0.9)}));
    println!("{}", json!({ "phases": report }));
    Ok(())
}
