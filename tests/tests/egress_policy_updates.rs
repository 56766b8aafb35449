//! Policy updates against what the sandbox can do about them, end to end (a Debian sandbox
//! behind its gateway, the HTTPS echo upstream under `.test` names):
//! - the policy version is never shown to the sandbox (it labels secrets), and two policies that
//!   differ only in a secret value look the same from inside;
//! - a sandbox holding every connection slot of its gateway cannot make `PUT .../egress/` fail;
//! - a WebSocket opened under a policy is closed by an update that removes its host;
//! - a secret value that is not a header value is a 422, never echoed.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use e2e::egress::{EgressStack, gateway_of};
use e2e::{ControlPlane, DEBIAN, Session, docker, eventually};
use reqwest::Method;
use serde_json::{Value, json};

const SECRET: &str = "ghp_e2eUpdatesSecret0123456789";

/// `api.upstream.test` (GET, with the credential) and `other.upstream.test` (any method).
fn policy(secret: &str) -> Value {
    json!({
        "policy": {
            "default": "deny",
            "intercept": "all",
            "rules": [
                {"host": "api.upstream.test", "methods": ["GET"], "inject": "tok"},
                {"host": "other.upstream.test"}
            ]
        },
        "secrets": {"tok": {"header": "Authorization", "value": secret}}
    })
}

async fn put_egress(cp: &ControlPlane, s: &Session, body: Value) -> Result<(u16, Value)> {
    cp.call(
        Method::PUT,
        &format!("/session/{}/egress/", s.id),
        Some(body),
    )
    .await
}

/// Starts a background process in the session; returns its id.
async fn spawn(cp: &ControlPlane, s: &Session, command: &str) -> Result<String> {
    let (status, resp) = cp
        .call(
            Method::POST,
            &format!("/session/{}/processes/", s.id),
            Some(json!({"command": command})),
        )
        .await?;
    if status != 201 {
        bail!("start process: {status} {resp}");
    }
    Ok(resp["process_id"]
        .as_str()
        .context("no process_id")?
        .to_string())
}

/// A background process's output so far, and whether it still runs.
async fn output(cp: &ControlPlane, s: &Session, pid: &str) -> Result<(String, bool)> {
    let (status, resp) = cp
        .call(
            Method::GET,
            &format!("/session/{}/processes/{pid}/?offset=0", s.id),
            None,
        )
        .await?;
    if status != 200 {
        bail!("poll process: {status} {resp}");
    }
    Ok((
        resp["output"].as_str().unwrap_or_default().to_string(),
        resp["running"].as_bool().unwrap_or(false),
    ))
}

/// Waits until the process has printed `needle`.
async fn printed(cp: &ControlPlane, s: &Session, pid: &str, needle: &str) -> Result<String> {
    eventually(
        &format!("process prints {needle:?}"),
        Duration::from_secs(60),
        || async {
            let (out, running) = output(cp, s, pid).await?;
            if out.contains(needle) {
                return Ok(Some(out));
            }
            if !running {
                bail!("process ended without printing {needle:?}: {out}");
            }
            Ok(None)
        },
    )
    .await
}

/// Everything the sandbox can ask the proxy port about its policy, exchange by exchange, with
/// the `Date` headers left out: denials inside a MITM'd tunnel (text and JSON), a refused
/// CONNECT, a plaintext denial, and the health path asked of the gateway's own address.
const SANDBOX_VIEW: &str = r#"
import os, socket, ssl
gw = os.environ["HTTPS_PROXY"].split("//")[1].strip("/")
host, port = gw.rsplit(":", 1)
def dial():
    return socket.create_connection((host, int(port)), timeout=10)
def read_all(s):
    out = b""
    while True:
        try:
            b = s.recv(65536)
        except (socket.timeout, ssl.SSLError, OSError):
            break
        if not b:
            break
        out += b
    return out
def clean(raw):
    lines = raw.decode(errors="replace").split("\r\n")
    return "\n".join(l for l in lines if not l.lower().startswith("date:"))
def connect(target):
    s = dial()
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        b = s.recv(1)
        if not b:
            break
        head += b
    return s, head
for accept in ["*/*", "application/json"]:
    s, head = connect("api.upstream.test:443")
    ctx = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    t = ctx.wrap_socket(s, server_hostname="api.upstream.test")
    t.sendall(f"DELETE /x HTTP/1.1\r\nHost: api.upstream.test\r\nAccept: {accept}\r\nConnection: close\r\n\r\n".encode())
    print("== mitm", accept, clean(head), clean(read_all(t)), sep="\n")
s, head = connect("unlisted.upstream.test:443")
print("== connect", clean(head + read_all(s)), sep="\n")
s = dial()
s.sendall(b"GET http://unlisted.upstream.test/y HTTP/1.1\r\nHost: unlisted.upstream.test\r\nAccept: application/json\r\nConnection: close\r\n\r\n")
print("== plain", clean(read_all(s)), sep="\n")
for path in ["/-/health/", "/-/health"]:
    s = dial()
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: {gw}\r\nAccept: application/json\r\nConnection: close\r\n\r\n".encode())
    print("== health", path, clean(read_all(s)), sep="\n")
