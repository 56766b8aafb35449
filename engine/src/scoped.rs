//! An engine of a fleet as the code above the engine seam sees it ([`ScopedEngine`], a
//! [`Decorate`]: it writes only its ids, its guard and its streams' cut).
//!
//! Two things set a fleet's engine apart from the single engine of a plain deployment:
//! - its container ids are handed out with the engine's name in front (`b.<id>`), so a session id
//!   says which engine holds it, on every replica, without a database (`sandbox_common::ids`);
//! - it may be unreachable: until the fleet first connects to it, and whenever its health check
//!   marks it down. A call then fails at once, and a call in flight (a stream too) is cut when the
//!   engine is marked down, so no request waits on a dead engine longer than it takes to notice.
//!
//! The control plane's fleet owns the [`Link`]: it connects, checks health and flips the
//! state; everything else holds the [`ScopedEngine`].

use std::future::Future;
use std::ops::Deref;
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use futures::stream::BoxStream;
use sandbox_common::ids::with_engine;
use tokio::sync::watch;

use crate::{ContainerEngine, Decorate, EngineError};

/// The connection to one engine and whether it answers.
pub struct Link {
    name: String,
    engine: RwLock<Option<Arc<dyn ContainerEngine>>>,
    up: watch::Sender<bool>,
}

