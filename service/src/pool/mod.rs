//! The warm pool: sandboxes created and started before anyone asks, handed out by
//! `POST /session/` in a few milliseconds instead of a container create and start.
//!
//! `DAIV_SANDBOX_WARM_POOL` / `DAIV_SANDBOX_WARM_POOL_EGRESS` name images and how many ready
//! members each keeps (egress members are whole triads, behind a deny-all policy);
//! `DAIV_SANDBOX_WARM_POOL_SNAPSHOTS` names snapshots, whose members are isolated sessions from
//! that snapshot (retired once the snapshot is deleted). A request
//! whose image and kind (isolated or egress) match takes a member and gets what it carries
//! applied at claim time; anything else, or a pool that is empty or cannot apply the request,
//! falls back to the cold path.
//!
//! # Members, names and the claim
//!
//! A member is an ordinary sandbox container (role `sandbox`, this deployment's label) with
//! [`POOL_LABEL`] (its kind) and [`POOL_SPEC_LABEL`] (a hash of everything its spec was built
//! from). Labels cannot change after create, so a member's state is its **name**:
//!
//! | name | state |
//! | --- | --- |
//! | `daiv-building-<token>` | being built (never claimable) |
//! | `daiv-pool-<token>` | ready: claimable, not a session (its id answers 404) |
//! | `daiv-claimed-<token>` | claimed: a session like any other, for good |
//! | `daiv-retired-<token>` | being removed by the pool (stale, dead, over the size, shutdown) |
//!
//! Claiming is one engine call: rename `daiv-pool-<t>` to `daiv-claimed-<t>`, addressed by the
//! *current name*. The engine serialises renames of one container and the target is fixed by the
//! source, so of any number of racing claimers exactly one succeeds: the others find no container
//! of the old name (404) or find it already named the target (refused). This holds across
//! replicas on one engine with or without Redis: the engine is the arbiter, not a lock. Retiring
//! uses the same swap, so a member is never both handed out and removed. A claimed member never
//! becomes a member again: every claim gets a container no session ever used.
//!
//! [`Sessions::find`] stays one inspect: a pool-labelled container is a session only under its
//! claimed name. The reaper leaves unclaimed members alone and wakes the refill, which replaces
//! members that died, whose image tag now points elsewhere or whose spec hash is stale.
//!
//! # What a claim applies
//!
//! - `environment`: written as root into the sandbox's root-owned service directory
//!   ([`ENV_FILE`](crate::layout::ENV_FILE), a JSON list of pairs, readable but not writable
//!   by the sandbox user); the helper applies it on top of the container's environment to every
//!   command (`serve`) and background process (`init`). Egress proxy settings still win, as on
//!   the cold path.
//! - `memory_bytes` / `cpus`: a live update of the container (swap twice the memory, as at
//!   create). A runtime that refuses updates (gVisor) makes the claim fall back to a cold create,
//!   and requests with limits skip the pool from then on.
//! - egress `policy` and secrets: staged into the member's gateway and acknowledged (the
//!   `PUT .../egress/` path) before the create answers, so the policy is in effect when the client has the id.
//!
//! A claim that fails to apply removes the member (it was never given out) and goes cold.

use rand::seq::SliceRandom;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use shared_policy::PolicyFile;

use crate::api::StartSessionRequest;
use crate::config::Config;
use crate::egress::{self, Egress, Triad};
use crate::engine::{
    ContainerEngine, ContainerInfo, DEPLOYMENT_LABEL, EngineError, IMAGE_LABEL, POOL_LABEL,
    POOL_SPEC_LABEL, ROLE_LABEL, ROLE_SANDBOX, SNAPSHOT_LABEL,
};
use crate::ids::fnv;
use crate::runtime::SessionRuntime;
use crate::sandbox::{Naming, SandboxFactory};
use crate::telemetry::metrics::{Metrics, PoolLabels, PoolMissLabels};

mod apply;
mod claim;
mod error;
mod refill;

pub use claim::Claim;
pub use error::PoolError;
pub use refill::Refill;

pub(crate) const BUILDING: &str = "daiv-building-";
pub(crate) const READY: &str = "daiv-pool-";
pub(crate) const CLAIMED: &str = "daiv-claimed-";
pub(crate) const RETIRED: &str = "daiv-retired-";

