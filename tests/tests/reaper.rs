//! The reaper on real Docker, with two replicas sharing one Redis and short settings: expired
//! stopped sessions go, the stopped cap evicts the oldest, an idle running session goes while one
//! with a command in flight stays, orphaned egress gateways and networks go, and only one replica
//! sweeps per interval.
//!
//! Each test is a deployment of its own (`DAIV_SANDBOX_DEPLOYMENT`, shared by its two replicas):
//! the reaper sweeps only its deployment, so these tests run beside any other.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use e2e::redis::Redis;
use e2e::{BUSYBOX, ControlPlane, docker, docker_quietly, eventually, inspect, require_image};
use reqwest::Method;

/// This test's deployment name.
fn deployment(test: &str) -> String {
    format!("e2e-{}-{test}", std::process::id())
}

/// Two replicas of deployment `test` with the reaper on, sweeping every second.
async fn replicas(
    redis: &Redis,
    test: &str,
    extra: &[(&str, &str)],
) -> Result<(ControlPlane, ControlPlane)> {
    let url = redis.url();
    let deployment = deployment(test);
    let mut env = vec![
        ("REDIS_URL", url.as_str()),
        ("DEPLOYMENT", deployment.as_str()),
        ("REAPER_ENABLED", "true"),
        ("REAPER_INTERVAL_SECONDS", "1"),
    ];
    env.extend_from_slice(extra);
    let a = ControlPlane::start_with(&env).await?;
    let b = ControlPlane::start_with(&env).await?;
    Ok((a, b))
}

fn sweeps(cps: &[&ControlPlane]) -> usize {
    cps.iter()
        .map(|cp| cp.logs().matches("reaper: sweeping").count())
        .sum()
}

/// Waits until the replicas have swept `n` more times between them.
async fn more_sweeps(cps: &[&ControlPlane], n: usize) -> Result<()> {
    let start = sweeps(cps);
    eventually("more sweeps", Duration::from_secs(30), || async {
        Ok((sweeps(cps) >= start + n).then_some(()))
    })
    .await
}

async fn gone(id: &str, within: Duration) -> Result<()> {
    eventually(&format!("{id} removed"), within, || async {
        Ok(inspect(id).is_none().then_some(()))
    })
    .await
}

fn running(id: &str) -> bool {
    inspect(id).is_some_and(|c| c["State"]["Running"].as_bool() == Some(true))
}

async fn stop(cp: &ControlPlane, id: &str) -> Result<()> {
    let (status, body) = cp
        .call(Method::DELETE, &format!("/session/{id}/"), None)
        .await?;
    if status != 204 {
        bail!("stop {id}: {status} {body}");
    }
    Ok(())
}

#[tokio::test]
async fn reaper_removes_stopped_sessions_after_the_grace_period_one_replica_at_a_time() -> Result<()>
{
    require_image(BUSYBOX);
    let redis = Redis::start()?;
    let started = Instant::now();
    let (a, b) = replicas(
        &redis,
        "grace",
        &[
            ("SESSION_GRACE_SECONDS", "3"),
            ("RUNNING_SESSION_MAX_IDLE_SECONDS", "0"),
        ],
    )
    .await?;
    let stopped = a.session_of(BUSYBOX).await?;
    let kept = b.session_of(BUSYBOX).await?;
    stop(&a, &stopped.id).await?;
    let stopped_at = Instant::now();
    gone(&stopped.id, Duration::from_secs(30)).await?;
    assert!(
        stopped_at.elapsed() >= Duration::from_secs(2),
        "removed before its grace period: {:?}",
        stopped_at.elapsed()
    );
    // A running session is not the grace period's business.
    more_sweeps(&[&a, &b], 2).await?;
    assert!(running(&kept.id));

    // One sweep per interval between the two replicas (each ticks every second).
    let elapsed = started.elapsed().as_secs_f64();
    let total = sweeps(&[&a, &b]);
    assert!(
        total >= 2 && (total as f64) <= elapsed + 2.0,
        "{total} sweeps in {elapsed:.1} s"
    );
    Ok(())
}

