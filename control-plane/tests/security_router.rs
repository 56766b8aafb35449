//! In-process tests of what a hostile client may give a create: image references that would
//! reach another deployment's snapshot, and environment a committed image could carry.

mod harness;

use axum::http::StatusCode;
use serde_json::json;

use harness::Harness;

#[tokio::test]
async fn base_image_is_a_repository_reference_never_an_id_or_a_snapshot() {
    let h = Harness::default();
    let full = "f".repeat(64);
    for (image, status) in [
        (format!("sha256:{full}"), StatusCode::UNPROCESSABLE_ENTITY),
        ("sha256:abc".to_string(), StatusCode::UNPROCESSABLE_ENTITY),
        (full.clone(), StatusCode::UNPROCESSABLE_ENTITY),
        (
            format!("daiv-sandbox-snapshot:{full}"),
            StatusCode::BAD_REQUEST,
        ),
        (
            "docker.io/library/daiv-sandbox-snapshot".into(),
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let (s, b) = h
            .api("POST", "/session/", Some(json!({"base_image": image})))
            .await;
        assert_eq!(s, status, "{image}: {b}");
        assert!(
            b["detail"]
                .as_str()
                .is_some_and(|d| d.contains("base_image")),
            "{b}"
        );
    }
    // A snapshot's image under any other name (an operator's retag) is refused as well.
    h.engine.set_image_labels(
        "retagged:1",
        &[
            ("daiv.sandbox.role", "snapshot"),
            ("daiv.sandbox.snapshot", "x"),
        ],
    );
    let (s, b) = h
        .api(
            "POST",
            "/session/",
            Some(json!({"base_image": "retagged:1"})),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{b}");
    assert!(
        b["detail"]
            .as_str()
            .is_some_and(|d| d.contains("snapshot_id")),
        "{b}"
    );
    assert!(
        !h.engine.calls().iter().any(|c| c.starts_with("create ")),
        "{:?}",
        h.engine.calls()
    );
    // An ordinary image still makes a session.
    let (s, b) = h
        .api("POST", "/session/", Some(json!({"base_image": "abc"})))
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    // Its skeleton empties the claimed-environment file whatever the image held there.
    let id = b["session_id"].as_str().expect("id");
    let skeleton = h
        .engine
        .spec(id)
        .and_then(|s| s.skeleton_archive().expect("readable"))
        .expect("skeleton");
    let mut archive = tar::Archive::new(&skeleton[..]);
    let env_file = control_plane::layout::ENV_FILE.trim_start_matches('/');
    let mut found = None;
    for entry in archive.entries().expect("tar") {
        let mut entry = entry.expect("entry");
        if entry.path().expect("path").to_str() == Some(env_file) {
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut data).expect("read");
            found = Some((data, entry.header().uid().expect("uid")));
        }
    }
    assert_eq!(found, Some((b"[]".to_vec(), 0)));
}
