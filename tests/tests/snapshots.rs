//! Snapshots, forks and pause (issue 23) against the real binary on real Docker: a session's whole
//! filesystem (its container's changes, such as `/home/sandbox`, and its `/workspace` volume)
//! kept at one instant and brought back with owners, modes, symlinks and its seeded state; forks
//! of a busy session, consistent and isolated; egress forks with gateways of their own, and
//! snapshots that never hold a secret; pause keeping processes and memory, thawed by the next
//! request; retention by TTL and count; deployments that never see each other's snapshots; and
//! nothing left behind once sessions and snapshots are gone (under runc, and under gVisor).
//!
//! Each test is a deployment of its own, removed by a guard whatever happens: snapshots outlive
//! their sessions, so the guard takes the deployment's images and volumes too.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use e2e::egress::{EgressSettings, Upstream, gateway_of, start_upstream};
use e2e::scan::{dir_contains, scan, scan_maybe_compressed, snapshot_contains};
use e2e::workspace::{Member, seed, tar_of};
use e2e::{
    BUSYBOX, ControlPlane, DEBIAN, DeploymentGuard, Session, containers_but_workers,
    containers_with, docker, eventually, images_with, inspect, require_image,
    volumes_but_shared_helper, volumes_with,
};
use reqwest::Method;
use serde_json::{Value, json};

const REPO: &str = "/workspace/repo";

/// Owner of the file put in the workspace behind the sandbox's back: neither root nor the
/// sandbox user (1000:1000), which cannot make it.
const OTHER_UID: u64 = 4242;
const OTHER_GID: u64 = 4243;

fn deployment(test: &str) -> String {
    format!("e2e-{}-snap-{test}", std::process::id())
}

/// A service of its own deployment. Fields drop in order: the service stops first, then the
/// guard removes everything labelled with the deployment (containers, networks, volumes,
/// images), pass or fail.
struct Svc {
    cp: ControlPlane,
    _guard: DeploymentGuard,
}

impl std::ops::Deref for Svc {
    type Target = ControlPlane;
    fn deref(&self) -> &ControlPlane {
        &self.cp
    }
}

impl Svc {
    fn label(&self) -> String {
        format!("daiv.sandbox.deployment={}", self.cp.deployment)
    }
}

async fn service(test: &str, extra: &[(&str, &str)]) -> Result<Svc> {
    let dep = deployment(test);
    let guard = DeploymentGuard(dep.clone());
    let mut env = vec![("DEPLOYMENT", dep.as_str())];
    env.extend_from_slice(extra);
    let cp = ControlPlane::start_with(&env).await?;
    Ok(Svc { cp, _guard: guard })
}

// === the API ===

/// `POST /session/{id}/snapshot/`, insisting on 201; returns the body.
async fn snapshot(cp: &ControlPlane, s: &Session, body: Value) -> Result<Value> {
    let (status, resp) = cp
        .call(
            Method::POST,
            &format!("/session/{}/snapshot/", s.id),
            Some(body),
        )
        .await?;
    ensure!(status == 201, "snapshot of {}: {status} {resp}", s.id);
    Ok(resp)
}

fn id_of(snapshot: &Value) -> Result<String> {
    let id = snapshot["snapshot_id"]
        .as_str()
        .with_context(|| format!("no snapshot_id in {snapshot}"))?;
    ensure!(!id.is_empty(), "empty snapshot_id in {snapshot}");
    Ok(id.to_string())
}

async fn get_snapshot(cp: &ControlPlane, id: &str) -> Result<(u16, Value)> {
    cp.call(Method::GET, &format!("/snapshots/{id}/"), None)
        .await
}

/// `GET /snapshots/{id}/`, insisting on 200.
async fn info(cp: &ControlPlane, id: &str) -> Result<Value> {
    let (status, resp) = get_snapshot(cp, id).await?;
    ensure!(status == 200, "GET snapshot {id}: {status} {resp}");
    Ok(resp)
}

async fn delete_snapshot(cp: &ControlPlane, id: &str) -> Result<u16> {
    Ok(cp
        .call(Method::DELETE, &format!("/snapshots/{id}/"), None)
        .await?
        .0)
}

/// Ids in `GET /snapshots/`.
async fn listed_ids(cp: &ControlPlane) -> Result<Vec<String>> {
    let (status, resp) = cp.call(Method::GET, "/snapshots/", None).await?;
    ensure!(status == 200, "list snapshots: {status} {resp}");
    let list = resp["snapshots"]
        .as_array()
        .with_context(|| format!("no snapshots array in {resp}"))?;
    list.iter()
        .map(|v| {
            v["snapshot_id"]
                .as_str()
                .map(String::from)
                .with_context(|| format!("listed without an id: {v}"))
        })
        .collect()
}

/// `POST /session/` whatever it answers; a session it made anyway is force-removed with the
/// returned guard.
async fn create(cp: &ControlPlane, body: Value) -> Result<(u16, Value, Option<Session>)> {
    let (status, resp) = cp.call(Method::POST, "/session/", Some(body)).await?;
    let made = resp["session_id"]
        .as_str()
        .map(|id| Session { id: id.into() });
    Ok((status, resp, made))
}

/// `POST /session/{id}/fork/`, insisting on 201; the forks, each removed when dropped.
async fn fork(cp: &ControlPlane, s: &Session, body: Value) -> Result<Vec<Session>> {
    let (status, resp) = fork_status(cp, &s.id, body).await?;
    let forks: Vec<Session> = resp["session_ids"]
        .as_array()
        .map(|ids| {
            ids.iter()
                .filter_map(|v| v.as_str())
                .map(|id| Session { id: id.into() })
                .collect()
        })
        .unwrap_or_default();
    ensure!(status == 201, "fork of {}: {status} {resp}", s.id);
    Ok(forks)
}

async fn fork_status(cp: &ControlPlane, id: &str, body: Value) -> Result<(u16, Value)> {
    cp.call(Method::POST, &format!("/session/{id}/fork/"), Some(body))
        .await
}

async fn pause(cp: &ControlPlane, id: &str) -> Result<(u16, Value)> {
    cp.call(Method::POST, &format!("/session/{id}/pause/"), None)
        .await
}

async fn status_of(cp: &ControlPlane, s: &Session) -> Result<u16> {
    Ok(cp
        .call(Method::GET, &format!("/session/{}/", s.id), None)
        .await?
        .0)
}

/// Starts a background process; its id.
async fn start_process(cp: &ControlPlane, s: &Session, command: &str) -> Result<String> {
    let (status, resp) = cp
        .call(
            Method::POST,
            &format!("/session/{}/processes/", s.id),
            Some(json!({ "command": command })),
        )
        .await?;
    ensure!(status == 201, "start process: {status} {resp}");
    Ok(resp["process_id"]
        .as_str()
        .context("no process_id")?
        .to_string())
}

async fn poll(cp: &ControlPlane, s: &Session, pid: &str, offset: u64, wait: u32) -> Result<Value> {
    let (status, resp) = cp
        .call(
            Method::GET,
            &format!(
                "/session/{}/processes/{pid}/?offset={offset}&wait={wait}",
                s.id
            ),
            None,
        )
        .await?;
    ensure!(status == 200, "poll {pid}: {status} {resp}");
    Ok(resp)
}

async fn processes(cp: &ControlPlane, s: &Session) -> Result<Vec<Value>> {
    let (status, resp) = cp
        .call(Method::GET, &format!("/session/{}/processes/", s.id), None)
        .await?;
    ensure!(status == 200, "list processes: {status} {resp}");
    Ok(resp["processes"].as_array().cloned().unwrap_or_default())
}

/// Runs one command and insists on exit code 0; its output.
async fn ok(cp: &ControlPlane, s: &Session, command: &str) -> Result<String> {
    let (code, out) = cp.sh(s, command).await?;
    ensure!(code == 0, "`{command}` in {}: exit {code}: {out}", s.id);
    Ok(out)
}

/// An id of the same shape as `id` that names nothing.
fn unknown_like(id: &str) -> String {
    let mut s = id.to_string();
    let last = s.pop().unwrap_or('0');
    s.push(if last == 'a' { 'b' } else { 'a' });
    s
}

fn is_rfc3339(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return false;
    }
    if b[13] != b':' || b[16] != b':' {
        return false;
    }
    let offset = &b[b.len() - 6..];
    s.ends_with(['Z', 'z']) || (matches!(offset[0], b'+' | b'-') && offset[3] == b':')
}

// === Docker's side ===

fn payload_image(id: &str) -> String {
    format!("daiv-sandbox-snapshot:{id}")
}

fn record_volume(id: &str) -> String {
    format!("daiv-snapshot-{id}")
}

fn data_volume(id: &str) -> String {
    format!("daiv-snapshot-{id}-data")
}

fn image_labels(reference: &str) -> Option<Value> {
    let v: Value = serde_json::from_str(&docker(&["image", "inspect", reference]).ok()?).ok()?;
    Some(v.get(0)?["Config"]["Labels"].clone())
}

fn volume_labels(name: &str) -> Option<Value> {
    let v: Value = serde_json::from_str(&docker(&["volume", "inspect", name]).ok()?).ok()?;
    Some(v.get(0)?["Labels"].clone())
}

/// The snapshot's image and both its volumes exist, labelled as the service's, of `deployment`.
fn assert_objects_present(id: &str, deployment: &str) {
    let image = payload_image(id);
    let labels = image_labels(&image).unwrap_or_else(|| panic!("no image {image}"));
    // A commit carries the deployment; a snapshot that committed nothing names its base image,
    // whose labels are the image's own (its layer says so).
    let layer = volume_labels(&data_volume(id)).unwrap_or_default();
    if layer["daiv.sandbox.snapshot.layout"] != "state" {
        assert_eq!(labels["daiv.sandbox.managed"], "true", "{image}: {labels}");
        assert_eq!(
            labels["daiv.sandbox.deployment"], deployment,
            "{image}: {labels}"
        );
    }
    for v in [record_volume(id), data_volume(id)] {
        let labels = volume_labels(&v).unwrap_or_else(|| panic!("no volume {v}"));
        assert_eq!(labels["daiv.sandbox.managed"], "true", "{v}: {labels}");
        assert_eq!(
            labels["daiv.sandbox.deployment"], deployment,
            "{v}: {labels}"
        );
    }
}

