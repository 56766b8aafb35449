//! In-process tests of E2B's API over the fake engine: the control API's shapes and statuses as
//! E2B's SDK parses them (201 on create, `{code, message}` errors, the list's double-encoded
//! metadata filter, 409 for a second pause), envd's token check and the Connect protocol's
//! refusals (a malformed, compressed or oversized envelope is an error, never a hang).

mod harness;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use control_plane::e2b;
use control_plane::engine::fake::FakeEngine;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use harness::{Harness, IMAGE, KEY};

/// E2B's API over the app of a [`Harness`] (the app holds everything the harness made).
struct E2b {
    router: axum::Router,
}

fn service() -> E2b {
    let templates = format!(r#"{{"base": "{IMAGE}"}}"#);
    let h = Harness::new(FakeEngine::default(), &[("E2B_TEMPLATES", &templates)]);
    let router = e2b::router(h.state.config.clone(), h.router.clone());
    E2b { router }
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
