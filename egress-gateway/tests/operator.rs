//! Operator features, in-process: typed denials, path rules, shadow mode, policy versions on the
//! health listener (and nowhere the sandbox looks), the staged (atomic, acknowledged) install,
//! WebSockets across reloads, and the plain-HTTP opt-in.

mod common;

use std::time::Duration;

use common::{Options, Trust, denied_code, eventually, start, start_with, write_policy};
use serde_json::{Value, json};

const SECRET: &str = "glpat-sekrit-0123456789";

async fn echo(resp: reqwest::Response) -> Value {
    assert_eq!(resp.status(), 200, "{:?}", resp.headers());
    serde_json::from_slice(&resp.bytes().await.expect("echo body")).expect("echo json")
}

/// `GET /-/health/` on the gateway's health listener.
async fn health(h: &common::Harness, json: bool) -> reqwest::Response {
    let mut req = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
        .get(format!("http://{}/-/health/", h.health));
    if json {
        req = req.header("accept", "application/json");
    }
    req.send().await.expect("health")
}

async fn enforced_version(h: &common::Harness) -> Option<String> {
    let resp = health(h, false).await;
    assert_eq!(resp.status(), 200);
    resp.headers()
        .get("x-egress-policy-version")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

#[tokio::test]
async fn denials_are_typed_json_when_the_client_accepts_json() {
    let h = start(json!({
        "version": "v1",
        "policy": {"default": "deny", "rules": [{"host": "upstream.test", "methods": ["GET"]}]}
    }))
    .await;
    let client = h.client(Trust::Gateway, true);
    let resp = client
        .post(h.https_url("upstream.test", "/echo"))
        .header("accept", "application/json, text/plain;q=0.5")
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 403);
    assert_eq!(denied_code(&resp).as_deref(), Some("method-not-allowed"));
    assert_eq!(resp.headers()["content-type"], "application/json");
    assert!(resp.headers().get("x-egress-policy-version").is_none());
    let body: Value = serde_json::from_slice(&resp.bytes().await.expect("body")).expect("json");
    assert_eq!(body["error"], "egress_denied");
    assert_eq!(body["reason"], "method-not-allowed");
    assert_eq!(body["host"], "upstream.test");
    assert_eq!(body["method"], "POST");
    assert_eq!(body["rule"], "upstream.test");
    assert!(body.get("policy_version").is_none(), "{body}");
    assert_eq!(body["path"], "/echo");

    // Plaintext, unlisted host: no rule key; `*/*` (curl's default) keeps the plain text.
    let resp = client
        .get(h.http_url("unlisted.test", "/"))
        .header("accept", "application/json")
        .send()
        .await
        .expect("send");
    assert_eq!(denied_code(&resp).as_deref(), Some("host-not-listed"));
    let body: Value = serde_json::from_slice(&resp.bytes().await.expect("body")).expect("json");
    assert_eq!(body["reason"], "host-not-listed");
    assert!(body.get("rule").is_none(), "{body}");
    for accept in [None, Some("*/*"), Some("application/json;q=0")] {
        let mut req = client.post(h.https_url("upstream.test", "/echo"));
        if let Some(a) = accept {
            req = req.header("accept", a);
        }
        let resp = req.send().await.expect("send");
        assert_eq!(resp.status(), 403);
        assert!(
            resp.headers()["content-type"]
                .to_str()
                .expect("ct")
                .starts_with("text/plain"),
            "{accept:?}"
        );
        let text = resp.text().await.expect("text");
        assert!(
            text.starts_with("egress denied (method-not-allowed)"),
            "{text}"
        );
    }
}

