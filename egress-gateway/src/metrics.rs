//! Prometheus metrics (`prometheus-client`), served on a listener of their own
//! (`--metrics-listen` / `DAIV_EGRESS_METRICS_LISTEN`, off by default), never on the proxy port
//! the sandbox reaches.
//!
//! Decisions and bytes are counted from the audit records (every decision writes exactly one, so
//! the two never disagree): [`MeteredSink`] wraps the audit sink. Upstream latency is observed
//! where the upstream answers; the leaf cache and the policy store keep their own counts, copied
//! in at scrape time.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tracing::{debug, warn};

use crate::audit::{AuditRecord, AuditSink};
use crate::body::{Body, full};
use crate::ca::CertificateAuthority;
use crate::policy_store::PolicyStore;

/// The path scraped.
pub const METRICS_PATH: &str = "/metrics";

/// A scraper must finish its request headers within this (the proxy port's slowloris bound).
const SCRAPE_HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// Labels of `egress_decisions_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    /// `connect`, `tunnel`, `mitm`, `forward`.
    pub mode: String,
    /// `allow`, `deny`, `error`.
    pub decision: String,
    /// The reason code.
    pub reason: String,
    /// `false` for a shadow-mode denial that was let through.
    pub enforced: String,
}

/// Labels of `egress_bytes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BytesLabels {
    /// `down` (to the sandbox) or `up` (to the upstream).
    pub direction: String,
    /// `tunnel`, `mitm`, `forward`.
    pub mode: String,
}

/// Labels of `egress_policy_version_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabels {
    /// The enforced policy's `version` (empty when it has none).
    pub version: String,
}

/// Labels of `egress_tls_leaf_cache_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheLabels {
    /// `hit` or `miss` (a leaf minted).
    pub result: String,
}

/// Every metric of one gateway.
pub struct Metrics {
    registry: Registry,
    decisions: Family<DecisionLabels, Counter>,
    bytes: Family<BytesLabels, Counter>,
    upstream_latency: Histogram,
    leaf_cache: Family<CacheLabels, Counter>,
    version: Family<VersionLabels, Gauge>,
    loaded: Gauge,
    reloads: Counter,
    reload_failures: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let decisions = Family::<DecisionLabels, Counter>::default();
        let bytes = Family::<BytesLabels, Counter>::default();
        // 1 ms .. ~32 s.
        let upstream_latency = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let leaf_cache = Family::<CacheLabels, Counter>::default();
        let version = Family::<VersionLabels, Gauge>::default();
        let loaded = Gauge::default();
        let reloads = Counter::default();
        let reload_failures = Counter::default();
        let mut registry = Registry::with_prefix("egress");
        registry.register(
            "decisions",
            "Decisions, by mode, decision, reason code and whether enforced (shadow mode: false)",
            decisions.clone(),
        );
        registry.register(
            "bytes",
            "Body and tunnel bytes, by direction (down = to the sandbox) and mode",
            bytes.clone(),
        );
        registry.register(
            "upstream_latency_seconds",
            "Time from sending a request upstream to its response head (MITM and plaintext)",
            upstream_latency.clone(),
        );
        registry.register(
            "tls_leaf_cache",
            "Leaf certificate lookups: hit = cached, miss = minted",
            leaf_cache.clone(),
        );
        registry.register(
            "policy_version_info",
            "The enforced policy's version (value 1)",
            version.clone(),
        );
        registry.register(
            "policy_loaded",
            "1 when a valid policy is enforced, 0 when denying all (missing or invalid file)",
            loaded.clone(),
        );
        registry.register("policy_reloads", "Policy (re)loads", reloads.clone());
        registry.register(
            "policy_reload_failures",
            "Reloads that ended in deny-all, and in-place writes that were refused",
            reload_failures.clone(),
        );
        Self {
            registry,
            decisions,
            bytes,
            upstream_latency,
            leaf_cache,
            version,
            loaded,
            reloads,
            reload_failures,
        }
    }
}

