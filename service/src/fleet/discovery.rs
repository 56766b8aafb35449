//! The engines file, watched: [`EnginesFile`] says whether the file now gives another list (a bad
//! one is refused and the last good list kept), [`Watch`] says when to look.
//!
//! Writers replace the file whole (a temporary file renamed over it, or Kubernetes' swap of the
//! `..data` symlink of a mounted ConfigMap), so the file's directory is watched with `notify`,
//! as the egress gateway watches its policy, and a burst of events is read once after a short
//! debounce. A slow poll backs the watcher up on filesystems where inotify misses changes (some
//! network and FUSE mounts), and stands in for it, faster, when no watcher can be set.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

use crate::config::{EngineSpec, parse_engines};
use crate::telemetry::metrics::Metrics;

/// Events within this window are read as one change (a write then a rename; a symlink swap).
pub const DEBOUNCE: Duration = Duration::from_millis(100);
/// The poll beside a working watcher: what the watcher misses is seen within this.
pub const BACKSTOP_POLL: Duration = Duration::from_secs(10);
/// The poll when no watcher could be set.
pub const POLL: Duration = Duration::from_secs(2);

/// The engines file and the content last looked at.
pub(super) struct EnginesFile {
    path: PathBuf,
    /// The content last applied or refused (`None` after it could not be read), so each content
    /// is applied, or refused, once.
    seen: Mutex<Option<Vec<u8>>>,
    metrics: Arc<Metrics>,
}

impl EnginesFile {
    /// The file at `path`, whose list (as read at start-up) the fleet already has.
    pub fn new(path: PathBuf, metrics: Arc<Metrics>) -> Self {
        metrics.fleet.file_valid.set(1);
        Self {
            seen: Mutex::new(std::fs::read(&path).ok()),
            path,
            metrics,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The list the file gives now, when its content changed since the last look and checks
    /// out. A bad file (unreadable, unparsable, failing a check) is refused: logged
    /// (`engines file refused`) and counted once per content, and the last good list stays.
    pub fn changed(&self) -> Option<Vec<EngineSpec>> {
        let Ok(text) = std::fs::read(&self.path) else {
            // A file being replaced may be missing for a moment; a missing one is a bad one.
            self.refuse(None, "the engines file cannot be read");
            return None;
        };
        {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            if seen.as_deref() == Some(&text[..]) {
                return None;
            }
            *seen = Some(text.clone());
        }
        match parse_engines(&text) {
            Ok(specs) => {
                self.metrics.fleet.file_valid.set(1);
                Some(specs)
            }
            Err(why) => {
                self.refuse(Some(text), &why);
                None
            }
        }
    }

    fn refuse(&self, text: Option<Vec<u8>>, why: &str) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        // Said once per bad content (or once per spell of an unreadable file), not every look.
        if text.is_some() || seen.is_some() {
            self.metrics.fleet.file_errors.inc();
            self.metrics.fleet.file_valid.set(0);
            tracing::error!(file = %self.path.display(), error = why, "engines file refused; keeping the last good list");
        }
        *seen = text;
    }
}

/// When to look at the file again: a debounced `notify` event on it, or the poll. Holds the
/// watcher; dropping it stops watching.
pub(super) struct Watch {
    _watcher: Option<RecommendedWatcher>,
    events: mpsc::Receiver<()>,
    poll: tokio::time::Interval,
}

impl Watch {
    /// Watches the directory of `path` (in a tokio runtime). The first [`Watch::changed`]
    /// returns at once.
    pub fn start(path: &Path) -> Self {
        // Capacity 1: a burst of events is one pending look.
        let (tx, events) = mpsc::channel(1);
        let watcher = watcher(path, tx);
        let every = if watcher.is_some() {
            BACKSTOP_POLL
        } else {
            POLL
        };
        let mut poll = tokio::time::interval(every);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self {
            _watcher: watcher,
            events,
            poll,
        }
    }

    /// Resolves when the file may have changed.
    pub async fn changed(&mut self) {
        tokio::select! {
            Some(()) = self.events.recv() => {
                tokio::time::sleep(DEBOUNCE).await;
                while self.events.try_recv().is_ok() {}
            }
            _ = self.poll.tick() => {}
        }
    }
}

/// A watcher of `path`'s directory that sends on `tx` when an event may concern the file; `None`
/// (logged) when none can be set.
fn watcher(path: &Path, tx: mpsc::Sender<()>) -> Option<RecommendedWatcher> {
    let name = path.file_name().map(|n| n.to_owned());
    let handler = move |res: notify::Result<notify::Event>| {
        let relevant = match &res {
            Ok(ev) => {
                is_change(&ev.kind)
                    && (ev.paths.is_empty()
                        || ev.paths.iter().any(|p| {
                            let file = p.file_name();
                            // `..data` and its temporary twin: a ConfigMap's symlink swap.
                            file == name.as_deref()
                                || file.is_some_and(|f| f.as_encoded_bytes().starts_with(b".."))
                        }))
            }
            // An event lost (a queue overflow) may have been ours.
            Err(_) => true,
        };
        if relevant {
            let _ = tx.try_send(());
        }
    };
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    match notify::recommended_watcher(handler) {
        Ok(mut w) => match w.watch(dir, RecursiveMode::NonRecursive) {
            Ok(()) => Some(w),
            Err(error) => {
                tracing::warn!(dir = %dir.display(), %error, "cannot watch the engines file's directory; polling it");
                None
            }
        },
        Err(error) => {
            tracing::warn!(%error, "no file watcher; polling the engines file");
            None
        }
    }
}

/// Whether an event kind can mean the file changed: our own reads (opens, closes without a
/// write) cannot, and reacting to them would read the file in a loop.
fn is_change(kind: &notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode};
    match kind {
        notify::EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        notify::EventKind::Access(_) => false,
        _ => true,
    }
}
