//! The gateway in-process, driven by real clients against loopback fixture upstreams.

mod common;

use std::time::Duration;

use common::{Options, Trust, denied_code, eventually, start, start_with, write_policy};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SECRET: &str = "Bearer sekrit-token-0123456789";

fn allow_upstream() -> Value {
    json!({"policy": {"default": "deny", "rules": [{"host": "upstream.test"}, {"host": "127.0.0.1"}]}})
}

async fn echo(resp: reqwest::Response) -> Value {
    assert_eq!(resp.status(), 200, "{:?}", resp.headers());
    serde_json::from_slice(&resp.bytes().await.expect("echo body")).expect("echo json")
}

#[tokio::test]
async fn allows_listed_and_denies_unlisted() {
    let h = start(allow_upstream()).await;
    let client = h.client(Trust::Gateway, false);
    let body = client
        .get(h.https_url("upstream.test", "/hello"))
        .send()
        .await
        .expect("send")
        .text()
        .await
        .expect("body");
    assert_eq!(body, "hello from https-upstream");

    // Plaintext absolute-form: the 403 and its reason are visible to the client.
    let resp = client
        .get(h.http_url("other.test", "/"))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 403);
    assert_eq!(denied_code(&resp).as_deref(), Some("host-not-listed"));
    assert!(resp.text().await.expect("body").contains("host-not-listed"));

    // CONNECT deny: 403 with the header, no tunnel.
    let (status, head, _) = h
        .raw_connect(&format!("other.test:{}", h.https.addr.port()))
        .await;
    assert_eq!(status, 403);
    assert!(head.contains("x-egress-denied: host-not-listed"), "{head}");

    let lines = h.audit_lines();
    assert!(lines.iter().any(|l| l["decision"] == "deny"
        && l["reason"] == "host-not-listed"
        && l["host"] == "other.test"));
    assert!(
        lines
            .iter()
            .any(|l| l["decision"] == "allow" && l["mode"] == "mitm" && l["path"] == "/hello")
    );
    assert!(lines.iter().all(|l| l["session"] == "test-session"));
}

#[tokio::test]
async fn enforces_methods_inside_tls() {
    let h = start(json!({"policy": {"default": "allow", "rules": [{"host": "upstream.test", "methods": ["GET"]}]}})).await;
    let client = h.client(Trust::Gateway, false);
    assert_eq!(
        client
            .get(h.https_url("upstream.test", "/"))
            .send()
            .await
            .expect("get")
            .status(),
        200
    );
    let resp = client
        .post(h.https_url("upstream.test", "/"))
        .body("x")
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status(), 403);
    assert_eq!(denied_code(&resp).as_deref(), Some("method-not-allowed"));
    // Under default allow, an unlisted host takes any method.
    let resp = client
        .post(h.https_url("other.test", "/"))
        .body("x")
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn injects_and_replaces_the_credential() {
    let h = start(json!({
        "policy": {"default": "deny", "rules": [{"host": "upstream.test", "inject": "tok"}]},
        "secrets": {"tok": {"header": "Authorization", "value": SECRET}}
    }))
    .await;
    let client = h.client(Trust::Gateway, true);
    let resp = client
        .get(h.https_url("upstream.test", "/echo"))
        .header("authorization", "Bearer from-the-sandbox")
        .header("proxy-authorization", "Basic abc")
        .send()
        .await
        .expect("send");
    let body = echo(resp).await;
    assert_eq!(body["headers"]["authorization"], json!([SECRET]));
    assert!(body["headers"].get("proxy-authorization").is_none());
    // The upstream leg follows the client leg (HTTP/1.1); Host is the bound destination.
    assert_eq!(body["version"], "HTTP/1.1");
    assert_eq!(
        body["headers"]["host"],
        json!([format!("upstream.test:{}", h.https.addr.port())])
    );
    let lines = h.audit_lines();
    assert!(lines.iter().any(|l| l["injected"] == "Authorization"));
}

