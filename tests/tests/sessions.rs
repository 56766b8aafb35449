//! Sessions and commands, end to end: the real binary against the real Docker engine.

use anyhow::Result;
use e2e::{BUSYBOX, ControlPlane, DEBIAN, inspect, require_image};
use reqwest::Method;
use serde_json::json;

#[tokio::test]
async fn auth_is_required_except_for_health_and_version() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start().await?;
    let http = cp.http();
    let url = cp.url("/session/");
    let r = http
        .post(&url)
        .json(&json!({"base_image": BUSYBOX}))
        .send()
        .await?;
    assert_eq!(r.status(), 403);
    assert_eq!(
        r.json::<serde_json::Value>().await?,
        json!({"detail": "API Key header is missing"})
    );
    let r = http
        .post(&url)
        .header("x-api-key", "wrong")
        .json(&json!({"base_image": BUSYBOX}))
        .send()
        .await?;
    assert_eq!(r.status(), 403);
    assert_eq!(
        r.json::<serde_json::Value>().await?,
        json!({"detail": "Invalid API Key"})
    );
    for path in [
        "/-/health/",
        "/-/version/",
        "/api/v1/-/health/",
        "/api/v1/-/version/",
    ] {
        let r = http.get(format!("{}{path}", cp.base)).send().await?;
        assert_eq!(r.status(), 200, "{path}");
    }
    let openapi: serde_json::Value = http
        .get(cp.url("/openapi.json"))
        .send()
        .await?
        .json()
        .await?;
    assert!(openapi["paths"]["/session/{session_id}/"].is_object());
    Ok(())
}

#[tokio::test]
async fn unknown_sessions_are_404_on_every_route() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start().await?;
    // A real container that is not a session must not be reachable through the API either.
    let foreign = e2e::docker(&["create", "--pull", "never", BUSYBOX, "true"])?;
    let _foreign_guard = e2e::Session {
        id: foreign.clone(),
    };
    assert_eq!(foreign.len(), 64, "docker create printed {foreign:?}");
    for id in ["0".repeat(64), foreign.clone(), foreign[..12].to_string()] {
        let path = format!("/session/{id}/");
        for (method, body) in [
            (Method::GET, None),
            (Method::POST, Some(json!({"commands": ["true"]}))),
            (Method::DELETE, None),
        ] {
            let (status, body) = cp.call(method.clone(), &path, body).await?;
            assert_eq!(status, 404, "{method} {path}: {body}");
        }
        let (status, _) = cp
            .call(Method::DELETE, &format!("{path}?force=true"), None)
            .await?;
        assert_eq!(status, 404);
    }
    assert!(
        inspect(&foreign).is_some(),
        "a foreign container was touched"
    );
    Ok(())
}

#[tokio::test]
async fn commands_see_workspace_env_pipefail_and_fail_fast() -> Result<()> {
    require_image(DEBIAN);
    let cp = ControlPlane::start().await?;
    let s = cp
        .session(json!({
            "base_image": DEBIAN,
            "environment": {"GREETING": "hello world"},
            "dockerfile": "FROM ignored",
            "some_future_field": {"x": 1}
        }))
        .await?;
    let results = cp
        .run(
            &s,
            json!({"commands": [
                "pwd; echo \"$GREETING\"; echo \"$HOME\"; touch \"$HOME/.probe\" && echo home-writable",
                "false | true",
                "echo out; echo err >&2; echo out2",
                "exit 7",
                "echo still-running"
            ]}),
        )
        .await?;
    assert_eq!(results.len(), 5);
    assert_eq!(
        results[0]["output"],
        "/workspace/repo\nhello world\n/home/sandbox\nhome-writable\n"
    );
    assert_eq!(results[0]["workdir"], "/workspace/repo");
    assert_eq!(results[1]["exit_code"], 1, "pipefail: {}", results[1]);
    assert_eq!(results[2]["output"], "out\nerr\nout2\n");
    assert_eq!(results[3]["exit_code"], 7);
    assert_eq!(results[4]["output"], "still-running\n");

    let results = cp
        .run(
            &s,
            json!({"commands": ["exit 3", "echo skipped"], "fail_fast": true}),
        )
        .await?;
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["exit_code"], 3);
    Ok(())
}

#[tokio::test]
async fn busybox_without_bash_still_gets_pipefail() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start().await?;
    let s = cp.session_of(BUSYBOX).await?;
    let (code, _) = cp.sh(&s, "false | true").await?;
    assert_eq!(code, 1);
    let (code, out) = cp
        .sh(&s, "ls -d /workspace/repo /workspace/skills /workspace/tmp")
        .await?;
    assert_eq!(code, 0, "{out}");
    Ok(())
}

