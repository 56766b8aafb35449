//! In-process tests of OpenSandbox's API over the fake engine, whose helper and process
//! supervisor are host builds of the real ones: the lifecycle's shapes and statuses as the SDK
//! parses them (202 on create, optional fields left out rather than `null`, `{code, message}`
//! errors, pagination, a merge patch of metadata), the endpoints and their execd token, and
//! execd's server-sent events (a line per event, each with its timestamp, the stream closed
//! after the last one), files and a stateful bash session.

mod harness;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use control_plane::engine::fake::FakeEngine;
use control_plane::opensandbox;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use harness::{Harness, IMAGE, KEY};

struct Os {
    router: axum::Router,
    _h: Harness,
}

fn service() -> Os {
    let h = Harness::new(FakeEngine::default(), &[]);
    let router = opensandbox::router(h.state.config.clone(), h.state.ops(), &h.state.metrics);
    Os { router, _h: h }
}

/// A sandbox's execd: its path prefix and token, as its endpoint gives them.
struct Execd {
    prefix: String,
    token: String,
}

impl Os {
    async fn send(&self, req: Request<Body>) -> (StatusCode, Vec<u8>, axum::http::HeaderMap) {
        let resp = match self.router.clone().oneshot(req).await {
            Ok(r) => r,
            Err(e) => match e {},
        };
        let (status, headers) = (resp.status(), resp.headers().clone());
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        (status, bytes.to_vec(), headers)
    }

