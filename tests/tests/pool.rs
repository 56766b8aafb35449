//! The warm pool on the real Docker engine: claims apply the request (environment, limits,
//! egress policy), racing replicas never share a member, dead members are replaced, force
//! deletes leave exactly the pool, and members survive a restart unless a setting removes them
//! on a clean shutdown, never across deployments.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use e2e::egress::{EgressSettings, Upstream, start_upstream};
use e2e::{
    BUSYBOX, ControlPlane, DEBIAN, DeploymentGuard, Session, containers_with, docker, eventually,
    inspect, networks_with, require_image,
};
use reqwest::Method;
use serde_json::json;

fn deployment(tag: &str) -> String {
    format!("e2e-pool-{tag}-{}-{:x}", std::process::id(), rand_u32())
}

fn rand_u32() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
}

fn name_of(id: &str) -> String {
    inspect(id)
        .and_then(|c| {
            c["Name"]
                .as_str()
                .map(|n| n.trim_start_matches('/').to_string())
        })
        .unwrap_or_default()
}

/// Ready members (running, named `daiv-pool-*`) of a deployment.
fn ready_members(deployment: &str) -> Vec<String> {
    let label = format!("daiv.sandbox.deployment={deployment}");
    containers_with(&[&label, "daiv.sandbox.role=sandbox", "daiv.sandbox.pool"])
        .into_iter()
        .filter(|id| {
            inspect(id).is_some_and(|c| {
                c["State"]["Running"] == json!(true)
                    && c["Name"]
                        .as_str()
                        .is_some_and(|n| n.starts_with("/daiv-pool-"))
            })
        })
        .collect()
}

async fn pool_of(deployment: &str, n: usize) -> Result<Vec<String>> {
    let d = deployment.to_string();
    eventually(
        &format!("{n} ready members"),
        Duration::from_secs(90),
        || {
            let d = d.clone();
            async move {
                let ready = ready_members(&d);
                Ok((ready.len() == n).then_some(ready))
            }
        },
    )
    .await
}

