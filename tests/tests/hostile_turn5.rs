//! A hostile pass over what the earlier ones left (issue 41, item 8), each test the property that
//! held, asserted so that it fails if the protection goes:
//!
//! - process event streams and streaming runs whose client stops reading while the process
//!   prints hundreds of MiB: the service's memory stays flat, the stream ends rather than grows,
//!   its resume says 410, and the session keeps answering;
//! - a recursive watch raced by a sandbox swapping directories for symlinks to the service
//!   directory (absolute, relative, through `/proc/self/root`): never armed on it under another
//!   name, never an entry of it reported;
//! - E2B network rules on an egress sandbox, changed live: the injected header reaches only the
//!   host the rule names (not another host by `Host`, SNI, address or alias), and after an update
//!   neither the old nor the new secret travels on a connection opened before it;
//! - the MCP stdio bridge fed malformed lines, a key inside a malformed line and a message over
//!   the service's body cap: one JSON-RPC error per line, the bridge lives on, the key is never
//!   written;
//! - snapshot caps under gVisor: a workspace of metadata only (headers the archive counts) and a
//!   file growing through the freeze are refused or kept under the cap.
//!
//! What broke is in the tests marked `#[ignore = "finding: ..."]` (they fail on today's code):
//! the stdio bridge buffers a whole line before its 64 MiB check, and a writable layer of empty
//! directories is measured as 0 bytes, so a snapshot past the cap on the host's disk is taken.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use e2e::dataplane::{Lines, watch};
use e2e::egress::{ECHO_SERVER, EgressStack, Upstream};
use e2e::{
    BUSYBOX, ControlPlane, DEBIAN, DeploymentGuard, Session, docker, eventually, free_port,
    require_image,
};
use reqwest::Method;
use serde_json::{Value, json};

const MIB: u64 = 1024 * 1024;

// === helpers ===

use integration::cp::rss_kib as status_kib;

/// Samples a process's resident memory every 50 ms; the peak seen (KiB).
struct Sampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(pid: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(0));
        let (s, p) = (stop.clone(), peak.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Some(kib) = status_kib(pid, "VmRSS:") {
                    p.fetch_max(kib, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Self {
            stop,
            peak,
            thread: Some(thread),
        }
    }

    fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs `command` in the session; its output, insisting on exit code 0.
async fn sh_ok(cp: &ControlPlane, s: &Session, command: &str) -> Result<String> {
    let (code, out) = cp.sh(s, command).await?;
    ensure!(code == 0, "{command}: exit {code}: {out}");
    Ok(out)
}

/// Whether process `pid` of session `s` still runs (from the list).
async fn running(cp: &ControlPlane, s: &Session, pid: &str) -> Result<Option<bool>> {
    let (st, list) = cp
        .call(Method::GET, &format!("/session/{}/processes/", s.id), None)
        .await?;
    ensure!(st == 200, "list: {st} {list}");
    Ok(list["processes"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["process_id"] == pid))
        .map(|p| p["running"] == true))
}

async fn start_process(cp: &ControlPlane, s: &Session, id: &str, command: &str) -> Result<()> {
    let (st, b) = cp
        .call(
            Method::POST,
            &format!("/session/{}/processes/", s.id),
            Some(json!({ "command": command, "process_id": id })),
        )
        .await?;
    ensure!(st == 201, "start {id}: {st} {b}");
    Ok(())
}

/// Waits until process `pid` has ended (polled every 100 ms, at most 240 s).
async fn ended(cp: &ControlPlane, s: &Session, pid: &str) -> Result<()> {
    eventually(
        &format!("process {pid} ends"),
        Duration::from_secs(240),
        || async { Ok(running(cp, s, pid).await?.filter(|r| !r).map(|_| ())) },
    )
    .await
}

/// A line `yes` prints, 64 bytes with its newline.
const FLOOD_LINE: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde";

// === 1. process event streams and slow readers ===

/// A process prints 256 MiB while the client of its followed event stream reads nothing, then
/// a streaming run prints 256 MiB to a client that reads nothing: the service's resident memory
/// grows by far less than either (the follower takes one bounded round at a time, the run's
/// output is capped), the session answers other requests meanwhile, the event stream ends by
/// itself once its next events left the process's buffer (never a silent gap: it delivered a
/// few MiB at most), and a resume from its last `seq` is a 410.
#[tokio::test]
async fn slow_readers_of_event_streams_and_streaming_runs_cost_no_memory() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start().await?;
    let s = cp.session_of(BUSYBOX).await?;
    let flood = 256 * MIB;
    start_process(
        &cp,
        &s,
        "flood",
        &format!(
            "i=0; while [ ! -e /tmp/go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; \
             yes {FLOOD_LINE} | head -c {flood}"
        ),
    )
    .await?;
    let events = format!("/session/{}/processes/flood/events?follow=true", s.id);
    let resp = cp.request(Method::GET, &events).send().await?;
    ensure!(resp.status().as_u16() == 200, "events: {}", resp.status());
    let baseline = cp.rss_kib().context("rss")?;
    let sampler = Sampler::start(cp.pid());

    // The flood, its stream unread.
    sh_ok(&cp, &s, "touch /tmp/go").await?;
    ended(&cp, &s, "flood").await?;
    // The session answers beside the unread stream.
    ensure!(sh_ok(&cp, &s, "echo alive").await?.contains("alive"));
    let unread_peak = sampler.peak();

    // Now read: what was held for it, then the end.
    let mut lines = Lines::of(resp);
    let (mut last, mut data, mut count, mut closed) = (0u64, 0u64, 0u64, false);
    while count < 200_000 {
        match lines.next().await? {
            Some(e) => {
                count += 1;
                last = e["seq"].as_u64().unwrap_or(last);
                data += e["data"].as_str().map_or(0, |d| d.len() as u64);
            }
            None => {
                closed = true;
                break;
            }
        }
    }
    ensure!(closed, "the stream went on past {count} events");
    ensure!(
        data < 16 * MIB,
        "the stream held {data} bytes of output for a reader that read nothing"
    );
    let (st, b) = cp
        .call(
            Method::GET,
            &format!("/session/{}/processes/flood/events?after={last}", s.id),
            None,
        )
        .await?;
    ensure!(st == 410, "a resume past lost events: {st} {b}");

    // A streaming run to a client that reads nothing.
    let run = cp
        .request(Method::POST, &format!("/session/{}/", s.id))
        .header("accept", "application/x-ndjson")
        .json(&json!({ "commands": [format!("yes {FLOOD_LINE} | head -c {flood}; echo end")] }))
        .send()
        .await?;
    ensure!(run.status().as_u16() == 200, "run: {}", run.status());
    // Give the command the time to print it all (it is capped past OUTPUT_MAX_BYTES, 16 MiB):
    // 5 s, well within the 10 s a request's consumer may stall before the service gives the
    // request up (the runtime's STREAM_STALL; waiting as long as that raced it).
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let run_unread_peak = sampler.peak();
    let mut lines = Lines::of(run);
    let mut done = None;
    for _ in 0..100_000 {
        match lines.next().await? {
            Some(l) if l["type"] == "done" => {
                done = Some(l);
                break;
            }
            Some(_) => {}
            None => break,
        }
    }
    let done = done.context("the streaming run never said done")?;
    let result = &done["results"][0];
    ensure!(result["exit_code"] == 0, "{result}");
    let output = result["output"].as_str().unwrap_or_default();
    ensure!(
        (output.len() as u64) < 17 * MIB && output.contains("output truncated"),
        "the run kept {} bytes",
        output.len()
    );
    let peak = sampler.peak();
    drop(sampler);
    eprintln!(
        "service RSS: {baseline} KiB before; peak {unread_peak} KiB with the event stream \
         unread through {flood} bytes ({data} bytes delivered in {count} events), \
         {run_unread_peak} KiB with the streaming run unread, {peak} KiB overall"
    );
    // 256 MiB went through each; the service may hold a few bounded rounds and the run's
    // capped output (16 MiB, and its copy in the answer), not the flood.
    ensure!(
        unread_peak.saturating_sub(baseline) < 48 * 1024,
        "the event stream grew the service by {} KiB",
        unread_peak - baseline
    );
    ensure!(
        peak.saturating_sub(baseline) < 128 * 1024,
        "the streaming run grew the service by {} KiB",
        peak - baseline
    );
    Ok(())
}