    /// A lifecycle call with `key`.
    async fn api(
        &self,
        method: &str,
        uri: &str,
        body: Option<Value>,
        key: &str,
    ) -> (StatusCode, Value) {
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header("host", "127.0.0.1:8090")
            .header("open-sandbox-api-key", key);
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        let body = body.map(|b| Body::from(b.to_string())).unwrap_or_default();
        let (status, bytes, _) = self.send(req.body(body).expect("request")).await;
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    async fn create(&self, body: Value) -> String {
        let (s, v) = self.api("POST", "/v1/sandboxes", Some(body), KEY).await;
        assert_eq!(s, StatusCode::ACCEPTED, "{v}");
        v["id"].as_str().expect("id").to_string()
    }

    async fn execd(&self, id: &str) -> Execd {
        let (s, v) = self
            .api(
                "GET",
                &format!("/v1/sandboxes/{id}/endpoints/44772?use_server_proxy=false"),
                None,
                KEY,
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        let endpoint = v["endpoint"].as_str().expect("endpoint");
        assert!(
            !endpoint.contains("://") && !endpoint.ends_with('/'),
            "{endpoint}"
        );
        let prefix = endpoint
            .strip_prefix("127.0.0.1:8090")
            .expect("the host the caller used")
            .to_string();
        let token = v["headers"]["X-EXECD-ACCESS-TOKEN"]
            .as_str()
            .expect("token")
            .to_string();
        Execd { prefix, token }
    }

    /// An execd call: its status, body and headers.
    async fn call(
        &self,
        x: &Execd,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> (StatusCode, Vec<u8>, axum::http::HeaderMap) {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", x.prefix))
            .header("x-execd-access-token", &x.token);
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        self.send(req.body(Body::from(body)).expect("request"))
            .await
    }

    /// A command's events, as the stream carried them (it must have ended).
    async fn run(&self, x: &Execd, body: Value) -> Vec<Value> {
        let (s, bytes, headers) = self
            .call(
                x,
                "POST",
                "/command",
                Some("application/json"),
                body.to_string().into_bytes(),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&bytes));
        assert!(
            headers["content-type"]
                .to_str()
                .expect("present")
                .starts_with("text/event-stream")
        );
        events(&bytes)
    }
}

/// execd's framing: each event a JSON object and a blank line, with its timestamp.
fn events(bytes: &[u8]) -> Vec<Value> {
    let text = String::from_utf8(bytes.to_vec()).expect("utf-8");
    assert!(text.ends_with("\n\n"), "{text:?}");
    text.split("\n\n")
        .filter(|f| !f.is_empty())
        .map(|f| {
            let v: Value = serde_json::from_str(f).expect("a JSON event");
            assert!(
                v["timestamp"]
                    .as_i64()
                    .is_some_and(|t| t > 1_700_000_000_000),
                "{v}"
            );
            v
        })
        .collect()
}

fn texts(events: &[Value], kind: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["type"] == kind)
        .map(|e| e["text"].as_str().unwrap_or("").to_string())
        .collect()
}

#[tokio::test]
async fn the_lifecycle_answers_as_the_sdk_parses_it() {
    let os = service();
    // The key: OpenSandbox's header, a 401 in its shape.
    let (s, v) = os.api("GET", "/v1/sandboxes", None, "wrong").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(v["code"], "UNAUTHORIZED", "{v}");
    assert!(v["message"].is_string());

    let body = json!({
        "image": {"uri": IMAGE}, "timeout": 600,
        "resourceLimits": {"cpu": "500m", "memory": "512Mi"},
        "env": {"FOO": "bar"}, "metadata": {"team": "a"},
        "entrypoint": ["tail", "-f", "/dev/null"], "secureAccess": false,
    });
    let (s, v) = os.api("POST", "/v1/sandboxes", Some(body), KEY).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let id = v["id"].as_str().expect("present").to_string();
    assert_eq!(v["status"]["state"], "Running");
    assert!(
        v["createdAt"].is_string() && v["expiresAt"].is_string(),
        "{v}"
    );
    assert_eq!(v["entrypoint"], json!(["tail", "-f", "/dev/null"]));
    assert_eq!(v["metadata"], json!({"team": "a"}));
    assert_eq!(v["image"]["uri"], IMAGE);
    assert!(
        v.as_object()
            .expect("present")
            .values()
            .all(|x| !x.is_null()),
        "no null: the SDK's parser takes one for a value: {v}"
    );

    // No deadline: no expiresAt at all.
    let (s, v) = os
        .api(
            "POST",
            "/v1/sandboxes",
            Some(json!({"image": {"uri": IMAGE}, "timeout": null})),
            KEY,
        )
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    assert!(v.get("expiresAt").is_none(), "{v}");
    let other = v["id"].as_str().expect("present").to_string();
    let third = os
        .create(json!({"image": {"uri": IMAGE}, "metadata": {"team": "b"}}))
        .await;

    // Pages, and the metadata filter as the SDK encodes it (once more).
    let (s, v) = os
        .api(
            "GET",
            "/v1/sandboxes?state=Running&pageSize=2&page=2",
            None,
            KEY,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        v["pagination"],
        json!({"page": 2, "pageSize": 2, "totalItems": 3, "totalPages": 2, "hasNextPage": false})
    );
    assert_eq!(v["items"].as_array().expect("present").len(), 1);
    let (_, v) = os
        .api("GET", "/v1/sandboxes?metadata=team%3Da", None, KEY)
        .await;
    let ids: Vec<&str> = v["items"]
        .as_array()
        .expect("present")
        .iter()
        .map(|i| i["id"].as_str().expect("present"))
        .collect();
    assert_eq!(ids, vec![id.as_str()]);
    let (_, v) = os.api("GET", "/v1/sandboxes?state=Paused", None, KEY).await;
    assert_eq!(v["pagination"]["totalItems"], 0, "{v}");

    // Metadata: a JSON merge patch (null removes).
    let (s, v) = os
        .api(
            "PATCH",
            &format!("/v1/sandboxes/{id}/metadata"),
            Some(json!({"team": null, "x": "y"})),
            KEY,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["metadata"], json!({"x": "y"}));
    let (_, v) = os
        .api("GET", &format!("/v1/sandboxes/{id}"), None, KEY)
        .await;
    assert_eq!(v["metadata"], json!({"x": "y"}));

    // Renewal: the deadline moves to the time asked for.
    let at = time::OffsetDateTime::now_utc() + time::Duration::hours(2);
    let at = at
        .format(&time::format_description::well_known::Rfc3339)
        .expect("present");
    let (s, v) = os
        .api(
            "POST",
            &format!("/v1/sandboxes/{id}/renew-expiration"),
            Some(json!({"expiresAt": at})),
            KEY,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let got = control_plane::time::parse_rfc3339(v["expiresAt"].as_str().expect("present"))
        .expect("present");
    let want = control_plane::time::parse_rfc3339(&at).expect("present");
    assert!((got - want).whole_seconds().abs() <= 1, "{got} {want}");

    // What is not served is said, never dropped (a policy ignored would be a surprise).
    let (s, v) = os
        .api(
            "POST",
            "/v1/sandboxes",
            Some(json!({"image": {"uri": IMAGE}, "volumes": [{"name": "data"}]})),
            KEY,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_IMPLEMENTED, "{v}");
    let (s, v) = os
        .api(
            "POST",
            "/v1/sandboxes",
            Some(json!({"image": {"uri": IMAGE}, "resourceLimits": {"cpu": "lots"}})),
            KEY,
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["code"], "INVALID_ARGUMENT");

    // The service's own keys (`daiv.`) are neither set, removed nor shown through metadata.
    let (s, v) = os
        .api(
            "POST",
            "/v1/sandboxes",
            Some(json!({"image": {"uri": IMAGE}, "metadata": {"daiv.e2b.private-traffic": "1"}})),
            KEY,
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let (s, v) = os
        .api(
            "PATCH",
            &format!("/v1/sandboxes/{id}/metadata"),
            Some(json!({"daiv.opensandbox.entrypoint": null})),
            KEY,
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    // A sandbox comes from an image or a snapshot, not both.
    let (s, v) = os
        .api(
            "POST",
            "/v1/sandboxes",
            Some(json!({"image": {"uri": IMAGE}, "snapshotId": "abc123abc123"})),
            KEY,
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");

    // Kill: 204, then a 404 in OpenSandbox's shape.
    for sandbox in [&id, &other, &third] {
        let (s, _) = os
            .api("DELETE", &format!("/v1/sandboxes/{sandbox}"), None, KEY)
            .await;
        assert_eq!(s, StatusCode::NO_CONTENT);
    }
    let (s, v) = os
        .api("GET", &format!("/v1/sandboxes/{id}"), None, KEY)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(v["code"], "NOT_FOUND", "{v}");
}

#[tokio::test]
async fn execd_takes_the_endpoints_token_and_streams_commands_as_events() {
    let os = service();
    let id = os.create(json!({"image": {"uri": IMAGE}})).await;
    let x = os.execd(&id).await;
    // The egress sidecar's endpoint resolves too (the SDK asks for it on every create).
    let (s, _) = os
        .api(
            "GET",
            &format!("/v1/sandboxes/{id}/endpoints/18080"),
            None,
            KEY,
        )
        .await;
    assert_eq!(s, StatusCode::OK);

    let (s, body, _) = os.call(&x, "GET", "/ping", None, Vec::new()).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    // Another sandbox's token, or none, opens nothing.
    let other = os.create(json!({"image": {"uri": IMAGE}})).await;
    let y = os.execd(&other).await;
    let wrong = Execd {
        prefix: x.prefix.clone(),
        token: y.token.clone(),
    };
    let (s, body, _) = os.call(&wrong, "GET", "/ping", None, Vec::new()).await;
    assert_eq!(
        s,
        StatusCode::UNAUTHORIZED,
        "{}",
        String::from_utf8_lossy(&body)
    );

    // A line per event, without its newline; stderr apart; the end.
    let ev = os
        .run(
            &x,
            json!({"command": "echo hi; printf 'a\\nb'; echo oops >&2", "envs": {"V": "1"}}),
        )
        .await;
    assert_eq!(ev[0]["type"], "init");
    let cmd_id = ev[0]["text"].as_str().expect("present").to_string();
    assert_eq!(texts(&ev, "stdout"), vec!["hi", "a", "b"]);
    assert_eq!(texts(&ev, "stderr"), vec!["oops"]);
    assert_eq!(
        ev.last().expect("present")["type"],
        "execution_complete",
        "{ev:?}"
    );
    // Its status, by the id `init` gave.
    let (s, body, _) = os
        .call(
            &x,
            "GET",
            &format!("/command/status/{cmd_id}"),
            None,
            Vec::new(),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let st: Value = serde_json::from_slice(&body).expect("present");
    assert_eq!(
        (st["running"].clone(), st["exit_code"].clone()),
        (json!(false), json!(0))
    );

    // A failure is execd's error event, with the exit code.
    let ev = os.run(&x, json!({"command": "exit 3"})).await;
    let last = ev.last().expect("present");
    assert_eq!(last["type"], "error", "{ev:?}");
    assert_eq!(last["error"]["evalue"], "3");
    assert_eq!(last["error"]["exit_code"], 3);
    // A timeout kills the command (ms).
    let ev = os
        .run(&x, json!({"command": "sleep 30", "timeout": 300}))
        .await;
    assert_eq!(
        ev.last().expect("present")["error"]["exit_code"],
        137,
        "{ev:?}"
    );
    // Nothing runs as another user.
    let (s, body, _) = os
        .call(
            &x,
            "POST",
            "/command",
            Some("application/json"),
            json!({"command": "id", "uid": 0}).to_string().into_bytes(),
        )
        .await;
    assert_eq!(
        s,
        StatusCode::BAD_REQUEST,
        "{}",
        String::from_utf8_lossy(&body)
    );

    // In the background: the stream ends at once; the logs by cursor.
    let ev = os
        .run(
            &x,
            json!({"command": "echo one; echo two", "background": true}),
        )
        .await;
    assert_eq!(
        ev.iter()
            .map(|e| e["type"].as_str().expect("present"))
            .collect::<Vec<_>>(),
        ["init", "execution_complete"]
    );
    let bg = ev[0]["text"].as_str().expect("present").to_string();
    let mut logs = (String::new(), 0u64);
    for _ in 0..100 {
        let (s, body, headers) = os
            .call(&x, "GET", &format!("/command/{bg}/logs"), None, Vec::new())
            .await;
        assert_eq!(s, StatusCode::OK);
        logs = (
            String::from_utf8(body).expect("present"),
            headers["execd-commands-tail-cursor"]
                .to_str()
                .expect("present")
                .parse()
                .expect("present"),
        );
        if logs.0 == "one\ntwo\n" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(logs, ("one\ntwo\n".to_string(), 8));
    let (_, body, _) = os
        .call(
            &x,
            "GET",
            &format!("/command/{bg}/logs?cursor=4"),
            None,
            Vec::new(),
        )
        .await;
    assert_eq!(body, b"two\n");
}

/// One multipart upload of two files, as the SDK sends it (a metadata part, then the file).
fn upload(boundary: &str, files: &[(&str, u32, &[u8])]) -> Vec<u8> {
    let mut b = Vec::new();
    for (path, mode, data) in files {
        b.extend_from_slice(format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\nContent-Type: application/json\r\n\r\n{}\r\n",
            json!({"path": path, "owner": null, "group": null, "mode": mode})
        ).as_bytes());
        b.extend_from_slice(format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        ).as_bytes());
        b.extend_from_slice(data);
        b.extend_from_slice(b"\r\n");
    }
    b.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    b
}

#[tokio::test]
async fn files_go_up_and_down_with_their_modes() {
    let os = service();
    let id = os.create(json!({"image": {"uri": IMAGE}})).await;
    let x = os.execd(&id).await;
    let ct = "multipart/form-data; boundary=XyZ";
    let body = upload(
        "XyZ",
        &[
            ("/workspace/d/a.txt", 644, b"hello"),
            ("/workspace/b.bin", 600, b"\x00\x01"),
        ],
    );
    let (s, out, _) = os.call(&x, "POST", "/files/upload", Some(ct), body).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&out));
    let (s, out, _) = os
        .call(
            &x,
            "GET",
            "/files/download?path=/workspace/d/a.txt",
            None,
            Vec::new(),
        )
        .await;
    assert_eq!((s, out.as_slice()), (StatusCode::OK, &b"hello"[..]));
    let (s, out, _) = os
        .call(
            &x,
            "GET",
            "/files/info?path=/workspace/d/a.txt&path=/workspace/b.bin",
            None,
            Vec::new(),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let info: Value = serde_json::from_slice(&out).expect("present");
    assert_eq!(info["/workspace/d/a.txt"]["mode"], 644, "{info}");
    assert_eq!(info["/workspace/b.bin"]["mode"], 600);
    assert_eq!(info["/workspace/b.bin"]["size"], 2);
    assert_eq!(info["/workspace/d/a.txt"]["type"], "file");
    // Bounded before the parser buffers it: a part whose headers never end is refused.
    let mut endless = b"--XyZ\r\nContent-Disposition: form-data; name=\"metadata\"\r\n".to_vec();
    endless.extend(std::iter::repeat_n(b'A', 64 * 1024));
    let (s, _, _) = os
        .call(&x, "POST", "/files/upload", Some(ct), endless)
        .await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    // A mode that is not octal digits, an owner: refused, in its words.
    let (s, _, _) = os
        .call(
            &x,
            "POST",
            "/files/upload",
            Some(ct),
            upload("XyZ", &[("/workspace/c", 789, b"x")]),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);

    let dirs = json!({"/workspace/x/y": {"mode": 755, "owner": null, "group": null}});
    let (s, _, _) = os
        .call(
            &x,
            "POST",
            "/directories",
            Some("application/json"),
            dirs.to_string().into_bytes(),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, out, _) = os
        .call(
            &x,
            "GET",
            "/directories/list?path=/workspace/x",
            None,
            Vec::new(),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let listed: Value = serde_json::from_slice(&out).expect("present");
    assert_eq!(listed[0]["path"], "/workspace/x/y", "{listed}");
    assert_eq!(listed[0]["type"], "directory");

    // (The fake runs no `rm`: the removal itself is the e2e suite's to see.)
    let (s, _, _) = os
        .call(
            &x,
            "DELETE",
            "/files?path=/workspace/d/a.txt",
            None,
            Vec::new(),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, out, _) = os
        .call(
            &x,
            "GET",
            "/files/download?path=/workspace/none",
            None,
            Vec::new(),
        )
        .await;
    assert_eq!(
        s,
        StatusCode::NOT_FOUND,
        "{}",
        String::from_utf8_lossy(&out)
    );
    let err: Value = serde_json::from_slice(&out).expect("present");
    assert_eq!(err["code"], "NOT_FOUND");
}

#[tokio::test]
async fn a_bash_session_keeps_its_state_between_runs_and_outlives_a_timeout() {
    let os = service();
    let id = os.create(json!({"image": {"uri": IMAGE}})).await;
    let x = os.execd(&id).await;
    let (s, out, _) = os
        .call(
            &x,
            "POST",
            "/session",
            Some("application/json"),
            json!({"cwd": "/tmp"}).to_string().into_bytes(),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&out));
    let sid = serde_json::from_slice::<Value>(&out).expect("present")["session_id"]
        .as_str()
        .expect("present")
        .to_string();
    let run = |command: &str, timeout: Option<u64>| {
        let mut body = json!({ "command": command });
        if let Some(t) = timeout {
            body["timeout"] = json!(t);
        }
        let (os, x, sid) = (&os, &x, sid.clone());
        async move {
            let (s, out, _) = os
                .call(
                    x,
                    "POST",
                    &format!("/session/{sid}/run"),
                    Some("application/json"),
                    body.to_string().into_bytes(),
                )
                .await;
            assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&out));
            events(&out)
        }
    };
    let ev = run("pwd; X=42; cd /; echo e >&2", None).await;
    assert_eq!(texts(&ev, "stdout"), vec!["/tmp"]);
    assert_eq!(texts(&ev, "stderr"), vec!["e"]);
    assert_eq!(ev.last().expect("present")["type"], "execution_complete");
    // Its variables and directory stay; output without a last newline keeps its line.
    let ev = run("echo $X; pwd; printf tail", None).await;
    assert_eq!(texts(&ev, "stdout"), vec!["42", "/", "tail"]);
    // A command that reads stdin reads nothing: not the rest of its run, nor the next run.
    let ev = run("cat; echo after-cat", None).await;
    assert_eq!(texts(&ev, "stdout"), vec!["after-cat"], "{ev:?}");
    // A syntax error is its run's own.
    let ev = run("echo 'unclosed", None).await;
    assert_eq!(ev.last().expect("present")["type"], "error", "{ev:?}");
    // A run past its timeout is interrupted; the session stays.
    let ev = run("sleep 30", Some(300)).await;
    assert_eq!(
        ev.last().expect("present")["error"]["exit_code"],
        130,
        "{ev:?}"
    );
    let ev = run("echo $X", None).await;
    assert_eq!(texts(&ev, "stdout"), vec!["42"]);
    // Deleted: a run then answers that it has ended.
    let (s, _, _) = os
        .call(&x, "DELETE", &format!("/session/{sid}"), None, Vec::new())
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, out, _) = os
        .call(
            &x,
            "POST",
            &format!("/session/{sid}/run"),
            Some("application/json"),
            json!({"command": "true"}).to_string().into_bytes(),
        )
        .await;
    assert_eq!(
        s,
        StatusCode::NOT_FOUND,
        "{}",
        String::from_utf8_lossy(&out)
    );
}

#[tokio::test]
async fn a_paused_sandbox_runs_nothing_until_it_is_resumed() {
    let os = service();
    let id = os.create(json!({"image": {"uri": IMAGE}})).await;
    let x = os.execd(&id).await;
    let (s, _) = os
        .api("POST", &format!("/v1/sandboxes/{id}/pause"), None, KEY)
        .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let (_, v) = os
        .api("GET", &format!("/v1/sandboxes/{id}"), None, KEY)
        .await;
    assert_eq!(v["status"]["state"], "Paused");
    let (s, _, _) = os.call(&x, "GET", "/ping", None, Vec::new()).await;
    assert_eq!(s, StatusCode::CONFLICT);
    let (s, out, _) = os
        .call(
            &x,
            "POST",
            "/command",
            Some("application/json"),
            json!({"command": "true"}).to_string().into_bytes(),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{}", String::from_utf8_lossy(&out));
    let (s, _) = os
        .api("POST", &format!("/v1/sandboxes/{id}/resume"), None, KEY)
        .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let (s, _, _) = os.call(&x, "GET", "/ping", None, Vec::new()).await;
    assert_eq!(s, StatusCode::OK);
}

/// An entrypoint that runs something is the sandbox's background process `entrypoint`, and
/// the sandbox shows it.
#[tokio::test]
async fn an_entrypoint_runs_in_the_background() {
    let os = service();
    let (s, v) = os
        .api(
            "POST",
            "/v1/sandboxes",
            Some(json!({"image": {"uri": IMAGE}, "entrypoint": ["sh", "-c", "echo up; sleep 30"]})),
            KEY,
        )
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    assert_eq!(v["entrypoint"], json!(["sh", "-c", "echo up; sleep 30"]));
    assert!(
        v["metadata"].as_object().is_none_or(|m| m.is_empty()),
        "{v}"
    );
    let id = v["id"].as_str().expect("present").to_string();
    let x = os.execd(&id).await;
    let (s, out, _) = os
        .call(&x, "GET", "/command/status/entrypoint", None, Vec::new())
        .await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&out));
    let st: Value = serde_json::from_slice(&out).expect("present");
    assert_eq!(st["running"], true, "{st}");
}

