//! In-process tests of the data plane's routes over the fake engine and a host build of the
//! real helper: raw files up and down (whole, ranges, gzip), the statuses of their refusals, and
//! `fs/stat`, `fs/mkdir`, `fs/move`, `fs/list` on paths anywhere. What the sandbox user may do
//! in a real container (permissions, the service directory) is tested end to end in `e2e`.

#![allow(clippy::unwrap_used)]

mod harness;

use std::io::Read;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};

use harness::{Harness, KEY};

async fn raw(
    h: &Harness,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
    let mut req = Request::builder()
        .method(method)
        .uri(format!("/api/v1{uri}"))
        .header("x-api-key", KEY);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = h.send(req.body(Body::from(body)).expect("request")).await;
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
        .to_vec();
    (status, headers, bytes)
}

fn json_of(b: &[u8]) -> Value {
    serde_json::from_slice(b).unwrap_or(Value::Null)
}

#[tokio::test]
async fn raw_files_go_up_and_down_with_ranges_gzip_and_their_refusals() {
    let h = Harness::default();
    let id = h.session().await;
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    let uri = format!("/session/{id}/files?path=/workspace/tmp/deep/new/blob.bin");
    let (s, _, b) = raw(&h, "PUT", &uri, &[], data.clone()).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    assert_eq!(json_of(&b), json!({"bytes": 200_000, "error": null}));

    let (s, hd, b) = raw(&h, "GET", &uri, &[], vec![]).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(hd["content-length"], "200000");
    assert_eq!(hd["accept-ranges"], "bytes");
    assert_eq!(b, data);

    let (s, hd, b) = raw(&h, "GET", &uri, &[("range", "bytes=100-199")], vec![]).await;
    assert_eq!(s, StatusCode::PARTIAL_CONTENT);
    assert_eq!(hd["content-range"], "bytes 100-199/200000");
    assert_eq!(b, &data[100..200]);
    let (s, _, b) = raw(&h, "GET", &uri, &[("range", "bytes=-10")], vec![]).await;
    assert_eq!(s, StatusCode::PARTIAL_CONTENT);
    assert_eq!(b, &data[199_990..]);
    let (s, hd, b) = raw(&h, "GET", &uri, &[("range", "bytes=200000-")], vec![]).await;
    assert_eq!(s, StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(hd["content-range"], "bytes */200000");
    assert_eq!(json_of(&b)["code"], "invalid_range");

    let (s, hd, b) = raw(&h, "GET", &uri, &[("accept-encoding", "gzip")], vec![]).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(hd["content-encoding"], "gzip");
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(&b[..])
        .read_to_end(&mut plain)
        .expect("gzip");
    assert_eq!(plain, data);

    // Replaced whole; mode kept unless given.
    let (s, _, _) = raw(&h, "PUT", &format!("{uri}&mode=384"), &[], b"v2".to_vec()).await;
    assert_eq!(s, StatusCode::OK);
    let (_, _, b) = raw(&h, "GET", &uri, &[], vec![]).await;
    assert_eq!(b, b"v2");
    let (_, st) = h
        .api(
            "POST",
            &format!("/session/{id}/fs/stat"),
            Some(json!({"path": "/workspace/tmp/deep/new/blob.bin"})),
        )
        .await;
    assert_eq!(st["entry"]["mode"], 0o600, "{st}");
    assert_eq!(st["entry"]["permissions"], "-rw-------");

    // Refusals.
    let missing = format!("/session/{id}/files?path=/workspace/tmp/nope");
    let (s, _, b) = raw(&h, "GET", &missing, &[], vec![]).await;
    assert_eq!(
        (s, json_of(&b)["code"].clone()),
        (StatusCode::NOT_FOUND, json!("not_found"))
    );
    for bad in ["relative/x", "/workspace/../etc/passwd", "/a%00b"] {
        let (s, _, b) = raw(
            &h,
            "GET",
            &format!("/session/{id}/files?path={bad}"),
            &[],
            vec![],
        )
        .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
        assert_eq!(json_of(&b)["code"], "invalid_path", "{bad}");
    }
    let dir = format!("/session/{id}/files?path=/workspace/tmp");
    let (s, _, b) = raw(&h, "GET", &dir, &[], vec![]).await;
    assert_eq!(
        (s, json_of(&b)["code"].clone()),
        (StatusCode::CONFLICT, json!("is_a_directory"))
    );
    let no_parent = format!("/session/{id}/files?path=/workspace/tmp/a/b/c&parents=false");
    let (s, _, b) = raw(&h, "PUT", &no_parent, &[], b"x".to_vec()).await;
    assert_eq!(
        (s, json_of(&b)["code"].clone()),
        (StatusCode::NOT_FOUND, json!("not_found"))
    );
    let (s, _, _) = raw(&h, "GET", "/session/nosuch/files?path=/tmp/x", &[], vec![]).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_body_over_the_cap_is_refused_before_anything_is_written() {
    let h = Harness::new(
        control_plane::engine::fake::FakeEngine::default(),
        &[
            ("FILE_MAX_BYTES", "1024"),
            ("SESSION_LOCK_WAIT_SECONDS", "1"),
        ],
    );
    let id = h.session().await;
    let uri = format!("/session/{id}/files?path=/workspace/tmp/big");
    // Declared too large: refused at once, without waiting for a busy session (its lock held
    // elsewhere would make it a 409 after the lock's wait).
    let held = h.sessions().lock(&harness::sid(&id)).await.expect("lock");
    let (s, _, b) = raw(
        &h,
        "PUT",
        &uri,
        &[("content-length", "2048")],
        vec![0; 2048],
    )
    .await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(json_of(&b)["code"], "too_large");
    drop(held);
    let (s, _, _) = raw(&h, "GET", &uri, &[], vec![]).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "nothing was written");
    // Streamed without a length: cut where it passes the cap, nothing left behind.
    let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = (0..8)
        .map(|_| Ok(bytes::Bytes::from(vec![7u8; 512])))
        .collect();
    let req = Request::builder()
        .method("PUT")
        .uri(format!("/api/v1{uri}"))
        .header("x-api-key", KEY)
        .body(Body::from_stream(futures::stream::iter(chunks)))
        .expect("request");
    let resp = h.send(req).await;
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let (s, _, _) = raw(&h, "GET", &uri, &[], vec![]).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "nothing was written");
    let (_, v) = h
        .api(
            "POST",
            &format!("/session/{id}/fs/list"),
            Some(json!({"path": "/workspace/tmp"})),
        )
        .await;
    assert_eq!(v["entries"], json!([]), "no temporary file left: {v}");
}