#[tokio::test]
async fn path_rules_scope_a_credential_after_mitm() {
    let h = start(json!({
        "policy": {"default": "deny", "rules": [
            {"host": "upstream.test", "methods": ["GET"], "paths": ["/echo"], "inject": "tok"},
            {"host": "upstream.test", "methods": ["GET", "POST"], "paths": ["/api/**"]}
        ]},
        "secrets": {"tok": {"header": "PRIVATE-TOKEN", "value": SECRET}}
    }))
    .await;
    let client = h.client(Trust::Gateway, true);
    let body = echo(
        client
            .get(h.https_url("upstream.test", "/echo"))
            .send()
            .await
            .expect("send"),
    )
    .await;
    assert_eq!(body["headers"]["private-token"], json!([SECRET]));
    // Another path on the same host: no rule allows it.
    let resp = client
        .get(h.https_url("upstream.test", "/elsewhere"))
        .send()
        .await
        .expect("send");
    assert_eq!(denied_code(&resp).as_deref(), Some("path-not-allowed"));
    // Rule 1's paths let a POST through (the fixture answers what it answers), uncredentialed.
    let resp = client
        .post(h.https_url("upstream.test", "/api/v4/x"))
        .send()
        .await
        .expect("send");
    assert!(denied_code(&resp).is_none(), "{:?}", resp.headers());

    // The credential moves with its paths: now scoped elsewhere, /echo gets none.
    write_policy(
        &h.policy_path,
        &json!({
            "version": "scoped-elsewhere",
            "policy": {"default": "deny", "rules": [
                {"host": "upstream.test", "paths": ["/api/**"], "inject": "tok"},
                {"host": "upstream.test", "methods": ["GET"]}
            ]},
            "secrets": {"tok": {"header": "PRIVATE-TOKEN", "value": SECRET}}
        })
        .to_string(),
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            enforced_version(&h).await.as_deref() == Some("scoped-elsewhere")
        })
        .await
    );
    let body = echo(
        client
            .get(h.https_url("upstream.test", "/echo"))
            .send()
            .await
            .expect("send"),
    )
    .await;
    assert!(body["headers"].get("private-token").is_none(), "{body}");
    let lines = h.audit_lines();
    assert!(
        lines
            .iter()
            .any(|l| l["reason"] == "path-not-allowed" && l["path"] == "/elsewhere"),
        "{lines:?}"
    );
}

#[tokio::test]
async fn shadow_flag_reports_denials_and_lets_them_through() {
    let h = start_with(
        json!({"version": "v-shadow", "policy": {"default": "deny", "rules": [{"host": "nothing.test"}]}}),
        Options {
            shadow: true,
            ..Options::default()
        },
    )
    .await;
    let client = h.client(Trust::Gateway, true);
    let body = echo(
        client
            .get(h.https_url("upstream.test", "/echo"))
            .send()
            .await
            .expect("send"),
    )
    .await;
    assert_eq!(body["path"], "/echo");
    let lines = h.audit_lines();
    let connect = lines
        .iter()
        .find(|l| l["mode"] == "connect")
        .expect("connect line");
    assert_eq!(connect["decision"], "deny");
    assert_eq!(connect["enforced"], false);
    assert_eq!(connect["reason"], "host-not-listed");
    assert!(
        eventually(Duration::from_secs(5), || async {
            h.audit_lines().iter().any(|l| {
                l["mode"] == "mitm"
                    && l["decision"] == "deny"
                    && l["enforced"] == false
                    && l["reason"] == "host-not-listed"
                    && l["status"] == 200
                    && l["policy_version"] == "v-shadow"
            })
        })
        .await,
        "{:?}",
        h.audit_lines()
    );
    let doc: Value =
        serde_json::from_slice(&health(&h, true).await.bytes().await.expect("b")).expect("json");
    assert_eq!(doc["shadow"], true);
    // A broken policy is still enforced: fail closed even in shadow mode.
    write_policy(&h.policy_path, "{\"policy\": ");
    assert!(
        eventually(Duration::from_secs(5), || async {
            let resp = client.get(h.http_url("upstream.test", "/")).send().await;
            resp.is_ok_and(|r| denied_code(&r).as_deref() == Some("policy-unavailable"))
        })
        .await
    );
}

#[tokio::test]
async fn shadow_policy_field_reports_method_denials() {
    let h = start(json!({
        "policy": {"mode": "shadow", "default": "deny", "rules": [{"host": "upstream.test", "methods": ["GET"]}]}
    }))
    .await;
    let client = h.client(Trust::Gateway, true);
    let resp = client
        .post(h.https_url("upstream.test", "/echo"))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    assert!(
        eventually(Duration::from_secs(5), || async {
            h.audit_lines().iter().any(|l| {
                l["mode"] == "mitm"
                    && l["method"] == "POST"
                    && l["decision"] == "deny"
                    && l["enforced"] == false
                    && l["reason"] == "method-not-allowed"
            })
        })
        .await
    );
    // Enforced decisions say so.
    client
        .get(h.https_url("upstream.test", "/echo"))
        .send()
        .await
        .expect("send");
    assert!(
        eventually(Duration::from_secs(5), || async {
            h.audit_lines()
                .iter()
                .any(|l| l["method"] == "GET" && l["decision"] == "allow" && l["enforced"] == true)
        })
        .await
    );
}