#[tokio::test]
async fn a_timeout_kills_the_command_and_all_its_children() -> Result<()> {
    require_image(DEBIAN);
    let cp = ControlPlane::start().await?;
    let s = cp.session_of(DEBIAN).await?;
    let results = cp
        .run(
            &s,
            json!({"commands": ["echo before; sleep 1000 & sleep 1000", "echo never"], "timeout": 2}),
        )
        .await?;
    assert_eq!(results.len(), 1, "later commands are skipped: {results:?}");
    assert_eq!(results[0]["exit_code"], 124);
    assert_eq!(results[0]["output"], "before\n");
    let (_, ps) = cp.sh(&s, "ps -eo args").await?;
    assert!(
        !ps.contains("sleep 1000"),
        "a child survived its timeout:\n{ps}"
    );
    Ok(())
}

#[tokio::test]
async fn a_timeout_kills_children_on_busybox_too() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start().await?;
    let s = cp.session_of(BUSYBOX).await?;
    let results = cp
        .run(
            &s,
            json!({"commands": ["sleep 1000 & sleep 1000"], "timeout": 1}),
        )
        .await?;
    assert_eq!(results[0]["exit_code"], 124);
    let (_, ps) = cp
        .sh(
            &s,
            "ps -o args | grep -v grep | grep -c 'sleep 1000' || true",
        )
        .await?;
    assert_eq!(ps.trim(), "0", "a child survived its timeout");
    Ok(())
}

#[tokio::test]
async fn the_default_timeout_comes_from_the_setting() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start_with(&[("COMMAND_TIMEOUT", "1")]).await?;
    let s = cp.session_of(BUSYBOX).await?;
    let results = cp.run(&s, json!({"commands": ["sleep 30"]})).await?;
    assert_eq!(results[0]["exit_code"], 124);
    let results = cp
        .run(
            &s,
            json!({"commands": ["sleep 2; echo done"], "timeout": 0}),
        )
        .await?;
    assert_eq!(results[0]["exit_code"], 0);
    assert_eq!(results[0]["output"], "done\n");
    Ok(())
}

#[tokio::test]
async fn huge_output_is_capped_and_memory_stays_bounded() -> Result<()> {
    require_image(BUSYBOX);
    let cap: usize = 1024 * 1024;
    let cp = ControlPlane::start_with(&[("OUTPUT_MAX_BYTES", &cap.to_string())]).await?;
    let s = cp.session_of(BUSYBOX).await?;
    // 50 MB of output.
    // The service's own footprint (its binary grows with features) is not the point: what
    // streaming adds on top of it is.
    let before = cp.rss_kib().unwrap_or(0);
    let (code, out) = cp.sh(&s, "head -c 52428800 /dev/zero | tr '\\0' a").await?;
    assert_eq!(code, 0);
    assert!(
        out.starts_with(&"a".repeat(cap)),
        "kept output is the first {cap} bytes"
    );
    let marker = &out[cap..];
    assert!(
        marker.contains("output truncated: 51380224 bytes omitted"),
        "marker: {marker:?}"
    );
    let peak = cp.peak_rss_kib().unwrap_or(u64::MAX);
    // Buffering the output would need 50 MB at least; the service stays far below that.
    assert!(
        peak.saturating_sub(before) < 24 * 1024,
        "peak RSS {peak} KiB (from {before} KiB) while streaming 50 MB of output"
    );
    Ok(())
}

#[tokio::test]
async fn commands_run_unprivileged_without_network() -> Result<()> {
    require_image(DEBIAN);
    let cp = ControlPlane::start().await?;
    let s = cp.session_of(DEBIAN).await?;
    let (_, id) = cp.sh(&s, "id -u; id -g").await?;
    assert_eq!(id, "1000\n1000\n");
    let (_, caps) = cp
        .sh(&s, "grep -E '^Cap(Inh|Eff|Prm|Amb):' /proc/self/status")
        .await?;
    assert_eq!(caps.lines().count(), 4, "{caps}");
    for line in caps.lines() {
        assert!(
            line.ends_with("0000000000000000"),
            "capabilities left: {caps}"
        );
    }
    // The bounding set holds only what the helper keeps (KILL, SETGID, SETUID), and with
    // no-new-privileges nothing a command executes can gain them.
    let (_, bnd) = cp.sh(&s, "grep -E '^CapBnd:' /proc/self/status").await?;
    assert!(bnd.trim().ends_with("00000000000000e0"), "{bnd}");
    let (_, nnp) = cp.sh(&s, "grep NoNewPrivs /proc/self/status").await?;
    assert!(nnp.contains('1'), "{nnp}");
    // IPv6 is off in the session's network namespace.
    let (_, v6) = cp
        .sh(&s, "cat /proc/sys/net/ipv6/conf/all/disable_ipv6")
        .await?;
    assert_eq!(v6, "1\n");
    let (_, ifaces) = cp.sh(&s, "ls /sys/class/net").await?;
    assert_eq!(ifaces.split_whitespace().collect::<Vec<_>>(), vec!["lo"]);
    // No route anywhere (checked without sending a packet).
    let (code, routes) = cp.sh(&s, "ip route show; ip -6 route show").await?;
    assert_eq!((code, routes.trim()), (0, ""), "routes: {routes}");
    let info = inspect(&s.id).expect("container");
    assert_eq!(info["HostConfig"]["NetworkMode"], "none");
    assert_eq!(info["HostConfig"]["CapDrop"], json!(["ALL"]));
    assert_eq!(
        info["HostConfig"]["CapAdd"],
        json!(["SETUID", "SETGID", "KILL"])
    );
    assert!(info["HostConfig"]["PidsLimit"].as_i64().unwrap_or(0) > 0);
    Ok(())
}

