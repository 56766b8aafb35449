//! The secure runtime as it really behaves on this machine: under `runsc` the service probes
//! whether the commands agents run work (GNU `ls` and `stat` in the Debian image) and says so in
//! `/-/health/`, a metric and its log; and a Debian session under gVisor runs `ls`, `stat`, `cp`
//! and `git status` exactly as the probe said it would. On a runsc older than
//! release-20230227.0 (Debian 12's) the probe finds `statx` failing; on a newer one everything
//! passes. Either way the probe must match what a session sees.
//!
//! With no probe image and no warm pool (the defaults), each image is probed when a session
//! first uses it, and the verdict reaches the operator (`/-/health/`, the metrics, the log) and
//! the client (the session's `runtime_warning`, the `X-Daiv-Sandbox-Warning` header of a failed
//! command's answer).

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use e2e::{BUSYBOX, ControlPlane, DEBIAN, DeploymentGuard, eventually, require_image};
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
    no_probe_container_left(&cp).await?;

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

/// `GET /session/{id}/info/`.
async fn info(cp: &ControlPlane, id: &str) -> Result<Value> {
    let (s, b) = cp
        .call(Method::GET, &format!("/session/{id}/info/"), None)
        .await?;
    ensure!(s == 200, "{s} {b}");
    Ok(b)
}

/// `image`'s entry in `/-/health/`'s `runtime.runsc.images`, once its probe finished.
async fn image_verdict(cp: &ControlPlane, image: &str) -> Result<Value> {
    eventually(
        &format!("{image}'s verdict in /-/health/"),
        Duration::from_secs(120),
        || async {
            let (s, b) = cp.call(Method::GET, "/-/health/", None).await?;
            ensure!(s == 200, "{s} {b}");
            let images = b["runtime"]["runsc"]["images"].as_array().cloned();
            Ok(images
                .unwrap_or_default()
                .into_iter()
                .find(|i| i["image"] == image && !i["sound"].is_null()))
        },
    )
    .await
}

#[tokio::test]
async fn with_default_settings_each_sessions_image_is_probed_and_told() -> Result<()> {
    require_image(DEBIAN);
    require_image(BUSYBOX);
    let cp = ControlPlane::start_with(&[("RUNTIME", "runsc")]).await?;
    let _guard = DeploymentGuard(cp.deployment.clone());
    // Nothing probed at start-up: nothing known, and nothing said to be sound.
    let (_, b) = cp.call(Method::GET, "/-/health/", None).await?;
    ensure!(b["runtime"]["runsc"]["sound"].is_null(), "{b}");

    let mut ids = Vec::new();
    for image in [DEBIAN, DEBIAN, BUSYBOX] {
        let (s, b) = cp
            .call(
                Method::POST,
                "/session/",
                Some(json!({"base_image": image})),
            )
            .await?;
        ensure!(s == 200, "create {image}: {s} {b}");
        ids.push(b["session_id"].as_str().context("session_id")?.to_string());
    }
    let (debian, busybox) = (&ids[0], &ids[2]);

    let busybox_verdict = image_verdict(&cp, BUSYBOX).await?;
    ensure!(
        busybox_verdict["sound"] == true,
        "busybox's ls and stat work under any runsc: {busybox_verdict}"
    );
    let verdict = image_verdict(&cp, DEBIAN).await?;
    let sound = verdict["sound"].as_bool().context("sound")?;
    let (_, b) = cp.call(Method::GET, "/-/health/", None).await?;
    let runsc = &b["runtime"]["runsc"];
    let debians = runsc["images"]
        .as_array()
        .map(|a| a.iter().filter(|i| i["image"] == DEBIAN).count());
    ensure!(debians == Some(1), "two sessions, one probe: {runsc}");
    ensure!(
        runsc["sound"] == sound,
        "the runtime's verdict is the worst image's: {runsc}"
    );
    let metrics = cp.metrics().await?;
    ensure!(
        metrics.contains(&format!(
            "daiv_sandbox_runtime_sound{{runtime=\"runsc\"}} {}",
            u8::from(sound)
        )),
        "the metric disagrees with /-/health/ ({runsc})"
    );
    // The probes leave no container behind.
    no_probe_container_left(&cp).await?;

    // What the client sees: the session's info, and the answer of a command that failed.
    let busybox_info = info(&cp, busybox).await?;
    ensure!(
        busybox_info.get("runtime_warning").is_none(),
        "{busybox_info}"
    );
    let debian_info = info(&cp, debian).await?;
    let resp = cp
        .request(Method::POST, &format!("/session/{debian}/"))
        .json(&json!({"commands": ["ls /"]}))
        .send()
        .await?;
    let header = resp
        .headers()
        .get("x-daiv-sandbox-warning")
        .map(|v| v.to_str().unwrap_or_default().to_string());
    let ran: Value = resp.json().await?;
    let (code, out) = (
        &ran["results"][0]["exit_code"],
        &ran["results"][0]["output"],
    );
    if sound {
        ensure!(
            code == 0,
            "ls fails on an image the probe found sound: {ran}"
        );
        ensure!(
            debian_info.get("runtime_warning").is_none(),
            "{debian_info}"
        );
        ensure!(header.is_none(), "{header:?}");
        return Ok(());
    }
    let failing = verdict["failing"].as_array().context("failing")?;
    ensure!(
        failing.contains(&json!("ls")) && failing.contains(&json!("stat")),
        "{verdict}"
    );
    let reason = verdict["reason"].as_str().unwrap_or_default();
    ensure!(
        reason.contains("statx") && reason.contains("release-20230227.0"),
        "the reason names neither the cause nor the release that fixes it: {reason}"
    );
    let warning = debian_info["runtime_warning"].as_str().unwrap_or_default();
    ensure!(
        warning.contains("ls, stat fail") && warning.contains("release-20230227.0"),
        "no warning in the Debian session's info: {debian_info}"
    );
    ensure!(
        code != 0 && out.as_str().is_some_and(|o| o.contains("Invalid argument")),
        "the probe says ls fails, the session says otherwise: {ran}"
    );
    ensure!(
        header
            .as_deref()
            .is_some_and(|h| h.contains("ls, stat fail")),
        "no warning beside the failed command's answer: {header:?}"
    );
    ensure!(
        !out.as_str().unwrap_or_default().contains("runsc"),
        "the command's output is its own: {out}"
    );
    let logs = cp.logs();
    ensure!(
        logs.lines().any(|l| l.contains("ERROR")
            && l.contains(&format!("the runtime is not sound in image {DEBIAN}"))
            && l.contains("ls, stat fail")
            && l.contains("release-20230227.0")),
        "no error naming the image, the failing tools and the fix in the service's log"
    );
    Ok(())
}

/// Waits until no runtime-probe container of `cp`'s deployment is left.
async fn no_probe_container_left(cp: &ControlPlane) -> Result<()> {
    eventually(
        "the probes' containers gone",
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
    .await
}
