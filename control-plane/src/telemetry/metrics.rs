//! Prometheus metrics on [`prometheus_client`], served in the Prometheus text format 0.0.4.
//!
//! Why that crate: it is the official Prometheus Rust client, with typed families over label
//! sets, OpenMetrics and Prometheus text encoders, no global registry and no macros. The
//! `metrics` ecosystem would need a recorder, an exporter crate and a process-wide global.
//!
//! The wrappers here keep the call sites' words (`.with(&[..])`, `.add(n)`, `.observe(Duration)`)
//! and fix each family's label names in one place: a call site passes values only, and the wrong
//! number of values does not compile. Label values are bounded by construction (route templates,
//! fs op names, error codes, engine call names, configured warm-pool images), never ids or user
//! input, so the number of series stays small.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, prometheus_text};
use prometheus_client::metrics::{MetricType, TypedMetric, counter, family, gauge, histogram};
use prometheus_client::registry::Registry;

/// The `Content-Type` of [`Metrics::render`]'s output.
pub use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Every metric name starts with it (`daiv_sandbox_…`).
const PREFIX: &str = "daiv_sandbox";

/// Upper bounds (seconds) shared by every histogram: from a cache-hot fs op (~5 ms) to a long
/// command or a large seed (minutes).
const BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

// === impl Counter, Gauge, Histogram ===

/// A monotonic count. Clones share the cell.
#[derive(Clone, Debug, Default)]
pub struct Counter(counter::Counter<u64, AtomicU64>);

impl Counter {
    pub fn inc(&self) {
        self.0.inc();
    }

    pub fn add(&self, n: u64) {
        self.0.inc_by(n);
    }

    pub fn get(&self) -> u64 {
        self.0.get()
    }
}

/// A value that goes up and down, as last set. Clones share the cell.
#[derive(Clone, Debug, Default)]
pub struct Gauge(gauge::Gauge<u64, AtomicU64>);

impl Gauge {
    pub fn set(&self, n: u64) {
        self.0.set(n);
    }

    pub fn get(&self) -> u64 {
        self.0.get()
    }

    pub fn inc(&self) {
        self.0.inc();
    }

    pub fn dec(&self) {
        self.0.dec();
    }
}

/// Durations over [`BUCKETS`], in seconds. Clones share the cell.
#[derive(Clone, Debug)]
pub struct Histogram(histogram::Histogram);

impl Default for Histogram {
    fn default() -> Self {
        Self(histogram::Histogram::new(BUCKETS))
    }
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        self.0.observe(d.as_secs_f64());
    }
}

/// The wrappers encode as the client type they wrap (so they can sit in a registry or a family).
macro_rules! encode_as_inner {
    ($($wrapper:ty => $kind:expr),* $(,)?) => {$(
        impl TypedMetric for $wrapper {
            const TYPE: MetricType = $kind;
        }

        impl EncodeMetric for $wrapper {
            fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
                self.0.encode(encoder)
            }

            fn metric_type(&self) -> MetricType {
                $kind
            }
        }
    )*};
}

encode_as_inner!(
    Counter => MetricType::Counter,
    Gauge => MetricType::Gauge,
    Histogram => MetricType::Histogram,
);

// === impl Family ===

