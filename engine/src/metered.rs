//! [`MeteredEngine`]: counts and times every container-engine call, and its errors by kind, into
//! the engine's metric group ([`EngineMetrics`]).
//!
//! A wrapper at the engine seam rather than counters inside the Docker implementation: every
//! call is covered once, whatever backend sits behind the trait, and the round trips per API
//! operation (DESIGN.md asks us to count them) show up as `engine_call_duration_seconds_count`.
//! It is a [`Decorate`]: it writes its timing and nothing else.

use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::{ContainerEngine, Decorate, EngineError};

/// The name of the one engine of a service without a fleet.
pub const DEFAULT_ENGINE: &str = "default";

/// `engine_call_duration_seconds`: the engine call's name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    pub op: &'static str,
    /// The engine's name in the fleet (`default` without one).
    pub engine: String,
}

/// `engine_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EngineErrorLabels {
    pub op: &'static str,
    pub kind: &'static str,
    pub engine: String,
}

/// The upper bounds (seconds) of a group's duration histograms: those of the registry it joins,
/// so that every duration on a page shares them.
#[derive(Clone, Copy, Debug)]
pub struct Buckets(pub &'static [f64]);

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0.iter().copied())
    }
}

/// The engine's metric group: what [`MeteredEngine`] counts, registered by
/// [`EngineMetrics::register`] into the service's registry. Clones share their cells.
#[derive(Clone, Debug)]
pub struct EngineMetrics {
    pub calls: Family<OpLabels, Histogram, Buckets>,
    pub errors: Family<EngineErrorLabels, Counter<u64, AtomicU64>>,
}

impl EngineMetrics {
    pub fn new(buckets: Buckets) -> Self {
        Self {
            calls: Family::new_with_constructor(buckets),
            errors: Family::default(),
        }
    }

    /// Adds the group's families to `registry` (which gives them its prefix).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "engine_call_duration_seconds",
            "Container engine (Docker API) calls by operation",
            self.calls.clone(),
        );
        registry.register(
            "engine_errors",
            "Container engine (Docker API) errors by operation and kind",
            self.errors.clone(),
        );
    }
}

impl AsRef<EngineMetrics> for EngineMetrics {
    fn as_ref(&self) -> &EngineMetrics {
        self
    }
}

pub struct MeteredEngine {
    inner: Arc<dyn ContainerEngine>,
    metrics: EngineMetrics,
    /// The engine's name in the fleet, a label of every figure.
    name: String,
}

impl MeteredEngine {
    /// Counts into the engine group of `metrics` (the group itself, or the service's metrics
    /// that hold it).
    pub fn new<M: AsRef<EngineMetrics>>(inner: Arc<dyn ContainerEngine>, metrics: Arc<M>) -> Self {
        Self::named(inner, metrics, DEFAULT_ENGINE)
    }

    /// Counts under the fleet engine `name`.
    pub fn named<M: AsRef<EngineMetrics>>(
        inner: Arc<dyn ContainerEngine>,
        metrics: Arc<M>,
        name: &str,
    ) -> Self {
        Self {
            inner,
            metrics: AsRef::<EngineMetrics>::as_ref(&*metrics).clone(),
            name: name.to_string(),
        }
    }

    fn record<T>(
        &self,
        op: &'static str,
        started: Instant,
        r: Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        tracing::trace!(op, engine = %self.name, elapsed = ?started.elapsed(), ok = r.is_ok(), "engine call done");
        self.metrics
            .calls
            .get_or_create(&OpLabels {
                op,
                engine: self.name.clone(),
            })
            .observe(started.elapsed().as_secs_f64());
        if let Err(e) = &r {
            self.metrics
                .errors
                .get_or_create(&EngineErrorLabels {
                    op,
                    kind: kind(e),
                    engine: self.name.clone(),
                })
                .inc();
        }
        r
    }
}

/// A stable label for an error kind (never its message, which carries ids and paths).
pub fn kind(e: &EngineError) -> &'static str {
    match e {
        EngineError::NotFound => "not_found",
        EngineError::Conflict(_) => "conflict",
        EngineError::ImageUnavailable { .. } => "image_unavailable",
        EngineError::Rejected(_) => "rejected",
        EngineError::Unavailable(_) => "unavailable",
    }
}

