//! The live policy: an `ArcSwap<Evaluator>` reloaded when the file changes.
//!
//! Writers replace the file by renaming a complete temporary file over it (the control plane does),
//! or by extracting an archive (docker `put_archive`), so the directory is watched, not the file.
//! notify delivers the change; a poll of the file's metadata backs it up on filesystems where
//! inotify misses events (some bind mounts, overlay from outside). Missing, unreadable or invalid
//! means deny-all, never "no policy, so allow", and never "keep the last good one": a policy the
//! operator tried to tighten must not silently stay loose.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use shared_policy::Evaluator;
use tokio::sync::mpsc;
use tracing::{error, info, warn};

/// Events within this window are coalesced into one reload (an editor's write + rename, or a
/// tar extraction's create + write + chmod + utime).
pub const DEBOUNCE: Duration = Duration::from_millis(10);
/// The metadata poll: the backstop when notify says nothing.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// The current policy and where it comes from.
pub struct PolicyStore {
    path: PathBuf,
    current: ArcSwap<Evaluator>,
    /// What the file looked like at the last reload, to tell whether a poll sees a change.
    stamp: std::sync::Mutex<Option<Stamp>>,
    /// Reloads so far (tests check that reading the file does not itself trigger reloads).
    reloads: AtomicU64,
}

/// Identity of one version of the file. `ctime` changes on every write or rename even when a
/// writer forces `mtime` (the reference's writer set mtime 0 every time, so mtime alone missed
/// every refresh).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

// === impl PolicyStore ===

impl PolicyStore {
    /// Loads the file once (deny-all if it is not usable yet).
    pub fn open(path: impl Into<PathBuf>) -> Arc<Self> {
        let path = path.into();
        let store = Arc::new(Self {
            current: ArcSwap::from_pointee(Evaluator::deny_all()),
            stamp: std::sync::Mutex::new(None),
            reloads: AtomicU64::new(0),
            path,
        });
        store.reload();
        store
    }

    /// A store fixed to one evaluator, with no file behind it (tests, `policy explain`).
    pub fn fixed(evaluator: Evaluator) -> Arc<Self> {
        Arc::new(Self {
            path: PathBuf::new(),
            current: ArcSwap::from_pointee(evaluator),
            stamp: std::sync::Mutex::new(None),
            reloads: AtomicU64::new(0),
        })
    }

    /// The policy to decide with: one `Arc` per decision, never a guard held across `.await`.
    pub fn current(&self) -> Arc<Evaluator> {
        self.current.load_full()
    }

    /// The file this store reads.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many times the file has been (re)loaded.
    pub fn reload_count(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }

    /// Re-reads the file now and swaps the result in.
    pub fn reload(&self) {
        self.reloads.fetch_add(1, Ordering::Relaxed);
        let stamp = stamp(&self.path);
        let next = load(&self.path);
        self.current.store(next);
        if let Ok(mut s) = self.stamp.lock() {
            *s = stamp;
        }
    }

    /// Reloads only if the file's identity changed since the last reload.
    fn reload_if_changed(&self) {
        let now = stamp(&self.path);
        let changed = self.stamp.lock().map(|s| *s != now).unwrap_or(true);
        if changed {
            self.reload();
        }
    }
}

/// Reads and validates `path`. Any failure is logged and yields deny-all (fail closed).
pub fn load(path: &Path) -> Arc<Evaluator> {
    let parsed = std::fs::read(path)
        .map_err(|e| e.to_string())
        .and_then(|bytes| Evaluator::from_json(&bytes).map_err(|e| e.to_string()));
    match parsed {
        Ok(ev) => {
            info!(path = %path.display(), "policy loaded");
            Arc::new(ev)
        }
        Err(error) => {
            error!(path = %path.display(), %error, "policy unusable; denying all egress");
            Arc::new(Evaluator::deny_all())
        }
    }
}

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(Stamp {
        ino: m.ino(),
        len: m.len(),
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
    })
}

/// Whether an event kind can mean the file's content changed.
fn is_change(kind: &notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode};
    match kind {
        notify::EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        notify::EventKind::Access(_) => false,
        _ => true,
    }
}