/// A streaming run whose client stops reading: the run's events fill `stream_run`'s queues, then
/// the request's inbox on the session's helper channel, whose reader then waits on it. Found in
/// this pass: with no stall limit on that request (a download's had one), every other request
/// of the session (a file read, the process list, a watch) waited, then failed with 503, for as
/// long as the client stayed. Now the run is given up after its stall and the session answers.
#[tokio::test]
async fn an_unread_streaming_run_leaves_the_sessions_other_requests_answered() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start().await?;
    let s = cp.session_of(BUSYBOX).await?;
    let run = cp
        .request(Method::POST, &format!("/session/{}/", s.id))
        .header("accept", "application/x-ndjson")
        .json(&json!({ "commands": [format!("yes {FLOOD_LINE} | head -c {}", 256 * MIB)] }))
        .send()
        .await?;
    ensure!(run.status().as_u16() == 200, "run: {}", run.status());
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let path = format!("/session/{}/processes/", s.id);
    let listed =
        tokio::time::timeout(Duration::from_secs(30), cp.call(Method::GET, &path, None)).await;
    drop(run);
    ensure!(
        matches!(listed, Ok(Ok((200, _)))),
        "the session did not answer beside a streaming run nobody reads: {listed:?}"
    );
    Ok(())
}

// === 2. a watch raced by symlink swaps ===

