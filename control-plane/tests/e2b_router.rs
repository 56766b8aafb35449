//! In-process tests of E2B's API over the fake engine: the control API's shapes and statuses as
//! E2B's SDK parses them (201 on create, `{code, message}` errors, the list's double-encoded
//! metadata filter, 409 for a second pause), envd's token check and the Connect protocol's
//! refusals (a malformed, compressed or oversized envelope is an error, never a hang), a signed
//! upload URL confined to its path, the polled watchers' caps, and a paused sandbox that envd
//! leaves paused until `connect`.

mod harness;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use control_plane::e2b;
use control_plane::engine::fake::FakeEngine;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use harness::{Harness, IMAGE, KEY};

/// E2B's API over the app of a [`Harness`] (the harness kept, for its reaper and native API).
struct E2b {
    router: axum::Router,
    h: Harness,
}

fn service() -> E2b {
    let templates = format!(r#"{{"base": "{IMAGE}"}}"#);
    let h = Harness::new(FakeEngine::default(), &[("E2B_TEMPLATES", &templates)]);
    let router = e2b::router(h.state.config.clone(), h.state.ops(), &h.state.metrics);
    E2b { router, h }
}

impl E2b {
    async fn send(&self, req: Request<Body>) -> (StatusCode, Vec<u8>, axum::http::HeaderMap) {
        let resp = match self.router.clone().oneshot(req).await {
            Ok(r) => r,
            Err(e) => match e {},
        };
        let (status, headers) = (resp.status(), resp.headers().clone());
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        (status, bytes.to_vec(), headers)
    }

    /// A control-API call with `key`.
    async fn control(
        &self,
        method: &str,
        uri: &str,
        body: Option<Value>,
        key: &str,
    ) -> (StatusCode, Value, axum::http::HeaderMap) {
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header("x-api-key", key);
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        let body = body.map(|b| Body::from(b.to_string())).unwrap_or_default();
        let (status, bytes, headers) = self.send(req.body(body).expect("request")).await;
        let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, v, headers)
    }

    /// An envd call for `sandbox` with `token`.
    async fn envd(
        &self,
        path: &str,
        sandbox: &str,
        token: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> (StatusCode, Vec<u8>, axum::http::HeaderMap) {
        let req = Request::builder()
            .method("POST")
            .uri(path)
            .header("e2b-sandbox-id", sandbox)
            .header("e2b-sandbox-port", "49983")
            .header("x-access-token", token)
            .header("content-type", content_type)
            .body(Body::from(body))
            .expect("request");
        self.send(req).await
    }

    async fn create(&self, body: Value) -> Value {
        let (s, v, _) = self.control("POST", "/v2/sandboxes", Some(body), KEY).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        v
    }
}

fn envelope(flags: u8, json: &[u8]) -> Vec<u8> {
    let mut out = vec![flags];
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(json);
    out
}

/// The envelopes of a streamed answer: (flags, JSON).
fn envelopes(mut buf: &[u8]) -> Vec<(u8, Value)> {
    let mut out = Vec::new();
    while buf.len() >= 5 {
        let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
        let v = serde_json::from_slice(&buf[5..5 + len]).expect("JSON envelope");
        out.push((buf[0], v));
        buf = &buf[5 + len..];
    }
    out
}

#[tokio::test]
async fn a_create_answers_201_with_what_the_sdk_requires_and_info_and_list_show_it() {
    let e = service();
    let v = e
        .create(
            json!({"templateID": "base", "timeout": 120, "metadata": {"suite": "a b"},
                       "envVars": {"X": "1"}}),
        )
        .await;
    let id = v["sandboxID"].as_str().expect("sandboxID").to_string();
    assert_eq!(v["templateID"], "base");
    assert_eq!(v["envdVersion"], e2b::ENVD_VERSION);
    assert!(
        v["clientID"].is_string() && v["envdAccessToken"].is_string(),
        "{v}"
    );

    let (s, info, _) = e
        .control("GET", &format!("/sandboxes/{id}"), None, KEY)
        .await;
    assert_eq!(s, StatusCode::OK, "{info}");
    for k in [
        "templateID",
        "sandboxID",
        "clientID",
        "startedAt",
        "endAt",
        "envdVersion",
        "cpuCount",
        "memoryMB",
        "diskSizeMB",
        "state",
    ] {
        assert!(info.get(k).is_some(), "{k} missing: {info}");
    }
    assert_eq!(info["state"], "running");
    assert_eq!(info["metadata"], json!({"suite": "a b"}));
    assert_eq!(info["templateID"], "base");

    // The SDK's filter: `metadata=` of `quote(k)=quote(v)`, URL-encoded again.
    let (s, list, headers) = e
        .control(
            "GET",
            "/v2/sandboxes?metadata=suite%3Da%2520b&state=running,paused",
            None,
            KEY,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{list}");
    let ids: Vec<&str> = list
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|s| s["sandboxID"].as_str())
        .collect();
    assert_eq!(ids, [id.as_str()]);
    assert!(headers.get("x-next-token").is_none(), "one page");
    let (_, none, _) = e
        .control("GET", "/v2/sandboxes?metadata=suite%3Dother", None, KEY)
        .await;
    assert_eq!(none, json!([]));

    // Kill: 204, then 404 with E2B's error body (the SDK's `False`).
    let (s, _, _) = e
        .control("DELETE", &format!("/sandboxes/{id}"), None, KEY)
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, v, _) = e
        .control("DELETE", &format!("/sandboxes/{id}"), None, KEY)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(v["code"], 404, "{v}");
    assert!(v["message"].is_string(), "{v}");
}

