//! Prometheus metrics on [`prometheus_client`], served in the Prometheus text format 0.0.4.
//!
//! Why that crate: it is the official Prometheus Rust client, with typed families over label
//! sets, OpenMetrics and Prometheus text encoders, no global registry and no macros. The
//! `metrics` ecosystem would need a recorder, an exporter crate and a process-wide global.
//!
//! Each family is keyed by a typed label set (`#[derive(EncodeLabelSet)]`), as in the gateway: the
//! label names live in one struct, and a call site that leaves one out does not compile. Label
//! values are bounded by construction (route templates, fs op names, error codes, engine call
//! names, configured warm-pool images), never ids or user input, so the number of series stays
//! small.
//!
//! Families are grouped by area, each group a struct of its own that registers itself
//! ([`EngineMetrics::register`]): the engine's group lives with the engine crate's metered
//! decorator, and [`Metrics`] holds it. The control plane's other families are to follow that
//! pattern (HTTP, sessions, pool, admission, ...); until then they are fields of [`Metrics`].

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, prometheus_text};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::{counter, gauge, histogram};
use prometheus_client::registry::Registry;

pub use crate::engine::metered::{Buckets, EngineErrorLabels, EngineMetrics, OpLabels};

/// The `Content-Type` of [`Metrics::render`]'s output.
pub use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Every metric name starts with it (`daiv_sandbox_…`).
const PREFIX: &str = "daiv_sandbox";

/// Upper bounds (seconds) shared by every histogram: from a cache-hot fs op (~5 ms) to a long
/// command or a large seed (minutes).
const BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

// === metric types and label sets ===

/// A monotonic count. Clones share the cell.
pub type Counter = counter::Counter<u64, AtomicU64>;
/// A value that goes up and down, as last set. Clones share the cell.
pub type Gauge = gauge::Gauge<u64, AtomicU64>;
/// Durations in seconds over [`BUCKETS`]. Clones share the cell.
pub type Histogram = histogram::Histogram;
/// One histogram over [`BUCKETS`] per label set.
pub type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

fn histograms<L: Clone + std::hash::Hash + Eq>() -> Histograms<L> {
    Family::new_with_constructor(histogram)
}

/// Records `d` in seconds, the unit of every histogram here.
pub fn observe_duration(h: &Histogram, d: Duration) {
    h.observe(d.as_secs_f64());
}

/// `http_request_duration_seconds`: the route is the matched template (bounded), never the path.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: String,
    pub route: String,
    pub status: u16,
}

/// `sessions_closed_total`: `stop` or `remove`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabels {
    pub mode: &'static str,
}

/// `fs_op_duration_seconds`: the op and its outcome (`ok`, an fs error code, or `api_error`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FsLabels {
    pub op: &'static str,
    pub code: String,
}

/// `seed_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

/// An engine of the fleet.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EngineLabels {
    pub engine: String,
}

/// A warm pool: a configured image and the kind (`isolated`, `egress`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub image: String,
    pub kind: &'static str,
}

/// `pool_misses_total`: a pool and why a request went cold (`empty`, `limits`, `apply`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolMissLabels {
    pub image: String,
    pub kind: &'static str,
    pub reason: &'static str,
}

/// `pool_refill_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

/// An admission class (`create`, `seed`, `fs`, `fs_session`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabels {
    pub class: &'static str,
}

/// `admission_refused_total`: a class and why (`queue_full`, `timeout`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    pub class: &'static str,
    pub reason: &'static str,
}

/// `runtime_sound`: the sandboxes' OCI runtime (`runsc`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuntimeLabels {
    pub runtime: &'static str,
}

/// `sessions` (at scrape time).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

// === impl Metrics ===