/// A watch is refused on the service directory by any name: itself, through
/// `/proc/self/root` or `/proc/thread-self/root`, through symlinks in the workspace (absolute and
/// relative). Then a recursive watch on a directory the sandbox keeps rearranging (a new
/// directory swapped for a symlink to the service directory as the watch adds it; a watched
/// directory moved away and its old name made such a symlink, while files named like the
/// service directory's are made in it, which the watch resolves by that old name) reports only
/// the sandbox user's entries: none of root's, none of the helper's size, nothing below the
/// service directory.
#[tokio::test]
async fn a_watch_raced_by_symlink_swaps_never_reaches_the_service_directory() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start().await?;
    let s = cp.session_of(BUSYBOX).await?;
    sh_ok(
        &cp,
        &s,
        "mkdir -p /workspace/race /workspace/arm && cd /workspace/arm && \
         ln -s /.daiv-sandbox abs && ln -s ../../.daiv-sandbox/session rel && \
         ln -s /proc/self/root/.daiv-sandbox viaproc && ln -s /proc/1/root/.daiv-sandbox init",
    )
    .await?;
    for path in [
        "/.daiv-sandbox",
        "/.daiv-sandbox/session",
        "//.daiv-sandbox/./session/",
        "/proc/self/root/.daiv-sandbox",
        "/proc/thread-self/root/.daiv-sandbox/session",
        "/proc/1/root/.daiv-sandbox",
        "/proc/self/cwd/../.daiv-sandbox",
        "/workspace/arm/abs",
        "/workspace/arm/rel",
        "/workspace/arm/viaproc",
        "/workspace/arm/viaproc/session",
        "/workspace/arm/init",
    ] {
        let (status, _) = watch(&cp, &s.id, &format!("path={path}&recursive=true")).await?;
        ensure!(
            (400..500).contains(&status),
            "a watch on {path} answered {status}"
        );
    }

    let (status, mut lines) = watch(&cp, &s.id, "path=/workspace/race&recursive=true").await?;
    ensure!(status == 200, "watch: {status}");
    let armed = lines.next().await?.unwrap_or_default();
    ensure!(armed["type"] == "armed", "{armed}");
    sh_ok(&cp, &s, "mkdir -p /workspace/out").await?;

    // Deterministic: a watched directory moved out of the tree stays watched under its old
    // name, which the sandbox then points at the service directory; what is made in the moved
    // directory is resolved through that name. The entries named like the service directory's
    // must come without an entry (refused), never with the service directory's.
    let targets = [
        "/.daiv-sandbox",
        "../../.daiv-sandbox",
        "/proc/self/root/.daiv-sandbox",
        "/proc/thread-self/root/.daiv-sandbox",
        "/.daiv-sandbox/session",
    ];
    let mut refused = 0;
    for (i, target) in targets.iter().enumerate() {
        sh_ok(
            &cp,
            &s,
            &format!("mkdir /workspace/race/d{i} && : > /workspace/race/d{i}/armed"),
        )
        .await?;
        expect_watch(&mut lines, &format!("/workspace/race/d{i}/armed")).await?;
        sh_ok(
            &cp,
            &s,
            &format!(
                "cd /workspace && mv race/d{i} out/m{i} && ln -s {target} race/d{i} && \
                 : > out/m{i}/daiv-sandbox-helper && mkdir out/m{i}/session && \
                 echo x > out/m{i}/environment && : > out/m{i}/seeded && : > out/m{i}/last"
            ),
        )
        .await?;
        let seen = expect_watch(&mut lines, &format!("/workspace/race/d{i}/last")).await?;
        for e in &seen {
            let path = e["path"].as_str().unwrap_or_default();
            if ["daiv-sandbox-helper", "session", "environment", "seeded"]
                .iter()
                .any(|n| path.ends_with(&format!("/d{i}/{n}")))
            {
                ensure!(e["entry"].is_null(), "through {target}: {e}");
                refused += 1;
            }
        }
    }
    ensure!(
        refused >= targets.len() * 3,
        "only {refused} changes resolved through the links"
    );

    // Racy: new directories swapped for such links as the watch adds them, in a loop.
    start_process(
        &cp,
        &s,
        "racer",
        "cd /workspace/race || exit 1; i=0; while [ $i -lt 150 ]; do \
           mkdir r; rmdir r; ln -s /.daiv-sandbox r; rm r; \
           mkdir r; rmdir r; ln -s ../../.daiv-sandbox/session r; rm r; \
           mkdir r; mv r m$i; ln -s /.daiv-sandbox r; \
           : > m$i/daiv-sandbox-helper; mkdir m$i/session; echo x > m$i/seeded; \
           rm r; ln -s /proc/self/root/.daiv-sandbox r; \
           : > m$i/environment; mkdir m$i/session2; chmod 700 m$i; \
           rm -rf r m$i; i=$((i+1)); \
         done; : > /workspace/race/finished",
    )
    .await?;
    let seen = expect_watch(&mut lines, "/workspace/race/finished").await?;
    eprintln!(
        "watch raced: {refused} changes resolved through links refused, then {} events of the \
         loop, none of the service directory",
        seen.len()
    );
    Ok(())
}

/// Reads a watch's events until one for `last`; every one checked: inside the watched
/// directory, and no entry of root's (the service directory's are; nothing the sandbox makes
/// is), nor one of a size the sandbox never wrote, nor one below a directory the watch never saw
/// made. The events read.
async fn expect_watch(lines: &mut Lines, last: &str) -> Result<Vec<Value>> {
    let mut seen = Vec::new();
    while seen.len() < 200_000 {
        let Some(e) = lines.next().await? else {
            bail!("the watch ended after {} events", seen.len());
        };
        if e["type"] == "overflow" {
            seen.push(e);
            continue;
        }
        let path = e["path"].as_str().unwrap_or_default().to_string();
        ensure!(
            path.starts_with("/workspace/race/"),
            "an event outside the watch: {e}"
        );
        let entry = &e["entry"];
        if !entry.is_null() {
            let owner = entry["owner"].as_str().unwrap_or_default();
            ensure!(
                owner != "root" && owner != "0",
                "the watch reported an entry of root's: {e}"
            );
            ensure!(
                entry["size"].as_u64().unwrap_or(0) < 4096
                    || entry["type"].as_str() == Some("directory"),
                "the watch reported an entry the sandbox never wrote: {e}"
            );
        }
        ensure!(
            !path.contains("/session/") && !path.contains("/session2/"),
            "the watch went into a directory it never saw made empty: {e}"
        );
        seen.push(e);
        if path == last {
            return Ok(seen);
        }
    }
    bail!("{last} not seen in {} events", seen.len())
}