/// One series per combination of values of `N` fixed labels, created on first use.
pub struct Family<M, const N: usize> {
    names: [&'static str; N],
    series: family::Family<[(&'static str, String); N], M>,
}

impl<M: Clone + Default, const N: usize> Family<M, N> {
    fn new(names: [&'static str; N]) -> Self {
        Self {
            names,
            series: family::Family::default(),
        }
    }

    /// The series for `values` (one per label name, in order): a handle sharing its cell. The
    /// family's lock is held for the lookup only, never across an await.
    pub fn with(&self, values: &[&str; N]) -> M {
        let labels = std::array::from_fn(|i| (self.names[i], values[i].to_owned()));
        self.series.get_or_create_owned(&labels)
    }
}

// === impl Metrics ===

/// Every metric the control plane exports. Held by the composition (`AppState`); the engine wrapper, the
/// request middleware, the handlers and the reaper count into it.
pub struct Metrics {
    /// Holds a clone of every metric below (clones share their cells), in page order.
    registry: Registry,
    pub http_requests: Family<Histogram, 3>,
    pub sessions_created: Counter,
    pub sessions_closed: Family<Counter, 1>,
    pub sessions_reaped: Counter,
    pub reaper_failures: Counter,
    pub commands: Counter,
    pub command_batches: Histogram,
    pub fs_ops: Family<Histogram, 2>,
    pub seeds: Family<Histogram, 1>,
    pub seed_bytes: Counter,
    pub lock_waits: Histogram,
    pub lock_busy: Counter,
    pub engine_calls: Family<Histogram, 1>,
    pub engine_errors: Family<Counter, 2>,
    pub processes_started: Counter,
    pub processes_killed: Counter,
    /// Running background processes per session as last listed (list route, reaper). Session
    /// ids stay here: only their sum, [`Self::processes_live`], is exported.
    processes_by_session: Mutex<HashMap<String, u64>>,
    processes_live: Gauge,
    pub streamed_runs: Counter,
    /// Ready warm-pool members per (image, kind), as this replica last counted them.
    pub pool_size: Family<Gauge, 2>,
    pub pool_claims: Family<Counter, 2>,
    /// Requests a pool was configured for that went cold, by (image, kind, reason).
    pub pool_misses: Family<Counter, 3>,
    pub pool_refill_failures: Family<Counter, 2>,
    /// Time to build one member, by kind.
    pub pool_refill: Family<Histogram, 1>,
    /// Requests holding a slot of an admission class (see [`crate::admission`]).
    pub admission_in_flight: Family<Gauge, 1>,
    /// Requests queued for a slot of an admission class.
    pub admission_waiting: Family<Gauge, 1>,
    /// Requests answered 429 by admission, by class and reason (`queue_full`, `timeout`).
    pub admission_refused: Family<Counter, 2>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut m = Self {
            registry: Registry::with_prefix(PREFIX),
            http_requests: Family::new(["method", "route", "status"]),
            sessions_created: Counter::default(),
            sessions_closed: Family::new(["mode"]),
            sessions_reaped: Counter::default(),
            reaper_failures: Counter::default(),
            commands: Counter::default(),
            command_batches: Histogram::default(),
            fs_ops: Family::new(["op", "code"]),
            seeds: Family::new(["outcome"]),
            seed_bytes: Counter::default(),
            lock_waits: Histogram::default(),
            lock_busy: Counter::default(),
            engine_calls: Family::new(["op"]),
            engine_errors: Family::new(["op", "kind"]),
            processes_started: Counter::default(),
            processes_killed: Counter::default(),
            processes_by_session: Mutex::default(),
            processes_live: Gauge::default(),
            streamed_runs: Counter::default(),
            pool_size: Family::new(["image", "kind"]),
            pool_claims: Family::new(["image", "kind"]),
            pool_misses: Family::new(["image", "kind", "reason"]),
            pool_refill_failures: Family::new(["image", "kind"]),
            pool_refill: Family::new(["kind"]),
            admission_in_flight: Family::new(["class"]),
            admission_waiting: Family::new(["class"]),
            admission_refused: Family::new(["class", "reason"]),
        };
        // Names go in without the prefix, and counters without `_total`: the encoder adds both.
        // It also ends each help text with a period.
        let r = &mut m.registry;
        r.register(
            "http_request_duration_seconds",
            "HTTP requests by method, route template and status",
            m.http_requests.series.clone(),
        );
        r.register(
            "sessions_created",
            "Sessions created",
            m.sessions_created.clone(),
        );
        r.register(
            "sessions_closed",
            "Sessions closed through the API, by mode (stop or remove)",
            m.sessions_closed.series.clone(),
        );
        r.register(
            "sessions_reaped",
            "Sessions removed by the reaper (expired, over the stopped cap, idle)",
            m.sessions_reaped.clone(),
        );
        r.register(
            "reaper_failures",
            "Reaper sweeps or removals that failed",
            m.reaper_failures.clone(),
        );
        r.register(
            "commands",
            "Commands run (each entry of a run request that was executed)",
            m.commands.clone(),
        );
        r.register(
            "command_batch_duration_seconds",
            "Duration of run requests (all their commands), successful or not",
            m.command_batches.clone(),
        );
        r.register(
            "fs_op_duration_seconds",
            "fs operations by op and outcome code (ok, an fs error code, or api_error)",
            m.fs_ops.series.clone(),
        );
        r.register(
            "seed_duration_seconds",
            "Seed requests by outcome",
            m.seeds.series.clone(),
        );
        r.register(
            "seed_bytes",
            "Decompressed archive bytes written by successful seeds",
            m.seed_bytes.clone(),
        );
        r.register(
            "session_lock_wait_seconds",
            "Time spent acquiring a session lock, acquired or not",
            m.lock_waits.clone(),
        );
        r.register(
            "session_lock_busy",
            "Requests answered 409 because the session lock stayed held",
            m.lock_busy.clone(),
        );
        r.register(
            "engine_call_duration_seconds",
            "Container engine (Docker API) calls by operation",
            m.engine_calls.series.clone(),
        );
        r.register(
            "engine_errors",
            "Container engine (Docker API) errors by operation and kind",
            m.engine_errors.series.clone(),
        );
        r.register(
            "streamed_runs",
            "Run requests answered as an NDJSON stream",
            m.streamed_runs.clone(),
        );
        r.register(
            "processes_started",
            "Background processes started",
            m.processes_started.clone(),
        );
        r.register(
            "processes_killed",
            "Background processes killed through the API",
            m.processes_killed.clone(),
        );
        r.register(
            "processes_live",
            "Running background processes over all sessions, as last listed (list route, reaper)",
            m.processes_live.clone(),
        );
        r.register(
            "pool_size",
            "Ready warm-pool members by image and kind, as this replica last counted them",
            m.pool_size.series.clone(),
        );
        r.register(
            "pool_claims",
            "Sessions handed out from the warm pool, by image and kind",
            m.pool_claims.series.clone(),
        );
        r.register(
            "pool_misses",
            "Requests for a pooled image and kind created cold, by reason (empty, limits, apply)",
            m.pool_misses.series.clone(),
        );
        r.register(
            "pool_refill_failures",
            "Warm-pool members that could not be built, or pools that could not be checked",
            m.pool_refill_failures.series.clone(),
        );
        r.register(
            "pool_refill_duration_seconds",
            "Time to build one warm-pool member (create, start and, for egress, the triad)",
            m.pool_refill.series.clone(),
        );
        r.register(
            "admission_in_flight",
            "Requests holding a slot, by admission class (create, seed, fs, fs_session)",
            m.admission_in_flight.series.clone(),
        );
        r.register(
            "admission_waiting",
            "Requests queued for a slot, by admission class",
            m.admission_waiting.series.clone(),
        );
        r.register(
            "admission_refused",
            "Requests answered 429 for want of a slot, by admission class and reason (queue_full, timeout)",
            m.admission_refused.series.clone(),
        );
        m
    }
}

/// Sessions by state, read from the engine at scrape time (`None` when it did not answer).
#[derive(Debug, Default, Clone, Copy)]
pub struct SessionGauge {
    pub running: u64,
    pub stopped: u64,
}

impl Metrics {
    /// Records how many background processes of a session run (`None`: the session is gone).
    pub fn observe_processes(&self, session_id: &str, running: Option<u64>) {
        let mut m = self
            .processes_by_session
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
        self.processes_live.set(m.values().sum());
    }

    /// Forgets the running processes of sessions not in `live` (removed by anyone).
    pub fn retain_processes(&self, live: &std::collections::HashSet<String>) {
        let mut m = self
            .processes_by_session
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        m.retain(|id, _| live.contains(id));
        self.processes_live.set(m.values().sum());
    }

    /// The Prometheus text exposition (format 0.0.4, [`CONTENT_TYPE`]). Families without a
    /// series yet are left out.
    pub fn render(&self, sessions: Option<SessionGauge>) -> String {
        let mut out = String::with_capacity(8 * 1024);
        encode(&mut out, &self.registry);
        if let Some(g) = sessions {
            // This scrape's engine count, in a registry of its own: a shared gauge would be
            // cleared and set by concurrent scrapes, and could be read half-way.
            let mut scrape = Registry::with_prefix(PREFIX);
            let by_state = family::Family::<[(&str, &str); 1], Gauge>::default();
            by_state
                .get_or_create(&[("state", "running")])
                .set(g.running);
            by_state
                .get_or_create(&[("state", "stopped")])
                .set(g.stopped);
            scrape.register(
                "sessions",
                "Sessions (sandbox containers) by state, as the engine lists them now",
                by_state,
            );
            encode(&mut out, &scrape);
        }
        out
    }
}

/// Appends `registry`'s page to `out`. Writing to a `String` cannot fail; should the encoder
/// still refuse, the scrape gets what was written and the log says why.
fn encode(out: &mut String, registry: &Registry) {
    if let Err(error) = prometheus_text::encode(out, registry) {
        tracing::warn!(%error, "cannot encode metrics");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_cumulative_buckets_and_escaped_labels() {
        let m = Metrics::default();
        m.fs_ops
            .with(&["read", "not_found"])
            .observe(Duration::from_millis(20));
        m.fs_ops
            .with(&["read", "not_found"])
            .observe(Duration::from_secs(2));
        m.engine_errors.with(&["inspect", "a\"b\\c\nd"]).inc();
        m.lock_waits.observe(Duration::from_millis(3));
        let text = m.render(Some(SessionGauge {
            running: 2,
            stopped: 1,
        }));
        let fs = "daiv_sandbox_fs_op_duration_seconds";
        for (le, n) in [("0.01", 0), ("0.025", 1), ("1", 1), ("2.5", 2), ("+Inf", 2)] {
            let line = format!("{fs}_bucket{{op=\"read\",code=\"not_found\",le=\"{le}\"}} {n}\n");
            assert!(text.contains(&line), "no {line:?} in:\n{text}");
        }
        assert!(text.contains(&format!(
            "{fs}_sum{{op=\"read\",code=\"not_found\"}} 2.02\n"
        )));
        assert!(text.contains(&format!("{fs}_count{{op=\"read\",code=\"not_found\"}} 2\n")));
        assert!(
            text.contains(
                "daiv_sandbox_engine_errors_total{op=\"inspect\",kind=\"a\\\"b\\\\c\\nd\"} 1\n"
            ),
            "{text}"
        );
        assert!(text.contains("daiv_sandbox_sessions{state=\"running\"} 2\n"));
        assert!(text.contains("daiv_sandbox_sessions{state=\"stopped\"} 1\n"));
        assert!(text.contains("daiv_sandbox_session_lock_wait_seconds_bucket{le=\"0.005\"} 1\n"));
        assert!(text.contains("daiv_sandbox_session_lock_wait_seconds_count 1\n"));
    }

    #[test]
    fn counters_count_and_keep_their_total_names() {
        let m = Metrics::default();
        m.sessions_created.inc();
        m.sessions_created.add(2);
        m.sessions_closed.with(&["remove"]).inc();
        m.sessions_closed.with(&["remove"]).inc();
        assert_eq!(m.sessions_created.get(), 3);
        let text = m.render(None);
        assert!(
            text.contains(
                "# HELP daiv_sandbox_sessions_created_total Sessions created.\n\
                 # TYPE daiv_sandbox_sessions_created_total counter\n\
                 daiv_sandbox_sessions_created_total 3\n"
            ),
            "{text}"
        );
        assert!(text.contains("daiv_sandbox_sessions_closed_total{mode=\"remove\"} 2\n"));
        assert!(!text.contains("_total_total"), "{text}");
        assert!(
            !text.contains("daiv_sandbox_sessions "),
            "no engine count, no gauge"
        );
    }

    #[test]
    fn gauges_follow_the_last_value() {
        let m = Metrics::default();
        let size = m.pool_size.with(&["img:1", "isolated"]);
        size.set(3);
        size.set(size.get().saturating_sub(1));
        m.observe_processes("s1", Some(2));
        m.observe_processes("s2", Some(5));
        m.observe_processes("s2", Some(1));
        m.observe_processes("s1", None);
        let text = m.render(None);
        assert!(
            text.contains("# TYPE daiv_sandbox_pool_size gauge\n"),
            "{text}"
        );
        assert!(text.contains("daiv_sandbox_pool_size{image=\"img:1\",kind=\"isolated\"} 2\n"));
        assert!(text.contains("# TYPE daiv_sandbox_processes_live gauge\n"));
        assert!(text.contains("daiv_sandbox_processes_live 1\n"), "{text}");
        assert!(!text.contains("s2"), "session ids are not label values");
    }

    /// The wire contract: every family's name and type, as dashboards and alerts query them.
    #[test]
    fn every_family_keeps_its_name_and_type() {
        let m = Metrics::default();
        let d = Duration::from_millis(1);
        m.http_requests.with(&["GET", "/metrics", "200"]).observe(d);
        m.sessions_closed.with(&["stop"]).inc();
        m.fs_ops.with(&["read", "ok"]).observe(d);
        m.seeds.with(&["ok"]).observe(d);
        m.engine_calls.with(&["list"]).observe(d);
        m.engine_errors.with(&["list", "unavailable"]).inc();
        m.pool_size.with(&["img:1", "isolated"]).set(1);
        m.pool_claims.with(&["img:1", "isolated"]).inc();
        m.pool_misses.with(&["img:1", "isolated", "empty"]).inc();
        m.pool_refill_failures.with(&["img:1", "isolated"]).inc();
        m.pool_refill.with(&["isolated"]).observe(d);
        m.admission_in_flight.with(&["fs"]).inc();
        m.admission_waiting.with(&["fs"]).inc();
        m.admission_refused.with(&["fs", "timeout"]).inc();
        let text = m.render(Some(SessionGauge::default()));
        let types: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE daiv_sandbox_"))
            .collect();
        assert_eq!(
            types,
            [
                "http_request_duration_seconds histogram",
                "sessions_created_total counter",
                "sessions_closed_total counter",
                "sessions_reaped_total counter",
                "reaper_failures_total counter",
                "commands_total counter",
                "command_batch_duration_seconds histogram",
                "fs_op_duration_seconds histogram",
                "seed_duration_seconds histogram",
                "seed_bytes_total counter",
                "session_lock_wait_seconds histogram",
                "session_lock_busy_total counter",
                "engine_call_duration_seconds histogram",
                "engine_errors_total counter",
                "streamed_runs_total counter",
                "processes_started_total counter",
                "processes_killed_total counter",
                "processes_live gauge",
                "pool_size gauge",
                "pool_claims_total counter",
                "pool_misses_total counter",
                "pool_refill_failures_total counter",
                "pool_refill_duration_seconds histogram",
                "admission_in_flight gauge",
                "admission_waiting gauge",
                "admission_refused_total counter",
                "sessions gauge",
            ]
        );
        // One HELP per TYPE, each a sentence.
        let helps: Vec<&str> = text.lines().filter(|l| l.starts_with("# HELP ")).collect();
        assert_eq!(helps.len(), types.len());
        assert!(helps.iter().all(|h| h.ends_with('.')), "{helps:?}");
    }
}
