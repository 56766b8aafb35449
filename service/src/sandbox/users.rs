//! Who a new sandbox's commands run as: `RUN_UID:RUN_GID`, or with `RUN_UID_RANGE` a uid of its
//! own.
//!
//! Under runc the kernel keeps some limits per uid, host-wide: inotify instances and watches,
//! processes (`RLIMIT_NPROC`), POSIX message queue bytes. Sandboxes that share a uid share them,
//! so code in one could hold all of them and fail programs in the others. With a range, each
//! sandbox takes a uid that no managed container on its engine holds (any deployment's: they
//! are read from the containers' labels, so two deployments with overlapping ranges still do not
//! collide), chosen at random so that replicas creating at the same moment rarely pick the same
//! one. A uid handed out is remembered for [`RECENT`] so that concurrent creates of this replica,
//! whose containers the engine does not list yet, get different ones. Sessions made from one
//! snapshot (forks among them) keep the snapshot's uid: its files are that uid's.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::Rng;

use crate::engine::{ContainerEngine, EngineError, SANDBOX_USER_LABEL, SandboxUser};

/// How long a uid handed out stays reserved in this replica without its container listed.
const RECENT: Duration = Duration::from_secs(120);

/// Why no sandbox user could be had.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("every uid of RUN_UID_RANGE is in use: no sandbox can be made until one ends")]
    Exhausted,
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// Hands out sandbox users (see the module docs).
pub struct SandboxUsers {
    fixed: SandboxUser,
    range: Option<(u32, u32)>,
    recent: Mutex<HashMap<u32, Instant>>,
}

impl SandboxUsers {
    pub fn new(fixed: SandboxUser, range: Option<(u32, u32)>) -> Self {
        Self {
            fixed,
            range,
            recent: Mutex::default(),
        }
    }

    /// The user every sandbox gets when there is no range.
    pub fn fixed(&self) -> SandboxUser {
        self.fixed
    }

    /// The user of a new sandbox on `engine`. Without a range, no round trip; with one, one
    /// listing of the engine's managed containers.
    pub async fn pick(&self, engine: &dyn ContainerEngine) -> Result<SandboxUser, UserError> {
        let Some((first, last)) = self.range else {
            return Ok(self.fixed);
        };
        let mut used: HashSet<u32> = engine
            .list(&[])
            .await?
            .iter()
            .filter_map(|c| c.labels.get(SANDBOX_USER_LABEL))
            .filter_map(|l| SandboxUser::parse(l))
            .map(|u| u.uid)
            .filter(|uid| (first..=last).contains(uid))
            .collect();
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        recent.retain(|_, at| now.duration_since(*at) < RECENT);
        used.extend(recent.keys().copied());
        let size = u64::from(last - first) + 1;
        if used.len() as u64 >= size {
            return Err(UserError::Exhausted);
        }
        // A random start, then the next free one: at most `used.len() + 1` steps.
        let start = rand::rng().random_range(0..size);
        let uid = (0..size)
            .map(|k| first + ((start + k) % size) as u32)
            .find(|uid| !used.contains(uid))
            .ok_or(UserError::Exhausted)?;
        recent.insert(uid, now);
        Ok(SandboxUser {
            uid,
            gid: self.fixed.gid,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ContainerSpec;
    use crate::engine::fake::FakeEngine;

    fn user(uid: u32) -> SandboxUser {
        SandboxUser { uid, gid: 1000 }
    }

    async fn running_as(engine: &FakeEngine, u: SandboxUser) {
        let spec = ContainerSpec {
            name: None,
            image: "busybox".to_string(),
            entrypoint: None,
            cmd: None,
            env: Vec::new(),
            labels: HashMap::from([
                (crate::engine::MANAGED_LABEL.to_string(), "true".to_string()),
                (SANDBOX_USER_LABEL.to_string(), u.to_string()),
            ]),
            user: None,
            cap_add: Vec::new(),
            sysctls: Vec::new(),
            init: true,
            runtime: "runc".to_string(),
            memory_bytes: None,
            nano_cpus: None,
            pids_limit: 64,
            network: crate::engine::NetworkAttach::None,
            volumes: Vec::new(),
            named_volumes: Vec::new(),
            read_only_volumes: Vec::new(),
            host_dirs: Vec::new(),
            log_options: Vec::new(),
            auto_remove: false,
            skeleton: Vec::new(),
        };
        engine.create(&spec).await.expect("created");
    }

    #[tokio::test]
    async fn without_a_range_every_sandbox_is_the_fixed_user() {
        let engine = FakeEngine::default();
        let users = SandboxUsers::new(user(1000), None);
        for _ in 0..3 {
            assert_eq!(users.pick(&engine).await.expect("a user"), user(1000));
        }
    }

    #[tokio::test]
    async fn a_range_hands_out_each_uid_once_then_refuses() {
        let engine = FakeEngine::default();
        let users = SandboxUsers::new(user(1000), Some((5000, 5007)));
        let mut seen = HashSet::new();
        for _ in 0..8 {
            let u = users.pick(&engine).await.expect("a user");
            assert!((5000..=5007).contains(&u.uid), "{u}");
            assert_eq!(u.gid, 1000);
            assert!(seen.insert(u.uid), "{u} handed out twice");
        }
        assert!(matches!(
            users.pick(&engine).await,
            Err(UserError::Exhausted)
        ));
    }

    #[tokio::test]
    async fn a_uid_another_sandbox_holds_is_never_picked() {
        let engine = FakeEngine::default();
        // Another deployment's (or replica's) sandboxes, seen only through their labels.
        for uid in [6000, 6001, 6003] {
            running_as(&engine, user(uid)).await;
        }
        let users = SandboxUsers::new(user(1000), Some((6000, 6003)));
        assert_eq!(users.pick(&engine).await.expect("the free one"), user(6002));
        assert!(matches!(
            users.pick(&engine).await,
            Err(UserError::Exhausted)
        ));
    }
}