// === 3. E2B network rules, applied live on an egress sandbox ===

/// Probes run in the sandbox: CONNECTs and requests with chosen SNI and `Host`, through the
/// sandbox's proxy, printing only statuses (the echo upstream reflects headers in its bodies).
const PROBE: &str = r#"
import json, os, socket, ssl, sys, time
from urllib.parse import urlparse

def proxy():
    for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        v = os.environ.get(k)
        if v:
            u = urlparse(v)
            return u.hostname, u.port or 80
    sys.exit("no proxy in the environment")

def read_head(s):
    buf = b""
    while b"\r\n\r\n" not in buf:
        c = s.recv(65536)
        if not c:
            break
        buf += c
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head, rest

def status_of(head):
    parts = head.split(b" ", 2)
    return int(parts[1]) if head.startswith(b"HTTP/") and len(parts) > 1 else 0

def request(s, target, host):
    lines = [f"GET {target} HTTP/1.1"] + [f"Host: {h}" for h in host] + ["", ""]
    s.sendall("\r\n".join(lines).encode())
    head, body = read_head(s)
    n = 0
    for l in head.split(b"\r\n")[1:]:
        k, _, v = l.partition(b":")
        if k.strip().lower() == b"content-length":
            n = int(v.strip())
    while len(body) < n:
        c = s.recv(65536)
        if not c:
            break
        body += c
    return status_of(head)

def tunnel(target, sni):
    s = socket.create_connection(proxy(), timeout=20)
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head, _ = read_head(s)
    st = status_of(head)
    if st != 200:
        return None, {"connect": st}
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["http/1.1"])
    try:
        return ctx.wrap_socket(s, server_hostname=sni), {"connect": 200}
    except Exception as e:
        return None, {"connect": 200, "tls": type(e).__name__}

def probe(p):
    try:
        if p.get("plain"):
            s = socket.create_connection(proxy(), timeout=20)
            return {"status": request(s, p["target"], p["host"])}
        t, out = tunnel(p["connect"], p.get("sni"))
        if t is not None:
            out["status"] = request(t, p["path"], p["host"])
        return out
    except Exception as e:
        return {"error": type(e).__name__}

if sys.argv[1] == "probes":
    print(json.dumps([probe(p) for p in json.loads(sys.argv[2])]))
else:
    # keepalive: one request, wait for /tmp/go, a second on the same connection.
    host = sys.argv[2]
    t, out = tunnel(f"{host}:443", host)
    out["first"] = request(t, "/ka1", [host])
    open("/tmp/ka1", "w").close()
    for _ in range(1200):
        if os.path.exists("/tmp/go"):
            break
        time.sleep(0.1)
    try:
        out["second"] = request(t, "/ka2", [host])
    except Exception as e:
        out["second"] = type(e).__name__
    print(json.dumps(out))
"#;

/// A second echo server on the upstream's network, answering as `evil.upstream.test` with a
/// certificate the gateway trusts: a host no rule names. Removed on drop.
struct Evil {
    container: String,
    dir: PathBuf,
}