#[tokio::test]
async fn health_reports_the_version_and_a_staged_policy_is_installed_when_complete() {
    let h = start(json!({"version": "v1", "policy": {"default": "allow"}})).await;
    assert_eq!(enforced_version(&h).await.as_deref(), Some("v1"));
    let doc: Value =
        serde_json::from_slice(&health(&h, true).await.bytes().await.expect("b")).expect("json");
    assert_eq!(
        doc,
        json!({"status": "ok", "policy": "loaded", "policy_version": "v1", "shadow": false})
    );
    let staged = shared_policy::sidecar::staging_path_for(&h.policy_path);
    let v2 = json!({"version": "v2", "policy": {"default": "deny", "rules": [{"host": "upstream.test"}]}})
        .to_string();
    // Written in place, in two parts, as an archive extraction may: the first half never counts.
    std::fs::write(&staged, &v2[..v2.len() / 2]).expect("write");
    tokio::time::sleep(shared_policy_settle() * 3).await;
    assert_eq!(enforced_version(&h).await.as_deref(), Some("v1"));
    assert!(staged.exists(), "an incomplete staged file stays");
    std::fs::write(&staged, &v2).expect("write");
    assert!(
        eventually(Duration::from_secs(5), || async {
            enforced_version(&h).await.as_deref() == Some("v2")
        })
        .await
    );
    // Installed by copy + rename: the staged file stays (its writer may still set its metadata
    // by path), and is not installed again.
    assert!(staged.exists());
    let installed = std::fs::metadata(&h.policy_path)
        .expect("policy")
        .modified()
        .expect("mtime");
    tokio::time::sleep(shared_policy_settle() * 2).await;
    assert_eq!(
        std::fs::metadata(&h.policy_path)
            .expect("policy")
            .modified()
            .expect("mtime"),
        installed,
        "installed once"
    );

    // The `health` subcommand, as the control plane runs it inside the gateway.
    let addr = h.health;
    let (code, text) = tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        let code = egress_gateway::cli::health(addr, Some("v2"), Duration::from_secs(5), &mut out)
            .expect("io");
        (code, String::from_utf8_lossy(&out).into_owned())
    })
    .await
    .expect("join");
    assert_eq!((code, text.trim()), (0, "ok policy_version=v2"));
    let (code, text) = tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        let code =
            egress_gateway::cli::health(addr, Some("v9"), Duration::from_millis(100), &mut out)
                .expect("io");
        (code, String::from_utf8_lossy(&out).into_owned())
    })
    .await
    .expect("join");
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("enforces policy_version=v2"), "{text}");
}

fn shared_policy_settle() -> Duration {
    egress_gateway::policy_store::POLL_INTERVAL
}

#[tokio::test]
async fn an_in_place_write_is_not_reloaded_until_the_file_is_replaced() {
    let h = start(json!({"version": "v1", "policy": {"default": "allow"}})).await;
    let client = h.client(Trust::Gateway, true);
    let url = h.https_url("upstream.test", "/echo");
    assert_eq!(client.get(&url).send().await.expect("send").status(), 200);
    let deny = json!({"version": "v2", "policy": {"default": "deny", "rules": [{"host": "nothing.test"}]}})
        .to_string();
    std::fs::write(&h.policy_path, &deny).expect("write in place");
    tokio::time::sleep(shared_policy_settle() * 3).await;
    assert_eq!(enforced_version(&h).await.as_deref(), Some("v1"));
    assert_eq!(client.get(&url).send().await.expect("send").status(), 200);
    // Replaced (renamed over): in effect.
    write_policy(&h.policy_path, &deny);
    assert!(
        eventually(Duration::from_secs(5), || async {
            enforced_version(&h).await.as_deref() == Some("v2")
        })
        .await
    );
    // While the policy is unusable, any change is read, so a fix always takes effect.
    write_policy(&h.policy_path, "not json");
    assert!(
        eventually(Duration::from_secs(5), || async {
            enforced_version(&h).await.is_none()
        })
        .await
    );
    std::fs::write(
        &h.policy_path,
        json!({"version": "v3", "policy": {"default": "allow"}}).to_string(),
    )
    .expect("write in place");
    assert!(
        eventually(Duration::from_secs(5), || async {
            enforced_version(&h).await.as_deref() == Some("v3")
        })
        .await
    );
}

/// The acceptance check, in-process: 100 staged updates, each acknowledged through the
/// health endpoint, while a client keeps requesting a host both versions allow: no denial.
#[tokio::test]
async fn no_spurious_denials_across_100_staged_updates_under_load() {
    let policy = |n: usize| {
        json!({
            "version": format!("v{n}"),
            "policy": {"default": "deny", "rules": [
                {"host": "upstream.test", "methods": ["GET"]},
                {"host": format!("other-{n}.test")}
            ]}
        })
        .to_string()
    };
    let h = start(serde_json::from_str(&policy(0)).expect("json")).await;
    let client = h.client(Trust::Gateway, true);
    let url = h.https_url("upstream.test", "/echo");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for _ in 0..4 {
        let (client, url, stop) = (client.clone(), url.clone(), stop.clone());
        load.push(tokio::spawn(async move {
            let (mut ok, mut denied) = (0u64, 0u64);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match client.get(&url).send().await {
                    Ok(r) if r.status() == 200 => ok += 1,
                    Ok(r) => {
                        denied += 1;
                        eprintln!("spurious: {} {:?}", r.status(), denied_code(&r));
                    }
                    Err(e) => panic!("request failed: {e}"),
                }
            }
            (ok, denied)
        }));
    }
    let staged = shared_policy::sidecar::staging_path_for(&h.policy_path);
    for n in 1..=100 {
        // In place, like an archive extraction: the gateway installs it when complete.
        std::fs::write(&staged, policy(n)).expect("stage");
        let want = format!("v{n}");
        assert!(
            eventually(Duration::from_secs(10), || async {
                enforced_version(&h).await.as_deref() == Some(want.as_str())
            })
            .await,
            "update {n} not acknowledged"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut ok, mut denied) = (0, 0);
    for task in load {
        let (o, d) = task.await.expect("load task");
        ok += o;
        denied += d;
    }
    assert!(ok > 0);
    assert_eq!(
        denied, 0,
        "{denied} requests denied across updates ({ok} allowed)"
    );
}

