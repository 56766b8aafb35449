//! Prometheus metrics: a small registry of atomics rendered in the text exposition format.
//!
//! Hand-written rather than a metrics crate: the service needs a dozen families with fixed label
//! names, and counting is an atomic add, so a crate would add code and memory for nothing. Label
//! values are bounded by construction (route templates, fs op names, error codes, engine call
//! names), never ids or user input, so the number of series stays small.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// Upper bounds (seconds) shared by every histogram: from a cache-hot fs op (~5 ms) to a long
/// command or a large seed (minutes).
const BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

#[derive(Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }

    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// For gauges kept in the same cell: the value last observed.
    pub fn set(&self, n: u64) {
        self.0.store(n, Ordering::Relaxed);
    }
}

/// Per-bucket (not cumulative) counts; the sum is kept in microseconds so it stays an integer.
#[derive(Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// One metric per combination of label values, created on first use.
pub struct Family<M> {
    labels: &'static [&'static str],
    series: Mutex<BTreeMap<Vec<String>, std::sync::Arc<M>>>,
}

impl<M: Default> Family<M> {
    fn new(labels: &'static [&'static str]) -> Self {
        Self {
            labels,
            series: Mutex::new(BTreeMap::new()),
        }
    }

    /// The series for `values` (one per label name, in order). The lock is held for a map
    /// lookup only, never across an await.
    pub fn with(&self, values: &[&str]) -> std::sync::Arc<M> {
        let key: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        let mut series = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        series.entry(key).or_default().clone()
    }

    fn snapshot(&self) -> Vec<(Vec<String>, std::sync::Arc<M>)> {
        let series = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        series.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

/// Every metric the control plane exports. Held in [`crate::AppState`]; the engine wrapper, the
/// request middleware, the handlers and the reaper count into it.
pub struct Metrics {
    pub http_requests: Family<Histogram>,
    pub sessions_created: Counter,
    pub sessions_closed: Family<Counter>,
    pub sessions_reaped: Counter,
    pub reaper_failures: Counter,
    pub commands: Counter,
    pub command_batches: Histogram,
    pub fs_ops: Family<Histogram>,
    pub seeds: Family<Histogram>,
    pub seed_bytes: Counter,
    pub lock_waits: Histogram,
    pub lock_busy: Counter,
    pub engine_calls: Family<Histogram>,
    pub engine_errors: Family<Counter>,
    pub processes_started: Counter,
    pub processes_killed: Counter,
    /// Running background processes per session as last listed (list route, reaper).
    processes_live: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    pub streamed_runs: Counter,
    /// Ready warm-pool members per (image, kind), as this replica last counted them.
    pub pool_size: Family<Counter>,
    pub pool_claims: Family<Counter>,
    /// Requests a pool was configured for that went cold, by (image, kind, reason).
    pub pool_misses: Family<Counter>,
    pub pool_refill_failures: Family<Counter>,
    /// Time to build one member, by kind.
    pub pool_refill: Family<Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            http_requests: Family::new(&["method", "route", "status"]),
            sessions_created: Counter::default(),
            sessions_closed: Family::new(&["mode"]),
            sessions_reaped: Counter::default(),
            reaper_failures: Counter::default(),
            commands: Counter::default(),
            command_batches: Histogram::default(),
            fs_ops: Family::new(&["op", "code"]),
            seeds: Family::new(&["outcome"]),
            seed_bytes: Counter::default(),
            lock_waits: Histogram::default(),
            lock_busy: Counter::default(),
            engine_calls: Family::new(&["op"]),
            engine_errors: Family::new(&["op", "kind"]),
            processes_started: Counter::default(),
            processes_killed: Counter::default(),
            processes_live: Default::default(),
            streamed_runs: Counter::default(),
            pool_size: Family::new(&["image", "kind"]),
            pool_claims: Family::new(&["image", "kind"]),
            pool_misses: Family::new(&["image", "kind", "reason"]),
            pool_refill_failures: Family::new(&["image", "kind"]),
            pool_refill: Family::new(&["kind"]),
        }
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
            .processes_live
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match running {
            Some(n) if n > 0 => {
                m.insert(session_id.to_string(), n);
            }
            _ => {
                m.remove(session_id);
            }
        }
    }

    fn processes_live(&self) -> u64 {
        let m = self
            .processes_live
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        m.values().sum()
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub fn render(&self, sessions: Option<SessionGauge>) -> String {
        let mut out = String::with_capacity(8 * 1024);
        let w = &mut out;
        family_hist(
            w,
            "daiv_sandbox_http_request_duration_seconds",
            "HTTP requests by method, route template and status.",
            &self.http_requests,
        );
        counter(
            w,
            "daiv_sandbox_sessions_created_total",
            "Sessions created.",
            self.sessions_created.get(),
        );
        family_counter(
            w,
            "daiv_sandbox_sessions_closed_total",
            "Sessions closed through the API, by mode (stop or remove).",
            &self.sessions_closed,
        );
        counter(
            w,
            "daiv_sandbox_sessions_reaped_total",
            "Sessions removed by the reaper (expired, over the stopped cap, idle).",
            self.sessions_reaped.get(),
        );
        counter(
            w,
            "daiv_sandbox_reaper_failures_total",
            "Reaper sweeps or removals that failed.",
            self.reaper_failures.get(),
        );
        if let Some(g) = sessions {
            header(
                w,
                "daiv_sandbox_sessions",
                "Sessions (sandbox containers) by state, as the engine lists them now.",
                "gauge",
            );
            let _ = writeln!(
                w,
                "daiv_sandbox_sessions{{state=\"running\"}} {}",
                g.running
            );
            let _ = writeln!(
                w,
                "daiv_sandbox_sessions{{state=\"stopped\"}} {}",
                g.stopped
            );
        }
        counter(
            w,
            "daiv_sandbox_commands_total",
            "Commands run (each entry of a run request that was executed).",
            self.commands.get(),
        );
        hist(
            w,
            "daiv_sandbox_command_batch_duration_seconds",
            "Duration of run requests (all their commands), successful or not.",
            &[],
            &[],
            &self.command_batches,
        );
        family_hist(
            w,
            "daiv_sandbox_fs_op_duration_seconds",
            "fs operations by op and outcome code (ok, an fs error code, or api_error).",
            &self.fs_ops,
        );
        family_hist(
            w,
            "daiv_sandbox_seed_duration_seconds",
            "Seed requests by outcome.",
            &self.seeds,
        );
        counter(
            w,
            "daiv_sandbox_seed_bytes_total",
            "Decompressed archive bytes written by successful seeds.",
            self.seed_bytes.get(),
        );
        hist(
            w,
            "daiv_sandbox_session_lock_wait_seconds",
            "Time spent acquiring a session lock, acquired or not.",
            &[],
            &[],
            &self.lock_waits,
        );
        counter(
            w,
            "daiv_sandbox_session_lock_busy_total",
            "Requests answered 409 because the session lock stayed held.",
            self.lock_busy.get(),
        );
        family_hist(
            w,
            "daiv_sandbox_engine_call_duration_seconds",
            "Container engine (Docker API) calls by operation.",
            &self.engine_calls,
        );
        family_counter(
            w,
            "daiv_sandbox_engine_errors_total",
            "Container engine (Docker API) errors by operation and kind.",
            &self.engine_errors,
        );
        counter(
            w,
            "daiv_sandbox_streamed_runs_total",
            "Run requests answered as an NDJSON stream.",
            self.streamed_runs.get(),
        );
        counter(
            w,
            "daiv_sandbox_processes_started_total",
            "Background processes started.",
            self.processes_started.get(),
        );
        counter(
            w,
            "daiv_sandbox_processes_killed_total",
            "Background processes killed through the API.",
            self.processes_killed.get(),
        );
        header(
            w,
            "daiv_sandbox_processes_live",
            "Running background processes over all sessions, as last listed (list route, reaper).",
            "gauge",
        );
        let _ = writeln!(w, "daiv_sandbox_processes_live {}", self.processes_live());
        family_counter_as(
            w,
            "daiv_sandbox_pool_size",
            "Ready warm-pool members by image and kind, as this replica last counted them.",
            "gauge",
            &self.pool_size,
        );
        family_counter(
            w,
            "daiv_sandbox_pool_claims_total",
            "Sessions handed out from the warm pool, by image and kind.",
            &self.pool_claims,
        );
        family_counter(
            w,
            "daiv_sandbox_pool_misses_total",
            "Requests for a pooled image and kind created cold, by reason (empty, limits, apply).",
            &self.pool_misses,
        );
        family_counter(
            w,
            "daiv_sandbox_pool_refill_failures_total",
            "Warm-pool members that could not be built, or pools that could not be checked.",
            &self.pool_refill_failures,
        );
        family_hist(
            w,
            "daiv_sandbox_pool_refill_duration_seconds",
            "Time to build one warm-pool member (create, start and, for egress, the triad).",
            &self.pool_refill,
        );
        out
    }
}

