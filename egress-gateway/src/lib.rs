//! The egress gateway: a policy-driven forward proxy (absolute-form HTTP and CONNECT) that
//! tunnels or terminates TLS per the shared policy, enforces methods per request, injects
//! credentials the sandbox never sees, and refuses what the hardening rules of DESIGN.md refuse.
//! `main.rs` is a thin wrapper so that tests embed the proxy in-process.
//!
//! # Layout
//! - [`config`]: flags and `DAIV_EGRESS_*` environment, and the subcommands.
//! - [`policy_store`]: the live policy (notify + arc-swap + poll), deny-all on any bad file.
//! - [`ca`]: leaf certificates minted per host (rcgen), cached and bounded.
//! - [`guard`]: own DNS resolution and the non-global address refusal (SSRF guard).
//! - [`proxy`]: accept, CONNECT, tunnel, MITM, per-request handling, upstream client.
//! - [`body`]: the one response body type, byte counting, the audit line written when a
//!   streamed exchange ends (a leaf: the proxy, health and metrics answer with it).
//! - [`audit`]: one JSON line per decision.
//! - [`health`]: the health endpoint and the enforced policy's version, on a listener of its
//!   own (loopback by default; never the proxy port the sandbox reaches).
//! - [`metrics`]: Prometheus counters, served on a listener of their own (off by default).
//! - [`cli`]: `policy check`, `policy explain`, `gen-ca`.
//! - [`error`]: [`ProxyError`] (one `status()` mapping), [`ConfigError`] and the CA's
//!   [`ca::CaError`].
//!
//! # Reason codes (`X-Egress-Denied` and the audit log)
//! From the policy: `host-not-listed`, `method-not-allowed`, `path-not-allowed`, `rule-denied`,
//! `policy-unavailable`. From the
//! gateway: `sni-mismatch`, `host-mismatch`, `address-not-allowed`, `tls-required`,
//! `credential-echo`, and (audit only, closed by a reload) `intercept-required` (a tunnel) and
//! `credential-changed` (a WebSocket).
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod audit;
pub mod body;
pub mod ca;
pub mod cli;
pub mod config;
pub mod error;
pub mod guard;
pub mod health;
pub mod metrics;
pub mod policy_store;
pub mod proxy;

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use ipnet::IpNet;
use rustls_pki_types::CertificateDer;
use tokio::net::TcpListener;

pub use error::{ConfigError, DenyCode, ProxyError};
pub use proxy::Limits;

use crate::audit::AuditSink;
use crate::ca::CertificateAuthority;
use crate::guard::AddressGuard;
use crate::policy_store::{PolicyStore, Reloader};

/// Everything the proxy needs, already read from files (so tests build it in memory).
pub struct GatewayConfig {
    /// The policy file, watched for changes.
    pub policy_path: PathBuf,
    /// CA certificate (PEM) that sandboxes trust.
    pub ca_cert_pem: String,
    /// CA private key (PEM, PKCS#8).
    pub ca_key_pem: String,
    /// Extra roots for upstream servers, on top of the web PKI.
    pub extra_roots: Vec<CertificateDer<'static>>,
    /// Non-global ranges that may still be reached (for example a test network).
    pub allowed_cidrs: Vec<IpNet>,
    /// Names answered without DNS (tests and benchmarks map `*.test` to loopback).
    pub static_hosts: HashMap<String, Vec<IpAddr>>,
    /// Session id written into every audit line.
    pub session_id: String,
    /// Where audit lines go.
    pub audit: Arc<dyn AuditSink>,
    /// Connection cap and client-side timeouts.
    pub limits: Limits,
    /// Report-only mode for every policy (`--shadow`): denials are audited with
    /// `"enforced": false` and let through (without credentials).
    pub shadow: bool,
    /// A corporate HTTP proxy all upstream connections go through (`--upstream-proxy`).
    pub upstream_proxy: Option<proxy::upstream::UpstreamProxy>,
    /// Hosts reachable in plain HTTP on private networks, credential included
    /// (`--plain-http-hosts`; development stacks). Empty: none, the default.
    pub plain_http_hosts: Vec<shared_policy::sidecar::PlainHttpHost>,
}

/// A configured gateway, ready to serve a listener.
pub struct Gateway {
    ctx: Arc<proxy::Ctx>,
    _reloader: Reloader,
}

impl Gateway {
    /// Builds the gateway and starts watching the policy file. Needs a tokio runtime.
    pub fn new(config: GatewayConfig) -> Result<Self, ConfigError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let ca = CertificateAuthority::from_pem(
            &config.ca_cert_pem,
            &config.ca_key_pem,
            provider.clone(),
        )?;
        let guard = Arc::new(AddressGuard::new(config.allowed_cidrs, config.static_hosts));
        let tls = proxy::upstream::client_tls(provider, &config.extra_roots)
            .map_err(ConfigError::Invalid)?;
        let policy = PolicyStore::open(&config.policy_path);
        let reloader = policy_store::watch(policy.clone());
        let metrics = Arc::new(metrics::Metrics::default());
        let audit: Arc<dyn audit::AuditSink> = Arc::new(metrics::MeteredSink {
            inner: config.audit,
            metrics: metrics.clone(),
        });
        let ctx = Arc::new(proxy::Ctx {
            policy,
            ca: Arc::new(ca),
            upstreams: proxy::upstream::Upstreams::new(
                guard.clone(),
                tls,
                config.upstream_proxy.map(Arc::new),
            ),
            guard,
            session: config.session_id.into(),
            audit,
            metrics,
            tasks: tokio_util::task::TaskTracker::new(),
            limits: config.limits,
            shadow: config.shadow,
            plain_http: config.plain_http_hosts,
        });
        Ok(Self {
            ctx,
            _reloader: reloader,
        })
    }

    /// The live policy (tests and benchmarks inspect it).
    pub fn policy(&self) -> &Arc<PolicyStore> {
        &self.ctx.policy
    }

    /// The CA (tests and benchmarks inspect its cache).
    pub fn ca(&self) -> &Arc<CertificateAuthority> {
        &self.ctx.ca
    }

    /// What the metrics endpoint serves; run it with [`metrics::serve`] on a listener of its own.
    pub fn scrape(&self) -> Arc<metrics::Scrape> {
        Arc::new(metrics::Scrape {
            metrics: self.ctx.metrics.clone(),
            policy: self.ctx.policy.clone(),
            ca: self.ctx.ca.clone(),
        })
    }

    /// Serves the proxy on `listener` and the health endpoint on `health` until `shutdown`
    /// resolves, then drains briefly (health answers until the proxy has drained).
    pub async fn serve(
        self,
        listener: TcpListener,
        health: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        let stop = tokio_util::sync::CancellationToken::new();
        let health = tokio::spawn(health::serve(
            health,
            self.ctx.clone(),
            stop.clone().cancelled_owned(),
        ));
        let served = proxy::serve(listener, self.ctx.clone(), shutdown).await;
        stop.cancel();
        let _ = health.await;
        served
    }
}
