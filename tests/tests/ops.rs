//! Operations: request logs, Prometheus metrics and Sentry reports, against the real binary (and
//! real Docker, except where a failing engine is the point). The docs page: `docs_page.rs`.

use std::time::Duration;

use anyhow::{Context, Result};
use e2e::fake_sentry::{FakeSentry, failing_docker};
use e2e::workspace::{Member, code, fs, fs_ok, gzip, seed, tar_of};
use e2e::{BUSYBOX, ControlPlane, require_image};
use reqwest::Method;
use serde_json::{Value, json};

fn b64(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// The value of one sample line (`name{labels} value`), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

async fn scrape(cp: &ControlPlane, key: Option<&str>) -> Result<(u16, String)> {
    let req = match key {
        Some(k) => cp.root().with_key(k).request(Method::GET, "/metrics"),
        None => cp.http().get(format!("{}/metrics", cp.base)),
    };
    let resp = req.send().await?;
    Ok((resp.status().as_u16(), resp.text().await?))
}

#[tokio::test]
async fn request_logs_are_json_lines_without_keys_secrets_or_contents() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start_with(&[("ENVIRONMENT", "production")]).await?;
    let secret = format!("env-secret-{}", std::process::id());
    let content = format!("file-content-marker-{}", std::process::id());
    let s = cp
        .session(json!({"base_image": BUSYBOX, "environment": {"TOKEN": secret}}))
        .await?;
    let written = fs_ok(
        &cp,
        &s,
        "write",
        json!({"path": "/workspace/repo/notes.txt", "content": b64(&content)}),
    )
    .await?;
    assert_eq!(code(&written), None, "{written}");
    let (code, out) = cp.sh(&s, "echo \"$TOKEN\" | wc -c").await?;
    assert_eq!(code, 0, "{out}");
    let status = cp.force_close(&s).await?;
    assert_eq!(status, 204);

    let logs = cp.logs();
    let lines: Vec<Value> = logs
        .lines()
        .map(|l| serde_json::from_str(l).with_context(|| format!("not a JSON line: {l}")))
        .collect::<Result<_>>()?;
    let write = lines
        .iter()
        .find(|l| l["message"] == "request" && l["route"] == "/session/{session_id}/fs/write")
        .with_context(|| format!("no request line for fs/write in:\n{logs}"))?;
    assert_eq!(write["method"], "POST");
    assert_eq!(write["status"], 200);
    assert_eq!(write["session_id"], s.id.as_str());
    assert!(write["elapsed_ms"].as_f64().is_some(), "{write}");
    assert_eq!(write["level"], "INFO");
    // One line per request: create, write, run, delete (plus the harness' health probes).
    let requests = lines.iter().filter(|l| l["message"] == "request").count();
    let probes = lines
        .iter()
        .filter(|l| l["message"] == "request" && l["route"] == "/-/health/")
        .count();
    assert_eq!(requests - probes, 4, "{logs}");

    assert!(!logs.contains(&cp.key), "the API key was logged");
    assert!(!logs.contains(&secret), "a session secret was logged");
    assert!(!logs.contains(&content), "a file's content was logged");
    assert!(
        !logs.contains(&b64(&content)),
        "a file's content was logged (base64)"
    );
    Ok(())
}

