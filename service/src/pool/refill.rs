//! The refill: keeps every pool at its size in the background.
//!
//! At start-up, after each claim, when the reaper sweeps and every [`CHECK_EVERY`], it lists each
//! pool's members (labels: this deployment, the kind, the image) and:
//! - adopts the ready ones it did not build (a restart finds its pool again);
//! - retires (swap to the retired name, then remove with the triad) members that died, whose
//!   spec hash is not the current one, or whose image tag now resolves to another image;
//! - removes retired leftovers and builds that were abandoned (a replica died mid-build);
//! - retires members beyond the size, and builds the missing ones.
//!
//! Builds are bounded by [`PARALLELISM`] over all pools, so a refill never takes more than that
//! from the engine while requests wait. With Redis, one replica refills a pool at a time (a lock
//! per pool, taken without waiting); the others only adopt what it built.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use shared_policy::PolicyFile;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::{BUILDING, CLAIMED, Key, Kind, Member, Pool, PoolError, READY, RETIRED};
use crate::api::StartSessionRequest;
use crate::coordination::lock::{LockError, SessionLocks};
use crate::egress::Triad;
use crate::engine::{ContainerInfo, EngineError, POOL_SPEC_LABEL};
use crate::ids::fnv;
use crate::sandbox::EgressPolicy;
use crate::telemetry::metrics::{KindLabels, observe_duration};
use crate::time::unix_now;

/// Members built at once, over every pool.
pub const PARALLELISM: usize = 2;
/// How often the pools are checked without a reason.
pub const CHECK_EVERY: Duration = Duration::from_secs(30);
/// A build older than this whose builder is not this replica was abandoned.
const BUILD_TIMEOUT_SECS: i64 = 120;
/// Longest a clean shutdown waits for builds in flight.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(8);

pub struct Refill {
    pool: Arc<Pool>,
    locks: Arc<dyn SessionLocks>,
    slots: Arc<Semaphore>,
    stopping: AtomicBool,
}

impl Refill {
    pub fn new(pool: Arc<Pool>, locks: Arc<dyn SessionLocks>) -> Arc<Self> {
        Arc::new(Self {
            pool,
            locks,
            slots: Arc::new(Semaphore::new(PARALLELISM)),
            stopping: AtomicBool::new(false),
        })
    }

    /// Refills now and whenever woken (or [`CHECK_EVERY`]), until aborted. `None` without pools.
    pub fn spawn(self: &Arc<Self>) -> Option<JoinHandle<()>> {
        self.pool
            .is_configured()
            .then(|| crate::background::spawn(self.clone()))
    }

    /// One round over every pool, side by side.
    pub async fn reconcile_all(&self) {
        let targets = self.pool.targets();
        futures::future::join_all(
            targets
                .iter()
                .map(|(key, target)| self.reconcile(key, *target)),
        )
        .await;
    }

    fn failed(&self, key: &Key, what: &str, e: &dyn std::fmt::Display) {
        tracing::warn!(image = %key.image, kind = key.kind.as_str(), error = %e, "warm pool: {what}");
        self.pool
            .metrics
            .pool
            .refill_failures
            .get_or_create(&key.labels())
            .inc();
    }

