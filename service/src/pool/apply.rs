//! What a claim applies to its member: the request's environment, limits and egress policy.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use shared_policy::PolicyFile;

use super::{Kind, Member, Prepared};
use super::{Pool, PoolError};
use crate::api::StartSessionRequest;
use crate::engine::EngineError;
use crate::layout::ENV_FILE;
use crate::runtime::ServiceFile;

/// The claim's environment as the helper reads it (a JSON list of pairs): the caller's
/// variables, minus those the egress settings set (they win, as at a cold create). `None` when
/// there are none: the member's skeleton wrote an empty file.
pub(crate) fn env_json(req: &StartSessionRequest, kind: Kind) -> Option<Bytes> {
    crate::sandbox::env_json(req.environment.as_deref(), kind == Kind::Egress)
}

/// The environment file on the session's own volume: root's, world-readable (the sandbox user
/// reads it, never replaces it), never in a snapshot.
fn env_file() -> ServiceFile {
    ServiceFile::root(ENV_FILE, 0o644)
}

impl Pool {
    /// Opens what a claim of `member` writes through (see [`Prepared`]); what cannot be opened
    /// is opened at the claim instead.
    pub(crate) async fn prepare(&self, member: &Member) -> Prepared {
        let env_file = env_file();
        let env = env_file.open(self.engine(), &member.id);
        let policy = async {
            match (&member.triad, self.factory.egress()) {
                (Some(triad), Some(egress)) => egress.installer(triad).await.ok(),
                _ => None,
            }
        };
        let (env, policy) = tokio::join!(env, policy);
        Prepared {
            env: env.ok(),
            policy,
        }
    }

    /// Applies the request to a claimed member: environment, limits and policy, side by side.
    pub(super) async fn apply(
        &self,
        member: &Member,
        req: &StartSessionRequest,
        policy: Option<&PolicyFile>,
        kind: Kind,
        prepared: Prepared,
    ) -> Result<(), PoolError> {
        let id = member.id.as_str();
        let Prepared {
            env: env_writer,
            policy: installer,
        } = prepared;
        let env = async {
            let Some(json) = env_json(req, kind) else {
                return Ok(());
            };
            env_file()
                .write(self.engine(), id, &json, &[], env_writer)
                .await?;
            Ok::<_, PoolError>(())
        };
        let limits = async {
            if req.memory_bytes.is_none() && req.cpus.is_none() {
                return Ok(());
            }
            let nano_cpus = req.cpus.map(crate::api::nano_cpus);
            match self
                .engine()
                .update_limits(id, req.memory_bytes, nano_cpus)
                .await
            {
                Ok(()) => Ok(()),
                Err(e) => {
                    if !matches!(e, EngineError::NotFound) {
                        self.limits_refused.store(true, Ordering::Relaxed);
                    }
                    Err(PoolError::from(e))
                }
            }
        };
        let policy = async {
            match (policy, &member.triad, self.factory.egress()) {
                (None, _, _) => Ok(()),
                (Some(policy), Some(triad), Some(egress)) => {
                    Ok(egress.install(triad, policy, installer).await?)
                }
                _ => Err(PoolError::MemberWithoutGateway),
            }
        };
        let (env, limits, policy) = tokio::join!(env, limits, policy);
        env.and(limits).and(policy)
    }
}
