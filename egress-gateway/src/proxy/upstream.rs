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

use crate::body::CountingBody;
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

/// HTTP/2 flow-control window the gateway grants an upstream per stream. Fixed, not adaptive:
/// hyper's adaptive window grows to 16 MiB, and what an upstream sends beyond what the client has
/// read waits in the gateway's memory. Equal to what the client side buffers per stream
/// (`mitm::H2_SEND_BUFFER`), so a download holds at most about twice that in the gateway; 1 MiB
/// per round trip still carries ~100 MiB/s at 10 ms.
pub const H2_STREAM_WINDOW: u32 = 1024 * 1024;
/// The HTTP/2 connection window towards an upstream: a few concurrent streams' worth.
pub const H2_CONNECTION_WINDOW: u32 = 4 * 1024 * 1024;
/// Largest HTTP/2 frame the gateway accepts from an upstream (`SETTINGS_MAX_FRAME_SIZE`), above
/// the 16 KiB default: with 16 KiB frames every DATA frame (9-byte header + 16 KiB) spans two TLS
/// records, one of them 9 bytes, so the gateway decrypts and parses twice as many records as the
/// data needs. 64 KiB frames carry four full records each; a frame is buffered whole before it
/// is forwarded, so this is also the per-connection read buffer bound.
pub const H2_MAX_FRAME_SIZE: u32 = 64 * 1024;

/// The upstream proxy's CONNECT answer must arrive within this.
pub const PROXY_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A proxy's CONNECT response head larger than this is refused.
const MAX_PROXY_HEAD: usize = 16 * 1024;

/// A corporate HTTP proxy that every upstream connection goes through
/// (`--upstream-proxy http://[user:password@]host:port`). The gateway still resolves and checks
/// the destination itself (the SSRF guard), and asks the proxy to `CONNECT` to the checked
/// address, never to a name the proxy would resolve again. The proxy's own address is the
/// operator's and is not subject to the guard.
#[derive(Clone)]
pub struct UpstreamProxy {
    /// `host:port` of the proxy.
    pub addr: String,
    /// `Proxy-Authorization` value (`Basic ...`), from the URL's user info.
    authorization: Option<String>,
}

impl std::fmt::Debug for UpstreamProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamProxy")
            .field("addr", &self.addr)
            .field("authorization", &self.authorization.as_ref().map(|_| "***"))
            .finish()
    }
}

impl UpstreamProxy {
    /// Parses `http://[user:password@]host:port` (the port defaults to 3128, `http` is the only
    /// scheme: the gateway talks to the proxy in plaintext, the tunnelled TLS stays end to end).
    pub fn parse(url: &str) -> Result<Self, String> {
        let uri: Uri = url.parse().map_err(|_| format!("{url:?} is not a URL"))?;
        if uri.scheme_str() != Some("http") {
            return Err("the upstream proxy URL must start with http://".to_owned());
        }
        let authority = uri
            .authority()
            .ok_or_else(|| "the upstream proxy URL needs a host".to_owned())?;
        let (userinfo, hostport) = match authority.as_str().rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority.as_str()),
        };
        let addr = if authority.port_u16().is_some() {
            hostport.to_owned()
        } else {
            format!("{hostport}:3128")
        };
        let authorization = userinfo.map(|u| {
            use base64::Engine;
            let decoded = percent_decode(u);
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(decoded)
            )
        });
        Ok(Self {
            addr,
            authorization,
        })
    }

    /// A tunnel through the proxy to `target` (an address the guard checked).
    pub async fn dial(&self, target: SocketAddr) -> Result<TcpStream, ProxyError> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let timed_out = |phase| ProxyError::UpstreamTimeout { phase };
        let mut tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&self.addr))
            .await
            .map_err(|_| timed_out("upstream proxy connect"))?
            .map_err(ProxyError::upstream)?;
        super::set_nodelay(&tcp);
        let mut head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
        if let Some(auth) = &self.authorization {
            head.push_str(&format!("Proxy-Authorization: {auth}\r\n"));
        }
        head.push_str("\r\n");
        let answer = async {
            tcp.write_all(head.as_bytes()).await?;
            // Byte by byte: nothing after the head may be consumed (it belongs to the tunnel).
            let mut got = Vec::with_capacity(128);
            let mut byte = [0u8; 1];
            while !got.ends_with(b"\r\n\r\n") {
                if tcp.read(&mut byte).await? == 0 || got.len() > MAX_PROXY_HEAD {
                    return Err(std::io::Error::other(
                        "upstream proxy closed during CONNECT",
                    ));
                }
                got.push(byte[0]);
            }
            Ok(got)
        };
        let got = tokio::time::timeout(PROXY_CONNECT_TIMEOUT, answer)
            .await
            .map_err(|_| timed_out("upstream proxy CONNECT"))?
            .map_err(ProxyError::upstream)?;
        let status = String::from_utf8_lossy(&got)
            .split_whitespace()
            .nth(1)
            .map(str::to_owned)
            .unwrap_or_default();
        if status != "200" {
            return Err(ProxyError::upstream(format!(
                "upstream proxy answered {status:?} to CONNECT"
            )));
        }
        Ok(tcp)
    }
}

