//! In-process tests of the code interpreter's doors over the fake engine, whose helper is a host
//! build of the real one: the sandbox's interpreter is a stand-in this test serves on the host's
//! loopback at port 49999 (the fake engine's sandboxes share the host's network). The native
//! routes map onto the interpreter's own (`/code` to `/execute`, the contexts), stream its NDJSON
//! back and keep the API key from it; MCP's `run_code` renders its lines as text and images; a
//! session with no interpreter is a conflict that says so. One test: the port is the host's.

mod harness;

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::any;
use http_body_util::BodyExt;
use serde_json::{Value, json};

use harness::{Harness, KEY};

type Seen = Arc<Mutex<Vec<Value>>>;

/// The stand-in: records each request (method, path, headers, body), answers `/execute` with a
/// few E2B lines (a figure among them) and `/contexts` with a context.
async fn interpreter(seen: Seen) -> tokio::task::JoinHandle<()> {
    async fn handle(State(seen): State<Seen>, req: Request) -> axum::response::Response {
        let (parts, body) = req.into_parts();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let headers: serde_json::Map<String, Value> = parts
            .headers
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v.to_str().unwrap_or(""))))
            .collect();
        seen.lock().expect("seen").push(json!({
            "method": parts.method.as_str(),
            "path": parts.uri.path(),
            "headers": headers,
            "body": serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null),
        }));
        match parts.uri.path() {
            "/execute" => {
                let lines = [
                    json!({"type": "number_of_executions", "execution_count": 3}),
                    json!({"type": "stdout", "text": "hi\n", "timestamp": 1}),
                    json!({"type": "result", "png": "iVBORw0KGgo=", "text": "<Figure>", "is_main_result": false}),
                    json!({"type": "result", "text": "42", "is_main_result": true}),
                    json!({"type": "error", "name": "ValueError", "value": "bad",
                           "traceback": "\u{1b}[31mValueError\u{1b}[39m: bad"}),
                    json!({"type": "end_of_execution"}),
                ];
                let body: String = lines.iter().map(|l| format!("{l}\n")).collect();
                axum::response::Response::builder()
                    .header("content-type", "application/x-ndjson")
                    .body(Body::from(body))
                    .expect("response")
            }
            "/contexts" => axum::Json(json!({"id": "c-1", "language": "python", "cwd": "/tmp"}))
                .into_response(),
            _ => StatusCode::NO_CONTENT.into_response(),
        }
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:49999")
        .await
        .expect("port 49999 is free on the host's loopback (the code interpreter's)");
    let router = axum::Router::new().fallback(any(handle)).with_state(seen);
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    })
}

async fn raw(h: &Harness, method: &str, path: &str, body: Option<Value>) -> (StatusCode, String) {
    let mut req = Request::builder()
        .method(method)
        .uri(format!("/api/v1{path}"))
        .header("x-api-key", KEY);
    let body = match body {
        Some(v) => {
            req = req.header("content-type", "application/json");
            Body::from(v.to_string())
        }
        None => Body::empty(),
    };
    let resp = h.send(req.body(body).expect("request")).await;
    let status = resp.status();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

#[tokio::test]
async fn native_routes_and_run_code_reach_the_interpreter_and_a_session_without_one_says_so() {
    let h = Harness::new(
        control_plane::engine::fake::FakeEngine::default(),
        &[("MCP_STATELESS", "true")],
    );
    let id = h.session().await;

    // No interpreter yet: after waiting for one to start, a 409 that says why.
    let (status, body) = raw(
        &h,
        "POST",
        &format!("/session/{id}/code"),
        Some(json!({"code": "1"})),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body.contains("no code interpreter"), "{body}");

    let seen: Seen = Arc::default();
    let server = interpreter(seen.clone()).await;

    // The cell goes to /execute as it was sent; its lines come back as they were written.
    let cell = json!({"code": "x", "env_vars": {"A": "1"}, "timeout": 2.5});
    let (status, body) = raw(
        &h,
        "POST",
        &format!("/session/{id}/code"),
        Some(cell.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let lines: Vec<Value> = body
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    assert_eq!(lines.len(), 6, "{body}");
    assert_eq!(lines[3]["text"], "42");
    {
        let seen = seen.lock().expect("seen");
        let last = seen.last().expect("a request");
        assert_eq!(last["path"], "/execute");
        assert_eq!(last["body"], cell);
        assert!(
            last["headers"].get("x-api-key").is_none(),
            "the key reached the sandbox: {last}"
        );
    }

    // The contexts' routes, each onto the interpreter's own.
    for (method, path, want) in [
        ("POST", format!("/session/{id}/code/contexts"), "/contexts"),
        ("GET", format!("/session/{id}/code/contexts/"), "/contexts"),
        (
            "DELETE",
            format!("/session/{id}/code/contexts/c-1"),
            "/contexts/c-1",
        ),
        (
            "POST",
            format!("/session/{id}/code/contexts/c-1/restart"),
            "/contexts/c-1/restart",
        ),
        (
            "POST",
            format!("/session/{id}/code/contexts/c-1/interrupt"),
            "/contexts/c-1/interrupt",
        ),
    ] {
        let (status, body) = raw(&h, method, &path, (method == "POST").then(|| json!({}))).await;
        assert!(status.is_success(), "{method} {path}: {status} {body}");
        let seen = seen.lock().expect("seen");
        let last = seen.last().expect("a request");
        assert_eq!(
            (last["method"].as_str(), last["path"].as_str()),
            (Some(method), Some(want))
        );
    }
    // What is not a context id or an action never reaches the interpreter as a path.
    let before = seen.lock().expect("seen").len();
    for (method, path) in [
        (
            "DELETE",
            format!("/session/{id}/code/contexts/..%2F..%2Fexecute"),
        ),
        ("POST", format!("/session/{id}/code/contexts/c%3Fx/restart")),
        ("POST", format!("/session/{id}/code/contexts/c-1/shutdown")),
    ] {
        let (status, _) = raw(&h, method, &path, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}");
    }
    assert_eq!(seen.lock().expect("seen").len(), before);

    // MCP's run_code: the transcript as text, the figure as image content.
    let req = Request::builder()
        .method("POST")
        .uri("/mcp")
        .header("host", "127.0.0.1:8000")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18")
        .header("authorization", format!("Bearer {KEY}"))
        .body(Body::from(
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": "run_code", "arguments": {"session_id": id, "code": "x"}}})
            .to_string(),
        ))
        .expect("request");
    let resp = h.send(req).await;
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let text = String::from_utf8_lossy(&bytes);
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .next_back()
            .expect("an answer")
    });
    let content = &v["result"]["content"];
    assert_eq!(content[0]["type"], "text", "{v}");
    assert_eq!(
        content[0]["text"], "hi\n<Figure>\nOut: 42\nValueError: bad\n",
        "output in order, the value marked, no terminal colours: {v}"
    );
    assert_eq!(content[1]["type"], "image", "{v}");
    assert_eq!(content[1]["mimeType"], "image/png", "{v}");
    assert_eq!(content[1]["data"], "iVBORw0KGgo=", "{v}");
    let structured = &v["result"]["structuredContent"];
    assert_eq!(structured["error"]["name"], "ValueError", "{v}");
    assert_eq!(structured["execution_count"], 3, "{v}");
    assert_eq!(structured["results"][0]["png"], "[image 1]", "{v}");
    server.abort();
}
