//! What every E2B handler reaches, and the envd version it answers as: below the handlers, so
//! they import it and `mod.rs` alone composes them.

use std::sync::Arc;

use crate::config::Config;

/// The envd version this service answers as: the highest whose features are all served (file
/// metadata 0.6.2, watch events' entries 0.6.3, watches that may cross network mounts 0.6.4:
/// a sandbox has none, so the flag changes nothing), so the SDK itself refuses what is not.
pub const ENVD_VERSION: &str = "0.6.4";

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
    /// The deployment's sandbox ids, for a signed URL that names none (see [`LiveIds`]).
    pub live: Arc<LiveIds>,
}

/// The deployment's sandbox ids, listed at most every [`LiveIds::FRESH`]: a signed `/files` URL
/// carries no sandbox id (its signature names one), and anyone may present one, so a flood of
/// them lists the engines a few times a second, never once per request. Readers take the last
/// list without waiting; one listing runs at a time.
#[derive(Default)]
pub struct LiveIds {
    listed: std::sync::RwLock<Option<(tokio::time::Instant, Arc<Vec<String>>)>>,
    listing: tokio::sync::Mutex<()>,
}

impl LiveIds {
    const FRESH: std::time::Duration = std::time::Duration::from_millis(250);

    fn last(&self) -> Option<(tokio::time::Instant, Arc<Vec<String>>)> {
        self.listed
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The ids as last listed, however old (listing them when none were).
    pub async fn cached(
        &self,
        ops: &crate::ops::Ops,
    ) -> Result<Arc<Vec<String>>, crate::error::ApiError> {
        match self.last() {
            Some((_, ids)) => Ok(ids),
            None => self.refresh(ops).await,
        }
    }

    /// The ids listed now, unless a list younger than [`LiveIds::FRESH`] is at hand (one that
    /// another caller's listing just made counts).
    pub async fn refresh(
        &self,
        ops: &crate::ops::Ops,
    ) -> Result<Arc<Vec<String>>, crate::error::ApiError> {
        let _one = self.listing.lock().await;
        if let Some((at, ids)) = self.last()
            && at.elapsed() < Self::FRESH
        {
            return Ok(ids);
        }
        let mut ids = Vec::new();
        let mut next: Option<String> = None;
        loop {
            let mut pairs = vec![("limit".to_string(), "1000".to_string())];
            if let Some(n) = next.take() {
                pairs.push(("next".into(), n));
            }
            let page = ops
                .list(&crate::ops::inventory::ListQuery::parse(&pairs)?)
                .await?;
            ids.extend(page.sessions.into_iter().map(|s| s.session_id));
            match page.next {
                Some(n) => next = Some(n),
                None => break,
            }
        }
        let ids = Arc::new(ids);
        *self.listed.write().unwrap_or_else(|e| e.into_inner()) =
            Some((tokio::time::Instant::now(), ids.clone()));
        Ok(ids)
    }
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