#[tokio::test]
async fn tunnels_or_intercepts_per_intercept_mode() {
    let h = start(json!({
        "policy": {"default": "deny", "intercept": "credentialed", "rules": [
            {"host": "upstream.test"},
            {"host": "other.test", "inject": "tok"}
        ]},
        "secrets": {"tok": {"header": "X-Token", "value": "t0k"}}
    }))
    .await;
    // Tunnelled: the client sees the upstream's own certificate (trusting only the upstream CA works,
    // trusting only the gateway CA fails).
    let upstream_only = h.client(Trust::Upstream, false);
    let gateway_only = h.client(Trust::Gateway, false);
    let body = upstream_only
        .get(h.https_url("upstream.test", "/echo"))
        .send()
        .await
        .expect("tunnel");
    assert!(echo(body).await["headers"].get("x-token").is_none());
    assert!(
        gateway_only
            .get(h.https_url("upstream.test", "/"))
            .send()
            .await
            .is_err()
    );
    // Intercepted (credentialed host): the client sees a minted leaf.
    let body = echo(
        gateway_only
            .get(h.https_url("other.test", "/echo"))
            .send()
            .await
            .expect("mitm"),
    )
    .await;
    assert_eq!(body["headers"]["x-token"], json!(["t0k"]));
    assert!(
        upstream_only
            .get(h.https_url("other.test", "/"))
            .send()
            .await
            .is_err()
    );

    // The tunnel's audit line is written when the tunnel closes.
    drop(upstream_only);
    assert!(
        eventually(Duration::from_secs(5), || async {
            h.audit_lines().iter().any(|l| {
                l["mode"] == "tunnel" && l["decision"] == "allow" && l["bytes"].as_u64() > Some(0)
            })
        })
        .await
    );

    // intercept = all: the same plain host is now intercepted.
    write_policy(
        &h.policy_path,
        &json!({"policy": {"default": "deny", "rules": [{"host": "upstream.test"}]}}).to_string(),
    );
    let fresh = h.client(Trust::Gateway, false);
    assert!(
        eventually(Duration::from_secs(5), || async {
            fresh
                .get(h.https_url("upstream.test", "/"))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200)
        })
        .await
    );
}

#[tokio::test]
async fn refuses_sni_that_differs_from_connect() {
    for intercept in ["all", "credentialed"] {
        let h = start(json!({"policy": {"default": "allow", "intercept": intercept}})).await;
        let port = h.https.addr.port();
        let (status, _, tcp) = h.raw_connect(&format!("upstream.test:{port}")).await;
        assert_eq!(status, 200);
        assert!(
            h.tls_over(tcp, "other.test").await.is_err(),
            "{intercept}: SNI mismatch must fail"
        );
        // Matching SNI works.
        let (_, _, tcp) = h.raw_connect(&format!("upstream.test:{port}")).await;
        assert!(
            h.tls_over(tcp, "upstream.test").await.is_ok(),
            "{intercept}"
        );
        assert!(
            eventually(Duration::from_secs(5), || async {
                h.audit_lines()
                    .iter()
                    .any(|l| l["reason"] == "sni-mismatch")
            })
            .await,
            "{intercept}: {:?}",
            h.audit_lines()
        );
    }
}

#[tokio::test]
async fn refuses_host_header_that_differs_from_connect() {
    let h = start(json!({
        "policy": {"default": "allow", "rules": [{"host": "upstream.test", "inject": "tok"}]},
        "secrets": {"tok": {"header": "X-Token", "value": "t0k"}}
    }))
    .await;
    let client = h.client(Trust::Gateway, true);
    let resp = client
        .get(h.https_url("upstream.test", "/echo"))
        .header("host", "other.test")
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 403);
    assert_eq!(denied_code(&resp).as_deref(), Some("host-mismatch"));
    // Raw: a second request on the same MITM connection with a foreign Host is refused too.
    let port = h.https.addr.port();
    let (_, _, tcp) = h.raw_connect(&format!("upstream.test:{port}")).await;
    let mut tls = h.tls_over(tcp, "upstream.test").await.expect("tls");
    tls.write_all(format!("GET /echo HTTP/1.1\r\nHost: upstream.test:{port}\r\n\r\nGET /echo HTTP/1.1\r\nHost: other.test:{port}\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut out = Vec::new();
    let _ = tls.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.contains("HTTP/1.1 403") && text.contains("host-mismatch"),
        "{text}"
    );
    assert_eq!(
        text.matches("t0k").count(),
        1,
        "only the bound request is credentialed: {text}"
    );
}

