//! Snapshots and forks as hostile input, on real Docker: another deployment's snapshot image is
//! no `base_image` by any name (its tag, its id, a prefix of the id); a capped engine counts
//! creates from a snapshot and forks as it counts creates; a fork takes a create slot per build
//! it runs at once; sparse files cannot become host disk past the size caps; no snapshot image
//! (every byte of its `docker save`) holds a caller's `environment` value or an egress secret.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use e2e::egress::{EgressSettings, start_upstream};
use e2e::fleet::{EnginesFile, local_engine};
use e2e::scan::{dir_contains, snapshot_contains};
use e2e::{
    BUSYBOX, ControlPlane, DeploymentGuard, containers_with, docker, eventually, inspect,
    require_image,
};
use reqwest::Method;
use serde_json::{Value, json};

async fn create(cp: &ControlPlane, body: Value) -> Result<(u16, Value)> {
    cp.call(Method::POST, "/session/", Some(body)).await
}

async fn session(cp: &ControlPlane, body: Value) -> Result<String> {
    let (s, b) = create(cp, body).await?;
    ensure!(s == 200, "create: {s} {b}");
    b["session_id"].as_str().map(String::from).context("no id")
}

async fn snapshot(cp: &ControlPlane, id: &str) -> Result<String> {
    let (s, b) = cp
        .call(
            Method::POST,
            &format!("/session/{id}/snapshot/"),
            Some(json!({})),
        )
        .await?;
    ensure!(s == 201, "snapshot: {s} {b}");
    b["snapshot_id"]
        .as_str()
        .map(String::from)
        .context("no snapshot_id")
}

async fn fork(cp: &ControlPlane, id: &str, count: u32) -> Result<(u16, Value)> {
    cp.call(
        Method::POST,
        &format!("/session/{id}/fork/"),
        Some(json!({ "count": count })),
    )
    .await
}

#[tokio::test]
async fn another_deployments_snapshot_is_no_base_image_by_tag_id_or_prefix() -> Result<()> {
    require_image(BUSYBOX);
    let b = ControlPlane::start().await?;
    let _gb = DeploymentGuard(b.deployment.clone());
    let a = ControlPlane::start().await?;
    let _ga = DeploymentGuard(a.deployment.clone());

    let source = session(
        &b,
        json!({"base_image": BUSYBOX, "environment": {"B_SECRET": "b-only"}}),
    )
    .await?;
    let (s, out) = b
        .call(
            Method::POST,
            &format!("/session/{source}/"),
            Some(json!({"commands": ["echo b-was-here > $HOME/marker"]})),
        )
        .await?;
    ensure!(s == 200, "{s} {out}");
    let snap = snapshot(&b, &source).await?;
    let image_id = docker(&[
        "image",
        "inspect",
        "--format",
        "{{.Id}}",
        &format!("daiv-sandbox-snapshot:{snap}"),
    ])?
    .trim()
    .to_string();
    let hex = image_id.trim_start_matches("sha256:").to_string();
    ensure!(hex.len() == 64, "{image_id}");

    for image in [
        format!("daiv-sandbox-snapshot:{snap}"),
        image_id.clone(),
        hex.clone(),
        hex[..12].to_string(),
        hex[..5].to_string(),
    ] {
        let (s, body) = create(&a, json!({"base_image": image})).await?;
        ensure!(
            s == 400 || s == 422,
            "{image}: deployment A made a session from B's snapshot image: {s} {body}"
        );
        let detail = body["detail"].as_str().unwrap_or_default();
        ensure!(!detail.contains(&b.deployment), "{detail}");
    }
    // Nothing of A's was made, and B's own snapshot route still serves B.
    ensure!(
        containers_with(&[&format!("daiv.sandbox.deployment={}", a.deployment)]).is_empty(),
        "A made containers"
    );
    let from = session(&b, json!({"snapshot_id": snap})).await?;
    let (s, out) = b
        .call(
            Method::POST,
            &format!("/session/{from}/"),
            Some(json!({"commands": ["cat $HOME/marker; echo \"[$B_SECRET]\""]})),
        )
        .await?;
    ensure!(s == 200, "{s} {out}");
    let text = out["results"][0]["output"].as_str().unwrap_or_default();
    ensure!(text.contains("b-was-here"), "{text}");
    ensure!(
        !text.contains("b-only"),
        "the source's environment came along: {text}"
    );
    Ok(())
}