impl Evil {
    fn start(up: &Upstream) -> Result<Self> {
        let dir = up.dir().join("evil");
        std::fs::create_dir_all(&dir)?;
        let (cert, key) = up.upstream_ca.leaf_pem(&["evil.upstream.test"])?;
        std::fs::write(dir.join("server.crt"), cert)?;
        std::fs::write(dir.join("server.key"), key)?;
        std::fs::write(dir.join("server.py"), ECHO_SERVER)?;
        let container = docker(&[
            "run",
            "-d",
            "--pull",
            "never",
            "--label",
            "daiv.e2e=1",
            "--network",
            &up.network,
            "--network-alias",
            "evil.upstream.test",
            "-v",
            &format!("{}:/certs:ro", dir.display()),
            DEBIAN,
            "python3",
            "/certs/server.py",
        ])?;
        let evil = Self { container, dir };
        for _ in 0..100 {
            if docker(&["exec", &evil.container, "test", "-f", "/tmp/ready"]).is_ok() {
                return Ok(evil);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("the evil upstream did not start")
    }

    fn ip(&self, network: &str) -> Result<String> {
        docker(&[
            "inspect",
            "-f",
            &format!("{{{{(index .NetworkSettings.Networks \"{network}\").IPAddress}}}}"),
            &self.container,
        ])
    }

    fn requests(&self) -> Result<String> {
        docker(&[
            "exec",
            &self.container,
            "sh",
            "-c",
            "cat /tmp/requests.jsonl 2>/dev/null || true",
        ])
    }
}

impl Drop for Evil {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-fv", &self.container]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn rule(host: &str, secret: &str) -> Value {
    json!({ host: [{ "transform": { "headers": { "X-Secret": secret } } }] })
}

/// An E2B sandbox whose network rule injects a secret toward `api.upstream.test` (every other
/// host allowed, as E2B's default is), probed from inside: the secret never reaches another host
/// however the sandbox names it (a `Host` header, SNI, the other host's address, another name of
/// the same server, an absolute-form URL inside the tunnel, two `Host` headers, plain HTTP).
/// Then the rule is moved live to `other.upstream.test` (E2B's `PUT /sandboxes/{id}/network`):
/// a connection opened before the update carries neither secret on its next request, a new one
/// to the old host none, and the new host gets the new one.
#[tokio::test]
async fn e2b_network_rules_changed_live_never_send_a_secret_to_an_unnamed_host() -> Result<()> {
    let port = free_port().to_string();
    let EgressStack { up, cp } = EgressStack::start_with(&[("E2B_PORT", &port)]).await?;
    let _guard = DeploymentGuard(cp.deployment.clone());
    let evil = Evil::start(&up)?;
    let evil_ip = evil.ip(&up.network)?;
    let e2b = format!("http://127.0.0.1:{port}");
    let (s1, s2) = ("hostile-e2b-first-5f0c1d", "hostile-e2b-second-9a7e42");
    let created = cp
        .http()
        .post(format!("{e2b}/sandboxes"))
        .header("X-API-KEY", &cp.key)
        .json(&json!({ "templateID": "base", "timeout": 600,
                       "network": { "rules": rule("api.upstream.test", s1) } }))
        .send()
        .await?;
    let st = created.status().as_u16();
    let body: Value = created.json().await?;
    ensure!(st == 201, "create: {st} {body}");
    let s = Session {
        id: body["sandboxID"].as_str().context("sandboxID")?.to_string(),
    };
    let put = cp
        .request(
            Method::PUT,
            &format!("/session/{}/files?path=/tmp/probe.py", s.id),
        )
        .body(PROBE)
        .send()
        .await?;
    ensure!(put.status().is_success(), "probe upload: {}", put.status());

    let p = |connect: &str, sni: Option<&str>, path: &str, host: &[&str]| json!({ "connect": connect, "sni": sni, "path": path, "host": host });
    let api = "api.upstream.test:443";
    let evil_443 = "evil.upstream.test:443";
    let evil_ip_443 = format!("{evil_ip}:443");
    let before = json!([
        // The named host: the secret goes (the control).
        p(api, Some("api.upstream.test"), "/named", &["api.upstream.test"]),
        // Another host, claiming the named one by Host, by SNI, by both; by address.
        p(evil_443, Some("evil.upstream.test"), "/by-host", &["api.upstream.test"]),
        p(evil_443, Some("api.upstream.test"), "/by-sni", &["api.upstream.test"]),
        p(&evil_ip_443, None, "/by-ip", &["api.upstream.test"]),
        // The named host's tunnel, turned toward another: SNI, Host, absolute form, two Hosts.
        p(api, Some("evil.upstream.test"), "/sni-away", &["evil.upstream.test"]),
        p(api, Some("api.upstream.test"), "/host-away", &["evil.upstream.test"]),
        p(api, Some("api.upstream.test"), "http://evil.upstream.test/absolute-away", &["api.upstream.test"]),
        p(api, Some("api.upstream.test"), "/two-hosts", &["api.upstream.test", "evil.upstream.test"]),
        // Another name of the same server.
        p("other.upstream.test:443", Some("other.upstream.test"), "/alias", &["other.upstream.test"]),
        // Plain HTTP: to the named host (the secret travels only in TLS), and toward another.
        {"plain": true, "target": "http://api.upstream.test/plain", "host": ["api.upstream.test"]},
        {"plain": true, "target": "http://evil.upstream.test/plain-away", "host": ["api.upstream.test"]},
    ]);
    let out = sh_ok(&cp, &s, &format!("python3 /tmp/probe.py probes '{before}'")).await?;
    eprintln!("probes before the update: {out}");
    let statuses: Value =
        serde_json::from_str(out.lines().last().unwrap_or_default()).context("probe output")?;
    ensure!(statuses[0]["status"] == 200, "the named host: {statuses}");

    // A connection opened under the first rule, kept across the update.
    start_process(
        &cp,
        &s,
        "keepalive",
        "python3 /tmp/probe.py keepalive api.upstream.test",
    )
    .await?;
    eventually("the first request", Duration::from_secs(60), || async {
        Ok(cp
            .sh(&s, "test -e /tmp/ka1")
            .await
            .ok()
            .filter(|(c, _)| *c == 0)
            .map(|_| ()))
    })
    .await?;
    let updated = cp
        .http()
        .put(format!("{e2b}/sandboxes/{}/network", s.id))
        .header("X-API-KEY", &cp.key)
        .json(&json!({ "rules": rule("other.upstream.test", s2) }))
        .send()
        .await?;
    ensure!(
        updated.status().as_u16() == 204,
        "update: {}",
        updated.status()
    );
    sh_ok(&cp, &s, "touch /tmp/go").await?;
    ended(&cp, &s, "keepalive").await?;
    let after = json!([
        p(
            api,
            Some("api.upstream.test"),
            "/api-after",
            &["api.upstream.test"]
        ),
        p(
            "other.upstream.test:443",
            Some("other.upstream.test"),
            "/other-after",
            &["other.upstream.test"]
        ),
        p(
            evil_443,
            Some("other.upstream.test"),
            "/by-sni-after",
            &["other.upstream.test"]
        ),
    ]);
    let out = sh_ok(&cp, &s, &format!("python3 /tmp/probe.py probes '{after}'")).await?;
    eprintln!("probes after the update: {out}");

    let evil_saw = evil.requests()?;
    ensure!(
        !evil_saw.contains(s1) && !evil_saw.contains(s2),
        "a secret reached a host no rule named: {evil_saw}"
    );
    let seen = up.requests()?;
    let with = |secret: &str| -> Vec<(String, String)> {
        seen.iter()
            .filter(|r| r.to_string().contains(secret))
            .map(|r| {
                (
                    r["path"].as_str().unwrap_or_default().to_string(),
                    r["headers"]["host"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            })
            .collect()
    };
    let first = with(s1);
    let second = with(s2);
    eprintln!("the first secret went to {first:?}, the second to {second:?}");
    for (path, host) in &first {
        ensure!(
            host == "api.upstream.test" && (path == "/named" || path == "/ka1"),
            "the first secret went with {path} to {host}"
        );
    }
    for (path, host) in &second {
        ensure!(
            host == "other.upstream.test" && path == "/other-after",
            "the second secret went with {path} to {host}"
        );
    }
    ensure!(
        first.iter().any(|(p, _)| p == "/named") && first.iter().any(|(p, _)| p == "/ka1"),
        "the controls: the first secret reached the named host ({first:?})"
    );
    ensure!(
        second.len() == 1,
        "the control: the update's secret reached its host ({second:?})"
    );
    // The gateway may close the kept connection at the update instead (just as safe); when it
    // carried the second request, the checks above covered it.
    let kept = seen.iter().any(|r| r["path"] == "/ka2");
    eprintln!("the kept connection's request after the update reached the upstream: {kept}");
    ensure!(
        !cp.logs().contains(s1) && !cp.logs().contains(s2),
        "a secret is in the service's log"
    );
    Ok(())
}

// === 4. the MCP stdio bridge ===

/// The service binary, as the harness finds it.
fn service_binary() -> PathBuf {
    if let Ok(p) = std::env::var("DAIV_SANDBOX_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    exe.parent()
        .and_then(std::path::Path::parent)
        .map(|d| d.join("daiv-sandbox"))
        .unwrap_or_default()
}

/// A stdio bridge to `cp`'s `/mcp`, its key in a file; its stdout lines come through `lines`,
/// its stderr is collected.
struct StdioBridge {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    out: Vec<String>,
    err: Option<std::thread::JoinHandle<Vec<u8>>>,
    key_file: PathBuf,
}

impl StdioBridge {
    fn start(cp: &ControlPlane) -> Result<Self> {
        let key_file = std::env::temp_dir().join(format!("hostile-mcp-key-{}", free_port()));
        std::fs::write(&key_file, &cp.key)?;
        let mut child = Command::new(service_binary())
            .args(["mcp", "--url", &format!("{}/mcp", cp.base), "--key-file"])
            .arg(&key_file)
            .env_remove("DAIV_SANDBOX_API_KEY")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("spawn the stdio bridge")?;
        let stdout = child.stdout.take().context("stdout")?;
        let mut stderr = child.stderr.take().context("stderr")?;
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let err = std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = stderr.read_to_end(&mut v);
            v
        });
        Ok(Self {
            child,
            lines,
            out: Vec::new(),
            err: Some(err),
            key_file,
        })
    }

    /// The next line it writes (at most 60 s), kept in `out` too.
    fn next_line(&mut self) -> Result<Value> {
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(60))
            .context("no line from the bridge in 60 s")?;
        self.out.push(line.clone());
        serde_json::from_str(&line).with_context(|| format!("not JSON: {line}"))
    }

    /// Closes its stdin and waits (at most 120 s) for it to end: its exit code and stderr (the
    /// rest of its stdout goes to `out`).
    fn finish(&mut self) -> Result<(Option<i32>, String)> {
        drop(self.child.stdin.take());
        let mut code = None;
        for _ in 0..1200 {
            if let Some(st) = self.child.try_wait()? {
                code = st.code();
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if code.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.out.push(line);
        }
        let err = self
            .err
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        Ok((code, String::from_utf8_lossy(&err).into_owned()))
    }
}

impl Drop for StdioBridge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.key_file);
    }
}

