//! The MCP sessions this process keeps (the stateful mode): rmcp's in-memory session manager,
//! with a cap on how many there are and an idle expiry that counts an open stream as use.
//!
//! Why: the SDK keeps any number of sessions, each for five minutes without an event, so a
//! client that only sends `initialize` grew the service by ~55 KiB a session (8,000 of them: 38
//! → 464 MiB), most of it the SDK's message queues, which take room for 32 messages of ~370
//! bytes each when made (no SDK setting shrinks that). Here sessions cost at most
//! [`McpConfig::max_sessions`] × that, and one nobody uses goes after
//! [`McpConfig::session_idle`].
//!
//! - **Idle** means no request in flight and no stream open (a call's answer, the standalone
//!   `GET` stream, a resumption) for the idle time. The SDK's own keep-alive is turned off: it
//!   counts only messages, so it also ended the sessions of connected clients that were just
//!   waiting (the Python SDK holds its `GET` stream open for as long as it is connected, and
//!   sends no pings), and their next call failed with "Session terminated".
//! - **At the cap** a new session takes the place of the least recently used idle one; when
//!   every session is busy, `initialize` gets 503 with `Retry-After` (decided before rmcp sees
//!   the request: see [`McpSessions::admits_new`]).
//!
//! Evicting rather than refusing first: an MCP session here holds nothing but its streams (the
//! sandboxes are named by `session_id` in each call, and live on without it), so a client whose
//! idle session went starts a new one (what the spec asks of a client that gets 404 for its
//! session) and loses nothing. Refusing first would let one client that opens sessions in a
//! loop lock every new client out for the idle time. Eviction cannot take a connected client's
//! session either, since an open stream is not idle; a flood that holds streams open fills the
//! cap and is then refused like anyone else, while the sessions already there keep working.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use futures::{Stream, StreamExt};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::WorkerTransport;
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError, LocalSessionWorker, SessionConfig,
};
use rmcp::transport::streamable_http_server::session::{
    ServerSseMessage, SessionId, SessionManager,
};

use tokio::time::Instant;

use crate::config::McpConfig;

/// A session manager's failure: rmcp answers it with a 500 (the 503 at the cap is decided
/// before; this is the rare case of a race to the last slot).
#[derive(Debug, thiserror::Error)]
pub enum McpSessionError {
    #[error("MCP session limit reached: {0} sessions, none idle")]
    Full(usize),
    #[error("MCP session not found")]
    NotFound,
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
}

/// The sessions of `/mcp`: a cap and an idle expiry over rmcp's [`LocalSessionManager`]. A
/// clone is the same sessions (the service holds one, the guard another).
#[derive(Clone)]
pub struct McpSessions {
    shared: Arc<Shared>,
}

struct Shared {
    inner: LocalSessionManager,
    table: Mutex<Table>,
    max: usize,
    idle: Duration,
    /// Started with the first session (there is a runtime then); ends with the manager.
    sweeper: OnceLock<()>,
}

/// Each session's use, the slots taken by sessions being created, and what the log was told.
#[derive(Default)]
struct Table {
    sessions: HashMap<SessionId, Use>,
    reserved: usize,
    evicted: Notice,
    refused: Notice,
}

/// How often at most the log hears of evictions, and of refusals: a client opening sessions in
/// a loop would otherwise write a line per request.
const NOTICE_EVERY: Duration = Duration::from_secs(60);

/// Events of one kind since the log last heard of them.
#[derive(Default)]
struct Notice {
    last: Option<Instant>,
    since: u64,
}

impl Notice {
    /// Counts one; how many to log now (the first, then at most one line a [`NOTICE_EVERY`]).
    fn note(&mut self) -> Option<u64> {
        self.since += 1;
        let now = Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < NOTICE_EVERY)
        {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.since))
    }
}

struct Use {
    /// Requests and streams open on the session.
    open: usize,
    /// When it was last used: opened, or a stream of it closed.
    last: Instant,
}

impl Table {
    fn taken(&self) -> usize {
        self.sessions.len() + self.reserved
    }

    /// The least recently used session with nothing open (a linear scan: at most the cap).
    fn oldest_idle(&self) -> Option<SessionId> {
        self.sessions
            .iter()
            .filter(|(_, u)| u.open == 0)
            .min_by_key(|(_, u)| u.last)
            .map(|(id, _)| id.clone())
    }
}

impl McpSessions {
    pub fn new(config: &McpConfig) -> Self {
        let mut inner = LocalSessionManager::default();
        let mut session = SessionConfig::default();
        // Idleness is ours (see the module doc).
        session.keep_alive = None;
        inner.session_config = session;
        Self {
            shared: Arc::new(Shared {
                inner,
                table: Mutex::new(Table::default()),
                max: config.max_sessions.max(1),
                idle: config.session_idle,
                sweeper: OnceLock::new(),
            }),
        }
    }