#[tokio::test]
async fn reaper_keeps_at_most_max_stopped_sessions_oldest_first() -> Result<()> {
    require_image(BUSYBOX);
    let redis = Redis::start()?;
    let (a, b) = replicas(
        &redis,
        "cap",
        &[
            ("MAX_STOPPED_SESSIONS", "2"),
            ("RUNNING_SESSION_MAX_IDLE_SECONDS", "0"),
        ],
    )
    .await?;
    let s1 = a.session_of(BUSYBOX).await?;
    let s2 = b.session_of(BUSYBOX).await?;
    let s3 = a.session_of(BUSYBOX).await?;
    for s in [&s1, &s2, &s3] {
        stop(&b, &s.id).await?;
    }
    gone(&s1.id, Duration::from_secs(30)).await?;
    more_sweeps(&[&a, &b], 2).await?;
    assert!(inspect(&s2.id).is_some() && inspect(&s3.id).is_some());
    Ok(())
}

#[tokio::test]
async fn reaper_removes_idle_running_sessions_but_not_one_with_a_command_in_flight() -> Result<()> {
    require_image(BUSYBOX);
    let redis = Redis::start()?;
    let (a, b) = replicas(&redis, "idle", &[("RUNNING_SESSION_MAX_IDLE_SECONDS", "3")]).await?;
    let idle = a.session_of(BUSYBOX).await?;
    let busy = a.session_of(BUSYBOX).await?;

    let command = b.sh(&busy, "sleep 9; echo done");
    let watch = async {
        gone(&idle.id, Duration::from_secs(30)).await?;
        // Idle longer than the window by now, but its lock is held: still there.
        assert!(running(&busy.id));
        Ok::<_, anyhow::Error>(())
    };
    let (command, watch) = tokio::join!(command, watch);
    watch?;
    assert_eq!(command?, (0, "done\n".to_string()));
    // The closing touch gave it a fresh window.
    more_sweeps(&[&a, &b], 1).await?;
    assert!(running(&busy.id));
    Ok(())
}

/// Something made with the docker CLI, removed on drop whatever happened.
struct Made {
    kind: &'static str,
    name: String,
}

impl Drop for Made {
    fn drop(&mut self) {
        let args: &[&str] = if self.kind == "network" {
            &["network", "rm"]
        } else {
            &["rm", "-fv"]
        };
        docker_quietly(&[args, &[self.name.as_str()]].concat());
    }
}

fn labels(role: &str, token: &str) -> Vec<String> {
    [
        "daiv.sandbox.managed=true".to_string(),
        format!("daiv.sandbox.deployment={}", deployment("orphans")),
        format!("daiv.sandbox.role={role}"),
        format!("daiv.sandbox.egress={token}"),
        "daiv.test=1".to_string(),
    ]
    .into_iter()
    .flat_map(|l| ["--label".to_string(), l])
    .collect()
}

/// An egress network and gateway for `token`, and its sandbox when `with_sandbox`.
fn triad(token: &str, with_sandbox: bool) -> Result<Vec<Made>> {
    let mut made = Vec::new();
    let net = format!("daiv-e2e-{token}");
    let mut args = vec!["network", "create", "--internal"];
    let l = labels("egress-network", token);
    args.extend(l.iter().map(String::as_str));
    args.push(&net);
    docker(&args)?;
    made.push(Made {
        kind: "network",
        name: net.clone(),
    });
    let mut roles = vec!["egress-gateway"];
    if with_sandbox {
        roles.push("sandbox");
    }
    for role in roles {
        let l = labels(role, token);
        let mut args = vec!["run", "-d", "--pull", "never", "--network", &net];
        args.extend(l.iter().map(String::as_str));
        args.extend([BUSYBOX, "sleep", "600"]);
        let id = docker(&args)?;
        // Containers before the network, as the drop order of `made` is reversed below.
        made.insert(
            0,
            Made {
                kind: "container",
                name: id,
            },
        );
    }
    Ok(made)
}