async fn scrape(h: &common::Harness) -> String {
    let addr = h.metrics.expect("metrics enabled");
    let resp = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .expect("scrape");
    assert_eq!(resp.status(), 200);
    resp.text().await.expect("text")
}

/// The value of the sample whose line starts with `prefix` (name and labels), if present.
fn sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn metrics_count_decisions_bytes_latency_cache_and_policy_on_their_own_port() {
    let h = start_with(
        json!({"version": "m1", "policy": {"default": "deny", "rules": [{"host": "upstream.test", "methods": ["GET"]}]}}),
        Options {
            metrics: true,
            ..Options::default()
        },
    )
    .await;
    let client = h.client(Trust::Gateway, true);
    for _ in 0..3 {
        echo(
            client
                .get(h.https_url("upstream.test", "/echo"))
                .send()
                .await
                .expect("send"),
        )
        .await;
    }
    let resp = client
        .post(h.https_url("upstream.test", "/echo"))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 403);
    assert!(
        eventually(Duration::from_secs(5), || async {
            let text = scrape(&h).await;
            sample(
                &text,
                "egress_decisions_total{mode=\"mitm\",decision=\"allow\",reason=\"rule-allowed\",enforced=\"true\"}",
            ) == Some(3.0)
        })
        .await,
        "{}",
        scrape(&h).await
    );
    let text = scrape(&h).await;
    assert_eq!(
        sample(
            &text,
            "egress_decisions_total{mode=\"mitm\",decision=\"deny\",reason=\"method-not-allowed\",enforced=\"true\"}"
        ),
        Some(1.0),
        "{text}"
    );
    assert!(
        sample(
            &text,
            "egress_bytes_total{direction=\"down\",mode=\"mitm\"}"
        )
        .is_some_and(|b| b > 0.0),
        "{text}"
    );
    assert!(
        sample(&text, "egress_upstream_latency_seconds_count").is_some_and(|n| n >= 3.0),
        "{text}"
    );
    // One CONNECT per connection; reqwest reuses it, so at least one mint.
    assert!(
        sample(&text, "egress_tls_leaf_cache_total{result=\"miss\"}").is_some_and(|n| n >= 1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "egress_policy_version_info{version=\"m1\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(sample(&text, "egress_policy_loaded"), Some(1.0), "{text}");
    assert_eq!(
        sample(&text, "egress_policy_reload_failures_total"),
        Some(0.0),
        "{text}"
    );
    // A broken update: deny-all, counted as a failure.
    write_policy(&h.policy_path, "{");
    assert!(
        eventually(Duration::from_secs(5), || async {
            let text = scrape(&h).await;
            sample(&text, "egress_policy_loaded") == Some(0.0)
                && sample(&text, "egress_policy_reload_failures_total") == Some(1.0)
        })
        .await,
        "{}",
        scrape(&h).await
    );
    // Not on the proxy port: the sandbox's side has no /metrics.
    let resp = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
        .get(format!("http://{}/metrics", h.gateway))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 400);
}

#[tokio::test]
async fn metrics_are_off_by_default() {
    let h = start(json!({"policy": {"default": "allow"}})).await;
    assert!(h.metrics.is_none());
    let cli = <egress_gateway::config::Cli as clap::Parser>::try_parse_from(["x"]).expect("parse");
    assert!(cli.serve.metrics_listen.is_none());
}

