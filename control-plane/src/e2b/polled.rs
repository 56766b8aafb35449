//! The buffers of envd's polled watchers (`CreateWatcher` / `GetWatcherEvents` /
//! `RemoveWatcher`, what the SDK's synchronous `watch_dir` uses), kept in this process (a replica
//! answers for the watchers it made). A buffer that fills between two polls fails the next poll
//! rather than losing events silently; a watch that ended (the sandbox gone, the directory
//! removed) fails it with the reason. `envd/watchers.rs` fills them.
//!
//! Their memory is bounded: each buffer holds at most [`MAX_BUFFER_BYTES`] of events (as the JSON
//! the poll answers), a sandbox has at most [`MAX_PER_SANDBOX`] watchers and the replica
//! [`MAX_WATCHERS`], a watcher nobody polled for [`IDLE`] is removed, and a killed sandbox's go
//! with it. At most `MAX_WATCHERS × MAX_BUFFER_BYTES` (64 MiB) of events, whatever clients do.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde_json::Value;
use serde_json::value::RawValue;

use super::connect::{Code, RpcError};

/// Watchers kept at once in this replica (ended and idle ones are dropped first to make room).
pub const MAX_WATCHERS: usize = 256;
/// Watchers of one sandbox at once.
pub const MAX_PER_SANDBOX: usize = 16;
/// Bytes of events kept between two polls of one watcher: their JSON and a slot each.
pub const MAX_BUFFER_BYTES: usize = 256 * 1024;
/// What one kept event costs beside its JSON (its box and its slot in the queue).
const EVENT_OVERHEAD: usize = 32;
/// A watcher not polled for this long is removed (its watch stopped, its events dropped): the
/// SDK polls while its caller watches, so one left behind does not hold memory for good.
pub const IDLE: Duration = Duration::from_secs(60);

/// Longest a poll waits for events to catch up (see [`Watchers::settle`]).
pub const SETTLE_MAX: Duration = Duration::from_millis(100);
/// The quiet that ends a poll's wait once it has events.
pub const SETTLE_QUIET: Duration = Duration::from_millis(10);

/// What a watcher's task has read and not yet been polled.
pub struct Buffer {
    events: VecDeque<Box<RawValue>>,
    bytes: usize,
    overflowed: bool,
    ended: Option<RpcError>,
    /// The last poll, or the watcher's creation.
    polled: Instant,
    /// Rung at every event pushed (see [`Watchers::settle`]).
    pushed: Arc<tokio::sync::Notify>,
}

impl Default for Buffer {
    fn default() -> Self {
        Self {
            events: VecDeque::new(),
            bytes: 0,
            overflowed: false,
            ended: None,
            polled: Instant::now(),
            pushed: Arc::default(),
        }
    }
}

impl Buffer {
    /// Keeps `event` for the next poll; past [`MAX_BUFFER_BYTES`] it is dropped and the next poll
    /// fails (events were lost).
    pub fn push(&mut self, event: &Value) {
        if self.overflowed {
            return;
        }
        let Ok(raw) = serde_json::value::to_raw_value(event) else {
            return;
        };
        let cost = raw.get().len() + EVENT_OVERHEAD;
        if self.bytes + cost > MAX_BUFFER_BYTES {
            self.overflowed = true;
            self.events.clear();
            self.bytes = 0;
            return;
        }
        self.bytes += cost;
        self.events.push_back(raw);
        self.pushed.notify_waiters();
    }

    /// The watch lost events before they reached this buffer (the native watch overflowed).
    pub fn overflow(&mut self) {
        self.overflowed = true;
        self.events.clear();
        self.bytes = 0;
    }

    /// The watch ended, for `why`.
    pub fn end(&mut self, why: RpcError) {
        self.ended = Some(why);
    }

