//! Long-running work: streamed runs and background processes (`sessions::run`, `processes`).

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, PoisonError};

use prometheus_client::registry::Registry;

use super::{Counter, Gauge, add};

pub struct ProcessMetrics {
    /// Run requests answered as an NDJSON stream. Here rather than with the commands because the
    /// page has always listed it just before the processes.
    pub streamed_runs: Counter,
    pub started: Counter,
    /// Killed through the API.
    pub killed: Counter,
    /// The sum of `by_session`, set by [`Self::observe`] and [`Self::retain`] only.
    live: Gauge,
    /// Running background processes per session as last listed (list route, reaper). Session ids
    /// stay here: only their sum, `live`, is exported.
    by_session: Mutex<HashMap<String, u64>>,
}

impl ProcessMetrics {
    pub(super) fn new(r: &mut Registry) -> Self {
        Self {
            streamed_runs: add(
                r,
                "streamed_runs",
                "Run requests answered as an NDJSON stream",
                Counter::default(),
            ),
            started: add(
                r,
                "processes_started",
                "Background processes started",
                Counter::default(),
            ),
            killed: add(
                r,
                "processes_killed",
                "Background processes killed through the API",
                Counter::default(),
            ),
            live: add(
                r,
                "processes_live",
                "Running background processes over all sessions, as last listed (list route, reaper)",
                Gauge::default(),
            ),
            by_session: Mutex::default(),
        }
    }

    /// Records how many background processes of a session run (`None`: the session is gone).
    pub fn observe(&self, session_id: &str, running: Option<u64>) {
        let mut m = self
            .by_session
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match running {
            Some(n) if n > 0 => {
                m.insert(session_id.to_string(), n);
            }
            _ => {
                m.remove(session_id);
            }
        }
        // Set under the lock, so concurrent updates land in the order they changed the map.
        self.live.set(m.values().sum());
    }

    /// Forgets the running processes of sessions not in `live` (removed by anyone).
    pub fn retain(&self, live: &HashSet<String>) {
        let mut m = self
            .by_session
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        m.retain(|id, _| live.contains(id));
        self.live.set(m.values().sum());
    }
}
