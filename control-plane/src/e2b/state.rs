//! What every E2B handler reaches, and the envd version it answers as: below the handlers, so
//! they import it and `mod.rs` alone composes them.

use std::sync::Arc;

use crate::config::Config;

/// The envd version this service answers as: the highest whose features are all served (file
/// metadata, envd 0.6.2, is not), so the SDK itself refuses what is not.
pub const ENVD_VERSION: &str = "0.6.1";

/// What every handler reaches.
#[derive(Clone)]
pub struct E2b {
    pub config: Arc<Config>,
    /// The operations on sessions (what envd's processes go through).
    pub ops: crate::ops::Ops,
    pub tokens: super::token::Tokens,
    pub watchers: Arc<super::polled::Watchers>,
    /// envd's: a paused sandbox stays paused (it is not running until `connect` resumes it).
    pub keep_paused: bool,
}

impl E2b {
    /// Applies `op` to sandbox `id` (404, as envd's "not found", for an id that cannot be a
    /// session's), keeping it paused if this door does.
    pub async fn apply<O: crate::ops::Op>(
        &self,
        id: &str,
        op: O,
    ) -> Result<O::Output, super::connect::RpcError> {
        Ok(self.reach(id, op).await?)
    }

    /// [`E2b::apply`] with the operation's own error, for a door that renders it over HTTP.
    pub async fn reach<O: crate::ops::Op>(
        &self,
        id: &str,
        op: O,
    ) -> Result<O::Output, crate::error::ApiError> {
        let id = session_id(id)?;
        self.ops
            .apply_keeping_paused(&id, op, self.keep_paused)
            .await
    }
}

/// A sandbox id as the session id it names: one that cannot be a session's is not found, as an
/// unknown one is.
pub fn session_id(id: &str) -> Result<crate::ids::SessionId, crate::error::ApiError> {
    crate::ids::SessionId::parse(id).map_err(|_| crate::error::ApiError::NotFound)
}