"#;

async fn sandbox_view(cp: &ControlPlane, s: &Session) -> Result<String> {
    let script = format!("cat > /tmp/view.py <<'EOF'\n{SANDBOX_VIEW}\nEOF\npython3 /tmp/view.py");
    let (code, out) = cp.sh(s, &script).await?;
    assert_eq!(code, 0, "{out}");
    Ok(out)
}

/// The version the gateway enforces, asked as the control plane asks it: inside the gateway.
fn enforced_version(s: &Session) -> Result<String> {
    let (_, gateway) = gateway_of(&s.id)?;
    let out = docker(&["exec", &gateway, "/daiv-egress-gateway", "health"])?;
    out.strip_prefix("ok policy_version=")
        .map(str::to_owned)
        .with_context(|| format!("health answered {out:?}"))
}

/// Issue 25 item 4 (and item 9's API side). The version labels the whole policy, secrets
/// included; the sandbox sees no version at all, so two policies that differ only in a secret
/// value look exactly the same from inside. Only the gateway's health listener, which the
/// sandbox cannot reach, tells them apart, by keyed values.
#[tokio::test]
async fn the_sandbox_sees_nothing_that_tells_two_secret_values_apart() -> Result<()> {
    let EgressStack { up: _up, cp } = EgressStack::start().await?;
    let s = cp
        .session(json!({"base_image": DEBIAN, "egress": policy(SECRET)}))
        .await?;
    let v1 = enforced_version(&s)?;
    let first = sandbox_view(&cp, &s).await?;

    let other = format!("{SECRET}x");
    let (status, body) = put_egress(&cp, &s, policy(&other)).await?;
    assert_eq!(status, 204, "{body}");
    let v2 = enforced_version(&s)?;
    let second = sandbox_view(&cp, &s).await?;

    assert_eq!(first, second, "the sandbox tells the two policies apart");
    for (what, needle) in [
        ("the denials", "x-egress-denied: method-not-allowed"),
        ("the refused CONNECT", "x-egress-denied: host-not-listed"),
        ("the JSON body", "\"reason\":\"host-not-listed\""),
    ] {
        assert!(
            first.to_ascii_lowercase().contains(needle),
            "{what}: {first}"
        );
    }
    assert!(!first.contains(&v1) && !first.contains("hmac:"), "{first}");
    assert!(!first.to_ascii_lowercase().contains("version"), "{first}");
    // The health path on the proxy port is a 400 like any origin-form request.
    assert_eq!(first.matches("HTTP/1.1 400").count(), 2, "{first}");
    // The versions differ, and are keyed values (no unkeyed digest of the policy).
    assert_ne!(v1, v2);
    for v in [&v1, &v2] {
        assert!(v.starts_with("hmac:") && v.len() == 5 + 32, "{v}");
    }

    // A secret value that is not a header value: 422 at PUT and at create, never echoed.
    let bad = policy("ghp_badS3cr3t\u{1}value");
    let (status, body) = put_egress(&cp, &s, bad.clone()).await?;
    assert_eq!(status, 422, "{body}");
    assert!(!body.to_string().contains("S3cr3t"), "{body}");
    assert_eq!(enforced_version(&s)?, v2, "nothing was installed");
    let (status, body) = cp
        .call(
            Method::POST,
            "/session/",
            Some(json!({"base_image": DEBIAN, "egress": bad})),
        )
        .await?;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("secrets.tok.value") && !d.contains("S3cr3t")),
        "{body}"
    );
    Ok(())
}

/// Holds every connection slot of the gateway: opens connections, each answered once (so it
/// holds a slot) and kept alive, until one is closed at accept; prints `full N`. Keeps them
/// until /tmp/release exists (re-sending a request every few seconds, so keep-alive never ends
/// them), then prints `released`.
const HOLD_SLOTS: &str = r#"
import os, socket, time
gw = os.environ["HTTPS_PROXY"].split("//")[1].strip("/")
host, port = gw.rsplit(":", 1)
REQ = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
held = []
def answered(s):
    try:
        s.sendall(REQ)
        return len(s.recv(65536)) > 0
    except OSError:
        return False
while len(held) < 400:
    s = socket.create_connection((host, int(port)), timeout=5)
    if not answered(s):
        break
    held.append(s)
print("full", len(held), flush=True)
while not os.path.exists("/tmp/release"):
    time.sleep(3)
    for s in held:
        answered(s)
for s in held:
    s.close()
print("released", flush=True)
"#;

