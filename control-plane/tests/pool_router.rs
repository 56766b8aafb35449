//! In-process tests of the warm pool against the fake engine: claims, what they apply, the
//! cold fallback, racing replicas, replacement of dead and stale members, adoption after a
//! restart and removal on shutdown. The same behaviours on real Docker: `tests/tests/pool.rs`.

mod harness;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::http::StatusCode;
use control_plane::engine::fake::FakeEngine;
use control_plane::engine::{ContainerEngine, POOL_LABEL, ROLE_EGRESS_GATEWAY, ROLE_LABEL};
use control_plane::pool::Refill;
use serde_json::json;

use harness::{Harness, IMAGE};

/// One replica of the service: the harness plus its pool refill.
struct Replica {
    h: Harness,
    refill: Arc<Refill>,
}

impl std::ops::Deref for Replica {
    type Target = Harness;
    fn deref(&self) -> &Harness {
        &self.h
    }
}

fn replica(engine: &FakeEngine, extra: &[(&str, &str)]) -> Replica {
    let mut settings = vec![("WARM_POOL", "img:1=2"), ("DEPLOYMENT", "pool-test")];
    settings.extend_from_slice(extra);
    let h = Harness::new(engine.clone(), &settings);
    let refill = Refill::new(h.cell().pool().clone(), h.locks.clone());
    Replica { h, refill }
}

/// Ready members (named `daiv-pool-*`) as the engine has them.
async fn ready(engine: &FakeEngine) -> HashSet<String> {
    let all = engine
        .list(&[(POOL_LABEL, "isolated")])
        .await
        .expect("list");
    all.into_iter()
        .filter(|c| c.name.starts_with("daiv-pool-") && c.is_running())
        .map(|c| c.id)
        .collect()
}

fn creates(engine: &FakeEngine) -> usize {
    engine
        .calls()
        .iter()
        .filter(|c| c.starts_with("create "))
        .count()
}

