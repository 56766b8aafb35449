//! In-process tests of admission (`DAIV_SANDBOX_MAX_CONCURRENT_*`): a request past a class's
//! slots waits in the queue, then gets a 429 with `Retry-After` and a `{"detail": ...}`; the
//! per-session fs bound holds back one session only; slots come back on success, on error, when
//! the client goes away, and once the response has been sent. A held engine call (the fake's
//! [`Hold`]) keeps a request in flight for as long as a test needs.
//!
//! [`Hold`]: control_plane::engine::fake::Hold

mod harness;

use axum::body::Body;
use axum::http::{HeaderMap, Request, Response, StatusCode};
use control_plane::engine::fake::FakeEngine;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tower::ServiceExt;

use harness::{Harness, IMAGE, KEY};

/// A queue short enough that a refusal comes quickly; long enough to see a waiter served.
const SHORT_QUEUE: (&str, &str) = ("ADMISSION_QUEUE_SECONDS", "0.2");

fn request(method: &str, path: &str, body: Option<Value>) -> Request<Body> {
    let req = Request::builder()
        .method(method)
        .uri(format!("/api/v1{path}"))
        .header("x-api-key", KEY);
    match body {
        Some(v) => req
            .header("content-type", "application/json")
            .body(Body::from(v.to_string())),
        None => req.body(Body::empty()),
    }
    .expect("request")
}

/// Sends a request from a task of its own: it stays in flight while the test goes on.
fn spawn(h: &Harness, method: &str, path: &str, body: Option<Value>) -> JoinHandle<StatusCode> {
    let router = h.router.clone();
    let req = request(method, path, body);
    tokio::spawn(async move {
        match router.oneshot(req).await {
            Ok(r) => r.status(),
            Err(e) => match e {},
        }
    })
}

async fn send(h: &Harness, method: &str, path: &str, body: Option<Value>) -> Response<Body> {
    h.send(request(method, path, body)).await
}

/// Status, headers and JSON body.
async fn answer(resp: Response<Body>) -> (StatusCode, HeaderMap, Value) {
    let (status, headers) = (resp.status(), resp.headers().clone());
    (status, headers, harness::json_body(resp).await)
}

fn ls() -> Option<Value> {
    Some(json!({"path": "/workspace/repo"}))
}

fn create_body() -> Option<Value> {
    Some(json!({"base_image": IMAGE}))
}