/// Candidates a claim tries before it gives up and goes cold (each lost race costs a rename).
const CLAIM_TRIES: usize = 6;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Isolated,
    Egress,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Isolated => "isolated",
            Kind::Egress => "egress",
        }
    }
}

/// One configured pool: a kind and an image, or a snapshot (isolated sessions only).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    pub kind: Kind,
    /// The image; for a snapshot's pool, `snapshot:<id>` (its name in metrics and hashes).
    pub image: String,
    pub snapshot: Option<String>,
}

impl Key {
    fn image(kind: Kind, image: &str) -> Self {
        Self {
            kind,
            image: image.to_string(),
            snapshot: None,
        }
    }

    fn snapshot(id: &str) -> Self {
        Self {
            kind: Kind::Isolated,
            image: format!("snapshot:{id}"),
            snapshot: Some(id.to_string()),
        }
    }

    /// The pool's label set in the metrics.
    pub fn labels(&self) -> PoolLabels {
        PoolLabels {
            image: self.image.clone(),
            kind: self.kind.as_str(),
        }
    }
}

/// A ready member as the pool knows it: its id and token (the name's suffix; an egress
/// member's triad has a token of its own, reserved when it was built, on its labels), and its
/// triad's parts.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    pub id: String,
    pub token: String,
    pub triad: Option<Triad>,
}

impl Member {
    pub(crate) fn of(info: &ContainerInfo) -> Option<Self> {
        let token = info.name.strip_prefix(READY)?.to_string();
        Some(Self {
            id: info.id.clone(),
            token,
            triad: Triad::of(info),
        })
    }
}

/// A pool-labelled container that is not (or not yet, or no longer) a session.
pub fn is_unclaimed(info: &ContainerInfo) -> bool {
    info.label(POOL_LABEL).is_some() && !info.name.starts_with(CLAIMED)
}

/// The pool's state in one replica: targets, the members it knows to be ready, the refill's
/// wake-up and the metrics it keeps.
pub struct Pool {
    /// Members are sandboxes like any other: built by the same factory as a cold create.
    factory: Arc<SandboxFactory>,
    runtime: Arc<dyn SessionRuntime>,
    /// Each pool and its size here; in a fleet, the fleet sets this engine's share of each
    /// configured size ([`Pool::set_target`]).
    targets: RwLock<Vec<(Key, u32)>>,
    /// Each pool and its size as configured.
    configured: Vec<(Key, u32)>,
    /// Members believed ready, per pool; a claim pops from here before it lists the engine.
    ready: Mutex<HashMap<Key, VecDeque<Member>>>,
    pub(crate) wake: tokio::sync::Notify,
    /// Set when a live limits update was refused (gVisor): requests with limits go cold.
    limits_refused: AtomicBool,
    /// Spec hashes per kind, of everything but the image.
    spec_base: HashMap<Kind, u64>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) remove_on_shutdown: bool,
    /// Tokens of members this replica is building (removed on shutdown if unfinished).
    pub(crate) building: Mutex<HashSet<String>>,
    /// Tokens of builds this replica gave up on (failed or timed out) whose container may be
    /// left, on an engine that was down say: removed by the next round, not after the timeout
    /// that covers other replicas' builds.
    pub(crate) given_up: Mutex<HashMap<String, Key>>,
    /// The writers this replica opened ahead of its members' claims, by container id.
    prepared: Mutex<HashMap<String, Prepared>>,
}

/// What a claim writes through, opened when the member became ready: the environment file's
/// writer in the sandbox and the policy installer in the gateway. A claim by another replica
/// (or a restarted one) opens its own; these are then dropped, writing nothing.
#[derive(Debug, Default)]
pub(crate) struct Prepared {
    pub env: Option<crate::runtime::Writer>,
    pub policy: Option<crate::runtime::Writer>,
}

