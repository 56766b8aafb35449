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
//! Families are grouped by area, each group a struct of its own whose constructor registers its
//! families (as the engine crate's [`EngineMetrics`] does), so that a family is declared, built
//! and registered in one file, and a use site reads `metrics.pool.claims`. [`Metrics`] holds the
//! groups and the registry.
//!
//! # Groups, in page order
//! [`HttpMetrics`], [`SessionMetrics`] (sessions and the commands run in them),
//! [`WorkspaceMetrics`] (fs and seed), [`LockMetrics`], [`EngineMetrics`] (the engine crate's),
//! [`FleetMetrics`], [`ProcessMetrics`] (streamed runs and background processes),
//! [`SnapshotMetrics`] (snapshots, forks, pauses), [`RuntimeMetrics`], [`PoolMetrics`],
//! [`AdmissionMetrics`].

mod admission;
mod fleet;
mod http;
mod locks;
mod pool;
mod ports;
mod processes;
mod runtime;
mod sessions;
mod snapshots;
mod workspace;

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, prometheus_text};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::{counter, gauge, histogram};
use prometheus_client::registry::{Metric, Registry};

pub use admission::{AdmissionMetrics, ClassLabels, RefusedLabels};
pub use fleet::{EngineLabels, FleetMetrics};
pub use http::{HttpLabels, HttpMetrics};
pub use locks::LockMetrics;
pub use pool::{KindLabels, PoolLabels, PoolMetrics, PoolMissLabels};
pub use ports::PortMetrics;
pub use processes::ProcessMetrics;
pub use runtime::{ImageVerdictLabels, RuntimeLabels, RuntimeMetrics};
pub use sessions::{ModeLabels, SessionMetrics};
pub use snapshots::SnapshotMetrics;
pub use workspace::{FsLabels, OutcomeLabels, WorkspaceMetrics};

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

/// `sessions` (at scrape time).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

/// Registers `metric` under `name` and hands it back, so that a group's constructor registers
/// each field where it builds it, in the order of its struct literal. Names go in without the
/// prefix, and counters without `_total`: the encoder adds both, and ends each help text with a
/// period.
fn add<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

// === impl Metrics ===

/// Every metric the control plane exports, one group per area. Held by the composition
/// (`AppState`); the engine wrapper, the request middleware, the handlers and the reaper count
/// into it.
pub struct Metrics {
    /// Holds a clone of every metric of the groups (clones share their cells), in page order.
    registry: Registry,
    pub http: HttpMetrics,
    pub sessions: SessionMetrics,
    pub workspace: WorkspaceMetrics,
    pub locks: LockMetrics,
    /// The engine's group: its calls and errors (see `crate::engine::metered`).
    pub engine: EngineMetrics,
    pub fleet: FleetMetrics,
    pub processes: ProcessMetrics,
    pub snapshots: SnapshotMetrics,
    pub runtime: RuntimeMetrics,
    pub pool: PoolMetrics,
    pub admission: AdmissionMetrics,
    pub ports: PortMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let r = &mut registry;
        // Each group registers as it is built, so this order is the page's: kept as it was, so
        // that the page stays the same from one release to the next.
        let http = HttpMetrics::new(r);
        let sessions = SessionMetrics::new(r);
        let workspace = WorkspaceMetrics::new(r);
        let locks = LockMetrics::new(r);
        let engine = EngineMetrics::new(Buckets(&BUCKETS));
        engine.register(r);
        let fleet = FleetMetrics::new(r);
        let processes = ProcessMetrics::new(r);
        let snapshots = SnapshotMetrics::new(r);
        let runtime = RuntimeMetrics::new(r);
        let pool = PoolMetrics::new(r);
        let admission = AdmissionMetrics::new(r);
        let ports = PortMetrics::new(r);
        Self {
            registry,
            http,
            sessions,
            workspace,
            locks,
            engine,
            fleet,
            processes,
            snapshots,
            runtime,
            pool,
            admission,
            ports,
        }
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
        observe_duration(
            &m.workspace.fs_ops.get_or_create(&read),
            Duration::from_millis(20),
        );
        observe_duration(
            &m.workspace.fs_ops.get_or_create(&read),
            Duration::from_secs(2),
        );
        m.engine
            .errors
            .get_or_create(&EngineErrorLabels {
                op: "inspect",
                kind: "a\"b\\c\nd",
                engine: "default".into(),
            })
            .inc();
        observe_duration(&m.locks.waits, Duration::from_millis(3));
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
        m.sessions.created.inc();
        m.sessions.created.inc_by(2);
        let remove = ModeLabels { mode: "remove" };
        m.sessions.closed.get_or_create(&remove).inc();
        m.sessions.closed.get_or_create(&remove).inc();
        assert_eq!(m.sessions.created.get(), 3);
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
        let size = m.pool.size.get_or_create_owned(&PoolLabels {
            image: "img:1".into(),
            kind: "isolated",
        });
        size.set(3);
        size.set(size.get().saturating_sub(1));
        m.processes.observe("s1", Some(2));
        m.processes.observe("s2", Some(5));
        m.processes.observe("s2", Some(1));
        m.processes.observe("s1", None);
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