/// A command's timeout holds when nobody reads its stream any more: the client that went away
/// after `init` (its output then has nowhere to go) leaves it to be killed at its deadline, not
/// to run on.
#[tokio::test]
async fn a_commands_timeout_holds_without_a_reader() {
    let os = service();
    let id = os.create(json!({"image": {"uri": IMAGE}})).await;
    let x = os.execd(&id).await;
    let req = Request::builder()
        .method("POST")
        .uri(format!("{}/command", x.prefix))
        .header("x-execd-access-token", &x.token)
        .header("content-type", "application/json")
        .body(Body::from(
            json!({"command": "sleep 0.2; echo out; sleep 30", "timeout": 600}).to_string(),
        ))
        .expect("request");
    let resp = os.router.clone().oneshot(req).await.expect("response");
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let first = body.frame().await.expect("a frame").expect("data");
    let init: Value =
        serde_json::from_slice(first.data_ref().expect("bytes").trim_ascii()).expect("init");
    let cmd = init["text"].as_str().expect("id").to_string();
    drop(body);
    let mut st = Value::Null;
    for _ in 0..100 {
        let (s, out, _) = os
            .call(
                &x,
                "GET",
                &format!("/command/status/{cmd}"),
                None,
                Vec::new(),
            )
            .await;
        assert_eq!(s, StatusCode::OK);
        st = serde_json::from_slice(&out).expect("status");
        if st["running"] == false {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(st["running"], false, "killed at its timeout: {st}");
}

/// A snapshot through the lifecycle API: `Ready` in its 202, got, listed with OpenSandbox's
/// filters and pagination, a sandbox made from it that sees what was written before it, and
/// deleted.
#[tokio::test]
async fn a_snapshot_is_taken_listed_restored_and_deleted() {
    let os = service();
    let id = os.create(json!({"image": {"uri": IMAGE}})).await;
    let x = os.execd(&id).await;
    let ct = "multipart/form-data; boundary=XyZ";
    let body = upload(
        "XyZ",
        &[("/workspace/kept.txt", 644, b"before the snapshot")],
    );
    let (s, _, _) = os.call(&x, "POST", "/files/upload", Some(ct), body).await;
    assert_eq!(s, StatusCode::OK);

    let req = Request::builder()
        .method("POST")
        .uri(format!("/v1/sandboxes/{id}/snapshots"))
        .header("open-sandbox-api-key", KEY)
        .header("content-type", "application/json")
        .body(Body::from(json!({"name": "first"}).to_string()))
        .expect("request");
    let (s, bytes, headers) = os.send(req).await;
    let snap: Value = serde_json::from_slice(&bytes).expect("a snapshot");
    assert_eq!(s, StatusCode::ACCEPTED, "{snap}");
    let sid = snap["id"].as_str().expect("id").to_string();
    assert_eq!(snap["sandboxId"], json!(id), "{snap}");
    assert_eq!(snap["name"], "first");
    assert_eq!(snap["status"]["state"], "Ready", "taken whole: {snap}");
    assert!(snap["createdAt"].is_string(), "{snap}");
    assert!(
        snap.as_object()
            .expect("present")
            .values()
            .chain(snap["status"].as_object().expect("present").values())
            .all(|v| !v.is_null()),
        "no null: {snap}"
    );
    assert_eq!(
        headers["location"].to_str().expect("ascii"),
        format!("/v1/snapshots/{sid}")
    );
    // Unnamed: no `name` at all.
    let (s, unnamed) = os
        .api("POST", &format!("/v1/sandboxes/{id}/snapshots"), None, KEY)
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{unnamed}");
    assert!(unnamed.get("name").is_none(), "{unnamed}");
    let second = unnamed["id"].as_str().expect("id").to_string();

    let (s, got) = os
        .api("GET", &format!("/v1/snapshots/{sid}"), None, KEY)
        .await;
    assert_eq!((s, &got), (StatusCode::OK, &snap));

    // The list: newest first, every key the SDK's converter reads, its filters.
    let ids = |v: &Value| -> Vec<String> {
        v["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|i| i["id"].as_str().expect("id").to_string())
            .collect()
    };
    let (s, v) = os
        .api("GET", &format!("/v1/snapshots?sandboxId={id}"), None, KEY)
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    // (Newest first, to the second: two taken within one are in the order of their ids.)
    let mut both = vec![sid.clone(), second.clone()];
    both.sort();
    let mut listed = ids(&v);
    listed.sort();
    assert_eq!(listed, both, "{v}");
    assert_eq!(
        v["pagination"],
        json!({"page": 1, "pageSize": 20, "totalItems": 2, "totalPages": 1, "hasNextPage": false})
    );
    // A page at a time: each once.
    let mut paged = Vec::new();
    for page in [1, 2] {
        let (_, v) = os
            .api(
                "GET",
                &format!("/v1/snapshots?state=Ready&pageSize=1&page={page}"),
                None,
                KEY,
            )
            .await;
        assert_eq!(v["items"].as_array().map(Vec::len), Some(1), "{v}");
        assert_eq!(v["pagination"]["hasNextPage"], page == 1, "{v}");
        assert_eq!(v["pagination"]["totalPages"], 2, "{v}");
        paged.extend(ids(&v));
    }
    paged.sort();
    assert_eq!(paged, both);
    let (_, v) = os.api("GET", "/v1/snapshots?name=first", None, KEY).await;
    assert_eq!(ids(&v), vec![sid.clone()], "{v}");
    for none in ["state=Creating&state=Failed", "sandboxId=someone-else"] {
        let (s, v) = os
            .api("GET", &format!("/v1/snapshots?{none}"), None, KEY)
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(v["items"], json!([]), "{none}: {v}");
        assert_eq!(v["pagination"]["totalItems"], 0, "{v}");
    }
    let (s, v) = os.api("GET", "/v1/snapshots?state=Sleepy", None, KEY).await;
    assert_eq!(
        (s, &v["code"]),
        (StatusCode::BAD_REQUEST, &json!("INVALID_ARGUMENT"))
    );

    // A sandbox from it, as the SDK asks for one (its default entrypoint and resources), sees
    // the file written before it.
    let (s, restored) = os
        .api(
            "POST",
            "/v1/sandboxes",
            Some(json!({
                "snapshotId": sid, "entrypoint": ["tail", "-f", "/dev/null"],
                "resourceLimits": {"cpu": "1", "memory": "2Gi"}, "timeout": 600,
            })),
            KEY,
        )
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{restored}");
    assert_eq!(restored["snapshotId"], json!(sid), "{restored}");
    assert!(restored.get("image").is_none(), "{restored}");
    let rid = restored["id"].as_str().expect("id").to_string();
    let rx = os.execd(&rid).await;
    let (s, out, _) = os
        .call(
            &rx,
            "GET",
            "/files/download?path=/workspace/kept.txt",
            None,
            Vec::new(),
        )
        .await;
    assert_eq!(
        (s, out.as_slice()),
        (StatusCode::OK, &b"before the snapshot"[..])
    );

    // Refusals in OpenSandbox's words: a body with what a snapshot does not take, a sandbox
    // or a snapshot that is not there, a paused sandbox.
    let (s, v) = os
        .api(
            "POST",
            &format!("/v1/sandboxes/{id}/snapshots"),
            Some(json!({"ttl": 5})),
            KEY,
        )
        .await;
    assert_eq!(
        (s, &v["code"]),
        (StatusCode::BAD_REQUEST, &json!("INVALID_ARGUMENT"))
    );
    let (s, v) = os
        .api("POST", "/v1/sandboxes/nope/snapshots", None, KEY)
        .await;
    assert_eq!(
        (s, &v["code"]),
        (StatusCode::NOT_FOUND, &json!("NOT_FOUND"))
    );
    let (s, _) = os
        .api("POST", &format!("/v1/sandboxes/{rid}/pause"), None, KEY)
        .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let (s, v) = os
        .api("POST", &format!("/v1/sandboxes/{rid}/snapshots"), None, KEY)
        .await;
    assert_eq!(
        (s, &v["code"]),
        (StatusCode::CONFLICT, &json!("CONFLICT")),
        "{v}"
    );
    let (s, _) = os.api("GET", "/v1/snapshots", None, "wrong").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);

    // Deleted: 204, then a 404, and listed no more.
    for snap in [&sid, &second] {
        let (s, _) = os
            .api("DELETE", &format!("/v1/snapshots/{snap}"), None, KEY)
            .await;
        assert_eq!(s, StatusCode::NO_CONTENT);
    }
    let (s, v) = os
        .api("GET", &format!("/v1/snapshots/{sid}"), None, KEY)
        .await;
    assert_eq!(
        (s, &v["code"]),
        (StatusCode::NOT_FOUND, &json!("NOT_FOUND")),
        "{v}"
    );
    let (s, _) = os
        .api("DELETE", &format!("/v1/snapshots/{sid}"), None, KEY)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (_, v) = os.api("GET", "/v1/snapshots", None, KEY).await;
    assert_eq!(v["pagination"]["totalItems"], 0, "{v}");
}

/// The rest of execd's files: a search by name, renames, modes, text replaced in place, and
/// reads by lines.
#[tokio::test]
async fn files_are_searched_moved_chmodded_replaced_and_read_by_lines() {
    let os = service();
    let id = os.create(json!({"image": {"uri": IMAGE}})).await;
    let x = os.execd(&id).await;
    let ct = "multipart/form-data; boundary=XyZ";
    let body = upload(
        "XyZ",
        &[
            ("/workspace/s/a.py", 644, b"print(1)\n"),
            ("/workspace/s/sub/b.py", 644, b"print(2)\n"),
            ("/workspace/s/c.txt", 644, b"l1\nl2\nl3\nl4"),
            ("/workspace/s/r.cfg", 640, b"host=localhost; db=localhost\n"),
        ],
    );
    let (s, _, _) = os.call(&x, "POST", "/files/upload", Some(ct), body).await;
    assert_eq!(s, StatusCode::OK);
    let get = |path: String| {
        let (os, x) = (&os, &x);
        async move {
            let (s, out, _) = os.call(x, "GET", &path, None, Vec::new()).await;
            (s, out)
        }
    };
    let post = |path: String, body: Value| {
        let (os, x) = (&os, &x);
        async move {
            let (s, out, _) = os
                .call(
                    x,
                    "POST",
                    &path,
                    Some("application/json"),
                    body.to_string().into_bytes(),
                )
                .await;
            (s, out)
        }
    };
    let paths = |out: &[u8]| -> Vec<String> {
        let v: Value = serde_json::from_slice(out).expect("json");
        v.as_array()
            .expect("a list")
            .iter()
            .map(|i| i["path"].as_str().expect("path").to_string())
            .collect()
    };

    // Search: names at every level, files only, as FileInfos.
    let (s, out) = get("/files/search?path=/workspace/s&pattern=*.py".into()).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&out));
    assert_eq!(paths(&out), ["/workspace/s/a.py", "/workspace/s/sub/b.py"]);
    let found: Value = serde_json::from_slice(&out).expect("json");
    assert_eq!(found[0]["mode"], 644, "{found}");
    assert_eq!(found[0]["size"], 9, "{found}");
    assert_eq!(found[0]["type"], "file", "{found}");
    assert!(found[0]["modified_at"].is_string() && found[0]["owner"].is_string());
    let (s, out) = get("/files/search?path=/workspace/s".into()).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        paths(&out),
        [
            "/workspace/s/a.py",
            "/workspace/s/c.txt",
            "/workspace/s/r.cfg",
            "/workspace/s/sub/b.py"
        ]
    );
    let (s, out) = get("/files/search?path=/workspace/s&pattern=%5B".into()).await;
    assert_eq!(
        s,
        StatusCode::BAD_REQUEST,
        "{}",
        String::from_utf8_lossy(&out)
    );
    let (s, _) = get("/files/search?path=/workspace/none&pattern=*".into()).await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // Moves: renamed across directories; a source that is not there is a 404.
    let (s, out) = post(
        "/files/mv".into(),
        json!([{"src": "/workspace/s/c.txt", "dest": "/workspace/s/sub/c2.txt"}]),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&out));
    let (s, out) = get("/files/download?path=/workspace/s/sub/c2.txt".into()).await;
    assert_eq!(
        (s, out.as_slice()),
        (StatusCode::OK, &b"l1\nl2\nl3\nl4"[..])
    );
    let (s, _) = get("/files/download?path=/workspace/s/c.txt".into()).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = post(
        "/files/mv".into(),
        json!([{"src": "/workspace/s/c.txt", "dest": "/workspace/s/c3.txt"}]),
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // Modes: an owner, or a mode that is not octal digits, is refused before anything is
    // changed; a path that is not there is a 404. (The fake runs no `chmod`: the change
    // itself is the e2e suite's to see.)
    for refused in [
        json!({"/workspace/s/a.py": {"mode": 600, "owner": "root"}}),
        json!({"/workspace/s/a.py": {"mode": 600, "group": "root"}}),
        json!({"/workspace/s/a.py": {"mode": 789}}),
    ] {
        let (s, out) = post("/files/permissions".into(), refused.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{refused}");
        let err: Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(err["code"], "INVALID_ARGUMENT");
    }
    let (s, _) = post(
        "/files/permissions".into(),
        json!({"/workspace/none": {"mode": 644, "owner": null, "group": null}}),
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // Replacements: every occurrence, counted when asked for, the mode kept.
    let (s, out) = post(
        "/files/replace?verbose=true".into(),
        json!({"/workspace/s/r.cfg": {"old": "localhost", "new": "0.0.0.0"},
               "/workspace/s/a.py": {"old": "absent", "new": "x"}}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&out));
    let counts: Value = serde_json::from_slice(&out).expect("json");
    assert_eq!(
        counts,
        json!({"/workspace/s/r.cfg": {"replacedCount": 2}, "/workspace/s/a.py": {"replacedCount": 0}})
    );
    let (_, out) = get("/files/download?path=/workspace/s/r.cfg".into()).await;
    assert_eq!(out, b"host=0.0.0.0; db=0.0.0.0\n");
    let (_, out) = get("/files/info?path=/workspace/s/r.cfg".into()).await;
    let info: Value = serde_json::from_slice(&out).expect("json");
    assert_eq!(info["/workspace/s/r.cfg"]["mode"], 640, "{info}");
    let (s, out) = post(
        "/files/replace".into(),
        json!({"/workspace/s/r.cfg": {"old": "db", "new": "store"}}),
    )
    .await;
    assert_eq!(
        (s, out.len()),
        (StatusCode::OK, 0),
        "without verbose: no body"
    );
    let (_, out) = get("/files/download?path=/workspace/s/r.cfg".into()).await;
    assert_eq!(out, b"host=0.0.0.0; store=0.0.0.0\n");
    let (s, _) = post(
        "/files/replace".into(),
        json!({"/workspace/s/r.cfg": {"old": "", "new": "x"}}),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, _) = post(
        "/files/replace".into(),
        json!({"/workspace/none": {"old": "a", "new": "b"}}),
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // Reads by lines: `offset` from 1, `limit` lines, each with its newline.
    let file = "/files/download?path=/workspace/s/sub/c2.txt";
    for (q, want) in [
        ("&offset=2&limit=2", &b"l2\nl3\n"[..]),
        ("&offset=3", b"l3\nl4"),
        ("&limit=1", b"l1\n"),
        ("&offset=9", b""),
    ] {
        let (s, out) = get(format!("{file}{q}")).await;
        assert_eq!((s, out.as_slice()), (StatusCode::OK, want), "{q}");
    }
    let (s, _) = get(format!("{file}&offset=0")).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let req = Request::builder()
        .uri(format!("{}{file}&offset=1", x.prefix))
        .header("x-execd-access-token", &x.token)
        .header("range", "bytes=0-1")
        .body(Body::empty())
        .expect("request");
    let (s, _, _) = os.send(req).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "lines or bytes, not both");
}

/// A search below more entries than one listing answers walks on a directory at a time; one
/// directory of more than a listing holds is refused, in its words.
#[tokio::test]
async fn a_search_walks_past_what_one_listing_answers() {
    let os = service();
    let id = os.create(json!({"image": {"uri": IMAGE}})).await;
    let x = os.execd(&id).await;
    let mkdirs = |dirs: Vec<String>| {
        let (os, x) = (&os, &x);
        async move {
            let body: serde_json::Map<String, Value> = dirs
                .into_iter()
                .map(|d| (d, json!({"mode": 755})))
                .collect();
            let (s, out, _) = os
                .call(
                    x,
                    "POST",
                    "/directories",
                    Some("application/json"),
                    Value::Object(body).to_string().into_bytes(),
                )
                .await;
            assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&out));
        }
    };
    // 40 directories of 30: more entries than one listing answers (1,000), none of them a
    // directory that holds that many.
    mkdirs(
        (0..40)
            .flat_map(|i| (0..30).map(move |j| format!("/workspace/big/d{i:02}/e{j:02}")))
            .collect(),
    )
    .await;
    let ct = "multipart/form-data; boundary=XyZ";
    let body = upload(
        "XyZ",
        &[
            ("/workspace/big/d00/needle.txt", 644, b"1"),
            ("/workspace/big/d39/e29/needle.txt", 644, b"2"),
            ("/workspace/big/d39/e29/hay.txt", 644, b"3"),
        ],
    );
    let (s, _, _) = os.call(&x, "POST", "/files/upload", Some(ct), body).await;
    assert_eq!(s, StatusCode::OK);
    let (s, out, _) = os
        .call(
            &x,
            "GET",
            "/files/search?path=/workspace/big&pattern=needle.*",
            None,
            Vec::new(),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&out));
    let found: Value = serde_json::from_slice(&out).expect("json");
    let paths: Vec<&str> = found
        .as_array()
        .expect("a list")
        .iter()
        .map(|f| f["path"].as_str().expect("path"))
        .collect();
    assert_eq!(
        paths,
        [
            "/workspace/big/d00/needle.txt",
            "/workspace/big/d39/e29/needle.txt"
        ]
    );

    // One directory of more than a listing holds: refused, not answered in part.
    mkdirs(
        (0..1001)
            .map(|k| format!("/workspace/flat/f{k:04}"))
            .collect(),
    )
    .await;
    let (s, out, _) = os
        .call(
            &x,
            "GET",
            "/files/search?path=/workspace/flat",
            None,
            Vec::new(),
        )
        .await;
    assert_eq!(
        s,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        String::from_utf8_lossy(&out)
    );
    let err: Value = serde_json::from_slice(&out).expect("json");
    assert!(
        err["message"]
            .as_str()
            .is_some_and(|m| m.contains("narrower path")),
        "{err}"
    );
}