#[tokio::test]
async fn stat_mkdir_move_and_list_answer_with_the_fs_tables_codes() {
    let h = Harness::default();
    let id = h.session().await;
    let op = |name: &str| format!("/session/{id}/fs/{name}");
    let (s, v) = h
        .api(
            "POST",
            &op("mkdir"),
            Some(json!({"path": "/workspace/tmp/a/b", "parents": true})),
        )
        .await;
    assert_eq!(
        (s, v.clone()),
        (
            StatusCode::OK,
            json!({"ok": true, "created": true, "error": null})
        )
    );
    let (_, v) = h
        .api(
            "POST",
            &op("mkdir"),
            Some(json!({"path": "/workspace/tmp/a/b"})),
        )
        .await;
    assert_eq!(v["error"]["code"], "already_exists");
    let (_, v) = h
        .api(
            "POST",
            &op("move"),
            Some(json!({"source": "/workspace/tmp/a", "destination": "/workspace/tmp/c"})),
        )
        .await;
    assert_eq!(v, json!({"ok": true, "error": null}));
    let (_, v) = h
        .api(
            "POST",
            &op("list"),
            Some(json!({"path": "/workspace/tmp", "depth": 2})),
        )
        .await;
    let paths: Vec<&str> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, vec!["/workspace/tmp/c", "/workspace/tmp/c/b"]);
    assert_eq!(v["entries"][0]["type"], "directory");
    let (_, v) = h
        .api(
            "POST",
            &op("stat"),
            Some(json!({"path": "/workspace/tmp/nope"})),
        )
        .await;
    assert_eq!(
        v,
        json!({"entry": null, "error": {"code": "not_found", "message": "/workspace/tmp/nope does not exist"}})
    );
    let (_, v) = h
        .api("POST", &op("stat"), Some(json!({"path": "tmp/x"})))
        .await;
    assert_eq!(v["error"]["code"], "invalid_path");
    // Anywhere: the host's /tmp here, the container's in a sandbox.
    let (_, v) = h.api("POST", &op("stat"), Some(json!({"path": "/"}))).await;
    assert_eq!(v["entry"]["type"], "directory", "{v}");
    // The seven ops stay confined to the workspace.
    let (_, v) = h
        .api("POST", &op("ls"), Some(json!({"path": "/tmp"})))
        .await;
    assert_eq!(v["error"]["code"], "invalid_path");
}

