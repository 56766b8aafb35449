//! Sessions an operator and an SDK can see, on real Docker: the listing walked page by page while
//! sessions come and go, filters by state and metadata, a session's own lifetime ended, extended
//! and paused by the reaper (also after a restart of the service: the deadline is kept beside
//! the session, not in the process), what each command cost and the metrics of a session under
//! load, under runc and gVisor.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::{Result, ensure};
use e2e::{BUSYBOX, ControlPlane, DeploymentGuard, Session, eventually, inspect, require_image};
use reqwest::Method;
use serde_json::{Value, json};

async fn page(cp: &ControlPlane, query: &str) -> Result<Value> {
    let (status, body) = cp
        .call(Method::GET, &format!("/sessions/?{query}"), None)
        .await?;
    ensure!(status == 200, "GET /sessions/?{query}: {status} {body}");
    Ok(body)
}

fn ids(page: &Value) -> Vec<String> {
    page["sessions"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s["session_id"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

async fn info(cp: &ControlPlane, id: &str) -> Result<(u16, Value)> {
    cp.call(Method::GET, &format!("/session/{id}/info/"), None)
        .await
}

#[tokio::test]
async fn the_listing_walks_every_session_once_while_others_come_and_go() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start().await?;
    let _guard = DeploymentGuard(cp.deployment.clone());
    let mut lived = Vec::new();
    for i in 0..9 {
        let team = if i % 3 == 0 { "a" } else { "b" };
        lived.push(
            cp.session(
                json!({"base_image": BUSYBOX, "metadata": {"team": team, "i": i.to_string()}}),
            )
            .await?,
        );
    }
    let doomed = cp.session_of(BUSYBOX).await?;
    let mut made: Vec<Session> = Vec::new();
    let mut seen = Vec::new();
    let mut next: Option<String> = None;
    loop {
        let query = match &next {
            Some(n) => format!("limit=4&next={n}"),
            None => "limit=4".to_string(),
        };
        let p = page(&cp, &query).await?;
        seen.extend(ids(&p));
        if next.is_none() {
            ensure!(cp.force_close(&doomed).await? == 204);
        }
        made.push(cp.session_of(BUSYBOX).await?);
        match p["next"].as_str() {
            Some(n) => next = Some(n.to_string()),
            None => break,
        }
    }
    let unique: HashSet<&String> = seen.iter().collect();
    ensure!(unique.len() == seen.len(), "listed twice: {seen:?}");
    for s in &lived {
        ensure!(
            seen.contains(&s.id),
            "{} lived through the walk, not listed",
            s.id
        );
    }
    // Filters: metadata AND-ed, state.
    let a = page(&cp, "metadata=team%3Da").await?;
    ensure!(ids(&a).len() == 3, "{a}");
    let one = page(&cp, "metadata=team%3Da&metadata=i%3D3").await?;
    ensure!(ids(&one) == vec![lived[3].id.clone()], "{one}");
    let (status, _) = cp
        .call(Method::DELETE, &format!("/session/{}/", lived[1].id), None)
        .await?;
    ensure!(status == 204);
    let stopped = page(&cp, "state=stopped").await?;
    ensure!(ids(&stopped) == vec![lived[1].id.clone()], "{stopped}");
    // Info is the listing's object, with what Docker says of the container.
    let (status, i) = info(&cp, &lived[0].id).await?;
    ensure!(status == 200, "{i}");
    ensure!(i["state"] == "running" && i["base_image"] == BUSYBOX, "{i}");
    ensure!(i["metadata"] == json!({"team": "a", "i": "0"}), "{i}");
    ensure!(
        inspect(&lived[0].id).is_some_and(|c| c["State"]["Running"] == json!(true)),
        "docker disagrees"
    );
    Ok(())
}

#[tokio::test]
async fn deadlines_end_extend_and_pause_sessions_and_survive_a_restart() -> Result<()> {
    require_image(BUSYBOX);
    // The sessions are made by a service without a reaper, which then goes away: the deadlines
    // are enforced by the next one, from what the engine keeps.
    let first = ControlPlane::start().await?;
    let deployment = first.deployment.clone();
    let _guard = DeploymentGuard(deployment.clone());
    let short = first
        .session(json!({"base_image": BUSYBOX, "timeout_seconds": 5}))
        .await?;
    let extended = first
        .session(json!({"base_image": BUSYBOX, "timeout_seconds": 5}))
        .await?;
    let paused = first
        .session(json!({"base_image": BUSYBOX, "timeout_seconds": 5, "on_timeout": "pause"}))
        .await?;
    let untimed = first.session_of(BUSYBOX).await?;
    for secs in [30, 600] {
        let (status, body) = first
            .call(
                Method::POST,
                &format!("/session/{}/timeout/", extended.id),
                Some(json!({"timeout_seconds": secs})),
            )
            .await?;
        ensure!(
            status == 200 && body["expires_at"].is_string(),
            "{status} {body}"
        );
    }
    drop(first);

    let cp = ControlPlane::start_with(&[
        ("DEPLOYMENT", deployment.as_str()),
        ("REAPER_ENABLED", "true"),
        ("REAPER_INTERVAL_SECONDS", "1"),
    ])
    .await?;
    eventually(
        "the short session removed",
        Duration::from_secs(30),
        || async { Ok(inspect(&short.id).is_none().then_some(())) },
    )
    .await?;
    eventually(
        "the pausing session paused",
        Duration::from_secs(30),
        || async {
            let (_, i) = info(&cp, &paused.id).await?;
            Ok((i["state"] == "paused").then_some(()))
        },
    )
    .await?;
    for s in [&extended, &untimed] {
        let (status, i) = info(&cp, &s.id).await?;
        ensure!(status == 200 && i["state"] == "running", "{} {i}", s.id);
    }
    // The paused one thaws on its next request, as any paused session.
    let (code, out) = cp.sh(&paused, "echo thawed").await?;
    ensure!(code == 0 && out.trim() == "thawed", "{code} {out}");
    // No record outlives its session.
    eventually(
        "the removed session's record gone",
        Duration::from_secs(30),
        || async {
            let left = e2e::volumes_with(&[
                &format!("label=daiv.sandbox.deployment={deployment}"),
                &format!("label=daiv.sandbox.session={}", short.id),
            ]);
            Ok(left.is_empty().then_some(()))
        },
    )
    .await?;
    Ok(())
}

/// What a command that burns about a second of CPU and allocates about 100 MiB is reported to
/// have cost, under `runtime`.
async fn usage_under(runtime: &str) -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start_with(&[("RUNTIME", runtime)]).await?;
    let s = cp.session_of(BUSYBOX).await?;
    let results = cp
        .run(
            &s,
            json!({"commands": [
                // About a second of CPU here, however busy the machine (a count, not a clock).
                "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done",
                // `dd` holds its 100 MiB buffer for a second, blocked on a pipe nobody reads (the
                // peak is sampled every 100 ms: see sandbox-helper's `usage`).
                "(dd if=/dev/zero bs=100M count=1 2>/dev/null; true) | sleep 1; echo held",
                "true",
            ]}),
        )
        .await?;
    ensure!(results.len() == 3, "{results:?}");
    let cpu = results[0]["cpu_ms"].as_u64().unwrap_or(0);
    ensure!(
        cpu >= 300,
        "{runtime}: a loop of about a second of CPU used {cpu} ms: {}",
        results[0]
    );
    ensure!(
        results[0]["duration_ms"].is_u64(),
        "{runtime}: {}",
        results[0]
    );
    ensure!(
        results[1]["output"].as_str().map(str::trim) == Some("held"),
        "{}",
        results[1]
    );
    let rss = results[1]["max_rss_bytes"].as_u64().unwrap_or(0);
    ensure!(
        rss >= 90 << 20,
        "{runtime}: a 100 MiB buffer peaked at {rss} bytes: {}",
        results[1]
    );
    let idle = &results[2];
    ensure!(
        idle["cpu_ms"].as_u64().is_some_and(|c| c < 200)
            // A command gone before its first sample has no memory figure.
            && idle["max_rss_bytes"].as_u64().is_none_or(|m| m < 50 << 20),
        "{runtime}: `true` cost {idle}"
    );
    // An ended background process carries the same three, in its poll and in the list.
    let (status, started) = cp
        .call(
            Method::POST,
            &format!("/session/{}/processes/", s.id),
            Some(
                json!({"command": "(dd if=/dev/zero bs=64M count=1 2>/dev/null; true) | sleep 1"}),
            ),
        )
        .await?;
    ensure!(status == 201, "{status} {started}");
    let pid = started["process_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let ended = eventually("the process ended", Duration::from_secs(30), || async {
        let (_, p) = cp
            .call(
                Method::GET,
                &format!("/session/{}/processes/{pid}/?wait=5", s.id),
                None,
            )
            .await?;
        Ok((p["running"] == json!(false)).then_some(p))
    })
    .await?;
    ensure!(
        ended["max_rss_bytes"]
            .as_u64()
            .is_some_and(|m| m >= 60 << 20)
            && ended["cpu_ms"].is_u64()
            && ended["duration_ms"].is_u64(),
        "{runtime}: {ended}"
    );
    let (_, list) = cp
        .call(Method::GET, &format!("/session/{}/processes/", s.id), None)
        .await?;
    ensure!(
        list["processes"][0]["max_rss_bytes"] == ended["max_rss_bytes"],
        "{list}"
    );
    Ok(())
}