#[tokio::test]
async fn pool_claim_gets_environment_and_limits_and_matches_a_cold_session() -> Result<()> {
    require_image(BUSYBOX);
    let dep = deployment("env");
    let _guard = DeploymentGuard(dep.clone());
    let pooled = format!("{BUSYBOX}=2");
    let cp = ControlPlane::start_with(&[("DEPLOYMENT", &dep), ("WARM_POOL", &pooled)]).await?;
    let cold_cp = ControlPlane::start().await?;
    let members = pool_of(&dep, 2).await?;

    // A member is not a session until claimed.
    for id in &members {
        let (status, _) = cp
            .call(Method::GET, &format!("/session/{id}/"), None)
            .await?;
        assert_eq!(status, 404, "member {id} answered as a session");
        let (status, _) = cp
            .call(Method::DELETE, &format!("/session/{id}/?force=true"), None)
            .await?;
        assert_eq!(status, 404);
    }

    let body = json!({
        "base_image": BUSYBOX,
        "environment": {"POOL_E2E": "claimed value", "HOME": "/workspace/tmp"},
        "memory_bytes": 64 * 1024 * 1024,
        "cpus": 0.5,
    });
    let s = cp.session(body.clone()).await?;
    assert!(members.contains(&s.id), "not claimed from the pool");
    assert!(name_of(&s.id).starts_with("daiv-claimed-"));
    let cold = cold_cp.session(body).await?;
    assert!(!name_of(&cold.id).starts_with("daiv-"));

    // Commands and background processes see the request's environment.
    let (code, out) = cp.sh(&s, "echo \"$POOL_E2E|$HOME\"").await?;
    assert_eq!((code, out.as_str()), (0, "claimed value|/workspace/tmp\n"));
    let (status, started) = cp
        .call(
            Method::POST,
            &format!("/session/{}/processes/", s.id),
            Some(json!({"command": "echo \"bg:$POOL_E2E\""})),
        )
        .await?;
    assert_eq!(status, 201, "{started}");
    let pid = started["process_id"].as_str().context("process id")?;
    let polled = eventually("the process ends", Duration::from_secs(10), || async {
        let (_, v) = cp
            .call(
                Method::GET,
                &format!("/session/{}/processes/{pid}/?offset=0&wait=2", s.id),
                None,
            )
            .await?;
        Ok((v["running"] == json!(false)).then_some(v))
    })
    .await?;
    assert_eq!(polled["output"], json!("bg:claimed value\n"), "{polled}");
    // The sandbox user cannot rewrite the claim's environment.
    let (code, _) = cp
        .sh(
            &s,
            "echo '[[\"X\",\"y\"]]' > /.daiv-sandbox/session/environment",
        )
        .await?;
    assert_ne!(code, 0);

    // Same environment, user, limits, layout and isolation as a cold session of the request.
    let probe = "id; env | grep -v -e ^HOSTNAME= | sort; \
                 stat -c '%a %u %g %n' /workspace/* /home/sandbox /.daiv-sandbox; \
                 cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/cpu/cpu.cfs_quota_us \
                 2>/dev/null || cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/cpu.max; \
                 cat /proc/net/dev | tail -n +3 | cut -d: -f1";
    let (_, claimed_view) = cp.sh(&s, probe).await?;
    let (_, cold_view) = cold_cp.sh(&cold, probe).await?;
    assert_eq!(claimed_view, cold_view);
    assert!(
        claimed_view.contains("POOL_E2E=claimed value"),
        "{claimed_view}"
    );
    assert!(claimed_view.contains("67108864"), "{claimed_view}");
    let (a, b) = (
        inspect(&s.id).context("claimed")?,
        inspect(&cold.id).context("cold")?,
    );
    for field in [
        "Memory",
        "MemorySwap",
        "NanoCpus",
        "PidsLimit",
        "CapDrop",
        "SecurityOpt",
        "NetworkMode",
        "Runtime",
        "Init",
    ] {
        assert_eq!(a["HostConfig"][field], b["HostConfig"][field], "{field}");
    }
    assert_eq!(a["HostConfig"]["Memory"], json!(64 * 1024 * 1024));
    assert_eq!(a["HostConfig"]["NanoCpus"], json!(500_000_000));
    assert_eq!(a["Config"]["User"], b["Config"]["User"]);

    // The claim is counted, and the pool refills to its size with new containers.
    let metrics = cp.metrics().await?;
    assert!(
        metrics.contains(&format!(
            "daiv_sandbox_pool_claims_total{{image=\"{BUSYBOX}\",kind=\"isolated\"}} 1"
        )),
        "{metrics}"
    );
    let refilled = pool_of(&dep, 2).await?;
    assert!(!refilled.contains(&s.id));
    assert_eq!(cp.force_close(&s).await?, 204);
    assert_eq!(cold_cp.force_close(&cold).await?, 204);
    Ok(())
}

#[tokio::test]
async fn pool_replicas_claiming_at_once_never_share_a_member() -> Result<()> {
    claims_race(None).await
}

#[tokio::test]
async fn pool_replicas_with_redis_claiming_at_once_never_share_a_member() -> Result<()> {
    let redis = e2e::redis::Redis::start()?;
    claims_race(Some(redis.url())).await
}