/// Which of the snapshot's image and volumes still exist (empty: all gone).
fn objects_left(id: &str) -> Vec<String> {
    let mut left = Vec::new();
    let image = payload_image(id);
    if docker(&["image", "inspect", &image]).is_ok() {
        left.push(image);
    }
    for v in [record_volume(id), data_volume(id)] {
        if docker(&["volume", "inspect", &v]).is_ok() {
            left.push(v);
        }
    }
    left
}

/// Waits until the snapshot answers 404 and its image and volumes are gone.
async fn snapshot_gone(cp: &ControlPlane, id: &str, within: Duration) -> Result<()> {
    eventually(&format!("snapshot {id} removed"), within, || async {
        let (status, _) = get_snapshot(cp, id).await?;
        Ok((status == 404 && objects_left(id).is_empty()).then_some(()))
    })
    .await
    .with_context(|| format!("left: {:?}", objects_left(id)))
}

fn paused(id: &str) -> bool {
    inspect(id).is_some_and(|c| c["State"]["Paused"] == json!(true))
}

fn sweeps(cp: &ControlPlane) -> usize {
    cp.logs().matches("reaper: sweeping").count()
}

/// Waits until the service's reaper has swept `n` more times.
async fn more_sweeps(cp: &ControlPlane, n: usize) -> Result<()> {
    let start = sweeps(cp);
    eventually("more sweeps", Duration::from_secs(60), || async {
        Ok((sweeps(cp) >= start + n).then_some(()))
    })
    .await
}

/// Puts `name` into `dir` of a running container through the engine's archive API, which keeps
/// the entry's owner and mode: a file the sandbox user could not have made (another owner).
fn put_owned(container: &str, dir: &str, name: &str, data: &[u8], mode: u32) -> Result<()> {
    let mut h = tar::Header::new_gnu();
    h.set_path(name)?;
    h.set_size(data.len() as u64);
    h.set_mode(mode);
    h.set_uid(OTHER_UID);
    h.set_gid(OTHER_GID);
    h.set_mtime(1_700_000_000);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    let mut b = tar::Builder::new(Vec::new());
    b.append(&h, data)?;
    let archive = b.into_inner()?;
    let mut child = Command::new("docker")
        .args(["cp", "-", &format!("{container}:{dir}")])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("docker cp")?;
    child
        .stdin
        .take()
        .context("docker cp stdin")?
        .write_all(&archive)?;
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "docker cp into {container}:{dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn volume_dir(name: &str) -> Result<std::path::PathBuf> {
    let mountpoint = docker(&["volume", "inspect", "-f", "{{.Mountpoint}}", name])?;
    ensure!(!mountpoint.is_empty(), "volume {name} has no mountpoint");
    Ok(mountpoint.into())
}

// === 1 and 8: snapshot → new session ===

/// Owners, modes, types and targets of what the tests put in a session, then the contents.
const TREE: &str = "cd /workspace/repo && stat -c '%u:%g %a %F %n' . seeded.txt private.txt run.sh sub sub/nested.txt link other.txt /home/sandbox/home.txt && readlink link && cat seeded.txt private.txt sub/nested.txt other.txt /home/sandbox/home.txt && ./run.sh";

/// Fills a session: a seed (through the route), files of the sandbox user with modes 0600,
/// 0755 and 0750, a relative symlink, a file of another owner, a file in `/home/sandbox` (the
/// container's own layer). Returns what [`TREE`] prints for it.
async fn fill(cp: &ControlPlane, s: &Session) -> Result<String> {
    let archive = tar_of(&[Member::File("seeded.txt", b"seeded\n", 0o644)])?;
    let seeded = seed(cp, s, vec![("repo_archive", archive)]).await?;
    ensure!(seeded.status == 204, "seed: {seeded:?}");
    ok(
        cp,
        s,
        "cd /workspace/repo && printf 'private\\n' > private.txt && chmod 600 private.txt \
         && printf '#!/bin/sh\\necho ran\\n' > run.sh && chmod 755 run.sh \
         && mkdir sub && chmod 750 sub && echo nested > sub/nested.txt \
         && ln -s sub/nested.txt link \
         && echo home > /home/sandbox/home.txt && chmod 640 /home/sandbox/home.txt",
    )
    .await?;
    put_owned(&s.id, REPO, "other.txt", b"other\n", 0o604)?;
    let tree = ok(cp, s, TREE).await?;
    let lines: Vec<&str> = tree.lines().collect();
    let owner = format!("{OTHER_UID}:{OTHER_GID} 604 ");
    // The set-up itself did what the test relies on (else a comparison below proves nothing).
    let expected = [
        (1, "1000:1000 644 "),
        (2, "1000:1000 600 "),
        (3, "1000:1000 755 "),
        (4, "1000:1000 750 "),
        (7, owner.as_str()),
        (8, "1000:1000 640 "),
    ];
    for (i, prefix) in expected {
        ensure!(
            lines.get(i).is_some_and(|l| l.starts_with(prefix)),
            "line {i} of the tree is not `{prefix}...`:\n{tree}"
        );
    }
    ensure!(
        lines.get(6).is_some_and(|l| l.contains("symbolic link")),
        "no symlink:\n{tree}"
    );
    ensure!(
        tree.ends_with("sub/nested.txt\nseeded\nprivate\nnested\nother\nhome\nran\n"),
        "{tree}"
    );
    Ok(tree)
}

async fn snapshot_round_trip(image: &str, runtime: &str) -> Result<()> {
    require_image(image);
    let tag = format!(
        "rt-{}-{runtime}",
        if image == BUSYBOX {
            "busybox"
        } else {
            "debian"
        }
    );
    let svc = service(&tag, &[("RUNTIME", runtime)]).await?;
    let cp = &*svc;
    let src = cp
        .session(json!({
            "base_image": image,
            "environment": {"SRC_ONLY": "from-source", "SHARED": "source-value"}
        }))
        .await?;
    if runtime == "runsc" {
        assert_eq!(
            inspect(&src.id).expect("source")["HostConfig"]["Runtime"],
            "runsc"
        );
    }
    let tree = fill(cp, &src).await?;
    let sleeper = start_process(cp, &src, "sleep 300").await?;

    // Refused before anything happens.
    let (status, body) = cp
        .call(
            Method::POST,
            &format!("/session/{}/snapshot/", "0".repeat(64)),
            Some(json!({})),
        )
        .await?;
    assert_eq!(status, 404, "snapshot of an unknown session: {body}");
    let (status, body) = cp
        .call(
            Method::POST,
            &format!("/session/{}/snapshot/", src.id),
            Some(json!({"ttl_seconds": 0})),
        )
        .await?;
    assert_eq!(status, 422, "ttl_seconds 0: {body}");

    let made = snapshot(cp, &src, json!({"name": format!("e2e {tag}")})).await?;
    let id = id_of(&made)?;
    assert_eq!(made["name"], format!("e2e {tag}"), "{made}");
    assert!(
        made["created_at"].as_str().is_some_and(is_rfc3339),
        "{made}"
    );
    assert!(made["size_bytes"].as_u64().is_some_and(|n| n > 0), "{made}");

    // Its record, in the list too.
    let got = info(cp, &id).await?;
    assert_eq!(got["snapshot_id"], id.as_str(), "{got}");
    assert_eq!(got["name"], made["name"], "{got}");
    assert_eq!(got["source_session_id"], src.id.as_str(), "{got}");
    assert_eq!(got["base_image"], image, "{got}");
    assert_eq!(got["image"], payload_image(&id), "{got}");
    assert_eq!(got["created_at"], made["created_at"], "{got}");
    assert_eq!(got["size_bytes"], made["size_bytes"], "{got}");
    assert!(got.get("expires_at").is_some(), "no expires_at: {got}");
    assert!(listed_ids(cp).await?.contains(&id));
    assert_objects_present(&id, &cp.deployment);

    // The source goes on, process and all; what it does next is not in the snapshot.
    assert_eq!(ok(cp, &src, TREE).await?, tree);
    ok(
        cp,
        &src,
        "echo later > /workspace/repo/after.txt && echo later > /home/sandbox/after.txt",
    )
    .await?;
    let p = poll(cp, &src, &sleeper, 0, 0).await?;
    assert_eq!(
        p["running"], true,
        "the snapshot ended the source's process: {p}"
    );

    // A session from it, with no base_image and an environment of its own.
    let restored = cp
        .session(json!({
            "snapshot_id": id,
            "environment": {"SHARED": "restored-value", "NEW_ONLY": "restored"}
        }))
        .await?;
    assert_ne!(restored.id, src.id);
    if runtime == "runsc" {
        assert_eq!(
            inspect(&restored.id).expect("restored")["HostConfig"]["Runtime"],
            "runsc"
        );
    }
    assert_eq!(
        ok(cp, &restored, TREE).await?,
        tree,
        "the restored session's files differ from the source's at the snapshot"
    );
    let (code, out) = cp
        .sh(
            &restored,
            "ls /workspace/repo/after.txt /home/sandbox/after.txt 2>&1",
        )
        .await?;
    assert_ne!(code, 0, "written after the snapshot, yet there: {out}");
    // Its environment is its own; the source's stays with the source.
    let env = ok(
        cp,
        &restored,
        "echo \"${SRC_ONLY:-unset} ${SHARED:-unset} ${NEW_ONLY:-unset}\"; env",
    )
    .await?;
    assert!(
        env.starts_with("unset restored-value restored\n"),
        "environment of the restored session:\n{env}"
    );
    assert!(
        !env.contains("from-source") && !env.contains("source-value"),
        "{env}"
    );
    let bg = start_process(cp, &restored, "echo \"${SRC_ONLY:-unset} $NEW_ONLY\"").await?;
    let out = eventually("the process ends", Duration::from_secs(20), || async {
        let p = poll(cp, &restored, &bg, 0, 5).await?;
        Ok((p["running"] == false).then_some(p))
    })
    .await?;
    assert_eq!(out["output"], "unset restored\n", "{out}");
    // Running processes are not part of a snapshot.
    let procs = processes(cp, &restored).await?;
    assert!(
        procs
            .iter()
            .all(|p| p["command"] != "sleep 300" && p["process_id"] != sleeper.as_str()),
        "{procs:?}"
    );
    let (_, out) = cp
        .sh(
            &restored,
            "for p in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $p; echo; done 2>/dev/null | grep -c '^sleep 300 $' || true",
        )
        .await?;
    assert_eq!(
        out.trim(),
        "0",
        "the source's process runs in the restored session"
    );
    // Seeded state came along: a second seed is refused.
    let again = seed(
        cp,
        &restored,
        vec![(
            "repo_archive",
            tar_of(&[Member::File("again.txt", b"x", 0o644)])?,
        )],
    )
    .await?;
    assert_eq!(again.status, 409, "seed after restore: {again:?}");
    // The copy is the restored session's own: its writes do not reach the source.
    ok(
        cp,
        &restored,
        "echo changed > /workspace/repo/private.txt && echo changed > /home/sandbox/home.txt && rm /workspace/repo/seeded.txt",
    )
    .await?;
    let out = ok(
        cp,
        &src,
        "cat /workspace/repo/private.txt /home/sandbox/home.txt /workspace/repo/seeded.txt",
    )
    .await?;
    assert_eq!(out, "private\nhome\nseeded\n");

    // base_image may be given if it agrees; one that disagrees is a 400; an unknown id a 404.
    let (status, body, agreeing) = create(
        cp,
        json!({"snapshot_id": id, "base_image": image, "environment": {"X": "1"}}),
    )
    .await?;
    assert_eq!(status, 200, "snapshot_id with its own base_image: {body}");
    let agreeing = agreeing.context("no session")?;
    assert_eq!(
        ok(cp, &agreeing, "cat /workspace/repo/sub/nested.txt").await?,
        "nested\n"
    );
    drop(agreeing);
    let other = if image == BUSYBOX { DEBIAN } else { BUSYBOX };
    let (status, body, _made) = create(cp, json!({"snapshot_id": id, "base_image": other})).await?;
    assert_eq!(status, 400, "snapshot_id with another base_image: {body}");
    let unknown = unknown_like(&id);
    let (status, body, _made) = create(cp, json!({"snapshot_id": unknown})).await?;
    assert_eq!(status, 404, "unknown snapshot_id: {body}");
    assert_eq!(get_snapshot(cp, &unknown).await?.0, 404);
    assert_eq!(delete_snapshot(cp, &unknown).await?, 404);
    // Forks: 1..=16 by default.
    for count in [0, 17] {
        let (status, body) = fork_status(cp, &src.id, json!({"count": count})).await?;
        assert_eq!(status, 422, "fork count {count}: {body}");
    }
    let (status, body) = fork_status(cp, &"0".repeat(64), json!({"count": 1})).await?;
    assert_eq!(status, 404, "fork of an unknown session: {body}");
    Ok(())
}

