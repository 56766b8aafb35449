use std::time::UNIX_EPOCH;

use super::*;
use crate::engine::ContainerStatus;

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

#[test]
fn idle_counts_from_the_last_touch_then_creation_but_never_before_tracking() {
    let since = at(1000);
    // Touched at 1500: idle 500 s at 2000.
    assert_eq!(
        idle_for(Some(at(1500)), Some(10), since, at(2000)),
        Some(Duration::from_secs(500))
    );
    // Never touched, created at 1200.
    assert_eq!(
        idle_for(None, Some(1200), since, at(2000)),
        Some(Duration::from_secs(800))
    );
    // Created before the tracker started: counts from the start.
    assert_eq!(
        idle_for(None, Some(10), since, at(2000)),
        Some(Duration::from_secs(1000))
    );
    // Touched after "now" (a request between listing and re-check): not idle.
    assert_eq!(idle_for(Some(at(2500)), Some(10), since, at(2000)), None);
    // Nothing known: not idle.
    assert_eq!(idle_for(None, None, since, at(2000)), None);
}

#[test]
fn stop_time_is_finished_at_or_creation_of_a_never_started_container() {
    let mut info = ContainerInfo {
        id: "x".into(),
        name: "x".into(),
        image_id: None,
        status: ContainerStatus::Exited,
        created: Some(100),
        labels: Default::default(),
        finished_at: Some("2026-06-01T12:34:56.123456789Z".into()),
        memory_bytes: None,
        nano_cpus: None,
        env: Vec::new(),
        volumes: Vec::new(),
    };
    assert_eq!(stopped_at(&info), Some(1_780_317_296_123_456_789));
    info.finished_at = Some("garbage".into());
    assert_eq!(stopped_at(&info), None);
    info.status = ContainerStatus::Created;
    info.finished_at = None;
    assert_eq!(stopped_at(&info), Some(100 * NANOS));
}

#[test]
fn a_never_started_sandbox_is_a_create_in_flight_for_the_guard_from_its_truncated_second() {
    let info = ContainerInfo {
        id: "x".into(),
        name: "x".into(),
        image_id: None,
        status: ContainerStatus::Created,
        created: Some(100),
        labels: Default::default(),
        finished_at: Some("0001-01-01T00:00:00Z".into()),
        memory_bytes: None,
        nano_cpus: None,
        env: Vec::new(),
        volumes: Vec::new(),
    };
    let guard = CREATE_GUARD.as_secs();
    // Created at 100.9 s reads as 100: still in flight a whole guard after 101.
    assert!(creating(&info, at(101)));
    assert!(creating(&info, at(100 + guard)));
    assert!(!creating(&info, at(101 + guard)));
    // Started once (it has a stop time), or running: not a create.
    let ran = ContainerInfo {
        finished_at: Some("2026-06-01T12:34:56Z".into()),
        ..info.clone()
    };
    assert!(!creating(&ran, at(101)));
    let running = ContainerInfo {
        status: ContainerStatus::Running,
        ..info
    };
    assert!(!creating(&running, at(101)));
}