/// A TLS upstream that answers one WebSocket handshake with 101 (echoing what it saw of the
/// credential in a header) and then echoes every byte.
async fn websocket_upstream(
    ca: &integration::fixtures::TestCa,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut cfg = ca.server_config(&["upstream.test"]).expect("cert");
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(cfg));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("accept");
        let mut tls = acceptor.accept(tcp).await.expect("tls");
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if tls.read(&mut byte).await.expect("read") == 0 {
                return;
            }
            head.push(byte[0]);
        }
        let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
        let token = text
            .lines()
            .find_map(|l| l.strip_prefix("x-token: "))
            .unwrap_or("none")
            .trim()
            .to_owned();
        assert!(text.contains("upgrade: websocket"), "{text}");
        let resp = format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nX-Saw-Token: {token}\r\n\r\n"
        );
        tls.write_all(resp.as_bytes()).await.expect("write");
        let mut buf = [0u8; 1024];
        loop {
            match tls.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tls.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    (addr, task)
}

#[tokio::test]
async fn websocket_upgrades_pass_through_the_mitm_after_the_policy_check() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = start(json!({
        "policy": {"default": "deny", "rules": [
            {"host": "upstream.test", "methods": ["GET"], "paths": ["/ws"], "inject": "tok"}
        ]},
        "secrets": {"tok": {"header": "X-Token", "value": "t0k"}}
    }))
    .await;
    let (addr, upstream) = websocket_upstream(&h.upstream_ca).await;
    let authority = format!("upstream.test:{}", addr.port());
    let (status, _, tcp) = h.raw_connect(&authority).await;
    assert_eq!(status, 200);
    let mut tls = h.tls_over(tcp, "upstream.test").await.expect("tls");
    // Denied first (another path): the upgrade never reaches the upstream.
    let handshake = |path: &str| {
        format!(
            "GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        )
    };
    tls.write_all(handshake("/other").as_bytes())
        .await
        .expect("write");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert!(tls.read(&mut byte).await.expect("read") > 0);
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(
        text.starts_with("http/1.1 403") && text.contains("x-egress-denied: path-not-allowed"),
        "{text}"
    );
    // Drain the 403's body (content-length) before the next request on this connection.
    let len: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|v| v.trim().parse().ok())
        .expect("content-length");
    let mut body = vec![0u8; len];
    tls.read_exact(&mut body).await.expect("body");

    tls.write_all(handshake("/ws").as_bytes())
        .await
        .expect("write");
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        assert!(tls.read(&mut byte).await.expect("read") > 0);
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(text.starts_with("http/1.1 101"), "{text}");
    assert!(
        text.contains("upgrade: websocket") && text.contains("x-saw-token: t0k"),
        "{text}"
    );
    // Frames (any bytes) stream both ways.
    for msg in [&b"\x81\x05hello"[..], &[0x42u8; 20_000][..]] {
        tls.write_all(msg).await.expect("write");
        let mut back = vec![0u8; msg.len()];
        tls.read_exact(&mut back).await.expect("echo");
        assert_eq!(back, msg);
    }
    drop(tls);
    upstream.await.expect("upstream");
    assert!(
        eventually(Duration::from_secs(5), || async {
            h.audit_lines().iter().any(|l| {
                l["mode"] == "mitm"
                    && l["status"] == 101
                    && l["decision"] == "allow"
                    && l["injected"] == "X-Token"
                    && l["bytes"].as_u64() >= Some(20_007)
                    && l["bytes_up"].as_u64() >= Some(20_007)
            })
        })
        .await,
        "{:?}",
        h.audit_lines()
    );
}

/// A minimal CONNECT proxy on loopback: records each CONNECT target and its
/// `Proxy-Authorization`, then splices.
async fn connect_proxy() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::Mutex<Vec<(String, Option<String>)>>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut tcp, _)) = listener.accept().await else {
                return;
            };
            let log = log.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if tcp.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let text = String::from_utf8_lossy(&head).into_owned();
                let target = text
                    .split_whitespace()
                    .nth(1)
                    .unwrap_or_default()
                    .to_owned();
                let auth = text
                    .lines()
                    .find_map(|l| l.strip_prefix("Proxy-Authorization: "))
                    .map(str::to_owned);
                log.lock().expect("log").push((target.clone(), auth));
                let Ok(mut up) = tokio::net::TcpStream::connect(&target).await else {
                    let _ = tcp.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
                    return;
                };
                let _ = tcp
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await;
                let _ = tokio::io::copy_bidirectional(&mut tcp, &mut up).await;
            });
        }
    });
    (addr, seen)
}

