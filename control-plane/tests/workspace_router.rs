//! In-process tests of the seed and fs handlers' decisions against the fake engine: status
//! codes, the one-shot marker, the skipped-members header, lexical path validation and the lock.
//! What the scripts do in a real container is tested end to end in the `e2e` crate.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use control_plane::config::{self, Config};
use control_plane::engine::fake::FakeEngine;
use control_plane::lock::{LocalLocks, SessionLocks};
use control_plane::{AppState, app};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

const KEY: &str = "test-key";
const BOUNDARY: &str = "XyZboundary";

fn config(extra: &[(&str, &str)]) -> Arc<Config> {
    config::for_tests(KEY, extra)
}

struct Harness {
    engine: FakeEngine,
    locks: Arc<LocalLocks>,
    router: axum::Router,
}

impl Harness {
    fn new(extra: &[(&str, &str)]) -> Self {
        let engine = FakeEngine::default();
        let locks = Arc::new(LocalLocks::default());
        let state = AppState::new(config(extra), Arc::new(engine.clone()), locks.clone());
        Self {
            engine,
            locks,
            router: app(state),
        }
    }

    async fn send(&self, req: Request<Body>) -> (StatusCode, Option<String>, Value) {
        let resp = match self.router.clone().oneshot(req).await {
            Ok(r) => r,
            Err(e) => panic!("router error: {e}"),
        };
        let status = resp.status();
        let skipped = resp
            .headers()
            .get("x-seed-skipped-members")
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        let bytes = match resp.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => panic!("body error: {e}"),
        };
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, skipped, body)
    }

    async fn session(&self) -> String {
        let req = Request::post("/api/v1/session/")
            .header("x-api-key", KEY)
            .header("content-type", "application/json")
            .body(Body::from(json!({"base_image": "img"}).to_string()))
            .unwrap_or_default();
        let (s, _, b) = self.send(req).await;
        assert_eq!(s, StatusCode::OK, "{b}");
        b["session_id"].as_str().unwrap_or_default().to_string()
    }

    async fn seed(
        &self,
        id: &str,
        fields: &[(&str, Vec<u8>)],
    ) -> (StatusCode, Option<String>, Value) {
        let mut body = Vec::new();
        for (name, data) in fields {
            body.extend_from_slice(
                format!(
                    "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"a.tar\"\r\nContent-Type: application/octet-stream\r\n\r\n"
                )
                .as_bytes(),
            );
            body.extend_from_slice(data);
            body.extend_from_slice(b"\r\n");
        }
        body.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
        let req = Request::post(format!("/api/v1/session/{id}/seed"))
            .header("x-api-key", KEY)
            .header(
                "content-type",
                format!("multipart/form-data; boundary={BOUNDARY}"),
            )
            .body(Body::from(body))
            .unwrap_or_default();
        self.send(req).await
    }

    async fn fs(&self, id: &str, op: &str, body: Value) -> (StatusCode, Value) {
        let req = Request::post(format!("/api/v1/session/{id}/fs/{op}"))
            .header("x-api-key", KEY)
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap_or_default();
        let (s, _, b) = self.send(req).await;
        (s, b)
    }
}