/// `%XX` sequences decoded (user info in a URL).
fn percent_decode(s: &str) -> Vec<u8> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b, hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// Dials `host:port` from a URI after the guard resolved and checked it.
#[derive(Clone)]
pub struct GuardedConnector {
    guard: Arc<AddressGuard>,
    proxy: Option<Arc<UpstreamProxy>>,
    /// Which addresses the guard accepts.
    reach: Reach,
}

/// The addresses a connector may dial.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reach {
    /// Global ones, and `--allowed-cidrs` ([`AddressGuard::resolve`]).
    Guarded,
    /// Private networks only ([`AddressGuard::resolve_private`]): the plain-HTTP opt-in.
    PrivateNetwork,
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
        let proxy = self.proxy.clone();
        let reach = self.reach;
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
            let addrs = match reach {
                Reach::Guarded => guard.resolve(&host, port).await?,
                Reach::PrivateNetwork => guard.resolve_private(&host, port).await?,
            };
            connect_any(&addrs, proxy.as_deref())
                .await
                .map(TokioIo::new)
        })
    }
}

/// Connects to the first address that answers, each with its own timeout; through `proxy`
/// when one is configured.
pub async fn connect_any(
    addrs: &[SocketAddr],
    proxy: Option<&UpstreamProxy>,
) -> Result<TcpStream, ProxyError> {
    let mut last = ProxyError::upstream("no address to connect to");
    for addr in addrs {
        if let Some(proxy) = proxy {
            match proxy.dial(*addr).await {
                Ok(tcp) => return Ok(tcp),
                Err(e) => {
                    last = e;
                    continue;
                }
            }
        }
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(tcp)) => {
                super::set_nodelay(&tcp);
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
    /// Plaintext requests under the plain-HTTP opt-in: dials private networks only, so a
    /// credential sent in clear stays on them. A pool of its own, never shared with the others.
    pub private_plain: UpstreamClient,
    /// Where upstream connections go through, if anywhere (blind tunnels use it too).
    pub proxy: Option<Arc<UpstreamProxy>>,
}

impl Upstreams {
    /// Both clients over the same guard and trust, and optionally an upstream proxy.
    pub fn new(
        guard: Arc<AddressGuard>,
        tls: ClientConfig,
        proxy: Option<Arc<UpstreamProxy>>,
    ) -> Self {
        let builder = || {
            hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(tls.clone())
                .https_or_http()
                .enable_http1()
        };
        let pooled = |https| {
            Client::builder(TokioExecutor::new())
                .http2_initial_stream_window_size(H2_STREAM_WINDOW)
                .http2_initial_connection_window_size(H2_CONNECTION_WINDOW)
                .http2_max_frame_size(H2_MAX_FRAME_SIZE)
                .timer(TokioTimer::new())
                .pool_timer(TokioTimer::new())
                .pool_idle_timeout(POOL_IDLE_TIMEOUT)
                .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
                .build(https)
        };
        let connector = |reach| GuardedConnector {
            guard: guard.clone(),
            proxy: proxy.clone(),
            reach,
        };
        Self {
            any: pooled(
                builder()
                    .enable_http2()
                    .wrap_connector(connector(Reach::Guarded)),
            ),
            http1: pooled(builder().wrap_connector(connector(Reach::Guarded))),
            private_plain: pooled(builder().wrap_connector(connector(Reach::PrivateNetwork))),
            proxy,
        }
    }

    /// The client for a request that arrived with `version`; `plain_http` for a plaintext
    /// request under the plain-HTTP opt-in.
    pub fn for_request(&self, version: http::Version, plain_http: bool) -> &UpstreamClient {
        if plain_http {
            &self.private_plain
        } else if version == http::Version::HTTP_2 {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Both ends the gateway owns have Nagle off: upstream sockets here, accepted ones in `serve`.
    #[tokio::test]
    async fn upstream_and_accepted_sockets_have_nodelay() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let dialled = connect_any(&[addr], None).await.expect("connect");
        assert!(dialled.nodelay().expect("nodelay"));
        let (accepted, _) = listener.accept().await.expect("accept");
        super::super::set_nodelay(&accepted);
        assert!(accepted.nodelay().expect("nodelay"));
    }
}