#[tokio::test]
async fn upstream_connections_chain_through_a_proxy_with_the_guard_still_applied() {
    let (proxy, seen) = connect_proxy().await;
    let h = start_with(
        json!({"policy": {"default": "deny", "intercept": "credentialed", "rules": [
            {"host": "upstream.test", "inject": "tok"},
            {"host": "other.test"}
        ]}, "secrets": {"tok": {"header": "X-Token", "value": "t0k"}}}),
        Options {
            upstream_proxy: Some(format!("http://corp%40user:pa%3Ass@{proxy}")),
            ..Options::default()
        },
    )
    .await;
    // MITM'd: the gateway's own upstream connection goes through the proxy.
    let body = echo(
        h.client(Trust::Gateway, true)
            .get(h.https_url("upstream.test", "/echo"))
            .send()
            .await
            .expect("send"),
    )
    .await;
    assert_eq!(body["headers"]["x-token"], json!(["t0k"]));
    // Blind tunnel: too.
    let resp = h
        .client(Trust::Upstream, true)
        .get(h.https_url("other.test", "/echo"))
        .send()
        .await
        .expect("tunnel");
    assert_eq!(resp.status(), 200);
    let seen = seen.lock().expect("log").clone();
    let want = format!("127.0.0.1:{}", h.https.addr.port());
    assert!(seen.len() >= 2, "{seen:?}");
    // CONNECT names the address the guard checked, never a name for the proxy to resolve.
    use base64::Engine;
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("corp@user:pa:ss")
    );
    for (target, auth) in &seen {
        assert_eq!(target, &want);
        assert_eq!(auth.as_deref(), Some(basic.as_str()));
    }

    // The SSRF guard still applies to the destination (not to the proxy, which is loopback).
    let (proxy2, seen2) = connect_proxy().await;
    let h = start_with(
        json!({"policy": {"default": "allow"}}),
        Options {
            allowed_cidrs: vec![],
            upstream_proxy: Some(format!("http://{proxy2}")),
            ..Options::default()
        },
    )
    .await;
    let resp = h
        .client(Trust::Gateway, true)
        .get(h.http_url("upstream.test", "/"))
        .send()
        .await
        .expect("send");
    assert_eq!(denied_code(&resp).as_deref(), Some("address-not-allowed"));
    assert!(
        seen2.lock().expect("log").is_empty(),
        "nothing reached the proxy"
    );
}

#[test]
fn upstream_proxy_urls_are_parsed_and_never_print_credentials() {
    use egress_gateway::proxy::upstream::UpstreamProxy;
    let p = UpstreamProxy::parse("http://user:sekrit@proxy.corp.test").expect("parse");
    assert_eq!(p.addr, "proxy.corp.test:3128");
    assert!(!format!("{p:?}").contains("sekrit"));
    assert!(UpstreamProxy::parse("https://proxy.test:3128").is_err());
    assert!(UpstreamProxy::parse("not a url").is_err());
    assert_eq!(
        UpstreamProxy::parse("http://10.0.0.1:8080")
            .expect("parse")
            .addr,
        "10.0.0.1:8080"
    );
}

/// Everything a client of the proxy port sees of one exchange, minus the `date` header.
async fn seen(resp: reqwest::Response) -> String {
    let mut out = format!("{}\n", resp.status());
    for (k, v) in resp.headers() {
        if k != "date" {
            out.push_str(&format!("{k}: {}\n", v.to_str().unwrap_or("?")));
        }
    }
    out + &resp.text().await.unwrap_or_default()
}

/// What a sandbox can ask the proxy port about its policy: a denial (text and JSON, inside a
/// MITM'd tunnel and plaintext), a refused CONNECT, and the health path.
async fn sandbox_view(h: &common::Harness) -> Vec<String> {
    let client = h.client(Trust::Gateway, true);
    let direct = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let mut out = Vec::new();
    for accept in ["*/*", "application/json"] {
        for url in [
            h.https_url("upstream.test", "/echo"),
            h.http_url("upstream.test", "/echo"),
        ] {
            let resp = client.delete(url).header("accept", accept).send().await;
            out.push(seen(resp.expect("denial")).await);
        }
    }
    let (status, head, _) = h.raw_connect("unlisted.test:443").await;
    let head: Vec<&str> = head.lines().filter(|l| !l.starts_with("date:")).collect();
    out.push(format!("{status} {}", head.join("\n")));
    for path in ["/-/health/", "/-/health"] {
        let resp = direct
            .get(format!("http://{}{path}", h.gateway))
            .send()
            .await;
        out.push(seen(resp.expect("health on the proxy port")).await);
    }
    out
}

