//! Upstream proxy chaining end to end (issue 14 #5): the control plane is started with
//! `DAIV_SANDBOX_EGRESS_UPSTREAM_PROXY`, so a sandbox's gateway sends its own egress through a
//! local HTTP CONNECT proxy container on the test's network. The proxy records every CONNECT it
//! is asked for; the test proves that the sandbox's traffic went through it (and stops when it
//! is gone), that MITM with credential injection and blind tunnels still work through it, and
//! that the gateway's SSRF guard still refuses a loopback destination the proxy would reach.

use anyhow::{Context, Result, bail};
use e2e::egress::{EgressSettings, Upstream, gateway_of, start_upstream};
use e2e::{ControlPlane, DEBIAN, Session, docker};
use serde_json::{Value, json};

const SECRET: &str = "ghp_e2eProxiedSecret0123456789";
/// The proxy's name on the test network, and its credentials (`:` in the password is
/// percent-encoded in the URL, as an operator would have to).
const PROXY_NAME: &str = "proxy.corp.test";
const PROXY_USER: &str = "corp";
const PROXY_PASSWORD: &str = "pa:ss-e2e";
/// A service only the proxy can reach: on its own loopback.
const LOOPBACK_PORT: u16 = 8443;

/// A CONNECT-only HTTP proxy (Python, in the local Debian image) that requires Basic
/// credentials, appends one JSON line per request to /tmp/connects.jsonl (target, peer,
/// whether the credentials matched, outcome, and the raw head), and splices allowed tunnels.
/// It also serves `loopback reached` on 127.0.0.1:8443, a destination only it can reach.
const PROXY_SERVER: &str = r#"
import base64, http.server, json, socket, sys, threading
want = "Basic " + base64.b64encode(sys.argv[1].encode()).decode()
lock = threading.Lock()
def log(rec):
    with lock, open("/tmp/connects.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")
def pump(src, dst):
    try:
        while True:
            b = src.recv(65536)
            if not b:
                break
            dst.sendall(b)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