#[tokio::test]
async fn a_session_from_a_snapshot_has_its_files_owners_modes_links_and_seed_busybox() -> Result<()>
{
    snapshot_round_trip(BUSYBOX, "runc").await
}

#[tokio::test]
async fn a_session_from_a_snapshot_has_its_files_owners_modes_links_and_seed_debian() -> Result<()>
{
    snapshot_round_trip(DEBIAN, "runc").await
}

#[tokio::test]
async fn a_session_from_a_snapshot_has_its_files_owners_modes_links_and_seed_under_gvisor()
-> Result<()> {
    snapshot_round_trip(BUSYBOX, "runsc").await
}

/// A claimed warm-pool member keeps its claim's environment in a file of its own layer: a
/// snapshot of it must not hand that environment to sessions made from the snapshot.
#[tokio::test]
async fn a_claimed_sources_environment_does_not_reach_a_session_from_its_snapshot() -> Result<()> {
    require_image(BUSYBOX);
    let pooled = format!("{BUSYBOX}=1");
    let svc = service("pool-env", &[("WARM_POOL", &pooled)]).await?;
    let cp = &*svc;
    let label = svc.label();
    eventually("a ready pool member", Duration::from_secs(90), || async {
        let ready = containers_with(&[&label, "daiv.sandbox.role=sandbox", "daiv.sandbox.pool"])
            .into_iter()
            .any(|id| {
                inspect(&id).is_some_and(|c| {
                    c["State"]["Running"] == true
                        && c["Name"]
                            .as_str()
                            .is_some_and(|n| n.starts_with("/daiv-pool-"))
                })
            });
        Ok(ready.then_some(()))
    })
    .await?;
    let src = cp
        .session(json!({"base_image": BUSYBOX, "environment": {"CLAIM_ONLY": "claimed"}}))
        .await?;
    let name = inspect(&src.id).expect("source")["Name"].clone();
    assert!(
        name.as_str()
            .is_some_and(|n| n.starts_with("/daiv-claimed-")),
        "not claimed from the pool: {name}"
    );
    assert_eq!(ok(cp, &src, "echo $CLAIM_ONLY").await?, "claimed\n");
    ok(cp, &src, "echo kept > /workspace/repo/kept.txt").await?;
    let id = id_of(&snapshot(cp, &src, json!({})).await?)?;
    let restored = cp
        .session(json!({"snapshot_id": id, "environment": {"MINE": "restored"}}))
        .await?;
    assert_eq!(
        ok(cp, &restored, "cat /workspace/repo/kept.txt").await?,
        "kept\n"
    );
    let out = ok(
        cp,
        &restored,
        "echo \"${CLAIM_ONLY:-unset} ${MINE:-unset}\"",
    )
    .await?;
    assert_eq!(
        out, "unset restored\n",
        "the claim's environment came along"
    );
    let bare = cp.session(json!({"snapshot_id": id})).await?;
    let out = ok(cp, &bare, "echo \"${CLAIM_ONLY:-unset}\"").await?;
    assert_eq!(out, "unset\n", "the claim's environment came along");
    Ok(())
}

// === 2: forks of a busy session ===

/// A command that checks a copy of a file the writer appends `line N` to: prints its number of
/// lines when they are exactly `line 1` .. `line N`, each whole, else says what is wrong.
fn check_lines(path: &str) -> String {
    format!(
        "f={path}; awk '{{ n++; if ($0 != \"line \" n) {{ bad = 1; exit }} }} END {{ if (bad) print \"BAD at line \" n \": \" $0; else print n }}' \"$f\"; \
         if [ -s \"$f\" ] && [ -n \"$(tail -c 1 \"$f\")\" ]; then echo TORN: no newline at the end; fi"
    )
}

async fn lines_in(cp: &ControlPlane, s: &Session, path: &str) -> Result<u64> {
    let out = ok(cp, s, &check_lines(path)).await?;
    out.trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("{path} in {} is not whole numbered lines: {out}", s.id))
}

const WS_COUNTER: &str = "/workspace/repo/counter.txt";
const HOME_COUNTER: &str = "/home/sandbox/counter.txt";

#[tokio::test]
async fn forks_of_a_busy_session_are_consistent_isolated_copies_and_the_source_keeps_running()
-> Result<()> {
    require_image(BUSYBOX);
    let svc = service("fork", &[("FORK_MAX_COUNT", "2")]).await?;
    let cp = &*svc;
    let src = cp
        .session(json!({"base_image": BUSYBOX, "environment": {"ORIGIN": "source"}}))
        .await?;
    // One write per line, first to the workspace volume, then to the container's own layer:
    // at any one instant the second file has as many lines as the first, or one fewer.
    let writer = start_process(
        cp,
        &src,
        &format!(
            "i=0; while :; do i=$((i+1)); echo \"line $i\" >> {WS_COUNTER}; echo \"line $i\" >> {HOME_COUNTER}; done"
        ),
    )
    .await?;
    eventually(
        "the writer's first 200 lines",
        Duration::from_secs(30),
        || async {
            let (_, out) = cp.sh(&src, &format!("wc -l < {HOME_COUNTER}")).await?;
            Ok(out
                .trim()
                .parse::<u64>()
                .is_ok_and(|n| n >= 200)
                .then_some(()))
        },
    )
    .await?;

    // Over the cap (2 here), or none: refused, nothing made.
    for count in [0, 3] {
        let (status, body) = fork_status(cp, &src.id, json!({"count": count})).await?;
        assert_eq!(status, 422, "fork count {count}: {body}");
    }
    let forks = fork(
        cp,
        &src,
        json!({"count": 2, "environment": {"FORKED": "yes"}}),
    )
    .await?;
    assert_eq!(forks.len(), 2, "two forks asked for");
    assert!(forks[0].id != forks[1].id && forks.iter().all(|f| f.id != src.id));
    let sandboxes = containers_with(&[&svc.label(), "daiv.sandbox.role=sandbox"]);
    assert_eq!(
        sandboxes.len(),
        3,
        "the source and two forks: {sandboxes:?}"
    );

    let mut copied = Vec::new();
    for f in &forks {
        assert_eq!(status_of(cp, f).await?, 204);
        let ws = lines_in(cp, f, WS_COUNTER).await?;
        let home = lines_in(cp, f, HOME_COUNTER).await?;
        assert!(
            ws >= 200,
            "fork {} has {ws} lines, the source had 200 before",
            f.id
        );
        assert!(
            ws == home || ws == home + 1,
            "fork {}: not one instant: {ws} lines in the workspace, {home} in /home/sandbox",
            f.id
        );
        assert_eq!(ok(cp, f, "echo \"$FORKED\"").await?, "yes\n");
        copied.push(ws);
    }
    let (_, out) = cp.sh(&src, "echo \"${FORKED:-unset}\"").await?;
    assert_eq!(out, "unset\n", "the forks' environment reached the source");

    // The source keeps running, its writer too.
    assert_eq!(status_of(cp, &src).await?, 204);
    let p = poll(cp, &src, &writer, 0, 0).await?;
    assert_eq!(
        p["running"], true,
        "the fork ended the source's writer: {p}"
    );
    assert!(p["exit_code"].is_null(), "{p}");
    let most = copied.iter().copied().max().unwrap_or(0);
    eventually(
        "the source's writer goes on",
        Duration::from_secs(30),
        || async {
            let (_, out) = cp.sh(&src, &format!("wc -l < {WS_COUNTER}")).await?;
            Ok(out
                .trim()
                .parse::<u64>()
                .is_ok_and(|n| n > most)
                .then_some(()))
        },
    )
    .await?;

    // Each copy is its own: what one writes, neither the source nor the sibling sees.
    for (i, f) in forks.iter().enumerate() {
        ok(
            cp,
            f,
            &format!("echo {i} > /workspace/repo/mark-{i} && echo {i} > /home/sandbox/mark-{i}"),
        )
        .await?;
    }
    ok(
        cp,
        &src,
        "echo s > /workspace/repo/mark-src && echo s > /home/sandbox/mark-src",
    )
    .await?;
    // How many of the two copies of `name` the session has (runs use pipefail: no `ls | wc`).
    let look = |name: &str| {
        format!(
            "n=0; for f in /workspace/repo/{name} /home/sandbox/{name}; do [ -e $f ] && n=$((n+1)); done; echo $n"
        )
    };
    for (i, f) in forks.iter().enumerate() {
        let mine = ok(cp, f, &look(&format!("mark-{i}"))).await?;
        assert_eq!(mine.trim(), "2");
        let sibling = ok(cp, f, &look(&format!("mark-{}", 1 - i))).await?;
        assert_eq!(sibling.trim(), "0", "fork {i} sees its sibling's files");
        let source = ok(cp, f, &look("mark-src")).await?;
        assert_eq!(source.trim(), "0", "fork {i} sees the source's later files");
        let in_source = ok(cp, &src, &look(&format!("mark-{i}"))).await?;
        assert_eq!(in_source.trim(), "0", "the source sees fork {i}'s files");
    }
    // The forks' copies stay as they were: no writer of the source's wrote into them.
    for (f, n) in forks.iter().zip(&copied) {
        assert_eq!(lines_in(cp, f, WS_COUNTER).await?, *n);
    }
    let p = poll(cp, &src, &writer, 0, 0).await?;
    assert_eq!(p["running"], true, "{p}");
    Ok(())
}