/// Issue 25 item 4: the version labels a policy whose secrets the sandbox must not learn about.
/// Two policies that differ only in a secret value (and in the version label the control plane
/// gives each) look exactly the same from the proxy port; only the health listener, which the
/// sandbox cannot reach, tells them apart.
#[tokio::test]
async fn the_proxy_port_shows_nothing_that_tells_two_secrets_apart() {
    let policy = |secret: &str, version: &str| {
        json!({
            "version": version,
            "policy": {"default": "deny", "rules": [
                {"host": "upstream.test", "methods": ["GET"], "inject": "tok"}
            ]},
            "secrets": {"tok": {"header": "Authorization", "value": secret}}
        })
    };
    let h = start(policy("s3cr3t-one", "hmac:11111111")).await;
    let first = sandbox_view(&h).await;
    write_policy(
        &h.policy_path,
        &policy("s3cr3t-two", "hmac:22222222").to_string(),
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            enforced_version(&h).await.as_deref() == Some("hmac:22222222")
        })
        .await
    );
    let second = sandbox_view(&h).await;
    assert_eq!(first, second);
    let all = first.join("\n");
    assert!(all.contains("method-not-allowed") && all.contains("host-not-listed"));
    assert!(!all.contains("hmac:") && !all.contains("s3cr3t"), "{all}");
    assert!(!all.to_ascii_lowercase().contains("version"), "{all}");
    // The health path is no answer of the proxy port's.
    assert!(
        first[first.len() - 1].starts_with("400 "),
        "{}",
        first[first.len() - 1]
    );
    // The operator still has the version, in the audit line of each denial.
    assert!(
        h.audit_lines()
            .iter()
            .any(|l| l["decision"] == "deny" && l["policy_version"] == "hmac:22222222")
    );
}

/// Issue 25 item 7: a sandbox holding every connection slot of the proxy port cannot keep a
/// policy update from being acknowledged: the health listener has slots of its own.
#[tokio::test]
async fn acknowledgements_do_not_wait_for_proxy_slots() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const CAP: usize = 4;
    let v1 = json!({"version": "v1", "policy": {"default": "deny", "rules": [{"host": "upstream.test"}]}});
    let h = start_with(
        v1,
        Options {
            limits: egress_gateway::Limits {
                max_connections: CAP,
                ..Default::default()
            },
            ..Options::default()
        },
    )
    .await;
    let url = h.http_url("upstream.test", "/");
    assert_eq!(
        h.client(Trust::Gateway, true)
            .get(&url)
            .send()
            .await
            .expect("send")
            .status(),
        200
    );
    // Hold every slot: each connection is answered once (so it holds a slot), then kept open.
    let mut held = Vec::new();
    while held.len() < CAP {
        let mut tcp = tokio::net::TcpStream::connect(h.gateway)
            .await
            .expect("connect");
        let _ = tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let mut buf = [0u8; 512];
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf)).await
            && n > 0
        {
            held.push(tcp);
        }
    }
    let mut extra = tokio::net::TcpStream::connect(h.gateway)
        .await
        .expect("connect");
    let _ = extra.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(10), extra.read(&mut buf))
        .await
        .expect("closed at accept")
        .unwrap_or(0);
    assert_eq!(n, 0, "the proxy port is full");

    // An update is installed and acknowledged meanwhile, as the control plane asks for it.
    let ack = |version: &'static str| {
        let addr = h.health;
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            let code =
                egress_gateway::cli::health(addr, Some(version), Duration::from_secs(5), &mut out)
                    .expect("io");
            (code, String::from_utf8_lossy(&out).into_owned())
        })
    };
    assert_eq!(ack("v1").await.expect("join").0, 0);
    write_policy(
        &h.policy_path,
        &json!({"version": "v2", "policy": {"default": "deny", "rules": [{"host": "other.test"}]}})
            .to_string(),
    );
    let (code, text) = ack("v2").await.expect("join");
    assert_eq!((code, text.trim()), (0, "ok policy_version=v2"));

    // Once the slots free up, a fresh request gets the new policy.
    drop(held);
    assert!(
        eventually(Duration::from_secs(10), || async {
            let resp = h.client(Trust::Gateway, true).get(&url).send().await;
            resp.is_ok_and(|r| denied_code(&r).as_deref() == Some("host-not-listed"))
        })
        .await
    );
}