async fn claims_race(redis: Option<String>) -> Result<()> {
    require_image(BUSYBOX);
    let dep = deployment("race");
    let _guard = DeploymentGuard(dep.clone());
    let pooled = format!("{BUSYBOX}=4");
    let mut env = vec![("DEPLOYMENT", dep.as_str()), ("WARM_POOL", pooled.as_str())];
    if let Some(url) = &redis {
        env.push(("REDIS_URL", url.as_str()));
    }
    let a = ControlPlane::start_with(&env).await?;
    let members = pool_of(&dep, 4).await?;
    let b = ControlPlane::start_with(&env).await?;
    // B adopts A's members (a replica start builds nothing while the pool is full).
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(ready_members(&dep).len(), 4);

    // Each claim carries its own environment; A opened the environment writers of the members
    // it built, so B's claims of those must not be overwritten by A's unused writers.
    let (ra, rb) = tokio::join!(
        futures::future::join_all((0..4).map(|i| create_busybox(&a, format!("a{i}")))),
        futures::future::join_all((0..4).map(|i| create_busybox(&b, format!("b{i}")))),
    );
    let tags: Vec<String> = (0..4)
        .map(|i| format!("a{i}"))
        .chain((0..4).map(|i| format!("b{i}")))
        .collect();
    let sessions: Vec<Session> = ra.into_iter().chain(rb).collect::<Result<_>>()?;
    let ids: HashSet<&str> = sessions.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids.len(), sessions.len(), "two clients got one container");
    let claimed = sessions
        .iter()
        .filter(|s| name_of(&s.id).starts_with("daiv-claimed-"))
        .count();
    assert!(
        sessions.iter().filter(|s| members.contains(&s.id)).count() >= 1,
        "nothing was claimed from the pool"
    );
    for s in &sessions {
        let (code, out) = a.sh(s, "echo ok").await?;
        assert_eq!((code, out.as_str()), (0, "ok\n"));
    }
    let total_claims: u64 = [&a, &b]
        .iter()
        .map(|cp| async move { cp.metrics().await })
        .collect::<futures::future::JoinAll<_>>()
        .await
        .into_iter()
        .map(|m| claims_in(&m.unwrap_or_default()))
        .sum();
    assert_eq!(
        total_claims as usize, claimed,
        "claims counted by both replicas"
    );
    // A goes away: what it opened ahead of claims closes unused and writes nothing.
    drop(a);
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (s, tag) in sessions.iter().zip(&tags) {
        let (code, out) = b.sh(s, "printf %s \"$CLAIM_TAG\"").await?;
        assert_eq!((code, out.as_str()), (0, tag.as_str()), "session {}", s.id);
    }
    Ok(())
}

async fn create_busybox(cp: &ControlPlane, tag: String) -> Result<Session> {
    let (status, v) = cp
        .call(
            Method::POST,
            "/session/",
            Some(json!({"base_image": BUSYBOX, "environment": {"CLAIM_TAG": tag}})),
        )
        .await?;
    if status != 200 {
        bail!("create: {status} {v}");
    }
    Ok(Session {
        id: v["session_id"].as_str().context("id")?.to_string(),
    })
}