/// The refusal every class answers with: 429, `Retry-After` in whole seconds, a sentence.
fn assert_refused(answer: &(StatusCode, HeaderMap, Value), what: &str) {
    let (status, headers, body) = answer;
    assert_eq!(*status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(
        headers.get("retry-after").and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(
        detail.starts_with(&format!("too many {what} in progress")),
        "{body}"
    );
}

fn count(h: &Harness, prefix: &str) -> usize {
    h.engine
        .calls()
        .iter()
        .filter(|c| c.starts_with(prefix))
        .count()
}

#[tokio::test]
async fn a_create_past_the_limit_waits_then_gets_429_with_retry_after() {
    let h = Harness::new(
        FakeEngine::default(),
        &[("MAX_CONCURRENT_CREATES", "2"), SHORT_QUEUE],
    );
    let hold = h.engine.hold("create ");
    let first = [
        spawn(&h, "POST", "/session/", create_body()),
        spawn(&h, "POST", "/session/", create_body()),
    ];
    hold.until_waiting(2).await;

    let refused = answer(send(&h, "POST", "/session/", create_body()).await).await;
    assert_refused(&refused, "session creates");
    assert_eq!(
        hold.waiting(),
        2,
        "the third create never reached the engine"
    );
    let metrics = h.state.metrics.render(None);
    assert!(
        metrics.contains(
            "daiv_sandbox_admission_refused_total{class=\"create\",reason=\"timeout\"} 1\n"
        ),
        "{metrics}"
    );
    assert!(metrics.contains("daiv_sandbox_admission_in_flight{class=\"create\"} 2\n"));

    hold.release();
    for task in first {
        assert_eq!(task.await.expect("task"), StatusCode::OK);
    }
    // Their slots came back with their answers.
    let (s, _, b) = answer(send(&h, "POST", "/session/", create_body()).await).await;
    assert_eq!(s, StatusCode::OK, "{b}");
}

/// A snapshot and a fork build Docker objects as a create does: their operations take a create
/// slot, so with every slot held by a create they are refused, and the session is untouched.
#[tokio::test]
async fn snapshots_and_forks_take_a_create_slot() {
    let h = Harness::new(
        FakeEngine::default(),
        &[("MAX_CONCURRENT_CREATES", "1"), SHORT_QUEUE],
    );
    let (s, _, b) = answer(send(&h, "POST", "/session/", create_body()).await).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let id = b["session_id"].as_str().expect("session_id").to_string();
    let hold = h.engine.hold("create ");
    let busy = spawn(&h, "POST", "/session/", create_body());
    hold.until_waiting(1).await;

    let snap = send(&h, "POST", &format!("/session/{id}/snapshot/"), None).await;
    assert_refused(&answer(snap).await, "session creates");
    let fork = send(
        &h,
        "POST",
        &format!("/session/{id}/fork/"),
        Some(json!({"count": 2})),
    )
    .await;
    assert_refused(&answer(fork).await, "session creates");
    assert_eq!(hold.waiting(), 1, "neither reached the engine");

    hold.release();
    assert_eq!(busy.await.expect("task"), StatusCode::OK);
    // The session still serves, and its lock was never taken.
    let (s, _, b) = answer(send(&h, "POST", &format!("/session/{id}/pause/"), None).await).await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{b}");
}

#[tokio::test]
async fn a_queued_request_takes_the_first_slot_that_frees() {
    let h = Harness::new(
        FakeEngine::default(),
        &[
            ("MAX_CONCURRENT_CREATES", "1"),
            ("ADMISSION_QUEUE_SECONDS", "60"),
        ],
    );
    let hold = h.engine.hold("create ");
    let running = spawn(&h, "POST", "/session/", create_body());
    hold.until_waiting(1).await;
    let queued = spawn(&h, "POST", "/session/", create_body());
    while !h
        .state
        .metrics
        .render(None)
        .contains("daiv_sandbox_admission_waiting{class=\"create\"} 1\n")
    {
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    assert_eq!(hold.waiting(), 1, "the queued create waits for a slot");
    hold.release();
    assert_eq!(running.await.expect("task"), StatusCode::OK);
    assert_eq!(queued.await.expect("task"), StatusCode::OK);
    assert_eq!(count(&h, "create "), 2);
}

#[tokio::test]
async fn a_full_queue_refuses_without_waiting() {
    let h = Harness::new(
        FakeEngine::default(),
        &[
            ("MAX_CONCURRENT_CREATES", "1"),
            ("ADMISSION_QUEUE_LENGTH", "0"),
            ("ADMISSION_QUEUE_SECONDS", "300"),
        ],
    );
    let hold = h.engine.hold("create ");
    let running = spawn(&h, "POST", "/session/", create_body());
    hold.until_waiting(1).await;
    // A queue wait of 300 s would outlast the test: this answer did not wait.
    let refused = answer(send(&h, "POST", "/session/", create_body()).await).await;
    assert_refused(&refused, "session creates");
    let metrics = h.state.metrics.render(None);
    assert!(
        metrics.contains(
            "daiv_sandbox_admission_refused_total{class=\"create\",reason=\"queue_full\"} 1\n"
        ),
        "{metrics}"
    );
    hold.release();
    assert_eq!(running.await.expect("task"), StatusCode::OK);
}

#[tokio::test]
async fn a_seed_past_the_limit_gets_429_before_its_body_is_read() {
    let h = Harness::new(
        FakeEngine::default(),
        &[("MAX_CONCURRENT_SEEDS", "1"), SHORT_QUEUE],
    );
    let (s1, s2) = (h.session().await, h.session().await);
    // The first seed is admitted, then waits on its session's inspect.
    let hold = h.engine.hold(&format!("inspect {s1}"));
    let first = spawn(&h, "POST", &format!("/session/{s1}/seed/"), None);
    hold.until_waiting(1).await;

    // The second carries a body that would be a 422 if anything read it.
    let req = Request::post(format!("/api/v1/session/{s2}/seed/"))
        .header("x-api-key", KEY)
        .header("content-type", "multipart/form-data; boundary=x")
        .body(Body::from("not multipart at all"))
        .expect("request");
    let refused = answer(h.send(req).await).await;
    assert_refused(&refused, "seeds");

    hold.release();
    // Not multipart: refused by the handler, after admission; the slot comes back on error.
    assert_eq!(first.await.expect("task"), StatusCode::UNPROCESSABLE_ENTITY);
    let (s, _, _) = answer(send(&h, "POST", &format!("/session/{s2}/seed/"), None).await).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "admitted again");
}

#[tokio::test]
async fn the_per_session_fs_bound_holds_back_that_session_only() {
    let h = Harness::new(
        FakeEngine::default(),
        &[
            ("MAX_CONCURRENT_FS_OPS_PER_SESSION", "2"),
            ("MAX_CONCURRENT_FS_OPS", "8"),
            SHORT_QUEUE,
        ],
    );
    let (busy, other) = (h.session().await, h.session().await);
    let hold = h.engine.hold(&format!("inspect {busy}"));
    let ls_busy = format!("/session/{busy}/fs/ls/");
    let first = [
        spawn(&h, "POST", &ls_busy, ls()),
        spawn(&h, "POST", &ls_busy, ls()),
    ];
    hold.until_waiting(2).await;

    let refused = answer(send(&h, "POST", &ls_busy, ls()).await).await;
    assert_refused(&refused, "fs operations on this session");
    // Any op of the session counts, reads and writes alike.
    let write = json!({"path": "/workspace/repo/a", "content": ""});
    let refused = answer(
        send(
            &h,
            "POST",
            &format!("/session/{busy}/fs/write/"),
            Some(write),
        )
        .await,
    )
    .await;
    assert_refused(&refused, "fs operations on this session");
    // Another session is not held back.
    let (s, _, b) = answer(send(&h, "POST", &format!("/session/{other}/fs/ls/"), ls()).await).await;
    assert_eq!(s, StatusCode::OK, "{b}");

    hold.release();
    for task in first {
        assert_eq!(task.await.expect("task"), StatusCode::OK);
    }
    let (s, _, _) = answer(send(&h, "POST", &ls_busy, ls()).await).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        h.state.admission.tracked_sessions(),
        0,
        "sessions without fs ops in flight are forgotten"
    );
}

#[tokio::test]
async fn the_total_fs_bound_spans_sessions() {
    let h = Harness::new(
        FakeEngine::default(),
        &[
            ("MAX_CONCURRENT_FS_OPS_PER_SESSION", "4"),
            ("MAX_CONCURRENT_FS_OPS", "1"),
            SHORT_QUEUE,
        ],
    );
    let (busy, other) = (h.session().await, h.session().await);
    let hold = h.engine.hold(&format!("inspect {busy}"));
    let first = spawn(
        &h,
        "POST",
        &format!("/session/{busy}/fs/read/"),
        Some(json!({"path": "/workspace/repo/x"})),
    );
    hold.until_waiting(1).await;
    let refused = answer(send(&h, "POST", &format!("/session/{other}/fs/ls/"), ls()).await).await;
    assert_refused(&refused, "fs operations");
    hold.release();
    assert_eq!(first.await.expect("task"), StatusCode::OK);
}

#[tokio::test]
async fn slots_come_back_after_errors() {
    let h = Harness::new(
        FakeEngine::default(),
        &[
            ("MAX_CONCURRENT_CREATES", "1"),
            ("MAX_CONCURRENT_FS_OPS_PER_SESSION", "1"),
            ("MAX_CONCURRENT_FS_OPS", "1"),
            ("ADMISSION_QUEUE_LENGTH", "0"),
        ],
    );
    h.engine.set_missing_image("gone:1");
    let missing = "0".repeat(64);
    // With one slot and no queue, a slot kept by a failed request would make the next a 429.
    for _ in 0..3 {
        let (s, _, b) = answer(
            send(
                &h,
                "POST",
                "/session/",
                Some(json!({"base_image": "gone:1"})),
            )
            .await,
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{b}");
        let (s, _, b) =
            answer(send(&h, "POST", &format!("/session/{missing}/fs/ls/"), ls()).await).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{b}");
        // Refused by the handler's own checks after admission.
        let (s, _, b) =
            answer(send(&h, "POST", "/session/", Some(json!({"base_image": ""}))).await).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    }
    let (s, _, b) = answer(send(&h, "POST", "/session/", create_body()).await).await;
    assert_eq!(s, StatusCode::OK, "{b}");
}

#[tokio::test]
async fn a_client_that_goes_away_gives_its_slot_back() {
    let h = Harness::new(
        FakeEngine::default(),
        &[
            ("MAX_CONCURRENT_CREATES", "1"),
            ("ADMISSION_QUEUE_LENGTH", "0"),
        ],
    );
    let hold = h.engine.hold("create ");
    let gone = spawn(&h, "POST", "/session/", create_body());
    hold.until_waiting(1).await;
    gone.abort();
    assert!(gone.await.is_err_and(|e| e.is_cancelled()));
    assert_eq!(hold.waiting(), 0);
    // Admitted at once (the queue is off): the next create reaches the engine.
    let next = spawn(&h, "POST", "/session/", create_body());
    hold.until_waiting(1).await;
    hold.release();
    assert_eq!(next.await.expect("task"), StatusCode::OK);
}

#[tokio::test]
async fn the_slot_is_held_until_the_answer_is_sent() {
    let h = Harness::new(
        FakeEngine::default(),
        &[
            ("MAX_CONCURRENT_FS_OPS_PER_SESSION", "1"),
            ("ADMISSION_QUEUE_LENGTH", "0"),
        ],
    );
    let id = h.session().await;
    let path = format!("/session/{id}/fs/ls/");
    let unread = send(&h, "POST", &path, ls()).await;
    assert_eq!(unread.status(), StatusCode::OK);
    // Its body is still unsent: the session's one slot is taken.
    let refused = answer(send(&h, "POST", &path, ls()).await).await;
    assert_refused(&refused, "fs operations on this session");
    let (s, _, b) = answer(unread).await;
    assert_eq!(s, StatusCode::OK);
    assert!(b["entries"].is_array(), "{b}");
    let (s, _, _) = answer(send(&h, "POST", &path, ls()).await).await;
    assert_eq!(s, StatusCode::OK, "sent in full: the slot came back");
}

/// `/files` takes the session's fs slot in its operation: an upload while a download's body is
/// unsent is refused, and once the download has been read in full the slot is back.
#[tokio::test]
async fn a_download_holds_its_fs_slot_until_it_is_sent() {
    let h = Harness::new(
        FakeEngine::default(),
        &[
            ("MAX_CONCURRENT_FS_OPS_PER_SESSION", "1"),
            ("ADMISSION_QUEUE_LENGTH", "0"),
        ],
    );
    let id = h.session().await;
    let uri = format!("/api/v1/session/{id}/files?path=/workspace/repo/blob.bin");
    let put = |body: Vec<u8>| {
        Request::builder()
            .method("PUT")
            .uri(&uri)
            .header("x-api-key", KEY)
            .body(Body::from(body))
            .expect("request")
    };
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let (s, _, b) = answer(h.send(put(data.clone())).await).await;
    assert_eq!(s, StatusCode::OK, "{b}");

    let get = Request::builder()
        .uri(&uri)
        .header("x-api-key", KEY)
        .body(Body::empty())
        .expect("request");
    let unread = h.send(get).await;
    assert_eq!(unread.status(), StatusCode::OK);
    // Its body is still unsent: the session's one slot is taken, for writes as for reads.
    assert_refused(
        &answer(h.send(put(b"x".to_vec())).await).await,
        "fs operations on this session",
    );
    assert_refused(
        &answer(send(&h, "POST", &format!("/session/{id}/fs/ls/"), ls()).await).await,
        "fs operations on this session",
    );
    let body = http_body_util::BodyExt::collect(unread.into_body())
        .await
        .expect("body")
        .to_bytes();
    assert_eq!(body.as_ref(), &data[..], "the download is whole");
    let (s, _, b) = answer(h.send(put(b"x".to_vec())).await).await;
    assert_eq!(s, StatusCode::OK, "sent in full: the slot came back: {b}");
}

#[tokio::test]
async fn requests_without_the_key_never_take_a_slot() {
    let h = Harness::new(
        FakeEngine::default(),
        &[
            ("MAX_CONCURRENT_CREATES", "1"),
            ("ADMISSION_QUEUE_LENGTH", "0"),
        ],
    );
    let hold = h.engine.hold("create ");
    let running = spawn(&h, "POST", "/session/", create_body());
    hold.until_waiting(1).await;
    let (s, b) = h
        .call("POST", "/api/v1/session/", create_body(), None)
        .await;
    assert_eq!(
        (s, b),
        (
            StatusCode::FORBIDDEN,
            json!({"detail": "API Key header is missing"})
        )
    );
    hold.release();
    assert_eq!(running.await.expect("task"), StatusCode::OK);
}

#[tokio::test]
async fn openapi_documents_the_429_and_its_retry_after() {
    let h = Harness::default();
    let (_, doc) = h.call("GET", "/api/v1/openapi.json", None, None).await;
    let mut admitted = vec![
        "/session/".to_string(),
        "/session/{session_id}/seed/".to_string(),
    ];
    for op in ["ls", "read", "grep", "glob", "write", "edit", "delete"] {
        admitted.push(format!("/session/{{session_id}}/fs/{op}"));
    }
    for path in admitted {
        let r = &doc["paths"][&path]["post"]["responses"]["429"];
        assert!(r["headers"]["Retry-After"].is_object(), "{path}: {r}");
        assert_eq!(
            r["content"]["application/json"]["schema"]["$ref"], "#/components/schemas/ErrorBody",
            "{path}"
        );
    }
}