fn header(w: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(w, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn counter(w: &mut String, name: &str, help: &str, value: u64) {
    header(w, name, help, "counter");
    let _ = writeln!(w, "{name} {value}");
}

fn family_counter(w: &mut String, name: &str, help: &str, family: &Family<Counter>) {
    family_counter_as(w, name, help, "counter", family);
}

fn family_counter_as(w: &mut String, name: &str, help: &str, kind: &str, family: &Family<Counter>) {
    header(w, name, help, kind);
    for (values, c) in family.snapshot() {
        let _ = writeln!(
            w,
            "{name}{} {}",
            labels(family.labels, &values, None),
            c.get()
        );
    }
}

fn family_hist(w: &mut String, name: &str, help: &str, family: &Family<Histogram>) {
    header(w, name, help, "histogram");
    for (values, h) in family.snapshot() {
        series(w, name, family.labels, &values, &h);
    }
}

fn hist(w: &mut String, name: &str, help: &str, names: &[&str], values: &[String], h: &Histogram) {
    header(w, name, help, "histogram");
    series(w, name, names, values, h);
}

fn series(w: &mut String, name: &str, names: &[&str], values: &[String], h: &Histogram) {
    let mut cumulative = 0;
    for (i, bound) in BUCKETS.iter().enumerate() {
        cumulative += h.buckets[i].load(Ordering::Relaxed);
        let le = bound.to_string();
        let _ = writeln!(
            w,
            "{name}_bucket{} {cumulative}",
            labels(names, values, Some(&le))
        );
    }
    let count = h.count();
    let sum = h.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
    let _ = writeln!(
        w,
        "{name}_bucket{} {count}",
        labels(names, values, Some("+Inf"))
    );
    let _ = writeln!(w, "{name}_sum{} {sum}", labels(names, values, None));
    let _ = writeln!(w, "{name}_count{} {count}", labels(names, values, None));
}

fn labels(names: &[&str], values: &[String], le: Option<&str>) -> String {
    let mut pairs: Vec<String> = names
        .iter()
        .zip(values)
        .map(|(n, v)| format!("{n}=\"{}\"", escape(v)))
        .collect();
    if let Some(le) = le {
        pairs.push(format!("le=\"{le}\""));
    }
    if pairs.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", pairs.join(","))
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', r#"\""#)
        .replace('\n', r"\n")
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
        m.engine_errors.with(&["inspect", "a\"b"]).inc();
        let text = m.render(Some(SessionGauge {
            running: 2,
            stopped: 1,
        }));
        assert!(text.contains(
            "daiv_sandbox_fs_op_duration_seconds_bucket{op=\"read\",code=\"not_found\",le=\"0.025\"} 1\n"
        ));
        assert!(text.contains(
            "daiv_sandbox_fs_op_duration_seconds_bucket{op=\"read\",code=\"not_found\",le=\"+Inf\"} 2\n"
        ));
        assert!(text.contains(
            "daiv_sandbox_fs_op_duration_seconds_count{op=\"read\",code=\"not_found\"} 2\n"
        ));
        assert!(
            text.contains("daiv_sandbox_engine_errors_total{op=\"inspect\",kind=\"a\\\"b\"} 1\n")
        );
        assert!(text.contains("daiv_sandbox_sessions{state=\"running\"} 2\n"));
        assert!(text.contains("daiv_sandbox_session_lock_wait_seconds_count 0\n"));
    }
}