    /// Whether a new session would be made now: a free slot, or an idle session to replace.
    /// The guard answers `initialize` with 503 when not, before rmcp sees it (rmcp turns a
    /// session manager's error into a 500).
    pub fn admits_new(&self) -> bool {
        let mut t = self.shared.lock();
        if t.taken() < self.shared.max || t.sessions.values().any(|u| u.open == 0) {
            return true;
        }
        if let Some(refused) = t.refused.note() {
            tracing::warn!(
                max = self.shared.max,
                refused,
                "new MCP sessions refused: every session has a call or stream open \
                 (raise DAIV_SANDBOX_MCP_MAX_SESSIONS if these are real clients)"
            );
        }
        false
    }

    /// The session's use begins: a guard that ends it when dropped (with the stream it rides
    /// on), or not found.
    fn open(&self, id: &SessionId) -> Result<Open, McpSessionError> {
        let mut t = self.shared.lock();
        let u = t.sessions.get_mut(id).ok_or(McpSessionError::NotFound)?;
        u.open += 1;
        u.last = Instant::now();
        Ok(Open {
            shared: Arc::downgrade(&self.shared),
            id: id.clone(),
        })
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Table> {
        // A panic elsewhere leaves the counts as they were: still usable.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn start_sweeper(self: &Arc<Self>) {
        self.sweeper.get_or_init(|| {
            let shared = Arc::downgrade(self);
            let every = (self.idle / 4).clamp(Duration::from_millis(250), Duration::from_secs(15));
            tokio::spawn(sweep(shared, every));
        });
    }

    /// Ends the sessions idle for the idle time.
    async fn expire(&self) {
        let expired: Vec<SessionId> = {
            let mut t = self.lock();
            let now = Instant::now();
            let ids: Vec<SessionId> = t
                .sessions
                .iter()
                .filter(|(_, u)| u.open == 0 && now.duration_since(u.last) >= self.idle)
                .map(|(id, _)| id.clone())
                .collect();
            for id in &ids {
                t.sessions.remove(id);
            }
            ids
        };
        if expired.is_empty() {
            return;
        }
        tracing::debug!(count = expired.len(), "idle MCP sessions expired");
        for id in expired {
            if let Err(e) = self.inner.close_session(&id).await {
                tracing::debug!(error = %e, "closing an expired MCP session");
            }
        }
    }
}

async fn sweep(shared: Weak<Shared>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        shared.expire().await;
    }
}

/// A request or stream open on a session.
struct Open {
    shared: Weak<Shared>,
    id: SessionId,
}

impl Drop for Open {
    fn drop(&mut self) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let mut t = shared.lock();
        if let Some(u) = t.sessions.get_mut(&self.id) {
            u.open = u.open.saturating_sub(1);
            u.last = Instant::now();
        }
    }
}

/// A slot taken for a session being created; given back when the creation ends either way
/// (its future may be dropped when the client goes).
struct Reserved<'a>(&'a Shared);

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        let mut t = self.0.lock();
        t.reserved = t.reserved.saturating_sub(1);
    }
}

/// `stream`, which keeps the session in use until it is dropped.
fn held<S: Stream + Send + Sync + 'static>(
    stream: S,
    open: Open,
) -> impl Stream<Item = S::Item> + Send + Sync + 'static {
    stream.map(move |item| {
        let _in_use = &open;
        item
    })
}

impl SessionManager for McpSessions {
    type Error = McpSessionError;
    type Transport = WorkerTransport<LocalSessionWorker>;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        self.shared.start_sweeper();
        let (victim, reserved) = {
            let mut t = self.shared.lock();
            let victim = if t.taken() >= self.shared.max {
                let Some(victim) = t.oldest_idle() else {
                    return Err(McpSessionError::Full(self.shared.max));
                };
                t.sessions.remove(&victim);
                if let Some(evicted) = t.evicted.note() {
                    tracing::info!(
                        max = self.shared.max,
                        evicted,
                        "MCP session limit reached: the least recently used idle sessions were \
                         closed for new ones (DAIV_SANDBOX_MCP_MAX_SESSIONS)"
                    );
                }
                Some(victim)
            } else {
                None
            };
            t.reserved += 1;
            (victim, Reserved(&self.shared))
        };
        if let Some(victim) = victim
            && let Err(e) = self.shared.inner.close_session(&victim).await
        {
            tracing::debug!(error = %e, "closing an evicted MCP session");
        }
        let (id, transport) = self.shared.inner.create_session().await?;
        self.shared.lock().sessions.insert(
            id.clone(),
            Use {
                open: 0,
                last: Instant::now(),
            },
        );
        drop(reserved);
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        let _open = self.open(id)?;
        Ok(self.shared.inner.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        if !self.shared.lock().sessions.contains_key(id) {
            return Ok(false);
        }
        Ok(self.shared.inner.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.shared.lock().sessions.remove(id);
        Ok(self.shared.inner.close_session(id).await?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let open = self.open(id)?;
        let stream = self.shared.inner.create_stream(id, message).await?;
        Ok(held(stream, open))
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        let _open = self.open(id)?;
        Ok(self.shared.inner.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let open = self.open(id)?;
        let stream = self.shared.inner.create_standalone_stream(id).await?;
        Ok(held(stream, open))
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let open = self.open(id)?;
        let stream = self.shared.inner.resume(id, last_event_id).await?;
        Ok(held(stream, open))
    }

    // `restore_session` and `event_store` keep the trait's defaults: no external session store,
    // so an unknown id is a 404 and never a session made past the cap.
}