impl Pool {
    pub fn new(
        factory: Arc<SandboxFactory>,
        runtime: Arc<dyn SessionRuntime>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let shared = factory.clone();
        let config: &Config = shared.config();
        let helper: Option<&crate::shared_file::SharedFile> = shared.helper();
        let egress: Option<&Egress> = shared.egress().map(|e| &**e);
        let mut targets = Vec::new();
        for (kind, list) in [
            (Kind::Isolated, &config.pool.isolated),
            (Kind::Egress, &config.pool.egress),
        ] {
            for (image, count) in list {
                let key = Key::image(kind, image);
                metrics.pool.size.get_or_create(&key.labels()).set(0);
                targets.push((key, *count));
            }
        }
        for (id, count) in &config.pool.snapshots {
            let key = Key::snapshot(id);
            metrics.pool.size.get_or_create(&key.labels()).set(0);
            targets.push((key, *count));
        }
        let sandbox = format!(
            "{}|{}:{}|{:?}|{}|{}|{}|{}",
            config.sessions.runtime.as_str(),
            config.sessions.run_uid,
            config.sessions.run_gid,
            config.sessions.run_uid_range,
            config.sessions.helper_uid,
            config.sessions.pids_limit,
            helper.map_or(0, crate::shared_file::SharedFile::fingerprint),
            crate::VERSION,
        );
        let egress_part = egress.map(Egress::fingerprint).unwrap_or_default();
        let spec_base = HashMap::from([
            (Kind::Isolated, fnv(sandbox.as_bytes())),
            (
                Kind::Egress,
                fnv(format!("{sandbox}|{egress_part}").as_bytes()),
            ),
        ]);
        Self {
            factory,
            runtime,
            configured: targets.clone(),
            targets: RwLock::new(targets),
            ready: Mutex::default(),
            wake: tokio::sync::Notify::new(),
            limits_refused: AtomicBool::new(false),
            spec_base,
            metrics,
            remove_on_shutdown: config.pool.remove_on_shutdown,
            building: Mutex::default(),
            given_up: Mutex::default(),
            prepared: Mutex::default(),
        }
    }

    pub fn factory(&self) -> &Arc<SandboxFactory> {
        &self.factory
    }

    fn engine(&self) -> &dyn ContainerEngine {
        &**self.factory.engine()
    }

    fn config(&self) -> &Config {
        self.factory.config()
    }

    /// The engine's name in the pool's metrics (empty for the default engine).
    pub(crate) fn engine_name(&self) -> &str {
        self.engine().id_prefix().unwrap_or_default()
    }

    pub fn is_configured(&self) -> bool {
        !self.targets_now().is_empty()
    }

    /// Each pool and its size as configured (a fleet spreads it over its engines).
    pub fn configured(&self) -> &[(Key, u32)] {
        &self.configured
    }

    fn targets_now(&self) -> std::sync::RwLockReadGuard<'_, Vec<(Key, u32)>> {
        self.targets.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn targets(&self) -> Vec<(Key, u32)> {
        self.targets_now().clone()
    }

