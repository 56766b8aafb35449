//! In-process tests of ingress over the fake engine, whose helper is a host build of the real
//! one: a session's "port" is a server this test runs on the host's loopback, reached through
//! the service, the session's channel and the helper's `connect`. HTTP both ways (bodies larger
//! than every window, so flow control is what delivers them), the credentials kept from the
//! server, tokens and their refusals, the preview host, WebSockets passed through, raw TCP over
//! a WebSocket, a closed port, and the session's limit of connections.

mod harness;

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ws::{Message as WsMessage, WebSocketUpgrade};
use axum::http::{HeaderMap, Request, StatusCode};
use axum::routing::{any, get};
use futures::{SinkExt, StreamExt};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use harness::{Harness, KEY};

const DOMAIN: &str = "preview.test";

/// A server "inside the sandbox": echoes what it was sent as JSON, streams `/bytes/{n}`,
/// echoes bodies at `/echo` and WebSocket messages at `/ws`.
async fn app_server() -> u16 {
    async fn describe(req: axum::extract::Request) -> axum::Json<Value> {
        let headers: serde_json::Map<String, Value> = req
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v.to_str().unwrap_or(""))))
            .collect();
        axum::Json(json!({
            "method": req.method().as_str(),
            "uri": req.uri().to_string(),
            "headers": headers,
        }))
    }
    async fn bytes(axum::extract::Path(n): axum::extract::Path<usize>) -> Vec<u8> {
        (0..n).map(|i| (i % 251) as u8).collect()
    }
    async fn echo(body: Body) -> Body {
        body
    }
    async fn ws(up: WebSocketUpgrade) -> axum::response::Response {
        up.on_upgrade(|mut socket| async move {
            while let Some(Ok(m)) = socket.recv().await {
                if matches!(m, WsMessage::Close(_)) {
                    break;
                }
                if socket.send(m).await.is_err() {
                    break;
                }
            }
        })
    }
    let router = axum::Router::new()
        .route("/bytes/{n}", get(bytes))
        .route("/echo", any(echo))
        .route("/ws", get(ws))
        .fallback(describe);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    port
}

/// A raw TCP echo server on the loopback.
async fn tcp_echo() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    port
}

/// A WebSocket request to `url` with the key.
fn keyed_ws(url: String) -> tokio_tungstenite::tungstenite::handshake::client::Request {
    let mut req =
        tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(url)
            .expect("req");
    req.headers_mut()
        .insert("x-api-key", KEY.parse().expect("key"));
    req
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A new session, a TCP echo server, and a WebSocket through the service carrying raw TCP to
/// it: the session, the server's port and the socket.
async fn tcp_socket(h: &Harness) -> (String, u16, Socket) {
    let id = h.session().await;
    let tcp = tcp_echo().await;
    let addr = serve(h).await;
    let req = keyed_ws(format!("ws://{addr}/api/v1/session/{id}/ports/{tcp}/tcp"));
    let (ws, _) = tokio_tungstenite::connect_async(req)
        .await
        .expect("upgrade");
    (id, tcp, ws)
}

/// The service on a loopback listener of its own (upgrades need a real connection).
async fn serve(h: &Harness) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let router = h.router.clone();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    addr
}

async fn send(h: &Harness, req: Request<Body>) -> (StatusCode, HeaderMap, Vec<u8>) {
    let resp = h.send(req).await;
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, headers, body.to_vec())
}

fn get_req(uri: &str) -> axum::http::request::Builder {
    Request::builder().method("GET").uri(uri)
}

fn port_path(id: &str, port: u16, rest: &str) -> String {
    format!("/api/v1/session/{id}/ports/{port}/{rest}")
}