def handle(c, peer):
    head = b""
    while b"\r\n\r\n" not in head and len(head) < 16384:
        b = c.recv(1)
        if not b:
            c.close(); return
        head += b
    text = head.decode("latin-1")
    lines = text.split("\r\n")
    method, target = (lines[0].split(" ") + ["", ""])[:2]
    headers = {}
    for l in lines[1:]:
        if ":" in l:
            k, v = l.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    rec = {"method": method, "target": target, "peer": peer[0],
           "auth_ok": headers.get("proxy-authorization") == want, "head": text}
    if method != "CONNECT":
        rec["result"] = "not-connect"; log(rec)
        c.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n"); c.close(); return
    if not rec["auth_ok"]:
        rec["result"] = "auth-required"; log(rec)
        c.sendall(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n"); c.close(); return
    host, _, port = target.rpartition(":")
    try:
        u = socket.create_connection((host.strip("[]"), int(port)), timeout=5)
    except Exception as e:
        rec["result"] = "connect-failed"; log(rec)
        c.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n"); c.close(); return
    rec["result"] = "tunnel"; log(rec)
    c.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
    t = threading.Thread(target=pump, args=(u, c), daemon=True); t.start()
    pump(c, u); t.join(); c.close(); u.close()
class Loop(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        out = b"loopback reached\n"
        self.send_response(200); self.send_header("Content-Length", str(len(out))); self.end_headers()
        self.wfile.write(out)
    def log_message(self, *a):
        pass
loop = http.server.ThreadingHTTPServer(("127.0.0.1", 8443), Loop)
threading.Thread(target=loop.serve_forever, daemon=True).start()
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", 3128)); srv.listen(64)
open("/tmp/ready", "w").close()
while True:
    c, peer = srv.accept()
    threading.Thread(target=handle, args=(c, peer), daemon=True).start()
"#;

/// The proxy container on the upstream's network; removed on drop (before the network).
struct Proxy {
    container: String,
    dir: std::path::PathBuf,
}

impl Proxy {
    fn start(up: &Upstream) -> Result<Self> {
        let dir = up.dir().join("proxy");
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("proxy.py"), PROXY_SERVER)?;
        let credentials = format!("{PROXY_USER}:{PROXY_PASSWORD}");
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
            PROXY_NAME,
            "-v",
            &format!("{}:/proxy:ro", dir.display()),
            DEBIAN,
            "python3",
            "/proxy/proxy.py",
            &credentials,
        ])?;
        let proxy = Self { container, dir };
        for _ in 0..100 {
            if docker(&["exec", &proxy.container, "test", "-f", "/tmp/ready"]).is_ok() {
                return Ok(proxy);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        bail!(
            "proxy did not start: {}",
            docker(&["logs", &proxy.container]).unwrap_or_default()
        )
    }

    /// Every request the proxy has seen, oldest first.
    fn seen(&self) -> Result<Vec<Value>> {
        let out = docker(&[
            "exec",
            &self.container,
            "sh",
            "-c",
            "cat /tmp/connects.jsonl 2>/dev/null || true",
        ])?;
        out.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).context("proxy record"))
            .collect()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-fv", &self.container]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Address of `container` on `network`.
fn ip_on(container: &str, network: &str) -> Result<String> {
    docker(&[
        "inspect",
        "-f",
        &format!("{{{{(index .NetworkSettings.Networks \"{network}\").IPAddress}}}}"),
        container,
    ])
}

fn policy() -> Value {
    json!({
        "policy": {
            "default": "deny",
            "intercept": "credentialed",
            "rules": [
                {"host": "api.upstream.test", "methods": ["GET", "POST"], "inject": "tok"},
                {"host": "other.upstream.test"},
                // Allowed by the policy: only the SSRF guard stands between the sandbox and the
                // proxy's loopback service.
                {"host": "127.0.0.1"}
            ]
        },
        "secrets": {"tok": {"header": "Authorization", "value": SECRET}}
    })
}

fn last_request(up: &Upstream, path: &str) -> Result<Option<Value>> {
    Ok(up.requests()?.into_iter().rev().find(|r| r["path"] == path))
}

#[tokio::test]
async fn sandbox_egress_chains_through_an_upstream_proxy_with_the_guard_still_applied() -> Result<()>
{
    let up = start_upstream()?;
    let proxy = Proxy::start(&up)?;
    let upstream_ip = ip_on(&up.container, &up.network)?;

    let settings = EgressSettings::for_upstream(&up)?;
    let proxy_url = format!(
        "http://{PROXY_USER}:{}@{PROXY_NAME}:3128",
        PROXY_PASSWORD.replace(':', "%3A")
    );
    let cp =
        ControlPlane::start_with(&settings.env(&[("EGRESS_UPSTREAM_PROXY", proxy_url.as_str())]))
            .await?;
    let s: Session = cp
        .session(json!({"base_image": DEBIAN, "egress": policy()}))
        .await?;
    let gateway_ip = {
        let (_, gateway) = gateway_of(&s.id)?;
        ip_on(&gateway, &up.network)?
    };
    // Nothing has gone through the proxy yet (session create needs no upstream).
    assert!(proxy.seen()?.is_empty(), "{:?}", proxy.seen()?);

    // MITM with credential injection, through the proxy: the upstream gets the credential, and
    // the proxy saw one authenticated CONNECT from the gateway to the address the gateway's
    // guard checked (never a name for the proxy to resolve). The secret stays inside the TLS.
    let (code, out) = cp
        .sh(&s, "curl -sS --fail https://api.upstream.test/mitm")
        .await?;
    assert_eq!(code, 0, "{out}");
    let seen = last_request(&up, "/mitm")?.context("upstream saw the MITM'd request")?;
    assert_eq!(seen["headers"]["authorization"], SECRET);
    let connects = proxy.seen()?;
    let to_upstream = format!("{upstream_ip}:443");
    assert!(
        connects.iter().any(|c| c["target"] == to_upstream.as_str()
            && c["result"] == "tunnel"
            && c["auth_ok"] == true
            && c["peer"] == gateway_ip.as_str()),
        "the gateway's upstream connection did not go through the proxy: {connects:?}"
    );
    assert!(
        connects.iter().all(|c| c["target"]
            .as_str()
            .is_some_and(|t| !t.contains("upstream.test"))),
        "CONNECT must name the checked address: {connects:?}"
    );

    // A blind tunnel (allowed host, nothing to inject): through the proxy too, end-to-end TLS
    // with the upstream's own certificate.
    let before = proxy.seen()?.len();
    let (code, out) = cp
        .sh(
            &s,
            "curl -sS -k --fail -v https://other.upstream.test/tunnel 2>&1",
        )
        .await?;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("issuer: CN=daiv e2e upstream CA"), "{out}");
    assert!(last_request(&up, "/tunnel")?.is_some());
    let connects = proxy.seen()?;
    assert!(
        connects[before..]
            .iter()
            .any(|c| c["target"] == to_upstream.as_str() && c["result"] == "tunnel"),
        "the tunnel did not go through the proxy: {connects:?}"
    );

    // The SSRF guard still applies to the destination: the proxy reaches its own loopback
    // service (shown first, from inside the proxy's container)...
    let reached = docker(&[
        "exec",
        &proxy.container,
        "curl",
        "-sS",
        "--max-time",
        "5",
        "-p",
        "-x",
        &format!(
            "http://{PROXY_USER}:{}@127.0.0.1:3128",
            PROXY_PASSWORD.replace(':', "%3A")
        ),
        &format!("http://127.0.0.1:{LOOPBACK_PORT}/"),
    ])?;
    assert_eq!(reached, "loopback reached");
    // ...but the policy-allowed 127.0.0.1 is refused by the gateway with `address-not-allowed`,
    // over CONNECT and over plaintext forwarding, and nothing reaches the proxy meanwhile.
    let before = proxy.seen()?.len();
    for url in [
        format!("https://127.0.0.1:{LOOPBACK_PORT}/"),
        format!("http://127.0.0.1:{LOOPBACK_PORT}/"),
    ] {
        let (_, out) = cp
            .sh(
                &s,
                // `--noproxy ''`: the sandbox's NO_PROXY exempts loopback; this asks the gateway.
                &format!("curl -s -D - -o /dev/null --noproxy '' --max-time 30 {url} 2>&1"),
            )
            .await?;
        assert!(
            out.to_ascii_lowercase()
                .contains("x-egress-denied: address-not-allowed"),
            "{url}: {out}"
        );
        assert!(!out.contains("loopback reached"), "{url}: {out}");
    }
    let after: Vec<Value> = proxy.seen()?.split_off(before);
    assert!(
        after.is_empty(),
        "a guarded destination reached the proxy: {after:?}"
    );

    // Everything went through the proxy: with the proxy gone, the same allowed request fails
    // (a 502 from the gateway), although the gateway could reach the upstream on its own.
    docker(&["stop", "-t", "0", &proxy.container])?;
    let (_, out) = cp
        .sh(
            &s,
            "curl -s -o /dev/null -w '%{http_code}' --max-time 30 https://api.upstream.test/no-proxy",
        )
        .await?;
    assert_eq!(out, "502", "without the proxy there is no way out");
    assert!(last_request(&up, "/no-proxy")?.is_none());

    // The proxy's password never shows in the service's logs.
    let logs = cp.logs();
    assert!(!logs.contains(PROXY_PASSWORD), "proxy password in the logs");
    assert!(
        !logs.contains(&PROXY_PASSWORD.replace(':', "%3A")),
        "proxy password in the logs"
    );
    drop(s);
    drop(proxy);
    Ok(())
}