    fn target(&self, key: &Key) -> Option<u32> {
        self.targets_now()
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, n)| *n)
    }

    /// Sets the size of the pool `key` here (a fleet's share of it); wakes the refill when it
    /// changed. `false` when there is no such pool.
    pub fn set_target(&self, key: &Key, size: u32) -> bool {
        let changed = {
            let mut targets = self.targets.write().unwrap_or_else(|e| e.into_inner());
            let Some(slot) = targets.iter_mut().find(|(k, _)| k == key) else {
                return false;
            };
            std::mem::replace(&mut slot.1, size) != size
        };
        if changed {
            self.wake();
        }
        true
    }

    /// Whether a member of the image pool for `image` (egress or isolated) is believed ready
    /// here: a fleet sends a create where a claim can serve it.
    pub fn has_ready(&self, image: &str, egress: bool) -> bool {
        let kind = if egress { Kind::Egress } else { Kind::Isolated };
        self.ready()
            .get(&Key::image(kind, image))
            .is_some_and(|q| !q.is_empty())
    }

    /// The spec hash members of `key` carry (a stale one is replaced).
    pub(crate) fn spec_hash(&self, key: &Key) -> String {
        let base = self.spec_base.get(&key.kind).copied().unwrap_or_default();
        format!("{:016x}", fnv(format!("{base}|{}", key.image).as_bytes()))
    }

    /// Asks the refill to look again (after a claim, from the reaper).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    fn ready(&self) -> std::sync::MutexGuard<'_, HashMap<Key, VecDeque<Member>>> {
        self.ready.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pop(&self, key: &Key) -> Option<Member> {
        self.ready().get_mut(key).and_then(VecDeque::pop_front)
    }

    /// Replaces what this replica believes is ready for `key`; writers opened for members no
    /// longer ready (claimed elsewhere, retired) are dropped.
    pub(crate) fn set_ready(&self, key: &Key, members: Vec<Member>) {
        let mut ready = self.ready();
        ready.insert(key.clone(), members.into());
        let live: HashSet<&str> = ready.values().flatten().map(|m| m.id.as_str()).collect();
        self.prepared_map()
            .retain(|id, _| live.contains(id.as_str()));
    }

    fn prepared_map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Prepared>> {
        self.prepared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps what was opened ahead of `id`'s claim.
    pub(crate) fn keep_prepared(&self, id: &str, prepared: Prepared) {
        self.prepared_map().insert(id.to_string(), prepared);
    }

    /// What was opened ahead of `id`'s claim, if this replica did.
    fn take_prepared(&self, id: &str) -> Prepared {
        self.prepared_map().remove(id).unwrap_or_default()
    }

    pub(crate) fn push_ready(&self, key: &Key, member: Member) {
        let mut ready = self.ready();
        let queue = ready.entry(key.clone()).or_default();
        if !queue.iter().any(|m| m.id == member.id) {
            queue.push_back(member);
        }
    }

    fn add_ready(&self, key: &Key, members: Vec<Member>) {
        for m in members {
            self.push_ready(key, m);
        }
    }

    /// Labels every member of `key` carries (the refill lists by them).
    pub(crate) fn labels<'a>(&self, key: &'a Key, deployment: &'a str) -> Vec<(&'a str, &'a str)> {
        vec![
            (ROLE_LABEL, ROLE_SANDBOX),
            (DEPLOYMENT_LABEL, deployment),
            (POOL_LABEL, key.kind.as_str()),
            match &key.snapshot {
                Some(id) => (SNAPSHOT_LABEL, id.as_str()),
                None => (IMAGE_LABEL, key.image.as_str()),
            },
        ]
    }

    fn miss(&self, key: &Key, why: &'static str) {
        self.metrics
            .pool
            .misses
            .get_or_create(&PoolMissLabels {
                image: key.image.clone(),
                kind: key.kind.as_str(),
                reason: why,
            })
            .inc();
    }

    fn claimed(&self, key: &Key) {
        let labels = key.labels();
        self.metrics.pool.claims.get_or_create(&labels).inc();
        self.metrics
            .pool
            .members(&labels, self.engine_name(), None, -1);
    }
}

impl Pool {
    /// A ready member for `req`, claimed and with the request applied; `None` sends the request
    /// down the cold path (no pool for it, the pool is empty, or applying failed).
    pub(crate) async fn claim(
        &self,
        req: &StartSessionRequest,
        policy: Option<&PolicyFile>,
    ) -> Option<String> {
        let kind = if policy.is_some() {
            Kind::Egress
        } else {
            Kind::Isolated
        };
        let key = match &req.snapshot_id {
            Some(id) if kind == Kind::Isolated => Key::snapshot(id),
            Some(_) => return None,
            None => Key::image(kind, &req.base_image),
        };
        let pool = self;
        // A fleet's engine whose share of the pool is nothing lists nothing for it.
        if pool.target(&key)? == 0 && self.ready().get(&key).is_none_or(VecDeque::is_empty) {
            return None;
        }
        let limits = req.memory_bytes.is_some() || req.cpus.is_some();
        if limits && pool.limits_refused.load(Ordering::Relaxed) {
            pool.miss(&key, "limits");
            return None;
        }
        let started = Instant::now();
        let Some(member) = self.take(&key, &Claim::for_request(req)).await else {
            pool.miss(&key, "empty");
            pool.wake();
            return None;
        };
        pool.claimed(&key);
        pool.wake();
        let prepared = pool.take_prepared(&member.id);
        match self.apply(&member, req, policy, kind, prepared).await {
            Ok(()) => {
                tracing::debug!(session_id = %member.id, elapsed_ms = started.elapsed().as_millis() as u64, "warm pool claim");
                Some(member.id)
            }
            Err(e) => {
                tracing::warn!(session_id = %member.id, error = %e, "warm pool claim could not be applied; creating cold");
                pool.miss(&key, "apply");
                self.discard(&member.id, member.triad.as_ref()).await;
                None
            }
        }
    }