// === 3 and 4 (egress): forks with their own gateways; no secret in a snapshot ===

fn strict_policy(token: &str) -> Value {
    json!({
        "policy": {
            "default": "deny",
            "intercept": "all",
            "rules": [
                {"host": "api.upstream.test", "methods": ["GET", "POST"], "inject": "tok"}
            ]
        },
        "secrets": {"tok": {"header": "Authorization", "value": token}}
    })
}

async fn egress_service(test: &str) -> Result<(Upstream, Svc)> {
    let up = start_upstream()?;
    let settings = EgressSettings::for_upstream(&up)?;
    let svc = service(test, &settings.env(&[])).await?;
    Ok((up, svc))
}

/// Sends `GET https://api.upstream.test{path}` from the session and checks the upstream saw it
/// with the injected secret.
async fn reaches_upstream_with(
    cp: &ControlPlane,
    up: &Upstream,
    s: &Session,
    path: &str,
    secret: &str,
) -> Result<()> {
    ok(
        cp,
        s,
        &format!("curl -sS --fail --max-time 20 https://api.upstream.test{path}"),
    )
    .await?;
    let seen = up
        .requests()?
        .into_iter()
        .rev()
        .find(|r| r["path"] == path)
        .with_context(|| format!("the upstream never saw {path}"))?;
    ensure!(
        seen["headers"]["authorization"] == secret,
        "{path} reached the upstream without the injected secret: {seen}"
    );
    Ok(())
}

#[tokio::test]
async fn egress_forks_get_their_own_gateways_and_a_snapshot_never_holds_the_secret() -> Result<()> {
    let (up, svc) = egress_service("egress-fork").await?;
    let cp = &*svc;
    let secret = "ghp_snapshotForkSecret0123456789";
    let src = cp
        .session(json!({"base_image": DEBIAN, "egress": strict_policy(secret)}))
        .await?;
    reaches_upstream_with(cp, &up, &src, "/source", secret).await?;
    // Markers, to prove the scans below read the snapshot's files at all.
    let ws_mark = "workspace-marker-5f1c0e";
    let home_mark = "home-marker-9a7d2b";
    ok(
        cp,
        &src,
        &format!(
            "echo {ws_mark} > /workspace/repo/marker.txt && echo {home_mark} > /home/sandbox/marker.txt"
        ),
    )
    .await?;
    let (src_token, src_gateway) = gateway_of(&src.id)?;
    assert!(!src_gateway.is_empty() && !src_gateway.contains(char::is_whitespace));

    let forks = fork(cp, &src, json!({"count": 2})).await?;
    assert_eq!(forks.len(), 2);
    let mut gateways = vec![src_gateway.clone()];
    for (i, f) in forks.iter().enumerate() {
        let (token, gateway) = gateway_of(&f.id)?;
        assert!(
            !gateway.is_empty() && !gateway.contains(char::is_whitespace),
            "fork {i} has not exactly one gateway: {gateway:?}"
        );
        assert_ne!(
            token, src_token,
            "fork {i} shares the source's egress token"
        );
        assert!(
            !gateways.contains(&gateway),
            "fork {i} shares a gateway: {gateway}"
        );
        let g = inspect(&gateway).expect("gateway");
        assert_eq!(g["State"]["Running"], true, "{}", g["State"]);
        assert_eq!(g["Config"]["Labels"]["daiv.sandbox.role"], "egress-gateway");
        assert_eq!(
            g["Config"]["Labels"]["daiv.sandbox.deployment"],
            cp.deployment.as_str()
        );
        gateways.push(gateway);
        // The source's policy and secret, enforced by the fork's own gateway.
        reaches_upstream_with(cp, &up, f, &format!("/fork-{i}"), secret).await?;
        let (_, out) = cp
            .sh(
                f,
                "curl -s -o /dev/null -w '%{http_connect}' --max-time 20 https://other.upstream.test/x",
            )
            .await?;
        assert_eq!(out, "403", "fork {i}: a host the policy does not list");
        let out = ok(
            cp,
            f,
            "cat /workspace/repo/marker.txt /home/sandbox/marker.txt; env",
        )
        .await?;
        assert!(
            out.starts_with(&format!("{ws_mark}\n{home_mark}\n")),
            "{out}"
        );
        assert!(
            !out.contains(secret),
            "fork {i}: the secret is in the sandbox"
        );
    }
    // The source keeps its gateway and its way out.
    assert_eq!(gateway_of(&src.id)?.1, src_gateway);
    reaches_upstream_with(cp, &up, &src, "/source-after", secret).await?;

    // A snapshot of the source: its image (every layer) and its volumes hold the session's
    // files, never the secret.
    let id = id_of(&snapshot(cp, &src, json!({"name": "egress"})).await?)?;
    assert_objects_present(&id, &cp.deployment);
    let found = snapshot_contains(&id, &[secret, home_mark])?;
    assert!(
        found[1],
        "the home marker is in neither the snapshot's image nor its layers: nothing was scanned"
    );
    assert!(!found[0], "the secret is in the snapshot's image or layers");
    let (found, files) = dir_contains(&volume_dir(&data_volume(&id))?, &[secret, ws_mark])?;
    assert!(
        found[1],
        "the workspace marker is not in the snapshot's data volume ({files} files)"
    );
    assert!(!found[0], "the secret is in the snapshot's data volume");
    let (found, _) = dir_contains(&volume_dir(&record_volume(&id))?, &[secret])?;
    assert!(!found[0], "the secret is in the snapshot's record volume");

    // A session from that snapshot, asked for without egress, is isolated: no way out, no part
    // of the source's triad; removing it leaves the source's gateway alone.
    let isolated = cp.session(json!({"snapshot_id": id})).await?;
    assert_eq!(
        ok(cp, &isolated, "cat /workspace/repo/marker.txt").await?,
        format!("{ws_mark}\n")
    );
    let labels = inspect(&isolated.id).expect("restored")["Config"]["Labels"].clone();
    assert!(
        labels
            .get("daiv.sandbox.egress")
            .and_then(|v| v.as_str())
            .is_none_or(str::is_empty),
        "the session from the snapshot carries an egress token: {labels}"
    );
    let (code, out) = cp
        .sh(
            &isolated,
            "curl -sS --max-time 10 https://api.upstream.test/isolated 2>&1",
        )
        .await?;
    assert_ne!(code, 0, "a session without egress got out: {out}");
    // (Blanked variables are as good as unset: only a value would send clients anywhere.)
    let out = ok(cp, &isolated, "env").await?;
    let proxies: Vec<&str> = out
        .lines()
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            ["http_proxy=", "https_proxy=", "all_proxy="]
                .iter()
                .any(|p| l.starts_with(p) && l.len() > p.len())
        })
        .collect();
    assert!(
        proxies.is_empty(),
        "proxy settings of the source in an isolated session: {proxies:?}"
    );
    assert_eq!(cp.force_close(&isolated).await?, 204);
    assert_eq!(
        gateway_of(&src.id)?.1,
        src_gateway,
        "removing the session from the snapshot took the source's gateway"
    );
    reaches_upstream_with(cp, &up, &src, "/source-last", secret).await?;
    let logs = cp.logs();
    assert!(
        !logs.contains(secret),
        "the secret is in the service's logs"
    );
    Ok(())
}

// === 4: pause ===

const TICKS: &str = "/workspace/repo/ticks.txt";

/// `tick 1`, `tick 2`, ... with nothing missing, repeated or restarted; the last number.
fn consecutive_ticks(output: &str) -> Result<u64> {
    let mut n = 0;
    for line in output.lines() {
        n += 1;
        ensure!(
            line == format!("tick {n}"),
            "line {n} is {line:?}, not `tick {n}`: the process restarted or lost its state:\n{output}"
        );
    }
    Ok(n)
}

/// Output of a process from the start, once it has printed `tick {at_least}`.
async fn ticks_until(cp: &ControlPlane, s: &Session, pid: &str, at_least: u64) -> Result<u64> {
    eventually(
        &format!("tick {at_least}"),
        Duration::from_secs(60),
        || async {
            let p = poll(cp, s, pid, 0, 2).await?;
            ensure!(p["truncated"] != true, "{p}");
            let n = consecutive_ticks(p["output"].as_str().unwrap_or_default())?;
            Ok((n >= at_least).then_some(n))
        },
    )
    .await
}