#[tokio::test]
async fn a_capped_engine_counts_creates_from_snapshots_and_forks() -> Result<()> {
    require_image(BUSYBOX);
    let file = EnginesFile::new(&[local_engine(json!({"max_sessions": 3}))])?;
    let path = file.path_str();
    let cp = ControlPlane::start_with(&[("ENGINES_FILE", path.as_str())]).await?;
    let _guard = DeploymentGuard(cp.deployment.clone());
    let counted = |n: u64| {
        let cp = &cp;
        async move {
            eventually(
                &format!("{n} sessions counted"),
                Duration::from_secs(10),
                || async {
                    let (s, b) = cp.call(Method::GET, "/engines/", None).await?;
                    ensure!(s == 200, "{s} {b}");
                    Ok((b["engines"][0]["sessions"] == json!(n)).then_some(()))
                },
            )
            .await
        }
    };

    eventually("the engine up", Duration::from_secs(15), || async {
        let (_, b) = cp.call(Method::GET, "/engines/", None).await?;
        Ok((b["engines"][0]["state"] == "up").then_some(()))
    })
    .await?;
    let source = session(&cp, json!({"base_image": BUSYBOX})).await?;
    counted(1).await?;
    let snap = snapshot(&cp, &source).await?;
    // 1 + 3 > 3: refused before anything is frozen, with placement's reason.
    let (s, b) = fork(&cp, &source, 3).await?;
    ensure!(s == 503, "fork of 3 at 1/3: {s} {b}");
    let detail = b["detail"].as_str().unwrap_or_default();
    ensure!(detail.contains("at capacity (1/3 sessions)"), "{detail}");
    let (s, b) = fork(&cp, &source, 2).await?;
    ensure!(s == 201, "fork of 2 at 1/3: {s} {b}");
    counted(3).await?;
    let (s, b) = create(&cp, json!({"snapshot_id": snap})).await?;
    ensure!(s == 503, "create from a snapshot at 3/3: {s} {b}");
    let detail = b["detail"].as_str().unwrap_or_default();
    ensure!(detail.contains("at capacity (3/3 sessions)"), "{detail}");
    let (s, b) = create(&cp, json!({"base_image": BUSYBOX})).await?;
    ensure!(s == 503, "plain create at 3/3: {s} {b}");
    ensure!(
        containers_with(&[
            &format!("daiv.sandbox.deployment={}", cp.deployment),
            "daiv.sandbox.role=sandbox"
        ])
        .len()
            == 3,
        "more sessions than the engine's cap"
    );
    Ok(())
}

#[tokio::test]
async fn a_fork_takes_a_create_slot_for_each_build_it_runs_at_once() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start_with(&[
        ("MAX_CONCURRENT_CREATES", "2"),
        ("ADMISSION_QUEUE_LENGTH", "0"),
    ])
    .await?;
    let _guard = DeploymentGuard(cp.deployment.clone());
    let source = session(&cp, json!({"base_image": BUSYBOX})).await?;
    let forking = tokio::spawn(
        cp.request(Method::POST, &format!("/session/{source}/fork/"))
            .json(&json!({"count": 4}))
            .send(),
    );
    // Both slots are the fork's while it builds: another create finds none.
    eventually(
        "the fork holding both create slots",
        Duration::from_secs(20),
        || async {
            let m = cp.metrics().await?;
            Ok(
                m.contains("daiv_sandbox_admission_in_flight{class=\"create\"} 2")
                    .then_some(()),
            )
        },
    )
    .await?;
    let (s, b) = create(&cp, json!({"base_image": BUSYBOX})).await?;
    ensure!(
        s == 429,
        "a create beside a fork of 4 with 2 slots: {s} {b}"
    );
    let resp = forking.await??;
    ensure!(resp.status() == 201, "fork: {}", resp.status());
    let body: Value = resp.json().await?;
    ensure!(
        body["session_ids"].as_array().map(Vec::len) == Some(4),
        "{body}"
    );
    Ok(())
}