#[tokio::test]
async fn guards_private_addresses_unless_allowed() {
    let policy = json!({"policy": {"default": "allow"}});
    let closed = start_with(
        policy.clone(),
        Options {
            allowed_cidrs: vec![],
            ..Options::default()
        },
    )
    .await;
    let client = closed.client(Trust::Gateway, false);
    let resp = client
        .get(closed.http_url("upstream.test", "/"))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 403);
    assert_eq!(denied_code(&resp).as_deref(), Some("address-not-allowed"));
    for target in [
        format!("upstream.test:{}", closed.https.addr.port()),
        "127.0.0.1:443".into(),
        "169.254.169.254:80".into(),
        "[::1]:443".into(),
    ] {
        let (status, head, _) = closed.raw_connect(&target).await;
        assert_eq!(status, 403, "{target}");
        assert!(head.contains("address-not-allowed"), "{target}: {head}");
    }
    let open = start_with(policy, Options::default()).await;
    let client = open.client(Trust::Gateway, false);
    assert_eq!(
        client
            .get(open.http_url("upstream.test", "/"))
            .send()
            .await
            .expect("send")
            .status(),
        200
    );
    assert_eq!(
        client
            .get(open.https_url("upstream.test", "/"))
            .send()
            .await
            .expect("send")
            .status(),
        200
    );
    assert_eq!(
        client
            .get(open.https_url("127.0.0.1", "/"))
            .send()
            .await
            .expect("ip literal")
            .status(),
        200
    );
}

#[tokio::test]
async fn plaintext_never_carries_a_credential() {
    let h = start(json!({
        "policy": {"default": "deny", "rules": [{"host": "upstream.test", "inject": "tok"}, {"host": "other.test"}]},
        "secrets": {"tok": {"header": "Authorization", "value": SECRET}}
    }))
    .await;
    let client = h.client(Trust::Gateway, false);
    let resp = client
        .get(h.http_url("upstream.test", "/echo"))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 403);
    assert_eq!(denied_code(&resp).as_deref(), Some("tls-required"));
    // A plaintext request to a host without a credential is forwarded.
    let body = echo(
        client
            .get(h.http_url("other.test", "/echo"))
            .send()
            .await
            .expect("send"),
    )
    .await;
    assert!(body["headers"].get("authorization").is_none());
}

#[tokio::test]
async fn speaks_http2_on_both_sides_of_the_mitm() {
    let h = start(allow_upstream()).await;
    let client = h.client(Trust::Gateway, false);
    let resp = client
        .get(h.https_url("upstream.test", "/echo"))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.version(), reqwest::Version::HTTP_2, "client side");
    assert_eq!(echo(resp).await["version"], "HTTP/2.0", "upstream side");
    // And HTTP/1.1 when the client asks for it.
    let resp = h
        .client(Trust::Gateway, true)
        .get(h.https_url("upstream.test", "/echo"))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.version(), reqwest::Version::HTTP_11);
    // Concurrent streams over one h2 connection.
    let futs = (0..16).map(|i| {
        client
            .get(h.https_url("upstream.test", &format!("/n{i}")))
            .send()
    });
    for r in futures::future::join_all(futs).await {
        assert_eq!(r.expect("send").status(), 200);
    }
}