/// Issue 25 item 7. The acknowledgement of an update (the gateway's own health check, run inside
/// the gateway) no longer shares the proxy port's 256 slots: a sandbox holding them all cannot
/// make `PUT .../egress/` answer 503, and the new policy is in force for a fresh request once
/// the slots free up.
#[tokio::test]
async fn put_egress_is_acknowledged_while_the_sandbox_holds_every_proxy_slot() -> Result<()> {
    let EgressStack { up, cp } = EgressStack::start().await?;
    let s = cp
        .session(json!({"base_image": DEBIAN, "egress": policy(SECRET)}))
        .await?;
    // The CONNECT's status, then the request's (000 when there was none).
    let fetch =
        "curl -s -o /dev/null -w '%{http_connect} %{http_code}' https://other.upstream.test/fresh";
    assert_eq!(cp.sh(&s, fetch).await?.1, "200 200");

    let holder = spawn(
        &cp,
        &s,
        &format!("cat > /tmp/hold.py <<'EOF'\n{HOLD_SLOTS}\nEOF\npython3 /tmp/hold.py"),
    )
    .await?;
    let out = printed(&cp, &s, &holder, "full").await?;
    let held: usize = out
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .context("held count")?;
    assert_eq!(held, 256, "{out}");

    // The update: other.upstream.test is no longer listed.
    let mut tighter = policy(SECRET);
    tighter["policy"]["rules"] = json!([
        {"host": "api.upstream.test", "methods": ["GET"], "inject": "tok"}
    ]);
    let (status, body) = put_egress(&cp, &s, tighter).await?;
    assert_eq!(status, 204, "{body}");

    cp.sh(&s, "touch /tmp/release").await?;
    printed(&cp, &s, &holder, "released").await?;
    let before = up.requests()?.len();
    let code = eventually("a fresh request", Duration::from_secs(30), || async {
        let (_, code) = cp.sh(&s, fetch).await?;
        Ok((code != "000 000").then_some(code))
    })
    .await?;
    assert_eq!(
        code, "403 000",
        "the new policy is enforced (CONNECT refused)"
    );
    assert!(
        up.requests()?[before..]
            .iter()
            .all(|r| r["path"] != "/fresh")
    );
    Ok(())
}

/// Opens a WebSocket through the gateway (CONNECT, TLS with the sandbox's trust, the upgrade),
/// exchanges one frame, prints `echo ok`, then waits up to 60 s for the gateway to close it:
/// `closed` or `still open`.
const WEBSOCKET: &str = r#"
import os, socket, ssl, time
gw = os.environ["HTTPS_PROXY"].split("//")[1].strip("/")
host, port = gw.rsplit(":", 1)
s = socket.create_connection((host, int(port)), timeout=10)
s.sendall(b"CONNECT api.upstream.test:443 HTTP/1.1\r\nHost: api.upstream.test:443\r\n\r\n")
head = b""
while not head.endswith(b"\r\n\r\n"):
    head += s.recv(1)
assert head.startswith(b"HTTP/1.1 200"), head
ctx = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
ctx.set_alpn_protocols(["http/1.1"])
t = ctx.wrap_socket(s, server_hostname="api.upstream.test")
t.sendall(b"GET /ws HTTP/1.1\r\nHost: api.upstream.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
          b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
head = b""
while not head.endswith(b"\r\n\r\n"):
    head += t.recv(1)
assert head.startswith(b"HTTP/1.1 101"), head
t.sendall(b"\x81\x05hello")
got = b""
while len(got) < 7:
    got += t.recv(7 - len(got))
assert got == b"\x81\x05hello", got
print("echo ok", flush=True)
t.settimeout(60)
start = time.time()
try:
    while True:
        b = t.recv(1024)
        if not b:
            break
except socket.timeout:
    print("still open", flush=True)
    raise SystemExit(1)
except (ssl.SSLError, OSError):
    pass
print("closed after %.1f s" % (time.time() - start), flush=True)
"#;

/// Issue 25 item 8. A WebSocket outlived the policy that allowed it: after the 101 the gateway
/// spliced bytes and never looked again. Now an update that removes its host closes it, as
/// blind tunnels are closed.
#[tokio::test]
async fn put_egress_closes_a_websocket_whose_host_it_removes() -> Result<()> {
    let EgressStack { up, cp } = EgressStack::start().await?;
    let s = cp
        .session(json!({"base_image": DEBIAN, "egress": policy(SECRET)}))
        .await?;
    let ws = spawn(
        &cp,
        &s,
        &format!("cat > /tmp/ws.py <<'EOF'\n{WEBSOCKET}\nEOF\npython3 /tmp/ws.py"),
    )
    .await?;
    printed(&cp, &s, &ws, "echo ok").await?;
    let handshake = up
        .requests()?
        .into_iter()
        .find(|r| r["path"] == "/ws")
        .context("the upstream saw the upgrade")?;
    assert_eq!(handshake["headers"]["authorization"], SECRET);

    let mut without = policy(SECRET);
    without["policy"]["rules"] = json!([{"host": "other.upstream.test"}]);
    let (status, body) = put_egress(&cp, &s, without).await?;
    assert_eq!(status, 204, "{body}");
    let out = printed(&cp, &s, &ws, "closed").await?;
    assert!(!out.contains("still open"), "{out}");

    let (_, gateway) = gateway_of(&s.id)?;
    let audit = docker(&["logs", &gateway])?;
    let closed = audit
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["status"] == 101);
    let closed = closed.context("the websocket's audit line")?;
    assert_eq!(closed["decision"], "deny", "{closed}");
    assert_eq!(closed["reason"], "host-not-listed", "{closed}");
    Ok(())
}
