//! In-process tests of the seed and fs handlers' decisions against the fake engine: status
//! codes, the one-shot marker, the skipped-members header, lexical path validation and the lock.
//! What the scripts do in a real container is tested end to end in the `e2e` crate.

mod harness;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use control_plane::coordination::lock::SessionLocks;
use control_plane::engine::fake::FakeEngine;
use futures::StreamExt;
use http_body_util::BodyExt;
use serde_json::{Value, json};

use harness::{Harness, KEY};

const BOUNDARY: &str = "XyZboundary";

/// What the seed and fs routes answer with: status, the skipped-members header, JSON body.
async fn parts(resp: axum::http::Response<Body>) -> (StatusCode, Option<String>, Value) {
    let status = resp.status();
    let skipped = resp
        .headers()
        .get("x-seed-skipped-members")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    (status, skipped, harness::json_body(resp).await)
}

impl Harness {
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
        parts(self.send(req).await).await
    }

    /// A seed request with `body` as it is, and the response's status and raw body.
    async fn seed_raw(&self, id: &str, body: Body) -> (StatusCode, Vec<u8>) {
        let req = Request::post(format!("/api/v1/session/{id}/seed"))
            .header("x-api-key", KEY)
            .header(
                "content-type",
                format!("multipart/form-data; boundary={BOUNDARY}"),
            )
            .body(body)
            .unwrap_or_default();
        let resp = self.send(req).await;
        let status = resp.status();
        match resp.into_body().collect().await {
            Ok(b) => (status, b.to_bytes().to_vec()),
            Err(e) => panic!("body error: {e}"),
        }
    }

    async fn fs(&self, id: &str, op: &str, body: Value) -> (StatusCode, Value) {
        self.api("POST", &format!("/session/{id}/fs/{op}"), Some(body))
            .await
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
    let h = Harness::new(FakeEngine::default(), &[]);
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
    // Extracted by the helper (as the sandbox user), not through the archive API.
    assert!(h.engine.workspace_dir(&id).join("repo/a.txt").is_file());
    assert!(!h.engine.workspace_dir(&id).join("repo/hard").exists());
    let (s, _, b) = h.seed(&id, &[("repo_archive", archive)]).await;
    assert_eq!(s, StatusCode::CONFLICT, "{b}");
}

