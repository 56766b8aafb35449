//! In-process tests of the MCP endpoint over the fake engine: the key check, the tool list, a
//! turn through the tools (the same sessions the REST routes see), tool failures as results,
//! bad arguments as protocol errors, the body bound and the DNS-rebinding guard; in the stateful
//! mode, the cap on MCP sessions and their idle expiry.

mod harness;

use axum::body::Body;
use axum::http::{Request, Response, StatusCode, header};
use control_plane::engine::fake::FakeEngine;
use http_body_util::BodyExt;
use serde_json::{Value, json};

use harness::{Harness, IMAGE, KEY};

/// A stateless JSON-RPC request to `/mcp`: the status and the answer's message.
async fn rpc(h: &Harness, key: Option<&str>, body: Value) -> (StatusCode, Value) {
    let mut req = Request::builder()
        .method("POST")
        .uri("/mcp")
        .header("host", "127.0.0.1:8000")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18");
    if let Some(k) = key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    let resp = h
        .send(req.body(Body::from(body.to_string())).expect("request"))
        .await;
    let status = resp.status();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    // JSON, or the last `data:` event of an SSE stream.
    let value = serde_json::from_str(&text).unwrap_or_else(|_| {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .next_back()
            .unwrap_or(Value::String(text.clone()))
    });
    (status, value)
}

fn stateless() -> Harness {
    Harness::new(FakeEngine::default(), &[("MCP_STATELESS", "true")])
}

async fn call(h: &Harness, tool: &str, args: Value) -> Value {
    let (s, v) = rpc(
        h,
        Some(KEY),
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
               "params": {"name": tool, "arguments": args}}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v
}

#[tokio::test]
async fn without_the_key_nothing_is_listed() {
    let h = stateless();
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let (s, v) = rpc(&h, None, list.clone()).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    assert!(!v.to_string().contains("session_create"));
    let (s, v) = rpc(&h, Some("wrong"), list.clone()).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert!(!v.to_string().contains("session_create"));
    let (s, v) = rpc(&h, Some(KEY), list).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let names: Vec<&str> = v["result"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        names.contains(&"session_create") && names.contains(&"run"),
        "{names:?}"
    );
}

#[tokio::test]
async fn a_turn_through_the_tools_uses_the_rest_sessions() {
    let h = stateless();
    let v = call(&h, "session_create", json!({"image": IMAGE})).await;
    assert_eq!(v["result"]["isError"], false, "{v}");
    let id = v["result"]["structuredContent"]["session_id"]
        .as_str()
        .expect("session_id")
        .to_string();
    // The REST API sees the same session.
    let (s, _) = h.api("GET", &format!("/session/{id}/"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let v = call(
        &h,
        "write",
        json!({"session_id": id, "path": "/workspace/repo/a.txt", "content": "hello mcp\n"}),
    )
    .await;
    assert_eq!(v["result"]["isError"], false, "{v}");
    let v = call(
        &h,
        "run",
        json!({"session_id": id, "commands": ["cat a.txt", "exit 3"]}),
    )
    .await;
    let results = &v["result"]["structuredContent"]["results"];
    assert_eq!(results[0]["output"], "hello mcp\n", "{v}");
    assert_eq!(results[1]["exit_code"], 3, "{v}");
    let v = call(
        &h,
        "edit",
        json!({"session_id": id, "path": "/workspace/repo/a.txt", "old": "hello", "new": "bye"}),
    )
    .await;
    assert_eq!(v["result"]["structuredContent"]["occurrences"], 1, "{v}");
    let v = call(&h, "grep", json!({"session_id": id, "pattern": "bye"})).await;
    assert_eq!(
        v["result"]["structuredContent"]["matches"][0]["path"], "/workspace/repo/a.txt",
        "{v}"
    );
    // A second write of the same path is the tool's own failure, with the fs code.
    let v = call(
        &h,
        "write",
        json!({"session_id": id, "path": "/workspace/repo/a.txt", "content": "x"}),
    )
    .await;
    assert_eq!(v["result"]["isError"], true, "{v}");
    assert_eq!(
        v["result"]["structuredContent"]["code"], "already_exists",
        "{v}"
    );
    let v = call(&h, "session_close", json!({"session_id": id})).await;
    assert_eq!(v["result"]["isError"], false, "{v}");
    // Gone: not_found, with the way out.
    let v = call(&h, "run", json!({"session_id": id, "commands": ["true"]})).await;
    assert_eq!(v["result"]["isError"], true, "{v}");
    assert_eq!(v["result"]["structuredContent"]["code"], "not_found", "{v}");
    assert!(
        v["result"]["structuredContent"]["remediation"]
            .as_str()
            .unwrap_or("")
            .contains("session_create"),
        "{v}"
    );
}

#[tokio::test]
async fn bad_arguments_and_unknown_tools_are_protocol_errors_naming_the_field() {
    let h = stateless();
    let v = call(&h, "run", json!({"session_id": "x", "commands": "ls"})).await;
    assert_eq!(v["error"]["code"], -32602, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("commands"),
        "{v}"
    );
    let v = call(&h, "no_such_tool", json!({})).await;
    assert_eq!(v["error"]["code"], -32602, "{v}");
}

#[tokio::test]
async fn an_oversized_body_is_413_and_a_foreign_host_is_refused() {
    let h = Harness::new(
        FakeEngine::default(),
        &[("MCP_STATELESS", "true"), ("MCP_MAX_REQUEST_BYTES", "2048")],
    );
    let big = "x".repeat(4096);
    let (s, _) = rpc(
        &h,
        Some(KEY),
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
               "params": {"name": "ls", "arguments": {"session_id": big}}}),
    )
    .await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    let req = Request::builder()
        .method("POST")
        .uri("/mcp")
        .header("host", "evil.test")
        .header("x-api-key", KEY)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(Body::from(
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string(),
        ))
        .expect("request");
    assert_eq!(h.send(req).await.status(), StatusCode::FORBIDDEN);
}