fn claims_in(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("daiv_sandbox_pool_claims_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test]
async fn pool_member_killed_behind_the_services_back_is_replaced() -> Result<()> {
    require_image(BUSYBOX);
    let dep = deployment("kill");
    let _guard = DeploymentGuard(dep.clone());
    let pooled = format!("{BUSYBOX}=2");
    let cp = ControlPlane::start_with(&[
        ("DEPLOYMENT", &dep),
        ("WARM_POOL", &pooled),
        ("REAPER_ENABLED", "true"),
        ("REAPER_INTERVAL_SECONDS", "1"),
    ])
    .await?;
    let members = pool_of(&dep, 2).await?;
    let victim = members[0].clone();
    docker(&["kill", &victim])?;
    let d = dep.clone();
    let replaced = eventually(
        "the killed member is replaced",
        Duration::from_secs(60),
        || {
            let d = d.clone();
            let victim = victim.clone();
            async move {
                let ready = ready_members(&d);
                Ok(
                    (ready.len() == 2 && !ready.contains(&victim) && inspect(&victim).is_none())
                        .then_some(ready),
                )
            }
        },
    )
    .await?;
    assert!(replaced.contains(&members[1]), "the live member was kept");
    // The reaper never took a member for an idle or stopped session.
    let (status, _) = cp
        .call(Method::GET, &format!("/session/{}/", members[1]), None)
        .await?;
    assert_eq!(status, 404);
    Ok(())
}

/// The echo upstream and the egress settings pointing at it (the service is started by each test,
/// with its own pool settings).
fn egress_stack() -> Result<(Upstream, EgressSettings)> {
    let up = start_upstream()?;
    let settings = EgressSettings::for_upstream(&up)?;
    Ok((up, settings))
}

#[tokio::test]
async fn pool_egress_claim_enforces_the_requests_policy_and_secret_before_201() -> Result<()> {
    let (up, settings) = egress_stack()?;
    let dep = deployment("egress");
    let _guard = DeploymentGuard(dep.clone());
    let pooled = format!("{DEBIAN}=1");
    let env = settings.env(&[
        ("DEPLOYMENT", dep.as_str()),
        ("WARM_POOL_EGRESS", pooled.as_str()),
    ]);
    let cp = ControlPlane::start_with(&env).await?;
    let members = pool_of(&dep, 1).await?;

    let secret = "ghp_poolSecret0123456789";
    let s = cp
        .session(json!({
            "base_image": DEBIAN,
            "environment": {"POOL_E2E": "egress", "HTTPS_PROXY": "http://127.0.0.1:9"},
            "egress": {
                "policy": {"default": "deny", "intercept": "credentialed", "rules": [
                    {"host": "api.upstream.test", "methods": ["GET"], "inject": "tok"}
                ]},
                "secrets": {"tok": {"header": "Authorization", "value": format!("Bearer {secret}")}}
            }
        }))
        .await?;
    assert_eq!(s.id, members[0], "not claimed from the pool");
    // The very first command already runs under the request's policy and credential.
    let results = cp
        .run(
            &s,
            json!({"commands": [
                "curl -s -o /dev/null -w '%{http_code}' https://api.upstream.test/allowed",
                "curl -s -o /dev/null -w '%{http_connect}' https://other.upstream.test/",
                "echo \"$POOL_E2E $HTTPS_PROXY\"",
            ]}),
        )
        .await?;
    assert_eq!(results[0]["output"], json!("200"), "{results:?}");
    assert_eq!(results[1]["output"], json!("403"), "{results:?}");
    let out = results[2]["output"].as_str().unwrap_or_default();
    assert!(
        out.starts_with("egress http://100."),
        "proxy settings must win: {out}"
    );
    let seen = up.requests()?;
    let allowed = seen
        .iter()
        .find(|r| r["path"] == json!("/allowed"))
        .context("upstream saw the request")?;
    assert_eq!(
        allowed["headers"]["authorization"],
        json!(format!("Bearer {secret}"))
    );
    // The secret never reached the sandbox.
    let (_, grep) = cp
        .sh(
            &s,
            &format!("grep -rs {secret} /etc /workspace /home /.daiv-sandbox | wc -l"),
        )
        .await?;
    assert_eq!(grep.trim(), "0");
    assert_eq!(cp.force_close(&s).await?, 204);
    Ok(())
}

#[tokio::test]
async fn pool_force_deleting_every_session_leaves_the_pool_at_its_size_and_nothing_else()
-> Result<()> {
    let (_up, settings) = egress_stack()?;
    let dep = deployment("leaks");
    let _guard = DeploymentGuard(dep.clone());
    let isolated = format!("{BUSYBOX}=2");
    let egress = format!("{DEBIAN}=1");
    let env = settings.env(&[
        ("DEPLOYMENT", dep.as_str()),
        ("WARM_POOL", isolated.as_str()),
        ("WARM_POOL_EGRESS", egress.as_str()),
    ]);
    let cp = ControlPlane::start_with(&env).await?;
    pool_of(&dep, 3).await?;
    let policy = json!({"policy": {"default": "deny", "rules": [{"host": "api.upstream.test"}]}});
    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(cp.session_of(BUSYBOX).await?);
    }
    for _ in 0..2 {
        sessions.push(
            cp.session(json!({"base_image": DEBIAN, "egress": policy.clone()}))
                .await?,
        );
    }
    for s in &sessions {
        assert_eq!(cp.sh(s, "true").await?.0, 0);
        assert_eq!(cp.force_close(s).await?, 204);
    }
    let label = format!("daiv.sandbox.deployment={dep}");
    let expected = eventually("only the pool is left", Duration::from_secs(90), || {
        let label = label.clone();
        let dep = dep.clone();
        async move {
            let containers = containers_with(&[&label]);
            let networks = networks_with(&[&label]);
            let ready = ready_members(&dep);
            // 3 members + the egress member's gateway; its internal network.
            Ok(
                (ready.len() == 3 && containers.len() == 4 && networks.len() == 1)
                    .then_some((containers, networks)),
            )
        }
    })
    .await?;
    for id in &expected.0 {
        let role = inspect(id).map(|c| c["Config"]["Labels"]["daiv.sandbox.role"].clone());
        let name = name_of(id);
        assert!(
            name.starts_with("daiv-pool-") || role == Some(json!("egress-gateway")),
            "left behind: {id} {name}"
        );
    }
    for s in &sessions {
        assert!(inspect(&s.id).is_none(), "session {} still exists", s.id);
    }
    Ok(())
}

#[tokio::test]
async fn pool_is_kept_across_restarts_and_removed_on_shutdown_only_when_asked() -> Result<()> {
    require_image(BUSYBOX);
    let dep = deployment("keep");
    let other = deployment("other");
    let _guards = (DeploymentGuard(dep.clone()), DeploymentGuard(other.clone()));
    let pooled = format!("{BUSYBOX}=2");

    let mut first =
        ControlPlane::start_with(&[("DEPLOYMENT", &dep), ("WARM_POOL", &pooled)]).await?;
    let members: HashSet<String> = pool_of(&dep, 2).await?.into_iter().collect();
    assert!(first.terminate()?, "clean shutdown");
    drop(first);
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Default: kept for the next start.
    let kept: HashSet<String> = ready_members(&dep).into_iter().collect();
    assert_eq!(kept, members);

    // Another deployment on the same engine, with a pool of its own that it removes on shutdown.
    let mut elsewhere = ControlPlane::start_with(&[
        ("DEPLOYMENT", &other),
        ("WARM_POOL", &pooled),
        ("WARM_POOL_REMOVE_ON_SHUTDOWN", "true"),
    ])
    .await?;
    let theirs: HashSet<String> = pool_of(&other, 2).await?.into_iter().collect();
    assert!(theirs.is_disjoint(&members));
    // Its claims never take our members.
    let s = elsewhere.session_of(BUSYBOX).await?;
    assert!(
        theirs.contains(&s.id),
        "claimed {} outside its deployment",
        s.id
    );
    assert_eq!(elsewhere.force_close(&s).await?, 204);
    pool_of(&other, 2).await?;

    // A restart finds the pool it left: the same members, nothing built.
    let mut second = ControlPlane::start_with(&[
        ("DEPLOYMENT", &dep),
        ("WARM_POOL", &pooled),
        ("WARM_POOL_REMOVE_ON_SHUTDOWN", "true"),
    ])
    .await?;
    eventually("the pool is adopted", Duration::from_secs(30), || async {
        let m = second.metrics().await?;
        Ok(m.contains(&format!(
            "daiv_sandbox_pool_size{{image=\"{BUSYBOX}\",kind=\"isolated\"}} 2"
        ))
        .then_some(()))
    })
    .await?;
    let adopted: HashSet<String> = ready_members(&dep).into_iter().collect();
    assert_eq!(adopted, members);
    let claimed = second.session_of(BUSYBOX).await?;
    assert!(members.contains(&claimed.id));

    // Removal on shutdown takes this deployment's members (not its sessions, not the other's).
    let before_other: HashSet<String> = ready_members(&other).into_iter().collect();
    pool_of(&dep, 2).await?;
    assert!(second.terminate()?, "clean shutdown");
    let label = format!("daiv.sandbox.deployment={dep}");
    assert_eq!(
        containers_with(&[&label]),
        vec![claimed.id.clone()],
        "only the claimed session is left"
    );
    assert!(networks_with(&[&label]).is_empty());
    let after_other: HashSet<String> = ready_members(&other).into_iter().collect();
    assert_eq!(after_other, before_other);
    drop(claimed);

    assert!(elsewhere.terminate()?, "clean shutdown");
    let label = format!("daiv.sandbox.deployment={other}");
    assert!(containers_with(&[&label]).is_empty());
    Ok(())
}