    /// A registry with one series in every family (a family's series come in hash order).
    fn filled(d: Duration) -> Metrics {
        let m = Metrics::default();
        let pool = PoolLabels {
            image: "img:1".into(),
            kind: "isolated",
        };
        let fs = ClassLabels { class: "fs" };
        let engine = EngineLabels { engine: "b".into() };
        m.fleet.up.get_or_create(&engine).set(1);
        m.fleet.draining.get_or_create(&engine).set(0);
        m.fleet.sessions.get_or_create(&engine).set(3);
        observe_duration(
            &m.http.requests.get_or_create(&HttpLabels {
                door: "rest".into(),
                method: "GET".into(),
                route: "/metrics".into(),
                status: 200,
            }),
            d,
        );
        m.sessions.created.inc();
        m.sessions
            .closed
            .get_or_create(&ModeLabels { mode: "stop" })
            .inc();
        m.sessions.reaped.inc();
        m.sessions.reaper_failures.inc();
        m.sessions.commands.inc();
        observe_duration(&m.sessions.command_batches, d);
        observe_duration(
            &m.workspace.fs_ops.get_or_create(&FsLabels {
                op: "read",
                code: "ok".into(),
            }),
            d,
        );
        observe_duration(
            &m.workspace.seeds.get_or_create(&OutcomeLabels {
                outcome: "ok".into(),
            }),
            d,
        );
        m.workspace.seed_bytes.inc_by(5);
        observe_duration(&m.locks.waits, d);
        m.locks.busy.inc();
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
        m.fleet.placements_refused.inc();
        m.fleet.file_valid.set(1);
        m.fleet.file_errors.inc();
        m.processes.started.inc();
        m.processes.killed.inc();
        m.processes.observe("s", Some(4));
        m.processes.streamed_runs.inc();
        m.pool.members(&pool, "default", Some(2), 0);
        m.pool.claims.get_or_create(&pool).inc();
        m.pool
            .misses
            .get_or_create(&PoolMissLabels {
                image: "img:1".into(),
                kind: "isolated",
                reason: "empty",
            })
            .inc();
        m.pool.refill_failures.get_or_create(&pool).inc();
        observe_duration(
            &m.pool
                .refills
                .get_or_create(&KindLabels { kind: "isolated" }),
            d,
        );
        m.admission.in_flight.get_or_create(&fs).inc();
        m.admission.waiting.get_or_create(&fs).inc();
        m.admission
            .refused
            .get_or_create(&RefusedLabels {
                class: "fs",
                reason: "timeout",
            })
            .inc();
        m.snapshots.taken.inc();
        m.snapshots.forks.inc();
        m.snapshots.pauses.inc();
        m.snapshots.held.set(2);
        m.snapshots.bytes.set(9);
        m.runtime
            .sound
            .get_or_create(&RuntimeLabels { runtime: "runsc" })
            .set(1);
        m.runtime
            .images
            .get_or_create(&ImageVerdictLabels {
                runtime: "runsc",
                verdict: "unsound",
            })
            .set(1);
        m
    }

    /// The wire contract: every family's name and type, as dashboards and alerts query them.
    #[test]
    fn every_family_keeps_its_name_and_type() {
        let m = filled(Duration::from_millis(1));
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
                "runtime_sound gauge",
                "runtime_probed_images gauge",
                "pool_size gauge",
                "pool_claims_total counter",
                "pool_misses_total counter",
                "pool_refill_failures_total counter",
                "pool_refill_duration_seconds histogram",
                "admission_in_flight gauge",
                "admission_waiting gauge",
                "admission_refused_total counter",
                "port_streams_opened_total counter",
                "port_streams_refused_total counter",
                "port_streams_open gauge",
                "port_bytes_in_total counter",
                "port_bytes_out_total counter",
                "sessions gauge",
            ]
        );
        // One HELP per TYPE, each a sentence.
        let helps: Vec<&str> = text.lines().filter(|l| l.starts_with("# HELP ")).collect();
        assert_eq!(helps.len(), types.len());
        assert!(helps.iter().all(|h| h.ends_with('.')), "{helps:?}");
    }

    /// The whole page, byte for byte: names, help texts, label sets, bucket bounds and order, as
    /// they were before the families were grouped (issue 32). A change here is a change of the
    /// wire format. One series per family, since a family's series come in hash order.
    #[test]
    fn the_page_is_pinned() {
        let m = filled(Duration::from_millis(7));
        assert_eq!(m.render(None), include_str!("page.txt"));
    }
}