#[tokio::test]
async fn streams_200_mb_with_bounded_memory() {
    use futures::StreamExt;
    const SIZE: u64 = 200 * 1024 * 1024;
    let h = start(allow_upstream()).await;
    let client = h.client(Trust::Gateway, false);
    // Warm up (TLS, pools, leaf) so the baseline includes them.
    client
        .get(h.https_url("upstream.test", "/bytes/1048576"))
        .send()
        .await
        .expect("warm")
        .bytes()
        .await
        .expect("warm body");
    let before = integration::fixtures::rss_bytes().expect("rss");
    let resp = client
        .get(h.https_url("upstream.test", &format!("/bytes/{SIZE}")))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let (mut got, mut peak) = (0u64, before);
    while let Some(chunk) = stream.next().await {
        got += chunk.expect("chunk").len() as u64;
        if got % (16 * 1024 * 1024) < 65536 {
            peak = peak.max(integration::fixtures::rss_bytes().unwrap_or(0));
        }
    }
    assert_eq!(got, SIZE);
    // Upload the same amount through the MITM, streamed from a generator.
    let chunks = futures::stream::iter(0..(SIZE / 65536))
        .map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from_static(&[b'u'; 65536])));
    let resp = client
        .post(h.https_url("upstream.test", "/upload"))
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .expect("upload");
    assert_eq!(resp.text().await.expect("count"), SIZE.to_string());
    peak = peak.max(integration::fixtures::rss_bytes().unwrap_or(0));
    let growth = peak.saturating_sub(before);
    // The whole test process (client, gateway and upstream) grows far less than the body: nothing
    // buffers it. Generous bound; a buffering proxy would add at least 200 MiB.
    assert!(
        growth < 64 * 1024 * 1024,
        "RSS grew by {} MiB",
        growth / (1024 * 1024)
    );
}

#[tokio::test]
async fn reload_under_load_goes_allow_deny_all_allow() {
    let h = std::sync::Arc::new(start(allow_upstream()).await);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Background load: keep-alive connections making requests the whole time.
    let mut load = Vec::new();
    for _ in 0..4 {
        let (h, stop) = (h.clone(), stop.clone());
        load.push(tokio::spawn(async move {
            let client = h.client(Trust::Gateway, true);
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = client.get(h.https_url("upstream.test", "/")).send().await;
                if let Ok(r) = r {
                    // Only ever an allow or a policy denial: never an error, never a half policy.
                    assert!(
                        r.status() == 200
                            || denied_code(&r).as_deref() == Some("policy-unavailable"),
                        "{:?}",
                        r.status()
                    );
                }
                n += 1;
            }
            n
        }));
    }
    let client = h.client(Trust::Gateway, true);
    let status = |client: reqwest::Client, url: String| async move {
        client
            .get(url)
            .send()
            .await
            .map(|r| (r.status().as_u16(), denied_code(&r)))
            .ok()
    };
    let url = h.https_url("upstream.test", "/");
    assert_eq!(status(client.clone(), url.clone()).await, Some((200, None)));
    write_policy(&h.policy_path, "{\"policy\": {\"rules\": [");
    assert!(
        eventually(Duration::from_secs(5), || {
            let (c, u) = (client.clone(), url.clone());
            async move { status(c, u).await == Some((403, Some("policy-unavailable".into()))) }
        })
        .await,
        "garbage must deny all"
    );
    write_policy(&h.policy_path, &allow_upstream().to_string());
    assert!(
        eventually(Duration::from_secs(5), || {
            let (c, u) = (client.clone(), url.clone());
            async move { status(c, u).await == Some((200, None)) }
        })
        .await,
        "a good file restores service"
    );
    // Missing file = deny-all as well; writing it back restores.
    std::fs::remove_file(&h.policy_path).expect("remove");
    assert!(
        eventually(Duration::from_secs(5), || {
            let (c, u) = (client.clone(), url.clone());
            async move { status(c, u).await.map(|s| s.0) == Some(403) }
        })
        .await
    );
    write_policy(&h.policy_path, &allow_upstream().to_string());
    assert!(
        eventually(Duration::from_secs(5), || {
            let (c, u) = (client.clone(), url.clone());
            async move { status(c, u).await.map(|s| s.0) == Some(200) }
        })
        .await
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in load {
        assert!(task.await.expect("load task") > 0);
    }
}

