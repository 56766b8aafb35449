//! Deadlines as they come due. Every record written with a deadline arms it here; the reaper's
//! deadline watch ends each session within a second of its deadline (E2B's `timeout` is to the
//! second, and a sweep comes every `REAPER_INTERVAL_SECONDS`). The sweep stays the backstop and
//! arms what this replica did not write (another replica's records, a restart's).
//!
//! An entry is only a wake-up: the watch re-reads the record under the session's lock, so a
//! deadline moved later (or cleared) since it was armed does nothing.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use tokio::sync::Notify;

/// The deadlines this replica knows, soonest first, one per session (the latest armed: a
/// deadline moved replaces the one before, so a client moving it again and again holds one
/// entry).
#[derive(Default)]
pub struct Deadlines {
    due: Mutex<Due>,
    bell: Notify,
}

#[derive(Default)]
struct Due {
    by_time: BTreeSet<(i64, String)>,
    by_id: HashMap<String, i64>,
}

impl Deadlines {
    /// Session `id` is due at `at` (Unix seconds).
    pub fn arm(&self, id: &str, at: i64) {
        let mut due = self.due.lock().unwrap_or_else(|e| e.into_inner());
        match due.by_id.insert(id.to_string(), at) {
            Some(was) if was == at => return,
            Some(was) => {
                due.by_time.remove(&(was, id.to_string()));
            }
            None => {}
        }
        due.by_time.insert((at, id.to_string()));
        drop(due);
        self.bell.notify_waiters();
    }

    /// The sessions due at `now`, taken out.
    pub fn take_due(&self, now: i64) -> Vec<String> {
        let mut due = self.due.lock().unwrap_or_else(|e| e.into_inner());
        let later = due
            .by_time
            .split_off(&(now.saturating_add(1), String::new()));
        let taken: Vec<String> = std::mem::replace(&mut due.by_time, later)
            .into_iter()
            .map(|(_, id)| id)
            .collect();
        for id in &taken {
            due.by_id.remove(id);
        }
        taken
    }

    /// The soonest deadline armed.
    pub fn next(&self) -> Option<i64> {
        self.due
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_time
            .first()
            .map(|(at, _)| *at)
    }

    /// Until the soonest deadline (from `now_ms`, Unix milliseconds), or one sooner is armed.
    pub async fn wait(&self, now_ms: i64) {
        // Listening before the soonest is read: one armed in between still wakes this wait.
        let bell = self.bell.notified();
        tokio::pin!(bell);
        bell.as_mut().enable();
        match self.next().map(|at| at.saturating_mul(1000)) {
            Some(at) if at <= now_ms => {}
            Some(at) => {
                let ms = u64::try_from(at - now_ms).unwrap_or(0);
                let _ = tokio::time::timeout(std::time::Duration::from_millis(ms), bell).await;
            }
            None => bell.await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_sessions_come_out_soonest_first_and_once() {
        let d = Deadlines::default();
        d.arm("b", 20);
        d.arm("a", 10);
        d.arm("a", 10);
        d.arm("c", 30);
        assert_eq!(d.next(), Some(10));
        assert!(d.take_due(9).is_empty());
        assert_eq!(d.take_due(20), ["a", "b"]);
        assert!(d.take_due(20).is_empty());
        assert_eq!(d.next(), Some(30));
        // A deadline moved replaces the one before: one entry per session.
        d.arm("c", 40);
        d.arm("c", 35);
        assert!(d.take_due(34).is_empty());
        assert_eq!(d.take_due(100), ["c"]);
        assert_eq!(d.next(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_at_the_deadline_or_when_a_sooner_one_is_armed() {
        let d = std::sync::Arc::new(Deadlines::default());
        d.arm("a", 100);
        let started = tokio::time::Instant::now();
        d.wait(95_000).await;
        assert_eq!(started.elapsed().as_secs(), 5);
        let waiting = tokio::spawn({
            let d = d.clone();
            async move { d.wait(0).await }
        });
        tokio::task::yield_now().await;
        d.arm("b", 1);
        tokio::time::timeout(std::time::Duration::from_secs(1), waiting)
            .await
            .expect("woken by the sooner deadline")
            .expect("joined");
    }
}