#[tokio::test]
async fn claims_apply_environment_and_limits_and_members_are_not_sessions() {
    let engine = FakeEngine::default();
    let r = replica(&engine, &[]);
    r.refill.reconcile_all().await;
    let members = ready(&engine).await;
    assert_eq!(members.len(), 2);
    for id in &members {
        let (status, _) = r.api("GET", &format!("/session/{id}/"), None).await;
        assert_eq!(
            status,
            StatusCode::NOT_FOUND,
            "a member answered as a session"
        );
    }
    let id = r
        .create(json!({
            "base_image": IMAGE,
            "environment": {"POOL_X": "from the claim"},
            "memory_bytes": 64 << 20,
            "cpus": 1.5,
        }))
        .await;
    assert!(members.contains(&id), "not claimed");
    assert!(
        engine
            .name(&id)
            .is_some_and(|n| n.starts_with("daiv-claimed-")),
        "{:?}",
        engine.name(&id)
    );
    let spec = engine.spec(&id).expect("spec");
    assert_eq!(spec.memory_bytes, Some(64 << 20));
    assert_eq!(spec.nano_cpus, Some(1_500_000_000));
    // The environment is a root-owned file the helper reads; commands see it.
    let file = engine
        .file(&id, control_plane::layout::ENV_FILE)
        .expect("env file");
    assert_eq!(
        String::from_utf8_lossy(&file),
        r#"[["POOL_X","from the claim"]]"#
    );
    let (status, ran) = r
        .api(
            "POST",
            &format!("/session/{id}/"),
            Some(json!({"commands": ["printf %s \"$POOL_X\""]})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{ran}");
    assert_eq!(ran["results"][0]["output"], json!("from the claim"));
    let (status, _) = r.api("GET", &format!("/session/{id}/"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    // The pool refills with a new container; the claimed one never goes back.
    r.refill.reconcile_all().await;
    let after = ready(&engine).await;
    assert_eq!(after.len(), 2);
    assert!(!after.contains(&id));
    let metrics = r.state.metrics.render(None);
    assert!(
        metrics.contains("daiv_sandbox_pool_claims_total{image=\"img:1\",kind=\"isolated\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("daiv_sandbox_pool_size{image=\"img:1\",kind=\"isolated\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("daiv_sandbox_pool_refill_duration_seconds_count{kind=\"isolated\"} 3")
    );
}

#[tokio::test]
async fn other_images_and_an_empty_pool_go_cold() {
    let engine = FakeEngine::default();
    let r = replica(&engine, &[]);
    let cold = r.create(json!({"base_image": IMAGE})).await;
    assert!(engine.name(&cold).is_some_and(|n| n.starts_with("fake-")));
    let metrics = r.state.metrics.render(None);
    assert!(
        metrics.contains(
            "daiv_sandbox_pool_misses_total{image=\"img:1\",kind=\"isolated\",reason=\"empty\"} 1"
        ),
        "{metrics}"
    );
    r.refill.reconcile_all().await;
    let other = r.create(json!({"base_image": "other:1"})).await;
    assert!(engine.name(&other).is_some_and(|n| n.starts_with("fake-")));
    assert_eq!(ready(&engine).await.len(), 2, "the pool was not touched");
}

#[tokio::test]
async fn limits_the_runtime_refuses_fall_back_to_cold_and_skip_the_pool_after() {
    let engine = FakeEngine::default();
    engine.fail_on("update_limits");
    let r = replica(&engine, &[]);
    r.refill.reconcile_all().await;
    let members = ready(&engine).await;
    let id = r
        .create(json!({"base_image": IMAGE, "memory_bytes": 64 << 20}))
        .await;
    assert!(!members.contains(&id), "a member that could not be limited");
    assert_eq!(engine.spec(&id).expect("spec").memory_bytes, Some(64 << 20));
    // The member it tried was removed (never handed out), not put back.
    let left = ready(&engine).await;
    assert_eq!(left.len(), 1);
    let renames = |e: &FakeEngine| {
        e.calls()
            .iter()
            .filter(|c| c.starts_with("rename "))
            .count()
    };
    let before = renames(&engine);
    let again = r.create(json!({"base_image": IMAGE, "cpus": 1.0})).await;
    assert!(!members.contains(&again));
    assert_eq!(renames(&engine), before, "the pool was tried again");
    // Requests without limits still claim.
    let claimed = r.create(json!({"base_image": IMAGE})).await;
    assert!(left.contains(&claimed));
}

#[tokio::test]
async fn racing_replicas_never_hand_out_one_member_twice() {
    let engine = FakeEngine::default();
    let a = replica(&engine, &[("WARM_POOL", "img:1=3")]);
    let b = replica(&engine, &[("WARM_POOL", "img:1=3")]);
    a.refill.reconcile_all().await;
    let built = creates(&engine);
    // B adopts what A built: nothing new.
    b.refill.reconcile_all().await;
    assert_eq!(creates(&engine), built);
    let members = ready(&engine).await;
    assert_eq!(members.len(), 3);
    let body = json!({"base_image": IMAGE});
    let (from_a, from_b) = tokio::join!(
        futures::future::join_all((0..3).map(|_| a.create(body.clone()))),
        futures::future::join_all((0..3).map(|_| b.create(body.clone()))),
    );
    let ids: Vec<String> = from_a.into_iter().chain(from_b).collect();
    let distinct: HashSet<&String> = ids.iter().collect();
    assert_eq!(distinct.len(), 6);
    let claimed: Vec<&String> = ids.iter().filter(|id| members.contains(*id)).collect();
    assert_eq!(claimed.len(), 3, "every member claimed exactly once");
}

#[tokio::test]
async fn dead_and_retagged_members_are_replaced_and_a_restart_adopts_the_pool() {
    let engine = FakeEngine::default();
    let r = replica(&engine, &[]);
    r.refill.reconcile_all().await;
    let members: Vec<String> = ready(&engine).await.into_iter().collect();
    engine.kill(&members[0]);
    // The reaper leaves members alone, and wakes the refill.
    let swept = r
        .cell()
        .reaper()
        .sweep(SystemTime::now() + Duration::from_secs(86_400 * 30))
        .await
        .expect("sweep");
    assert_eq!(swept.removed(), 0, "{swept:?}");
    r.refill.reconcile_all().await;
    let now = ready(&engine).await;
    assert_eq!(now.len(), 2);
    assert!(!now.contains(&members[0]) && now.contains(&members[1]));
    assert!(
        engine.spec(&members[0]).is_none(),
        "the dead member was removed"
    );

    // The tag now names another image: every member is rebuilt from it.
    engine.set_image_id(IMAGE, "sha256:new");
    r.refill.reconcile_all().await;
    let rebuilt = ready(&engine).await;
    assert_eq!(rebuilt.len(), 2);
    assert!(rebuilt.is_disjoint(&now));

    // A restarted replica finds them again and builds nothing.
    let built = creates(&engine);
    let restarted = replica(&engine, &[]);
    restarted.refill.reconcile_all().await;
    assert_eq!(creates(&engine), built);
    let id = restarted.create(json!({"base_image": IMAGE})).await;
    assert!(rebuilt.contains(&id));
}

#[tokio::test]
async fn a_build_that_failed_and_left_its_container_is_replaced_by_the_next_round() {
    let engine = FakeEngine::default();
    let r = replica(&engine, &[]);
    // The engine fails the starts, then the clean-up too (it died under the build, say).
    engine.fail_on("start ");
    engine.fail_on("remove ");
    r.refill.reconcile_all().await;
    assert!(ready(&engine).await.is_empty());
    let left = engine.container_ids();
    assert!(!left.is_empty(), "the failed builds left their containers");
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    for id in &left {
        engine.set_times(id, Some(now), None);
    }
    engine.heal();
    // At once, not after the timeout that covers another replica's builds in flight.
    r.refill.reconcile_all().await;
    assert_eq!(ready(&engine).await.len(), 2);
    for id in &left {
        assert!(engine.spec(id).is_none(), "{id} was left behind");
    }
}

#[tokio::test]
async fn members_are_removed_on_shutdown_only_when_asked_and_only_this_deployments() {
    let engine = FakeEngine::default();
    let keep = replica(&engine, &[]);
    keep.refill.reconcile_all().await;
    let ours = ready(&engine).await;
    keep.refill.shutdown().await;
    assert_eq!(ready(&engine).await, ours, "kept by default");

    let other = replica(
        &engine,
        &[
            ("DEPLOYMENT", "another"),
            ("WARM_POOL_REMOVE_ON_SHUTDOWN", "true"),
        ],
    );
    other.refill.reconcile_all().await;
    let all = ready(&engine).await;
    assert_eq!(all.len(), 4, "each deployment has its own pool");
    let claimed = other.create(json!({"base_image": IMAGE})).await;
    assert!(!ours.contains(&claimed), "claimed across deployments");
    other.refill.shutdown().await;
    assert_eq!(ready(&engine).await, ours, "only its own members removed");
    assert!(engine.spec(&claimed).is_some(), "a session is not a member");
}

#[tokio::test]
async fn egress_members_are_whole_triads_and_a_claim_installs_the_policy() {
    let dir = std::env::temp_dir().join(format!("daiv-pool-ca-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    let (cert, key) = (dir.join("ca.crt"), dir.join("ca.key"));
    std::fs::write(&cert, "CERT").expect("cert");
    std::fs::write(&key, "KEY").expect("key");
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let engine = FakeEngine::default();
    let r = replica(
        &engine,
        &[
            ("WARM_POOL", ""),
            ("WARM_POOL_EGRESS", "img:1=1"),
            ("EGRESS_CA_CERT_FILE", &cert),
            ("EGRESS_CA_KEY_FILE", &key),
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
    r.refill.reconcile_all().await;
    let members = engine.list(&[(POOL_LABEL, "egress")]).await.expect("list");
    assert_eq!(members.len(), 1);
    let member = members[0].id.clone();
    assert_eq!(engine.networks().len(), 1);
    let gateways = engine
        .list(&[(ROLE_LABEL, ROLE_EGRESS_GATEWAY)])
        .await
        .expect("list");
    assert_eq!(gateways.len(), 1);
    // An isolated request does not take an egress member.
    let isolated = r.create(json!({"base_image": IMAGE})).await;
    assert_ne!(isolated, member);

    let id = r
        .create(json!({
            "base_image": IMAGE,
            "environment": {"A": "1", "HTTPS_PROXY": "http://elsewhere"},
            "egress": {
                "policy": {"default": "deny", "rules": [{"host": "api.upstream.test", "inject": "tok"}]},
                "secrets": {"tok": {"header": "Authorization", "value": "s3cret"}}
            }
        }))
        .await;
    assert_eq!(id, member);
    let gateway = &gateways[0].id;
    // Written over the gateway's policy by the helper in the gateway (no archive upload).
    let installed = engine
        .file(gateway, "/etc/daiv-egress/config.json")
        .expect("installed policy");
    let installed = String::from_utf8_lossy(&installed);
    assert!(installed.contains("api.upstream.test") && installed.contains("s3cret"));

    let env = engine
        .file(&id, control_plane::layout::ENV_FILE)
        .expect("env file");
    assert_eq!(String::from_utf8_lossy(&env), r#"[["A","1"]]"#);
    assert!(
        engine
            .calls()
            .iter()
            .any(|c| *c
                == format!("exec_attached {gateway} write-file /etc/daiv-egress/config.json")),
        "the policy was not installed by the helper"
    );
    // Force delete tears the triad down; the refill builds a whole new one.
    let (status, _) = r
        .api("DELETE", &format!("/session/{id}/?force=true"), None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    r.refill.reconcile_all().await;
    assert_eq!(engine.networks().len(), 1);
    let members = engine.list(&[(POOL_LABEL, "egress")]).await.expect("list");
    assert_eq!(members.len(), 1);
    assert_ne!(members[0].id, member);
}
