//! In-process tests of snapshots and forks over the fake engine (its images and volumes with
//! content: `engine/src/fake/layers.rs`) and a host build of the real helper: what a snapshot
//! keeps, what a session and a fork from it see, that the source is thawed and untouched, and
//! that a snapshot that fails or is deleted leaves nothing of itself. What Docker itself does
//! (the commit, the overlay mount, gVisor's sync) is tested end to end in `e2e`.

#![allow(clippy::unwrap_used)]

mod harness;

use axum::http::StatusCode;
use control_plane::engine::{ContainerEngine, ContainerStatus};
use serde_json::{Value, json};

use harness::Harness;

/// Writes `text` to a new file `/workspace/repo/<name>` (a write never replaces a file).
async fn write(h: &Harness, id: &str, name: &str, text: &str) {
    use base64::Engine as _;
    let content = base64::engine::general_purpose::STANDARD.encode(text);
    let (s, b) = h
        .api(
            "POST",
            &format!("/session/{id}/fs/write/"),
            Some(json!({"path": format!("/workspace/repo/{name}"), "content": content})),
        )
        .await;
    assert_eq!((s, &b["ok"]), (StatusCode::OK, &json!(true)), "{b}");
}

/// `/workspace/repo/<name>` as `fs/read` answers it (its JSON, error or not).
async fn read(h: &Harness, id: &str, name: &str) -> String {
    let (s, b) = h
        .api(
            "POST",
            &format!("/session/{id}/fs/read/"),
            Some(json!({"path": format!("/workspace/repo/{name}")})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    b.to_string()
}

async fn snapshot(h: &Harness, id: &str, body: Value) -> String {
    snapshot_answer(h, id, body).await["snapshot_id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// `POST /session/{id}/snapshot/`, insisting on 201: its answer.
async fn snapshot_answer(h: &Harness, id: &str, body: Value) -> Value {
    let (s, b) = h
        .api("POST", &format!("/session/{id}/snapshot/"), Some(body))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    b
}

/// Volumes and images of snapshots (records, data, copy-on-write workspaces) that exist.
fn snapshot_objects(h: &Harness) -> Vec<String> {
    // Not a session's anonymous volumes (Docker names them with 64 hex digits).
    let anonymous = |v: &String| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit());
    let mut all: Vec<String> = h
        .engine
        .volumes()
        .into_iter()
        .filter(|v| !anonymous(v))
        .collect();
    all.extend(h.engine.images());
    all.sort();
    all
}

/// Deletes `snapshots`, then `sessions` (their containers made old enough for the sweep), and
/// sweeps a month later.
async fn delete_all_and_sweep<'a>(
    h: &Harness,
    snapshots: impl IntoIterator<Item = &'a String>,
    sessions: impl IntoIterator<Item = &'a String>,
) {
    for id in snapshots {
        let (s, _) = h.api("DELETE", &format!("/snapshots/{id}/"), None).await;
        assert_eq!(s, StatusCode::NO_CONTENT);
    }
    for id in sessions {
        let (s, b) = h.api("DELETE", &format!("/session/{id}/"), None).await;
        assert!(s.is_success(), "{s} {b}");
        h.engine
            .set_times(id, Some(0), Some("2026-01-01T00:00:00Z"));
    }
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(30 * 86_400);
    // A session whose lock was held at that instant is the next sweep's, as in production.
    for _ in 0..5 {
        let out = h.cell().reaper().sweep(later).await.unwrap();
        if out.busy.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_snapshot_keeps_the_workspace_and_sessions_and_forks_start_from_it() {
    let h = Harness::default();
    let source = h.session().await;
    write(&h, &source, "kept.txt", "kept by the snapshot").await;
    let sid = snapshot(&h, &source, json!({"name": "first"})).await;
    // The source was frozen for it and is thawed, and goes on on its own.
    assert_eq!(h.engine.status(&source), Some(ContainerStatus::Running));
    write(&h, &source, "after.txt", "written after").await;

    let (s, b) = h.api("GET", "/snapshots/", None).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let listed = &b["snapshots"];
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{b}");
    assert_eq!(listed[0]["snapshot_id"], json!(sid));
    assert_eq!(listed[0]["name"], json!("first"));
    assert_eq!(listed[0]["source_session_id"], json!(source));
    let (s, one) = h.api("GET", &format!("/snapshots/{sid}/"), None).await;
    assert_eq!((s, &one["snapshot_id"]), (StatusCode::OK, &json!(sid)));

    // A session from it sees the workspace as it was, not what the source wrote after.
    let from = h.create(json!({"snapshot_id": sid})).await;
    assert!(
        read(&h, &from, "kept.txt")
            .await
            .contains("kept by the snapshot")
    );
    assert!(read(&h, &from, "after.txt").await.contains("not_found"));
    write(&h, &from, "own.txt", "the new session's own").await;
    assert!(read(&h, &source, "own.txt").await.contains("not_found"));

    // Forks see the source as it is now, each its own copy.
    let (s, b) = h
        .api(
            "POST",
            &format!("/session/{source}/fork/"),
            Some(json!({"count": 2})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let forks: Vec<String> = b["session_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(forks.len(), 2, "{b}");
    for fork in &forks {
        assert!(read(&h, fork, "after.txt").await.contains("written after"));
        assert!(
            read(&h, fork, "kept.txt")
                .await
                .contains("kept by the snapshot")
        );
    }
    write(&h, &forks[0], "first.txt", "only the first fork's").await;
    assert!(read(&h, &forks[1], "first.txt").await.contains("not_found"));
    assert!(read(&h, &source, "first.txt").await.contains("not_found"));
    // A fork's snapshot has no record: the list holds the API's snapshot only.
    let (_, b) = h.api("GET", "/snapshots/", None).await;
    assert_eq!(b["snapshots"].as_array().map(Vec::len), Some(1), "{b}");

    // Deleted, it is gone from the API; the session made from it keeps working.
    let (s, b) = h.api("DELETE", &format!("/snapshots/{sid}/"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{b}");
    let (s, _) = h.api("GET", &format!("/snapshots/{sid}/"), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(
        read(&h, &from, "own.txt")
            .await
            .contains("the new session's own")
    );
    let (s, b) = h
        .api("POST", "/session/", Some(json!({"snapshot_id": sid})))
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{b}");
}

#[tokio::test]
async fn a_snapshot_that_fails_leaves_nothing_and_thaws_its_session() {
    let h = Harness::default();
    let id = h.session().await;
    write(&h, &id, "here.txt", "still here").await;
    let before = snapshot_objects(&h);
    // A snapshot commits, or names its base image: either failing fails it.
    h.engine.fail_on("commit ");
    h.engine.fail_on("tag_image ");
    let (s, b) = h
        .api("POST", &format!("/session/{id}/snapshot/"), Some(json!({})))
        .await;
    assert!(s.is_server_error(), "{s} {b}");
    h.engine.heal();
    // Neither its volumes nor a holder container nor an image is left, and nothing is listed.
    assert_eq!(snapshot_objects(&h), before);
    let holders = h
        .engine
        .container_ids()
        .into_iter()
        .filter(|c| {
            h.engine.spec(c).is_some_and(|s| {
                s.labels.get("daiv.sandbox.role").map(String::as_str) == Some("snapshot-holder")
            })
        })
        .count();
    assert_eq!(holders, 0);
    let (_, b) = h.api("GET", "/snapshots/", None).await;
    assert_eq!(b["snapshots"], json!([]), "{b}");
    // The session was thawed and serves as before.
    assert_eq!(h.engine.status(&id), Some(ContainerStatus::Running));
    assert!(read(&h, &id, "here.txt").await.contains("still here"));
    // A fork that fails the same way makes no session.
    let (s0, _) = h.api("GET", "/sessions/", None).await;
    assert_eq!(s0, StatusCode::OK);
    // A snapshot commits, or names its base image: either failing fails it.
    h.engine.fail_on("commit ");
    h.engine.fail_on("tag_image ");
    let (s, b) = h
        .api(
            "POST",
            &format!("/session/{id}/fork/"),
            Some(json!({"count": 2})),
        )
        .await;
    assert!(s.is_server_error(), "{s} {b}");
    h.engine.heal();
    assert_eq!(snapshot_objects(&h), before);
    let (_, b) = h.api("GET", "/sessions/", None).await;
    assert_eq!(b["sessions"].as_array().map(Vec::len), Some(1), "{b}");
}

#[tokio::test]
async fn a_deleted_snapshot_and_its_sessions_leave_no_volume_or_image() {
    let h = Harness::default();
    let source = h.session().await;
    write(&h, &source, "seeded.txt", "seeded before the snapshot").await;
    let before = snapshot_objects(&h);
    let sid = snapshot(&h, &source, json!({})).await;
    let from = h.create(json!({"snapshot_id": sid})).await;
    assert!(
        read(&h, &from, "seeded.txt")
            .await
            .contains("seeded before the snapshot")
    );
    assert_ne!(snapshot_objects(&h), before);
    let (s, b) = h.api("DELETE", &format!("/session/{from}/"), None).await;
    assert!(s.is_success(), "{s} {b}");
    let (s, b) = h.api("DELETE", &format!("/snapshots/{sid}/"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{b}");
    // What a delete leaves to the reaper (a stopped container and its workspace, the payload it
    // used) is collected by its sweep once past its grace.
    h.engine
        .set_times(&from, Some(0), Some("2026-01-01T00:00:00Z"));
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(30 * 86_400);
    h.cell().reaper().sweep(later).await.unwrap();
    assert_eq!(snapshot_objects(&h), before);
}

#[tokio::test]
async fn a_session_from_a_snapshot_whose_image_went_is_the_snapshots_404_and_leaves_nothing() {
    let h = Harness::default();
    let source = h.session().await;
    let sid = snapshot(&h, &source, json!({})).await;
    let before = snapshot_objects(&h);
    // Its image removed behind the service's back (another replica's delete, an operator).
    let image = h
        .engine
        .images()
        .into_iter()
        .find(|i| i.contains(&sid))
        .unwrap();
    h.engine.remove_image(&image).await.unwrap();
    let (s, b) = h
        .api("POST", "/session/", Some(json!({"snapshot_id": sid})))
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{b}");
    assert!(
        b["detail"].as_str().is_some_and(|d| d.contains("napshot")),
        "the snapshot's 404, not a session's: {b}"
    );
    // Its copy-on-write workspace was made and removed again.
    let mut left = before;
    left.retain(|o| *o != image);
    assert_eq!(snapshot_objects(&h), left);
}

/// Deletes `/workspace/repo/<name>`.
async fn delete(h: &Harness, id: &str, name: &str) {
    let (s, b) = h
        .api(
            "POST",
            &format!("/session/{id}/fs/delete/"),
            Some(json!({"path": format!("/workspace/repo/{name}")})),
        )
        .await;
    assert_eq!((s, &b["removed"]), (StatusCode::OK, &json!(true)), "{b}");
}

/// The regular files (and whiteouts) a snapshot's own layer holds, relative to it.
fn layer_files(h: &Harness, snapshot: &str) -> Vec<String> {
    fn walk(dir: &std::path::Path, rel: &str, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let name = format!("{rel}{}", e.file_name().to_string_lossy());
            if e.file_type().unwrap().is_dir() {
                walk(&e.path(), &format!("{name}/"), out);
            } else {
                out.push(name);
            }
        }
    }
    let mut out = Vec::new();
    let dir = h
        .engine
        .volume_dir(&format!("daiv-snapshot-{snapshot}-data"));
    walk(&dir, "", &mut out);
    // A state layer holds the workspace under its key: its files as the workspace's.
    let mut out: Vec<String> = out
        .into_iter()
        .map(|f| {
            f.strip_prefix("workspace/")
                .map_or(f.clone(), str::to_string)
        })
        .collect();
    out.sort();
    out
}

/// Three generations: each snapshot of a session from a snapshot is a layer of what that
/// session changed (a file deleted stays deleted, a file written is there), over the layers of
/// the snapshot it came from, which stay while anything above them needs them, whoever deleted
/// their snapshot. Everything goes once every snapshot and session does.
#[tokio::test]
async fn a_snapshot_of_a_session_from_a_snapshot_is_a_layer_of_its_changes() {
    let h = Harness::default();
    let before = snapshot_objects(&h);
    let first = h.session().await;
    write(&h, &first, "a.txt", "a from the first").await;
    write(&h, &first, "b.txt", "b from the first").await;
    let s1 = snapshot(&h, &first, json!({})).await;
    assert!(layer_files(&h, &s1).contains(&"repo/b.txt".to_string()));

    let second = h.create(json!({"snapshot_id": s1})).await;
    delete(&h, &second, "a.txt").await;
    write(&h, &second, "c.txt", "c from the second").await;
    let s2 = snapshot(&h, &second, json!({})).await;
    // Its copier is gone with the copy.
    let copiers = h
        .engine
        .list(&[("daiv.sandbox.role", "layer-copier")])
        .await
        .unwrap();
    assert!(copiers.is_empty(), "{copiers:?}");
    // Its own layer: the new file and the deletion, nothing of the first's.
    let layer = layer_files(&h, &s2);
    assert!(layer.contains(&"repo/c.txt".to_string()), "{layer:?}");
    assert!(!layer.contains(&"repo/b.txt".to_string()), "{layer:?}");
    assert!(layer.contains(&"repo/.wh.a.txt".to_string()), "{layer:?}");
    assert!(!layer.contains(&"repo/a.txt".to_string()), "{layer:?}");

    // The first snapshot deleted: its layer stays under the second's.
    let (s, _) = h.api("DELETE", &format!("/snapshots/{s1}/"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let third = h.create(json!({"snapshot_id": s2})).await;
    assert!(read(&h, &third, "a.txt").await.contains("not_found"));
    assert!(read(&h, &third, "b.txt").await.contains("b from the first"));
    assert!(
        read(&h, &third, "c.txt")
            .await
            .contains("c from the second")
    );
    write(&h, &third, "d.txt", "d from the third").await;
    let (s, b) = h
        .api(
            "POST",
            &format!("/session/{third}/fork/"),
            Some(json!({"count": 1})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let fork = b["session_ids"][0].as_str().unwrap().to_string();
    assert!(read(&h, &fork, "a.txt").await.contains("not_found"));
    for (name, text) in [
        ("b.txt", "b from the first"),
        ("c.txt", "c from the second"),
        ("d.txt", "d from the third"),
    ] {
        assert!(read(&h, &fork, name).await.contains(text), "{name}");
    }

    // Every snapshot and session gone, the sweep leaves nothing of them.
    delete_all_and_sweep(&h, [&s2], [&first, &second, &third, &fork]).await;
    assert_eq!(snapshot_objects(&h), before);
}

/// The layers below snapshot `id`'s own, as its data volume's label lists them.
async fn lowers(h: &Harness, id: &str) -> String {
    h.engine
        .inspect_volume(&format!("daiv-snapshot-{id}-data"))
        .await
        .unwrap()
        .labels
        .get("daiv.sandbox.snapshot.lowers")
        .cloned()
        .unwrap_or_default()
}

/// A chain of sessions from snapshots deeper than an overlay stacks: the snapshot that would
/// be the 17th layer is a new base layer of the session's whole view instead (deletions
/// applied), which a session from it sees whole, and the layers below it go with their
/// snapshots.
#[tokio::test]
async fn past_sixteen_layers_a_snapshot_is_a_new_base_layer_of_the_sessions_view() {
    let h = Harness::default();
    let before = snapshot_objects(&h);
    let first = h.session().await;
    write(&h, &first, "gone.txt", "deleted in the second").await;
    let mut snapshots = vec![snapshot(&h, &first, json!({})).await];
    let mut sessions = vec![first];
    for n in 1..=16 {
        let s = h.create(json!({"snapshot_id": snapshots[n - 1]})).await;
        if n == 1 {
            delete(&h, &s, "gone.txt").await;
        }
        write(&h, &s, &format!("g{n}.txt"), &format!("generation {n}")).await;
        snapshots.push(snapshot(&h, &s, json!({})).await);
        sessions.push(s);
    }
    // The 16th is a layer over 15; the 17th, a base layer of everything.
    assert_eq!(lowers(&h, &snapshots[15]).await.split(',').count(), 15);
    assert_eq!(lowers(&h, &snapshots[16]).await, "");
    let top = layer_files(&h, &snapshots[16]);
    assert_eq!(top.len(), 16, "{top:?}");
    assert!(!top.iter().any(|f| f.contains("gone") || f.contains(".wh.")));
    let last = h.create(json!({"snapshot_id": snapshots[16]})).await;
    assert!(read(&h, &last, "gone.txt").await.contains("not_found"));
    for n in 1..=16 {
        assert!(
            read(&h, &last, &format!("g{n}.txt"))
                .await
                .contains(&format!("generation {n}"))
        );
    }

    delete_all_and_sweep(&h, &snapshots, sessions.iter().chain([&last])).await;
    assert_eq!(snapshot_objects(&h), before);
}

/// A chain of sessions from snapshots far deeper than an overlay stacks: a snapshot over
/// `FLATTEN_AT - 1` layers queues the stack below it, which the flattener (run here as the
/// stack's task runs it) copies into a flat base layer; from then on stacks through it end
/// there, so every snapshot stays a layer of its session's changes alone, however deep the
/// chain, and a session from the last sees every generation with the deletion still applied.
/// Everything goes with the snapshots and sessions.
#[tokio::test]
async fn deep_stacks_are_flattened_off_the_request_path_and_every_snapshot_stays_a_layer() {
    let h = Harness::default();
    let before = snapshot_objects(&h);
    let first = h.session().await;
    write(&h, &first, "gone.txt", "deleted in the second").await;
    let mut snapshots = vec![snapshot(&h, &first, json!({})).await];
    let mut sessions = vec![first];
    let at = control_plane::snapshots::FLATTEN_AT;
    let mut flattened = 0;
    for n in 1..=24 {
        let s = h.create(json!({"snapshot_id": snapshots[n - 1]})).await;
        if n == 1 {
            delete(&h, &s, "gone.txt").await;
        }
        write(&h, &s, &format!("g{n}.txt"), &format!("generation {n}")).await;
        snapshots.push(snapshot(&h, &s, json!({})).await);
        sessions.push(s);
        flattened += h.cell().snapshots().flatten_pending().await;
        let below = lowers(&h, &snapshots[n]).await;
        assert!(
            !below.is_empty() && below.split(',').count() < at,
            "generation {n}: {below}"
        );
        if n > 1 {
            assert_eq!(layer_files(&h, &snapshots[n]), [format!("repo/g{n}.txt")]);
        }
    }
    // One flat copy every `FLATTEN_AT - 2` generations past the first stack.
    assert!(flattened >= 3, "{flattened} stacks flattened");
    let markers = h
        .engine
        .volumes()
        .into_iter()
        .filter(|v| v.ends_with("-flat"))
        .count();
    assert_eq!(markers, flattened);
    let last = h.create(json!({"snapshot_id": snapshots[24]})).await;
    assert!(read(&h, &last, "gone.txt").await.contains("not_found"));
    for n in 1..=24 {
        assert!(
            read(&h, &last, &format!("g{n}.txt"))
                .await
                .contains(&format!("generation {n}")),
            "g{n}.txt"
        );
    }

    delete_all_and_sweep(&h, &snapshots, sessions.iter().chain([&last])).await;
    assert_eq!(snapshot_objects(&h), before);
}

/// An engine that gives copies now (here, a replica started with `SNAPSHOT_LAYERS=copy` over
/// the same engine) snapshots a session made as an overlay over layers as its whole view, a
/// base layer it can copy, rather than a layer a session there could not mount.
#[tokio::test]
async fn a_session_layered_before_an_engine_gives_copies_snapshots_as_a_base_layer() {
    let engine = control_plane::engine::fake::FakeEngine::default();
    let overlays = Harness::new(engine.clone(), &[]);
    let first = overlays.session().await;
    write(&overlays, &first, "a.txt", "a").await;
    write(&overlays, &first, "gone.txt", "deleted later").await;
    let s1 = snapshot(&overlays, &first, json!({})).await;
    let layered = overlays.create(json!({"snapshot_id": s1})).await;
    delete(&overlays, &layered, "gone.txt").await;
    write(&overlays, &layered, "b.txt", "b from the layered session").await;

    let copies = Harness::new(engine, &[("SNAPSHOT_LAYERS", "copy")]);
    let s2 = snapshot(&copies, &layered, json!({})).await;
    assert_eq!(layer_files(&copies, &s2), ["repo/a.txt", "repo/b.txt"]);
    let from = copies.create(json!({"snapshot_id": s2})).await;
    assert!(
        read(&copies, &from, "b.txt")
            .await
            .contains("b from the layered session")
    );
    assert!(read(&copies, &from, "gone.txt").await.contains("not_found"));
}

/// What `GET /engines/` and `/-/health/` say of the engine's snapshot layers.
async fn layer_reports(h: &Harness) -> (Value, Value) {
    let (s, engines) = h.api("GET", "/engines/", None).await;
    assert_eq!(s, StatusCode::OK, "{engines}");
    let (s, health) = h.api("GET", "/-/health/", None).await;
    assert_eq!(s, StatusCode::OK, "{health}");
    let engine = &engines["engines"][0]["snapshot_layers"];
    // The health check counts the engines by mode (their names are behind the key).
    let mode = engine["mode"].as_str().unwrap();
    assert_eq!(health["snapshot_layers"], json!({ mode: 1 }), "{health}");
    (engine.clone(), health["snapshot_layers"].clone())
}

/// On an engine whose kernel cannot mount overlay volumes, its probe says so (in
/// `GET /engines/` and `/-/health/`), and sessions from snapshots get a copy of the snapshot's
/// layer instead: they start (an overlay workspace would not), see the snapshot's files, and
/// their own snapshots and forks are base layers of their whole workspace. Nothing of the
/// probe, the copies or the copiers is left once everything is deleted.
#[tokio::test]
async fn an_engine_that_cannot_mount_overlays_gives_sessions_from_snapshots_copies_and_says_so() {
    let h = Harness::default();
    h.engine.fail_overlay_mounts();
    let before = snapshot_objects(&h);
    let (engines, health) = layer_reports(&h).await;
    assert_eq!(engines["mode"], "unknown", "{engines}");
    assert_eq!(health, json!({"unknown": 1}));

    let first = h.session().await;
    write(&h, &first, "a.txt", "a from the first").await;
    write(&h, &first, "b.txt", "b from the first").await;
    let s1 = snapshot(&h, &first, json!({})).await;
    let second = h.create(json!({"snapshot_id": s1})).await;
    let (engines, health) = layer_reports(&h).await;
    assert_eq!(engines["mode"], "copies", "{engines}");
    assert!(
        engines["reason"]
            .as_str()
            .unwrap()
            .contains("does not mount"),
        "{engines}"
    );
    assert_eq!(health, json!({"copies": 1}));
    assert!(
        read(&h, &second, "a.txt")
            .await
            .contains("a from the first")
    );

    delete(&h, &second, "a.txt").await;
    write(&h, &second, "c.txt", "c from the second").await;
    let s2 = snapshot(&h, &second, json!({})).await;
    // A base layer: the whole workspace, no whiteout, nothing below it.
    let layer = layer_files(&h, &s2);
    assert_eq!(layer, ["repo/b.txt", "repo/c.txt"], "{layer:?}");
    let (s, _) = h.api("DELETE", &format!("/snapshots/{s1}/"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, b) = h
        .api(
            "POST",
            &format!("/session/{second}/fork/"),
            Some(json!({"count": 2})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let forks: Vec<String> = b["session_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let third = h.create(json!({"snapshot_id": s2})).await;
    for id in forks.iter().chain([&third]) {
        assert!(read(&h, id, "a.txt").await.contains("not_found"), "{id}");
        assert!(read(&h, id, "b.txt").await.contains("b from the first"));
        assert!(read(&h, id, "c.txt").await.contains("c from the second"));
    }

    delete_all_and_sweep(
        &h,
        [&s2],
        [&first, &second, &third].into_iter().chain(&forks),
    )
    .await;
    assert_eq!(snapshot_objects(&h), before);
    for role in ["layer-probe", "layer-copier"] {
        let left = h.engine.list(&[("daiv.sandbox.role", role)]).await.unwrap();
        assert!(left.is_empty(), "{role}: {left:?}");
    }
}

/// Where overlays mount, the probe says so once a session from a snapshot made it run; an
/// operator's `SNAPSHOT_LAYERS=copy` says copies from the start, and is obeyed.
#[tokio::test]
async fn the_layer_probe_reports_overlays_and_an_operator_may_ask_for_copies() {
    let h = Harness::default();
    let first = h.session().await;
    write(&h, &first, "a.txt", "a").await;
    let s1 = snapshot(&h, &first, json!({})).await;
    h.create(json!({"snapshot_id": s1})).await;
    let (engines, health) = layer_reports(&h).await;
    assert_eq!(engines, json!({"mode": "overlay"}));
    assert_eq!(health, json!({"overlay": 1}));

    let h = Harness::new(
        control_plane::engine::fake::FakeEngine::default(),
        &[("SNAPSHOT_LAYERS", "copy")],
    );
    let (engines, _) = layer_reports(&h).await;
    assert_eq!(
        engines,
        json!({"mode": "copies", "reason": "DAIV_SANDBOX_SNAPSHOT_LAYERS=copy"})
    );
    let first = h.session().await;
    write(&h, &first, "a.txt", "a").await;
    let s1 = snapshot(&h, &first, json!({})).await;
    let second = h.create(json!({"snapshot_id": s1})).await;
    write(&h, &second, "b.txt", "b").await;
    let s2 = snapshot(&h, &second, json!({})).await;
    assert_eq!(layer_files(&h, &s2), ["repo/a.txt", "repo/b.txt"]);
}

/// Snapshot `s1` of a fresh session, then `s2` of a session from it (a layer over `s1`'s);
/// their sizes.
async fn two_layers(h: &Harness) -> (String, String, u64, u64) {
    let first = h.session().await;
    write(h, &first, "a.txt", "a from the first").await;
    write(h, &first, "b.txt", "b from the first").await;
    let one = snapshot_answer(h, &first, json!({})).await;
    let s1 = one["snapshot_id"].as_str().unwrap().to_string();
    let second = h.create(json!({"snapshot_id": s1})).await;
    write(h, &second, "c.txt", "c from the second").await;
    let two = snapshot_answer(h, &second, json!({})).await;
    let s2 = two["snapshot_id"].as_str().unwrap().to_string();
    let size = |v: &Value| v["size_bytes"].as_u64().unwrap();
    (s1, s2, size(&one), size(&two))
}

/// A deleted snapshot whose layer another snapshot still stands on keeps counting against the
/// deployment's byte cap: deleting it frees no disk, so it makes no room.
#[tokio::test]
async fn a_deleted_snapshots_layer_still_held_counts_against_the_deployments_cap() {
    let measure = Harness::default();
    let (_, _, one, two) = two_layers(&measure).await;
    let cap = (one + two + 1).to_string();
    let h = Harness::new(
        control_plane::engine::fake::FakeEngine::default(),
        &[("SNAPSHOT_MAX_BYTES", cap.as_str())],
    );
    let (s1, _s2, ..) = two_layers(&h).await;
    let (s, _) = h.api("DELETE", &format!("/snapshots/{s1}/"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert!(
        h.engine
            .volumes()
            .contains(&format!("daiv-snapshot-{s1}-held")),
        "{:?}",
        h.engine.volumes()
    );
    // A small snapshot would fit beside the second alone; not beside the layer it holds.
    let third = h.session().await;
    write(&h, &third, "x.txt", "x").await;
    let (s, b) = h
        .api(
            "POST",
            &format!("/session/{third}/snapshot/"),
            Some(json!({})),
        )
        .await;
    assert_eq!(s, StatusCode::INSUFFICIENT_STORAGE, "{b}");
}

/// The host directory of the volume session `id` mounts at `at`.
async fn mounted(h: &Harness, id: &str, at: &str) -> std::path::PathBuf {
    let info = h.engine.inspect(id).await.unwrap();
    let (_, name) = info.volumes.iter().find(|(m, _)| m == at).unwrap();
    h.engine.volume_dir(name)
}

/// With `SNAPSHOT_STATE=volumes` a session keeps home and the temporary directories on volumes
/// of its own, like its workspace: a snapshot holds each under its key, a later one only what
/// changed (a deletion as a whiteout), a session from it sees them all, and no image is
/// committed (the snapshot's image is its base's, by another name). An image where the sandbox
/// user can write elsewhere is committed as before. Everything goes with the snapshots.
#[tokio::test]
async fn state_sessions_keep_home_and_tmp_as_layers_and_commit_nothing() {
    let engine = control_plane::engine::fake::FakeEngine::default();
    let h = Harness::new(engine.clone(), &[("SNAPSHOT_STATE", "volumes")]);
    let before = snapshot_objects(&h);
    let first = h.session().await;
    for at in [
        "/workspace",
        "/home/sandbox",
        "/tmp",
        "/var/tmp",
        "/run/lock",
    ] {
        assert!(mounted(&h, &first, at).await.is_dir(), "{at}");
    }
    write(&h, &first, "a.txt", "a").await;
    std::fs::write(
        mounted(&h, &first, "/home/sandbox").await.join("h.txt"),
        "h",
    )
    .unwrap();
    std::fs::write(mounted(&h, &first, "/tmp").await.join("gone"), "x").unwrap();
    let s1 = snapshot(&h, &first, json!({})).await;
    // Nothing of the container's own layer is kept, so it is not measured (Docker walks the
    // whole root filesystem for that).
    let measured = |id: &str| {
        let call = format!("writable_bytes {id}");
        h.engine.calls().iter().filter(|c| **c == call).count()
    };
    assert_eq!(measured(&first), 0);
    let files = layer_files(&h, &s1);
    for f in ["home/h.txt", "tmp/gone", "repo/a.txt"] {
        assert!(files.contains(&f.to_string()), "{f} not in {files:?}");
    }
    let data = h
        .engine
        .inspect_volume(&format!("daiv-snapshot-{s1}-data"))
        .await
        .unwrap();
    assert_eq!(data.labels["daiv.sandbox.snapshot.layout"], "state");
    // Nothing committed: the snapshot's image is the session's.
    let tagged = h
        .engine
        .inspect_image(&format!("daiv-sandbox-snapshot:{s1}"))
        .await
        .unwrap();
    let own = h.engine.inspect(&first).await.unwrap().image_id.unwrap();
    assert_eq!(tagged.id, own);
    // That name is no base image: a snapshot is reached by its id.
    let (s, b) = h
        .api(
            "POST",
            "/session/",
            Some(json!({"base_image": format!("daiv-sandbox-snapshot:{s1}")})),
        )
        .await;
    assert!(s.is_client_error(), "{s} {b}");

    let second = h.create(json!({"snapshot_id": s1})).await;
    assert!(read(&h, &second, "a.txt").await.contains("\"a\""));
    let home = mounted(&h, &second, "/home/sandbox").await;
    assert_eq!(std::fs::read_to_string(home.join("h.txt")).unwrap(), "h");
    std::fs::write(home.join("h2.txt"), "h2").unwrap();
    std::fs::remove_file(mounted(&h, &second, "/tmp").await.join("gone")).unwrap();
    let s2 = snapshot(&h, &second, json!({})).await;
    assert_eq!(layer_files(&h, &s2), ["home/h2.txt", "tmp/.wh.gone"]);
    let third = h.create(json!({"snapshot_id": s2})).await;
    let home = mounted(&h, &third, "/home/sandbox").await;
    assert_eq!(std::fs::read_to_string(home.join("h2.txt")).unwrap(), "h2");
    assert_eq!(std::fs::read_to_string(home.join("h.txt")).unwrap(), "h");
    assert!(!mounted(&h, &third, "/tmp").await.join("gone").exists());

    // Where the sandbox user can write outside its volumes, the snapshot commits.
    engine.set_writable_paths(&["/srv"]);
    let elsewhere = Harness::new(engine, &[("SNAPSHOT_STATE", "volumes")]);
    let s3 = snapshot(&elsewhere, &third, json!({})).await;
    let committed = elsewhere
        .engine
        .inspect_image(&format!("daiv-sandbox-snapshot:{s3}"))
        .await
        .unwrap();
    assert_eq!(committed.labels["daiv.sandbox.snapshot"], s3);
    // Measured, before the freeze and frozen: the commit keeps that layer.
    assert_eq!(measured(&third), 2);

    // A tag left without its layer (Docker refused to untag an image's only name while a
    // container used it) is the sweep's; a live snapshot's tag is not.
    let orphan = "daiv-sandbox-snapshot:0123456789abcdef0123456789abcdef";
    h.engine.tag_image(&own, orphan).await.unwrap();
    h.cell()
        .reaper()
        .sweep(std::time::SystemTime::now())
        .await
        .unwrap();
    assert!(h.engine.inspect_image(orphan).await.is_err());
    h.engine
        .inspect_image(&format!("daiv-sandbox-snapshot:{s2}"))
        .await
        .expect("a live snapshot's tag is kept");

    delete_all_and_sweep(&h, &[s1, s2, s3], [&first, &second, &third]).await;
    assert_eq!(snapshot_objects(&h), before);
}

/// The layer workers on the engine, by id.
async fn workers(h: &Harness) -> Vec<String> {
    let mut ids: Vec<String> = h
        .engine
        .list(&[(
            control_plane::engine::ROLE_LABEL,
            control_plane::snapshots::ROLE_LAYER_WORKER,
        )])
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.id)
        .collect();
    ids.sort();
    ids
}

/// Every snapshot of an image's sessions is copied by one long-lived worker (no container is
/// made for the second), which a worker removed behind the service's back does not break, and
/// which goes once idle; another replica's worker past twice the age limit is the sweep's.
#[tokio::test]
async fn one_layer_worker_copies_every_snapshot_of_an_image_and_goes_when_idle() {
    let engine = control_plane::engine::fake::FakeEngine::default();
    let h = Harness::new(engine.clone(), &[("SNAPSHOT_STATE", "volumes")]);
    let first = h.session().await;
    write(&h, &first, "a.txt", "a").await;
    let s1 = snapshot(&h, &first, json!({})).await;
    let made = workers(&h).await;
    assert_eq!(made.len(), 1, "{made:?}");
    let second = h.create(json!({"snapshot_id": s1})).await;
    write(&h, &second, "b.txt", "b").await;
    let creates = |h: &Harness| {
        h.engine
            .calls()
            .iter()
            .filter(|c| c.starts_with("create "))
            .count()
    };
    let before = creates(&h);
    let s2 = snapshot(&h, &second, json!({})).await;
    assert_eq!(creates(&h), before, "the second snapshot made a container");
    assert_eq!(workers(&h).await, made);
    assert_eq!(layer_files(&h, &s2), ["repo/b.txt"]);

    // Removed behind the service's back: the next snapshot gets a new one.
    h.engine.remove(&made[0]).await.unwrap();
    let third = h.create(json!({"snapshot_id": s2})).await;
    write(&h, &third, "c.txt", "c").await;
    let s3 = snapshot(&h, &third, json!({})).await;
    assert_eq!(layer_files(&h, &s3), ["repo/c.txt"]);
    let now = workers(&h).await;
    assert!(now.len() == 1 && now != made, "{now:?}");

    // Another replica's (it died): swept once past twice the age limit, not before; ours stays.
    let spec = control_plane::engine::ContainerSpec {
        labels: std::collections::HashMap::from([
            (
                control_plane::engine::MANAGED_LABEL.to_string(),
                "true".to_string(),
            ),
            (
                control_plane::engine::ROLE_LABEL.to_string(),
                control_plane::snapshots::ROLE_LAYER_WORKER.to_string(),
            ),
            (
                control_plane::engine::DEPLOYMENT_LABEL.to_string(),
                "default".to_string(),
            ),
        ]),
        ..control_plane::engine::ContainerSpec::for_tests("img")
    };
    let theirs = h.engine.create(&spec).await.unwrap();
    h.engine.start(&theirs).await.unwrap();
    let unix = |d: u64| {
        (std::time::SystemTime::now() - std::time::Duration::from_secs(d))
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    };
    h.engine.set_times(&theirs, Some(unix(30 * 60)), None);
    let sweep = || async {
        h.cell()
            .reaper()
            .sweep(std::time::SystemTime::now())
            .await
            .unwrap();
    };
    sweep().await;
    assert!(workers(&h).await.contains(&theirs), "swept too young");
    h.engine.set_times(&theirs, Some(unix(2 * 60 * 60)), None);
    sweep().await;
    assert_eq!(workers(&h).await, now);

    // Idle (here: the shutdown's "all"), it goes.
    h.cell().snapshots().retire_idle_workers(true).await;
    assert!(workers(&h).await.is_empty());
    delete_all_and_sweep(&h, &[s1, s2, s3], [&first, &second, &third]).await;
}