/// Malformed lines (one quoting the API key), a request over the service's body cap, a request
/// with an id the service never saw initialised, then a real initialisation: each malformed line
/// is one parse error, the oversized request one JSON-RPC error for its id, the bridge answers
/// the initialisation after all that and ends cleanly at end of input; the key is in none of
/// what it wrote, on stdout or stderr.
#[tokio::test]
async fn the_stdio_bridge_survives_malformed_and_oversized_lines_and_never_writes_the_key()
-> Result<()> {
    let cp = ControlPlane::start_with(&[("MCP_MAX_REQUEST_BYTES", "1048576")]).await?;
    let mut bridge = StdioBridge::start(&cp)?;
    let mut stdin = bridge.child.stdin.take().context("stdin")?;
    let malformed = [
        "{".to_string(),
        "not json at all".to_string(),
        format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":7,\"params\":{{\"key\":\"{}\"",
            cp.key
        ),
        "[1,2,".to_string(),
        format!("\"{}", "x".repeat(100_000)),
    ];
    for l in &malformed {
        writeln!(stdin, "{l}")?;
    }
    let big = json!({"jsonrpc": "2.0", "id": "big", "method": "tools/call",
                     "params": {"name": "run", "arguments": {"commands": ["x".repeat(4 << 20)]}}});
    writeln!(stdin, "{big}")?;
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "hostile", "version": "0"}}});
    writeln!(stdin, "{init}")?;
    // Every line is answered (requests side by side) before input ends: the bridge aborts the
    // calls still running at end of input.
    let mut lines = Vec::new();
    while !(lines.iter().any(|l: &Value| l["id"] == "big") && lines.iter().any(|l| l["id"] == 1)) {
        ensure!(lines.len() < 64, "too many lines: {lines:?}");
        lines.push(bridge.next_line()?);
    }
    drop(stdin);
    let (code, err) = bridge.finish()?;
    let out = bridge.out.join("\n");
    eprintln!("bridge exit {code:?}; stdout: {out:.2000}; stderr: {err}");
    let parse_errors = lines
        .iter()
        .filter(|l| l["error"]["code"] == -32700)
        .count();
    ensure!(
        parse_errors == malformed.len(),
        "{parse_errors} parse errors for {} malformed lines: {out}",
        malformed.len()
    );
    let big_answer = lines.iter().find(|l| l["id"] == "big").context("big")?;
    ensure!(big_answer["error"].is_object(), "{big_answer}");
    let init_answer = lines.iter().find(|l| l["id"] == 1).context("init")?;
    ensure!(
        init_answer["result"]["serverInfo"].is_object(),
        "{init_answer}"
    );
    ensure!(code == Some(0), "the bridge ended with {code:?}: {err}");
    ensure!(
        !out.contains(&cp.key) && !err.contains(&cp.key),
        "the bridge wrote the API key"
    );
    Ok(())
}

