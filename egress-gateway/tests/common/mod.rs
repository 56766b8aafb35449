//! In-process gateway + loopback fixture upstreams + real clients. Names under `.test` are
//! mapped to 127.0.0.1 by the gateway's static-host table; nothing leaves the machine.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_gateway::audit::MemorySink;
use egress_gateway::{Gateway, GatewayConfig, Limits};
use integration::fixtures::{TestCa, Upstream, start_upstream};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

pub const LOOPBACK: &str = "127.0.0.0/8";

/// Names every test upstream answers to (its certificate lists them all).
pub const UPSTREAM_NAMES: &[&str] = &[
    "upstream.test",
    "other.test",
    "api.upstream.test",
    "127.0.0.1",
];

pub struct Harness {
    pub gateway: SocketAddr,
    /// The health listener (the version, the acknowledgement), apart from the proxy port.
    pub health: SocketAddr,
    pub gateway_ca: TestCa,
    pub upstream_ca: TestCa,
    pub https: Upstream,
    pub http: Upstream,
    pub audit: Arc<MemorySink>,
    pub policy_path: PathBuf,
    pub dir: tempfile::TempDir,
    /// The metrics endpoint, when [`Options::metrics`] asked for one.
    pub metrics: Option<SocketAddr>,
    _stop: oneshot::Sender<()>,
}

pub struct Options {
    pub allowed_cidrs: Vec<&'static str>,
    pub static_hosts: bool,
    pub limits: Limits,
    pub shadow: bool,
    pub metrics: bool,
    pub upstream_proxy: Option<String>,
    /// `--plain-http-hosts`.
    pub plain_http_hosts: Vec<&'static str>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            allowed_cidrs: vec![LOOPBACK],
            static_hosts: true,
            limits: Limits::default(),
            shadow: false,
            metrics: false,
            upstream_proxy: None,
            plain_http_hosts: Vec::new(),
        }
    }
}

pub async fn start(policy: serde_json::Value) -> Harness {
    start_with(policy, Options::default()).await
}

pub async fn start_with(policy: serde_json::Value, opts: Options) -> Harness {
    let gateway_ca = TestCa::new("test gateway ca").expect("gateway ca");
    let upstream_ca = TestCa::new("test upstream ca").expect("upstream ca");
    let https = start_upstream(
        "https-upstream",
        Some(upstream_ca.server_config(UPSTREAM_NAMES).expect("cert")),
    )
    .await
    .expect("https upstream");
    let http = start_upstream("http-upstream", None)
        .await
        .expect("http upstream");
    let dir = tempfile::tempdir().expect("tempdir");
    let policy_path = dir.path().join("config.json");
    write_policy(&policy_path, &policy.to_string());
    let mut static_hosts: HashMap<String, Vec<IpAddr>> = HashMap::new();
    if opts.static_hosts {
        for name in UPSTREAM_NAMES.iter().filter(|n| !n.starts_with("127")) {
            static_hosts.insert((*name).to_owned(), vec![IpAddr::from([127, 0, 0, 1])]);
        }
    }
    let audit = MemorySink::new();
    let config = GatewayConfig {
        policy_path: policy_path.clone(),
        ca_cert_pem: gateway_ca.cert_pem.clone(),
        ca_key_pem: gateway_ca.key_pem.clone(),
        extra_roots: vec![upstream_ca.cert_der.clone()],
        allowed_cidrs: opts
            .allowed_cidrs
            .iter()
            .map(|c| c.parse().expect("cidr"))
            .collect(),
        static_hosts,
        session_id: "test-session".into(),
        audit: audit.clone(),
        limits: opts.limits,
        shadow: opts.shadow,
        upstream_proxy: opts
            .upstream_proxy
            .as_deref()
            .map(|u| egress_gateway::proxy::upstream::UpstreamProxy::parse(u).expect("proxy url")),
        plain_http_hosts: opts
            .plain_http_hosts
            .iter()
            .map(|h| shared_policy::sidecar::PlainHttpHost::parse(h).expect("plain http host"))
            .collect(),
    };
    let gw = Gateway::new(config).expect("gateway");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let gateway = listener.local_addr().expect("addr");
    let health_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind health");
    let health = health_listener.local_addr().expect("addr");
    let metrics = if opts.metrics {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind metrics");
        let addr = l.local_addr().expect("addr");
        tokio::spawn(egress_gateway::metrics::serve(
            l,
            gw.scrape(),
            std::future::pending(),
        ));
        Some(addr)
    } else {
        None
    };
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(gw.serve(listener, health_listener, async move {
        let _ = stopped.await;
    }));
    Harness {
        gateway,
        health,
        gateway_ca,
        upstream_ca,
        https,
        http,
        audit,
        policy_path,
        dir,
        metrics,
        _stop: stop,
    }
}