#[tokio::test]
async fn http_reaches_a_port_with_the_key_and_the_server_never_sees_the_services_credentials() {
    let h = Harness::default();
    let id = h.session().await;
    let port = app_server().await;
    let req = get_req(&port_path(&id, port, "some/path?x=1&y=two"))
        .header("x-api-key", KEY)
        .header("cookie", "theirs=1; daiv_port_token=abc")
        .header("x-daiv-port-token", "abc")
        .header("host", "svc.example.test")
        .body(Body::empty())
        .expect("request");
    let (status, _, body) = send(&h, req).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(v["method"], "GET");
    assert_eq!(v["uri"], "/some/path?x=1&y=two");
    let headers = &v["headers"];
    assert!(headers.get("x-api-key").is_none(), "{headers}");
    assert!(headers.get("x-daiv-port-token").is_none(), "{headers}");
    assert_eq!(headers["cookie"], "theirs=1", "{headers}");
    assert_eq!(headers["x-forwarded-host"], "svc.example.test");
    assert_eq!(headers["x-forwarded-proto"], "http");
    assert_eq!(
        headers["x-forwarded-prefix"],
        format!("/api/v1/session/{id}/ports/{port}")
    );
    // The root of the port, with and without its slash.
    for uri in [
        format!("/session/{id}/ports/{port}"),
        format!("/session/{id}/ports/{port}/"),
    ] {
        let req = get_req(&uri)
            .header("x-api-key", KEY)
            .body(Body::empty())
            .expect("req");
        let (status, _, body) = send(&h, req).await;
        assert_eq!(status, StatusCode::OK);
        let v: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(v["uri"], "/");
    }
}

#[tokio::test]
async fn bodies_larger_than_every_window_cross_both_ways_byte_for_byte() {
    let h = Harness::default();
    let id = h.session().await;
    let port = app_server().await;
    let n = 9 * 1024 * 1024 + 7;
    let req = get_req(&port_path(&id, port, &format!("bytes/{n}")))
        .header("x-api-key", KEY)
        .body(Body::empty())
        .expect("request");
    let (status, _, body) = send(&h, req).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body.len(), n);
    assert!(body.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));

    let up: Vec<u8> = (0..n).map(|i| (i % 241) as u8).collect();
    let req = Request::builder()
        .method("PUT")
        .uri(port_path(&id, port, "echo"))
        .header("x-api-key", KEY)
        .body(Body::from(up.clone()))
        .expect("request");
    let (status, _, body) = send(&h, req).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body == up, "the echoed body differs ({} bytes)", body.len());

    // Every connection closed and counted.
    let (status, v) = h.api("GET", &format!("/session/{id}/ports"), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["opened"], 2, "{v}");
    assert!(v["bytes_out"].as_u64().unwrap_or(0) >= 2 * n as u64, "{v}");
    assert!(v["bytes_in"].as_u64().unwrap_or(0) >= n as u64, "{v}");
    for _ in 0..100 {
        let (_, v) = h.api("GET", &format!("/session/{id}/ports"), None).await;
        if v["open"] == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("a connection stayed open");
}

