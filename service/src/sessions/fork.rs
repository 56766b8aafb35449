//! Snapshots and forks of a session: its filesystem frozen into Docker objects, and `count` new
//! sessions from it.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;

use crate::api::{Environment, ForkRequest, StartSessionRequest};
use crate::config::Config;
use crate::egress::{self, Triad};
use crate::engine::{ContainerInfo, EngineError, ImageInfo};
use crate::layout;
use crate::runtime::RunSpec;
use crate::sandbox::EgressPolicy;
use crate::snapshots::{Keep, Snapshot, SnapshotRequest, Timings};

use super::{Lifetime, SessionError, SessionId, Sessions, ValidationError};

/// Where a container made by an older build kept a warm-pool claim's environment: in its layer
/// (kept for forks of such a container; see `runtime::writer` on such fallbacks).
const LEGACY_ENV_FILE: &str = "/.daiv-sandbox/environment";

/// A fork request, checked once before anything is asked of the engine: `count` within
/// `FORK_MAX_COUNT` (its environment was checked as it was read).
#[derive(Debug)]
pub struct ForkPlan {
    count: u32,
    environment: Option<Environment>,
    /// Each fork's metadata (the source's when `None`), timeout and `on_timeout`.
    lifetime: Lifetime,
}

impl ForkPlan {
    pub fn new(req: ForkRequest, config: &Config) -> Result<Self, ValidationError> {
        let cap = config.snapshots.fork_max;
        if !(1..=cap).contains(&req.count) {
            return Err(ValidationError::ForkCount(cap));
        }
        let lifetime = Lifetime::new(req.metadata, req.timeout_seconds, req.on_timeout)?;
        Ok(Self {
            count: req.count,
            environment: req.environment,
            lifetime,
        })
    }

    /// How many sessions the fork makes.
    pub fn count(&self) -> u32 {
        self.count
    }
}

impl Sessions {
    /// A snapshot request's name and TTL, checked (before the session's lock is taken).
    pub fn snapshot_request(
        &self,
        name: Option<&str>,
        ttl_secs: Option<u64>,
    ) -> Result<SnapshotRequest, SessionError> {
        Ok(self.snapshots().validate(name, ttl_secs)?)
    }

    /// `POST /session/{id}/snapshot/` (the caller holds the session's lock).
    pub async fn snapshot(
        &self,
        id: &SessionId,
        req: &SnapshotRequest,
    ) -> Result<(Snapshot, Timings), SessionError> {
        let info = self.thawed(id).await?;
        self.flush(&info).await;
        let source = self.source_image(&info).await?;
        let (snapshot, timings, _) = self
            .snapshots()
            .take(&info, &source, req, Keep::Recorded)
            .await?;
        self.metrics.snapshots.taken.inc();
        tracing::info!(
            session_id = %id,
            snapshot_id = %snapshot.id,
            size_bytes = snapshot.size,
            frozen_ms = timings.frozen.as_millis() as u64,
            commit_ms = timings.commit.as_millis() as u64,
            copy_ms = timings.copy.as_millis() as u64,
            "snapshot taken"
        );
        Ok((snapshot, timings))
    }

    /// `POST /session/{id}/fork/` (the caller holds the source's lock): a snapshot without a
    /// record, then `count` sessions from it side by side (`parallel` at a time), each with the
    /// source's egress policy (its own gateway) and limits. All or nothing.
    pub async fn fork(
        &self,
        id: &SessionId,
        plan: ForkPlan,
        parallel: usize,
    ) -> Result<Vec<String>, SessionError> {
        let info = self.thawed(id).await?;
        // The source's policy, and the egress that builds every fork's triad: asked once.
        let egress = match Triad::of(&info) {
            Some(triad) => {
                let egress = self.egress_here()?;
                Some(EgressPolicy {
                    egress: egress.clone(),
                    policy: egress.current_policy(&triad).await?,
                })
            }
            None => None,
        };
        self.flush(&info).await;
        // Inspected once: the snapshot's commit reads its environment, and so does the forks'.
        let source = self.source_image(&info).await?;
        // Pinned until the forks' containers and workspaces hold its payload.
        let (snapshot, _, pinned) = self
            .snapshots()
            .take(&info, &source, &SnapshotRequest::default(), Keep::ForForks)
            .await?;
        let environment = match plan.environment {
            Some(e) => e,
            None => match self.caller_env(&info, &source.env).await {
                Ok(e) => e,
                Err(e) => {
                    drop(pinned);
                    self.snapshots().release(&snapshot.id).await;
                    return Err(e);
                }
            },
        };
        let req = StartSessionRequest {
            base_image: snapshot.base_image.clone(),
            snapshot_id: Some(snapshot.id.clone()),
            environment: Some(environment),
            memory_bytes: info.memory_bytes,
            cpus: info.nano_cpus.map(crate::api::cpus_of),
            egress: None,
            ..Default::default()
        };
        // As many at a time as the request holds create slots for (see `Admission`).
        let builds = (0..plan.count).map(|_| self.build(&req, egress.as_ref(), Some(&snapshot)));
        let results: Vec<_> = futures::stream::iter(builds)
            .buffer_unordered(parallel.max(1))
            .collect()
            .await;
        let (made, failed): (Vec<_>, Vec<_>) = results.into_iter().partition(Result::is_ok);
        let made: Vec<String> = made.into_iter().filter_map(Result::ok).collect();
        let mut failed = failed.into_iter().filter_map(Result::err).next();
        if failed.is_none() {
            failed = self.record_forks(id, &made, plan.lifetime).await.err();
        }
        if let Some(e) = failed {
            for fork in &made {
                if let Err(e) = self.shut(fork, true).await {
                    tracing::warn!(session_id = %fork, error = %e, "fork: a made fork not removed");
                }
            }
            drop(pinned);
            self.snapshots().release(&snapshot.id).await;
            return Err(e);
        }
        // Its payload goes once the forks are gone (the reaper's sweep); the release skips
        // what is pinned.
        drop(pinned);
        self.snapshots().release(&snapshot.id).await;
        self.metrics.snapshots.forks.inc_by(u64::from(plan.count));
        for fork in &made {
            self.made(fork).await;
        }
        tracing::info!(session_id = %id, forks = ?made, "session forked");
        Ok(made)
    }

