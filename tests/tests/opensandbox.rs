//! OpenSandbox's Python SDK, unchanged, against the service's OpenSandbox API
//! (`DAIV_SANDBOX_OPENSANDBOX_PORT`): the oldest and the newest supported `opensandbox` (pinned in
//! integration/python/opensandbox-*.txt, each in its own venv from scripts/ensure-python-venv.sh) runs the programs of
//! integration/python/opensandbox_driver.py with only OPEN_SANDBOX_DOMAIN and
//! OPEN_SANDBOX_API_KEY pointing here, and each test asserts on what the program saw and on what
//! Docker shows afterwards: a turn, the synchronous SDK, refusals, and snapshots with the rest of
//! execd's file routes (search, moves, modes, replacements, reads by lines).

use std::path::PathBuf;

use anyhow::{Context, Result};
use e2e::python::{drive_script, venv_python};
use e2e::{
    ControlPlane, DEBIAN, DeploymentGuard, containers_but_workers, eventually, free_port,
    images_with, require_image, volumes_but_shared_helper,
};
use serde_json::{Value, json};

/// The supported range's ends, each in a venv of its own.
const NEWEST: &str = "opensandbox-1.2.1";
const OLDEST: &str = "opensandbox-1.1.1";

fn python(sdk: &str) -> PathBuf {
    venv_python(Some(sdk))
}

/// A service with its OpenSandbox API on a port of its own; its `host:port`.
async fn service(extra: &[(&str, &str)]) -> Result<(ControlPlane, String)> {
    require_image(DEBIAN);
    let port = free_port().to_string();
    let mut env: Vec<(&str, &str)> = vec![("OPENSANDBOX_PORT", &port)];
    env.extend_from_slice(extra);
    let cp = ControlPlane::start_with(&env).await?;
    Ok((cp, format!("127.0.0.1:{port}")))
}

/// Runs `scenario` of opensandbox_driver.py with `sdk` against `domain`; the JSON it printed.
async fn drive(sdk: &str, domain: &str, key: &str, scenario: &str, params: Value) -> Result<Value> {
    let env = [
        ("OPEN_SANDBOX_DOMAIN", domain.to_string()),
        ("OPEN_SANDBOX_API_KEY", key.to_string()),
        ("OS_PARAMS", params.to_string()),
    ];
    let env = env.map(|(k, v)| (k.to_string(), v)).to_vec();
    drive_script(python(sdk), "opensandbox_driver.py", scenario, env).await
}

/// The label every Docker object of `cp`'s deployment carries.
fn deployment_label(cp: &ControlPlane) -> String {
    format!("daiv.sandbox.deployment={}", cp.deployment)
}

fn assert_nothing_left(cp: &ControlPlane) {
    let label = deployment_label(cp);
    let left = containers_but_workers(&[&label]);
    assert!(left.is_empty(), "containers left: {left:?}");
}