#[tokio::test]
async fn a_closed_port_is_a_502_port_closed_and_system_ports_are_refused() {
    let h = Harness::default();
    let id = h.session().await;
    // A port nothing listens on: bind one and let it go.
    let free = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let req = get_req(&port_path(&id, free, ""))
        .header("x-api-key", KEY)
        .body(Body::empty());
    let (status, _, body) = send(&h, req.expect("req")).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    let v: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(v["code"], "port_closed", "{v}");
    assert!(
        v["detail"]
            .as_str()
            .unwrap_or("")
            .contains(&free.to_string()),
        "{v}"
    );

    for port in ["22", "80", "0", "70000", "x"] {
        let req = get_req(&format!("/api/v1/session/{id}/ports/{port}/"))
            .header("x-api-key", KEY)
            .body(Body::empty())
            .expect("req");
        let (status, _, _) = send(&h, req).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "port {port}");
    }
    // A session that does not exist.
    let other = "a".repeat(64);
    let port = app_server().await;
    let req = get_req(&port_path(&other, port, ""))
        .header("x-api-key", KEY)
        .body(Body::empty());
    let (status, _, _) = send(&h, req.expect("req")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_port_token_opens_its_own_session_and_port_only() {
    let h = Harness::default();
    let id = h.session().await;
    let other = h.session().await;
    let port = app_server().await;
    let port2 = app_server().await;
    let (status, v) = h
        .api(
            "POST",
            &format!("/session/{id}/ports/{port}/token"),
            Some(json!({"ttl_seconds": 60})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let token = v["token"].as_str().expect("token").to_string();
    assert!(
        v["url"]
            .as_str()
            .unwrap_or("")
            .ends_with(&format!("/session/{id}/ports/{port}/")),
        "{v}"
    );
    assert!(v["expires_at"].is_string());

    let with = |uri: String, token: &str| {
        get_req(&uri)
            .header("x-daiv-port-token", token)
            .body(Body::empty())
            .expect("req")
    };
    // Its own port: open.
    let (status, _, _) = send(&h, with(port_path(&id, port, "a"), &token)).await;
    assert_eq!(status, StatusCode::OK);
    // Another port of the session, the same port of another session: refused.
    let (status, _, _) = send(&h, with(port_path(&id, port2, "a"), &token)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _, _) = send(&h, with(port_path(&other, port, "a"), &token)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // Tampered, expired-looking, or nothing at all.
    let (status, _, _) = send(&h, with(port_path(&id, port, "a"), &format!("{token}x"))).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _, _) = send(&h, with(port_path(&id, port, "a"), "1.AAAA")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let req = get_req(&port_path(&id, port, "a"))
        .body(Body::empty())
        .expect("req");
    let (status, _, _) = send(&h, req).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // A wrong key is not a token.
    let req = get_req(&port_path(&id, port, "a"))
        .header("x-api-key", "nope")
        .body(Body::empty());
    let (status, _, _) = send(&h, req.expect("req")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // Asking for a token needs the key, and a sane lifetime.
    let (status, _) = h
        .call(
            "POST",
            &format!("/api/v1/session/{id}/ports/{port}/token"),
            None,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = h
        .api(
            "POST",
            &format!("/session/{id}/ports/{port}/token"),
            Some(json!({"ttl_seconds": 0})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, _) = h
        .api(
            "POST",
            &format!("/session/{}/ports/{port}/token", "b".repeat(64)),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_tokens_query_parameter_becomes_a_cookie_for_that_path_and_leaves_the_address() {
    let h = Harness::default();
    let id = h.session().await;
    let port = app_server().await;
    let (_, v) = h
        .api(
            "POST",
            &format!("/session/{id}/ports/{port}/token"),
            Some(json!({"public": true})),
        )
        .await;
    let url = v["url"].as_str().expect("url");
    let token = v["token"].as_str().expect("token");
    assert!(url.contains(&format!("daiv_port_token={token}")), "{url}");
    let uri = format!("/api/v1/session/{id}/ports/{port}/page?daiv_port_token={token}&keep=1");
    let req = get_req(&uri).body(Body::empty()).expect("req");
    let (status, headers, _) = send(&h, req).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let location = headers["location"].to_str().expect("location");
    assert_eq!(
        location,
        format!("/api/v1/session/{id}/ports/{port}/page?keep=1")
    );
    let cookie = headers["set-cookie"].to_str().expect("cookie");
    assert!(
        cookie.starts_with(&format!("daiv_port_token={token};")),
        "{cookie}"
    );
    assert!(
        cookie.contains(&format!("Path=/api/v1/session/{id}/ports/{port}/")),
        "{cookie}"
    );
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Lax"),
        "{cookie}"
    );
    // The cookie opens the port; the server does not see it.
    let req = get_req(location)
        .header("cookie", format!("daiv_port_token={token}"))
        .body(Body::empty())
        .expect("req");
    let (status, _, body) = send(&h, req).await;
    assert_eq!(status, StatusCode::OK);
    let v: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(v["uri"], "/page?keep=1");
    assert!(v["headers"].get("cookie").is_none(), "{v}");
}

#[tokio::test]
async fn a_preview_host_reaches_the_port_with_its_whole_path() {
    let h = Harness::new(Default::default(), &[("PREVIEW_DOMAIN", DOMAIN)]);
    let id = h.session().await;
    let port = app_server().await;
    let short = &id[..32];
    let (_, v) = h
        .api("POST", &format!("/session/{id}/ports/{port}/token"), None)
        .await;
    assert_eq!(v["url"], format!("https://{port}-{short}.{DOMAIN}/"), "{v}");
    let token = v["token"].as_str().expect("token");
    let req = get_req("/assets/app.js?v=3")
        .header("host", format!("{port}-{short}.{DOMAIN}:8443"))
        .header("x-daiv-port-token", token)
        .body(Body::empty())
        .expect("req");
    let (status, _, body) = send(&h, req).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(v["uri"], "/assets/app.js?v=3");
    assert!(v["headers"].get("x-forwarded-prefix").is_none(), "{v}");
    // The query parameter: a cookie for the whole host.
    let req = get_req(&format!("/?daiv_port_token={token}"))
        .header("host", format!("{port}-{short}.{DOMAIN}"))
        .body(Body::empty())
        .expect("req");
    let (status, headers, _) = send(&h, req).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(headers["location"], "/");
    let cookie = headers["set-cookie"].to_str().expect("cookie");
    assert!(
        cookie.contains("Path=/;") && cookie.contains("Secure"),
        "{cookie}"
    );
    // No credential, an unknown session, another host: refused or the API's.
    let req = get_req("/")
        .header("host", format!("{port}-{short}.{DOMAIN}"))
        .body(Body::empty());
    let (status, _, _) = send(&h, req.expect("req")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let req = get_req("/")
        .header("host", format!("{port}-{}.{DOMAIN}", "f".repeat(32)))
        .header("x-api-key", KEY)
        .body(Body::empty());
    let (status, _, _) = send(&h, req.expect("req")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let req = get_req("/api/v1/-/health/")
        .header("host", "sandbox.other.test")
        .body(Body::empty());
    let (status, _, _) = send(&h, req.expect("req")).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn websockets_pass_through_and_raw_tcp_rides_one() {
    let h = Harness::default();
    let id = h.session().await;
    let port = app_server().await;
    let addr = serve(&h).await;
    // A WebSocket to the server's own endpoint, upgraded end to end.
    let req = keyed_ws(format!("ws://{addr}/api/v1/session/{id}/ports/{port}/ws"));
    let (mut ws, resp) = tokio_tungstenite::connect_async(req)
        .await
        .expect("upgrade");
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    for i in 0..200 {
        ws.send(Message::Text(format!("m{i}").into()))
            .await
            .expect("send");
        let back = ws.next().await.expect("a message").expect("ok");
        assert_eq!(back.into_text().expect("text").as_str(), format!("m{i}"));
    }
    let _ = ws.close(None).await;

    // Raw TCP: binary messages to a TCP echo server and back.
    let tcp = tcp_echo().await;
    let req = keyed_ws(format!("ws://{addr}/api/v1/session/{id}/ports/{tcp}/tcp"));
    let (mut ws, _) = tokio_tungstenite::connect_async(req)
        .await
        .expect("upgrade");
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 256) as u8).collect();
    ws.send(Message::Binary(payload.clone().into()))
        .await
        .expect("send");
    let mut got = Vec::new();
    while got.len() < payload.len() {
        match ws.next().await.expect("a message").expect("ok") {
            Message::Binary(b) => got.extend_from_slice(&b),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(got == payload);
    let _ = ws.close(None).await;
}

#[tokio::test]
async fn a_cookie_never_opens_a_cross_origin_websocket() {
    let h = Harness::default();
    let id = h.session().await;
    let port = app_server().await;
    let addr = serve(&h).await;
    let (_, v) = h
        .api("POST", &format!("/session/{id}/ports/{port}/token"), None)
        .await;
    let token = v["token"].as_str().expect("token").to_string();
    let url = format!("ws://{addr}/api/v1/session/{id}/ports/{port}/ws");
    let request = |origin: &str, cookie: bool, header: bool| {
        let mut req =
            tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
                url.clone(),
            )
            .expect("req");
        req.headers_mut()
            .insert("origin", origin.parse().expect("origin"));
        if cookie {
            req.headers_mut().insert(
                "cookie",
                format!("daiv_port_token={token}").parse().expect("c"),
            );
        }
        if header {
            req.headers_mut()
                .insert("x-daiv-port-token", token.parse().expect("t"));
        }
        req
    };
    let refused = tokio_tungstenite::connect_async(request("http://evil.test", true, false)).await;
    match refused {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
            assert_eq!(r.status(), StatusCode::FORBIDDEN)
        }
        other => panic!(
            "a cross-origin socket with a cookie opened: {:?}",
            other.map(|_| ())
        ),
    }
    // The same origin with the cookie, or another origin with the token itself: open.
    let same = format!("http://{addr}");
    assert!(
        tokio_tungstenite::connect_async(request(&same, true, false))
            .await
            .is_ok()
    );
    assert!(
        tokio_tungstenite::connect_async(request("http://evil.test", false, true))
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn a_sessions_connections_are_bounded_and_a_stream_never_holds_its_lock() {
    let h = Harness::new(Default::default(), &[("PORT_STREAMS_MAX", "1")]);
    let (id, tcp, mut ws) = tcp_socket(&h).await;
    ws.send(Message::Binary(b"ping".to_vec().into()))
        .await
        .expect("send");
    let _ = ws.next().await;
    // The one connection is open: a second is refused, and commands still run.
    let req = get_req(&port_path(&id, tcp, ""))
        .header("x-api-key", KEY)
        .body(Body::empty());
    let (status, _, _) = send(&h, req.expect("req")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let (status, v) = h
        .api(
            "POST",
            &format!("/session/{id}/"),
            Some(json!({"commands": ["echo hi"]})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (_, v) = h.api("GET", &format!("/session/{id}/ports"), None).await;
    assert_eq!(v["open"], 1, "{v}");
    let _ = ws.close(None).await;
    drop(ws);
    // Closed, the port takes another.
    for _ in 0..100 {
        let (_, v) = h.api("GET", &format!("/session/{id}/ports"), None).await;
        if v["open"] == 0 {
            let resp = h
                .send(
                    get_req("/metrics")
                        .header("x-api-key", KEY)
                        .body(Body::empty())
                        .expect("req"),
                )
                .await;
            let page = resp.into_body().collect().await.expect("page").to_bytes();
            let page = String::from_utf8_lossy(&page);
            assert!(
                page.contains("daiv_sandbox_port_streams_refused_total 1"),
                "{page}"
            );
            assert!(page.contains("daiv_sandbox_port_streams_open 0"), "{page}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the connection stayed counted as open");
}

#[tokio::test]
async fn an_idle_connection_is_closed_after_the_deployments_idle_time() {
    let h = Harness::new(Default::default(), &[("PORT_IDLE_SECONDS", "1")]);
    let (_, _, mut ws) = tcp_socket(&h).await;
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match ws.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "an idle connection stayed open");
}

/// A `tools/call` to `/mcp` with the key.
fn mcp_request(body: &Value) -> Request<Body> {
    Request::builder()
        .method("POST")
        .uri("/mcp")
        .header("host", "127.0.0.1:8000")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18")
        .header("authorization", format!("Bearer {KEY}"))
        .body(Body::from(body.to_string()))
        .expect("request")
}

/// MCP's `port_url`: a URL and token an agent hands a person, which open the port.
#[tokio::test]
async fn mcps_port_url_gives_a_url_and_token_that_open_the_port() {
    let h = Harness::new(Default::default(), &[("MCP_STATELESS", "true")]);
    let id = h.session().await;
    let port = app_server().await;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "port_url", "arguments": {"session_id": id, "port": port}}});
    let req = mcp_request(&body);
    let (status, _, bytes) = send(&h, req).await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .next_back()
            .expect("an answer")
    });
    let answer: Value = serde_json::from_str(
        v["result"]["content"][0]["text"]
            .as_str()
            .expect("text content"),
    )
    .expect("json");
    let url = answer["url"].as_str().expect("url");
    assert_eq!(url, format!("/api/v1/session/{id}/ports/{port}/"));
    let token = answer["token"].as_str().expect("token");
    let req = get_req(&format!("{url}x"))
        .header("x-daiv-port-token", token)
        .body(Body::empty());
    let (status, _, _) = send(&h, req.expect("req")).await;
    assert_eq!(status, StatusCode::OK);
    let with = answer["url_with_token"].as_str().expect("url_with_token");
    let (status, _, _) = send(&h, get_req(with).body(Body::empty()).expect("req")).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    // A system port is the tool's argument error.
    let body = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "port_url", "arguments": {"session_id": id, "port": 22}}});
    let req = mcp_request(&body);
    let (_, _, bytes) = send(&h, req).await;
    let text = String::from_utf8_lossy(&bytes);
    assert!(
        text.contains("invalid_argument") && text.contains("port 22"),
        "{text}"
    );
}

/// E2B's door: `get_host(port)`'s host and the SDK's port header reach the relay; a sandbox
/// created with `allowPublicTraffic: false` takes its traffic token, and only it.
#[tokio::test]
async fn e2bs_hosts_and_port_headers_reach_the_port_and_private_traffic_takes_its_token() {
    use tower::ServiceExt;
    let templates = format!(r#"{{"base": "{}"}}"#, harness::IMAGE);
    let h = Harness::new(
        Default::default(),
        &[("E2B_TEMPLATES", &templates), ("PREVIEW_DOMAIN", DOMAIN)],
    );
    let e2b = control_plane::e2b::router(h.state.config.clone(), h.state.ops(), &h.state.metrics);
    let call = |req: Request<Body>| {
        let e2b = e2b.clone();
        async move {
            let resp = match e2b.oneshot(req).await {
                Ok(r) => r,
                Err(e) => match e {},
            };
            let status = resp.status();
            let bytes = resp.into_body().collect().await.expect("body").to_bytes();
            (
                status,
                serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null),
            )
        }
    };
    let create = |network: Value| {
        Request::builder()
            .method("POST")
            .uri("/sandboxes")
            .header("x-api-key", KEY)
            .header("content-type", "application/json")
            .body(Body::from(
                json!({"templateID": "base", "network": network}).to_string(),
            ))
            .expect("request")
    };
    let port = app_server().await;
    let (status, public) = call(create(json!({}))).await;
    assert_eq!(status, StatusCode::CREATED, "{public}");
    assert_eq!(public["domain"], DOMAIN, "{public}");
    assert!(public.get("trafficAccessToken").is_none(), "{public}");
    let id = public["sandboxID"].as_str().expect("id").to_string();
    // The SDK's host, as get_host(port) builds it: public, no credential.
    let req = get_req("/hello?a=1")
        .header("host", format!("{port}-{id}.{DOMAIN}"))
        .body(Body::empty())
        .expect("req");
    let (status, v) = call(req).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["uri"], "/hello?a=1");
    // The port header beside the sandbox's id.
    let req = get_req("/via-header")
        .header("e2b-sandbox-id", &id)
        .header("e2b-sandbox-port", port.to_string())
        .body(Body::empty())
        .expect("req");
    let (status, v) = call(req).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["uri"], "/via-header");
    assert!(v["headers"].get("e2b-sandbox-id").is_none(), "{v}");

    let (status, private) = call(create(json!({"allowPublicTraffic": false}))).await;
    assert_eq!(status, StatusCode::CREATED, "{private}");
    let pid = private["sandboxID"].as_str().expect("id").to_string();
    let token = private["trafficAccessToken"]
        .as_str()
        .expect("token")
        .to_string();
    let host = format!("{port}-{pid}.{DOMAIN}");
    let req = |t: Option<&str>| {
        let mut r = get_req("/").header("host", &host);
        if let Some(t) = t {
            r = r.header("e2b-traffic-access-token", t);
        }
        r.body(Body::empty()).expect("req")
    };
    let (status, _) = call(req(None)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let other = public_token_of(&h, &id);
    let (status, _) = call(req(Some(&other))).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, v) = call(req(Some(&token))).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(
        v["headers"].get("e2b-traffic-access-token").is_none(),
        "{v}"
    );
    // The marker stays out of the sandbox's listing.
    let req = get_req(&format!("/sandboxes/{pid}"))
        .header("x-api-key", KEY)
        .body(Body::empty());
    let (status, v) = call(req.expect("req")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["metadata"], json!({}), "{v}");
}

/// Another sandbox's traffic token (what a guess from a neighbour would be).
fn public_token_of(h: &Harness, id: &str) -> String {
    control_plane::e2b::token::Tokens::new(h.state.config.server.api_key.expose()).traffic(id)
}

/// Served as the service serves (the peer's address known), the server is told who asked.
#[tokio::test]
async fn the_server_is_told_the_clients_address_after_its_proxies() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = Harness::default();
    let id = h.session().await;
    let port = app_server().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let svc = h
        .router
        .clone()
        .into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move {
        let _ = axum::serve(listener, svc).await;
    });
    let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let req = format!(
        "GET /session/{id}/ports/{port}/who HTTP/1.1\r\nHost: x.test\r\nX-API-Key: {KEY}\r\n\
         X-Forwarded-For: 198.51.100.7\r\nConnection: close\r\n\r\n"
    );
    tcp.write_all(req.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    tcp.read_to_end(&mut out).await.expect("read");
    let text = String::from_utf8_lossy(&out);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    let v: Value = serde_json::from_str(body.trim()).expect("json");
    assert_eq!(
        v["headers"]["x-forwarded-for"], "198.51.100.7, 127.0.0.1",
        "{v}"
    );
}

/// Wake on traffic: a request to a paused session's port thaws it.
#[tokio::test]
async fn a_request_to_a_paused_sessions_port_thaws_it() {
    let h = Harness::default();
    let id = h.session().await;
    let port = app_server().await;
    let (status, v) = h.api("POST", &format!("/session/{id}/pause/"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{v}");
    let (_, v) = h.api("GET", &format!("/session/{id}/info/"), None).await;
    assert_eq!(v["state"], "paused", "{v}");
    let req = get_req(&port_path(&id, port, ""))
        .header("x-api-key", KEY)
        .body(Body::empty());
    let (status, _, _) = send(&h, req.expect("req")).await;
    assert_eq!(status, StatusCode::OK);
    let (_, v) = h.api("GET", &format!("/session/{id}/info/"), None).await;
    assert_eq!(v["state"], "running", "{v}");
}
