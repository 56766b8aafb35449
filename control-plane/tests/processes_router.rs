//! In-process tests of the background processes over the fake engine, whose helper and process
//! supervisor are host builds of the real ones (the processes run on the host): a create answers
//! with the session's helper channel open, a process takes any environment a session takes,
//! the processes' routes are operations that check the session once, and a process the session
//! does not have is the session's 404.

mod harness;

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{Value, json};

use control_plane::engine::ContainerEngine;
use control_plane::engine::fake::FakeEngine;
use harness::{Harness, KEY};

/// The engine's calls that opened `id`'s helper channel (the `serve` exec).
fn channels_opened(h: &Harness, id: &str) -> usize {
    h.engine
        .calls()
        .iter()
        .filter(|c| *c == &format!("exec_attached {id}"))
        .count()
}

/// Polls process `pid` of session `id` until it ended; its last answer.
async fn ended(h: &Harness, id: &str, pid: &str) -> Value {
    for _ in 0..100 {
        let (s, v) = h
            .call(
                "GET",
                &format!("/api/v1/session/{id}/processes/{pid}/?wait=1"),
                None,
                Some(KEY),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        if v["running"] == false {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("process {pid} did not end");
}

/// The first command of a session finds its channel open: the create waits for the exec that
/// opens it before it answers (no exec left for the first command to pay for), and the command
/// opens no other.
#[tokio::test]
async fn a_create_answers_with_the_sessions_helper_channel_open() {
    use tower::ServiceExt;
    let h = Harness::default();
    let hold = h.engine.hold("exec_attached ");
    let req = axum::http::Request::builder()
        .method("POST")
        .uri("/api/v1/session/")
        .header("x-api-key", KEY)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(
            json!({"base_image": harness::IMAGE}).to_string(),
        ))
        .expect("request");
    let mut create = tokio::spawn(h.router.clone().oneshot(req));
    while hold.waiting() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The channel's exec is held: the create cannot have answered.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut create)
            .await
            .is_err(),
        "the create answered before its channel was open"
    );
    hold.release();
    let resp = create.await.expect("the create").expect("a response");
    assert_eq!(resp.status(), StatusCode::OK);
    let v = harness::json_body(resp).await;
    let id = v["session_id"].as_str().expect("session_id").to_string();
    assert_eq!(channels_opened(&h, &id), 1, "{:?}", h.engine.calls());
    let (s, v) = h
        .call(
            "POST",
            &format!("/api/v1/session/{id}/"),
            Some(json!({"commands": ["echo first"]})),
            Some(KEY),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["results"][0]["output"], "first\n", "{v}");
    assert_eq!(channels_opened(&h, &id), 1, "{:?}", h.engine.calls());
}

/// A process's environment follows a session's rule (any name without `=` or NUL), so a name a
/// shell cannot spell still reaches the program; a name with `=` is refused as the session's is.
#[tokio::test]
async fn a_process_takes_any_environment_a_session_takes() {
    let h = Harness::default();
    let id = h.session().await;
    let (s, v) = h
        .call(
            "POST",
            &format!("/api/v1/session/{id}/processes/"),
            Some(json!({"command": "env", "environment": {"my.var": "dotted", "1ST": "digit"}})),
            Some(KEY),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let pid = v["process_id"].as_str().expect("process_id").to_string();
    let out = ended(&h, &id, &pid).await;
    let text = out["output"].as_str().unwrap_or_default();
    assert!(text.lines().any(|l| l == "my.var=dotted"), "{out}");
    assert!(text.lines().any(|l| l == "1ST=digit"), "{out}");

    for env in [
        json!({"A=B": "x"}),
        json!({"": "x"}),
        json!({"A": "x\u{0}y"}),
    ] {
        let (s, v) = h
            .call(
                "POST",
                &format!("/api/v1/session/{id}/processes/"),
                Some(json!({"command": "true", "environment": env})),
                Some(KEY),
            )
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{env}: {v}");
        assert!(
            v["detail"]
                .as_str()
                .is_some_and(|d| d.contains("environment variable")),
            "{v}"
        );
    }
}

/// Each process route is one operation: it checks the session once (one inspect), whatever it
/// does inside; a process the session does not have answers as a missing session does (the
/// reference's 404).
#[tokio::test]
async fn the_process_routes_check_the_session_once() {
    let h = Harness::default();
    let id = h.session().await;
    let inspects = |h: &Harness| {
        h.engine
            .calls()
            .iter()
            .filter(|c| c.starts_with(&format!("inspect {id}")))
            .count()
    };
    let before = inspects(&h);
    let (s, v) = h
        .call(
            "POST",
            &format!("/api/v1/session/{id}/processes/"),
            Some(json!({"command": "cat", "process_id": "reader"})),
            Some(KEY),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(inspects(&h) - before, 1, "{:?}", h.engine.calls());

    let before = inspects(&h);
    let (s, v) = h
        .call(
            "GET",
            &format!("/api/v1/session/{id}/processes/"),
            None,
            Some(KEY),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["processes"][0]["process_id"], "reader", "{v}");
    assert_eq!(inspects(&h) - before, 1);

    let (s, v) = h
        .call(
            "DELETE",
            &format!("/api/v1/session/{id}/processes/reader/"),
            None,
            Some(KEY),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{v}");
    let out = ended(&h, &id, "reader").await;
    assert_eq!(out["running"], false, "{out}");

    let (s, v) = h
        .call(
            "GET",
            &format!("/api/v1/session/{id}/processes/nobody/"),
            None,
            Some(KEY),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    assert_eq!(v["detail"], "Session not found or already closed", "{v}");
}

/// Opens a channel's exec on session `id` (after the first one closed), and `end`s the session
/// (stops or removes it) once that exec started and before its helper said it was ready, as a
/// deadline or a close beside the request does: the request's answer.
async fn answer_with_the_session_ended_under_its_channel(
    h: &Harness,
    id: &str,
    end: impl AsyncFnOnce(&FakeEngine),
) -> (StatusCode, Value) {
    // The create's channel closes with its container; started again, the next request opens one.
    h.engine.kill(id);
    h.engine.start(id).await.expect("start");
    let hold = h.engine.hold(&format!("serving {id}"));
    let uri = format!("/api/v1/session/{id}/processes/0/?wait=0");
    let (router, uri2) = (h.router.clone(), uri.clone());
    let request = tokio::spawn(async move {
        use tower::ServiceExt;
        let req = axum::http::Request::builder()
            .uri(uri2)
            .header("x-api-key", KEY)
            .body(axum::body::Body::empty())
            .expect("request");
        let resp = router.oneshot(req).await.expect("a response");
        let status = resp.status();
        (status, harness::json_body(resp).await)
    });
    while hold.waiting() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    end(&h.engine).await;
    hold.release();
    request.await.expect("the request")
}

/// A session stopped under a request (a close beside it, its process dying) still exists: the
/// answer is a retry (503), not a missing session's 404.
#[tokio::test]
async fn a_session_stopped_while_its_helper_starts_answers_a_retry() {
    let h = Harness::default();
    let id = h.session().await;
    let (s, v) =
        answer_with_the_session_ended_under_its_channel(&h, &id, async |e| e.kill(&id)).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{v}");
}

/// One removed under a request (its deadline removed it, a removal came beside it) answers as
/// a missing session does, not with a helper fault to retry: a retry would find nothing.
#[tokio::test]
async fn a_session_removed_while_its_helper_starts_answers_404() {
    let h = Harness::default();
    let id = h.session().await;
    let (s, v) = answer_with_the_session_ended_under_its_channel(&h, &id, async |e| {
        e.remove(&id).await.expect("remove")
    })
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    assert_eq!(v["detail"], "Session not found or already closed", "{v}");
}