    /// Takes a member by renaming it to its claimed name; a lost race tries the next one. The
    /// replica's own list comes first, then the engine's (members other replicas built).
    async fn take(&self, key: &Key, claim: &Claim) -> Option<Member> {
        let mut listed = false;
        for _ in 0..CLAIM_TRIES {
            let member = match self.pop(key) {
                Some(m) => m,
                None if !listed => {
                    listed = true;
                    let found = self.list_ready(key).await;
                    self.add_ready(key, found);
                    continue;
                }
                None => return None,
            };
            let from = format!("{READY}{}", member.token);
            let to = claim.name(&member.token);
            match self.engine().rename(&from, &to).await {
                Ok(()) => return Some(member),
                // Another replica claimed (or the refill retired) it first.
                Err(
                    EngineError::NotFound | EngineError::Rejected(_) | EngineError::Conflict(_),
                ) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "warm pool claim failed");
                    return None;
                }
            }
        }
        None
    }

    /// Running, ready members of `key` in the engine, in random order (replicas listing at
    /// once then mostly try different ones).
    pub(crate) async fn list_ready(&self, key: &Key) -> Vec<Member> {
        let labels = self.labels(key, &self.config().deployment);
        let spec = self.spec_hash(key);
        let Ok(list) = self.engine().list(&labels).await else {
            return Vec::new();
        };
        let mut found: Vec<Member> = list
            .iter()
            .filter(|c| c.is_running() && c.labels.get(POOL_SPEC_LABEL) == Some(&spec))
            .filter_map(Member::of)
            .collect();
        found.shuffle(&mut rand::rng());
        found
    }

    /// Removes a member (and its triad) that will not be handed out.
    pub(crate) async fn discard(&self, id: &str, triad: Option<&Triad>) {
        drop(self.take_prepared(id));
        self.runtime.forget(id);
        // A snapshot pool's member has a copy-on-write workspace of its own to remove.
        let workspace = if self.targets_now().iter().any(|(k, _)| k.snapshot.is_some()) {
            self.engine()
                .inspect(id)
                .await
                .ok()
                .and_then(|i| i.label(crate::engine::WORKSPACE_LABEL).map(str::to_string))
        } else {
            None
        };
        match self.engine().remove(id).await {
            Ok(()) | Err(EngineError::NotFound) => {}
            Err(e) => tracing::warn!(container = %id, error = %e, "could not remove a pool member"),
        }
        if let Some(triad) = triad {
            egress::teardown(self.engine(), &triad.parts()).await;
        }
        if let Some(token) = workspace {
            self.factory.snapshots().remove_workspace(&token).await;
        }
    }

    /// The name and labels of a new member of `key`.
    pub(crate) fn member_naming(&self, key: &Key, token: &str) -> Naming {
        Naming {
            name: format!("{BUILDING}{token}"),
            labels: vec![
                (POOL_LABEL.to_string(), key.kind.as_str().to_string()),
                (POOL_SPEC_LABEL.to_string(), self.spec_hash(key)),
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use bytes::Bytes;
    #[test]
    fn egress_settings_win_over_a_claims_environment() -> Result<(), Box<dyn std::error::Error>> {
        let req = StartSessionRequest {
            base_image: "img".into(),
            environment: Some(crate::api::Environment::new(
                [("A", "1"), ("HTTPS_PROXY", "evil")]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )?),
            memory_bytes: None,
            cpus: None,
            egress: None,
            snapshot_id: None,
            ..Default::default()
        };
        let read = |b: Option<Bytes>| String::from_utf8_lossy(&b.unwrap_or_default()).into_owned();
        let isolated = read(apply::env_json(&req, Kind::Isolated));
        assert_eq!(isolated, r#"[["A","1"],["HTTPS_PROXY","evil"]]"#);
        let egress = read(apply::env_json(&req, Kind::Egress));
        assert_eq!(egress, r#"[["A","1"]]"#);
        Ok(())
    }
}