async fn pause_keeps_processes(runtime: &str) -> Result<()> {
    require_image(BUSYBOX);
    let svc = service(&format!("pause-{runtime}"), &[("RUNTIME", runtime)]).await?;
    let cp = &*svc;
    let s = cp.session_of(BUSYBOX).await?;
    let pid = start_process(
        cp,
        &s,
        &format!("i=0; while :; do i=$((i+1)); echo \"tick $i\"; echo \"tick $i\" >> {TICKS}; sleep 0.2; done"),
    )
    .await?;
    let before = ticks_until(cp, &s, &pid, 3).await?;

    let (status, body) = pause(cp, &s.id).await?;
    assert_eq!(status, 204, "pause: {body}");
    assert!(paused(&s.id), "docker does not see the sandbox paused");
    // Frozen: the file the process appends to does not change (read on the host, which does
    // not touch the session).
    let mount = inspect(&s.id).expect("sandbox")["Mounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["Destination"] == "/workspace").cloned())
        .context("no /workspace mount")?;
    let host_ticks =
        Path::new(mount["Source"].as_str().context("mount source")?).join("repo/ticks.txt");
    let frozen = std::fs::read_to_string(&host_ticks).unwrap_or_default();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        std::fs::read_to_string(&host_ticks).unwrap_or_default(),
        frozen,
        "the paused process kept writing"
    );
    assert!(paused(&s.id));
    // The status route answers for a paused session.
    assert_eq!(status_of(cp, &s).await?, 204, "status of a paused session");

    // The next run thaws it and works; the process went on from where it was.
    let out = ok(cp, &s, "echo thawed").await?;
    assert_eq!(out, "thawed\n");
    assert!(!paused(&s.id), "still paused after a run");
    let after = ticks_until(cp, &s, &pid, before + 3).await?;
    assert!(after > before);
    let p = poll(cp, &s, &pid, 0, 0).await?;
    assert_eq!(p["running"], true, "{p}");
    let file = ok(cp, &s, &format!("cat {TICKS}")).await?;
    consecutive_ticks(&file)?;

    // Any request thaws: a lock-free fs read, a process poll.
    let (status, body) = pause(cp, &s.id).await?;
    assert_eq!(status, 204, "second pause: {body}");
    assert!(paused(&s.id));
    let (status, read) = cp
        .call(
            Method::POST,
            &format!("/session/{}/fs/read", s.id),
            Some(json!({"path": TICKS})),
        )
        .await?;
    assert_eq!(status, 200, "fs read of a paused session: {read}");
    assert!(read["error"].is_null(), "{read}");
    assert!(
        read["content"]
            .as_str()
            .is_some_and(|c| c.starts_with("tick 1\n")),
        "{read}"
    );
    let (status, body) = pause(cp, &s.id).await?;
    assert_eq!(status, 204, "third pause: {body}");
    let seen = ticks_until(cp, &s, &pid, after + 2).await?;
    assert!(seen > after);
    assert!(!paused(&s.id));

    let (status, body) = pause(cp, &"0".repeat(64)).await?;
    assert_eq!(status, 404, "pause of an unknown session: {body}");
    Ok(())
}

#[tokio::test]
async fn pause_keeps_background_processes_and_the_next_request_resumes() -> Result<()> {
    pause_keeps_processes("runc").await
}

#[tokio::test]
async fn pause_keeps_background_processes_and_the_next_request_resumes_under_gvisor() -> Result<()>
{
    pause_keeps_processes("runsc").await
}

#[tokio::test]
async fn pausing_an_egress_session_pauses_its_gateway_and_both_resume() -> Result<()> {
    let (up, svc) = egress_service("egress-pause").await?;
    let cp = &*svc;
    let secret = "ghp_snapshotPauseSecret0123456789";
    let s = cp
        .session(json!({"base_image": DEBIAN, "egress": strict_policy(secret)}))
        .await?;
    reaches_upstream_with(cp, &up, &s, "/before", secret).await?;
    let (_, gateway) = gateway_of(&s.id)?;
    assert!(!gateway.is_empty());
    let (status, body) = pause(cp, &s.id).await?;
    assert_eq!(status, 204, "pause: {body}");
    assert!(paused(&s.id), "the sandbox is not paused");
    assert!(paused(&gateway), "the gateway is not paused");
    reaches_upstream_with(cp, &up, &s, "/after", secret).await?;
    assert!(!paused(&s.id) && !paused(&gateway), "not both thawed");
    Ok(())
}

// === 5: retention ===

#[tokio::test]
async fn snapshots_expire_after_their_ttl_or_the_default_one() -> Result<()> {
    require_image(BUSYBOX);
    let svc = service(
        "ttl",
        &[
            ("REAPER_ENABLED", "true"),
            ("REAPER_INTERVAL_SECONDS", "1"),
            ("RUNNING_SESSION_MAX_IDLE_SECONDS", "0"),
            ("SNAPSHOT_TTL_SECONDS", "2"),
        ],
    )
    .await?;
    let cp = &*svc;
    let s = cp.session_of(BUSYBOX).await?;
    ok(cp, &s, "echo kept > /workspace/repo/f").await?;
    let short = id_of(&snapshot(cp, &s, json!({"ttl_seconds": 1})).await?)?;
    let default = id_of(&snapshot(cp, &s, json!({})).await?)?;
    let long = id_of(&snapshot(cp, &s, json!({"ttl_seconds": 86400})).await?)?;
    // (The short-lived ones may be gone already: the reaper sweeps every second.)
    assert_objects_present(&long, &cp.deployment);
    // Still listed right after (well within the day), each with its expiry.
    let got = info(cp, &long).await?;
    assert!(
        got["expires_at"].as_str().is_some_and(is_rfc3339),
        "ttl_seconds given: {got}"
    );
    snapshot_gone(cp, &short, Duration::from_secs(60)).await?;
    snapshot_gone(cp, &default, Duration::from_secs(60)).await?;
    more_sweeps(cp, 2).await?;
    let got = info(cp, &long).await?;
    assert!(got["expires_at"].as_str().is_some_and(is_rfc3339), "{got}");
    assert_objects_present(&long, &cp.deployment);
    assert_eq!(listed_ids(cp).await?, vec![long.clone()]);
    // The source session is not the snapshots' business.
    assert_eq!(ok(cp, &s, "cat /workspace/repo/f").await?, "kept\n");
    Ok(())
}

#[tokio::test]
async fn the_count_cap_keeps_only_the_newest_snapshot() -> Result<()> {
    require_image(BUSYBOX);
    let svc = service(
        "count",
        &[
            ("REAPER_ENABLED", "true"),
            ("REAPER_INTERVAL_SECONDS", "1"),
            ("RUNNING_SESSION_MAX_IDLE_SECONDS", "0"),
            ("SNAPSHOT_TTL_SECONDS", "0"),
            ("SNAPSHOT_MAX_COUNT", "1"),
        ],
    )
    .await?;
    let cp = &*svc;
    let s = cp.session_of(BUSYBOX).await?;
    ok(cp, &s, "echo one > /workspace/repo/f").await?;
    let older = snapshot(cp, &s, json!({"name": "older"})).await?;
    let older = id_of(&older)?;
    // SNAPSHOT_TTL_SECONDS=0: no expiry.
    let got = info(cp, &older).await?;
    assert!(got["expires_at"].is_null(), "TTL 0 means none: {got}");
    // Creation times a second apart at least, so which one is older is unambiguous even at a
    // resolution of seconds.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    ok(cp, &s, "echo two > /workspace/repo/f").await?;
    let newer = id_of(&snapshot(cp, &s, json!({"name": "newer"})).await?)?;
    snapshot_gone(cp, &older, Duration::from_secs(60)).await?;
    more_sweeps(cp, 2).await?;
    let got = info(cp, &newer).await?;
    assert_eq!(got["name"], "newer");
    assert_objects_present(&newer, &cp.deployment);
    assert_eq!(listed_ids(cp).await?, vec![newer.clone()]);
    let restored = cp.session(json!({"snapshot_id": newer})).await?;
    assert_eq!(ok(cp, &restored, "cat /workspace/repo/f").await?, "two\n");
    Ok(())
}

// === 6: deployments ===

/// A request to `cp` with `key` (a service started with another's `API_KEY`).
async fn call_with_key(
    cp: &ControlPlane,
    key: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Result<(u16, Value)> {
    cp.api().with_key(key).call(method, path, body).await
}

#[tokio::test]
async fn a_deployment_never_sees_another_deployments_snapshots() -> Result<()> {
    require_image(BUSYBOX);
    let a = service("iso-a", &[("SNAPSHOT_TTL_SECONDS", "0")]).await?;
    // Same key, same engine; its reaper caps snapshots at 1 and sweeps every second: were it
    // to count a's snapshots as its own, it would remove the older.
    let b = service(
        "iso-b",
        &[
            ("API_KEY", a.key.as_str()),
            ("REAPER_ENABLED", "true"),
            ("REAPER_INTERVAL_SECONDS", "1"),
            ("RUNNING_SESSION_MAX_IDLE_SECONDS", "0"),
            ("SNAPSHOT_TTL_SECONDS", "0"),
            ("SNAPSHOT_MAX_COUNT", "1"),
        ],
    )
    .await?;
    let key = a.key.clone();
    let s = a.session_of(BUSYBOX).await?;
    ok(&a, &s, "echo a > /workspace/repo/f").await?;
    let first = id_of(&snapshot(&a, &s, json!({"name": "a1"})).await?)?;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let second = id_of(&snapshot(&a, &s, json!({"name": "a2"})).await?)?;

    for id in [&first, &second] {
        let (status, body) =
            call_with_key(&b, &key, Method::GET, &format!("/snapshots/{id}/"), None).await?;
        assert_eq!(status, 404, "b reads a's snapshot: {body}");
        let (status, body) =
            call_with_key(&b, &key, Method::DELETE, &format!("/snapshots/{id}/"), None).await?;
        assert_eq!(status, 404, "b deletes a's snapshot: {body}");
        for body in [
            json!({"snapshot_id": id}),
            json!({"snapshot_id": id, "base_image": BUSYBOX}),
        ] {
            let (status, resp) =
                call_with_key(&b, &key, Method::POST, "/session/", Some(body.clone())).await?;
            let _made = resp["session_id"]
                .as_str()
                .map(|id| Session { id: id.into() });
            assert_eq!(
                status, 404,
                "b creates a session from a's snapshot ({body}): {resp}"
            );
        }
    }
    let (status, listed) = call_with_key(&b, &key, Method::GET, "/snapshots/", None).await?;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["snapshots"], json!([]), "b lists a's snapshots");

    // b's own snapshot is b's alone.
    let (status, made) = call_with_key(
        &b,
        &key,
        Method::POST,
        "/session/",
        Some(json!({"base_image": BUSYBOX})),
    )
    .await?;
    assert_eq!(status, 200, "{made}");
    let sb = Session {
        id: made["session_id"].as_str().context("session id")?.into(),
    };
    let (status, made) = call_with_key(
        &b,
        &key,
        Method::POST,
        &format!("/session/{}/snapshot/", sb.id),
        Some(json!({})),
    )
    .await?;
    assert_eq!(status, 201, "{made}");
    let theirs = id_of(&made)?;
    assert_eq!(
        get_snapshot(&a, &theirs).await?.0,
        404,
        "a reads b's snapshot"
    );
    assert_eq!(
        delete_snapshot(&a, &theirs).await?,
        404,
        "a deletes b's snapshot"
    );
    let (status, resp, _made) = create(&a, json!({"snapshot_id": theirs})).await?;
    assert_eq!(status, 404, "a creates from b's snapshot: {resp}");

    // b's reaper has swept a few times: a's two snapshots are untouched.
    more_sweeps(&b, 3).await?;
    let mine = listed_ids(&a).await?;
    assert!(mine.contains(&first) && mine.contains(&second), "{mine:?}");
    assert!(!mine.contains(&theirs), "a lists b's snapshot");
    for id in [&first, &second] {
        info(&a, id).await?;
        assert_objects_present(id, &a.deployment);
    }
    assert_objects_present(&theirs, &b.deployment);
    let restored = a.session(json!({"snapshot_id": first})).await?;
    assert_eq!(ok(&a, &restored, "cat /workspace/repo/f").await?, "a\n");
    Ok(())
}

