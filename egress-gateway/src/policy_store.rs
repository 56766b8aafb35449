//! The live policy: an `ArcSwap<Evaluator>` reloaded when the file is replaced.
//!
//! Writers replace the file by renaming a complete temporary file over it, or (when they cannot
//! rename inside the container, as with docker `put_archive`) write the staging file beside it
//! ([`shared_policy::sidecar::POLICY_STAGING_FILE`]), which this store installs once it is
//! complete: it copies the content to a temporary file of its own and renames that over the
//! policy file (the staged file stays where it is, so the writer's own `chown`/`chmod`/`utime`
//! by path, right after the content, never finds it gone). So the directory is watched. notify
//! delivers the change; a poll of the file's metadata backs it up on filesystems where inotify
//! misses events (some bind mounts, overlay from outside).
//!
//! Only a *replacement* (a new inode) of a valid policy is reloaded: an in-place write could be
//! read half-done, so it is ignored (logged, and counted as a reload failure) until the file is
//! replaced. While the policy is unusable (deny-all), any change is re-read, so a fix always
//! takes effect. Missing, unreadable or invalid means deny-all, never "no policy, so allow", and
//! never "keep the last good one": a policy the operator tried to tighten must not silently stay
//! loose.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use shared_policy::Evaluator;
use tokio::sync::{mpsc, watch};
use tracing::{debug, error, info, warn};