/// A request of the stateful mode: `method` to `/mcp`, in `session` if given.
fn stateful_request(method: &str, session: Option<&str>, body: Option<Value>) -> Request<Body> {
    let mut req = Request::builder()
        .method(method)
        .uri("/mcp")
        .header("host", "127.0.0.1:8000")
        .header("x-api-key", KEY)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18");
    if let Some(id) = session {
        req = req.header("mcp-session-id", id);
    }
    match body {
        Some(b) => req
            .header("content-type", "application/json")
            .body(Body::from(b.to_string())),
        None => req.body(Body::empty()),
    }
    .expect("request")
}

fn initialize_request() -> Request<Body> {
    stateful_request(
        "POST",
        None,
        Some(
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "mcp-router-test", "version": "0"}}}),
        ),
    )
}

/// A new MCP session's id.
async fn initialize(h: &Harness) -> String {
    let resp = h.send(initialize_request()).await;
    assert_eq!(resp.status(), StatusCode::OK);
    resp.headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .expect("mcp-session-id")
        .to_string()
}

/// `tools/list` in `session`, read to its end: the status.
async fn list_in(h: &Harness, session: &str) -> StatusCode {
    let resp = h
        .send(stateful_request(
            "POST",
            Some(session),
            Some(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})),
        ))
        .await;
    let status = resp.status();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    if status == StatusCode::OK {
        assert!(
            String::from_utf8_lossy(&body).contains("session_create"),
            "{body:?}"
        );
    }
    status
}

