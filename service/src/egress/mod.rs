//! Egress sessions: the one owner of the per-session **triad**.
//!
//! ```text
//! [sandbox] --internal network (no route out)--> [gateway] --egress-side network--> upstream
//! ```
//!
//! A triad is the three parts of an egress session, tied together by one random token (the
//! [`EGRESS_LABEL`] on all three, plus [`GATEWAY_LABEL`] and [`NETWORK_LABEL`] on the sandbox):
//! an internal network with no route out, an egress gateway sidecar (our proxy, enforcing the
//! session's policy) on that network and on the egress-side one, and the sandbox, attached to
//! the internal network only, with the proxy settings and the CA certificate. Only this module
//! creates, restarts, refreshes and tears down those parts: the rest of the service holds a
//! [`Triad`] (read off the sandbox's labels) and asks.
//!
//! The internal network gets a /29 of our choosing so the gateway (`.2`) and the sandbox (`.3`)
//! keep fixed addresses across stops and starts: the proxy address baked into the sandbox's
//! environment stays right after a warm restart. The gateway listens on its internal address only,
//! so nothing on the egress-side network can use it as an open proxy. The CA key and the secrets
//! are written into the gateway alone; the sandbox gets the CA certificate, nothing else.
//!
//! # Who calls what
//!
//! | caller | call |
//! | --- | --- |
//! | a cold `POST /session/` (`Sessions::create`, when no warm-pool member is claimed) | [`Egress::reserve`] (a token and its [`lock_key`], held while `SandboxFactory::build` runs [`Egress::create`]) |
//! | warm-pool refill (`pool::Refill`) | the same, with a deny-all policy and the helper in the gateway |
//! | warm-pool claim | [`Egress::install`] (the request's policy, acknowledged) |
//! | `PUT .../egress/` (`Sessions::refresh_egress`) | [`parse_policy`], [`Egress::refresh`] |
//! | any session operation (`Sessions::ensure_running`) | [`Egress::ensure_gateway`] (restart) |
//! | lock-free operations (`Sessions::gateway_up`) | [`Egress::gateway_running`] |
//! | `DELETE` (`Sessions::close`) | [`Egress::stop`]; with `force`, [`teardown`] |
//! | pool discards, failed creates | [`teardown`] |
//! | the reaper's orphan sweep | [`leftovers`], then [`teardown`] under [`lock_key`] |
//!
//! [`teardown`] needs only the engine, so parts are removed even where no CA is configured.
//!
//! Docker round trips: create = 2 image checks + network + gateway (create, put config, connect,
//! start) + sandbox (create, put skeleton, start, inspect) + CA install exec + readiness wait +
//! policy acknowledgement exec (+ its exit code) ≈ 15, with the gateway's start running beside the
//! sandbox's create and start; refresh = inspect sandbox + inspect gateway + put staged config +
//! acknowledgement exec + exit code (5).
//!
//! Policy installs are atomic and acknowledged (the contract is `shared_policy::sidecar`): the
//! file carries a `version` (a keyed hash of its content, see [`version`]); a refresh extracts
//! it as the staging file beside `config.json` (an extraction writes in place, and the image
//! has no shell to rename with), the gateway renames it over `config.json` once it is complete
//! (a claim writes it through the helper instead, see `policy.rs`), and the control plane runs the
//! gateway's own `health --expect-version V` inside the gateway until it reports that version.
//! The gateway answers that on a loopback listener of its own network namespace: the sandbox
//! can neither read the version there nor exhaust the listener (its connection slots are the
//! proxy port's).
//! Only then is the update answered 204 (503 after [`POLICY_ACK_TIMEOUT`]); session create waits
//! the same way for the first policy.
//!
//! # Layout
//! - `mod.rs`: [`Egress`] (what does not change per session), labels, tokens and their lock.
//! - [`triad`]: the lifecycle: create (network, gateway, sandbox wiring), stop, teardown, and
//!   the listing the reaper's orphan sweep reads.
//! - `files`: the archives of the gateway's config directory (its policy, CA and settings).
//! - `gateway`: the gateway's container spec, readiness and restart.
//! - `policy`: parsing the API's policy body, installing a policy and its acknowledgement.
//! - [`version`]: the keyed version a policy is labelled with.
//!
//! [`Sessions::refresh_egress`]: crate::sessions::Sessions::refresh_egress
//! [`Sessions::ensure_running`]: crate::sessions::Sessions::ensure_running
//! [`Sessions::gateway_up`]: crate::sessions::Sessions::gateway_up
//! [`Sessions::close`]: crate::sessions::Sessions::close
//! [`EGRESS_LABEL`]: crate::engine::EGRESS_LABEL

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use shared_policy::sidecar;

use crate::config::Config;
use crate::coordination::lock::{LockError, LockGuard, SessionLocks};
use crate::engine::ContainerEngine;
use crate::ids::fnv;