// === 7: a snapshot deleted under a session made from it ===

#[tokio::test]
async fn deleting_a_snapshot_in_use_is_safe_and_everything_goes_once_its_sessions_do() -> Result<()>
{
    require_image(BUSYBOX);
    let svc = service(
        "in-use",
        &[
            ("REAPER_ENABLED", "true"),
            ("REAPER_INTERVAL_SECONDS", "1"),
            ("SESSION_GRACE_SECONDS", "1"),
            ("RUNNING_SESSION_MAX_IDLE_SECONDS", "0"),
            ("SNAPSHOT_TTL_SECONDS", "0"),
        ],
    )
    .await?;
    let cp = &*svc;
    let label = svc.label();
    let src = cp.session_of(BUSYBOX).await?;
    ok(
        cp,
        &src,
        "echo ws > /workspace/repo/f && echo home > /home/sandbox/h",
    )
    .await?;
    let id = id_of(&snapshot(cp, &src, json!({})).await?)?;
    let restored = cp.session(json!({"snapshot_id": id})).await?;
    assert_eq!(
        ok(cp, &restored, "cat /workspace/repo/f /home/sandbox/h").await?,
        "ws\nhome\n"
    );
    // Its workspace is a copy-on-write overlay over the snapshot's data.
    let ws: Vec<String> = volumes_with(&[&label])
        .into_iter()
        .filter(|v| v.starts_with("daiv-ws-"))
        .collect();
    for part in ["-merged", "-upper", "-work"] {
        assert!(
            ws.iter().any(|v| v.ends_with(part)),
            "no {part} volume: {ws:?}"
        );
    }

    // Deleting its source session never deletes the snapshot (the reaper sweeps meanwhile).
    assert_eq!(cp.force_close(&src).await?, 204);
    more_sweeps(cp, 2).await?;
    info(cp, &id).await?;
    assert_objects_present(&id, &cp.deployment);

    // Deleting the snapshot while a session from it runs.
    assert_eq!(delete_snapshot(cp, &id).await?, 204);
    assert_eq!(get_snapshot(cp, &id).await?.0, 404);
    assert_eq!(delete_snapshot(cp, &id).await?, 404, "deleted twice");
    assert!(!listed_ids(cp).await?.contains(&id));
    let (status, body, _made) = create(cp, json!({"snapshot_id": id})).await?;
    assert_eq!(status, 404, "a session from a deleted snapshot: {body}");
    more_sweeps(cp, 2).await?;

    // The session made from it keeps working, across a stop and a restart too.
    assert_eq!(
        ok(cp, &restored, "cat /workspace/repo/f /home/sandbox/h").await?,
        "ws\nhome\n"
    );
    ok(cp, &restored, "echo new > /workspace/repo/g").await?;
    let (status, body) = cp
        .call(Method::DELETE, &format!("/session/{}/", restored.id), None)
        .await?;
    assert_eq!(status, 204, "stop: {body}");
    assert_eq!(status_of(cp, &restored).await?, 204, "restart");
    assert_eq!(
        ok(
            cp,
            &restored,
            "cat /workspace/repo/f /workspace/repo/g /home/sandbox/h"
        )
        .await?,
        "ws\nnew\nhome\n"
    );

    // A snapshot of that session (its workspace an overlay over a deleted snapshot's data), and
    // a session from it: every layer is there.
    let second = id_of(&snapshot(cp, &restored, json!({"name": "second"})).await?)?;
    let chained = cp.session(json!({"snapshot_id": second})).await?;
    assert_eq!(
        ok(
            cp,
            &chained,
            "cat /workspace/repo/f /workspace/repo/g /home/sandbox/h"
        )
        .await?,
        "ws\nnew\nhome\n"
    );
    assert_eq!(delete_snapshot(cp, &second).await?, 204);

    // Once they go too, the reaper leaves nothing of the deployment.
    assert_eq!(cp.force_close(&restored).await?, 204);
    assert_eq!(cp.force_close(&chained).await?, 204);
    let left = || {
        let mut all: Vec<String> = containers_but_workers(&[&label])
            .into_iter()
            .map(|c| format!("container {c}"))
            .collect();
        all.extend(
            volumes_but_shared_helper(&[&label])
                .into_iter()
                .map(|v| format!("volume {v}")),
        );
        all.extend(
            images_with(&[&label])
                .into_iter()
                .map(|i| format!("image {i}")),
        );
        all
    };
    eventually(
        "nothing of the deployment left",
        Duration::from_secs(90),
        || async { Ok(left().is_empty().then_some(())) },
    )
    .await
    .with_context(|| format!("left: {:?}", left()))?;

    // A snapshot's tag left without its layer (Docker refuses to untag an image's only name
    // while a container runs it) carries none of our labels: the sweep finds it by its name.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    let orphan = format!("daiv-sandbox-snapshot:e2e{nanos:x}");
    docker(&["tag", BUSYBOX, &orphan])?;
    let tagged = || docker(&["image", "inspect", &orphan]).is_ok();
    let swept = eventually(
        "an orphan snapshot tag swept",
        Duration::from_secs(60),
        || async { Ok((!tagged()).then_some(())) },
    )
    .await;
    if swept.is_err() {
        e2e::docker_quietly(&["rmi", &orphan]);
    }
    swept?;
    docker(&["image", "inspect", BUSYBOX]).context("the base image itself is kept")?;
    Ok(())
}

#[test]
fn the_scanners_find_what_they_look_for() -> Result<()> {
    let data = b"aaaa needle bbbb";
    let mut found = [false; 2];
    scan(&data[..], &["needle", "nope"], &mut found)?;
    assert_eq!(found, [true, false]);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(data)?;
    let gz = gz.finish()?;
    let mut found = [false; 1];
    scan_maybe_compressed(&gz[..], &["needle"], &mut found)?;
    assert!(found[0]);
    // A needle split across reads.
    let mut found = [false; 1];
    let reader = std::io::Read::chain(&b"xxnee"[..], &b"dlexx"[..]);
    scan(SmallReads(reader), &["needle"], &mut found)?;
    assert!(found[0]);
    Ok(())
}

/// A reader that yields at most 3 bytes a time.
struct SmallReads<R>(R);

impl<R: Read> Read for SmallReads<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(3);
        self.0.read(&mut buf[..n])
    }
}

/// `WARM_POOL_SNAPSHOTS`: a second replica of the deployment keeps a session from the snapshot
/// ready; a create from that snapshot claims it (its files are the snapshot's, its environment the
/// request's), and once the snapshot is deleted the pool's members are retired.
#[tokio::test]
async fn a_warm_pool_kept_for_a_snapshot_hands_out_sessions_from_it() -> Result<()> {
    require_image(BUSYBOX);
    let svc = service("pool-snap", &[]).await?;
    let src = svc.session_of(BUSYBOX).await?;
    ok(
        &svc,
        &src,
        "echo pooled > /workspace/repo/p.txt && echo home > ~/h.txt",
    )
    .await?;
    let id = id_of(&snapshot(&svc, &src, json!({})).await?)?;
    let label = svc.label();
    let pooled = format!("{id}=1");
    let replica = ControlPlane::start_with(&[
        ("DEPLOYMENT", svc.deployment.as_str()),
        ("WARM_POOL_SNAPSHOTS", pooled.as_str()),
    ])
    .await?;
    let ready = || {
        containers_with(&[&label, &format!("daiv.sandbox.snapshot={id}")])
            .into_iter()
            .filter(|c| {
                inspect(c).is_some_and(|c| {
                    c["State"]["Running"] == true
                        && c["Name"]
                            .as_str()
                            .is_some_and(|n| n.starts_with("/daiv-pool-"))
                })
            })
            .collect::<Vec<_>>()
    };
    eventually(
        "a ready member from the snapshot",
        Duration::from_secs(90),
        || async { Ok((!ready().is_empty()).then_some(())) },
    )
    .await?;
    let claimed = replica
        .session(json!({"snapshot_id": id, "environment": {"MINE": "claimed"}}))
        .await?;
    let name = inspect(&claimed.id).context("claimed session")?["Name"].clone();
    assert!(
        name.as_str()
            .is_some_and(|n| n.starts_with("/daiv-claimed-")),
        "not claimed from the snapshot's pool: {name}"
    );
    assert_eq!(
        ok(
            &replica,
            &claimed,
            "cat /workspace/repo/p.txt ~/h.txt; echo $MINE"
        )
        .await?,
        "pooled\nhome\nclaimed\n"
    );
    // Another image's request never takes it.
    let cold = replica.session_of(BUSYBOX).await?;
    let cold_name = inspect(&cold.id).context("cold session")?["Name"].clone();
    assert!(
        !cold_name
            .as_str()
            .is_some_and(|n| n.starts_with("/daiv-claimed-")),
        "an image request took the snapshot's member: {cold_name}"
    );
    // The pool refills; once the snapshot is deleted its members go.
    eventually("the pool refilled", Duration::from_secs(90), || async {
        Ok((!ready().is_empty()).then_some(()))
    })
    .await?;
    assert_eq!(delete_snapshot(&svc, &id).await?, 204);
    eventually(
        "the snapshot's members retired",
        Duration::from_secs(90),
        || async { Ok(ready().is_empty().then_some(())) },
    )
    .await?;
    // The claimed session is a session like any other: it keeps working.
    assert_eq!(
        ok(&replica, &claimed, "cat /workspace/repo/p.txt").await?,
        "pooled\n"
    );
    Ok(())
}