    /// The bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

struct Watcher {
    sandbox: String,
    buffer: Arc<Mutex<Buffer>>,
    task: tokio::task::AbortHandle,
}

impl Watcher {
    fn stop(&self) {
        self.task.abort();
    }
}

#[derive(Default)]
pub struct Watchers {
    inner: Mutex<HashMap<String, Watcher>>,
    /// Whether the task that removes idle watchers runs.
    sweeping: AtomicBool,
}

impl Drop for Watchers {
    fn drop(&mut self) {
        if let Ok(map) = self.inner.get_mut() {
            for w in map.values() {
                w.stop();
            }
        }
    }
}

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Watchers {
    /// Keeps a new watcher of `sandbox` (its buffer, filled by `task`); its id. Past a cap, the
    /// ended and idle watchers go first; then it is refused.
    pub fn insert(
        self: &Arc<Self>,
        sandbox: &str,
        buffer: Arc<Mutex<Buffer>>,
        task: tokio::task::AbortHandle,
    ) -> Result<String, RpcError> {
        self.ensure_sweeper();
        let watcher_id = {
            use rand::Rng;
            let bytes: [u8; 16] = rand::rng().random();
            bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
        };
        let mut map = lock(&self.inner);
        let of_sandbox =
            |map: &HashMap<String, Watcher>| map.values().filter(|w| w.sandbox == sandbox).count();
        if map.len() >= MAX_WATCHERS || of_sandbox(&map) >= MAX_PER_SANDBOX {
            let now = Instant::now();
            map.retain(|_, w| {
                let b = lock(&w.buffer);
                let keep = b.ended.is_none() && !idle(&b, now);
                drop(b);
                if !keep {
                    w.stop();
                }
                keep
            });
        }
        if of_sandbox(&map) >= MAX_PER_SANDBOX {
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!(
                    "this sandbox has {MAX_PER_SANDBOX} watchers, the most it may have: remove \
                     some first"
                ),
            ));
        }
        if map.len() >= MAX_WATCHERS {
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!("{MAX_WATCHERS} watchers are open: remove some first"),
            ));
        }
        map.insert(
            watcher_id.clone(),
            Watcher {
                sandbox: sandbox.to_string(),
                buffer,
                task,
            },
        );
        Ok(watcher_id)
    }

    fn with<R>(
        &self,
        sandbox: &str,
        watcher: &str,
        f: impl FnOnce(&Watcher) -> R,
    ) -> Result<R, RpcError> {
        let map = lock(&self.inner);
        match map.get(watcher) {
            Some(w) if w.sandbox == sandbox => Ok(f(w)),
            _ => Err(RpcError::new(
                Code::NotFound,
                format!("watcher {watcher:?} not found"),
            )),
        }
    }

    /// Until the watcher's events have caught up with the file system, as far as a poll can
    /// tell: a change the caller just made is in the kernel's queue when its call returns, but
    /// reaches this buffer a moment later (through the helper and the channel). So a poll that
    /// finds nothing waits up to [`SETTLE_MAX`] for a first event, and one that has some waits
    /// until [`SETTLE_QUIET`] passes without another (a write's create and write come together).
    pub async fn settle(&self, sandbox: &str, watcher: &str) -> Result<(), RpcError> {
        let buffer = self.with(sandbox, watcher, |w| w.buffer.clone())?;
        let pushed = lock(&buffer).pushed.clone();
        let until = tokio::time::Instant::now() + SETTLE_MAX;
        loop {
            let notified = pushed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let held = {
                let b = lock(&buffer);
                (!b.overflowed && b.ended.is_none()).then_some(b.events.len())
            };
            let Some(held) = held else { return Ok(()) };
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            let wait = if held == 0 {
                left
            } else {
                left.min(SETTLE_QUIET)
            };
            if wait.is_zero() || tokio::time::timeout(wait, notified).await.is_err() {
                return Ok(());
            }
        }
    }

    /// The events since the last poll.
    pub fn drain(&self, sandbox: &str, watcher: &str) -> Result<Vec<Box<RawValue>>, RpcError> {
        self.with(sandbox, watcher, |w| {
            let mut b = lock(&w.buffer);
            b.polled = Instant::now();
            if b.overflowed {
                b.overflowed = false;
                return Err(RpcError::new(
                    Code::ResourceExhausted,
                    format!(
                        "more events than the watcher keeps between two polls ({} KiB): some \
                         were lost",
                        MAX_BUFFER_BYTES / 1024
                    ),
                ));
            }
            if b.events.is_empty()
                && let Some(err) = &b.ended
            {
                return Err(err.clone());
            }
            b.bytes = 0;
            Ok(b.events.drain(..).collect())
        })?
    }

    pub fn remove(&self, sandbox: &str, watcher: &str) -> Result<(), RpcError> {
        self.with(sandbox, watcher, Watcher::stop)?;
        lock(&self.inner).remove(watcher);
        Ok(())
    }

    /// Every watcher of `sandbox` stopped and dropped (it was killed).
    pub fn remove_sandbox(&self, sandbox: &str) {
        lock(&self.inner).retain(|_, w| {
            let keep = w.sandbox != sandbox;
            if !keep {
                w.stop();
            }
            keep
        });
    }

    /// Drops the watchers not polled for [`IDLE`] as of `now`; how many went.
    pub fn sweep(&self, now: Instant) -> usize {
        let mut map = lock(&self.inner);
        let before = map.len();
        map.retain(|_, w| {
            let keep = !idle(&lock(&w.buffer), now);
            if !keep {
                w.stop();
            }
            keep
        });
        before - map.len()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.inner).len()
    }

    /// Starts the task that sweeps idle watchers, once; it ends with the last handle on `self`.
    fn ensure_sweeper(self: &Arc<Self>) {
        if self.sweeping.swap(true, Ordering::Relaxed) {
            return;
        }
        let weak: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(IDLE / 4);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(watchers) = weak.upgrade() else {
                    return;
                };
                let gone = watchers.sweep(Instant::now());
                if gone > 0 {
                    tracing::debug!(watchers = gone, "e2b: idle polled watchers removed");
                }
            }
        });
    }
}