/// Runs `command` in `id` and requires exit 0.
async fn sh(cp: &ControlPlane, id: &str, command: &str) -> Result<String> {
    let (s, out) = cp
        .call(
            Method::POST,
            &format!("/session/{id}/"),
            Some(json!({ "commands": [command] })),
        )
        .await?;
    ensure!(s == 200, "{command}: {s} {out}");
    let r = &out["results"][0];
    ensure!(r["exit_code"] == 0, "{command}: {r}");
    Ok(r["output"].as_str().unwrap_or_default().to_string())
}

/// The snapshot payload (images and data volumes) of `deployment` on the engine.
fn snapshot_payload(deployment: &str) -> (Vec<String>, Vec<String>) {
    let ours = format!("daiv.sandbox.deployment={deployment}");
    (
        e2e::images_with(&[&ours, "daiv.sandbox.role=snapshot"]),
        e2e::volumes_with(&[&ours, "daiv.sandbox.role=snapshot-data"]),
    )
}

/// Sparse files (holes the archive and the commit write as zeros) over
/// `SNAPSHOT_SIZE_MAX_BYTES` are refused with 413, outside the workspace before the commit and
/// inside it as the copy passes the cap: nothing of the snapshot is left and the session, thawed,
/// keeps working. A small snapshot still goes through.
async fn sparse_files_are_refused(runtime: &str) -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start_with(&[
        ("RUNTIME", runtime),
        ("SNAPSHOT_SIZE_MAX_BYTES", "67108864"),
    ])
    .await?;
    let _guard = DeploymentGuard(cp.deployment.clone());
    let id = session(&cp, json!({"base_image": BUSYBOX})).await?;
    let nothing_left = || {
        let (images, volumes) = snapshot_payload(&cp.deployment);
        ensure!(
            images.is_empty() && volumes.is_empty(),
            "a refused snapshot left images {images:?}, volumes {volumes:?}"
        );
        Ok(())
    };
    let refused = |s: u16, b: &Value, what: &str| {
        ensure!(s == 413, "{what}: {s} {b}");
        let detail = b["detail"].as_str().unwrap_or_default();
        ensure!(
            detail.contains("SNAPSHOT_SIZE_MAX_BYTES"),
            "{what}: the 413 does not name the setting: {detail}"
        );
        Ok(())
    };

    // Outside the workspace (the home directory: the container's layer).
    sh(&cp, &id, "truncate -s 4G $HOME/hole && sync").await?;
    let (s, b) = cp
        .call(
            Method::POST,
            &format!("/session/{id}/snapshot/"),
            Some(json!({})),
        )
        .await?;
    refused(s, &b, "a 4 GiB hole in $HOME")?;
    let (s, b) = fork(&cp, &id, 1).await?;
    refused(s, &b, "a fork with a 4 GiB hole in $HOME")?;
    nothing_left()?;
    ensure!(sh(&cp, &id, "echo alive").await?.contains("alive"));

    // Inside the workspace: counted as it is copied.
    sh(
        &cp,
        &id,
        "rm $HOME/hole && truncate -s 4G /workspace/hole && sync",
    )
    .await?;
    let (s, b) = cp
        .call(
            Method::POST,
            &format!("/session/{id}/snapshot/"),
            Some(json!({})),
        )
        .await?;
    refused(s, &b, "a 4 GiB hole in /workspace")?;
    let (s, b) = fork(&cp, &id, 2).await?;
    refused(s, &b, "a fork with a 4 GiB hole in /workspace")?;
    ensure!(
        containers_with(&[
            &format!("daiv.sandbox.deployment={}", cp.deployment),
            "daiv.sandbox.role=sandbox"
        ])
        .len()
            == 1,
        "a refused fork made sessions"
    );
    nothing_left()?;
    ensure!(sh(&cp, &id, "echo alive").await?.contains("alive"));

    sh(&cp, &id, "rm /workspace/hole && echo small > /workspace/f").await?;
    let snap = snapshot(&cp, &id).await?;
    let (s, b) = cp
        .call(Method::GET, &format!("/snapshots/{snap}/"), None)
        .await?;
    ensure!(s == 200, "{s} {b}");
    let size = b["size_bytes"].as_u64().unwrap_or(u64::MAX);
    ensure!(size < 67_108_864, "a small snapshot's size: {size}");
    Ok(())
}