async fn a_turn(sdk: &str, extra: &[(&str, &str)]) -> Result<()> {
    let (cp, domain) = service(extra).await?;
    let _guard = DeploymentGuard(cp.deployment.clone());
    let tag = format!("turn-{}", free_port());
    let v = drive(sdk, &domain, &cp.key, "turn", json!({ "tag": tag })).await?;
    assert_eq!(
        Some(v["sdk"].as_str().unwrap_or("")),
        sdk.strip_prefix("opensandbox-"),
        "{v}"
    );
    let id = v["id"].as_str().context("id")?;
    let gvisor = extra.contains(&("RUNTIME", "runsc"));
    let kernel = v["kernel_log"].to_string();
    assert_eq!(
        kernel.contains("gVisor"),
        gvisor,
        "the runtime asked for: {v}"
    );

    // Commands: the environment, both streams apart and a line per message, as they ran.
    assert_eq!(
        v["run"],
        json!({"stdout": ["bonjour", "late", "1000"], "stderr": ["oops"], "exit_code": 0, "error": null}),
        "{v}"
    );
    // Each stream's lines in order (the two streams are two pipes: their order between
    // them is the kernel's).
    let handled = |kind: &str| -> Vec<Value> {
        v["handled"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|h| h[0] == kind)
            .map(|h| h[1].clone())
            .collect()
    };
    assert_eq!(
        handled("out"),
        vec![json!("bonjour"), json!("late"), json!("1000")],
        "{v}"
    );
    assert_eq!(handled("err"), vec![json!("oops")], "{v}");
    assert!(
        v["spread_s"].as_f64().unwrap_or(0.0) > 0.3,
        "streamed as it ran: {v}"
    );
    assert_eq!(v["exit3"]["exit_code"], 3, "{v}");
    assert_eq!(v["exit3"]["stdout"], json!(["partial"]), "{v}");
    assert_eq!(v["exit3"]["error"]["name"], "CommandExecError", "{v}");
    assert_eq!(
        v["timed_out"]["exit_code"], 137,
        "killed at its timeout: {v}"
    );
    assert_eq!(
        v["bg_status"],
        json!({"running": false, "exit_code": 0}),
        "{v}"
    );
    assert_eq!(
        v["bg_logs"],
        json!({"content": "one\ntwo\n", "cursor": 8}),
        "{v}"
    );
    assert_eq!(v["bg_logs_from_4"], "two\n", "{v}");
    assert_eq!(
        v["as_root"]["status"], 400,
        "nothing runs as another user: {v}"
    );

    // A bash session: state kept, a timeout interrupts the run and not the session.
    let s = &v["session"];
    assert_eq!(s[0]["stdout"], json!(["/tmp"]), "{v}");
    assert_eq!(s[1]["stdout"], json!(["42", "/workspace"]), "{v}");
    assert_eq!(s[2]["exit_code"], 130, "{v}");
    assert_eq!(s[3]["stdout"], json!(["42"]), "{v}");

    // Files: up with their modes, down, their info, directories, removal.
    assert_eq!(v["read"], "hello world", "{v}");
    assert_eq!(v["read_bytes"], json!([0, 1, 255]), "{v}");
    assert_eq!(
        v["info"]["/workspace/hello.txt"],
        json!({"mode": 644, "size": 11, "type": "file", "owner": "user"}),
        "{v}"
    );
    assert_eq!(v["info"]["/workspace/d/a.bin"]["mode"], 600, "{v}");
    assert_eq!(v["cat_mode"], json!(["755"]), "the SDK's default mode: {v}");
    assert_eq!(v["after_delete"], json!(["gone", "dir"]), "{v}");
    assert_eq!(v["read_missing"]["status"], 404, "{v}");

    // The lifecycle.
    assert_eq!(v["get"]["state"], "Running", "{v}");
    assert_eq!(v["get"]["metadata"], json!({"suite": tag}), "{v}");
    let ttl = v["get"]["ttl_s"].as_f64().unwrap_or(0.0);
    assert!((200.0..=301.0).contains(&ttl), "the create's timeout: {v}");
    let renewed = v["renewed_ttl_s"].as_f64().unwrap_or(0.0);
    assert!((1700.0..=1801.0).contains(&renewed), "renewed: {v}");
    assert_eq!(v["patched"], json!({"k": "v"}), "{v}");
    assert_eq!(v["patched_get"], json!({"k": "v"}), "{v}");
    assert_eq!(v["listed"], json!([id]), "{v}");
    assert_eq!(v["pagination"]["total_items"], 1, "{v}");
    assert!(
        v["metrics"]["mem_total_mib"].as_f64().unwrap_or(0.0) > 0.0,
        "{v}"
    );
    assert_eq!(v["paused_state"], "Paused", "{v}");
    assert_eq!(v["resumed_state"], "Running", "{v}");
    assert_eq!(v["after_resume"], json!(["back", "bonjour"]), "{v}");
    assert_eq!(v["after_kill"]["status"], 404, "{v}");
    assert_nothing_left(&cp);
    Ok(())
}

#[tokio::test]
async fn the_newest_sdk_runs_a_turn() -> Result<()> {
    a_turn(NEWEST, &[]).await
}

#[tokio::test]
async fn the_oldest_sdk_runs_a_turn() -> Result<()> {
    a_turn(OLDEST, &[]).await
}

#[tokio::test]
async fn the_newest_sdk_runs_a_turn_on_gvisor() -> Result<()> {
    a_turn(NEWEST, &[("RUNTIME", "runsc")]).await
}

