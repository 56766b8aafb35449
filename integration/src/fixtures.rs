//! Fixture upstream servers on loopback: plain HTTP, or HTTPS with a certificate from a test CA
//! made at test start, each speaking HTTP/1.1 and (over TLS, by ALPN) HTTP/2.
//!
//! Routes:
//! - `/echo`: JSON `{"method", "path", "version", "headers": {name: [values]}}` of the request.
//! - `/bytes/N`: N bytes streamed in 64 KiB chunks (downloads without buffering).
//! - `/upload`: reads the body, answers with its length (uploads without buffering).
//! - anything else: `hello from NAME`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures::StreamExt;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

type Body = BoxBody<Bytes, Infallible>;

const CHUNK: usize = 64 * 1024;

/// A test certificate authority, made fresh per test run.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate, PEM.
    pub cert_pem: String,
    /// The CA certificate, DER.
    pub cert_der: CertificateDer<'static>,
    /// The CA key, PEM (PKCS#8).
    pub key_pem: String,
}

impl TestCa {
    /// A new CA with the given common name.
    pub fn new(common_name: &str) -> anyhow::Result<Self> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key)?;
        let key_pem = key.serialize_pem();
        Ok(Self {
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            key_pem,
            issuer: Issuer::new(params, key),
        })
    }

    /// A server certificate and its key (both PEM) for `names`, for servers that read files.
    pub fn leaf_pem(&self, names: &[&str]) -> anyhow::Result<(String, String)> {
        let key = KeyPair::generate()?;
        let params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// A TLS server config for `names` (DNS names or IP literals), ALPN h2 + http/1.1.
    pub fn server_config(&self, names: &[&str]) -> anyhow::Result<rustls::ServerConfig> {
        let key = KeyPair::generate()?;
        let mut params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().copied().unwrap_or("upstream"),
        );
        let cert = params.signed_by(&key, &self.issuer)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )?;
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(cfg)
    }
}

/// A running fixture upstream. Stops when dropped.
pub struct Upstream {
    /// Where it listens (127.0.0.1, random port).
    pub addr: SocketAddr,
    /// Bytes received by `/upload` so far.
    pub uploaded: Arc<AtomicU64>,
    _stop: oneshot::Sender<()>,
}

/// Starts an upstream named `name` (the name shows in its answers); TLS when `tls` is given.
pub async fn start_upstream(
    name: &str,
    tls: Option<rustls::ServerConfig>,
) -> anyhow::Result<Upstream> {
    start_upstream_on("127.0.0.1:0", name, tls).await
}

/// As [`start_upstream`], on a chosen address.
pub async fn start_upstream_on(
    bind: &str,
    name: &str,
    tls: Option<rustls::ServerConfig>,
) -> anyhow::Result<Upstream> {
    let listener = TcpListener::bind(bind).await?;
    let addr = listener.local_addr()?;
    let (stop, mut stopped) = oneshot::channel();
    let uploaded = Arc::new(AtomicU64::new(0));
    let acceptor = tls.map(|cfg| tokio_rustls::TlsAcceptor::from(Arc::new(cfg)));
    let name: Arc<str> = name.into();
    let counter = uploaded.clone();
    tokio::spawn(async move {
        loop {
            let tcp = tokio::select! {
                _ = &mut stopped => break,
                accepted = listener.accept() => match accepted { Ok((tcp, _)) => tcp, Err(_) => continue },
            };
            let _ = tcp.set_nodelay(true);
            let (name, counter, acceptor) = (name.clone(), counter.clone(), acceptor.clone());
            tokio::spawn(async move {
                let service = service_fn(move |req| handle(req, name.clone(), counter.clone()));
                let builder = auto::Builder::new(TokioExecutor::new());
                match acceptor {
                    Some(acceptor) => {
                        if let Ok(tls) = acceptor.accept(tcp).await {
                            let _ = builder.serve_connection(TokioIo::new(tls), service).await;
                        }
                    }
                    None => {
                        let _ = builder.serve_connection(TokioIo::new(tcp), service).await;
                    }
                }
            });
        }
    });
    Ok(Upstream {
        addr,
        uploaded,
        _stop: stop,
    })
}

async fn handle(
    req: Request<Incoming>,
    name: Arc<str>,
    uploaded: Arc<AtomicU64>,
) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_owned();
    let version = format!("{:?}", req.version());
    let resp = if path == "/echo" {
        let mut headers: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (k, v) in req.headers() {
            headers
                .entry(k.as_str().to_owned())
                .or_default()
                .push(String::from_utf8_lossy(v.as_bytes()).into_owned());
        }
        let body = serde_json::json!({
            "upstream": &*name, "method": req.method().as_str(), "path": path, "version": version, "headers": headers,
        });
        full(body.to_string())
    } else if let Some(n) = path
        .strip_prefix("/bytes/")
        .and_then(|n| n.parse::<u64>().ok())
    {
        streamed(n)
    } else if path == "/upload" {
        let mut body = req.into_body();
        let mut n = 0u64;
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(f) => {
                    if let Some(d) = f.data_ref() {
                        n += d.len() as u64;
                        uploaded.fetch_add(d.len() as u64, Ordering::Relaxed);
                    }
                }
                Err(_) => break,
            }
        }
        full(n.to_string())
    } else {
        full(format!("hello from {name}"))
    };
    let mut resp = resp;
    if let Ok(v) = http::HeaderValue::from_str(&version) {
        resp.headers_mut().insert("x-upstream-version", v);
    }
    Ok(resp)
}

fn full(text: String) -> Response<Body> {
    Response::new(Full::new(Bytes::from(text)).boxed())
}

/// `n` bytes in 64 KiB chunks, produced as the client reads them.
fn streamed(n: u64) -> Response<Body> {
    let chunk = Bytes::from(vec![b'x'; CHUNK]);
    let chunks = n.div_ceil(CHUNK as u64);
    let stream = futures::stream::iter(0..chunks).map(move |i| {
        let len = if i + 1 == chunks {
            n - i * CHUNK as u64
        } else {
            CHUNK as u64
        };
        Ok::<_, Infallible>(Frame::data(chunk.slice(..len as usize)))
    });
    let mut resp = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    if let Ok(v) = http::HeaderValue::from_str(&n.to_string()) {
        resp.headers_mut().insert(http::header::CONTENT_LENGTH, v);
    }
    resp
}

/// Resident set size of this process, from `/proc/self/status` (kB -> bytes).
pub fn rss_bytes() -> Option<u64> {
    rss_of("self")
}

/// Resident set size of process `pid` (`"self"` for this one).
pub fn rss_of(pid: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