/// Keeps the store current until dropped: a notify watcher on the file's directory, and a poll.
pub struct Reloader {
    _watcher: Option<RecommendedWatcher>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Reloader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts watching. Must be called inside a tokio runtime.
pub fn watch(store: Arc<PolicyStore>) -> Reloader {
    // Capacity 1: a burst of events collapses into one pending reload.
    let (tx, mut rx) = mpsc::channel::<()>(1);
    let file_name = store.path.file_name().map(|n| n.to_owned());
    let watcher = {
        let tx = tx.clone();
        let handler = move |res: notify::Result<notify::Event>| {
            // Only changes to our file (or events we cannot attribute) matter. Opens and reads
            // are ignored: our own read of the file produces them, and reacting to them would
            // reload in a loop. A close after writing is a change (an in-place write finished).
            let relevant = match &res {
                Ok(ev) => {
                    is_change(&ev.kind)
                        && (ev.paths.is_empty()
                            || ev
                                .paths
                                .iter()
                                .any(|p| p.file_name() == file_name.as_deref()))
                }
                Err(_) => true,
            };
            if relevant {
                let _ = tx.try_send(());
            }
        };
        let dir = store
            .path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        match notify::recommended_watcher(handler) {
            Ok(mut w) => match w.watch(dir, RecursiveMode::NonRecursive) {
                Ok(()) => Some(w),
                Err(error) => {
                    warn!(dir = %dir.display(), %error, "cannot watch policy directory; polling only");
                    None
                }
            },
            Err(error) => {
                warn!(%error, "no file watcher; polling only");
                None
            }
        }
    };
    let task = tokio::spawn(async move {
        let mut poll = tokio::time::interval(POLL_INTERVAL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                got = rx.recv() => {
                    if got.is_none() { break; }
                    tokio::time::sleep(DEBOUNCE).await;
                    while rx.try_recv().is_ok() {}
                    store.reload();
                }
                _ = poll.tick() => store.reload_if_changed(),
            }
        }
    });
    drop(tx);
    Reloader {
        _watcher: watcher,
        task,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use shared_policy::Host;

    proptest! {
        /// Whatever the parser rejects, the gateway's load path turns into deny-all.
        #[test]
        fn rejected_input_loads_as_deny_all(
            doc in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..128),
                "[{}\\[\\]\",: a-z0-9*]{0,64}".prop_map(String::into_bytes),
                (any::<bool>(), "[ a-z*.{]{0,8}", proptest::collection::vec("[a-z* ]{0,4}", 0..2))
                    .prop_map(|(allow, host, methods)| serde_json::json!({
                        "policy": {"default": if allow { "allow" } else { "deny" },
                                   "rules": [{"host": host, "methods": methods, "inject": "missing"}]}
                    }).to_string().into_bytes()),
            ]
        ) {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("config.json");
            std::fs::write(&path, &doc).expect("write");
            let loaded = load(&path);
            if Evaluator::from_json(&doc).is_err() {
                prop_assert!(loaded.is_deny_all());
                let host = Host::parse("a.test").expect("host");
                prop_assert!(!loaded.decide_connect(&host).allowed);
                prop_assert!(!loaded.decide_request(&host, "GET").allowed);
            } else {
                prop_assert!(!loaded.is_deny_all());
            }
        }
    }

    /// Reading the file produces inotify access events in the watched directory; they must not
    /// trigger another reload (that would loop forever, reloading every few milliseconds).
    #[tokio::test]
    async fn reloads_once_per_write_and_not_on_its_own_reads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.json");
        std::fs::write(&path, r#"{"policy": {"default": "allow"}}"#).expect("write");
        let store = PolicyStore::open(&path);
        let _reloader = watch(store.clone());
        tokio::time::sleep(Duration::from_millis(100)).await;
        let tmp = dir.path().join("config.tmp");
        std::fs::write(&tmp, r#"{"policy": {"default": "deny"}}"#).expect("write");
        std::fs::rename(&tmp, &path).expect("rename");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while store
            .current()
            .decide_connect(&Host::parse("a.test").expect("host"))
            .allowed
        {
            assert!(std::time::Instant::now() < deadline, "reload not seen");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let settled = store.reload_count();
        tokio::time::sleep(POLL_INTERVAL * 3).await;
        assert_eq!(store.reload_count(), settled, "no reloads without a change");
        assert!(settled <= 4, "one write caused {settled} reloads");
    }

    #[test]
    fn missing_file_is_deny_all() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = PolicyStore::open(dir.path().join("absent.json"));
        assert!(store.current().is_deny_all());
    }
}