    async fn reconcile(&self, key: &Key, target: u32) {
        let s = &*self.pool;
        let deployment = s.config().deployment.as_str();
        // Per engine in a fleet: each engine's share is refilled on its own.
        let engine = s
            .engine()
            .id_prefix()
            .map(|p| format!("{p}-"))
            .unwrap_or_default();
        let lock_name = format!(
            "pool-refill-{deployment}-{engine}{}-{:016x}",
            key.kind.as_str(),
            fnv(key.image.as_bytes())
        );
        let refilling = match self.locks.acquire(&lock_name, Duration::ZERO).await {
            Ok(held) => Some(held),
            // Another replica refills this pool now: only adopt what is there.
            Err(LockError::Timeout) => None,
            // Without the lock backend, refill anyway: at worst two replicas overfill a little.
            Err(LockError::Unavailable(_)) => {
                let listed = s.list_ready(key).await;
                self.pool.set_ready(key, listed);
                return self.fill(key, target, 0).await;
            }
        };
        let Some(_held) = refilling else {
            let listed = s.list_ready(key).await;
            self.set_size(key, listed.len());
            s.set_ready(key, listed);
            return;
        };
        let list = match s.engine().list(&s.labels(key, deployment)).await {
            Ok(l) => l,
            Err(e) => return self.failed(key, "cannot list members", &e),
        };
        // A snapshot's pool lives as long as the snapshot: once deleted, its members go.
        let target = match &key.snapshot {
            Some(id) => match s.factory.snapshots().get(id).await {
                Ok(_) => target,
                Err(crate::snapshots::SnapshotError::NotFound) => 0,
                Err(e) => return self.failed(key, "cannot read the snapshot", &e),
            },
            None => target,
        };
        let image_ref = match &key.snapshot {
            Some(id) => crate::snapshots::image_ref(id),
            None => key.image.clone(),
        };
        let image = match s.engine().image_id(&image_ref).await {
            Ok(id) => Some(id),
            // Pulled by the next build.
            Err(EngineError::NotFound) => None,
            Err(e) => return self.failed(key, "cannot inspect the image", &e),
        };
        let spec = s.spec_hash(key);
        let now = unix_now();
        let mine = s.building.lock().map(|b| b.clone()).unwrap_or_default();
        let given_up = s.given_up.lock().map(|g| g.clone()).unwrap_or_default();
        let mut ready: Vec<&ContainerInfo> = Vec::new();
        let mut building_elsewhere = 0usize;
        for c in &list {
            if c.name.starts_with(READY) {
                let stale = c.labels.get(POOL_SPEC_LABEL) != Some(&spec)
                    || (image.is_some() && c.image_id != image)
                    || !c.is_running();
                if stale {
                    tracing::info!(container = %c.id, running = c.is_running(), "warm pool: replacing a member");
                    self.retire(c).await;
                } else {
                    ready.push(c);
                }
            } else if c.name.starts_with(RETIRED) {
                self.pool.discard(&c.id, Triad::of(c).as_ref()).await;
            } else if let Some(token) = c.name.strip_prefix(BUILDING) {
                let abandoned = !mine.contains(token)
                    && (given_up.contains_key(token)
                        || c.created.is_some_and(|t| now - t > BUILD_TIMEOUT_SECS));
                if abandoned {
                    self.pool.discard(&c.id, Triad::of(c).as_ref()).await;
                    if let Ok(mut g) = s.given_up.lock() {
                        g.remove(token);
                    }
                } else if !mine.contains(token) {
                    building_elsewhere += 1;
                }
            }
        }
        // A given-up build with no container left made none (or it is gone): forget it.
        if let Ok(mut g) = s.given_up.lock() {
            g.retain(|t, k| {
                k != key
                    || list
                        .iter()
                        .any(|c| c.name.strip_prefix(BUILDING) == Some(t.as_str()))
            });
        }
        ready.sort_by_key(|c| c.created.unwrap_or(0));
        let target = target as usize;
        while ready.len() + building_elsewhere > target {
            let Some(extra) = ready.pop() else { break };
            self.retire(extra).await;
        }
        let members: Vec<Member> = ready.iter().filter_map(|c| Member::of(c)).collect();
        self.set_size(key, members.len());
        let have = members.len() + building_elsewhere;
        s.set_ready(key, members);
        self.fill(key, target as u32, have).await;
    }

    fn set_size(&self, key: &Key, n: usize) {
        self.pool
            .metrics
            .pool
            .members(&key.labels(), self.pool.engine_name(), Some(n as u64), 0);
    }

    /// Builds the members missing from `have` to `target`.
    async fn fill(&self, key: &Key, target: u32, have: usize) {
        let missing = (target as usize).saturating_sub(have);
        if missing == 0 || self.stopping.load(Ordering::Relaxed) {
            return;
        }
        futures::future::join_all((0..missing).map(|_| self.build(key))).await;
    }

    /// Swaps a ready member to its retired name (so no claim can take it), then removes it.
    async fn retire(&self, c: &ContainerInfo) {
        let Some(token) = c.name.strip_prefix(READY) else {
            return;
        };
        match self
            .pool
            .engine()
            .rename(&c.name, &format!("{RETIRED}{token}"))
            .await
        {
            Ok(()) => self.pool.discard(&c.id, Triad::of(c).as_ref()).await,
            // Claimed (or retired) by someone else in the meantime: not ours to remove.
            Err(e) => {
                tracing::debug!(container = %c.id, error = %e, "warm pool: member not retired")
            }
        }
    }

    async fn build(&self, key: &Key) {
        let Ok(_slot) = self.slots.acquire().await else {
            return;
        };
        if self.stopping.load(Ordering::Relaxed) {
            return;
        }
        let s = &*self.pool;
        let token = crate::ids::random_token();
        if let Ok(mut b) = s.building.lock() {
            b.insert(token.clone());
        }
        let started = Instant::now();
        // Bounded: a build stuck on its engine (one restarting under it, say) must not hold its
        // slot forever; what it left is removed as abandoned by a later round.
        let limit = Duration::from_secs(BUILD_TIMEOUT_SECS.unsigned_abs());
        let built = match tokio::time::timeout(limit, self.build_member(key, &token)).await {
            Ok(built) => built,
            Err(_) => Err(PoolError::BuildTimedOut(BUILD_TIMEOUT_SECS)),
        };
        if let Ok(mut b) = s.building.lock() {
            b.remove(&token);
        }
        if built.is_err()
            && let Ok(mut g) = s.given_up.lock()
        {
            g.insert(token.clone(), key.clone());
        }
        match built {
            Ok(member) => {
                let kind = KindLabels {
                    kind: key.kind.as_str(),
                };
                observe_duration(
                    &s.metrics.pool.refills.get_or_create(&kind),
                    started.elapsed(),
                );
                s.metrics
                    .pool
                    .members(&key.labels(), s.engine_name(), None, 1);
                tracing::debug!(container = %member.id, image = %key.image, kind = key.kind.as_str(), "warm pool: member ready");
                // The claim then costs writes on open streams, and its first command finds the
                // helper's channel open.
                let prepared = s.prepare(&member).await;
                s.keep_prepared(&member.id, prepared);
                crate::runtime::warm_in_background(&s.runtime, &member.id);
                s.push_ready(key, member);
            }
            Err(e) => self.failed(key, "building a member failed", &e),
        }
    }