#[tokio::test]
async fn wrong_keys_unknown_templates_and_routes_are_e2b_errors() {
    let e = service();
    let (s, v, _) = e
        .control(
            "POST",
            "/v2/sandboxes",
            Some(json!({"templateID": "base"})),
            "wrong",
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    assert_eq!(v["code"], 401, "{v}");
    let (s, _, _) = e.control("GET", "/v2/sandboxes", None, "").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, v, _) = e
        .control(
            "POST",
            "/sandboxes",
            Some(json!({"templateID": "nope"})),
            KEY,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(
        v["message"].as_str().is_some_and(|m| m.contains("'nope'")),
        "{v}"
    );
    let (s, v, _) = e.control("GET", "/no/such/route", None, KEY).await;
    assert_eq!((s, v["code"].clone()), (StatusCode::NOT_FOUND, json!(404)));
    let (s, v, _) = e
        .control("GET", "/sandboxes/..%2F..%2Fetc", None, KEY)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    // A network the deployment cannot give (no egress CA in the tests' settings) is a 400.
    let (s, v, _) = e
        .control(
            "POST",
            "/v2/sandboxes",
            Some(json!({"templateID": "base", "network": {"allowOut": ["api.example.test"]}})),
            KEY,
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["message"]
            .as_str()
            .is_some_and(|m| m.contains("EGRESS_CA")),
        "{v}"
    );
    let (s, v, _) = e
        .control(
            "POST",
            "/v2/sandboxes",
            Some(json!({"templateID": "base", "network": {"denyOut": ["10.0.0.0/8"]}})),
            KEY,
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
}

#[tokio::test]
async fn a_second_pause_is_a_conflict_and_connect_resumes() {
    let e = service();
    let id = e.create(json!({"templateID": "base"})).await["sandboxID"]
        .as_str()
        .expect("id")
        .to_string();
    let (s, v, _) = e
        .control(
            "POST",
            &format!("/sandboxes/{id}/pause"),
            Some(json!({})),
            KEY,
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{v}");
    let (s, v, _) = e
        .control(
            "POST",
            &format!("/sandboxes/{id}/pause"),
            Some(json!({})),
            KEY,
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    let (s, v, _) = e
        .control(
            "POST",
            &format!("/v2/sandboxes/{id}/connect"),
            Some(json!({"timeout": 60})),
            KEY,
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "resumed: {v}");
    assert_eq!(v["sandboxID"], id.as_str());
    let (_, info, _) = e
        .control("GET", &format!("/sandboxes/{id}"), None, KEY)
        .await;
    assert_eq!(info["state"], "running", "{info}");
}

#[tokio::test]
async fn envd_needs_the_sandboxs_own_token_and_refuses_bad_envelopes() {
    let e = service();
    let a = e.create(json!({"templateID": "base"})).await;
    let b = e.create(json!({"templateID": "base"})).await;
    let (id_a, token_a) = (
        a["sandboxID"].as_str().expect("id"),
        a["envdAccessToken"].as_str().expect("token"),
    );
    let token_b = b["envdAccessToken"].as_str().expect("token");
    let stat = br#"{"path": "/"}"#.to_vec();

    let (s, body, _) = e
        .envd(
            "/filesystem.Filesystem/Stat",
            id_a,
            token_b,
            "application/json",
            stat.clone(),
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let v: Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(v["code"], "unauthenticated", "{v}");

    // Streaming calls: a compressed, a truncated and an oversized envelope are end-of-stream
    // errors with HTTP 200, each answered at once.
    for (bytes, code) in [
        (envelope(1, br#"{"path": "/"}"#), "unimplemented"),
        (
            envelope(0, br#"{"path": "/"}"#)[..8].to_vec(),
            "invalid_argument",
        ),
        (
            [vec![0u8, 0x7f, 0xff, 0xff, 0xff], b"{}".to_vec()].concat(),
            "resource_exhausted",
        ),
        (envelope(0, b"not json"), "invalid_argument"),
    ] {
        let (s, body, headers) = e
            .envd(
                "/filesystem.Filesystem/WatchDir",
                id_a,
                token_a,
                "application/connect+json",
                bytes,
            )
            .await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(headers["content-type"], "application/connect+json");
        let frames = envelopes(&body);
        assert_eq!(frames.len(), 1, "{frames:?}");
        assert_eq!(frames[0].0, 2, "end of stream");
        assert_eq!(frames[0].1["error"]["code"], code, "{frames:?}");
    }

    // Protobuf is not served; an unknown method is unimplemented; root is refused.
    let (s, _, _) = e
        .envd(
            "/process.Process/List",
            id_a,
            token_a,
            "application/proto",
            Vec::new(),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_IMPLEMENTED);
    let (s, _, _) = e
        .envd(
            "/process.Process/Nope",
            id_a,
            token_a,
            "application/json",
            b"{}".to_vec(),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_IMPLEMENTED);
    let req = Request::builder()
        .method("POST")
        .uri("/filesystem.Filesystem/Stat")
        .header("e2b-sandbox-id", id_a)
        .header("x-access-token", token_a)
        .header("authorization", "Basic cm9vdDo=")
        .header("content-type", "application/json")
        .body(Body::from(stat))
        .expect("request");
    let (s, body, _) = e.send(req).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert!(String::from_utf8_lossy(&body).contains("root"));

    // envd for a sandbox that is gone: the SDK's "not running".
    let (s, _, _) = e
        .control("DELETE", &format!("/sandboxes/{id_a}"), None, KEY)
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, body, _) = e
        .envd(
            "/process.Process/List",
            id_a,
            token_a,
            "application/json",
            b"{}".to_vec(),
        )
        .await;
    let v: Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(
        (s, v["code"].clone()),
        (StatusCode::SERVICE_UNAVAILABLE, json!("unavailable")),
        "{v}"
    );
    assert!(
        v["message"]
            .as_str()
            .is_some_and(|m| m.contains("was not found"))
    );
}

/// `POST /files` of `parts` (file name, content) as multipart, for sandbox `id`, with the token
/// (`token` non-empty) or without (a signed URL's query says who may).
async fn upload(
    e: &E2b,
    id: &str,
    token: &str,
    query: &str,
    parts: &[(&str, &str)],
) -> (StatusCode, Value) {
    let boundary = "xBOUNDARYx";
    let mut body = String::new();
    for (name, content) in parts {
        body.push_str(&format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n\
             Content-Type: application/octet-stream\r\n\r\n{content}\r\n"
        ));
    }
    body.push_str(&format!("--{boundary}--\r\n"));
    let (s, bytes, _) = e
        .envd_with(
            "POST",
            &format!("/files?{query}"),
            id,
            token,
            &format!("multipart/form-data; boundary={boundary}"),
            body.into_bytes(),
        )
        .await;
    (s, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// The SDK's signature of a `/files` URL (e2b's `get_signature`, no expiration, default user).
fn signature(path: &str, operation: &str, token: &str) -> String {
    use base64::Engine;
    let raw = format!("{path}:{operation}::{token}");
    let sum = ring::digest::digest(&ring::digest::SHA256, raw.as_bytes());
    let sig = format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(sum.as_ref())
    );
    // As the SDK puts it in the query: percent-encoded.
    sig.replace('+', "%2B").replace('/', "%2F")
}

impl E2b {
    /// [`E2b::envd`] with any method; no `X-Access-Token` when `token` is empty.
    async fn envd_with(
        &self,
        method: &str,
        path: &str,
        sandbox: &str,
        token: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> (StatusCode, Vec<u8>, axum::http::HeaderMap) {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("e2b-sandbox-id", sandbox)
            .header("content-type", content_type);
        if !token.is_empty() {
            req = req.header("x-access-token", token);
        }
        self.send(req.body(Body::from(body)).expect("request"))
            .await
    }

    /// A file of the sandbox through the native API: its status and bytes.
    async fn native_file(&self, id: &str, path: &str) -> (StatusCode, Vec<u8>) {
        let req = Request::builder()
            .uri(format!("/api/v1/session/{id}/files?path={path}"))
            .header("x-api-key", KEY)
            .body(Body::empty())
            .expect("request");
        let resp = self.h.send(req).await;
        let status = resp.status();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        (status, bytes.to_vec())
    }

    /// A unary envd call's status and answer.
    async fn unary(&self, method: &str, id: &str, token: &str, body: Value) -> (StatusCode, Value) {
        let (s, bytes, _) = self
            .envd(
                method,
                id,
                token,
                "application/json",
                body.to_string().into_bytes(),
            )
            .await;
        (s, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }
}

/// A URL signed for one path writes that path and no other: every part of a multipart body goes
/// to it (as envd writes them), whatever the parts' file names say; a signed URL without a path
/// is refused. The access token, which may do anything the sandbox user may, still writes each
/// part to its own name.
#[tokio::test]
async fn a_signed_upload_url_writes_the_path_it_was_signed_for_and_no_other() {
    let e = service();
    let v = e.create(json!({"templateID": "base"})).await;
    let id = v["sandboxID"].as_str().expect("id");
    let token = v["envdAccessToken"].as_str().expect("token");
    let signed = "/workspace/repo/up.txt";
    // In a real sandbox the second part would be `/home/user/.bashrc`, which E2B's `bash -l`
    // runs before every later command (here paths outside /workspace are the host's).
    let elsewhere = "/workspace/repo/elsewhere.txt";
    let sig = signature(signed, "write", token);

    let (s, answer) = upload(
        &e,
        id,
        "",
        &format!("path={signed}&signature={sig}"),
        &[("a.txt", "first"), (elsewhere, "second")],
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{answer}");
    assert_eq!(
        e.native_file(id, signed).await,
        (StatusCode::OK, b"second".to_vec())
    );
    assert_eq!(
        e.native_file(id, elsewhere).await.0,
        StatusCode::NOT_FOUND,
        "written outside the signed path"
    );
    assert_eq!(
        e.native_file(id, "/workspace/repo/a.txt").await.0,
        StatusCode::NOT_FOUND
    );

    // Signed over no path: the body does not get to choose one.
    let (s, answer) = upload(
        &e,
        id,
        "",
        &format!("signature={}", signature("", "write", token)),
        &[(elsewhere, "third")],
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(e.native_file(id, elsewhere).await.0, StatusCode::NOT_FOUND);

    // A signature over another path, or for reading, opens nothing.
    for sig in [
        signature("/workspace/repo/x", "write", token),
        signature(signed, "read", token),
    ] {
        let (s, _) = upload(
            &e,
            id,
            "",
            &format!("path={signed}&signature={sig}"),
            &[("x", "y")],
        )
        .await;
        assert_eq!(s, StatusCode::UNAUTHORIZED);
    }

    // The token: each part to its own name, as envd writes a `write_files`.
    let (s, answer) = upload(
        &e,
        id,
        token,
        "",
        &[(elsewhere, "fourth"), ("/workspace/repo/b.txt", "fifth")],
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{answer}");
    assert_eq!(
        e.native_file(id, elsewhere).await,
        (StatusCode::OK, b"fourth".to_vec())
    );
    assert_eq!(
        e.native_file(id, "/workspace/repo/b.txt").await,
        (StatusCode::OK, b"fifth".to_vec())
    );
}

/// A sandbox has at most 16 polled watchers (a clear `resource_exhausted` past them), and a
/// killed sandbox's watchers go with it.
#[tokio::test]
async fn polled_watchers_are_capped_per_sandbox_and_go_with_their_sandbox() {
    let e = service();
    let v = e.create(json!({"templateID": "base"})).await;
    let id = v["sandboxID"].as_str().expect("id");
    let token = v["envdAccessToken"].as_str().expect("token");
    let watch = json!({"path": "/workspace/repo"});
    let mut watchers = Vec::new();
    for _ in 0..16 {
        let (s, w) = e
            .unary(
                "/filesystem.Filesystem/CreateWatcher",
                id,
                token,
                watch.clone(),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{w}");
        watchers.push(w["watcherId"].as_str().expect("watcherId").to_string());
    }
    let (s, refused) = e
        .unary(
            "/filesystem.Filesystem/CreateWatcher",
            id,
            token,
            watch.clone(),
        )
        .await;
    assert_eq!(
        (s, refused["code"].clone()),
        (StatusCode::TOO_MANY_REQUESTS, json!("resource_exhausted")),
        "{refused}"
    );
    assert!(
        refused["message"]
            .as_str()
            .is_some_and(|m| m.contains("16")),
        "{refused}"
    );
    // Removing one makes room.
    let (s, _) = e
        .unary(
            "/filesystem.Filesystem/RemoveWatcher",
            id,
            token,
            json!({"watcherId": watchers.pop()}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, w) = e
        .unary("/filesystem.Filesystem/CreateWatcher", id, token, watch)
        .await;
    assert_eq!(s, StatusCode::OK, "{w}");
    watchers.push(w["watcherId"].as_str().expect("watcherId").to_string());
    let (s, events) = e
        .unary(
            "/filesystem.Filesystem/GetWatcherEvents",
            id,
            token,
            json!({"watcherId": watchers[0]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{events}");

    let (s, _, _) = e
        .control("DELETE", &format!("/sandboxes/{id}"), None, KEY)
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    for w in &watchers {
        let (s, gone) = e
            .unary(
                "/filesystem.Filesystem/GetWatcherEvents",
                id,
                token,
                json!({"watcherId": w}),
            )
            .await;
        assert_eq!(
            (s, gone["code"].clone()),
            (StatusCode::NOT_FOUND, json!("not_found")),
            "{gone}"
        );
        assert!(
            gone["message"]
                .as_str()
                .is_some_and(|m| m.contains("watcher")),
            "{gone}"
        );
    }
}

/// A sandbox paused at its timeout (`autoPause`) is not running to envd, as on E2B: its calls
/// answer "not running" and leave it paused; `connect` alone resumes it, with a deadline again.
#[tokio::test]
async fn an_auto_paused_sandbox_stays_paused_to_envd_until_connect_gives_it_a_deadline() {
    let e = service();
    let v = e
        .create(json!({"templateID": "base", "timeout": 5, "autoPause": true}))
        .await;
    let id = v["sandboxID"].as_str().expect("id");
    let token = v["envdAccessToken"].as_str().expect("token");
    let swept =
        e.h.cell()
            .reaper()
            .clone()
            .sweep(std::time::SystemTime::now() + std::time::Duration::from_secs(60))
            .await
            .expect("sweep");
    assert_eq!(swept.paused, vec![id.to_string()], "{swept:?}");

    let (s, answer) = e
        .unary(
            "/filesystem.Filesystem/Stat",
            id,
            token,
            json!({"path": "/workspace"}),
        )
        .await;
    assert_eq!(
        (s, answer["code"].clone()),
        (StatusCode::SERVICE_UNAVAILABLE, json!("unavailable")),
        "{answer}"
    );
    assert!(
        answer["message"]
            .as_str()
            .is_some_and(|m| m.contains("paused")),
        "{answer}"
    );
    let (s, answer) = e.unary("/process.Process/List", id, token, json!({})).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    let (s, bytes, _) = e
        .envd_with(
            "GET",
            "/files?path=/workspace/repo/x",
            id,
            token,
            "",
            Vec::new(),
        )
        .await;
    assert_eq!(
        s,
        StatusCode::BAD_GATEWAY,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    let (s, _) = upload(&e, id, token, "path=/workspace/repo/x", &[("x", "y")]).await;
    assert_eq!(s, StatusCode::BAD_GATEWAY);
    let (s, _, _) = e
        .envd_with("GET", "/health", id, token, "", Vec::new())
        .await;
    assert_eq!(s, StatusCode::BAD_GATEWAY);
    let (_, info, _) = e
        .control("GET", &format!("/sandboxes/{id}"), None, KEY)
        .await;
    assert_eq!(info["state"], "paused", "envd thawed it: {info}");
    assert_eq!(info["endAt"], "9999-12-31T23:59:59Z", "{info}");

    resumes_with_its_deadline(&e, id, 120).await;
    let (s, answer) = e
        .unary(
            "/filesystem.Filesystem/Stat",
            id,
            token,
            json!({"path": "/workspace"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{answer}");
}

/// E2B's listener is inside the request observer, and the requests its translation sends to the
/// service's own router count as the E2B door's, not the REST API's.
#[tokio::test]
async fn e2b_traffic_is_observed_as_the_e2b_doors() {
    let e = service();
    let created = e.create(json!({"templateID": "base"})).await;
    assert!(created["sandboxID"].is_string(), "{created}");
    let (_, body) = e.h.call("GET", "/metrics", None, Some(KEY)).await;
    let text = body.as_str().unwrap_or_default();
    let series = |door: &str, route: &str| harness::has_request_series(text, door, route);
    assert!(series("e2b", "/v2/sandboxes"), "{text}");
    // The create is an operation, not a request to the native routes: counted once, as E2B's.
    assert!(!series("e2b", "/session/"), "{text}");
    assert!(!series("rest", "/session/"), "{text}");
}

/// A `connect` with `timeout` resumes paused sandbox `id` (201): it runs, and ends about
/// `timeout` seconds from now (within a minute).
async fn resumes_with_its_deadline(e: &E2b, id: &str, timeout: i64) {
    let (s, v, _) = e
        .control(
            "POST",
            &format!("/sandboxes/{id}/connect"),
            Some(json!({ "timeout": timeout })),
            KEY,
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (_, info, _) = e
        .control("GET", &format!("/sandboxes/{id}"), None, KEY)
        .await;
    assert_eq!(info["state"], "running", "{info}");
    let end = time::OffsetDateTime::parse(
        info["endAt"].as_str().expect("endAt"),
        &time::format_description::well_known::Rfc3339,
    )
    .expect("an RFC 3339 endAt");
    let left = end - time::OffsetDateTime::now_utc();
    assert!(
        left > time::Duration::seconds(timeout - 60)
            && left <= time::Duration::seconds(timeout + 1),
        "{info}"
    );
}

/// How many engine calls of `op` the service has made (its metrics page).
async fn engine_calls(e: &E2b, op: &str) -> u64 {
    let (_, body) = e.h.call("GET", "/metrics", None, Some(KEY)).await;
    let text = body.as_str().unwrap_or_default();
    text.lines()
        .filter(|l| {
            l.starts_with("daiv_sandbox_engine_call_duration_seconds_count{")
                && l.contains(&format!("op=\"{op}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// A streamed envd call's envelopes.
async fn streamed(e: &E2b, method: &str, id: &str, token: &str, msg: Value) -> Vec<(u8, Value)> {
    let (s, body, _) = e
        .envd(
            method,
            id,
            token,
            "application/connect+json",
            envelope(0, msg.to_string().as_bytes()),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    envelopes(&body)
}

/// The stdout an envd event stream carried, and its end event.
fn outcome(frames: &[(u8, Value)]) -> (String, Value) {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut out = Vec::new();
    let mut end = Value::Null;
    for (_, v) in frames {
        let ev = &v["event"];
        if let Some(data) = ev["data"]["stdout"].as_str() {
            out.extend(b64.decode(data).expect("base64"));
        }
        if ev.get("end").is_some() {
            end = ev["end"].clone();
        }
    }
    (String::from_utf8_lossy(&out).into_owned(), end)
}

/// envd's process calls are operations on the sandbox: a `Start` runs the command to its end
/// with one check of the sandbox (one inspect), however many steps it takes (start, close stdin,
/// follow the events); a process is found by its pid or its tag within the one operation of
/// `SendInput`, `CloseStdin`, `Connect` or `SendSignal`; a missing one is envd's `not_found`.
#[tokio::test]
async fn envd_process_calls_are_one_operation_each() {
    let e = service();
    let v = e.create(json!({"templateID": "base"})).await;
    let id = v["sandboxID"].as_str().expect("id");
    let token = v["envdAccessToken"].as_str().expect("token");

    let before = engine_calls(&e, "inspect").await;
    let frames = streamed(
        &e,
        "/process.Process/Start",
        id,
        token,
        json!({"process": {"cmd": "/bin/sh", "args": ["-c", "echo hi; echo err >&2; exit 3"]}}),
    )
    .await;
    let inspects = engine_calls(&e, "inspect").await - before;
    assert!(
        frames[0].1["event"]["start"]["pid"].as_u64().is_some(),
        "{frames:?}"
    );
    let (out, end) = outcome(&frames);
    assert_eq!(out, "hi\n", "{frames:?}");
    assert_eq!(end["exitCode"], 3, "{frames:?}");
    assert_eq!(end["status"], "exit status 3", "{frames:?}");
    assert_eq!(frames.last().expect("frames").0, 2, "end of stream");
    assert_eq!(inspects, 1, "one check of the sandbox for a whole Start");

    // A process started natively with a tag, reached by envd through the tag and the pid.
    let (s, started) =
        e.h.call(
            "POST",
            &format!("/api/v1/session/{id}/processes/"),
            Some(json!({"command": "cat", "tag": "echoer"})),
            Some(KEY),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{started}");
    let (s, list) = e.unary("/process.Process/List", id, token, json!({})).await;
    assert_eq!(s, StatusCode::OK, "{list}");
    let listed = list["processes"]
        .as_array()
        .and_then(|all| all.iter().find(|p| p["tag"] == "echoer"))
        .cloned()
        .expect("the tagged process listed");
    let pid = listed["pid"].as_u64().expect("pid");
    assert_eq!(listed["config"]["cmd"], "cat", "{listed}");

    let before = engine_calls(&e, "inspect").await;
    let (s, answer) = e
        .unary(
            "/process.Process/SendInput",
            id,
            token,
            json!({"process": {"tag": "echoer"}, "input": {"stdin": "cGluZwo="}}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{answer}");
    assert_eq!(engine_calls(&e, "inspect").await - before, 1);
    let (s, answer) = e
        .unary(
            "/process.Process/CloseStdin",
            id,
            token,
            json!({"process": {"pid": pid}}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{answer}");
    let frames = streamed(
        &e,
        "/process.Process/Connect",
        id,
        token,
        json!({"process": {"pid": pid}}),
    )
    .await;
    let (out, end) = outcome(&frames);
    assert_eq!(out, "ping\n", "{frames:?}");
    assert_eq!(end["exitCode"], 0, "{frames:?}");

    // A signal by pid ends a process with that signal.
    let (s, started) =
        e.h.call(
            "POST",
            &format!("/api/v1/session/{id}/processes/"),
            Some(json!({"command": "sleep 60", "tag": "sleeper"})),
            Some(KEY),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{started}");
    let (_, list) = e.unary("/process.Process/List", id, token, json!({})).await;
    let pid = list["processes"]
        .as_array()
        .and_then(|all| all.iter().find(|p| p["tag"] == "sleeper"))
        .and_then(|p| p["pid"].as_u64())
        .expect("the sleeper's pid");
    let (s, answer) = e
        .unary(
            "/process.Process/SendSignal",
            id,
            token,
            json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{answer}");
    let frames = streamed(
        &e,
        "/process.Process/Connect",
        id,
        token,
        json!({"process": {"tag": "sleeper"}}),
    )
    .await;
    let (_, end) = outcome(&frames);
    assert_eq!(end["status"], "signal: killed", "{frames:?}");

    // Nothing by that pid or tag: envd's not_found, naming what was asked.
    for selector in [json!({"pid": 999_999}), json!({"tag": "nobody"})] {
        let (s, answer) = e
            .unary(
                "/process.Process/SendInput",
                id,
                token,
                json!({"process": selector, "input": {"stdin": "eAo="}}),
            )
            .await;
        assert_eq!(
            (s, answer["code"].clone()),
            (StatusCode::NOT_FOUND, json!("not_found")),
            "{answer}"
        );
        assert!(
            answer["message"]
                .as_str()
                .is_some_and(|m| m.contains("not found")),
            "{answer}"
        );
    }
}

/// `connect` is one operation under the sandbox's lock: while another request holds the lock,
/// it waits for it and then answers busy (409) without resuming or touching the deadline; once
/// the lock is free it resumes a paused sandbox (201) with the deadline it asked for.
#[tokio::test]
async fn connect_is_one_operation_under_the_sandboxs_lock() {
    use control_plane::coordination::lock::SessionLocks;
    let templates = format!(r#"{{"base": "{IMAGE}"}}"#);
    let h = Harness::new(
        FakeEngine::default(),
        &[
            ("E2B_TEMPLATES", &templates),
            ("SESSION_LOCK_WAIT_SECONDS", "1"),
        ],
    );
    let router = e2b::router(h.state.config.clone(), h.state.ops(), &h.state.metrics);
    let e = E2b { router, h };
    let v = e.create(json!({"templateID": "base"})).await;
    let id = v["sandboxID"].as_str().expect("id").to_string();
    let (s, _, _) = e
        .control("POST", &format!("/sandboxes/{id}/pause"), None, KEY)
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);

    let held =
        e.h.locks
            .acquire(&harness::sid(&id), std::time::Duration::ZERO)
            .await
            .expect("the lock");
    let (s, v, _) = e
        .control(
            "POST",
            &format!("/sandboxes/{id}/connect"),
            Some(json!({"timeout": 300})),
            KEY,
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    let (_, info, _) = e
        .control("GET", &format!("/sandboxes/{id}"), None, KEY)
        .await;
    assert_eq!(info["state"], "paused", "{info}");

    drop(held);
    resumes_with_its_deadline(&e, &id, 300).await;
    // A second connect of the running sandbox: 200, nothing to resume.
    let (s, v, _) = e
        .control(
            "POST",
            &format!("/sandboxes/{id}/connect"),
            Some(json!({})),
            KEY,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
}

/// envd's `/files` is the native data plane's operations (`ops::files`): a write in place with
/// its parents made, gzip bodies decoded; a read whole, as a range, gzip-encoded when asked;
/// each with one check of the sandbox; fs refusals in envd's `{code, message}` with the native
/// statuses; and a killed sandbox's files answered as a sandbox that is not running (502).
#[tokio::test]
async fn envd_files_are_the_data_planes_operations() {
    use std::io::{Read, Write};
    let e = service();
    let v = e.create(json!({"templateID": "base"})).await;
    let id = v["sandboxID"].as_str().expect("id");
    let token = v["envdAccessToken"].as_str().expect("token");
    let path = "/workspace/tmp/e2b/deep/note.txt";
    let octet = "application/octet-stream";

    let before = engine_calls(&e, "inspect").await;
    let (s, b, _) = e
        .envd_with(
            "POST",
            &format!("/files?path={path}"),
            id,
            token,
            octet,
            b"hello files".to_vec(),
        )
        .await;
    let written: Value = serde_json::from_slice(&b).unwrap_or(Value::Null);
    assert_eq!(s, StatusCode::OK, "{written}");
    assert_eq!(
        written,
        json!([{"name": "note.txt", "type": "file", "path": path}])
    );
    assert_eq!(
        engine_calls(&e, "inspect").await - before,
        1,
        "one check of the sandbox for a write"
    );

    let get = |headers: Vec<(&'static str, &'static str)>| {
        let mut req = Request::builder()
            .method("GET")
            .uri(format!("/files?path={path}"))
            .header("e2b-sandbox-id", id)
            .header("x-access-token", token);
        for (k, v) in headers {
            req = req.header(k, v);
        }
        e.send(req.body(Body::empty()).expect("request"))
    };
    let before = engine_calls(&e, "inspect").await;
    let (s, b, _) = get(vec![]).await;
    assert_eq!((s, b.as_slice()), (StatusCode::OK, &b"hello files"[..]));
    assert_eq!(
        engine_calls(&e, "inspect").await - before,
        1,
        "one check of the sandbox for a read"
    );
    let (s, b, h) = get(vec![("range", "bytes=6-10")]).await;
    assert_eq!(
        (s, b.as_slice()),
        (StatusCode::PARTIAL_CONTENT, &b"files"[..])
    );
    assert_eq!(h["content-range"], "bytes 6-10/11");
    let (s, b, h) = get(vec![("accept-encoding", "gzip")]).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(h["content-encoding"], "gzip");
    let mut plain = String::new();
    flate2::read::GzDecoder::new(b.as_slice())
        .read_to_string(&mut plain)
        .expect("gzip");
    assert_eq!(plain, "hello files");

    // A gzip body is written decoded.
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(b"zipped").expect("gzip");
    let req = Request::builder()
        .method("POST")
        .uri(format!("/files?path={path}"))
        .header("e2b-sandbox-id", id)
        .header("x-access-token", token)
        .header("content-type", octet)
        .header("content-encoding", "gzip")
        .body(Body::from(enc.finish().expect("gzip")))
        .expect("request");
    let (s, _, _) = e.send(req).await;
    assert_eq!(s, StatusCode::OK);
    let (_, b, _) = get(vec![]).await;
    assert_eq!(b, b"zipped");

    // Refusals: envd's body, the native status.
    let e = &e;
    let refused = |uri: String| async move {
        let req = Request::builder()
            .method("GET")
            .uri(uri)
            .header("e2b-sandbox-id", id)
            .header("x-access-token", token)
            .body(Body::empty())
            .expect("request");
        let (s, b, _) = e.send(req).await;
        (
            s,
            serde_json::from_slice::<Value>(&b).unwrap_or(Value::Null),
        )
    };
    let (s, v) = refused("/files?path=/workspace/tmp/e2b/none".into()).await;
    assert_eq!((s, &v["code"]), (StatusCode::NOT_FOUND, &json!(404)), "{v}");
    assert!(v["message"].is_string(), "{v}");
    let (s, v) = refused("/files?path=/workspace/tmp/e2b/deep".into()).await;
    assert_eq!((s, &v["code"]), (StatusCode::CONFLICT, &json!(409)), "{v}");
    let (s, v) = refused("/files?path=/workspace/../etc/passwd".into()).await;
    assert_eq!(
        (s, &v["code"]),
        (StatusCode::UNPROCESSABLE_ENTITY, &json!(422)),
        "{v}"
    );

    // Killed: its files are a sandbox that is not running.
    let (s, _, _) = e
        .control("DELETE", &format!("/sandboxes/{id}"), None, KEY)
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, v) = refused(format!("/files?path={path}")).await;
    assert_eq!(s, StatusCode::BAD_GATEWAY, "{v}");
    assert!(
        v["message"]
            .as_str()
            .is_some_and(|m| m.contains("not running")),
        "{v}"
    );
}

/// envd's filesystem calls are the data plane's operations, answered as the SDK reads them: a
/// directory made, stated, listed and moved, a removal answered; what is not there is `not_found`, a second
/// `MakeDir` `already_exists`. A sandbox that is paused, or gone, is envd's "not running"
/// (`unavailable`) whatever the call: told by the error's class, not its words.
#[tokio::test]
async fn envd_filesystem_calls_are_the_data_planes_operations() {
    let e = service();
    let v = e.create(json!({"templateID": "base"})).await;
    let id = v["sandboxID"].as_str().expect("id").to_string();
    let token = v["envdAccessToken"].as_str().expect("token").to_string();
    let call = |method: &'static str, body: Value| {
        let (e, id, token) = (&e, id.clone(), token.clone());
        async move {
            e.unary(
                &format!("/filesystem.Filesystem/{method}"),
                &id,
                &token,
                body,
            )
            .await
        }
    };

    let (s, made) = call("MakeDir", json!({"path": "/workspace/tmp/a/b"})).await;
    assert_eq!(s, StatusCode::OK, "{made}");
    assert_eq!(made["entry"]["type"], "FILE_TYPE_DIRECTORY", "{made}");
    assert_eq!(made["entry"]["path"], "/workspace/tmp/a/b", "{made}");
    let (s, again) = call("MakeDir", json!({"path": "/workspace/tmp/a/b"})).await;
    assert_eq!(
        (s, again["code"].clone()),
        (StatusCode::CONFLICT, json!("already_exists")),
        "{again}"
    );
    let (s, stat) = call("Stat", json!({"path": "/workspace/tmp/a"})).await;
    assert_eq!(s, StatusCode::OK, "{stat}");
    assert_eq!(stat["entry"]["name"], "a", "{stat}");
    let (s, listed) = call("ListDir", json!({"path": "/workspace/tmp/a"})).await;
    assert_eq!(s, StatusCode::OK, "{listed}");
    let names: Vec<&str> = listed["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|x| x["name"].as_str())
        .collect();
    assert_eq!(names, ["b"], "{listed}");
    let (s, moved) = call(
        "Move",
        json!({"source": "/workspace/tmp/a/b", "destination": "/workspace/tmp/c"}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{moved}");
    assert_eq!(moved["entry"]["path"], "/workspace/tmp/c", "{moved}");
    let (s, gone) = call("Stat", json!({"path": "/workspace/tmp/a/b"})).await;
    assert_eq!(
        (s, gone["code"].clone()),
        (StatusCode::NOT_FOUND, json!("not_found")),
        "{gone}"
    );
    // (What a removal leaves is checked end to end: the fake runs its command on the host.)
    let (s, removed) = call("Remove", json!({"path": "/workspace/tmp/a"})).await;
    assert_eq!(s, StatusCode::OK, "{removed}");

    // Paused: not running until `connect` resumes it.
    let (s, v, _) = e
        .control(
            "POST",
            &format!("/sandboxes/{id}/pause"),
            Some(json!({})),
            KEY,
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{v}");
    let (s, paused) = call("Stat", json!({"path": "/workspace/tmp/c"})).await;
    assert_eq!(paused["code"], "unavailable", "{s} {paused}");
    assert!(
        paused["message"]
            .as_str()
            .is_some_and(|m| m.contains("paused")),
        "{paused}"
    );
    // Gone: killed.
    let (s, v, _) = e
        .control("DELETE", &format!("/sandboxes/{id}"), None, KEY)
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{v}");
    let (s, killed) = call("Stat", json!({"path": "/workspace/tmp/c"})).await;
    assert_eq!(killed["code"], "unavailable", "{s} {killed}");
    assert!(
        killed["message"]
            .as_str()
            .is_some_and(|m| m.contains("not found")),
        "{killed}"
    );
}

/// A run of commands is one operation on the REST API too: a plain run and a streamed one each
/// check the sandbox once (one inspect), as envd's `Start` does; a run with a value no shell can
/// take is refused before anything waits for the session (no inspect at all).
#[tokio::test]
async fn a_run_is_one_operation_with_one_check_of_the_sandbox() {
    let e = service();
    let id = e.create(json!({"templateID": "base"})).await["sandboxID"]
        .as_str()
        .expect("id")
        .to_string();
    let uri = format!("/api/v1/session/{id}/");
    let before = engine_calls(&e, "inspect").await;
    let (s, ran) =
        e.h.call(
            "POST",
            &uri,
            Some(json!({"commands": ["echo one"]})),
            Some(KEY),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{ran}");
    assert_eq!(ran["results"][0]["output"], "one\n", "{ran}");
    assert_eq!(engine_calls(&e, "inspect").await - before, 1, "plain run");

    let before = engine_calls(&e, "inspect").await;
    let req = Request::builder()
        .method("POST")
        .uri(&uri)
        .header("x-api-key", KEY)
        .header("content-type", "application/json")
        .header("accept", "application/x-ndjson")
        .body(Body::from(json!({"commands": ["echo two"]}).to_string()))
        .expect("request");
    let resp = e.h.send(req).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    let lines: Vec<Value> = body
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("json line"))
        .collect();
    let done = lines.last().expect("lines");
    assert_eq!(done["type"], "done", "{lines:?}");
    assert_eq!(done["results"][0]["output"], "two\n", "{lines:?}");
    assert_eq!(
        engine_calls(&e, "inspect").await - before,
        1,
        "streamed run"
    );

    let before = engine_calls(&e, "inspect").await;
    let (s, refused) =
        e.h.call(
            "POST",
            &uri,
            Some(json!({"commands": ["a\u{0}b"]})),
            Some(KEY),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert_eq!(
        engine_calls(&e, "inspect").await - before,
        0,
        "refused first"
    );
}

/// The head of the next HTTP/1.1 response on `conn`: its status line and headers, lowercased.
async fn response_head(conn: &mut tokio::io::BufReader<tokio::net::TcpStream>) -> Vec<String> {
    use tokio::io::AsyncBufReadExt;
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        let n = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            conn.read_line(&mut line),
        )
        .await
        .expect("a response within 10 s")
        .expect("read");
        if n == 0 || line == "\r\n" {
            return head;
        }
        head.push(line.trim_end().to_ascii_lowercase());
    }
}

/// A command refused for its user (`root`) is refused from the headers, before its body has
/// arrived; the connection it came on is then closed, and the response says so, so E2B's SDK
/// sends its next call (a file write) on a new connection instead of one closed under it. A call
/// whose body was read keeps its connection.
#[tokio::test]
async fn a_call_refused_before_its_body_arrived_says_its_connection_closes() {
    use base64::Engine;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let e = service();
    let v = e.create(json!({"templateID": "base"})).await;
    let id = v["sandboxID"].as_str().expect("id");
    let token = v["envdAccessToken"].as_str().expect("token");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let router = e.router.clone();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    let msg = envelope(0, json!({"process": {"cmd": "id"}}).to_string().as_bytes());
    let head = |user: &str, len: usize| {
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:"));
        format!(
            "POST /process.Process/Start HTTP/1.1\r\nhost: 127.0.0.1\r\ne2b-sandbox-id: {id}\r\n\
             x-access-token: {token}\r\nauthorization: Basic {auth}\r\n\
             content-type: application/connect+json\r\ncontent-length: {len}\r\n\r\n"
        )
    };

    // As root, the headers alone; the body is not sent until the answer is in.
    let mut conn =
        tokio::io::BufReader::new(tokio::net::TcpStream::connect(addr).await.expect("connect"));
    conn.get_mut()
        .write_all(head("root", msg.len()).as_bytes())
        .await
        .expect("write");
    let refused = response_head(&mut conn).await;
    assert!(refused[0].contains(" 200 "), "{refused:?}");
    assert!(
        refused.iter().any(|h| h == "connection: close"),
        "a refusal with its body unread must say the connection closes: {refused:?}"
    );

    // As the sandbox user, headers and body: answered, and the connection stays open for the
    // next call.
    let mut conn =
        tokio::io::BufReader::new(tokio::net::TcpStream::connect(addr).await.expect("connect"));
    let mut req = head("user", msg.len()).into_bytes();
    req.extend_from_slice(&msg);
    conn.get_mut().write_all(&req).await.expect("write");
    let ran = response_head(&mut conn).await;
    assert!(ran[0].contains(" 200 "), "{ran:?}");
    assert!(
        !ran.iter().any(|h| h.starts_with("connection:")),
        "a call whose body was read keeps its connection: {ran:?}"
    );
    // Read the streamed answer to its end, then reuse the connection.
    let mut rest = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&rest).contains("\r\n0\r\n\r\n") {
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), conn.read(&mut buf))
            .await
            .expect("the stream ends within 10 s")
            .expect("read");
        assert!(n > 0, "the connection closed mid-answer");
        rest.extend_from_slice(&buf[..n]);
    }
    conn.get_mut()
        .write_all(
            format!(
                "GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\ne2b-sandbox-id: {id}\r\n\
                 x-access-token: {token}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .expect("write");
    let health = response_head(&mut conn).await;
    assert!(health[0].contains(" 204 "), "{health:?}");
}

/// A multipart upload is bounded before the parser buffers it: a part whose headers never end
/// (or a preamble that never reaches a boundary) is refused at 16 KiB, not kept in memory.
#[tokio::test]
async fn an_upload_whose_part_headers_never_end_is_refused() {
    let e = service();
    let v = e.create(json!({"templateID": "base"})).await;
    let id = v["sandboxID"].as_str().expect("id");
    let token = v["envdAccessToken"].as_str().expect("token");
    let mut body =
        b"--xBOUNDARYx\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n"
            .to_vec();
    body.extend(std::iter::repeat_n(b'A', 64 * 1024));
    let (s, bytes, _) = e
        .envd_with(
            "POST",
            "/files?path=/workspace/repo/a",
            id,
            token,
            "multipart/form-data; boundary=xBOUNDARYx",
            body,
        )
        .await;
    assert_eq!(
        s,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
}