#[tokio::test]
async fn metrics_count_sessions_commands_fs_ops_seeds_locks_and_engine_errors() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start_with(&[("SESSION_LOCK_WAIT_SECONDS", "0.2")]).await?;
    let (status, _) = scrape(&cp, None).await?;
    assert_eq!(
        status, 403,
        "metrics need the API key unless METRICS_PUBLIC"
    );

    let s = cp.session_of(BUSYBOX).await?;
    let archive = gzip(&tar_of(&[Member::File(
        "README.md",
        b"hello seed\n",
        0o644,
    )])?)?;
    let seeded = seed(&cp, &s, vec![("repo_archive", archive)]).await?;
    assert_eq!(seeded.status, 204, "{:?}", seeded.body);
    let written = fs_ok(
        &cp,
        &s,
        "write",
        json!({"path": "/workspace/repo/a.txt", "content": b64("x")}),
    )
    .await?;
    assert_eq!(code(&written), None, "{written}");
    let (_, missing) = fs(
        &cp,
        &s,
        "read",
        json!({"path": "/workspace/repo/missing.txt"}),
    )
    .await?;
    assert_eq!(missing["error"]["code"], "not_found", "{missing}");
    // A session that does not exist: the engine's 404 on inspect.
    let (status, _) = cp
        .call(Method::GET, &format!("/session/{}/", "0".repeat(64)), None)
        .await?;
    assert_eq!(status, 404);
    cp.run(&s, json!({"commands": ["true", "echo two"]}))
        .await?;

    // Hold the session's lock with a slow command, then knock until a request gets 409.
    let slow = {
        let req = cp
            .request(Method::POST, &format!("/session/{}/", s.id))
            .json(&json!({"commands": ["sleep 3"]}));
        tokio::spawn(async move { req.send().await })
    };
    let mut busy = 0;
    for _ in 0..100 {
        let (status, _) = cp
            .call(Method::GET, &format!("/session/{}/", s.id), None)
            .await?;
        if status == 409 {
            busy += 1;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(busy, 1, "no request found the session busy");
    slow.await??.error_for_status()?;

    let (status, text) = scrape(&cp, Some(&cp.key)).await?;
    assert_eq!(status, 200);
    assert!(
        sample(&text, "daiv_sandbox_sessions{state=\"running\"}").is_some_and(|v| v >= 1.0),
        "{text}"
    );
    let status = cp.force_close(&s).await?;
    assert_eq!(status, 204);
    let (_, text) = scrape(&cp, Some(&cp.key)).await?;

    let expect = |series: &str, want: f64| {
        assert_eq!(sample(&text, series), Some(want), "{series} in:\n{text}");
    };
    expect("daiv_sandbox_sessions_created_total", 1.0);
    expect("daiv_sandbox_sessions_closed_total{mode=\"remove\"}", 1.0);
    expect("daiv_sandbox_commands_total", 3.0);
    expect("daiv_sandbox_command_batch_duration_seconds_count", 2.0);
    expect(
        "daiv_sandbox_fs_op_duration_seconds_count{op=\"write\",code=\"ok\"}",
        1.0,
    );
    expect(
        "daiv_sandbox_fs_op_duration_seconds_count{op=\"read\",code=\"not_found\"}",
        1.0,
    );
    expect(
        "daiv_sandbox_seed_duration_seconds_count{outcome=\"ok\"}",
        1.0,
    );
    assert!(
        sample(&text, "daiv_sandbox_seed_bytes_total").is_some_and(|b| b >= 11.0),
        "{text}"
    );
    expect("daiv_sandbox_session_lock_busy_total", 1.0);
    assert!(
        sample(&text, "daiv_sandbox_session_lock_wait_seconds_count").is_some_and(|n| n >= 6.0),
        "{text}"
    );
    // The unknown session was a Docker 404 on the inspect.
    assert!(
        sample(
            &text,
            "daiv_sandbox_engine_errors_total{op=\"inspect\",kind=\"not_found\",engine=\"default\"}"
        )
        .is_some_and(|n| n >= 1.0),
        "{text}"
    );
    assert!(
        sample(
            &text,
            "daiv_sandbox_engine_call_duration_seconds_count{op=\"create\",engine=\"default\"}"
        )
        .is_some_and(|n| n >= 1.0),
        "{text}"
    );
    assert!(
        text.contains("route=\"/session/{session_id}/fs/write\",status=\"200\""),
        "{text}"
    );
    assert!(!text.contains(&s.id), "session ids are not label values");
    Ok(())
}

#[tokio::test]
async fn metrics_public_setting_opens_the_page() -> Result<()> {
    let docker = failing_docker().await?;
    let host = format!("tcp://127.0.0.1:{}", docker.port);
    let cp = ControlPlane::start_with_process_env(
        &[("METRICS_PUBLIC", "true")],
        &[("DOCKER_HOST", host.as_str())],
    )
    .await?;
    let (status, text) = scrape(&cp, None).await?;
    assert_eq!(status, 200);
    // The engine failed the list: no gauge, and the failure is counted.
    assert!(!text.contains("daiv_sandbox_sessions{"), "{text}");
    assert!(
        sample(
            &text,
            "daiv_sandbox_engine_errors_total{op=\"list\",kind=\"unavailable\",engine=\"default\"}"
        ) == Some(1.0),
        "{text}"
    );
    Ok(())
}

/// A 5xx caused by an engine failure (a Docker API that answers 500) is reported once, with
/// release and environment, and with neither the API key nor anything from the request body.
#[tokio::test]
async fn a_server_error_is_reported_to_sentry_once_without_secrets() -> Result<()> {
    let sentry = FakeSentry::start().await?;
    let docker = failing_docker().await?;
    let host = format!("tcp://127.0.0.1:{}", docker.port);
    let dsn = sentry.dsn();
    let mut cp = ControlPlane::start_with_process_env(
        &[("ENVIRONMENT", "production"), ("SENTRY_DSN", dsn.as_str())],
        &[("DOCKER_HOST", host.as_str())],
    )
    .await?;
    let secret = format!("body-secret-{}", std::process::id());
    let (status, body) = cp
        .call(
            Method::POST,
            "/session/",
            Some(json!({"base_image": BUSYBOX, "environment": {"TOKEN": secret}})),
        )
        .await?;
    assert!((500..600).contains(&status), "{status} {body}");
    assert!(!body.to_string().contains("fake engine failure") || status == 503);

    let events = sentry.wait_for_events(1, Duration::from_secs(30)).await?;
    // A graceful stop flushes anything still queued: exactly one event in total.
    assert!(cp.terminate()?, "graceful shutdown failed");
    let events_after = sentry.events();
    assert_eq!(events_after.len(), 1, "{events_after:#?}");
    let event = &events[0];
    assert_eq!(event["release"], env!("CARGO_PKG_VERSION"));
    assert_eq!(event["environment"], "production");
    // `error` is the protocol's default level, which the SDK leaves out.
    assert_eq!(
        event["level"].as_str().unwrap_or("error"),
        "error",
        "{event}"
    );
    assert_eq!(event["tags"]["route"], "/session/");
    assert_eq!(event["tags"]["http.method"], "POST");
    assert!(
        event.get("request").is_none(),
        "request data attached: {event}"
    );

    for env in sentry.envelopes() {
        let raw = String::from_utf8_lossy(&env.body);
        assert!(!raw.contains(&cp.key), "API key sent to Sentry");
        assert!(!raw.contains(&secret), "request body sent to Sentry");
        assert!(
            !raw.to_ascii_lowercase().contains("x-api-key"),
            "headers sent to Sentry"
        );
    }
    Ok(())
}
