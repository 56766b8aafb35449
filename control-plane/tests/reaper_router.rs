//! In-process tests of the reaper's decisions and of activity tracking through the API, against
//! the fake engine and a clock of the test's own. Real Docker and Redis: `tests/tests/reaper.rs`.

mod harness;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use control_plane::config::Config;
use control_plane::coordination::activity::{LocalActivity, SessionActivity};
use control_plane::coordination::lock::SessionLocks;
use control_plane::egress;
use control_plane::engine::fake::FakeEngine;
use control_plane::engine::{
    ContainerEngine, ContainerSpec, ContainerStatus, DEPLOYMENT_LABEL, EGRESS_LABEL, MANAGED_LABEL,
    NetworkSpec, ROLE_EGRESS_GATEWAY, ROLE_EGRESS_NETWORK, ROLE_LABEL, ROLE_SANDBOX,
};
use control_plane::reaper::{self, Reaper};

use harness::{Harness, KEY, sid};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The sweep's clock: far enough from the epoch that every age below is positive.
const NOW: u64 = 1_000_000;

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn rfc3339(secs: u64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp(secs as i64)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

fn config(extra: &[(&str, &str)]) -> Arc<Config> {
    let mut settings = vec![
        ("SESSION_GRACE_SECONDS", "100"),
        ("MAX_STOPPED_SESSIONS", "10"),
        ("RUNNING_SESSION_MAX_IDLE_SECONDS", "300"),
    ];
    settings.extend_from_slice(extra);
    harness::config(&settings)
}

/// The harness with an activity tracker the test controls, and the reaper over it.
struct World {
    h: Harness,
    activity: Arc<LocalActivity>,
    reaper: Arc<Reaper>,
}

impl std::ops::Deref for World {
    type Target = Harness;
    fn deref(&self) -> &Harness {
        &self.h
    }
}

impl World {
    fn new(extra: &[(&str, &str)]) -> Self {
        let config = config(extra);
        let engine = FakeEngine::default();
        // The tracker has been recording "forever" unless a test says otherwise.
        let activity = Arc::new(LocalActivity::starting_at(
            UNIX_EPOCH,
            config.reaper.running_session_max_idle,
        ));
        let h = Harness::with_activity(engine, config, activity.clone());
        Self {
            reaper: h.cell().reaper().clone(),
            h,
            activity,
        }
    }

    async fn container(
        &self,
        labels: &[(&str, &str)],
    ) -> Result<String, Box<dyn std::error::Error>> {
        let mut all = HashMap::from([
            (MANAGED_LABEL.to_string(), "true".to_string()),
            (DEPLOYMENT_LABEL.to_string(), "default".to_string()),
        ]);
        for (k, v) in labels {
            all.insert(k.to_string(), v.to_string());
        }
        let spec = ContainerSpec {
            labels: all,
            init: true,
            pids_limit: 10,
            ..ContainerSpec::for_tests("img")
        };
        let id = self.engine.create(&spec).await?;
        self.engine.start(&id).await?;
        Ok(id)
    }

    /// A sandbox stopped at `stopped` (None: no readable stop time).
    async fn stopped(
        &self,
        created: u64,
        stopped: Option<u64>,
    ) -> Result<String, Box<dyn std::error::Error>> {
        let id = self.container(&[(ROLE_LABEL, ROLE_SANDBOX)]).await?;
        self.engine.stop(&id, Duration::ZERO).await?;
        let finished = stopped.map(rfc3339);
        self.engine
            .set_times(&id, Some(created as i64), finished.as_deref());
        Ok(id)
    }

    async fn running(&self, created: u64) -> Result<String, Box<dyn std::error::Error>> {
        let id = self.container(&[(ROLE_LABEL, ROLE_SANDBOX)]).await?;
        self.engine.set_times(&id, Some(created as i64), None);
        Ok(id)
    }

    fn exists(&self, id: &str) -> bool {
        self.engine.status(id).is_some()
    }
}

#[tokio::test]
async fn stopped_sessions_past_the_grace_period_are_removed() -> TestResult {
    let w = World::new(&[]);
    let old = w.stopped(10, Some(NOW - 101)).await?;
    let recent = w.stopped(10, Some(NOW - 50)).await?;
    let unknown = w.stopped(10, None).await?;
    let sweep = w.reaper.sweep(at(NOW)).await?;
    assert_eq!(sweep.expired, vec![old.clone()]);
    assert!(!w.exists(&old));
    assert!(w.exists(&recent) && w.exists(&unknown));
    Ok(())
}

/// A sandbox between its create and its start (the listing caught a create in flight) is not a
/// stopped one, however short the grace period and whatever the cap; one left unstarted past
/// the guard (a create that died) is.
#[tokio::test]
async fn a_sandbox_created_and_not_yet_started_is_not_taken_for_a_stopped_one() -> TestResult {
    let w = World::new(&[
        ("SESSION_GRACE_SECONDS", "1"),
        ("MAX_STOPPED_SESSIONS", "0"),
    ]);
    let created = |age: u64| {
        let w = &w;
        async move {
            let spec = ContainerSpec {
                labels: HashMap::from([
                    (MANAGED_LABEL.to_string(), "true".to_string()),
                    (DEPLOYMENT_LABEL.to_string(), "default".to_string()),
                    (ROLE_LABEL.to_string(), ROLE_SANDBOX.to_string()),
                ]),
                init: true,
                pids_limit: 10,
                ..ContainerSpec::for_tests("img")
            };
            let id = w.engine.create(&spec).await?;
            w.engine.set_times(&id, Some((NOW - age) as i64), None);
            Ok::<_, Box<dyn std::error::Error>>(id)
        }
    };
    let in_flight = created(3).await?;
    let dead = created(reaper::CREATE_GUARD.as_secs() + 2).await?;
    let sweep = w.reaper.sweep(at(NOW)).await?;
    assert_eq!(sweep.expired, vec![dead.clone()]);
    assert!(sweep.over_cap.is_empty(), "{:?}", sweep.over_cap);
    assert!(w.exists(&in_flight) && !w.exists(&dead));
    // Started, it is a session like any other.
    w.engine.start(&in_flight).await?;
    assert_eq!(w.reaper.sweep(at(NOW)).await?.removed(), 0);
    assert!(w.exists(&in_flight));
    Ok(())
}

#[tokio::test]
async fn another_deployments_resources_are_never_touched() -> TestResult {
    let w = World::new(&[("MAX_STOPPED_SESSIONS", "0")]);
    let theirs = w
        .container(&[(ROLE_LABEL, ROLE_SANDBOX), (DEPLOYMENT_LABEL, "other")])
        .await?;
    w.engine.stop(&theirs, Duration::ZERO).await?;
    w.engine.set_times(&theirs, Some(10), Some(&rfc3339(10)));
    let their_gateway = w
        .container(&[
            (ROLE_LABEL, ROLE_EGRESS_GATEWAY),
            (EGRESS_LABEL, "t"),
            (DEPLOYMENT_LABEL, "other"),
        ])
        .await?;
    let ours = w.stopped(10, Some(10)).await?;
    let sweep = w.reaper.sweep(at(NOW)).await?;
    assert_eq!(sweep.expired, vec![ours]);
    assert!(w.exists(&theirs) && w.exists(&their_gateway));
    Ok(())
}

#[tokio::test]
async fn the_stopped_cap_evicts_the_oldest_first_and_unknown_stop_times_last() -> TestResult {
    let w = World::new(&[("MAX_STOPPED_SESSIONS", "2")]);
    let unknown = w.stopped(10, None).await?;
    let s1 = w.stopped(10, Some(NOW - 40)).await?;
    let s2 = w.stopped(10, Some(NOW - 30)).await?;
    let s3 = w.stopped(10, Some(NOW - 20)).await?;
    let sweep = w.reaper.sweep(at(NOW)).await?;
    let mut evicted = sweep.over_cap.clone();
    evicted.sort();
    let mut expected = vec![s1.clone(), s2.clone()];
    expected.sort();
    assert_eq!(evicted, expected);
    assert!(w.exists(&s3) && w.exists(&unknown));
    // At the cap: nothing more to do.
    let again = w.reaper.sweep(at(NOW)).await?;
    assert_eq!(again.removed(), 0);
    Ok(())
}

#[tokio::test]
async fn running_sessions_are_removed_once_idle_and_kept_while_busy() -> TestResult {
    let w = World::new(&[]);
    let idle = w.running(10).await?;
    let busy = w.running(10).await?;
    let fresh = w.running(10).await?;
    let never_touched_new = w.running(NOW - 100).await?;
    let never_touched_old = w.running(NOW - 400).await?;
    w.activity.record(&idle, at(NOW - 301));
    w.activity.record(&busy, at(NOW - 301));
    w.activity.record(&fresh, at(NOW - 10));
    // A request in flight on `busy` holds its lock.
    let held = w.sessions().lock(&sid(&busy)).await?;
    // Taking the lock touched it: age it again, as a long command would leave it.
    w.activity.record(&busy, at(NOW - 301));

    let sweep = w.reaper.sweep(at(NOW)).await?;
    let mut idle_removed = sweep.idle.clone();
    idle_removed.sort();
    let mut expected = vec![idle.clone(), never_touched_old.clone()];
    expected.sort();
    assert_eq!(idle_removed, expected);
    assert_eq!(sweep.busy, vec![busy.clone()]);
    assert!(w.exists(&busy) && w.exists(&fresh) && w.exists(&never_touched_new));
    assert!(!w.exists(&idle));
    drop(held);
    Ok(())
}

#[tokio::test]
async fn the_lifetime_backstop_removes_old_sessions_whatever_they_do() -> TestResult {
    let w = World::new(&[("SESSION_MAX_LIFETIME_SECONDS", "1000")]);
    let old_busy = w.running(NOW - 1001).await?;
    let old_stopped = w.stopped(NOW - 2000, Some(NOW - 5)).await?;
    let young = w.running(NOW - 999).await?;
    for id in [&old_busy, &young] {
        w.activity.record(id, at(NOW - 1));
    }
    // A request holds the old session's lock for good (a command without a timeout).
    let held = w.sessions().lock(&sid(&old_busy)).await?;
    let sweep = w.reaper.sweep(at(NOW)).await?;
    let mut removed = sweep.lifetime.clone();
    removed.sort();
    let mut expected = vec![old_busy.clone(), old_stopped.clone()];
    expected.sort();
    assert_eq!(removed, expected);
    assert!(!w.exists(&old_busy) && !w.exists(&old_stopped));
    assert!(w.exists(&young));
    drop(held);
    // Off by default.
    let w = World::new(&[]);
    let old = w.running(10).await?;
    w.activity.record(&old, at(NOW - 1));
    assert_eq!(w.reaper.sweep(at(NOW)).await?.removed(), 0);
    assert!(w.exists(&old));
    Ok(())
}

#[tokio::test]
async fn sessions_created_before_tracking_began_get_a_full_window() -> TestResult {
    let config = config(&[]);
    let engine = FakeEngine::default();
    // A freshly restarted process: it has been recording for 10 s only.
    let activity = Arc::new(LocalActivity::starting_at(
        at(NOW - 10),
        config.reaper.running_session_max_idle,
    ));
    let h = Harness::with_activity(engine, config, activity);
    let w = World {
        reaper: h.cell().reaper().clone(),
        h,
        activity: Arc::new(LocalActivity::new(None)),
    };
    let ancient = w.running(10).await?;
    let sweep = w.reaper.sweep(at(NOW)).await?;
    assert!(sweep.idle.is_empty());
    assert!(w.exists(&ancient));
    let later = w.reaper.sweep(at(NOW + 300)).await?;
    assert_eq!(later.idle, vec![ancient]);
    Ok(())
}

#[tokio::test]
async fn idle_reaping_is_off_when_the_setting_is_zero() -> TestResult {
    let w = World::new(&[("RUNNING_SESSION_MAX_IDLE_SECONDS", "0")]);
    let id = w.running(10).await?;
    let sweep = w.reaper.sweep(at(NOW)).await?;
    assert!(sweep.idle.is_empty());
    assert!(w.exists(&id));
    Ok(())
}

#[tokio::test]
async fn a_restarted_session_is_rechecked_under_its_lock() -> TestResult {
    let w = World::new(&[]);
    let id = w.stopped(10, Some(NOW - 500)).await?;
    // Between the listing and the removal a request restarts it: simulate by holding the lock,
    // restarting, then letting the reaper try (busy), and again after the release (running).
    let held = w.sessions().lock(&sid(&id)).await?;
    let first = w.reaper.sweep(at(NOW)).await?;
    assert_eq!(first.busy, vec![id.clone()]);
    w.engine.start(&id).await?;
    drop(held);
    // Wait for the release (it happens right after the closing touch).
    drop(w.locks.acquire(&id, Duration::from_secs(5)).await?);
    let second = w.reaper.sweep(at(NOW)).await?;
    assert!(second.expired.is_empty(), "{second:?}");
    assert_eq!(w.engine.status(&id), Some(ContainerStatus::Running));
    Ok(())
}

#[tokio::test]
async fn orphaned_gateways_and_networks_go_after_the_grace_period() -> TestResult {
    let w = World::new(&[]);
    // Orphan: token with no sandbox, old.
    let gw = w
        .container(&[(ROLE_LABEL, ROLE_EGRESS_GATEWAY), (EGRESS_LABEL, "orphan")])
        .await?;
    w.engine.set_times(&gw, Some((NOW - 200) as i64), None);
    network(&w, "net-orphan", "orphan", NOW - 200).await?;
    // Young orphan: maybe a session being created.
    let young_gw = w
        .container(&[(ROLE_LABEL, ROLE_EGRESS_GATEWAY), (EGRESS_LABEL, "young")])
        .await?;
    w.engine.set_times(&young_gw, Some((NOW - 5) as i64), None);
    network(&w, "net-young", "young", NOW - 5).await?;
    // Live triad: its sandbox exists (stopped), so nothing of it goes.
    let sandbox = w
        .container(&[(ROLE_LABEL, ROLE_SANDBOX), (EGRESS_LABEL, "live")])
        .await?;
    w.engine.stop(&sandbox, Duration::ZERO).await?;
    w.engine
        .set_times(&sandbox, Some(10), Some(&rfc3339(NOW - 10)));
    let live_gw = w
        .container(&[(ROLE_LABEL, ROLE_EGRESS_GATEWAY), (EGRESS_LABEL, "live")])
        .await?;
    w.engine.set_times(&live_gw, Some(10), None);
    network(&w, "net-live", "live", 10).await?;

    let sweep = w.reaper.sweep(at(NOW)).await?;
    assert_eq!(sweep.orphans, vec!["orphan".to_string()]);
    assert!(!w.exists(&gw));
    assert!(w.exists(&young_gw) && w.exists(&live_gw) && w.exists(&sandbox));
    let mut nets = w.engine.networks();
    nets.sort();
    assert_eq!(nets, vec!["net-live".to_string(), "net-young".to_string()]);
    Ok(())
}

#[tokio::test]
async fn an_orphan_being_built_under_its_egress_lock_is_kept() -> TestResult {
    let w = World::new(&[]);
    network(&w, "net-building", "building", NOW - 500).await?;
    let held = w
        .locks
        .acquire(&egress::lock_key("building"), Duration::ZERO)
        .await?;
    let sweep = w.reaper.sweep(at(NOW)).await?;
    assert!(sweep.orphans.is_empty());
    assert_eq!(w.engine.networks(), vec!["net-building".to_string()]);
    drop(held);
    let sweep = w.reaper.sweep(at(NOW)).await?;
    assert_eq!(sweep.orphans, vec!["building".to_string()]);
    Ok(())
}

#[tokio::test]
async fn an_unreachable_engine_fails_the_sweep_not_the_process() -> TestResult {
    let w = World::new(&[]);
    w.stopped(10, Some(NOW - 500)).await?;
    w.engine.set_down(true);
    assert!(w.reaper.sweep(at(NOW)).await.is_err());
    // The loop's tick logs and returns.
    w.reaper.tick().await;
    w.engine.set_down(false);
    assert_eq!(w.reaper.sweep(at(NOW)).await?.expired.len(), 1);
    Ok(())
}

#[tokio::test]
async fn every_operation_touches_its_session_at_start_and_end() -> TestResult {
    let w = World::new(&[]);
    let id = w.running(10).await?;
    w.activity.record(&id, at(10));
    let before = SystemTime::now();
    let req = Request::builder()
        .method("GET")
        .uri(format!("/api/v1/session/{id}/"))
        .header("x-api-key", KEY)
        .body(Body::empty())?;
    let resp = w.send(req).await;
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    // The closing touch runs as the guard drops; the next lock holder sees it.
    let _next = w.sessions().lock(&sid(&id)).await?;
    let seen = w.activity.last_seen(std::slice::from_ref(&id)).await?;
    assert!(seen[0].is_some_and(|t| t >= before), "{seen:?}");
    // The reaper forgets records of sessions that are gone.
    drop(_next);
    drop(w.locks.acquire(&id, Duration::from_secs(5)).await?);
    w.engine.remove(&id).await?;
    w.reaper.sweep(at(NOW)).await?;
    assert!(w.activity.is_empty());
    Ok(())
}

async fn network(w: &World, name: &str, token: &str, created: u64) -> TestResult {
    w.engine
        .create_network(&NetworkSpec {
            name: name.to_string(),
            internal: true,
            subnet: None,
            no_host_address: true,
            labels: HashMap::from([
                (MANAGED_LABEL.to_string(), "true".to_string()),
                (DEPLOYMENT_LABEL.to_string(), "default".to_string()),
                (ROLE_LABEL.to_string(), ROLE_EGRESS_NETWORK.to_string()),
                (EGRESS_LABEL.to_string(), token.to_string()),
            ]),
        })
        .await?;
    w.engine.set_network_created(name, created as i64);
    Ok(())
}

/// A paused session is kept like a stopped one for the grace period, counted from its last
/// request (the pause), whatever its old stop time says; it never counts against the stopped cap.
#[tokio::test]
async fn paused_sessions_go_after_the_grace_period_since_their_last_request() -> TestResult {
    let w = World::new(&[("MAX_STOPPED_SESSIONS", "0")]);
    let old = w.running(10).await?;
    let recent = w.running(10).await?;
    for id in [&old, &recent] {
        w.engine.pause(id).await?;
        // An earlier stop, long ago, must not count as the pause's time.
        w.engine.set_times(id, Some(10), Some(&rfc3339(20)));
    }
    w.activity.record(&old, at(NOW - 101));
    w.activity.record(&recent, at(NOW - 50));
    let sweep = w.reaper.sweep(at(NOW)).await?;
    assert_eq!(sweep.expired, vec![old.clone()]);
    assert!(
        sweep.over_cap.is_empty() && sweep.idle.is_empty(),
        "{sweep:?}"
    );
    assert!(!w.exists(&old) && w.exists(&recent));
    Ok(())
}