/// The bridge's 64 MiB line cap (`MAX_LINE_BYTES`) holds before the line is buffered: a client
/// writing 512 MiB without a newline never grows the bridge past the cap. (Found in this pass:
/// the cap was checked after the whole line was read, so 512 MiB cost 527 MiB.)
#[tokio::test]
async fn a_line_over_the_stdio_bridges_cap_is_refused_before_it_is_buffered() -> Result<()> {
    let cp = ControlPlane::start().await?;
    let mut bridge = StdioBridge::start(&cp)?;
    let pid = bridge.child.id();
    let mut stdin = bridge.child.stdin.take().context("stdin")?;
    let before = status_kib(pid, "VmRSS:").unwrap_or(0);
    let sampler = Sampler::start(pid);
    let chunk = vec![b'a'; MIB as usize];
    for _ in 0..512 {
        if stdin.write_all(&chunk).is_err() {
            break; // the bridge refused and left
        }
    }
    drop(stdin);
    std::thread::sleep(Duration::from_millis(500));
    let peak = sampler.peak();
    drop(sampler);
    let (code, err) = bridge.finish()?;
    eprintln!("bridge RSS {before} KiB before, peak {peak} KiB; exit {code:?}: {err}");
    ensure!(
        peak < 96 * 1024,
        "the bridge held {peak} KiB for one line (its cap is 64 MiB)"
    );
    Ok(())
}

// === 5. snapshot size caps under gVisor ===

fn image_size(image: &str) -> Result<u64> {
    docker(&["image", "inspect", "-f", "{{.Size}}", image])?
        .parse()
        .context("image size")
}

async fn take_snapshot(cp: &ControlPlane, s: &Session) -> Result<(u16, Value)> {
    cp.call(
        Method::POST,
        &format!("/session/{}/snapshot/", s.id),
        Some(json!({})),
    )
    .await
}

/// `count` directories with 200-character names under `dir` (500 to a parent, as gVisor slows
/// down in larger directories), made by a few processes.
fn many_dirs(dir: &str, count: u32) -> String {
    let pad = "d".repeat(190);
    format!(
        "mkdir -p {dir} && cd {dir} && p=0; while [ $((p * 500)) -lt {count} ]; do \
           mkdir p$p && (cd p$p && seq $((p * 500 + 1)) $(((p + 1) * 500)) | \
           sed 's/$/{pad}/' | xargs mkdir) || exit 1; p=$((p + 1)); done"
    )
}