/// Events within this window are coalesced into one reload (an editor's write + rename, or a
/// tar extraction's create + write + chmod + utime).
pub const DEBOUNCE: Duration = Duration::from_millis(10);
/// The metadata poll: the backstop when notify says nothing.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// The current policy and where it comes from.
pub struct PolicyStore {
    path: PathBuf,
    /// Where writers that cannot rename put a new policy.
    staging: PathBuf,
    /// Reloads that ended in deny-all, and in-place writes that were ignored.
    failures: AtomicU64,
    /// The in-place change last warned about (one warning per change, not per poll).
    ignored: std::sync::Mutex<Option<Stamp>>,
    /// The staged file last installed (inode and content), so it is installed once.
    promoted: std::sync::Mutex<Option<(u64, Vec<u8>)>>,
    current: ArcSwap<Evaluator>,
    /// What the file looked like at the last reload, to tell whether a poll sees a change.
    stamp: std::sync::Mutex<Option<Stamp>>,
    /// Reloads so far (tests check that reading the file does not itself trigger reloads).
    reloads: AtomicU64,
    /// Bumped after every reload: blind tunnels, decided once at CONNECT, re-check on it.
    changes: watch::Sender<u64>,
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
            staging: shared_policy::sidecar::staging_path_for(&path),
            failures: AtomicU64::new(0),
            ignored: std::sync::Mutex::new(None),
            promoted: std::sync::Mutex::new(None),
            current: ArcSwap::from_pointee(Evaluator::deny_all()),
            stamp: std::sync::Mutex::new(None),
            reloads: AtomicU64::new(0),
            changes: watch::Sender::new(0),
            path,
        });
        store.reload();
        store
    }

    /// A store fixed to one evaluator, with no file behind it (tests, `policy explain`).
    pub fn fixed(evaluator: Evaluator) -> Arc<Self> {
        Arc::new(Self {
            staging: PathBuf::new(),
            failures: AtomicU64::new(0),
            ignored: std::sync::Mutex::new(None),
            promoted: std::sync::Mutex::new(None),
            path: PathBuf::new(),
            current: ArcSwap::from_pointee(evaluator),
            stamp: std::sync::Mutex::new(None),
            reloads: AtomicU64::new(0),
            changes: watch::Sender::new(0),
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

    /// Notified after each reload (the value is the reload count). A receiver sees only reloads
    /// that happen after it subscribed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// How many times the file has been (re)loaded.
    pub fn reload_count(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }

    /// Reloads that ended in deny-all (missing or invalid file) or were refused (an in-place
    /// write), since start.
    pub fn failure_count(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// The staging file beside the policy file.
    pub fn staging_path(&self) -> &Path {
        &self.staging
    }

    /// Re-reads the file now and swaps the result in.
    pub fn reload(&self) {
        let count = self.reloads.fetch_add(1, Ordering::Relaxed) + 1;
        // Metadata and content from the same open file, so the stamp is the loaded version's.
        let (stamp, next) = match std::fs::File::open(&self.path) {
            Ok(mut f) => {
                let stamp = f.metadata().ok().map(|m| Stamp::of(&m));
                let mut bytes = Vec::new();
                let read = std::io::Read::read_to_end(&mut f, &mut bytes).map(|_| bytes);
                (stamp, evaluate(&self.path, read))
            }
            Err(e) => (None, evaluate(&self.path, Err(e))),
        };
        if next.is_deny_all() {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        self.current.store(next);
        if let Ok(mut s) = self.stamp.lock() {
            *s = stamp;
        }
        self.changes.send_replace(count);
    }

    /// Promotes a staged file, then reloads if the policy file was replaced (or, while the
    /// policy is unusable, changed at all). Returns when to look at a staged file again, if it
    /// was not ready.
    pub fn sync(&self) -> Option<Duration> {
        let retry = self.promote_staged();
        self.reload_if_replaced();
        retry
    }

    /// Installs a complete staging file: its content is copied to a temporary file beside the
    /// policy file, which is renamed over it. Each staged file (inode and content) is installed
    /// once. Returns when to look again if it was not complete (or not readable yet: an
    /// extraction creates it as root and hands it to our uid right after).
    fn promote_staged(&self) -> Option<Duration> {
        use std::os::unix::fs::MetadataExt;
        if self.staging.as_os_str().is_empty() {
            return None;
        }
        let mut file = std::fs::File::open(&self.staging).ok()?;
        let ino = file.metadata().ok()?.ino();
        let mut bytes = Vec::new();
        if std::io::Read::read_to_end(&mut file, &mut bytes).is_err() {
            return Some(POLL_INTERVAL);
        }
        let seen = self
            .promoted
            .lock()
            .map(|p| p.as_ref().is_some_and(|(i, b)| *i == ino && *b == bytes))
            .unwrap_or(false);
        if seen {
            return None;
        }
        // A strict prefix of a JSON document never parses: a parse means the write is complete.
        if serde_json::from_slice::<serde_json::Value>(&bytes).is_err() {
            debug!(path = %self.staging.display(), "staged policy not complete yet");
            return Some(POLL_INTERVAL);
        }
        let tmp = self.staging.with_extension("installing");
        let installed =
            std::fs::write(&tmp, &bytes).and_then(|()| std::fs::rename(&tmp, &self.path));
        match installed {
            Ok(()) => {
                info!(path = %self.path.display(), "staged policy installed");
                if let Ok(mut p) = self.promoted.lock() {
                    *p = Some((ino, bytes));
                }
            }
            Err(error) => {
                let _ = std::fs::remove_file(&tmp);
                error!(path = %self.staging.display(), %error, "cannot install the staged policy");
            }
        }
        None
    }

    /// Reloads if the file is another file than the one loaded (renamed over, created, removed);
    /// an in-place change of a usable policy is refused.
    fn reload_if_replaced(&self) {
        let now = stamp(&self.path);
        let Ok(last) = self.stamp.lock().map(|s| s.clone()) else {
            return self.reload();
        };
        if last == now {
            return;
        }
        let replaced = last.as_ref().map(|s| s.ino) != now.as_ref().map(|s| s.ino);
        if replaced || self.current().is_deny_all() {
            return self.reload();
        }
        let first_warning = self
            .ignored
            .lock()
            .map(|mut seen| std::mem::replace(&mut *seen, now.clone()) != now)
            .unwrap_or(false);
        if first_warning {
            self.failures.fetch_add(1, Ordering::Relaxed);
            error!(
                path = %self.path.display(),
                "policy file was written in place, not replaced; not reloaded (a reader could see it half-written): write a temporary file beside it and rename it over the policy"
            );
        }
    }
}

fn meta_ctime(m: &std::fs::Metadata) -> (i64, i64) {
    use std::os::unix::fs::MetadataExt;
    (m.ctime(), m.ctime_nsec())
}

/// Reads and validates `path`. Any failure is logged and yields deny-all (fail closed).
pub fn load(path: &Path) -> Arc<Evaluator> {
    evaluate(path, std::fs::read(path))
}

fn evaluate(path: &Path, read: std::io::Result<Vec<u8>>) -> Arc<Evaluator> {
    let parsed = read
        .map_err(|e| e.to_string())
        .and_then(|bytes| Evaluator::from_json(&bytes).map_err(|e| e.to_string()));
    match parsed {
        Ok(ev) => {
            info!(path = %path.display(), policy_version = ev.version().unwrap_or(""), shadow = ev.is_shadow(), "policy loaded");
            Arc::new(ev)
        }
        Err(error) => {
            error!(path = %path.display(), %error, "policy unusable; denying all egress");
            Arc::new(Evaluator::deny_all())
        }
    }
}

fn stamp(path: &Path) -> Option<Stamp> {
    std::fs::metadata(path).ok().map(|m| Stamp::of(&m))
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: meta_ctime(m),
        }
    }
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
    let staging_name = store.staging.file_name().map(|n| n.to_owned());
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
                            || ev.paths.iter().any(|p| {
                                p.file_name() == file_name.as_deref()
                                    || p.file_name() == staging_name.as_deref()
                            }))
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
        // A staged file that was not settled yet is looked at again this soon.
        let mut retry: Option<Duration> = None;
        loop {
            let again = async {
                match retry {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                got = rx.recv() => {
                    if got.is_none() { break; }
                    tokio::time::sleep(DEBOUNCE).await;
                    while rx.try_recv().is_ok() {}
                    retry = store.sync();
                }
                () = again => retry = store.sync(),
                _ = poll.tick() => retry = store.sync(),
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