#[tokio::test]
async fn each_command_reports_its_cpu_time_and_peak_memory_under_runc() -> Result<()> {
    usage_under("runc").await
}

#[tokio::test]
async fn each_command_reports_its_cpu_time_and_peak_memory_under_runsc() -> Result<()> {
    usage_under("runsc").await
}

/// A session's metrics under load, under `runtime`: CPU and memory rise while a background
/// process burns a CPU and holds about 100 MiB, and the disk counts what was written.
async fn metrics_under(runtime: &str) -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start_with(&[
        ("RUNTIME", runtime),
        ("SESSION_METRICS_INTERVAL_SECONDS", "1"),
    ])
    .await?;
    let s = cp
        .session(json!({"base_image": BUSYBOX, "cpus": 1.0}))
        .await?;
    let (code, _) = cp
        .sh(
            &s,
            "dd if=/dev/zero of=/workspace/repo/blob bs=1M count=20 2>/dev/null",
        )
        .await?;
    ensure!(code == 0);
    let (status, started) = cp
        .call(
            Method::POST,
            &format!("/session/{}/processes/", s.id),
            Some(json!({"command": "(dd if=/dev/zero bs=100M count=1 2>/dev/null; true) | sleep 30 & while :; do :; done"})),
        )
        .await?;
    ensure!(status == 201, "{status} {started}");
    let busy = eventually("a busy sample", Duration::from_secs(60), || async {
        let (status, m) = cp
            .call(Method::GET, &format!("/session/{}/metrics/", s.id), None)
            .await?;
        ensure!(status == 200, "{status} {m}");
        let found = m["samples"].as_array().and_then(|all| {
            all.iter()
                .find(|x| {
                    // The disk is read every sixth sample: its first reading may predate the
                    // write.
                    x["cpu_used_pct"].as_f64().is_some_and(|p| p > 20.0)
                        && x["mem_used"].as_u64().is_some_and(|b| b > 80 << 20)
                        && x["disk_used"].as_u64().is_some_and(|d| d >= 20 << 20)
                })
                .cloned()
        });
        Ok(found)
    })
    .await?;
    ensure!(busy["cpu_count"] == json!(1.0), "{runtime}: {busy}");
    ensure!(
        busy["mem_total"].as_u64().is_some_and(|t| t > 100 << 20),
        "{busy}"
    );
    ensure!(
        busy["disk_used"].as_u64().is_some_and(|d| d >= 20 << 20)
            && busy["disk_total"].as_u64().is_some_and(|t| t > 20 << 20),
        "{runtime}: 20 MiB written: {busy}"
    );
    // The series is bounded in time: a window before the session is empty.
    let (_, none) = cp
        .call(
            Method::GET,
            &format!("/session/{}/metrics/?end=1000", s.id),
            None,
        )
        .await?;
    ensure!(none["samples"] == json!([]), "{none}");
    // No per-session label reaches Prometheus.
    let scraped = cp.metrics().await?;
    ensure!(!scraped.contains(&s.id), "a session id in /metrics");
    Ok(())
}

#[tokio::test]
async fn metrics_rise_under_load_under_runc() -> Result<()> {
    metrics_under("runc").await
}

#[tokio::test]
async fn metrics_rise_under_load_under_runsc() -> Result<()> {
    metrics_under("runsc").await
}