    /// The forks' records: their own lifetime, and the source's metadata unless they were given
    /// their own.
    async fn record_forks(
        &self,
        source: &str,
        forks: &[String],
        mut lifetime: Lifetime,
    ) -> Result<(), SessionError> {
        if lifetime.metadata.is_none() {
            lifetime.metadata = self.record(source).await?.map(|r| r.metadata);
        }
        let writes = forks.iter().map(|fork| self.record_new(fork, &lifetime));
        futures::future::try_join_all(writes).await.map(drop)
    }

    /// The image the session `info` runs, inspected (its environment and size).
    async fn source_image(&self, info: &ContainerInfo) -> Result<ImageInfo, SessionError> {
        let image = info
            .image_id
            .as_deref()
            .ok_or_else(|| EngineError::Unavailable("the session has no image id".into()))?;
        Ok(self.engine().inspect_image(image).await?)
    }

    /// Under gVisor, file data a sandbox wrote may still sit in the sandbox kernel's cache, where
    /// neither a commit nor an archive of the host's files sees it: `sync` writes it out before
    /// the freeze. (runc's page cache is the host's: nothing to do.) Best effort: a sandbox
    /// without `sync` is snapshotted as the host sees it.
    ///
    /// Either way the session's channel is open (and answering) before the freeze: see
    /// [`Self::settle`].
    async fn flush(&self, info: &ContainerInfo) {
        if !info.is_running() {
            return;
        }
        if self.config().sessions.runtime.as_str() != "runsc" {
            return self.settle(&info.id).await;
        }
        let spec = RunSpec {
            commands: vec!["sync".to_string()],
            fail_fast: true,
            timeout: Some(Duration::from_secs(30)),
            output_cap: 4096,
            run_output_cap: 4096,
            workdir: layout::REPO.to_string(),
            env: Vec::new(),
        };
        if let Err(e) = self.runtime.run(&info.id, &spec).await {
            tracing::warn!(session_id = %info.id, error = %e, "snapshot: sync before the freeze failed");
        }
    }

    /// Waits until no exec of ours is starting in the session, before it is frozen: an exec
    /// frozen half-way (`runc init` joining the container's cgroup) holds the container in the
    /// runtime's shim, and the thaw then waits behind it for good, taking the Docker daemon's
    /// lock on the container with it. The helper's channel is the exec a fresh session opens in
    /// the background ([`Self::warm`]); a request on it waits for an open in flight and proves
    /// the exec started. Every other exec of a session is made under its lock, which the freezing
    /// request holds.
    pub(super) async fn settle(&self, id: &str) {
        if let Err(e) = self.runtime.seeded(id).await {
            tracing::debug!(session_id = %id, error = %e, "the helper's channel did not answer before a freeze");
        }
    }

    /// What the caller asked for in the environment of the session `info`: its environment
    /// file (on the session's own volume, see [`crate::sandbox`]). A container made by an older
    /// build also had it in its own variables (those without its image's, `image_env`, the
    /// sandbox's own and the egress settings), and a claimed one in a file of its layer.
    async fn caller_env(
        &self,
        info: &ContainerInfo,
        image_env: &[String],
    ) -> Result<Environment, SessionError> {
        // A variable of the image, as the image sets it (one the caller gave another value,
        // including one a snapshot's image blanked, is the caller's).
        let in_image = |kv: &str| image_env.iter().any(|ie| ie == kv);
        let read = |path| crate::engine::read_file(self.engine(), &info.id, path, 1024 * 1024);
        let file = match read(layout::ENV_FILE).await? {
            Some(json) => Some(json),
            None => read(LEGACY_ENV_FILE).await?,
        };
        let claimed: Vec<(String, String)> = file
            .and_then(|json| serde_json::from_slice(&json).ok())
            .unwrap_or_default();
        let mut env: BTreeMap<String, String> = info
            .env
            .iter()
            .filter(|kv| !in_image(kv))
            .filter_map(|kv| kv.split_once('='))
            .filter(|(k, _)| !crate::sandbox::BASE_ENV_NAMES.contains(k) && !egress::sets_env(k))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.extend(claimed.into_iter().filter(|(k, _)| !egress::sets_env(k)));
        // What the container and its environment file hold was a valid environment.
        Ok(Environment::keeping_valid(env))
    }
}
