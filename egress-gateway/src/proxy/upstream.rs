//! The upstream side: a connector that only dials addresses the guard checked, the TLS client
//! config (webpki roots plus an optional extra bundle), and the pooled HTTP client built on them.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::CertificateDer;
use shared_policy::Host;
use tokio::net::TcpStream;

use super::body::CountingBody;
use crate::error::ProxyError;
use crate::guard::AddressGuard;

/// TCP connect to one upstream address.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle pooled upstream connections are closed after this.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// At most this many idle connections per upstream host are kept. HTTP/1.1 clients get an
/// HTTP/1.1 upstream leg, one connection per concurrent request: a pool smaller than the client's
/// concurrency would make every request beyond it pay a fresh TLS handshake upstream. Idle
/// connections cost a few tens of KiB each and close after [`POOL_IDLE_TIMEOUT`].
pub const POOL_MAX_IDLE_PER_HOST: usize = 64;

/// Request bodies on their way upstream: the client's, counted.
pub type UpBody = CountingBody<Incoming>;
/// The pooled client used for MITM'd and plaintext-forwarded requests.
pub type UpstreamClient = Client<HttpsConnector<GuardedConnector>, UpBody>;

/// Dials `host:port` from a URI after the guard resolved and checked it.
#[derive(Clone)]
pub struct GuardedConnector {
    guard: Arc<AddressGuard>,
}

impl tower_service::Service<Uri> for GuardedConnector {
    type Response = TokioIo<TcpStream>;
    type Error = ProxyError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, ProxyError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ProxyError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let guard = self.guard.clone();
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or(ProxyError::BadRequest("upstream URI without host"))?;
            let host =
                Host::parse(host).map_err(|_| ProxyError::BadRequest("invalid upstream host"))?;
            let port = uri
                .port_u16()
                .unwrap_or(if uri.scheme_str() == Some("https") {
                    443
                } else {
                    80
                });
            let addrs = guard.resolve(&host, port).await?;
            connect_any(&addrs).await.map(TokioIo::new)
        })
    }
}

/// Connects to the first address that answers, each with its own timeout.
pub async fn connect_any(addrs: &[SocketAddr]) -> Result<TcpStream, ProxyError> {
    let mut last = ProxyError::upstream("no address to connect to");
    for addr in addrs {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(tcp)) => {
                let _ = tcp.set_nodelay(true);
                return Ok(tcp);
            }
            Ok(Err(e)) => last = ProxyError::upstream(e),
            Err(_) => last = ProxyError::UpstreamTimeout { phase: "connect" },
        }
    }
    Err(last)
}

/// Trust for upstream servers: the public web PKI, plus an operator's extra CAs (a corporate CA,
/// or a test CA).
pub fn client_tls(
    provider: Arc<CryptoProvider>,
    extra_roots: &[CertificateDer<'static>],
) -> Result<ClientConfig, String> {
    let mut roots = RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    for cert in extra_roots {
        roots.add(cert.clone()).map_err(|e| e.to_string())?;
    }
    // No ALPN here: the connector builder sets h2 + http/1.1 itself.
    Ok(ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The pooled upstream clients. The upstream leg follows the client leg: an HTTP/2 client gets
/// an upstream that may negotiate h2 by ALPN (multiplexing end to end), an HTTP/1.1 client gets
/// HTTP/1.1 upstream too, which streams large bodies with less framing work than h2.
pub struct Upstreams {
    /// ALPN h2 + http/1.1.
    pub any: UpstreamClient,
    /// http/1.1 only.
    pub http1: UpstreamClient,
}

impl Upstreams {
    /// Both clients over the same guard and trust.
    pub fn new(guard: Arc<AddressGuard>, tls: ClientConfig) -> Self {
        let builder = || {
            hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(tls.clone())
                .https_or_http()
                .enable_http1()
        };
        let pooled = |https| {
            Client::builder(TokioExecutor::new())
                .http2_adaptive_window(true)
                .timer(TokioTimer::new())
                .pool_timer(TokioTimer::new())
                .pool_idle_timeout(POOL_IDLE_TIMEOUT)
                .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
                .build(https)
        };
        Self {
            any: pooled(builder().enable_http2().wrap_connector(GuardedConnector {
                guard: guard.clone(),
            })),
            http1: pooled(builder().wrap_connector(GuardedConnector { guard })),
        }
    }

    /// The client for a request that arrived with `version`.
    pub fn for_version(&self, version: http::Version) -> &UpstreamClient {
        if version == http::Version::HTTP_2 {
            &self.any
        } else {
            &self.http1
        }
    }
}

/// Finds the gateway's own error inside a client error (the connector's guard or timeout), so
/// that a refused address is a 403 with its reason, not an anonymous 502.
pub fn classify(err: hyper_util::client::legacy::Error) -> ProxyError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&err);
    while let Some(e) = source {
        if let Some(p) = e.downcast_ref::<ProxyError>() {
            return match p {
                ProxyError::Denied(code) => ProxyError::Denied(*code),
                ProxyError::UpstreamTimeout { phase } => ProxyError::UpstreamTimeout { phase },
                ProxyError::Resolve { host, reason } => ProxyError::Resolve {
                    host: host.clone(),
                    reason: reason.clone(),
                },
                _ => ProxyError::upstream(err),
            };
        }
        source = e.source();
    }
    ProxyError::upstream(err)
}

/// A fresh upload counter.
pub fn counter() -> Arc<AtomicU64> {
    Arc::new(AtomicU64::new(0))
}
