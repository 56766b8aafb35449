//! Snapshots and forks as hostile input, on real Docker: another deployment's snapshot image is
//! no `base_image` by any name (its tag, its id, a prefix of the id); a capped engine counts
//! creates from a snapshot and forks as it counts creates; a fork takes a create slot per build
//! it runs at once.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use e2e::fleet::{EnginesFile, local_engine};
use e2e::{
    BUSYBOX, ControlPlane, DeploymentGuard, containers_with, docker, eventually, require_image,
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