/// Every metric the control plane exports. Held by the composition (`AppState`); the engine wrapper, the
/// request middleware, the handlers and the reaper count into it.
pub struct Metrics {
    /// Holds a clone of every metric below (clones share their cells), in page order.
    registry: Registry,
    pub http_requests: Histograms<HttpLabels>,
    pub sessions_created: Counter,
    pub sessions_closed: Family<ModeLabels, Counter>,
    pub sessions_reaped: Counter,
    pub reaper_failures: Counter,
    pub commands: Counter,
    pub command_batches: Histogram,
    pub fs_ops: Histograms<FsLabels>,
    pub seeds: Histograms<OutcomeLabels>,
    pub seed_bytes: Counter,
    pub lock_waits: Histogram,
    pub lock_busy: Counter,
    /// The engine's group: its calls and errors (see `crate::engine::metered`).
    pub engine: EngineMetrics,
    /// 1 while an engine of the fleet answers, 0 while it is down.
    pub engine_up: Family<EngineLabels, Gauge>,
    /// 1 while an engine is drained (no new sessions).
    pub engine_draining: Family<EngineLabels, Gauge>,
    /// Sessions (warm-pool members included) an engine holds, as last counted.
    pub engine_sessions: Family<EngineLabels, Gauge>,
    /// Creates refused because no engine could take a session.
    pub placements_refused: Counter,
    /// 1 while the engines file last read was valid, 0 while a bad one is ignored.
    pub engines_file_valid: Gauge,
    /// Changes of the engines file that were refused (the last good list kept).
    pub engines_file_errors: Counter,
    pub processes_started: Counter,
    pub processes_killed: Counter,
    /// Running background processes per session as last listed (list route, reaper). Session
    /// ids stay here: only their sum, [`Self::processes_live`], is exported.
    processes_by_session: Mutex<HashMap<String, u64>>,
    /// Ready members per pool and engine (a fleet's engines each count their own); only their
    /// sum per pool, [`Self::pool_size`], is exported.
    pool_by_engine: Mutex<HashMap<(PoolLabels, String), u64>>,
    processes_live: Gauge,
    pub streamed_runs: Counter,
    /// Ready warm-pool members per (image, kind), as this replica last counted them.
    pub pool_size: Family<PoolLabels, Gauge>,
    pub pool_claims: Family<PoolLabels, Counter>,
    /// Requests a pool was configured for that went cold, by (image, kind, reason).
    pub pool_misses: Family<PoolMissLabels, Counter>,
    pub pool_refill_failures: Family<PoolLabels, Counter>,
    /// Time to build one member, by kind.
    pub pool_refill: Histograms<KindLabels>,
    /// Requests holding a slot of an admission class (see [`crate::admission`]).
    pub admission_in_flight: Family<ClassLabels, Gauge>,
    /// Requests queued for a slot of an admission class.
    pub admission_waiting: Family<ClassLabels, Gauge>,
    /// Requests answered 429 by admission, by class and reason (`queue_full`, `timeout`).
    pub admission_refused: Family<RefusedLabels, Counter>,
    pub snapshots_taken: Counter,
    /// Sessions made by forks.
    pub forks: Counter,
    pub pauses: Counter,
    /// Snapshots of this deployment and the bytes they hold, as the reaper last counted them.
    pub snapshots_held: Gauge,
    pub snapshot_bytes: Gauge,
    /// 1 when the runtime's start-up probe found `ls` and `stat` working, 0 when they failed;
    /// absent while not known (see `telemetry::runtime_probe`).
    pub runtime_sound: Family<RuntimeLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut m = Self {
            registry: Registry::with_prefix(PREFIX),
            http_requests: histograms(),
            sessions_created: Counter::default(),
            sessions_closed: Family::default(),
            sessions_reaped: Counter::default(),
            reaper_failures: Counter::default(),
            commands: Counter::default(),
            command_batches: histogram(),
            fs_ops: histograms(),
            seeds: histograms(),
            seed_bytes: Counter::default(),
            lock_waits: histogram(),
            lock_busy: Counter::default(),
            engine: EngineMetrics::new(Buckets(&BUCKETS)),
            engine_up: Family::default(),
            engine_draining: Family::default(),
            engine_sessions: Family::default(),
            placements_refused: Counter::default(),
            engines_file_valid: Gauge::default(),
            engines_file_errors: Counter::default(),
            processes_started: Counter::default(),
            processes_killed: Counter::default(),
            processes_by_session: Mutex::default(),
            pool_by_engine: Mutex::default(),
            processes_live: Gauge::default(),
            streamed_runs: Counter::default(),
            pool_size: Family::default(),
            pool_claims: Family::default(),
            pool_misses: Family::default(),
            pool_refill_failures: Family::default(),
            pool_refill: histograms(),
            admission_in_flight: Family::default(),
            admission_waiting: Family::default(),
            admission_refused: Family::default(),
            snapshots_taken: Counter::default(),
            forks: Counter::default(),
            pauses: Counter::default(),
            snapshots_held: Gauge::default(),
            snapshot_bytes: Gauge::default(),
            runtime_sound: Family::default(),
        };
        // Names go in without the prefix, and counters without `_total`: the encoder adds both.
        // It also ends each help text with a period.
        let r = &mut m.registry;
        r.register(
            "http_request_duration_seconds",
            "HTTP requests by method, route template and status",
            m.http_requests.clone(),
        );
        r.register(
            "sessions_created",
            "Sessions created",
            m.sessions_created.clone(),
        );
        r.register(
            "sessions_closed",
            "Sessions closed through the API, by mode (stop or remove)",
            m.sessions_closed.clone(),
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
            m.fs_ops.clone(),
        );
        r.register(
            "seed_duration_seconds",
            "Seed requests by outcome",
            m.seeds.clone(),
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
        m.engine.register(r);
        r.register(
            "engine_up",
            "Whether an engine of the fleet answers (1) or is down (0)",
            m.engine_up.clone(),
        );
        r.register(
            "engine_draining",
            "Whether an engine of the fleet is drained: no new sessions (1)",
            m.engine_draining.clone(),
        );
        r.register(
            "engine_sessions",
            "Sessions (warm-pool members included) an engine holds, as last counted",
            m.engine_sessions.clone(),
        );
        r.register(
            "placements_refused",
            "Session creates refused because no engine could take one",
            m.placements_refused.clone(),
        );
        r.register(
            "engines_file_valid",
            "Whether the engines file last read was valid (1) or is ignored for the last good one (0)",
            m.engines_file_valid.clone(),
        );
        r.register(
            "engines_file_errors",
            "Changes of the engines file refused as invalid",
            m.engines_file_errors.clone(),
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
            "snapshots_taken",
            "Snapshots taken through the API",
            m.snapshots_taken.clone(),
        );
        r.register("forks", "Sessions made by forks", m.forks.clone());
        r.register("pauses", "Sessions paused", m.pauses.clone());
        r.register(
            "snapshots_held",
            "Snapshots of this deployment, as the reaper last counted them",
            m.snapshots_held.clone(),
        );
        r.register(
            "snapshot_bytes",
            "Bytes held by this deployment's snapshots, as the reaper last counted them",
            m.snapshot_bytes.clone(),
        );
        r.register(
            "runtime_sound",
            "Whether the start-up probe found ls and stat working under the sandboxes' runtime (1) or failing (0)",
            m.runtime_sound.clone(),
        );
        r.register(
            "pool_size",
            "Ready warm-pool members by image and kind, as this replica last counted them",
            m.pool_size.clone(),
        );
        r.register(
            "pool_claims",
            "Sessions handed out from the warm pool, by image and kind",
            m.pool_claims.clone(),
        );
        r.register(
            "pool_misses",
            "Requests for a pooled image and kind created cold, by reason (empty, limits, apply)",
            m.pool_misses.clone(),
        );
        r.register(
            "pool_refill_failures",
            "Warm-pool members that could not be built, or pools that could not be checked",
            m.pool_refill_failures.clone(),
        );
        r.register(
            "pool_refill_duration_seconds",
            "Time to build one warm-pool member (create, start and, for egress, the triad)",
            m.pool_refill.clone(),
        );
        r.register(
            "admission_in_flight",
            "Requests holding a slot, by admission class (create, seed, fs, fs_session)",
            m.admission_in_flight.clone(),
        );
        r.register(
            "admission_waiting",
            "Requests queued for a slot, by admission class",
            m.admission_waiting.clone(),
        );
        r.register(
            "admission_refused",
            "Requests answered 429 for want of a slot, by admission class and reason (queue_full, timeout)",
            m.admission_refused.clone(),
        );
        m
    }
}