fn network_exists(name: &str) -> bool {
    docker(&["network", "inspect", name]).is_ok()
}

#[tokio::test]
async fn reaper_removes_orphaned_egress_gateways_and_networks() -> Result<()> {
    require_image(BUSYBOX);
    let redis = Redis::start()?;
    let pid = std::process::id();
    let orphan_token = format!("orphan{pid}");
    let live_token = format!("live{pid}");
    let orphan = triad(&orphan_token, false)?;
    let live = triad(&live_token, true)?;
    let (a, b) = replicas(
        &redis,
        "orphans",
        &[
            ("SESSION_GRACE_SECONDS", "2"),
            ("RUNNING_SESSION_MAX_IDLE_SECONDS", "0"),
        ],
    )
    .await?;
    let orphan_gateway = orphan[0].name.clone();
    gone(&orphan_gateway, Duration::from_secs(30)).await?;
    let orphan_net = format!("daiv-e2e-{orphan_token}");
    eventually(
        "orphan network removed",
        Duration::from_secs(10),
        || async { Ok((!network_exists(&orphan_net)).then_some(())) },
    )
    .await?;
    more_sweeps(&[&a, &b], 2).await?;
    // A triad whose sandbox exists is not an orphan.
    for m in &live {
        if m.kind == "container" {
            assert!(running(&m.name), "{} removed", m.name);
        } else {
            assert!(network_exists(&m.name), "{} removed", m.name);
        }
    }
    drop(live);
    drop(orphan);
    Ok(())
}

/// Stops (SIGSTOP) the session helper's processes (`init`, the process supervisor, and `serve`)
/// from outside, as root: what a wedged or hostile helper looks like to the control plane.
fn freeze_helper(id: &str) -> Result<()> {
    docker(&[
        "exec",
        "-u",
        "0",
        id,
        "sh",
        "-c",
        "for p in /proc/[0-9]*; do case \"$(tr '\\0' ' ' < $p/cmdline)\" in \
         *daiv-sandbox-helper\\ init*|*daiv-sandbox-helper\\ serve*) kill -STOP ${p#/proc/};; esac; done",
    ])?;
    Ok(())
}

/// Issue 25 #2: a session whose helper does not answer (stopped) holds up neither the reaper of
/// the deployment (another idle session is still removed, and so is the frozen one: a sandbox
/// that does not answer is not in use) nor a force delete of its own.
#[tokio::test]
async fn a_frozen_helper_holds_up_neither_the_reaper_nor_a_force_delete() -> Result<()> {
    require_image(BUSYBOX);
    let deployment = deployment("frozen");
    let cp = ControlPlane::start_with(&[
        ("DEPLOYMENT", deployment.as_str()),
        ("REAPER_ENABLED", "true"),
        ("REAPER_INTERVAL_SECONDS", "1"),
        ("RUNNING_SESSION_MAX_IDLE_SECONDS", "3"),
    ])
    .await?;
    let frozen = cp.session_of(BUSYBOX).await?;
    let doomed = cp.session_of(BUSYBOX).await?;
    let other = cp.session_of(BUSYBOX).await?;
    for s in [&frozen, &doomed, &other] {
        let (code, _) = cp.sh(s, "echo warm").await?;
        assert_eq!(code, 0);
    }
    freeze_helper(&frozen.id)?;
    freeze_helper(&doomed.id)?;
    // While the reaper may be asking its frozen helper, a force delete goes through.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (status, body) = cp
        .call(
            Method::DELETE,
            &format!("/session/{}/?force=true", doomed.id),
            None,
        )
        .await?;
    assert_eq!(status, 204, "{body}");
    gone(&doomed.id, Duration::from_secs(10)).await?;
    gone(&other.id, Duration::from_secs(30)).await?;
    gone(&frozen.id, Duration::from_secs(30)).await?;
    Ok(())
}