/// Under gVisor, with `SNAPSHOT_SIZE_MAX_BYTES` at 4 MiB: a workspace of 4,000 empty directories
/// with long names (no file bytes, 6 MiB of archive headers) is refused as its copy passes the cap
/// (a snapshot that commits nothing counts only what it copies; one that commits counts the
/// container's layer too, the helper's 4 MiB, and is refused all the more), and a file growing
/// in the home directory while snapshots are taken (a volume of the session's, counted as it is
/// copied; in the container's layer, measured again frozen) never yields one recorded or
/// committed past the cap; once grown past it, a snapshot is refused; the session lives on.
#[tokio::test]
async fn snapshot_caps_hold_under_gvisor_for_metadata_and_writes_through_the_freeze() -> Result<()>
{
    require_image(BUSYBOX);
    let cap = 4 * MIB;
    let cp = ControlPlane::start_with(&[
        ("RUNTIME", "runsc"),
        ("SNAPSHOT_SIZE_MAX_BYTES", &cap.to_string()),
    ])
    .await?;
    let _guard = DeploymentGuard(cp.deployment.clone());
    let s = cp.session_of(BUSYBOX).await?;
    sh_ok(&cp, &s, &many_dirs("/workspace/many", 4000)).await?;
    let (st, b) = take_snapshot(&cp, &s).await?;
    ensure!(
        st == 413,
        "4,000 directories in the workspace (6 MiB of archive): {st} {b}"
    );
    sh_ok(&cp, &s, "rm -rf /workspace/many").await?;

    // A file growing in the home directory through the snapshots.
    start_process(
        &cp,
        &s,
        "grow",
        "i=0; while [ $i -lt 16 ]; do head -c 1048576 /dev/zero >> $HOME/grow; i=$((i+1)); done",
    )
    .await?;
    let base = image_size(BUSYBOX)?;
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        let (st, b) = take_snapshot(&cp, &s).await?;
        match st {
            201 => {
                let id = b["snapshot_id"].as_str().context("snapshot_id")?;
                let size = b["size_bytes"].as_u64().unwrap_or(u64::MAX);
                let added = snapshot_image(id)?
                    .map(|i| image_size(&i))
                    .transpose()?
                    .map(|s| s.saturating_sub(base));
                ensure!(size <= cap, "a snapshot recorded at {size} bytes");
                if let Some(added) = added {
                    ensure!(added <= cap, "a snapshot image adding {added} bytes");
                }
                outcomes.push(format!("201 ({size} bytes, image +{added:?})"));
            }
            413 => outcomes.push("413".into()),
            other => bail!("snapshot during the growth: {other} {b}"),
        }
    }
    ended(&cp, &s, "grow").await?;
    let (st, b) = take_snapshot(&cp, &s).await?;
    ensure!(st == 413, "16 MiB in the home directory: {st} {b}");
    outcomes.push(format!("{st} once grown"));
    eprintln!("snapshots through the growth: {outcomes:?}");
    ensure!(sh_ok(&cp, &s, "echo alive").await?.contains("alive"));
    Ok(())
}

/// The image of snapshot `id`, if there is one.
fn snapshot_image(id: &str) -> Result<Option<String>> {
    let images = docker(&[
        "images",
        "-q",
        "--no-trunc",
        "--filter",
        &format!("label=daiv.sandbox.snapshot={id}"),
    ])?;
    Ok(images.lines().next().map(String::from))
}

/// FINDING: the writable layer is measured as Docker's `SizeRw`, the sum of regular files'
/// sizes: directories, empty files and inodes count 0. A session under gVisor that makes 3,000
/// empty directories in its home (12 MiB of the host's blocks) is snapshotted under an 8 MiB
/// cap (recorded at the helper's 4 MiB); each snapshot or fork copies that layer again, and a
/// million directories are 4 GiB a copy, so neither `SNAPSHOT_SIZE_MAX_BYTES` nor
/// `SNAPSHOT_MAX_BYTES` bounds the host's disk. Measuring what the commit writes (the layer's
/// archive, as the workspace copy is counted, or its blocks) would refuse it.
#[tokio::test]
#[ignore = "finding: metadata-only writable layers pass the snapshot caps (control-plane/src/snapshots/budget.rs:87, take.rs:93)"]
async fn a_writable_layer_of_empty_directories_counts_against_the_snapshot_cap_under_gvisor()
-> Result<()> {
    require_image(BUSYBOX);
    let cap = 8 * MIB;
    let cp = ControlPlane::start_with(&[
        ("RUNTIME", "runsc"),
        ("SNAPSHOT_SIZE_MAX_BYTES", &cap.to_string()),
    ])
    .await?;
    let _guard = DeploymentGuard(cp.deployment.clone());
    let s = cp.session_of(BUSYBOX).await?;
    sh_ok(&cp, &s, &many_dirs("$HOME/many", 3000)).await?;
    let (st, b) = take_snapshot(&cp, &s).await?;
    if st == 413 {
        return Ok(());
    }
    ensure!(st == 201, "{st} {b}");
    let id = b["snapshot_id"].as_str().context("snapshot_id")?;
    let image = snapshot_image(id)?.context("the snapshot's image")?;
    let upper = docker(&[
        "image",
        "inspect",
        "-f",
        "{{.GraphDriver.Data.UpperDir}}",
        &image,
    ])?;
    let du = Command::new("du")
        .args(["-sk", &upper])
        .output()
        .context("du")?;
    let kib: u64 = String::from_utf8_lossy(&du.stdout)
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    eprintln!(
        "snapshot {id}: recorded {} bytes; its layer takes {kib} KiB of the host's disk",
        b["size_bytes"]
    );
    ensure!(
        kib * 1024 <= cap,
        "a snapshot under an {cap}-byte cap takes {} bytes of the host's disk",
        kib * 1024
    );
    Ok(())
}