/// What the metered engine counts into (`MeteredEngine::new(engine, metrics)`).
impl AsRef<EngineMetrics> for Metrics {
    fn as_ref(&self) -> &EngineMetrics {
        &self.engine
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
    /// Sets, or moves by `delta` when `set` is `None`, the ready members of pool `labels` on
    /// `engine`; `pool_size` shows the sum over the engines.
    pub fn pool_members(&self, labels: &PoolLabels, engine: &str, set: Option<u64>, delta: i64) {
        let mut counts = self
            .pool_by_engine
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let n = counts
            .entry((labels.clone(), engine.to_string()))
            .or_default();
        *n = match set {
            Some(v) => v,
            None => n.saturating_add_signed(delta),
        };
        let total = counts
            .iter()
            .filter(|((l, _), _)| l == labels)
            .map(|(_, n)| *n)
            .sum();
        self.pool_size.get_or_create(labels).set(total);
    }

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
            let by_state = Family::<StateLabels, Gauge>::default();
            by_state
                .get_or_create(&StateLabels { state: "running" })
                .set(g.running);
            by_state
                .get_or_create(&StateLabels { state: "stopped" })
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
        let read = FsLabels {
            op: "read",
            code: "not_found".into(),
        };
        observe_duration(&m.fs_ops.get_or_create(&read), Duration::from_millis(20));
        observe_duration(&m.fs_ops.get_or_create(&read), Duration::from_secs(2));
        m.engine
            .errors
            .get_or_create(&EngineErrorLabels {
                op: "inspect",
                kind: "a\"b\\c\nd",
                engine: "default".into(),
            })
            .inc();
        observe_duration(&m.lock_waits, Duration::from_millis(3));
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
                "daiv_sandbox_engine_errors_total{op=\"inspect\",kind=\"a\\\"b\\\\c\\nd\",engine=\"default\"} 1\n"
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
        m.sessions_created.inc_by(2);
        let remove = ModeLabels { mode: "remove" };
        m.sessions_closed.get_or_create(&remove).inc();
        m.sessions_closed.get_or_create(&remove).inc();
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
        let size = m.pool_size.get_or_create_owned(&PoolLabels {
            image: "img:1".into(),
            kind: "isolated",
        });
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
        let pool = PoolLabels {
            image: "img:1".into(),
            kind: "isolated",
        };
        let fs = ClassLabels { class: "fs" };
        let engine = EngineLabels { engine: "b".into() };
        m.engine_up.get_or_create(&engine).set(1);
        m.engine_draining.get_or_create(&engine).set(0);
        m.engine_sessions.get_or_create(&engine).set(3);
        observe_duration(
            &m.http_requests.get_or_create(&HttpLabels {
                method: "GET".into(),
                route: "/metrics".into(),
                status: 200,
            }),
            d,
        );
        m.sessions_closed
            .get_or_create(&ModeLabels { mode: "stop" })
            .inc();
        observe_duration(
            &m.fs_ops.get_or_create(&FsLabels {
                op: "read",
                code: "ok".into(),
            }),
            d,
        );
        observe_duration(
            &m.seeds.get_or_create(&OutcomeLabels {
                outcome: "ok".into(),
            }),
            d,
        );
        observe_duration(
            &m.engine.calls.get_or_create(&OpLabels {
                op: "list",
                engine: "default".into(),
            }),
            d,
        );
        m.engine
            .errors
            .get_or_create(&EngineErrorLabels {
                op: "list",
                kind: "unavailable",
                engine: "default".into(),
            })
            .inc();
        m.pool_size.get_or_create(&pool).set(1);
        m.pool_claims.get_or_create(&pool).inc();
        m.pool_misses
            .get_or_create(&PoolMissLabels {
                image: "img:1".into(),
                kind: "isolated",
                reason: "empty",
            })
            .inc();
        m.pool_refill_failures.get_or_create(&pool).inc();
        observe_duration(
            &m.pool_refill
                .get_or_create(&KindLabels { kind: "isolated" }),
            d,
        );
        m.admission_in_flight.get_or_create(&fs).inc();
        m.admission_waiting.get_or_create(&fs).inc();
        m.admission_refused
            .get_or_create(&RefusedLabels {
                class: "fs",
                reason: "timeout",
            })
            .inc();
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
                "engine_up gauge",
                "engine_draining gauge",
                "engine_sessions gauge",
                "placements_refused_total counter",
                "engines_file_valid gauge",
                "engines_file_errors_total counter",
                "streamed_runs_total counter",
                "processes_started_total counter",
                "processes_killed_total counter",
                "processes_live gauge",
                "snapshots_taken_total counter",
                "forks_total counter",
                "pauses_total counter",
                "snapshots_held gauge",
                "snapshot_bytes gauge",
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