impl Metrics {
    /// Counts one audit record: its decision and its bytes.
    pub fn observe(&self, record: &AuditRecord) {
        self.decisions
            .get_or_create(&DecisionLabels {
                mode: record.mode.to_owned(),
                decision: record.decision.to_owned(),
                reason: record.reason.to_owned(),
                enforced: record.enforced.to_string(),
            })
            .inc();
        for (direction, n) in [("down", record.bytes), ("up", record.bytes_up)] {
            if n > 0 {
                self.bytes
                    .get_or_create(&BytesLabels {
                        direction: direction.to_owned(),
                        mode: record.mode.to_owned(),
                    })
                    .inc_by(n);
            }
        }
    }

    /// Records one upstream response head's latency.
    pub fn upstream_latency(&self, took: Duration) {
        self.upstream_latency.observe(took.as_secs_f64());
    }

    /// The text exposition, with the policy and leaf-cache values current.
    pub fn render(&self, policy: &PolicyStore, ca: &CertificateAuthority) -> String {
        let current = policy.current();
        self.version.clear();
        self.version
            .get_or_create(&VersionLabels {
                version: current.version().unwrap_or_default().to_owned(),
            })
            .set(1);
        self.loaded.set(i64::from(!current.is_deny_all()));
        catch_up(&self.reloads, policy.reload_count());
        catch_up(&self.reload_failures, policy.failure_count());
        let (hits, misses) = ca.cache_stats();
        for (result, n) in [("hit", hits), ("miss", misses)] {
            catch_up(
                &self.leaf_cache.get_or_create(&CacheLabels {
                    result: result.to_owned(),
                }),
                n,
            );
        }
        let mut text = String::new();
        if let Err(error) =
            prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)
        {
            warn!(%error, "cannot encode metrics");
        }
        text
    }
}

/// Raises a counter to a total kept elsewhere (monotonic).
fn catch_up(counter: &Counter<u64, AtomicU64>, total: u64) {
    let now = counter.get();
    if total > now {
        counter.inc_by(total - now);
    }
}

/// The audit sink, counting every record into [`Metrics`] on its way.
pub struct MeteredSink {
    /// Where the records go.
    pub inner: Arc<dyn AuditSink>,
    /// What counts them.
    pub metrics: Arc<Metrics>,
}

impl AuditSink for MeteredSink {
    fn record(&self, record: &AuditRecord) {
        self.metrics.observe(record);
        self.inner.record(record);
    }
}

/// What the metrics endpoint reads.
pub struct Scrape {
    /// The counters.
    pub metrics: Arc<Metrics>,
    /// The live policy.
    pub policy: Arc<PolicyStore>,
    /// The leaf cache.
    pub ca: Arc<CertificateAuthority>,
}

/// Serves `GET /metrics` on `listener` until `shutdown` resolves. Anything else is a 404.
pub async fn serve(
    listener: TcpListener,
    scrape: Arc<Scrape>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            accepted = listener.accept() => {
                let (tcp, _) = match accepted {
                    Ok(a) => a,
                    Err(error) => {
                        warn!(%error, "metrics accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let scrape = scrape.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let scrape = scrape.clone();
                        async move { Ok::<_, Infallible>(answer(&req, &scrape)) }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .timer(hyper_util::rt::TokioTimer::new())
                        .header_read_timeout(SCRAPE_HEADER_TIMEOUT)
                        .serve_connection(TokioIo::new(tcp), service);
                    if let Err(error) = conn.await {
                        debug!(%error, "metrics connection ended with an error");
                    }
                });
            }
        }
    }
}

fn answer(req: &Request<Incoming>, scrape: &Scrape) -> Response<Body> {
    if req.method() != http::Method::GET || req.uri().path() != METRICS_PATH {
        let mut resp = Response::new(full("not found\n"));
        *resp.status_mut() = StatusCode::NOT_FOUND;
        return resp;
    }
    let mut resp = Response::new(full(scrape.metrics.render(&scrape.policy, &scrape.ca)));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        // The Prometheus text format 0.0.4, which is what `render` encodes.
        http::HeaderValue::from_static(prometheus_client::encoding::prometheus_text::CONTENT_TYPE),
    );
    resp
}