/// Files searched, moved, chmodded, replaced and read by lines; a snapshot taken, got, listed,
/// a sandbox made from it that sees what was written before it, both killed and the snapshot
/// deleted: then nothing of the deployment is left.
async fn snapshots_and_files(sdk: &str) -> Result<()> {
    let (cp, domain) = service(&[]).await?;
    let _guard = DeploymentGuard(cp.deployment.clone());
    let tag = format!("snap-{}", free_port());
    let v = drive(
        sdk,
        &domain,
        &cp.key,
        "snapshots_and_files",
        json!({ "tag": tag }),
    )
    .await?;
    assert_eq!(
        Some(v["sdk"].as_str().unwrap_or("")),
        sdk.strip_prefix("opensandbox-"),
        "{v}"
    );
    let id = v["id"].as_str().context("id")?;

    // Files: a search by name at every level, files only.
    assert_eq!(
        v["search"],
        json!({
            "/workspace/s/a.py": {"mode": 644, "size": 9, "type": "file"},
            "/workspace/s/sub/b.py": {"mode": 644, "size": 9, "type": "file"},
        }),
        "{v}"
    );
    assert_eq!(v["moved"], json!(["gone", "l1"]), "{v}");
    assert_eq!(v["chmodded"], json!(["700"]), "{v}");
    assert_eq!(
        v["chown"]["status"], 400,
        "files belong to the sandbox user: {v}"
    );
    assert_eq!(
        v["chown_left"],
        json!(["700"]),
        "refused before anything changed: {v}"
    );
    assert_eq!(v["replaced"], json!({"/workspace/s/app.cfg": 2}), "{v}");
    assert_eq!(
        v["replaced_text"], "host=db.internal\nstore=db.internal\n",
        "{v}"
    );
    assert_eq!(v["replaced_mode"], json!(["640"]), "its mode kept: {v}");
    assert_eq!(v["lines"], "l2\nl3\n", "{v}");

    // The snapshot: ready as it is answered, got, listed by its sandbox and by its name.
    let snap = v["snapshot"]["id"].as_str().context("snapshot id")?;
    assert_eq!(
        v["snapshot"],
        json!({"id": snap, "state": "Ready", "name": tag, "sandbox_id": id}),
        "{v}"
    );
    assert_eq!(
        v["got"],
        json!({"id": snap, "state": "Ready", "name": tag}),
        "{v}"
    );
    assert_eq!(v["listed"], json!([snap]), "{v}");
    assert_eq!(v["listed_total"], 1, "{v}");
    assert_eq!(v["listed_by_name"], json!([snap]), "{v}");
    // A sandbox from it sees the file as it was then; its source went on on its own.
    assert_eq!(v["restored_read"], "before the snapshot", "{v}");
    assert_eq!(v["restored_snapshot_id"], json!(snap), "{v}");
    assert_eq!(v["source_read"], "after the snapshot", "{v}");
    // Deleted: a 404, listed no more, and nothing of it left in Docker.
    assert_eq!(v["after_delete"]["status"], 404, "{v}");
    assert_eq!(v["listed_after_delete"], json!([]), "{v}");
    assert_nothing_left(&cp);
    let label = deployment_label(&cp);
    let left = || {
        let mut all = volumes_but_shared_helper(&[&label]);
        all.extend(images_with(&[&label]));
        all
    };
    eventually(
        "no volume or image of the deployment left",
        std::time::Duration::from_secs(60),
        || async { Ok(left().is_empty().then_some(())) },
    )
    .await
    .with_context(|| format!("left: {:?}", left()))?;
    Ok(())
}

#[tokio::test]
async fn the_newest_sdk_takes_snapshots_and_edits_files() -> Result<()> {
    snapshots_and_files(NEWEST).await
}

#[tokio::test]
async fn the_oldest_sdk_takes_snapshots_and_edits_files() -> Result<()> {
    snapshots_and_files(OLDEST).await
}

#[tokio::test]
async fn the_synchronous_sdk_and_refusals() -> Result<()> {
    let (cp, domain) = service(&[]).await?;
    let _guard = DeploymentGuard(cp.deployment.clone());
    let tag = format!("sync-{}", free_port());
    let v = drive(NEWEST, &domain, &cp.key, "sync_turn", json!({ "tag": tag })).await?;
    assert_eq!(v["run"]["stdout"], json!(["sync"]), "{v}");
    assert_eq!(v["read"], "sync file", "{v}");
    // A registry on a loopback port nothing listens on: the pull fails at once.
    let missing = format!(
        "127.0.0.1:{}/daiv-sandbox-no-such-image:latest",
        free_port()
    );
    let v = drive(
        NEWEST,
        &domain,
        &cp.key,
        "refused",
        json!({ "missing_image": missing }),
    )
    .await?;
    assert_eq!(v["wrong_key"]["status"], 401, "{v}");
    assert_eq!(v["wrong_key"]["code"], "UNAUTHORIZED", "{v}");
    assert_eq!(v["unknown_image"]["status"], 400, "{v}");
    assert!(
        v["unknown_image"]["message"]
            .as_str()
            .unwrap_or("")
            .contains(&missing),
        "{v}"
    );
    assert_nothing_left(&cp);
    Ok(())
}