#[tokio::test]
async fn shuts_down_promptly_with_idle_and_open_connections() {
    use egress_gateway::{Gateway, GatewayConfig, audit::MemorySink};
    let ca = integration::fixtures::TestCa::new("shutdown ca").expect("ca");
    let dir = tempfile::tempdir().expect("tempdir");
    let policy_path = dir.path().join("config.json");
    write_policy(
        &policy_path,
        &json!({"policy": {"default": "allow"}}).to_string(),
    );
    let gw = Gateway::new(GatewayConfig {
        policy_path,
        ca_cert_pem: ca.cert_pem.clone(),
        ca_key_pem: ca.key_pem.clone(),
        extra_roots: vec![],
        allowed_cidrs: vec![],
        static_hosts: Default::default(),
        session_id: String::new(),
        audit: MemorySink::new(),
        limits: Default::default(),
        shadow: false,
        upstream_proxy: None,
        plain_http_hosts: Vec::new(),
    })
    .expect("gateway");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let health = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(gw.serve(listener, health, async move {
        let _ = stopped.await;
    }));
    // An idle keep-alive connection and a half-sent request.
    let mut idle = tokio::net::TcpStream::connect(addr).await.expect("connect");
    idle.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut buf = [0u8; 256];
    let n = idle.read(&mut buf).await.expect("read");
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 400"));
    let mut slow = tokio::net::TcpStream::connect(addr).await.expect("connect");
    slow.write_all(b"GET http://a.test/ HTTP/1.1\r\n")
        .await
        .expect("write");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let t = std::time::Instant::now();
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(5), served)
        .await
        .expect("serve returns")
        .expect("join")
        .expect("ok");
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "bounded by the shutdown grace"
    );
    // The idle connection was closed.
    assert_eq!(idle.read(&mut buf).await.unwrap_or(0), 0);
}