/// Not polled for [`IDLE`] as of `now`.
fn idle(b: &Buffer, now: Instant) -> bool {
    now.saturating_duration_since(b.polled) >= IDLE
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(i: usize) -> Value {
        json!({"name": format!("file-{i}"), "type": "EVENT_TYPE_CREATE",
               "entry": {"path": format!("/home/user/dir/file-{i}"), "size": "0"}})
    }

    fn idle_task() -> tokio::task::AbortHandle {
        tokio::spawn(std::future::pending::<()>()).abort_handle()
    }

    #[test]
    fn a_buffer_holds_a_bounded_number_of_bytes_then_reports_the_loss() {
        let mut b = Buffer::default();
        let mut kept = 0;
        for i in 0..100_000 {
            b.push(&event(i));
            assert!(b.bytes() <= MAX_BUFFER_BYTES);
            if b.overflowed {
                break;
            }
            kept += 1;
        }
        assert!(b.overflowed, "the buffer never filled");
        assert!(kept > 100, "only {kept} events fit");
        // Nothing more is kept until a poll has reported the loss.
        b.push(&event(0));
        assert_eq!(b.bytes(), 0);
    }

    #[tokio::test]
    async fn an_overflow_fails_the_next_poll_then_events_flow_again() {
        let w = Arc::new(Watchers::default());
        let buffer = Arc::new(Mutex::new(Buffer::default()));
        let id = w
            .insert("s", buffer.clone(), idle_task())
            .expect("a watcher");
        for i in 0..100_000 {
            lock(&buffer).push(&event(i));
        }
        let err = w.drain("s", &id).expect_err("the loss is reported");
        assert_eq!(err.code, Code::ResourceExhausted);
        lock(&buffer).push(&event(1));
        assert_eq!(w.drain("s", &id).expect("events").len(), 1);
        assert!(w.drain("s", &id).expect("none").is_empty());
    }

    /// A poll right after a change waits for its events to arrive (they come a moment after the
    /// caller's write returns), and for the ones that come with them; an empty one gives up.
    #[tokio::test(start_paused = true)]
    async fn a_poll_waits_for_events_that_are_on_their_way() {
        let w = Arc::new(Watchers::default());
        let buffer = Arc::new(Mutex::new(Buffer::default()));
        let id = w
            .insert("s", buffer.clone(), idle_task())
            .expect("a watcher");
        let late = buffer.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            lock(&late).push(&event(1));
            tokio::time::sleep(Duration::from_millis(5)).await;
            lock(&late).push(&event(2));
        });
        let started = tokio::time::Instant::now();
        w.settle("s", &id).await.expect("settled");
        assert_eq!(w.drain("s", &id).expect("events").len(), 2);
        assert!(started.elapsed() < SETTLE_MAX, "{:?}", started.elapsed());
        let started = tokio::time::Instant::now();
        w.settle("s", &id).await.expect("settled");
        assert_eq!(started.elapsed(), SETTLE_MAX);
        assert!(w.drain("s", &id).expect("none").is_empty());
        assert_eq!(
            w.settle("s", "nope")
                .await
                .expect_err("no such watcher")
                .code,
            Code::NotFound
        );
    }

    #[tokio::test]
    async fn a_sandbox_has_a_bounded_number_of_watchers() {
        let w = Arc::new(Watchers::default());
        for _ in 0..MAX_PER_SANDBOX {
            w.insert("s", Arc::default(), idle_task())
                .expect("a watcher");
        }
        let err = w
            .insert("s", Arc::default(), idle_task())
            .expect_err("over the cap");
        assert_eq!(err.code, Code::ResourceExhausted);
        assert!(err.message.contains("this sandbox"), "{}", err.message);
        // Another sandbox is not held back by this one.
        w.insert("t", Arc::default(), idle_task())
            .expect("another sandbox's watcher");
        // An ended watcher makes room.
        let ended = Arc::new(Mutex::new(Buffer::default()));
        w.remove_sandbox("s");
        let first = w.insert("s", ended.clone(), idle_task()).expect("room");
        lock(&ended).end(RpcError::new(Code::NotFound, "gone"));
        for _ in 1..MAX_PER_SANDBOX {
            w.insert("s", Arc::default(), idle_task())
                .expect("a watcher");
        }
        w.insert("s", Arc::default(), idle_task())
            .expect("the ended one made room");
        assert_eq!(
            w.drain("s", &first).expect_err("dropped").code,
            Code::NotFound
        );
    }

    #[tokio::test]
    async fn idle_watchers_and_a_killed_sandboxs_are_dropped_with_their_tasks() {
        let w = Arc::new(Watchers::default());
        let task = tokio::spawn(std::future::pending::<()>());
        let polled = w
            .insert("s", Arc::default(), task.abort_handle())
            .expect("a watcher");
        let unpolled = w
            .insert("s", Arc::default(), idle_task())
            .expect("a watcher");
        let other = w
            .insert("t", Arc::default(), idle_task())
            .expect("a watcher");
        assert_eq!(w.sweep(Instant::now()), 0);
        // Polled now: it is idle only IDLE after this poll.
        w.drain("s", &polled).expect("polled");
        let later = Instant::now() + IDLE;
        assert_eq!(w.sweep(later), 3);
        assert_eq!(w.len(), 0);
        assert!(task.await.expect_err("stopped").is_cancelled());
        for (s, id) in [("s", &polled), ("s", &unpolled), ("t", &other)] {
            assert_eq!(w.drain(s, id).expect_err("gone").code, Code::NotFound);
        }

        let a = w.insert("s", Arc::default(), idle_task()).expect("a");
        let b = w.insert("t", Arc::default(), idle_task()).expect("b");
        w.remove_sandbox("s");
        assert_eq!(w.drain("s", &a).expect_err("gone").code, Code::NotFound);
        assert!(w.drain("t", &b).is_ok());
    }
}