/// A session paused or snapshotted the moment it is created still thaws: the service opens the
/// helper's channel (an exec) in the background after a create, and an exec frozen half-way would
/// hold the container in the runtime for good (the thaw waiting behind it, and with it every
/// Docker call that needs the container's lock).
#[tokio::test]
async fn a_session_frozen_right_after_its_create_thaws() -> Result<()> {
    require_image(BUSYBOX);
    let svc = service("fresh-freeze", &[]).await?;
    for round in 0..4 {
        let s = svc.session_of(BUSYBOX).await?;
        let (status, body) = if round % 2 == 0 {
            svc.call(Method::POST, &format!("/session/{}/pause/", s.id), None)
                .await?
        } else {
            svc.call(
                Method::POST,
                &format!("/session/{}/snapshot/", s.id),
                Some(json!({})),
            )
            .await?
        };
        ensure!(
            status == 204 || status == 201,
            "round {round}: {status} {body}"
        );
        assert_eq!(
            ok(&svc, &s, "echo thawed").await?,
            "thawed\n",
            "round {round}"
        );
        assert_eq!(svc.force_close(&s).await?, 204, "round {round}");
    }
    Ok(())
}

// === issue 43: layers ===

/// Host disk (KiB, `du -sk`) of this deployment's snapshot layers.
fn layers_kib(label: &str) -> Result<u64> {
    let mut total = 0;
    for v in volumes_with(&[label, "daiv.sandbox.role=snapshot-data"]) {
        let dir = volume_dir(&v)?;
        let out = Command::new("du").arg("-sk").arg(&dir).output()?;
        ensure!(out.status.success(), "du {}", dir.display());
        let kib = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap_or("0")
            .parse::<u64>()?;
        total += kib;
    }
    Ok(total)
}

/// What the checks below print of a generation: the deleted file, the replaced directory, the
/// sparse file's length and its blocks, the 0600 files (workspace and home), what each
/// generation wrote.
const GENERATIONS: &str = "cd /workspace/repo && { test -e gone.txt && echo gone-is-back || echo gone-is-gone; } \
    && ls dir && stat -c '%s %a %n' sparse.bin secret.txt /home/sandbox/secret \
    && cat secret.txt /home/sandbox/secret keep.txt two.txt \
    && echo blocks=$(du -k sparse.bin | cut -f1)";