    async fn build_member(&self, key: &Key, token: &str) -> Result<Member, PoolError> {
        let s = &*self.pool;
        let snapshot = match &key.snapshot {
            Some(id) => Some(s.factory.snapshots().get(id).await?),
            None => None,
        };
        let req = StartSessionRequest {
            base_image: snapshot
                .as_ref()
                .map_or_else(|| key.image.clone(), |sn| sn.base_image.clone()),
            environment: None,
            memory_bytes: None,
            cpus: None,
            egress: None,
            snapshot_id: key.snapshot.clone(),
            ..Default::default()
        };
        let naming = s.member_naming(key, token);
        let id = match key.kind {
            Kind::Isolated => {
                s.factory
                    .build(&req, None, Some(&naming), snapshot.as_ref())
                    .await?
            }
            Kind::Egress => {
                // Deny-all until a claim installs the request's policy. The triad's parts exist
                // before its sandbox: its token's lock keeps the reaper from taking them for
                // orphans meanwhile, as for a cold create.
                let egress = s.factory.egress_or_400()?;
                let reservation = egress
                    .reserve(&*self.locks, Duration::from_secs(5))
                    .await
                    .map_err(PoolError::Lock)?;
                let deny_all = EgressPolicy {
                    egress: egress.clone(),
                    policy: PolicyFile::default(),
                };
                s.factory
                    .build(&req, Some((&deny_all, &reservation)), Some(&naming), None)
                    .await?
            }
        };
        let ready = async {
            s.engine()
                .rename(&naming.name, &format!("{READY}{token}"))
                .await?;
            s.engine().inspect(&id).await
        }
        .await;
        match ready.map(|info| Member::of(&info)) {
            Ok(Some(member)) => Ok(member),
            Ok(None) => Err(PoolError::MemberRenamed),
            Err(e) => {
                let triad = s.engine().inspect(&id).await.ok();
                let triad = triad.as_ref().and_then(Triad::of);
                s.discard(&id, triad.as_ref()).await;
                Err(e.into())
            }
        }
    }

    /// A clean shutdown: no new builds, those in flight finish (bounded), then, only with
    /// `WARM_POOL_REMOVE_ON_SHUTDOWN`, this deployment's unclaimed members are removed with their
    /// triads. By default they stay for the next start.
    pub async fn shutdown(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        let all = u32::try_from(PARALLELISM).unwrap_or(u32::MAX);
        let _quiet = tokio::time::timeout(SHUTDOWN_WAIT, self.slots.acquire_many(all)).await;
        if !self.pool.remove_on_shutdown {
            return;
        }
        let s = &*self.pool;
        let mut removed = 0usize;
        for (key, _) in &s.targets() {
            let labels = s.labels(key, &s.config().deployment);
            let Ok(list) = s.engine().list(&labels).await else {
                continue;
            };
            for c in &list {
                if c.name.starts_with(READY) {
                    self.retire(c).await;
                    removed += 1;
                } else if c.name.starts_with(RETIRED) {
                    s.discard(&c.id, Triad::of(c).as_ref()).await;
                } else if !c.name.starts_with(CLAIMED) {
                    // Building: nothing of ours is in flight any more.
                    let token = c.name.strip_prefix(BUILDING).unwrap_or_default();
                    let mine = s.building.lock().is_ok_and(|b| b.contains(token));
                    if mine
                        || c.created
                            .is_some_and(|t| unix_now() - t > BUILD_TIMEOUT_SECS)
                    {
                        s.discard(&c.id, Triad::of(c).as_ref()).await;
                    }
                }
            }
        }
        tracing::info!(removed, "warm pool: removed on shutdown");
    }
}

impl crate::background::Background for Refill {
    fn name(&self) -> &'static str {
        "warm pool refill"
    }

    async fn round(self: Arc<Self>) -> std::ops::ControlFlow<()> {
        self.reconcile_all().await;
        std::ops::ControlFlow::Continue(())
    }

    async fn pause(&self) {
        tokio::select! {
            () = self.pool.wake.notified() => {}
            () = tokio::time::sleep(CHECK_EVERY) => {}
        }
    }
}
