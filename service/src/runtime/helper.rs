//! [`HelperRuntime`]: one helper channel per session, opened lazily (or from this build's helper
//! beside one of another protocol), retried once where that cannot give a wrong answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::channel::{Channel, ChannelError};
use super::*;
use crate::engine::{
    ContainerEngine, EngineError, ExecSpec, HELPER_USER_LABEL, SANDBOX_USER_LABEL,
};
use crate::shared_file::SharedFile;

/// A session's channel, opened once under its own async lock.
#[derive(Default)]
pub(super) struct SlotState {
    channel: Option<Arc<Channel>>,
    /// Where `serve` runs from when not [`crate::layout::HELPER`]: this build's helper, put
    /// beside a helper that speaks another protocol.
    serve_from: Option<String>,
    /// After a protocol violation: no channel is opened before this.
    quiet_until: Option<Instant>,
}

pub(super) type Slot = Arc<tokio::sync::Mutex<SlotState>>;

/// Where this build's helper goes in a session whose own helper speaks another protocol.
pub fn own_helper_path() -> String {
    format!("{}-p{}", crate::layout::HELPER, sandbox_protocol::VERSION)
}

/// [`SessionRuntime`] over the in-container helper.
pub struct HelperRuntime {
    pub(super) engine: Arc<dyn ContainerEngine>,
    pub(super) user: String,
    /// This build's helper binary, put into a session whose helper speaks another protocol.
    helper: Option<SharedFile>,
    /// One slot per session: the async lock makes concurrent first uses open one channel.
    pub(super) channels: Mutex<HashMap<String, Slot>>,
}

/// Why a call on a channel failed.
pub(super) enum CallError {
    /// The channel closed; `reached` says whether the helper had answered anything yet.
    Lost {
        reached: bool,
    },
    Helper(HelperError),
}

impl From<HelperError> for CallError {
    fn from(e: HelperError) -> Self {
        CallError::Helper(e)
    }
}

impl HelperRuntime {
    pub fn new(engine: Arc<dyn ContainerEngine>, run_uid: u32, run_gid: u32) -> Self {
        Self {
            engine,
            user: format!("{run_uid}:{run_gid}"),
            helper: None,
            channels: Mutex::default(),
        }
    }

    /// Gives the runtime this build's helper binary (see [`HelperRuntime::channel`]).
    pub fn with_helper(mut self, helper: Option<SharedFile>) -> Self {
        self.helper = helper;
        self
    }

    pub(super) fn slot(&self, id: &str) -> Slot {
        let mut map = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        // Slots of closed channels are dropped here, so the map holds live sessions only.
        let now = Instant::now();
        map.retain(|k, v| {
            k == id
                || v.try_lock()
                    .map(|s| {
                        s.channel.as_ref().is_some_and(|c| !c.is_closed())
                            || s.quiet_until.is_some_and(|t| t > now)
                    })
                    .unwrap_or(true)
        });
        map.entry(id.to_string()).or_default().clone()
    }

    /// Whether `slot` is no longer `id`'s: [`SessionRuntime::forget`] dropped it since.
    fn forgotten(&self, id: &str, slot: &Slot) -> bool {
        let map = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        map.get(id).is_none_or(|s| !Arc::ptr_eq(s, slot))
    }