#[tokio::test]
async fn sparse_files_over_the_size_cap_are_refused_and_leave_nothing() -> Result<()> {
    sparse_files_are_refused("runc").await
}

#[tokio::test]
async fn sparse_files_over_the_size_cap_are_refused_under_gvisor() -> Result<()> {
    sparse_files_are_refused("runsc").await
}

/// `SNAPSHOT_MAX_BYTES` is room reserved before taking, forks' payloads counted: the snapshot
/// that would pass it is refused with 507 (the newest, not an old one evicted), and deleting a
/// snapshot makes room again.
#[tokio::test]
async fn the_deployments_byte_cap_refuses_the_newest_and_counts_forks() -> Result<()> {
    require_image(BUSYBOX);
    // Each snapshot here holds about 8 MiB of workspace plus its layer (the helper, about
    // 3 MiB): two fit under 24 MiB, a third does not.
    let cp = ControlPlane::start_with(&[("SNAPSHOT_MAX_BYTES", "25165824")]).await?;
    let _guard = DeploymentGuard(cp.deployment.clone());
    let id = session(&cp, json!({"base_image": BUSYBOX})).await?;
    sh(&cp, &id, "head -c 8388608 /dev/urandom > /workspace/data").await?;
    let first = snapshot(&cp, &id).await?;
    let (s, b) = fork(&cp, &id, 1).await?;
    ensure!(s == 201, "a fork with room: {s} {b}");
    let (s, b) = cp
        .call(
            Method::POST,
            &format!("/session/{id}/snapshot/"),
            Some(json!({})),
        )
        .await?;
    ensure!(s == 507, "a snapshot past the deployment's cap: {s} {b}");
    let detail = b["detail"].as_str().unwrap_or_default();
    ensure!(detail.contains("SNAPSHOT_MAX_BYTES"), "{detail}");
    let (s, b) = cp
        .call(Method::GET, &format!("/snapshots/{first}/"), None)
        .await?;
    ensure!(
        s == 200,
        "the older snapshot was evicted for the newest: {s} {b}"
    );
    let (s, b) = cp
        .call(Method::DELETE, &format!("/snapshots/{first}/"), None)
        .await?;
    ensure!(s == 204, "{s} {b}");
    snapshot(&cp, &id).await?;
    Ok(())
}

// === the caller's environment and the egress secret in no snapshot image ===

/// The variable every session below is given, each with a value of its own.
const CALLER_VAR: &str = "CALLER_TOKEN";

/// The value of [`CALLER_VAR`] a command in `id` sees.
async fn caller_var_in(cp: &ControlPlane, id: &str) -> Result<String> {
    sh(cp, id, &format!("printf %s \"${{{CALLER_VAR}:-unset}}\"")).await
}