/// The session's standalone `GET` stream, held open for as long as the response is kept (a
/// connected client's, as the Python SDK holds it).
async fn open_stream(h: &Harness, session: &str) -> Response<Body> {
    let resp = h.send(stateful_request("GET", Some(session), None)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    resp
}

#[tokio::test]
async fn past_the_session_cap_the_least_recently_used_idle_session_goes() {
    let h = Harness::new(FakeEngine::default(), &[("MCP_MAX_SESSIONS", "2")]);
    let a = initialize(&h).await;
    let b = initialize(&h).await;
    // `a` used after `b` was made: `b` is the least recently used.
    assert_eq!(list_in(&h, &a).await, StatusCode::OK);
    let c = initialize(&h).await;
    // The spec's answer for a session the server ended: 404, so the client starts a new one.
    assert_eq!(list_in(&h, &b).await, StatusCode::NOT_FOUND);
    assert_eq!(list_in(&h, &a).await, StatusCode::OK);
    assert_eq!(list_in(&h, &c).await, StatusCode::OK);
}

#[tokio::test]
async fn a_session_with_a_stream_open_is_kept_and_a_full_cap_of_them_is_503() {
    let h = Harness::new(FakeEngine::default(), &[("MCP_MAX_SESSIONS", "1")]);
    let a = initialize(&h).await;
    let stream = open_stream(&h, &a).await;
    let refused = h.send(initialize_request()).await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(refused.headers().contains_key(header::RETRY_AFTER));
    let body = refused
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    let v: Value = serde_json::from_slice(&body).expect("json");
    assert!(
        v["detail"]
            .as_str()
            .unwrap_or("")
            .contains("too many MCP sessions"),
        "{v}"
    );
    // The connected client works on.
    assert_eq!(list_in(&h, &a).await, StatusCode::OK);
    // Once its stream is closed it is idle, and a new client takes its place.
    drop(stream);
    let b = initialize(&h).await;
    assert_eq!(list_in(&h, &a).await, StatusCode::NOT_FOUND);
    assert_eq!(list_in(&h, &b).await, StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn an_idle_session_expires_and_a_connected_one_does_not() {
    let h = Harness::new(FakeEngine::default(), &[("MCP_SESSION_IDLE_SECONDS", "1")]);
    let idle = initialize(&h).await;
    let connected = initialize(&h).await;
    let stream = open_stream(&h, &connected).await;
    // The paused clock runs through the idle time and the sweeps after it.
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    assert_eq!(list_in(&h, &idle).await, StatusCode::NOT_FOUND);
    assert_eq!(list_in(&h, &connected).await, StatusCode::OK);
    drop(stream);
}

/// `/mcp` is inside the request observer: its requests are in the request metric and log as the
/// MCP door's, apart from the REST API's.
#[tokio::test]
async fn mcp_requests_are_observed_as_the_mcp_doors() {
    let h = Harness::new(FakeEngine::default(), &[("METRICS_PUBLIC", "true")]);
    initialize(&h).await;
    let _ = h.call("GET", "/api/v1/-/version/", None, None).await;
    let (_, body) = h.call("GET", "/metrics", None, None).await;
    let text = body.as_str().unwrap_or_default();
    let series = |door: &str, route: &str| harness::has_request_series(text, door, route);
    assert!(series("mcp", "/mcp"), "{text}");
    assert!(series("rest", "/-/version/"), "{text}");
    assert!(!series("rest", "/mcp"), "{text}");
}

/// The process tools go through the same operations as the routes: a process runs and is read
/// back, and one the session does not have is the tool's "no such process" (the session itself
/// is fine), not the session's own "not found".
#[tokio::test]
async fn a_process_the_session_lacks_is_not_a_session_gone() {
    let h = stateless();
    let id = h.session().await;
    let v = call(
        &h,
        "process_start",
        json!({"session_id": id, "command": "echo from-mcp"}),
    )
    .await;
    assert_eq!(v["result"]["isError"], false, "{v}");
    let pid = v["result"]["structuredContent"]["process_id"]
        .as_str()
        .expect("process_id")
        .to_string();
    let mut output = String::new();
    for _ in 0..100 {
        let v = call(
            &h,
            "process_output",
            json!({"session_id": id, "process_id": pid, "wait": 1}),
        )
        .await;
        let out = &v["result"]["structuredContent"];
        output = out["output"].as_str().unwrap_or_default().to_string();
        if out["running"] == false {
            break;
        }
    }
    assert_eq!(output, "from-mcp\n");

    let v = call(
        &h,
        "process_output",
        json!({"session_id": id, "process_id": "nobody"}),
    )
    .await;
    assert_eq!(v["result"]["isError"], true, "{v}");
    let failure = &v["result"]["structuredContent"];
    assert_eq!(failure["code"], "not_found", "{v}");
    assert_eq!(failure["cause"], "No such process in this session", "{v}");
}