#[tokio::test]
async fn seed_decisions() {
    let h = Harness::new(FakeEngine::default(), &[("SEED_MAX_MEMBERS", "1")]);
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
    let (s, _, _) = parts(h.send(req).await).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    // Unknown session.
    let (s, _, _) = h.seed(&"f".repeat(64), &[("repo_archive", vec![])]).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn fs_paths_are_validated_before_touching_the_container() {
    let h = Harness::new(FakeEngine::default(), &[]);
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
    // (Opening the helper's channel, ahead of use after create, is not an fs op.)
    assert!(
        calls[before..]
            .iter()
            .all(|c| c.starts_with("inspect") || c.starts_with("exec_attached")),
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
async fn fs_read_and_edit_go_through_the_helper() {
    let h = Harness::new(FakeEngine::default(), &[]);
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
    // The helper (a host build here) wrote the seeded and edited file in the session's files.
    assert_eq!(
        std::fs::read(h.engine.workspace_dir(&id).join("repo/f.txt"))
            .ok()
            .as_deref(),
        Some(&b"1\ntwo\n1\n"[..])
    );
    let (_, r) = h
        .fs(&id, "read", json!({"path": "/workspace/repo/missing"}))
        .await;
    assert_eq!(r["error"]["code"], "not_found");
}

#[tokio::test]
async fn fs_writes_wait_for_the_session_lock_then_409_and_reads_do_not() {
    let h = Harness::new(
        FakeEngine::default(),
        &[("SESSION_LOCK_WAIT_SECONDS", "0.1")],
    );
    let id = h.session().await;
    let held = h.locks.acquire(&id, Duration::from_secs(1)).await;
    assert!(held.is_ok());
    for op in ["ls", "glob", "grep", "read"] {
        let body = json!({"path": "/workspace", "pattern": "x"});
        let (s, v) = h.fs(&id, op, body).await;
        assert_eq!(s, StatusCode::OK, "{op} waited for the lock: {v}");
    }
    let (s, _) = h
        .fs(&id, "delete", json!({"path": "/workspace/repo/x"}))
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
    let (s, _) = h
        .fs(
            &id,
            "edit",
            json!({"path": "/workspace/repo/x", "old": "a", "new": "b"}),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
    let (s, _, _) = h.seed(&id, &[("repo_archive", vec![])]).await;
    assert_eq!(s, StatusCode::CONFLICT);
    drop(held);
}

/// A multipart body of `fields` (like [`Harness::seed`]'s, without part `Content-Type`s).
fn multipart(fields: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, data) in fields {
        body.extend_from_slice(
            format!(
                "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"a.tar\"\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    body
}

/// A GNU long-name record carrying `name`, then an empty regular file (whose name it is).
fn tar_with_long_name(name: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut record = name.to_vec();
    record.push(0);
    for (kind, size) in [
        (tar::EntryType::GNULongName, record.len()),
        (tar::EntryType::Regular, 0),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(0o644);
        h.set_size(size as u64);
        let n: &[u8] = if size > 0 { b"././@LongLink" } else { b"short" };
        h.as_old_mut().name[..n.len()].copy_from_slice(n);
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        if size > 0 {
            out.extend_from_slice(&record);
            out.resize(out.len().div_ceil(512) * 512, 0);
        }
    }
    out.resize(out.len() + 1024, 0);
    out
}

#[tokio::test]
async fn hostile_names_give_short_422_bodies() {
    let h = Harness::new(FakeEngine::default(), &[]);
    let id = h.session().await;
    // 32 KB names: over PATH_MAX (refused before the tar reader takes the record in), and
    // just under it (refused for its `..`, the name cut in the message).
    for (len, wants) in [
        (32 * 1024, "longer than 4095 bytes"),
        (4000, "(4000 bytes)"),
    ] {
        let name = format!("../{}", "a".repeat(len - 3));
        let body = multipart(&[("repo_archive", tar_with_long_name(name.as_bytes()))]);
        let (s, b) = h.seed_raw(&id, Body::from(body)).await;
        let text = String::from_utf8_lossy(&b);
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
        assert!(b.len() < 1024, "{len}: {} bytes: {text}", b.len());
        assert!(text.contains(wants), "{len}: {text}");
    }
    assert!(h.engine.file(&id, "/.daiv-sandbox/seeded").is_none());
}

#[tokio::test]
async fn endless_part_headers_give_422() {
    let h = Harness::new(FakeEngine::default(), &[]);
    let id = h.session().await;
    // A part whose headers never end: 64 MiB offered, lazily, in 64 KiB chunks.
    let pulled = Arc::new(AtomicUsize::new(0));
    let counter = pulled.clone();
    let head = format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"repo_archive\"\r\nX-Endless: "
    );
    let filler = bytes::Bytes::from(vec![b'a'; 64 * 1024]);
    let chunks = futures::stream::once(async move { bytes::Bytes::from(head) })
        .chain(futures::stream::repeat(filler).take(1024))
        .map(move |c| {
            counter.fetch_add(c.len(), Ordering::Relaxed);
            Ok::<_, std::io::Error>(c)
        });
    let (s, b) = h.seed_raw(&id, Body::from_stream(chunks)).await;
    let text = String::from_utf8_lossy(&b);
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
    assert!(
        text.contains("multipart part headers exceed 16384 bytes"),
        "{text}"
    );
    let pulled = pulled.load(Ordering::Relaxed);
    assert!(pulled < 1024 * 1024, "{pulled} bytes of the body were read");
    // Part data is not bounded by the guard (nor by axum's default body limit: the guarded
    // request keeps the route's `DefaultBodyLimit::disable`).
    let big = multipart(&[("other", vec![b'x'; 3 * 1024 * 1024])]);
    let (s, b) = h.seed_raw(&id, Body::from(big)).await;
    let text = String::from_utf8_lossy(&b);
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
    assert!(text.contains("at least one of"), "{text}");
    // 64 parts reach the handler (which wants a seed field among them); 65 do not.
    let names: Vec<String> = (0..65).map(|i| format!("f{i}")).collect();
    let fields: Vec<(&str, Vec<u8>)> = names.iter().map(|n| (n.as_str(), vec![b'x'])).collect();
    for (n, wants) in [(64, "at least one of"), (65, "more than 64 parts")] {
        let (s, b) = h.seed_raw(&id, Body::from(multipart(&fields[..n]))).await;
        let text = String::from_utf8_lossy(&b);
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{n}: {text}");
        assert!(text.contains(wants), "{n}: {text}");
    }
}

/// Issue 41 #7: `ls` and `glob` answer every entry (the helper's listing streams through the
/// service), and a listing over `FS_LIST_MAX_BYTES` is `too_large` with no entry.
#[tokio::test]
async fn fs_listings_answer_every_entry_up_to_their_byte_bound() {
    // 5,000 of `{"path":"/workspace/repo/m/f00000.py","is_dir":false}` and a comma: 54 bytes.
    let h = Harness::new(FakeEngine::default(), &[("FS_LIST_MAX_BYTES", "270000")]);
    let id = h.session().await;
    let dir = h.engine.workspace_dir(&id).join("repo/m");
    assert!(std::fs::create_dir_all(&dir).is_ok());
    for i in 0..5_000 {
        assert!(std::fs::write(dir.join(format!("f{i:05}.py")), "").is_ok());
    }
    let want: Vec<Value> = (0..5_000)
        .map(|i| json!({"path": format!("/workspace/repo/m/f{i:05}.py"), "is_dir": false}))
        .collect();
    let (s, r) = h
        .fs(
            &id,
            "glob",
            json!({"path": "/workspace/repo", "pattern": "**/*.py"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(r, json!({"matches": want, "error": null}));
    let (s, r) = h.fs(&id, "ls", json!({"path": "/workspace/repo/m"})).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(r, json!({"entries": want, "error": null}));
    // One more entry is over the bound.
    assert!(std::fs::write(dir.join("g.py"), "").is_ok());
    for (op, key) in [("glob", "matches"), ("ls", "entries")] {
        let body = json!({"path": "/workspace/repo/m", "pattern": "*"});
        let (s, r) = h.fs(&id, op, body).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(r[key], json!([]), "{op}");
        assert_eq!(r["error"]["code"], "too_large", "{op}: {r}");
    }
    // The service still answers small listings on the session.
    let (_, r) = h
        .fs(
            &id,
            "glob",
            json!({"path": "/workspace/repo", "pattern": "m"}),
        )
        .await;
    assert_eq!(
        r,
        json!({"matches": [{"path": "/workspace/repo/m", "is_dir": true}], "error": null})
    );
}
