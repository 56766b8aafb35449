//! Operations on a session's life.

use super::{Access, Admit, Op, Ops, Reached};
use crate::api::{SessionInfo, StartSessionRequest};
use crate::error::ApiError;
use shared_policy::PolicyFile;

/// Makes a session run again and, with `timeout`, lengthens its life (E2B's `connect`): under
/// its lock, so nothing else thaws, pauses or moves its deadline between the steps. The
/// deadline moves when the session was not running (a resume), or when it would end sooner
/// than `timeout` from now: a connect never shortens a running session's life.
pub struct Connect {
    pub timeout: Option<u64>,
}

/// A connected session: whether it was resumed (it was paused or stopped), and its info as the
/// connect left it.
pub struct Connected {
    pub resumed: bool,
    pub info: SessionInfo,
}

impl Op for Connect {
    type Output = Connected;
    const ADMIT: Admit = Admit::Free;
    const ACCESS: Access = Access::Ordered;

    async fn apply(self, at: Reached) -> Result<Connected, ApiError> {
        let resumed = at
            .found
            .as_ref()
            .is_some_and(|c| c.is_paused() || !c.is_running());
        let engine = at.engine();
        let mut info = at.sessions.info(&at.id, &engine).await?.info;
        if let Some(seconds) = self.timeout
            && (resumed || ends_before(&info, seconds))
        {
            at.sessions.set_timeout(&at.id, seconds).await?;
            info = at.sessions.info(&at.id, &engine).await?.info;
        }
        Ok(Connected { resumed, info })
    }
}

/// Whether a session would end within `seconds` from now (one without a deadline never does).
fn ends_before(s: &SessionInfo, seconds: u64) -> bool {
    let Some(end) = s.expires_at.as_deref() else {
        return false;
    };
    let Some(end) = crate::time::parse_rfc3339(end) else {
        return true;
    };
    let wanted = crate::time::unix_now().saturating_add_unsigned(seconds);
    end.unix_timestamp() < wanted
}

/// Freezes a session (and its gateway), keeping its memory and background processes; one
/// paused already stays so, a stopped one is refused (409).
pub struct Pause;

impl Op for Pause {
    type Output = ();
    const ADMIT: Admit = Admit::Free;
    const ACCESS: Access = Access::Held;

    async fn apply(self, at: Reached) -> Result<(), ApiError> {
        Ok(at.sessions.pause(&at.id).await?)
    }
}

/// Moves a session's deadline to now plus `seconds` (shorter or longer), without thawing it;
/// answers the session with its new deadline.
pub struct SetTimeout {
    pub seconds: u64,
}

impl Op for SetTimeout {
    type Output = SessionInfo;
    const ADMIT: Admit = Admit::Free;
    const ACCESS: Access = Access::Held;

    async fn apply(self, at: Reached) -> Result<SessionInfo, ApiError> {
        at.sessions.set_timeout(&at.id, self.seconds).await?;
        Ok(at.sessions.info(&at.id, &at.engine()).await?.info)
    }
}

/// Patches a session's metadata under its lock, without thawing it (a JSON merge patch of
/// string values: `None` removes a key); answers the session with its new metadata.
pub struct PatchMetadata {
    pub patch: std::collections::BTreeMap<String, Option<String>>,
}

impl Op for PatchMetadata {
    type Output = SessionInfo;
    const ADMIT: Admit = Admit::Free;
    const ACCESS: Access = Access::Held;

    async fn apply(self, at: Reached) -> Result<SessionInfo, ApiError> {
        at.sessions.patch_metadata(&at.id, self.patch).await?;
        Ok(at.sessions.info(&at.id, &at.engine()).await?.info)
    }
}

/// Makes sure a session runs (a stopped one restarted, a paused one thawed), in its order: the
/// reference's `GET /session/{id}/`.
pub struct EnsureRunning;

impl Op for EnsureRunning {
    type Output = ();
    const ADMIT: Admit = Admit::Free;
    const ACCESS: Access = Access::Ordered;

    async fn apply(self, _at: Reached) -> Result<(), ApiError> {
        Ok(())
    }
}

/// Stops a session (kept for a later request to restart), under its lock.
pub struct Stop;

impl Op for Stop {
    type Output = ();
    const ADMIT: Admit = Admit::Free;
    const ACCESS: Access = Access::Held;

    async fn apply(self, at: Reached) -> Result<(), ApiError> {
        Ok(at.sessions.close(&at.id, false).await?)
    }
}

/// Removes a session and everything of it, not waiting behind a busy one.
pub struct Remove;

impl Op for Remove {
    type Output = ();
    const ADMIT: Admit = Admit::Free;
    const ACCESS: Access = Access::Removal;

    async fn apply(self, at: Reached) -> Result<(), ApiError> {
        Ok(at.sessions.close(&at.id, true).await?)
    }
}

/// Replaces a session's egress policy (`policy` as the request gave it, checked by the
/// gateway's own parser), without thawing it: a paused session gets it when it thaws.
pub struct RefreshEgress {
    pub policy: serde_json::Value,
}

impl Op for RefreshEgress {
    type Output = ();
    const ADMIT: Admit = Admit::Free;
    const ACCESS: Access = Access::Held;

    async fn apply(self, at: Reached) -> Result<(), ApiError> {
        Ok(at.sessions.refresh_egress(&at.id, &self.policy).await?)
    }
}

/// The policy a session's gateway enforces now, secrets and door state included: for a door
/// that shows part of it or derives the next from it; never rendered whole. As it stands:
/// reading it neither thaws nor starts the session.
pub struct ReadEgress;

impl Op for ReadEgress {
    type Output = PolicyFile;
    const ADMIT: Admit = Admit::Free;
    const ACCESS: Access = Access::Held;

    async fn apply(self, at: Reached) -> Result<PolicyFile, ApiError> {
        Ok(at.sessions.current_egress(&at.id).await?)
    }
}

/// A door's edit of a session's egress policy, under its lock so no other edit interleaves:
/// `edit` maps the policy the gateway enforces to the next one (and what the door answers),
/// which is installed and acknowledged as a refresh is. An edit that changes nothing installs
/// nothing.
pub struct EditEgress<F> {
    pub edit: F,
}

impl<F, T> Op for EditEgress<F>
where
    F: FnOnce(PolicyFile) -> Result<(PolicyFile, T), ApiError> + Send,
    T: Send,
{
    type Output = (PolicyFile, T);
    const ADMIT: Admit = Admit::Free;
    const ACCESS: Access = Access::Held;

    async fn apply(self, at: Reached) -> Result<(PolicyFile, T), ApiError> {
        let current = at.sessions.current_egress(&at.id).await?;
        let before = current.content();
        let (next, answer) = (self.edit)(current)?;
        if next.content() != before {
            at.sessions.install_door_egress(&at.id, &next).await?;
        }
        Ok((next, answer))
    }
}

impl Ops {
    /// A new session (a create slot first, held until it is made): its id.
    pub async fn create(&self, req: &StartSessionRequest) -> Result<String, ApiError> {
        let _slot = self.admission.create().await?;
        Ok(self.fleet.create(req).await?)
    }
}