fn tar_with(names: &[(&str, tar::EntryType, &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind, target) in names {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(*kind);
        h.set_mode(0o644);
        h.set_size(0);
        let raw = name.as_bytes();
        h.as_old_mut().name[..raw.len()].copy_from_slice(raw);
        let t = target.as_bytes();
        h.as_old_mut().linkname[..t.len()].copy_from_slice(t);
        h.set_cksum();
        b.append(&h, std::io::empty()).unwrap_or_default();
    }
    b.into_inner().unwrap_or_default()
}

#[tokio::test]
async fn seed_is_one_shot_and_reports_skipped_members() {
    let h = Harness::new(&[]);
    let id = h.session().await;
    let archive = tar_with(&[
        ("a.txt", tar::EntryType::Regular, ""),
        ("hard", tar::EntryType::Link, "a.txt"),
        ("esc", tar::EntryType::Symlink, "../../x"),
    ]);
    let (s, skipped, b) = h
        .seed(&id, &[("repo_archive", archive.clone()), ("x", vec![1])])
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{b}");
    assert_eq!(skipped.as_deref(), Some("2"));
    assert!(h.engine.file(&id, "/.daiv-sandbox/seeded").is_some());
    assert!(h.engine.file(&id, "/workspace/repo/a.txt").is_some());
    let (s, _, b) = h.seed(&id, &[("repo_archive", archive)]).await;
    assert_eq!(s, StatusCode::CONFLICT, "{b}");
}

#[tokio::test]
async fn seed_decisions() {
    let h = Harness::new(&[("SEED_MAX_MEMBERS", "1")]);
    let id = h.session().await;
    // Neither field.
    let (s, _, b) = h.seed(&id, &[("other", vec![1, 2, 3])]).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    // Hostile names reject the archive; no marker is written.
    let evil = tar_with(&[("../x", tar::EntryType::Regular, "")]);
    let (s, _, b) = h.seed(&id, &[("skills_archive", evil)]).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    assert!(h.engine.file(&id, "/.daiv-sandbox/seeded").is_none());
    // Over the member limit.
    let two = tar_with(&[
        ("a", tar::EntryType::Regular, ""),
        ("b", tar::EntryType::Regular, ""),
    ]);
    let (s, _, b) = h.seed(&id, &[("repo_archive", two)]).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "{b}");
    // Not multipart at all.
    let req = Request::post(format!("/api/v1/session/{id}/seed/"))
        .header("x-api-key", KEY)
        .header("content-type", "application/json")
        .body(Body::from("{}"))
        .unwrap_or_default();
    let (s, _, _) = h.send(req).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    // Unknown session.
    let (s, _, _) = h.seed(&"f".repeat(64), &[("repo_archive", vec![])]).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn fs_paths_are_validated_before_touching_the_container() {
    let h = Harness::new(&[]);
    let id = h.session().await;
    let before = h.engine.calls().len();
    for op in ["ls", "read", "grep", "glob", "write", "edit", "delete"] {
        let (s, b) = h
            .fs(&id, op, json!({"path": "/workspace/../etc", "pattern": "x", "content": "", "old": "a", "new": "b"}))
            .await;
        assert_eq!(s, StatusCode::OK, "{op}: {b}");
        assert_eq!(b["error"]["code"], "invalid_path", "{op}: {b}");
    }
    let calls = h.engine.calls();
    assert!(
        calls[before..].iter().all(|c| c.starts_with("inspect")),
        "only the session lookup may reach the engine: {calls:?}"
    );
    let (s, _) = h
        .fs(&"f".repeat(64), "ls", json!({"path": "/workspace"}))
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = h.fs(&id, "read", json!({"nopath": 1})).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn fs_read_and_edit_go_through_the_archive_api() {
    let h = Harness::new(&[]);
    let id = h.session().await;
    let mut b = tar::Builder::new(Vec::new());
    let mut hd = tar::Header::new_gnu();
    hd.set_size(12);
    hd.set_mode(0o644);
    hd.set_cksum();
    b.append_data(&mut hd, "f.txt", &b"one\ntwo\none\n"[..])
        .unwrap_or_default();
    let (s, _, body) = h
        .seed(&id, &[("repo_archive", b.into_inner().unwrap_or_default())])
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{body}");
    let (s, r) = h
        .fs(
            &id,
            "read",
            json!({"path": "/workspace/repo/f.txt", "offset": 1, "limit": 1}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        r,
        json!({"content": "two", "encoding": "utf-8", "total_lines": 3, "end_line": 2, "truncated": false, "error": null})
    );
    let (_, r) = h
        .fs(
            &id,
            "edit",
            json!({"path": "/workspace/repo/f.txt", "old": "one", "new": "1"}),
        )
        .await;
    assert_eq!(r["error"]["code"], "multiple_occurrences", "{r}");
    let (_, r) = h
        .fs(
            &id,
            "edit",
            json!({"path": "/workspace/repo/f.txt", "old": "one", "new": "1", "replace_all": true}),
        )
        .await;
    assert_eq!(r, json!({"occurrences": 2, "error": null}));
    assert_eq!(
        h.engine.file(&id, "/workspace/repo/f.txt").as_deref(),
        Some(&b"1\ntwo\n1\n"[..])
    );
    let (_, r) = h
        .fs(&id, "read", json!({"path": "/workspace/repo/missing"}))
        .await;
    assert_eq!(r["error"]["code"], "not_found");
}

#[tokio::test]
async fn fs_ops_wait_for_the_session_lock_then_409() {
    let h = Harness::new(&[("SESSION_LOCK_WAIT_SECONDS", "0.1")]);
    let id = h.session().await;
    let held = h.locks.acquire(&id, Duration::from_secs(1)).await;
    assert!(held.is_ok());
    let (s, _) = h.fs(&id, "ls", json!({"path": "/workspace"})).await;
    assert_eq!(s, StatusCode::CONFLICT);
    let (s, _, _) = h.seed(&id, &[("repo_archive", vec![])]).await;
    assert_eq!(s, StatusCode::CONFLICT);
    drop(held);
}