mod error;
mod files;
mod gateway;
mod policy;
pub mod triad;
pub mod version;

pub use error::EgressError;

pub use policy::parse_policy;
pub use triad::{Leftover, Parts, SandboxPlan, Triad, caller_env, leftovers, sets_env, teardown};

/// On a sandbox whose gateway enforces rule actions (`deny`, `credential`): a gateway made
/// before them reads such a rule as an `allow` (unknown fields are ignored), so a policy with
/// one is installed only where this label says the gateway knows them.
pub const RULES_LABEL: &str = "daiv.sandbox.egress.rules";
/// [`RULES_LABEL`]'s value.
pub const RULES_WITH_ACTIONS: &str = "actions";

/// The sandbox's labels naming its gateway container and internal network.
pub const GATEWAY_LABEL: &str = "daiv.sandbox.egress.gateway";
pub const NETWORK_LABEL: &str = "daiv.sandbox.egress.network";

/// The non-root user the gateway image runs as; its files are owned by it.
pub const GATEWAY_UID: u32 = sidecar::UID;
/// A policy install (create or `PUT .../egress/`) fails with 503 when the gateway does not
/// report the new version within this.
pub const POLICY_ACK_TIMEOUT: Duration = Duration::from_secs(5);
/// The 503's words when the gateway image cannot be had (absent and not pullable), as the
/// reference says them; the pull's reason follows in our words.
pub const GATEWAY_IMAGE_FAILED: &str = "Egress proxy failed to start";

/// Everything egress needs that does not change per session, read once at start-up.
pub struct Egress {
    engine: Arc<dyn ContainerEngine>,
    config: Arc<Config>,
    ca_cert: Bytes,
    ca_key: Bytes,
    upstream_ca: Option<Bytes>,
    /// Labels every policy installed, keyed by the CA key.
    versions: version::PolicyVersions,
}

impl Egress {
    /// Reads the CA pair (and the optional upstream bundle) so a bad file fails start-up, not a
    /// session.
    pub fn load(
        engine: Arc<dyn ContainerEngine>,
        config: Arc<Config>,
    ) -> Result<Option<Self>, std::io::Error> {
        let Some(ca) = &config.egress.ca else {
            return Ok(None);
        };
        let ca_cert = Bytes::from(std::fs::read(&ca.cert_file)?);
        let ca_key = Bytes::from(std::fs::read(&ca.key_file)?);
        let upstream_ca = match &config.egress.upstream_ca_file {
            Some(p) => Some(Bytes::from(std::fs::read(p)?)),
            None => None,
        };
        let versions = version::PolicyVersions::from_ca_key(&ca_key);
        Ok(Some(Self {
            engine,
            config,
            ca_cert,
            ca_key,
            upstream_ca,
            versions,
        }))
    }

    /// What a warm-pool egress member depends on besides the sandbox (for its spec hash).
    pub fn fingerprint(&self) -> String {
        let c = &self.config;
        format!(
            "{}|{}|{}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{}|{}|{}|{}|{:?}",
            c.egress.proxy_image,
            c.egress.proxy_port,
            c.egress.proxy_runtime.as_str(),
            c.egress.proxy_network,
            c.sessions.network,
            c.egress.proxy_memory_bytes,
            c.egress.proxy_cpus,
            c.egress.allowed_cidrs,
            c.egress
                .upstream_proxy
                .as_ref()
                .map(|p| fnv(p.expose().as_bytes())),
            fnv(&self.ca_cert),
            fnv(&self.ca_key),
            self.upstream_ca.as_deref().map_or(0, fnv),
            c.egress.subnet_pool,
            c.egress
                .plain_http_hosts
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
        )
    }
}

/// The lock a session creation (cold or a pool member's) holds on its egress token while it
/// builds the triad, and that the reaper takes before removing an orphaned gateway or network of
/// that token: a triad's parts exist before its sandbox does.
pub fn lock_key(token: &str) -> String {
    format!("egress-{token}")
}

/// A fresh token for a triad's parts and its lock ([`lock_key`]), held until dropped: the
/// reaper never takes the parts of a triad being built for orphans.
pub struct Reservation {
    token: String,
    _held: LockGuard,
}

impl Reservation {
    pub fn token(&self) -> &str {
        &self.token
    }
}

impl Egress {
    /// A fresh token for a new triad, with its lock held (a fresh lock is free at once unless its
    /// backend is down, then `wait` bounds the attempt). Only a cold create and a pool build
    /// reserve one: a claim uses the member's triad.
    pub async fn reserve(
        &self,
        locks: &dyn SessionLocks,
        wait: Duration,
    ) -> Result<Reservation, LockError> {
        let token = crate::ids::random_token();
        let held = locks.acquire(&lock_key(&token), wait).await?;
        Ok(Reservation { token, _held: held })
    }
}