impl Decorate for MeteredEngine {
    fn inner(
        &self,
    ) -> Result<impl Deref<Target = dyn ContainerEngine> + Send + Sync + '_, EngineError> {
        Ok(&*self.inner)
    }

    fn prefix(&self) -> Option<&str> {
        self.inner.id_prefix()
    }

    async fn around<T: Send>(
        &self,
        op: &'static str,
        call: impl Future<Output = Result<T, EngineError>> + Send,
    ) -> Result<T, EngineError> {
        let started = Instant::now();
        tracing::trace!(op, engine = %self.name, "engine call");
        let r = call.await;
        self.record(op, started, r)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::decorate::VERBS;
    use crate::fake::FakeEngine;

    const BUCKETS: Buckets = Buckets(&[0.1, 1.0]);

    fn page(metrics: &EngineMetrics) -> String {
        let mut registry = Registry::with_prefix("daiv_sandbox");
        metrics.register(&mut registry);
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &registry).expect("encodes");
        out
    }

    #[tokio::test]
    async fn calls_and_errors_are_counted_under_their_op_and_engine() {
        let metrics = Arc::new(EngineMetrics::new(BUCKETS));
        let fake = Arc::new(FakeEngine::default());
        let engine = MeteredEngine::named(fake.clone(), metrics.clone(), "b");
        engine.list(&[]).await.expect("ok");
        assert!(matches!(
            engine.inspect("nope").await,
            Err(EngineError::NotFound)
        ));
        fake.set_down(true);
        assert!(engine.image_id("img").await.is_err());
        let text = page(&metrics);
        for line in [
            "daiv_sandbox_engine_call_duration_seconds_count{op=\"list\",engine=\"b\"} 1\n",
            "daiv_sandbox_engine_call_duration_seconds_count{op=\"inspect\",engine=\"b\"} 1\n",
            "daiv_sandbox_engine_errors_total{op=\"inspect\",kind=\"not_found\",engine=\"b\"} 1\n",
            "daiv_sandbox_engine_errors_total{op=\"inspect_image\",kind=\"unavailable\",engine=\"b\"} 1\n",
            "# TYPE daiv_sandbox_engine_call_duration_seconds histogram\n",
            "# TYPE daiv_sandbox_engine_errors_total counter\n",
        ] {
            assert!(text.contains(line), "no {line:?} in:\n{text}");
        }
        assert!(
            text.contains(
                "engine_call_duration_seconds_bucket{op=\"list\",engine=\"b\",le=\"0.1\"}"
            ),
            "the registry's buckets: {text}"
        );
    }

    /// The `op` label values: dashboards and alerts query them.
    #[test]
    fn each_verb_keeps_its_op_label() {
        let ops: BTreeSet<&str> = VERBS.iter().map(|(_, op)| *op).collect();
        let expected: BTreeSet<&str> = [
            "ping",
            "info",
            "ensure_image",
            "create",
            "start",
            "inspect",
            "writable_bytes",
            "stats",
            "stop",
            "remove",
            "exec",
            "exec_attached",
            "exec_inspect",
            "put_archive",
            "get_archive",
            "wait_for_log",
            "rename",
            "update",
            "inspect_image",
            "list",
            "create_network",
            "remove_network",
            "connect_network",
            "list_networks",
            "pause",
            "unpause",
            "commit",
            "tag_image",
            "list_images",
            "remove_image",
            "create_volume",
            "inspect_volume",
            "list_volumes",
            "remove_volume",
        ]
        .into();
        assert_eq!(ops, expected);
        let op = |verb: &str| VERBS.iter().find(|(v, _)| *v == verb).map(|(_, op)| *op);
        assert_eq!(op("exec_exit_code"), Some("exec_inspect"));
        assert_eq!(op("update_limits"), Some("update"));
        assert_eq!(op("image_id"), Some("inspect_image"));
    }
}