    pub(super) async fn channel(&self, id: &str) -> Result<Arc<Channel>, HelperError> {
        let slot = self.slot(id);
        let mut held = slot.lock().await;
        if let Some(c) = held.channel.as_ref() {
            if !c.is_closed() {
                return Ok(c.clone());
            }
            if let Some(v) = c.violation() {
                held.channel = None;
                held.quiet_until = Some(Instant::now() + QUIET_AFTER_VIOLATION);
                tracing::warn!(session_id = %id, violation = %v, quiet = ?QUIET_AFTER_VIOLATION,
                    "session helper broke the protocol; its session gets no channel for a while");
            }
        }
        if held.quiet_until.is_some_and(|t| t > Instant::now()) {
            return Err(HelperError::Untrusted);
        }
        let unstartable = |e: ChannelError| {
            // A session removed or stopped while its channel opened (a delete right after a
            // create) took the helper with it: no fault to report.
            if self.forgotten(id, &slot) {
                tracing::debug!(session_id = %id, error = %e, "session helper gone with its session");
            } else {
                tracing::warn!(session_id = %id, error = %e, "session helper unavailable");
            }
            HelperError::Unstartable(e)
        };
        let spec = self.serve_spec(id, held.serve_from.as_deref()).await?;
        let exec = self.engine.exec_attached(id, &spec).await?;
        let chan = match Channel::open(exec).await {
            Ok(chan) => chan,
            // A session made by a build of another protocol: its helper is left alone (its
            // supervisor may run background processes) and this build's is put beside it,
            // root-owned in the root-owned service directory, to serve from instead.
            Err(e @ ChannelError::Version { .. }) if held.serve_from.is_none() => {
                let Some(bin) = &self.helper else {
                    tracing::warn!(session_id = %id, error = %e, "session helper speaks another protocol");
                    return Err(HelperError::OtherProtocol(e));
                };
                let path = own_helper_path();
                tracing::warn!(session_id = %id, error = %e, path, "session helper speaks another protocol; serving from this build's helper");
                // The same `serve`, from this build's helper (no second inspect). Put there by
                // an earlier channel (of this replica or another) already?
                let mut spec = spec;
                spec.cmd[0] = path.clone();
                let exec = self.engine.exec_attached(id, &spec).await?;
                let chan = match Channel::open(exec).await {
                    Ok(chan) => chan,
                    Err(_) => {
                        // Read from its file for this upload only (a rare path: an older
                        // build's session).
                        let file = bin.clone();
                        let read = tokio::task::spawn_blocking(move || file.read_all())
                            .await
                            .map_err(std::io::Error::other)
                            .and_then(|r| r);
                        let put = match read {
                            Ok(bytes) => {
                                ServiceFile::executable(&path)
                                    .upload(&*self.engine, id, &bytes)
                                    .await
                            }
                            Err(e) => Err(EngineError::Unavailable(e.to_string())),
                        };
                        if let Err(put) = put {
                            tracing::warn!(session_id = %id, error = %put, "this build's helper could not be put into the session");
                            return Err(HelperError::OtherProtocol(e));
                        }
                        let exec = self.engine.exec_attached(id, &spec).await?;
                        Channel::open(exec).await.map_err(unstartable)?
                    }
                };
                held.serve_from = Some(path);
                chan
            }
            Err(e) => {
                return Err(match self.removed_meanwhile(id).await {
                    Some(gone) => gone,
                    None => unstartable(e),
                });
            }
        };
        held.channel = Some(chan.clone());
        held.quiet_until = None;
        Ok(chan)
    }

    /// How to start `serve` in the session: as root, told to take the helper's own uid, where
    /// the sandbox says its helper has one (its labels); else as the sandbox user, as sandboxes
    /// created before that did. (One inspect per channel opened.)
    pub(super) async fn serve_spec(
        &self,
        id: &str,
        from: Option<&str>,
    ) -> Result<ExecSpec, HelperError> {
        let info = self.engine.inspect(id).await?;
        let helper = from.unwrap_or(crate::layout::HELPER);
        let mut cmd = vec![helper.to_string(), "serve".to_string()];
        let user = match (
            info.labels.get(HELPER_USER_LABEL),
            info.labels.get(SANDBOX_USER_LABEL),
        ) {
            (Some(helper), Some(sandbox)) => {
                cmd.extend([
                    "--user".to_string(),
                    sandbox.clone(),
                    "--helper-user".to_string(),
                    helper.clone(),
                ]);
                "0:0".to_string()
            }
            _ => self.user.clone(),
        };
        Ok(ExecSpec {
            cmd,
            user,
            workdir: Some("/".to_string()),
            env: Vec::new(),
        })
    }

    /// Runs `call` on the session's channel, once more on a fresh one when the first never
    /// reached a helper (or, with `idempotent`, when the helper died under it).
    pub(super) async fn with_retry<T, F>(
        &self,
        id: &str,
        idempotent: bool,
        call: F,
    ) -> Result<T, HelperError>
    where
        F: for<'a> Fn(&'a Arc<Channel>) -> futures::future::BoxFuture<'a, Result<T, CallError>>,
    {
        for attempt in 0..2 {
            let chan = self.channel(id).await?;
            match call(&chan).await {
                Ok(v) => return Ok(v),
                Err(CallError::Helper(e)) => return Err(e),
                Err(CallError::Lost { reached }) => {
                    if attempt == 0 && (!reached || idempotent) {
                        tracing::info!(session_id = %id, "session helper channel lost; reopening");
                        continue;
                    }
                    break;
                }
            }
        }
        Err(self
            .removed_meanwhile(id)
            .await
            .unwrap_or(HelperError::Lost))
    }

    /// Whether the session was removed under a helper that failed to start or a channel that
    /// was lost (by its deadline, or a removal beside the request): then the answer is the
    /// missing session's (404), not a helper fault to retry. A session stopped or paused
    /// meanwhile stays a retry: it still exists, and the next request finds it as it is.
    /// (One inspect, on failure paths.)
    async fn removed_meanwhile(&self, id: &str) -> Option<HelperError> {
        let closed = matches!(self.engine.inspect(id).await, Err(EngineError::NotFound));
        closed.then_some(HelperError::Engine(EngineError::NotFound))
    }
}
