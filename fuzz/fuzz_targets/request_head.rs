//! The gateway's request-head handling: raw HTTP/1.1 bytes through hyper's server (configured
//! as the gateway's: `MAX_BUF_SIZE`), then the gateway's routing, destination binding
//! (`request::check_destination`), policy decision and upstream request
//! (`request::build_upstream_request`).
//!
//! Input: byte 0 = mode (bit 0: MITM, the connection bound to the CONNECT authority on the first
//! line; otherwise plaintext absolute-form, bound per request; bits 1-2: which policy), then the
//! stream. Invariants, beyond "no panic":
//! - a request passes the destination check only if it names its destination at least once and
//!   every authority it claims (URI, each `Host`) is the bound host and port;
//! - the upstream request of a request that passed is always built, goes to the bound scheme,
//!   host and port with the client's path and query, and carries no `Host`,
//!   `Proxy-Authorization`, hop-by-hop header or header the client listed in `Connection`
//!   (but `te: trailers`); an injected credential appears exactly once, marked sensitive;
//! - decisions are deterministic.
#![no_main]

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};

use daiv_sandbox_fuzz::split_once;
use egress_gateway::proxy::request::{self, Binding};
use egress_gateway::proxy::{MAX_BUF_SIZE, upstream};
use egress_gateway::{DenyCode, ProxyError};
use http::{Method, Request, Response, header};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use libfuzzer_sys::fuzz_target;
use shared_policy::{Evaluator, Host};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
    })
}

fn policies() -> &'static [Arc<Evaluator>; 4] {
    static P: OnceLock<[Arc<Evaluator>; 4]> = OnceLock::new();
    P.get_or_init(|| {
        let load = |doc: serde_json::Value| {
            Arc::new(Evaluator::from_json(doc.to_string().as_bytes()).expect("policy"))
        };
        [
            load(serde_json::json!({
                "policy": {"default": "deny", "rules": [
                    {"host": "example.com", "methods": ["GET", "POST"], "inject": "tok"},
                    {"host": "*.github.com"},
                    {"host": "api.test", "methods": ["POST"], "paths": ["/api/**"], "inject": "gl"},
                    {"host": "10.0.0.1"},
                    {"host": "[::1]", "methods": ["GET"]}
                ]},
                "secrets": {
                    "tok": {"header": "Authorization", "value": "Bearer s3cret"},
                    "gl": {"header": "PRIVATE-TOKEN", "value": "glpat"}
                },
                "version": "v1"
            })),
            load(serde_json::json!({
                "policy": {"default": "allow", "intercept": "credentialed", "rules": [
                    {"host": "example.com", "methods": ["GET"]}
                ]}
            })),
            Arc::new(Evaluator::deny_all()),
            load(serde_json::json!({
                "policy": {"default": "allow", "mode": "shadow", "rules": [
                    {"host": "*", "methods": ["GET"], "paths": ["/ok/*"], "inject": "tok"}
                ]},
                "secrets": {"tok": {"header": "X-Token", "value": "t"}}
            })),
        ]
    })
}

/// What the gateway's `route` and `connect::target` do before `request::handle`.
fn bind(req: &Request<Incoming>, mitm: Option<&(Host, u16)>) -> Option<Binding> {
    if let Some((host, port)) = mitm {
        return Some(Binding {
            host: host.clone(),
            port: *port,
            tls: true,
            client: None,
        });
    }
    let uri = req.uri();
    match (uri.scheme_str(), uri.host()) {
        (Some("http"), Some(host)) => Host::parse(host).ok().map(|host| Binding {
            host,
            port: uri.port_u16().unwrap_or(80),
            tls: false,
            client: None,
        }),
        _ => None,
    }
}

const HOP_BY_HOP: &[&str] = &[
    "connection",
    "transfer-encoding",
    "upgrade",
    "trailer",
    "proxy-authenticate",
    "keep-alive",
    "proxy-connection",
];