/// Reads from `stream` until `needle` has arrived (bounded wait); returns all that was read.
async fn read_until<S: tokio::io::AsyncRead + Unpin>(stream: &mut S, needle: &str) -> String {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let found = tokio::time::timeout(Duration::from_secs(20), async {
        while !String::from_utf8_lossy(&seen).contains(needle) {
            let n = stream.read(&mut buf).await.expect("read");
            assert!(n > 0, "closed early: {:?}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    assert!(
        found.is_ok(),
        "no {needle:?} in {:?}",
        String::from_utf8_lossy(&seen)
    );
    String::from_utf8_lossy(&seen).into_owned()
}

/// True when the peer closes `stream` (EOF or reset) within a bounded wait, discarding data.
async fn closes<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> bool {
    let mut buf = [0u8; 4096];
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

fn limits(max_connections: usize, header_read: Duration, idle: Duration) -> Options {
    Options {
        limits: egress_gateway::Limits {
            max_connections,
            header_read_timeout: header_read,
            idle_timeout: idle,
        },
        ..Options::default()
    }
}

/// A request the gateway answers itself (an origin-form request is a 400), keeping the
/// connection open.
const OWN_ANSWER: &[u8] = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";

/// A sandbox cannot make the gateway hold unbounded memory with half-sent request heads: past
/// the cap, connections are closed at accept, and one head never buffers more than the limit.
#[tokio::test]
async fn caps_connections_and_bounds_half_sent_heads() {
    const CAP: usize = 8;
    let long = Duration::from_secs(600);
    let h = start_with(allow_upstream(), limits(CAP, long, long)).await;
    let mut held = Vec::new();
    for _ in 0..CAP {
        let mut tcp = tokio::net::TcpStream::connect(h.gateway)
            .await
            .expect("connect");
        // Served (so it holds a slot), then left with a half-sent head.
        tcp.write_all(OWN_ANSWER).await.expect("write");
        read_until(&mut tcp, "expected)\n").await;
        tcp.write_all(b"GET http://upstream.test/ HTTP/1.1\r\nX-Pad: aaaa")
            .await
            .expect("write");
        held.push(tcp);
    }
    for _ in 0..3 {
        let mut extra = tokio::net::TcpStream::connect(h.gateway)
            .await
            .expect("the kernel still completes the handshake");
        let _ = extra.write_all(OWN_ANSWER).await;
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(10), extra.read(&mut buf))
            .await
            .expect("closed at accept, not left waiting")
            .unwrap_or(0);
        assert_eq!(
            n,
            0,
            "beyond the cap: {:?}",
            String::from_utf8_lossy(&buf[..n])
        );
    }
    // Closing a held connection frees its slot.
    drop(held.pop());
    let mut fresh = None;
    for _ in 0..200 {
        let mut tcp = tokio::net::TcpStream::connect(h.gateway)
            .await
            .expect("connect");
        let _ = tcp.write_all(OWN_ANSWER).await;
        let mut buf = [0u8; 256];
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf)).await
            && String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 400")
        {
            fresh = Some(tcp);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut fresh = fresh.expect("a slot is free again");
    // A head as long as the buffer limit, unfinished: refused (431) and closed, not buffered on.
    let mut head = b"GET http://upstream.test/ HTTP/1.1\r\nX-Pad: ".to_vec();
    head.resize(egress_gateway::proxy::MAX_BUF_SIZE, b'a');
    fresh.write_all(&head).await.expect("write");
    let mut out = Vec::new();
    let answered = tokio::time::timeout(Duration::from_secs(10), fresh.read_to_end(&mut out)).await;
    assert!(
        answered.is_ok(),
        "a head at the limit must not be buffered on"
    );
    let text = String::from_utf8_lossy(&out);
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 431"),
        "{text}"
    );
}

#[tokio::test]
async fn drops_a_slow_head_after_the_header_timeout() {
    let h = start_with(
        allow_upstream(),
        limits(8, Duration::from_millis(200), Duration::from_secs(600)),
    )
    .await;
    let mut slow = tokio::net::TcpStream::connect(h.gateway)
        .await
        .expect("connect");
    slow.write_all(b"GET http://upstream.test/ HTTP/1.1\r\nHost: upstream.test\r\n")
        .await
        .expect("write");
    assert!(closes(&mut slow).await, "a head that never ends is dropped");
    // Inside a MITM'd tunnel too.
    let port = h.https.addr.port();
    let (_, _, tcp) = h.raw_connect(&format!("upstream.test:{port}")).await;
    let mut tls = h.tls_over(tcp, "upstream.test").await.expect("tls");
    tls.write_all(b"GET / HTTP/1.1\r\n").await.expect("write");
    assert!(
        closes(&mut tls).await,
        "MITM'd head that never ends is dropped"
    );
}

#[tokio::test]
async fn closes_idle_tunnels_and_mitm_sessions() {
    let h = start_with(
        json!({"policy": {"default": "deny", "intercept": "credentialed", "rules": [
            {"host": "upstream.test"}, {"host": "other.test", "methods": ["GET"]}
        ]}}),
        // The header timeout is long: what closes the MITM session is the idle clock.
        limits(8, Duration::from_secs(600), Duration::from_secs(1)),
    )
    .await;
    let port = h.https.addr.port();
    for host in ["upstream.test", "other.test"] {
        let (status, _, tcp) = h.raw_connect(&format!("{host}:{port}")).await;
        assert_eq!(status, 200);
        let mut tls = h.tls_over(tcp, host).await.expect("tls");
        tls.write_all(format!("GET / HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n").as_bytes())
            .await
            .expect("write");
        read_until(&mut tls, "hello from https-upstream").await;
        assert!(closes(&mut tls).await, "{host}: idle connection closed");
    }
}

/// TRACE echoes the request, so through a MITM it would hand the sandbox the injected credential.
#[tokio::test]
async fn refuses_trace_and_track_where_a_credential_is_injected() {
    let h = start(json!({
        "policy": {"default": "deny", "rules": [
            {"host": "upstream.test", "inject": "tok"}, {"host": "other.test"}
        ]},
        "secrets": {"tok": {"header": "Authorization", "value": SECRET}}
    }))
    .await;
    for http1 in [true, false] {
        let client = h.client(Trust::Gateway, http1);
        for method in ["TRACE", "TRACK", "trace"] {
            let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
            let resp = client
                .request(method.clone(), h.https_url("upstream.test", "/echo"))
                .send()
                .await
                .expect("send");
            assert_eq!(resp.status(), 403, "{method}");
            assert_eq!(denied_code(&resp).as_deref(), Some("credential-echo"));
            assert!(!resp.text().await.expect("body").contains("sekrit"));
        }
        // No credential, nothing to leak: forwarded.
        let resp = client
            .request(reqwest::Method::TRACE, h.https_url("other.test", "/echo"))
            .send()
            .await
            .expect("send");
        assert_eq!(echo(resp).await["method"], "TRACE");
    }
    assert!(h.audit_lines().iter().any(|l| l["method"] == "TRACK"
        && l["decision"] == "deny"
        && l["reason"] == "credential-echo"));
}

/// A reload re-checks blind tunnels: one the new policy would not open is closed; others stay.
#[tokio::test]
async fn reload_closes_blind_tunnels_the_policy_no_longer_allows() {
    let policy = |rules: Value| json!({"policy": {"default": "deny", "intercept": "credentialed", "rules": rules}});
    let h = start(policy(
        json!([{"host": "upstream.test"}, {"host": "other.test"}]),
    ))
    .await;
    let port = h.https.addr.port();
    let mut tunnels = Vec::new();
    for host in ["upstream.test", "other.test"] {
        let (status, _, tcp) = h.raw_connect(&format!("{host}:{port}")).await;
        assert_eq!(status, 200);
        let mut tls = h
            .tls_over(tcp, host)
            .await
            .expect("tls to the upstream itself");
        tls.write_all(format!("GET / HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n").as_bytes())
            .await
            .expect("write");
        read_until(&mut tls, "hello from https-upstream").await;
        tunnels.push(tls);
    }
    let (mut other, mut removed) = (tunnels.pop().expect("other"), tunnels.pop().expect("up"));
    write_policy(
        &h.policy_path,
        &policy(json!([{"host": "other.test"}])).to_string(),
    );
    assert!(
        closes(&mut removed).await,
        "the removed host's tunnel is closed"
    );
    other
        .write_all(format!("GET / HTTP/1.1\r\nHost: other.test:{port}\r\n\r\n").as_bytes())
        .await
        .expect("write");
    read_until(&mut other, "hello from https-upstream").await;
    // Still allowed, but now method-restricted: a blind tunnel cannot enforce that.
    write_policy(
        &h.policy_path,
        &policy(json!([{"host": "other.test", "methods": ["GET"]}])).to_string(),
    );
    assert!(
        closes(&mut other).await,
        "a tunnel that must now be intercepted is closed"
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            h.audit_lines()
                .iter()
                .filter(|l| l["mode"] == "tunnel")
                .count()
                >= 2
        })
        .await
    );
    let lines = h.audit_lines();
    let closed = |host: &str, reason: &str| {
        lines.iter().any(|l| {
            l["mode"] == "tunnel"
                && l["host"] == host
                && l["decision"] == "deny"
                && l["reason"] == reason
                && l["bytes"].as_u64() > Some(0)
        })
    };
    assert!(closed("upstream.test", "host-not-listed"), "{lines:#?}");
    assert!(closed("other.test", "intercept-required"), "{lines:#?}");
}

