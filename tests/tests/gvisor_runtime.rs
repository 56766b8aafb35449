//! The secure runtime as it really behaves on this machine: under `runsc` the service probes
//! whether the commands agents run work (GNU `ls` and `stat` in the Debian image) and says so in
//! `/-/health/`, a metric and its log; and a Debian session under gVisor runs `ls`, `stat`, `cp`
//! and `git status` exactly as the probe said it would. On a runsc older than
//! release-20230227.0 (Debian 12's) the probe finds `statx` failing; on a newer one everything
//! passes. Either way the probe must match what a session sees.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use e2e::{ControlPlane, DEBIAN, DeploymentGuard, eventually, require_image};
use reqwest::Method;
use serde_json::{Value, json};

/// Runs `command` in `id`: its exit code and output.
async fn run(cp: &ControlPlane, id: &str, command: &str) -> Result<(i64, String)> {
    let (s, out) = cp
        .call(
            Method::POST,
            &format!("/session/{id}/"),
            Some(json!({ "commands": [command] })),
        )
        .await?;
    ensure!(s == 200, "{command}: {s} {out}");
    let r = &out["results"][0];
    Ok((
        r["exit_code"].as_i64().context("exit_code")?,
        r["output"].as_str().unwrap_or_default().to_string(),
    ))
}

#[tokio::test]
async fn the_gvisor_probe_says_what_a_debian_session_then_sees() -> Result<()> {
    require_image(DEBIAN);
    let cp =
        ControlPlane::start_with(&[("RUNTIME", "runsc"), ("RUNTIME_PROBE_IMAGE", DEBIAN)]).await?;
    let _guard = DeploymentGuard(cp.deployment.clone());

    let verdict: Value = eventually(
        "the runtime probe's verdict in /-/health/",
        Duration::from_secs(120),
        || async {
            let (s, b) = cp.call(Method::GET, "/-/health/", None).await?;
            ensure!(s == 200, "{s} {b}");
            let runsc = &b["runtime"]["runsc"];
            ensure!(runsc.is_object(), "no runsc entry in /-/health/: {b}");
            ensure!(runsc["image"] == DEBIAN, "{runsc}");
            Ok((!runsc["sound"].is_null()).then(|| runsc.clone()))
        },
    )
    .await?;
    let sound = verdict["sound"].as_bool().context("sound")?;
    let metrics = cp.metrics().await?;
    ensure!(
        metrics.contains(&format!(
            "daiv_sandbox_runtime_sound{{runtime=\"runsc\"}} {}",
            u8::from(sound)
        )),
        "the metric disagrees with /-/health/ ({verdict})"
    );
    // The probe leaves no container behind.
    eventually(
        "the probe's container gone",
        Duration::from_secs(30),
        || async {
            Ok(e2e::containers_with(&[
                &format!("daiv.sandbox.deployment={}", cp.deployment),
                "daiv.sandbox.role=runtime-probe",
            ])
            .is_empty()
            .then_some(()))
        },
    )
    .await?;

    let (s, b) = cp
        .call(
            Method::POST,
            "/session/",
            Some(json!({"base_image": DEBIAN})),
        )
        .await?;
    ensure!(s == 200, "create: {s} {b}");
    let id = b["session_id"].as_str().context("session_id")?.to_string();
    run(
        &cp,
        &id,
        "mkdir -p /workspace/repo && cd /workspace/repo && git init -q && echo x > f && \
         git add f && git -c user.email=a@b.test -c user.name=a commit -qm init",
    )
    .await?;
    let checks = [
        ("ls", "ls / && ls /workspace/repo"),
        ("stat", "stat /workspace/repo/f"),
        (
            "cp",
            "cp /workspace/repo/f /workspace/g && cat /workspace/g",
        ),
        ("git status", "cd /workspace/repo && git status --short"),
    ];
    let failing: Vec<&str> = verdict["failing"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for (name, command) in checks {
        let (code, out) = run(&cp, &id, command).await?;
        if sound {
            ensure!(
                code == 0,
                "{name} fails on a runtime the probe found sound: {out}"
            );
        } else if failing.contains(&name) {
            ensure!(
                code != 0 && out.contains("Invalid argument"),
                "the probe says {name} fails ({verdict}), but in a session it gave {code}: {out}"
            );
        }
    }
    if !sound {
        let reason = verdict["reason"].as_str().unwrap_or_default();
        ensure!(
            reason.contains("statx") && reason.contains("release-20230227.0"),
            "the reason names neither the cause nor the release that fixes it: {reason}"
        );
        ensure!(
            cp.logs()
                .contains("runtime probe: the runtime is not sound"),
            "no error in the service's log"
        );
    }
    Ok(())
}