impl Link {
    /// A link not connected yet (down).
    pub fn new(name: &str) -> Arc<Self> {
        Arc::new(Self {
            name: name.to_string(),
            engine: RwLock::new(None),
            up: watch::Sender::new(false),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The connected engine, whatever its health.
    pub fn engine(&self) -> Option<Arc<dyn ContainerEngine>> {
        self.engine
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn connect(&self, engine: Arc<dyn ContainerEngine>) {
        *self.engine.write().unwrap_or_else(|e| e.into_inner()) = Some(engine);
    }

    /// Drops the connection (and its pooled sockets): an engine that died and came back at the
    /// same address would otherwise be asked over sockets of its previous life, which may go
    /// nowhere until the request's timeout.
    pub fn disconnect(&self) {
        *self.engine.write().unwrap_or_else(|e| e.into_inner()) = None;
    }

    pub fn is_up(&self) -> bool {
        *self.up.borrow()
    }

    /// Marks the engine up or down; going down cuts every call in flight.
    pub fn set_up(&self, up: bool) {
        self.up
            .send_if_modified(|now| std::mem::replace(now, up) != up);
    }

    fn down_error(&self) -> EngineError {
        EngineError::Unavailable(format!("engine {} is down", self.name))
    }

    /// The engine when it is up.
    fn live(&self) -> Result<Arc<dyn ContainerEngine>, EngineError> {
        match self.engine() {
            Some(e) if self.is_up() => Ok(e),
            _ => Err(self.down_error()),
        }
    }

    /// Resolves once the engine is marked down.
    fn went_down(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.up.subscribe();
        async move {
            let _ = rx.wait_for(|up| !*up).await;
        }
    }

    /// `stream`, ended by an error as soon as the engine is marked down.
    fn cut<T: Send + 'static>(
        &self,
        stream: BoxStream<'static, Result<T, EngineError>>,
    ) -> BoxStream<'static, Result<T, EngineError>> {
        let down = Box::pin(self.went_down());
        let error = self.down_error().to_string();
        futures::stream::unfold(
            (stream, down, false),
            move |(mut stream, mut down, done)| {
                let error = error.clone();
                async move {
                    if done {
                        return None;
                    }
                    tokio::select! {
                        biased;
                        () = &mut down => Some((Err(EngineError::Unavailable(error)), (stream, down, true))),
                        item = stream.next() => item.map(|i| (i, (stream, down, false))),
                    }
                }
            },
        )
        .boxed()
    }
}

/// A fleet's engine: ids with the engine's prefix, calls bounded by its health.
pub struct ScopedEngine {
    link: Arc<Link>,
    prefix: Option<String>,
}

impl ScopedEngine {
    pub fn new(link: Arc<Link>, prefix: Option<&str>) -> Self {
        Self {
            link,
            prefix: prefix.map(str::to_string),
        }
    }
}

impl Decorate for ScopedEngine {
    fn inner(
        &self,
    ) -> Result<impl Deref<Target = dyn ContainerEngine> + Send + Sync + '_, EngineError> {
        self.link.live()
    }

    fn prefix(&self) -> Option<&str> {
        self.prefix.as_deref()
    }

    /// The call, cut short when the engine goes down.
    async fn around<T: Send>(
        &self,
        _op: &'static str,
        call: impl Future<Output = Result<T, EngineError>> + Send,
    ) -> Result<T, EngineError> {
        let down = self.link.went_down();
        tokio::select! {
            biased;
            r = call => r,
            () = down => Err(self.link.down_error()),
        }
    }

    /// The engine's own id for one we handed out (names pass through).
    fn id_in<'a>(&self, id: &'a str) -> &'a str {
        match &self.prefix {
            Some(p) => id
                .strip_prefix(p.as_str())
                .and_then(|rest| rest.strip_prefix('.'))
                .unwrap_or(id),
            None => id,
        }
    }

    fn id_out(&self, raw: String) -> String {
        with_engine(self.prefix.as_deref(), &raw)
    }

    /// Streams end with an error as soon as the engine is marked down.
    fn stream_out<T: Send + 'static>(
        &self,
        stream: BoxStream<'static, Result<T, EngineError>>,
    ) -> BoxStream<'static, Result<T, EngineError>> {
        self.link.cut(stream)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sandbox_common::ids::{is_container_id, is_session_id};

    use super::*;
    use crate::ContainerSpec;
    use crate::fake::FakeEngine;

    fn scoped(prefix: Option<&str>) -> (Arc<Link>, ScopedEngine, Arc<FakeEngine>) {
        let fake = Arc::new(FakeEngine::default());
        let link = Link::new("b");
        link.connect(fake.clone());
        link.set_up(true);
        let engine = ScopedEngine::new(link.clone(), prefix);
        (link, engine, fake)
    }

    fn spec() -> ContainerSpec {
        ContainerSpec {
            pids_limit: 10,
            ..ContainerSpec::for_tests("img")
        }
    }

    #[tokio::test]
    async fn ids_carry_the_prefix_out_and_lose_it_in() {
        let (_, engine, fake) = scoped(Some("b"));
        let id = engine.create(&spec()).await.expect("ok");
        let raw = id.strip_prefix("b.").expect("prefixed");
        assert!(is_session_id(&id));
        // The engine itself knows the raw id only.
        fake.inspect(raw).await.expect("ok");
        assert_eq!(engine.inspect(&id).await.expect("ok").id, id);
        engine.start(&id).await.expect("ok");
        let listed = engine.list(&[]).await.expect("ok");
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].id, id);
        engine.remove(&id).await.expect("ok");
        assert!(matches!(
            fake.inspect(raw).await,
            Err(EngineError::NotFound)
        ));
    }

    #[tokio::test]
    async fn the_default_engine_keeps_raw_ids() {
        let (_, engine, _) = scoped(None);
        let id = engine.create(&spec()).await.expect("ok");
        assert!(is_container_id(&id));
        assert_eq!(engine.inspect(&id).await.expect("ok").id, id);
    }

    #[tokio::test]
    async fn a_down_engine_fails_at_once() {
        let (link, engine, _) = scoped(Some("b"));
        link.set_up(false);
        let err = engine.ping().await.expect_err("an error");
        assert!(err.to_string().contains("engine b is down"), "{err}");
        let never = ScopedEngine::new(Link::new("c"), Some("c"));
        assert!(never.list(&[]).await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn calls_and_streams_in_flight_are_cut_when_the_engine_goes_down() {
        let (link, engine, fake) = scoped(Some("b"));
        // A call that would not return before the hold is dropped.
        let _hold = fake.hold("list");
        let flip = {
            let link = link.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(3)).await;
                link.set_up(false);
            })
        };
        let err = engine.list(&[]).await.expect_err("an error");
        assert!(err.to_string().contains("down"), "{err}");
        flip.await.expect("ok");

        // A stream that never ends.
        link.set_up(true);
        let stream: BoxStream<'static, Result<u8, EngineError>> =
            futures::stream::pending().boxed();
        let mut cut = link.cut(stream);
        link.set_up(false);
        assert!(matches!(
            cut.next().await,
            Some(Err(EngineError::Unavailable(_)))
        ));
        assert!(cut.next().await.is_none());
    }
}