/// Opens a WebSocket through the MITM to the fixture at `addr`; returns the client's TLS stream
/// after the 101 and one echoed frame.
async fn open_websocket(
    h: &common::Harness,
    addr: std::net::SocketAddr,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let authority = format!("upstream.test:{}", addr.port());
    let (status, _, tcp) = h.raw_connect(&authority).await;
    assert_eq!(status, 200);
    let mut tls = h.tls_over(tcp, "upstream.test").await.expect("tls");
    let handshake = format!(
        "GET /ws HTTP/1.1\r\nHost: {authority}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    tls.write_all(handshake.as_bytes()).await.expect("write");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert!(tls.read(&mut byte).await.expect("read") > 0);
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(text.starts_with("http/1.1 101"), "{text}");
    tls.write_all(b"\x81\x05hello").await.expect("write");
    let mut back = [0u8; 7];
    tls.read_exact(&mut back).await.expect("echo");
    assert_eq!(&back, b"\x81\x05hello");
    tls
}

/// Whether the gateway closes `tls` within a few seconds (end of stream or an error), rather
/// than keep echoing.
async fn websocket_closes(
    tls: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = tls.write_all(b"\x81\x01x").await;
    let mut buf = [0u8; 64];
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match tokio::time::timeout_at(deadline.into(), tls.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// Issue 25 item 8: a WebSocket is re-checked on every reload, as blind tunnels are. A reload
/// that leaves it allowed (with the same credential) keeps it; one that removes its host, or
/// changes the credential it was opened with, closes it.
#[tokio::test]
async fn a_reload_closes_websockets_the_new_policy_would_not_open() {
    let policy = |rules: Value, secret: &str| {
        json!({
            "policy": {"default": "deny", "rules": rules},
            "secrets": {"tok": {"header": "X-Token", "value": secret}}
        })
    };
    let ws_rule = json!({"host": "upstream.test", "methods": ["GET"], "inject": "tok"});
    let h = start(policy(json!([ws_rule.clone()]), "t0k")).await;
    let reload = |doc: Value| {
        let before = h.audit.lines().len();
        write_policy(&h.policy_path, &doc.to_string());
        before
    };
    let settle = || tokio::time::sleep(shared_policy_settle());

    // An unrelated change: the socket stays.
    let (addr, upstream) = websocket_upstream(&h.upstream_ca).await;
    let mut tls = open_websocket(&h, addr).await;
    reload(policy(
        json!([ws_rule.clone(), {"host": "other.test"}]),
        "t0k",
    ));
    settle().await;
    assert!(
        !websocket_closes(&mut tls).await,
        "an unrelated reload closed it"
    );

    // The credential it was opened with is no longer the policy's: closed.
    reload(policy(
        json!([ws_rule.clone(), {"host": "other.test"}]),
        "rotated",
    ));
    assert!(
        websocket_closes(&mut tls).await,
        "still open with the old credential"
    );
    upstream.await.expect("upstream");

    // Its host removed: closed, like a blind tunnel.
    let (addr, upstream) = websocket_upstream(&h.upstream_ca).await;
    let mut tls = open_websocket(&h, addr).await;
    reload(policy(json!([{"host": "other.test"}]), "rotated"));
    assert!(
        websocket_closes(&mut tls).await,
        "still open after its host was removed"
    );
    upstream.await.expect("upstream");

    let closed: Vec<Value> = h
        .audit_lines()
        .into_iter()
        .filter(|l| l["status"] == 101 && l["decision"] == "deny")
        .collect();
    let reasons: Vec<&str> = closed.iter().filter_map(|l| l["reason"].as_str()).collect();
    assert_eq!(
        reasons,
        ["credential-changed", "host-not-listed"],
        "{closed:?}"
    );
}

/// Issue 21 item 5, the part that needs no private network: the opt-in is named hosts only,
/// and never reaches loopback even where `--allowed-cidrs` opens it for ordinary requests;
/// unlisted hosts keep credentials TLS-only. (The private-network half is end to end:
/// `tests/tests/egress_plain_http.rs`.)
#[tokio::test]
async fn plain_http_opt_in_is_for_listed_hosts_on_private_networks_only() {
    let h = start_with(
        json!({
            "policy": {"default": "deny", "rules": [
                {"host": "upstream.test", "inject": "tok"},
                {"host": "other.test", "inject": "tok"}
            ]},
            "secrets": {"tok": {"header": "PRIVATE-TOKEN", "value": "glpat-x"}}
        }),
        Options {
            plain_http_hosts: vec!["upstream.test"],
            ..Options::default()
        },
    )
    .await;
    let client = h.client(Trust::Gateway, true);
    let resp = client
        .get(h.http_url("upstream.test", "/echo"))
        .send()
        .await
        .expect("send");
    assert_eq!(denied_code(&resp).as_deref(), Some("address-not-allowed"));
    let resp = client
        .get(h.http_url("other.test", "/echo"))
        .send()
        .await
        .expect("send");
    assert_eq!(denied_code(&resp).as_deref(), Some("tls-required"));
    // Over TLS nothing changes for the listed host: MITM'd, credential injected, loopback
    // allowed by --allowed-cidrs as for any host.
    let body = echo(
        client
            .get(h.https_url("upstream.test", "/echo"))
            .send()
            .await
            .expect("send"),
    )
    .await;
    assert_eq!(body["headers"]["private-token"][0], "glpat-x");
    let lines = h.audit_lines();
    let plain: Vec<&Value> = lines.iter().filter(|l| l["mode"] == "forward").collect();
    assert_eq!(plain.len(), 2, "{lines:?}");
    assert_eq!(plain[0]["plain_http_opt_in"], true);
    assert_eq!(plain[0]["reason"], "address-not-allowed");
    assert!(
        plain[1].get("plain_http_opt_in").is_none(),
        "{:?}",
        plain[1]
    );
    assert!(
        lines
            .iter()
            .filter(|l| l["mode"] != "forward")
            .all(|l| l.get("plain_http_opt_in").is_none())
    );
}