/// `POST /session/{id}/fork/` of one, insisting on 201: the fork's id.
async fn fork_one(cp: &ControlPlane, id: &str) -> Result<String> {
    let (s, b) = fork(cp, id, 1).await?;
    ensure!(s == 201, "fork: {s} {b}");
    b["session_ids"][0]
        .as_str()
        .map(String::from)
        .context("no fork id")
}

/// The snapshot image a session was made from (its `daiv.sandbox.snapshot` label).
fn made_from(id: &str) -> Result<String> {
    let c = inspect(id).context("the fork is gone")?;
    let snap = c["Config"]["Labels"]["daiv.sandbox.snapshot"]
        .as_str()
        .filter(|s| !s.is_empty())
        .with_context(|| format!("{id} has no snapshot label"))?;
    Ok(format!("daiv-sandbox-snapshot:{snap}"))
}

/// The host directory of volume `name`.
fn volume_dir(name: &str) -> Result<std::path::PathBuf> {
    let dir = docker(&["volume", "inspect", "--format", "{{.Mountpoint}}", name])?;
    Ok(dir.trim().into())
}

/// A cold create, a warm-pool claim and an egress session (whose policy holds a secret), each
/// given a distinctive `environment` value: each is snapshotted, forked (the fork sees its
/// source's value) and its fork snapshotted too. Every snapshot image, the forks' own included,
/// is `docker save`d and every byte of it scanned (configs, `container_config` among them, and
/// every layer): no caller value and no secret anywhere, while a marker written in the home
/// directory is found (the scan read the layers). The recorded snapshots' data volumes hold none
/// either, and no session container's config (`docker inspect`: environment, labels, command)
/// holds a caller value.
async fn no_caller_value_in_a_snapshot(runtime: &str) -> Result<()> {
    require_image(BUSYBOX);
    let pid = std::process::id();
    let up = start_upstream()?;
    let settings = EgressSettings::for_upstream(&up)?;
    let cp = ControlPlane::start_with(&settings.env(&[("RUNTIME", runtime)])).await?;
    let _guard = DeploymentGuard(cp.deployment.clone());
    // The claim on a service of its own: with a pool of its image, a create there is a claim.
    let pooled = format!("{BUSYBOX}=1");
    let pool = ControlPlane::start_with(&[("RUNTIME", runtime), ("WARM_POOL", &pooled)]).await?;
    let _pool_guard = DeploymentGuard(pool.deployment.clone());

    let secret = format!("egress-secret-{pid}-c41d7e");
    let cold_value = format!("cold-value-{pid}-9f2a6b");
    let claimed_value = format!("claimed-value-{pid}-1d8e3c");
    let egress_value = format!("egress-value-{pid}-7b5f0a");
    let with_env = |value: &str| json!({"base_image": BUSYBOX, "environment": {CALLER_VAR: value}});

    let cold = session(&cp, with_env(&cold_value)).await?;
    let mut egress_body = with_env(&egress_value);
    egress_body["egress"] = json!({
        "policy": {
            "default": "deny",
            "rules": [{"host": "api.upstream.test", "methods": ["GET"], "inject": "tok"}]
        },
        "secrets": {"tok": {"header": "Authorization", "value": secret}}
    });
    let egress = session(&cp, egress_body).await?;
    let label = format!("daiv.sandbox.deployment={}", pool.deployment);
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
    let claimed = session(&pool, with_env(&claimed_value)).await?;
    let name = inspect(&claimed).context("claimed")?["Name"].clone();
    ensure!(
        name.as_str()
            .is_some_and(|n| n.starts_with("/daiv-claimed-")),
        "not claimed from the pool: {name}"
    );

    let values = [
        cold_value.as_str(),
        claimed_value.as_str(),
        egress_value.as_str(),
    ];
    let mut leaks = Vec::new();
    let mut images = Vec::new();
    for (what, cp, id, value) in [
        ("cold", &cp, &cold, &cold_value),
        ("claimed", &pool, &claimed, &claimed_value),
        ("egress", &cp, &egress, &egress_value),
    ] {
        ensure!(&caller_var_in(cp, id).await? == value, "{what}: not seen");
        let mark = format!("home-mark-{what}-{pid}");
        sh(
            cp,
            id,
            &format!("echo {mark} > $HOME/mark && echo {mark} > /workspace/repo/mark"),
        )
        .await?;
        let snap = snapshot(cp, id).await?;
        images.push((
            format!("{what}'s snapshot"),
            payload_image(&snap),
            mark.clone(),
        ));
        let data = format!("daiv-snapshot-{snap}-data");
        let mut needles: Vec<&str> = values.to_vec();
        needles.extend([secret.as_str(), mark.as_str()]);
        let (found, files) = dir_contains(&volume_dir(&data)?, &needles)?;
        ensure!(
            found[needles.len() - 1],
            "{what}: the workspace marker is not in {data} ({files} files): nothing was scanned"
        );
        if found[..needles.len() - 1].iter().any(|f| *f) {
            leaks.push(format!("{what}'s snapshot data volume {data}: {found:?}"));
        }
        // A session from the snapshot without an environment has none of the source's.
        let from = session(cp, json!({"snapshot_id": snap})).await?;
        ensure!(
            caller_var_in(cp, &from).await? == "unset",
            "{what}: a session from its snapshot has the source's environment"
        );
        // A fork has its source's environment; its own snapshot (alive while the fork is) and a
        // snapshot of the fork keep none of it.
        let fork = fork_one(cp, id).await?;
        ensure!(
            &caller_var_in(cp, &fork).await? == value,
            "{what}: the fork does not see its source's environment"
        );
        images.push((
            format!("{what}'s fork's snapshot"),
            made_from(&fork)?,
            mark.clone(),
        ));
        let of_fork = snapshot(cp, &fork).await?;
        images.push((
            format!("{what}'s fork, snapshotted"),
            payload_image(&of_fork),
            mark,
        ));
        for (whose, container) in [(what.to_string(), id), (format!("{what}'s fork"), &fork)] {
            let config = inspect(container).context("inspect")?["Config"].to_string();
            if values.iter().any(|v| config.contains(v)) {
                leaks.push(format!("{whose}'s container config: {config}"));
            }
        }
        for (whose, image, mark) in images.iter().rev().take(3) {
            let mut needles: Vec<&str> = values.to_vec();
            needles.extend([secret.as_str(), mark.as_str()]);
            // Its image, and its layers: where nothing was committed (the image is the base
            // image by another name) home is in a layer.
            let id = image.rsplit_once(':').map_or("", |(_, id)| id);
            let found = snapshot_contains(id, &needles)?;
            ensure!(
                found[needles.len() - 1],
                "{whose} ({image}): the home marker is in neither its docker save nor its layer: \
                 nothing was scanned"
            );
            if found[..needles.len() - 1].iter().any(|f| *f) {
                leaks.push(format!(
                    "{whose} ({image}) holds {:?}",
                    needles[..needles.len() - 1]
                        .iter()
                        .zip(&found)
                        .filter(|(_, f)| **f)
                        .map(|(n, _)| *n)
                        .collect::<Vec<_>>()
                ));
            }
        }
    }
    ensure!(images.len() == 9, "{images:?}");
    ensure!(
        leaks.is_empty(),
        "caller values kept:\n{}",
        leaks.join("\n")
    );
    Ok(())
}

fn payload_image(snapshot: &str) -> String {
    format!("daiv-sandbox-snapshot:{snapshot}")
}

#[tokio::test]
async fn no_snapshot_image_holds_a_callers_environment_or_secret() -> Result<()> {
    no_caller_value_in_a_snapshot("runc").await
}

#[tokio::test]
async fn no_snapshot_image_holds_a_callers_environment_or_secret_under_gvisor() -> Result<()> {
    no_caller_value_in_a_snapshot("runsc").await
}