/// How sessions from snapshots get their workspace: `"auto"` (overlays, which this machine's
/// engine mounts) or `"copy"` (an operator's `SNAPSHOT_LAYERS=copy`, as on an engine that
/// cannot mount them).
/// With `state` `"volumes"`, home and the shared temporary directories are checked as the
/// workspace is, and that nothing was committed.
async fn generations(image: &str, runtime: &str, layers: &str, state: &str) -> Result<()> {
    require_image(image);
    let volumes = state == "volumes";
    let svc = service(
        &format!("layers-{runtime}-{layers}-{state}"),
        &[
            ("RUNTIME", runtime),
            ("SNAPSHOT_LAYERS", layers),
            ("SNAPSHOT_STATE", state),
            ("REAPER_ENABLED", "true"),
            ("REAPER_INTERVAL_SECONDS", "1"),
            ("SESSION_GRACE_SECONDS", "1"),
            ("RUNNING_SESSION_MAX_IDLE_SECONDS", "0"),
            ("SNAPSHOT_TTL_SECONDS", "0"),
        ],
    )
    .await?;
    let cp = &*svc;
    let label = svc.label();
    let first = cp.session_of(image).await?;
    ok(
        cp,
        &first,
        "cd /workspace/repo && echo gone > gone.txt && mkdir -p dir/old && echo old > dir/old/x \
         && echo keep > keep.txt && printf 'secret\\n' > secret.txt && chmod 600 secret.txt \
         && printf 'home\\n' > /home/sandbox/secret && chmod 600 /home/sandbox/secret \
         && truncate -s 1G base-sparse.bin",
    )
    .await?;
    if volumes {
        ok(
            cp,
            &first,
            "echo t > /tmp/t.txt && echo l > /run/lock/l && echo gone > /home/sandbox/gone \
             && mkdir -p /var/tmp/d && echo vt > /var/tmp/d/x && echo e2b > /home/user/u",
        )
        .await?;
    }
    let base = id_of(&snapshot(cp, &first, json!({})).await?)?;
    // The first snapshot copies the whole workspace, holes as holes.
    let base_kib = layers_kib(&label)?;
    ensure!(base_kib < 10 * 1024, "the base layer takes {base_kib} KiB");
    let second = cp.session(json!({"snapshot_id": base})).await?;
    // The engine's report says which, in `GET /engines/` and `/-/health/` alike.
    let mode = if layers == "copy" {
        "copies"
    } else {
        "overlay"
    };
    let (st, engines) = cp.call(Method::GET, "/engines/", None).await?;
    ensure!(st == 200, "{st} {engines}");
    ensure!(
        engines["engines"][0]["snapshot_layers"]["mode"] == mode,
        "{engines}"
    );
    let (st, health) = cp.call(Method::GET, "/-/health/", None).await?;
    ensure!(st == 200, "{st} {health}");
    ensure!(health["snapshot_layers"] == json!({ mode: 1 }), "{health}");
    // The second generation deletes a file, replaces a directory, makes a 1 GiB sparse file.
    ok(
        cp,
        &second,
        "cd /workspace/repo && rm gone.txt && rm -rf dir && mkdir dir && echo new > dir/y \
         && truncate -s 1G sparse.bin && echo two > two.txt",
    )
    .await?;
    if volumes {
        ok(
            cp,
            &second,
            "rm /home/sandbox/gone && truncate -s 1G /home/sandbox/sparse && rm -rf /var/tmp/d \
             && mkdir /var/tmp/d && echo new > /var/tmp/d/y",
        )
        .await?;
    }
    let before_forks = layers_kib(&label)?;
    // A fork of a fork of a fork: each a layer over the one it came from.
    let mut at = second;
    let mut generations = Vec::new();
    for _ in 0..3 {
        let mut forks = fork(cp, &at, json!({"count": 1})).await?;
        let next = forks.pop().context("a fork")?;
        generations.push(std::mem::replace(&mut at, next));
    }
    let out = ok(cp, &at, GENERATIONS).await?;
    let lines: Vec<&str> = out.lines().collect();
    ensure!(
        lines[..2] == ["gone-is-gone", "y"],
        "a deleted file or a replaced directory came back:\n{out}"
    );
    ensure!(
        lines[2] == "1073741824 644 sparse.bin"
            && lines[3] == "7 600 secret.txt"
            && lines[4] == "5 600 /home/sandbox/secret",
        "lengths and modes:\n{out}"
    );
    ensure!(
        lines[5..9] == ["secret", "home", "keep", "two"],
        "contents:\n{out}"
    );
    // gVisor's own file system reports a file's blocks from its length, not the host's: there
    // the host's disk below says whether holes stayed holes.
    let blocks: u64 = lines[9].trim_start_matches("blocks=").parse()?;
    ensure!(
        runtime == "runsc" || blocks < 1024,
        "the sparse file lost its holes: {out}"
    );
    if volumes {
        let out = ok(
            cp,
            &at,
            "cat /tmp/t.txt /run/lock/l /home/user/u && ls /var/tmp/d \
             && stat -c '%a %U' /tmp /var/tmp /run/lock \
             && { test -e /home/sandbox/gone && echo home-gone-is-back || echo home-gone-is-gone; } \
             && stat -c '%s' /home/sandbox/sparse && du -k /home/sandbox/sparse | cut -f1 \
             && touch /tmp/mine /run/lock/mine /home/sandbox/mine /home/user/mine && echo writable",
        )
        .await?;
        let lines: Vec<&str> = out.lines().collect();
        ensure!(
            lines[..4] == ["t", "l", "e2b", "y"]
                && lines[4..7] == ["1777 root", "1777 root", "1777 root"]
                && lines[7] == "home-gone-is-gone"
                && lines[8] == "1073741824"
                && lines[10] == "writable",
            "home and the temporary directories:\n{out}"
        );
        let blocks: u64 = lines[9].parse()?;
        ensure!(
            blocks < 1024,
            "the home's sparse file lost its holes: {out}"
        );
        // No commit: every layer is a state layer, the snapshot's image is the base image by
        // another name (a fork's goes once its forks hold their layers: they run from the
        // base image), and no image of the deployment's was made.
        let base_id = docker(&["image", "inspect", "--format", "{{.Id}}", image])?;
        for v in volumes_with(&[&label, "daiv.sandbox.role=snapshot-data"]) {
            let labels = volume_labels(&v).context("labels")?;
            ensure!(
                labels["daiv.sandbox.snapshot.layout"] == "state",
                "{labels}"
            );
        }
        let snap = docker(&[
            "image",
            "inspect",
            "--format",
            "{{.Id}}",
            &format!("daiv-sandbox-snapshot:{base}"),
        ])?;
        ensure!(
            snap.trim() == base_id.trim(),
            "snapshot {base} committed: {snap} is not {base_id}"
        );
        ensure!(images_with(&[&label]).is_empty(), "an image was committed");
    }
    // Three forks' layers hold what changed: the sparse file's holes stay holes.
    let after_forks = layers_kib(&label)?;
    ensure!(
        after_forks < before_forks + 3 * 1024,
        "three forks took {} KiB of layers (before: {before_forks} KiB)",
        after_forks - before_forks
    );
    // Each fork's snapshot is a layer over the ones below it; with copies, a base layer (no
    // volume of the deployment is an overlay).
    let overlays = volumes_with(&[&label])
        .into_iter()
        .filter(|v| {
            docker(&["volume", "inspect", "--format", "{{json .Options}}", v])
                .is_ok_and(|o| o.contains("overlay"))
        })
        .count();
    let stacked = volumes_with(&[&label, "daiv.sandbox.role=snapshot-data"])
        .into_iter()
        .filter(|v| {
            volume_labels(v).is_some_and(|l| {
                l["daiv.sandbox.snapshot.lowers"]
                    .as_str()
                    .is_some_and(|s| !s.is_empty())
            })
        })
        .count();
    if layers == "copy" {
        ensure!(
            stacked == 0 && overlays == 0,
            "{stacked} layered snapshots, {overlays} overlays with copies"
        );
    } else {
        ensure!(
            stacked >= 3 && overlays >= 1,
            "{stacked} layered snapshots, {overlays} overlays"
        );
    }

    // Everything goes once every snapshot and session does, the snapshots' names for the base
    // image too.
    let tags: Vec<String> = volumes_with(&[&label, "daiv.sandbox.role=snapshot-data"])
        .iter()
        .filter_map(|v| volume_labels(v))
        .filter_map(|l| l["daiv.sandbox.snapshot"].as_str().map(str::to_string))
        .map(|id| format!("daiv-sandbox-snapshot:{id}"))
        .collect();
    assert_eq!(delete_snapshot(cp, &base).await?, 204);
    for s in generations.iter().chain([&first, &at]) {
        cp.force_close(s).await?;
    }
    eventually("no layer left", Duration::from_secs(60), || async {
        let left: Vec<String> = volumes_but_shared_helper(&[&label])
            .into_iter()
            .chain(images_with(&[&label]))
            .chain(containers_but_workers(&[&label]))
            .collect();
        Ok(left.is_empty().then_some(()))
    })
    .await
    .with_context(|| format!("left: {:?}", volumes_but_shared_helper(&[&label])))?;
    for tag in tags {
        ensure!(
            docker(&["image", "inspect", &tag]).is_err(),
            "{tag} left behind"
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_fork_of_a_fork_of_a_fork_keeps_deletions_replaced_directories_holes_and_modes()
-> Result<()> {
    generations(DEBIAN, "runc", "auto", "commit").await
}

/// The same four generations where every session keeps what its user writes on volumes
/// (`SNAPSHOT_STATE=volumes`): home, `/tmp` and `/run/lock` are layers like the workspace, and
/// no snapshot commits (its image is Debian's, by another name).
#[tokio::test]
async fn a_fork_of_a_fork_of_a_fork_keeps_home_and_tmp_as_layers_and_commits_nothing() -> Result<()>
{
    generations(DEBIAN, "runc", "auto", "volumes").await
}

/// The same four generations where sessions from snapshots get copies (an engine that cannot
/// mount overlays, here by the operator's setting): the same files, each snapshot a base layer.
#[tokio::test]
async fn a_fork_of_a_fork_of_a_fork_keeps_the_same_files_when_the_engine_gives_copies() -> Result<()>
{
    generations(DEBIAN, "runc", "copy", "commit").await
}

#[tokio::test]
async fn a_fork_of_a_fork_of_a_fork_keeps_deletions_replaced_directories_holes_and_modes_under_gvisor()
-> Result<()> {
    // Busybox: Debian's coreutils cannot `ls` under this machine's gVisor release (see
    // docs/operations/isolation.md).
    generations(BUSYBOX, "runsc", "auto", "commit").await
}

/// The stack a flattening copies in the background is this deep (`snapshots::FLATTEN_AT`).
const FLATTEN_AT: usize = 8;

/// The snapshot session `s` came from, and the layers below its own, top first.
fn snapshot_and_lowers(s: &Session) -> Result<(String, Vec<String>)> {
    let info = inspect(&s.id).context("the fork's container")?;
    let snap = info["Config"]["Labels"]["daiv.sandbox.snapshot"]
        .as_str()
        .context("the fork's snapshot")?
        .to_string();
    let labels = volume_labels(&data_volume(&snap)).context("its layer")?;
    let lowers = labels["daiv.sandbox.snapshot.lowers"]
        .as_str()
        .unwrap_or_default()
        .split(',')
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    Ok((snap, lowers))
}

/// A chain of twenty forks, deeper than an overlay stacks: the stack under each deep enough
/// fork is flattened in the background (its view copied into a flat base layer, a marker
/// saying so), so every fork's snapshot stays a layer of its changes over fewer than
/// `FLATTEN_AT` layers (none is a whole view copied on the request path), the last fork mounts
/// a short stack, and it still sees the deleted file gone, the replaced directory, the sparse
/// file's holes, the 0600 files and what every generation wrote. Everything goes with the
/// sessions.
#[tokio::test]
async fn a_chain_of_twenty_forks_is_flattened_in_the_background_and_every_fork_stays_a_layer()
-> Result<()> {
    require_image(DEBIAN);
    let svc = service(
        "flatten",
        &[
            ("SNAPSHOT_STATE", "volumes"),
            ("REAPER_ENABLED", "true"),
            ("REAPER_INTERVAL_SECONDS", "1"),
            ("SESSION_GRACE_SECONDS", "1"),
            ("RUNNING_SESSION_MAX_IDLE_SECONDS", "0"),
        ],
    )
    .await?;
    let cp = &*svc;
    let label = svc.label();
    let first = cp.session_of(DEBIAN).await?;
    ok(
        cp,
        &first,
        "cd /workspace/repo && echo gone > gone.txt && mkdir -p dir/old && echo old > dir/old/x \
         && printf 'secret\\n' > secret.txt && chmod 600 secret.txt && truncate -s 1G sparse.bin \
         && printf 'home\\n' > /home/sandbox/secret && chmod 600 /home/sandbox/secret",
    )
    .await?;
    let mut at = first;
    let mut chain = Vec::new();
    let mut flats = 0;
    for n in 1..=20 {
        let change = match n {
            2 => "cd /workspace/repo && rm gone.txt && rm -rf dir && mkdir dir && echo new > dir/y"
                .to_string(),
            _ => format!("echo {n} > /workspace/repo/g{n}.txt"),
        };
        ok(cp, &at, &change).await?;
        let next = fork(cp, &at, json!({"count": 1}))
            .await?
            .pop()
            .context("a fork")?;
        chain.push(std::mem::replace(&mut at, next));
        let (snap, lowers) = snapshot_and_lowers(&at)?;
        // The first fork's snapshot is its fresh source's whole workspace; every later one a
        // layer over what its source mounted, cut short by the flat copies.
        ensure!(
            (n == 1) == lowers.is_empty() && lowers.len() < FLATTEN_AT,
            "fork {n}: snapshot {snap} over {lowers:?}"
        );
        if lowers.len() + 1 >= FLATTEN_AT {
            // Queued by the fork's snapshot; waited for here so that the chain goes on over
            // the short stack rather than racing the copy.
            let marker = format!("daiv-snapshot-{}-flat", lowers[0]);
            eventually(&marker, Duration::from_secs(60), || async {
                Ok(volume_labels(&marker).map(|_| ()))
            })
            .await?;
            flats += 1;
        }
    }
    ensure!(flats >= 2, "{flats} stacks flattened");
    // The last fork's overlay stacks fewer than FLATTEN_AT layers.
    let info = inspect(&at.id).context("the last fork")?;
    let workspace = info["Mounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["Destination"] == "/workspace"))
        .and_then(|m| m["Name"].as_str())
        .context("its workspace volume")?
        .to_string();
    let options = docker(&[
        "volume",
        "inspect",
        "--format",
        "{{json .Options}}",
        &workspace,
    ])?;
    let options: Value = serde_json::from_str(options.trim())?;
    let layers = options["o"]
        .as_str()
        .and_then(|o| o.split(',').find_map(|kv| kv.strip_prefix("lowerdir=")))
        .context("an overlay")?
        .split(':')
        .count();
    ensure!(
        layers < FLATTEN_AT + 1,
        "the last fork mounts {layers} layers"
    );
    let out = ok(
        cp,
        &at,
        "cd /workspace/repo && { test -e gone.txt && echo gone-is-back || echo gone-is-gone; } \
         && ls dir && stat -c '%s %a %n' sparse.bin secret.txt /home/sandbox/secret \
         && echo blocks=$(du -k sparse.bin | cut -f1) && cat g*.txt | sort -n | tr '\\n' ' '",
    )
    .await?;
    let lines: Vec<&str> = out.lines().collect();
    ensure!(
        lines[..2] == ["gone-is-gone", "y"]
            && lines[2] == "1073741824 644 sparse.bin"
            && lines[3] == "7 600 secret.txt"
            && lines[4] == "5 600 /home/sandbox/secret",
        "the last fork's files:\n{out}"
    );
    let blocks: u64 = lines[5].trim_start_matches("blocks=").parse()?;
    ensure!(blocks < 1024, "the sparse file lost its holes: {out}");
    let wrote: Vec<String> = (1..=20)
        .filter(|n| *n != 2)
        .map(|n| n.to_string())
        .collect();
    ensure!(
        lines[6].split_whitespace().collect::<Vec<_>>() == wrote,
        "what the generations wrote:\n{out}"
    );

    // Every session gone, nothing of the chain is left: layers, flat copies, markers, views.
    for s in chain.iter().chain([&at]) {
        cp.force_close(s).await?;
    }
    eventually("no layer left", Duration::from_secs(60), || async {
        let left: Vec<String> = volumes_but_shared_helper(&[&label])
            .into_iter()
            .chain(images_with(&[&label]))
            .chain(containers_but_workers(&[&label]))
            .collect();
        Ok(left.is_empty().then_some(()))
    })
    .await
    .with_context(|| format!("left: {:?}", volumes_but_shared_helper(&[&label])))?;
    Ok(())
}

/// A tree the layer copy will not walk (deeper than 256 directories) is a clear 422, the
/// session thawed and nothing of the snapshot left.
#[tokio::test]
async fn a_tree_too_deep_to_copy_is_a_422_and_leaves_nothing() -> Result<()> {
    require_image(BUSYBOX);
    let svc = service("deep", &[]).await?;
    let cp = &*svc;
    let label = svc.label();
    let first = cp.session_of(BUSYBOX).await?;
    let base = id_of(&snapshot(cp, &first, json!({})).await?)?;
    let from = cp.session(json!({"snapshot_id": base})).await?;
    ok(
        cp,
        &from,
        "cd /workspace/repo && mkdir -p $(for i in $(seq 300); do printf d/; done)",
    )
    .await?;
    let data_before = volumes_with(&[&label, "daiv.sandbox.role=snapshot-data"]);
    let images_before = images_with(&[&label]);
    let (status, body) = cp
        .call(
            Method::POST,
            &format!("/session/{}/snapshot/", from.id),
            Some(json!({})),
        )
        .await?;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("deeper than 256")),
        "{body}"
    );
    assert!(!paused(&from.id), "the session stays frozen");
    assert_eq!(ok(cp, &from, "echo alive").await?, "alive\n");
    assert_eq!(
        volumes_with(&[&label, "daiv.sandbox.role=snapshot-data"]),
        data_before
    );
    ensure!(
        containers_with(&[&label, "daiv.sandbox.role=layer-copier"]).is_empty(),
        "a copier left behind"
    );
    assert_eq!(
        images_with(&[&label]),
        images_before,
        "the commit left behind"
    );
    Ok(())
}