fn handle(req: Request<Incoming>, mitm: Option<&(Host, u16)>, policy: &Evaluator) {
    if req.method() == Method::CONNECT {
        if let Some(a) = req.uri().authority() {
            let _ = Host::parse_authority(a.as_str());
        }
        return;
    }
    let Some(binding) = bind(&req, mitm) else {
        return;
    };
    let default_port = if binding.tls { 443 } else { 80 };
    let names_binding = |authority: &str| {
        Host::parse_authority(authority)
            .is_ok_and(|(h, p)| h == binding.host && p.unwrap_or(default_port) == binding.port)
    };
    let mut claims: Vec<Option<String>> = Vec::new();
    if let Some(a) = req.uri().authority() {
        claims.push(Some(a.as_str().to_owned()));
    }
    for v in req.headers().get_all(header::HOST) {
        claims.push(v.to_str().ok().map(str::to_owned));
    }
    let honest = !claims.is_empty()
        && claims
            .iter()
            .all(|c| c.as_deref().is_some_and(names_binding));
    match request::check_destination(&req, &binding) {
        Ok(()) => assert!(
            honest,
            "destination check passed: {claims:?} for {}:{}",
            binding.host, binding.port
        ),
        Err(ProxyError::Denied(DenyCode::HostMismatch)) => {
            assert!(
                !honest,
                "destination check refused {claims:?} for {}:{}",
                binding.host, binding.port
            );
            return;
        }
        Err(e) => panic!("destination check: unexpected {e:?}"),
    }

    let path = req.uri().path().to_owned();
    let decision = policy.decide_http(&binding.host, req.method().as_str(), Some(&path));
    assert_eq!(
        decision,
        policy.decide_http(&binding.host, req.method().as_str(), Some(&path))
    );
    let listed: Vec<String> = req
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect();
    let pq = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let inject = decision.inject.clone();
    let up = request::build_upstream_request(req, &binding, inject.as_ref(), upstream::counter())
        .unwrap_or_else(|e| panic!("upstream request not built: {e:?}"));

    let uri = up.uri();
    let scheme = if binding.tls { "https" } else { "http" };
    assert_eq!(uri.scheme_str(), Some(scheme));
    let host = uri.host().expect("upstream host");
    assert_eq!(
        Host::parse(host).as_ref(),
        Ok(&binding.host),
        "upstream host {host}"
    );
    assert_eq!(uri.port_u16(), Some(binding.port));
    assert_eq!(uri.path_and_query().map(|p| p.as_str()), Some(pq.as_str()));
    assert_eq!(up.version(), http::Version::HTTP_11);
    let h = up.headers();
    assert!(h.get(header::HOST).is_none(), "Host forwarded");
    assert!(
        h.get(header::PROXY_AUTHORIZATION).is_none(),
        "Proxy-Authorization forwarded"
    );
    for name in HOP_BY_HOP {
        assert!(h.get(*name).is_none(), "{name} forwarded");
    }
    // Only `te: trailers` may pass, once (regressions/request_head/te-trailers-then-other).
    let te: Vec<_> = h.get_all(header::TE).iter().collect();
    assert!(
        te.len() <= 1 && te.iter().all(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers")),
        "te: {te:?} forwarded"
    );
    let injected = inject.as_ref().map(|i| i.header.to_ascii_lowercase());
    for name in &listed {
        if Some(name) != injected.as_ref() && name != "te" {
            assert!(
                h.get(name.as_str()).is_none(),
                "{name} (listed in Connection) forwarded"
            );
        }
    }
    if let Some(i) = &inject {
        let values: Vec<_> = h.get_all(i.header.as_str()).iter().collect();
        assert_eq!(
            values.len(),
            1,
            "credential header {} has {} values",
            i.header,
            values.len()
        );
        assert_eq!(values[0].as_bytes(), i.value.expose().as_bytes());
        assert!(values[0].is_sensitive());
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let policy = policies()[usize::from(mode >> 1) & 3].clone();
    let (mitm, stream) = if mode & 1 == 1 {
        let (line, stream) = split_once(rest, b'\n');
        let Ok(line) = std::str::from_utf8(line) else {
            return;
        };
        // `connect::target`: the port is required.
        let Ok((host, Some(port))) = Host::parse_authority(line.trim_end_matches('\r')) else {
            return;
        };
        (Some(Arc::new((host, port))), stream)
    } else {
        (None, rest)
    };

    runtime().block_on(async move {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let service = service_fn(move |req: Request<Incoming>| {
            let (mitm, policy) = (mitm.clone(), policy.clone());
            async move {
                handle(req, mitm.as_deref(), &policy);
                Ok::<_, Infallible>(Response::new(String::new()))
            }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .max_buf_size(MAX_BUF_SIZE)
            .serve_connection(TokioIo::new(server), service)
            .with_upgrades();
        let talk = async move {
            let _ = client.write_all(stream).await;
            let _ = client.shutdown().await;
            let mut sink = Vec::new();
            let _ = client.read_to_end(&mut sink).await;
        };
        let (_, ()) = tokio::join!(conn, talk);
    });
});