/// MITM'd connections decide per request: after a reload removes the host, the next request on
/// the same kept-alive connection is a 403.
#[tokio::test]
async fn reload_denies_the_next_request_on_a_kept_alive_mitm_connection() {
    use http_body_util::{BodyExt, Empty};
    let h = start(allow_upstream()).await;
    let port = h.https.addr.port();
    let (_, _, tcp) = h.raw_connect(&format!("upstream.test:{port}")).await;
    let tls = h.tls_over(tcp, "upstream.test").await.expect("tls");
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .expect("handshake");
    tokio::spawn(conn);
    let get = || {
        http::Request::get("/")
            .header("host", format!("upstream.test:{port}"))
            .body(Empty::<bytes::Bytes>::new())
            .expect("request")
    };
    let resp = sender.send_request(get()).await.expect("first request");
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.expect("body");
    write_policy(
        &h.policy_path,
        &json!({"policy": {"default": "deny", "rules": [{"host": "other.test"}]}}).to_string(),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        sender
            .ready()
            .await
            .expect("the same connection stays usable");
        let resp = sender.send_request(get()).await.expect("request");
        let (status, code) = (
            resp.status(),
            resp.headers()
                .get("x-egress-denied")
                .map(|v| v.to_str().unwrap_or("").to_owned()),
        );
        resp.into_body().collect().await.expect("body");
        if status == 403 {
            assert_eq!(code.as_deref(), Some("host-not-listed"));
            break;
        }
        assert_eq!(status, 200);
        assert!(std::time::Instant::now() < deadline, "reload never applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