#[tokio::test]
async fn memory_and_cpus_reach_the_container() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start().await?;
    let s = cp
        .session(json!({"base_image": BUSYBOX, "memory_bytes": 134217728, "cpus": 0.5}))
        .await?;
    let info = inspect(&s.id).expect("container");
    assert_eq!(info["HostConfig"]["Memory"], 134_217_728);
    assert_eq!(info["HostConfig"]["NanoCpus"], 500_000_000);
    assert_eq!(info["Config"]["Labels"]["daiv.sandbox.managed"], "true");
    Ok(())
}

#[tokio::test]
async fn stop_then_status_restarts_with_files_intact_and_force_removes() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start().await?;
    let s = cp.session_of(BUSYBOX).await?;
    let (code, _) = cp.sh(&s, "echo kept > /workspace/repo/file.txt").await?;
    assert_eq!(code, 0);
    let path = format!("/session/{}/", s.id);
    let (status, _) = cp.call(Method::DELETE, &path, None).await?;
    assert_eq!(status, 204);
    let info = inspect(&s.id).expect("stopped, not removed");
    assert_eq!(info["State"]["Running"], false);
    let (status, _) = cp.call(Method::GET, &path, None).await?;
    assert_eq!(status, 204);
    assert_eq!(inspect(&s.id).expect("container")["State"]["Running"], true);
    let (_, out) = cp.sh(&s, "cat /workspace/repo/file.txt").await?;
    assert_eq!(out, "kept\n");
    // A command on a stopped session restarts it too.
    cp.call(Method::DELETE, &path, None).await?;
    let (_, out) = cp.sh(&s, "cat /workspace/repo/file.txt").await?;
    assert_eq!(out, "kept\n");
    let (status, _) = cp
        .call(Method::DELETE, &format!("{path}?force=true"), None)
        .await?;
    assert_eq!(status, 204);
    assert!(inspect(&s.id).is_none(), "force must remove the container");
    let (status, _) = cp.call(Method::GET, &path, None).await?;
    assert_eq!(status, 404);
    Ok(())
}

#[tokio::test]
async fn a_missing_image_that_cannot_be_pulled_is_a_clear_4xx() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start().await?;
    // A registry on a loopback port nothing listens on: the engine's pull fails at once, and no
    // name goes to a resolver (a made-up `.test` registry would be looked up by the host's).
    let port = e2e::free_port();
    let image = format!("127.0.0.1:{port}/daiv-sandbox-no-such-image:latest");
    let image = image.as_str();
    let (status, body) = cp
        .call(
            Method::POST,
            "/session/",
            Some(json!({"base_image": image})),
        )
        .await?;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["detail"].as_str().unwrap_or("").contains(image),
        "{body}"
    );
    Ok(())
}

#[tokio::test]
async fn eight_sessions_in_parallel() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start().await?;
    let tasks = (0..8).map(|i| {
        let cp = &cp;
        async move {
            let s = cp.session_of(BUSYBOX).await?;
            let (code, out) = cp.sh(&s, &format!("echo session-{i} > f; cat f")).await?;
            anyhow::ensure!(
                code == 0 && out == format!("session-{i}\n"),
                "session {i}: {out}"
            );
            let status = cp.force_close(&s).await?;
            anyhow::ensure!(status == 204);
            Ok::<_, anyhow::Error>(())
        }
    });
    for r in futures::future::join_all(tasks).await {
        r?;
    }
    Ok(())
}

#[tokio::test]
async fn gvisor_sessions_really_run_under_gvisor() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start_with(&[("RUNTIME", "runsc")]).await?;
    let s = cp.session_of(BUSYBOX).await?;
    let info = inspect(&s.id).expect("container");
    assert_eq!(info["HostConfig"]["Runtime"], "runsc");
    let (code, out) = cp.sh(&s, "dmesg").await?;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("gVisor"), "not gVisor: {out}");
    let (_, id) = cp.sh(&s, "id -u; ls -d /workspace/repo").await?;
    assert_eq!(id, "1000\n/workspace/repo\n");
    let (_, ifaces) = cp.sh(&s, "ls /sys/class/net").await?;
    assert_eq!(
        ifaces.split_whitespace().collect::<Vec<_>>(),
        vec!["lo"],
        "isolated under gVisor too"
    );
    Ok(())
}