/// The data plane's ops are counted as the `fs/*` ops are (by op and outcome), and a file's mode
/// follows one rule wherever a request gives it (`PUT /files`, `fs/write`): up to 0o7777, of
/// which the permission bits are applied.
#[tokio::test]
async fn data_plane_ops_are_counted_and_a_mode_has_one_rule() {
    let h = Harness::default();
    let id = h.session().await;
    let op = |name: &str| format!("/session/{id}/fs/{name}");
    let (_, v) = h.api("POST", &op("stat"), Some(json!({"path": "/"}))).await;
    assert_eq!(v["entry"]["type"], "directory", "{v}");
    let (_, v) = h
        .api(
            "POST",
            &op("stat"),
            Some(json!({"path": "/workspace/tmp/nope"})),
        )
        .await;
    assert_eq!(v["error"]["code"], "not_found", "{v}");
    let (_, v) = h
        .api("POST", &op("list"), Some(json!({"path": "/workspace"})))
        .await;
    assert!(v["entries"].is_array(), "{v}");
    let (_, page) = h.call("GET", "/metrics", None, Some(KEY)).await;
    let page = page.as_str().unwrap_or_default().to_string();
    let counted = |op: &str, code: &str| {
        page.lines().any(|l| {
            l.starts_with("daiv_sandbox_fs_op_duration_seconds_count{")
                && l.contains(&format!("op=\"{op}\""))
                && l.contains(&format!("code=\"{code}\""))
                && !l.ends_with(" 0")
        })
    };
    assert!(counted("stat", "ok"), "{page}");
    assert!(counted("stat", "not_found"), "{page}");
    assert!(counted("list", "ok"), "{page}");

    // 0o4755 (2541): the permission bits only, by both routes.
    let put = format!("/session/{id}/files?path=/workspace/tmp/put.sh&mode=2541");
    let (s, _, b) = raw(&h, "PUT", &put, &[], b"#!/bin/sh\n".to_vec()).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    let (s, v) = h
        .api(
            "POST",
            &op("write"),
            Some(json!({"path": "/workspace/tmp/write.sh", "content": "IyEvYmluL3NoCg==", "mode": 2541})),
        )
        .await;
    assert_eq!(
        (s, v["error"].clone()),
        (StatusCode::OK, Value::Null),
        "{v}"
    );
    for path in ["/workspace/tmp/put.sh", "/workspace/tmp/write.sh"] {
        let (_, v) = h
            .api("POST", &op("stat"), Some(json!({"path": path})))
            .await;
        assert_eq!(v["entry"]["permissions"], "-rwxr-xr-x", "{path}: {v}");
    }
    // Past 0o7777: refused by both, with the same words.
    let put = format!("/session/{id}/files?path=/workspace/tmp/big.sh&mode=4096");
    let (s, _, b) = raw(&h, "PUT", &put, &[], b"x".to_vec()).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    let put_words = json_of(&b)["detail"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let (s, v) = h
        .api(
            "POST",
            &op("write"),
            Some(json!({"path": "/workspace/tmp/big2.sh", "content": "eA==", "mode": 4096})),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(v["detail"].as_str().unwrap_or_default(), put_words);
    assert!(put_words.contains("0o7777"), "{put_words}");
}