/// Atomic replace, as the control plane writes it: temp file in the same dir, then rename.
pub fn write_policy(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write temp policy");
    std::fs::rename(&tmp, path).expect("rename policy");
}

pub enum Trust {
    Gateway,
    Upstream,
    Both,
}

impl Harness {
    pub fn https_url(&self, host: &str, path: &str) -> String {
        format!("https://{host}:{}{path}", self.https.addr.port())
    }

    pub fn http_url(&self, host: &str, path: &str) -> String {
        format!("http://{host}:{}{path}", self.http.addr.port())
    }

    /// A reqwest client through the gateway. No built-in roots: only what the test trusts.
    pub fn client(&self, trust: Trust, http1_only: bool) -> reqwest::Client {
        let cert = |der: &rustls::pki_types::CertificateDer<'static>| {
            reqwest::Certificate::from_der(der.as_ref()).expect("cert")
        };
        let mut b = reqwest::Client::builder()
            .proxy(reqwest::Proxy::all(format!("http://{}", self.gateway)).expect("proxy"))
            .tls_built_in_root_certs(false)
            .timeout(Duration::from_secs(60));
        if matches!(trust, Trust::Gateway | Trust::Both) {
            b = b.add_root_certificate(cert(&self.gateway_ca.cert_der));
        }
        if matches!(trust, Trust::Upstream | Trust::Both) {
            b = b.add_root_certificate(cert(&self.upstream_ca.cert_der));
        }
        if http1_only {
            b = b.http1_only();
        }
        b.build().expect("client")
    }

    pub fn audit_lines(&self) -> Vec<serde_json::Value> {
        self.audit
            .lines()
            .iter()
            .map(|l| serde_json::from_str(l).expect("audit line is JSON"))
            .collect()
    }

    /// Sends a raw CONNECT and returns (status, headers text, the stream).
    pub async fn raw_connect(&self, authority: &str) -> (u16, String, TcpStream) {
        let mut tcp = TcpStream::connect(self.gateway)
            .await
            .expect("connect gateway");
        tcp.write_all(
            format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes(),
        )
        .await
        .expect("write");
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            let n = tcp.read(&mut byte).await.expect("read");
            assert!(
                n > 0,
                "gateway closed during CONNECT response: {:?}",
                String::from_utf8_lossy(&head)
            );
            head.push(byte[0]);
        }
        let text = String::from_utf8_lossy(&head).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("status");
        (status, text.to_ascii_lowercase(), tcp)
    }

    /// TLS over an established CONNECT with a chosen SNI, trusting the gateway CA (h1 ALPN).
    pub async fn tls_over(
        &self,
        tcp: TcpStream,
        sni: &str,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.gateway_ca.cert_der.clone()).expect("root");
        roots.add(self.upstream_ca.cert_der.clone()).expect("root");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let name = ServerName::try_from(sni.to_owned()).expect("server name");
        tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect(name, tcp)
            .await
    }
}

/// Polls `check` until it returns true or `timeout` passes.
pub async fn eventually<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

pub fn denied_code(resp: &reqwest::Response) -> Option<String> {
    resp.headers()
        .get("x-egress-denied")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}
