//! One HTTP request that the gateway can see (inside a MITM'd tunnel, or plaintext absolute-form):
//! bind it to its destination, decide, inject, send upstream, stream the answer back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, Uri, Version};
use hyper::body::Incoming;
use shared_policy::{Host, Injection};

use super::body::{AuditedBody, Body, CountingBody, PendingAudit};
use super::{Ctx, refuse, upstream};
use crate::audit::AuditRecord;
use crate::error::{DenyCode, ProxyError};
use http_body_util::BodyExt;

/// The upstream has this long to send its response head; the body then streams with no limit.
pub const RESPONSE_HEAD_TIMEOUT: Duration = Duration::from_secs(120);

/// The destination a connection is bound to. Requests on it can never go anywhere else.
#[derive(Debug, Clone)]
pub struct Binding {
    /// Normalised host (the CONNECT authority, or the absolute-form URI's host).
    pub host: Host,
    /// Port.
    pub port: u16,
    /// `true` when the client's side of the connection is TLS (MITM), `false` for plaintext.
    pub tls: bool,
}

impl Binding {
    fn scheme(&self) -> &'static str {
        if self.tls { "https" } else { "http" }
    }

    fn mode(&self) -> &'static str {
        if self.tls { "mitm" } else { "forward" }
    }
}

/// Handles one request end to end; every outcome becomes a response and one audit line.
pub async fn handle(
    req: Request<Incoming>,
    binding: Arc<Binding>,
    ctx: Arc<Ctx>,
) -> Response<Body> {
    let started = Instant::now();
    let mut record = AuditRecord::start(
        &ctx.session,
        binding.mode(),
        req.method().as_str(),
        binding.host.as_str(),
        binding.port,
        // Never the query string: tokens travel there.
        Some(req.uri().path().to_owned()),
    );
    match forward(req, &binding, &ctx, &mut record).await {
        Ok(resp) => resp,
        Err(err) => {
            let resp = refuse(&err, &mut record, started);
            if !matches!(err, ProxyError::Denied(_)) {
                tracing::warn!(host = %binding.host, error = %err, source = ?std::error::Error::source(&err), "request failed");
            }
            ctx.audit.record(&record);
            resp
        }
    }
}

async fn forward(
    req: Request<Incoming>,
    binding: &Binding,
    ctx: &Ctx,
    record: &mut AuditRecord,
) -> Result<Response<Body>, ProxyError> {
    let started = Instant::now();
    check_destination(&req, binding)?;

    // Re-read per request: a tightened policy applies to connections that are already open.
    let policy = ctx.policy.current();
    let decision = policy.decide_request(&binding.host, req.method().as_str());
    record.reason = decision.reason.code();
    record.rule = decision
        .rule
        .and_then(|i| policy.rule_host(i))
        .map(str::to_owned);
    if !decision.allowed {
        return Err(ProxyError::Denied(DenyCode::Policy(decision.reason)));
    }
    // Credentials only travel inside TLS. Forwarding without the credential would surprise the
    // agent with a 401 from the upstream; refusing says why.
    if decision.inject.is_some() && !binding.tls {
        record.reason = DenyCode::TlsRequired.code();
        return Err(ProxyError::Denied(DenyCode::TlsRequired));
    }
    record.injected = decision.inject.as_ref().map(|i| i.header.clone());

    let up = upstream::counter();
    let client = ctx.upstreams.for_version(req.version());
    let upstream_req = build_upstream_request(req, binding, decision.inject.as_ref(), up.clone())?;
    let resp = tokio::time::timeout(RESPONSE_HEAD_TIMEOUT, client.request(upstream_req))
        .await
        .map_err(|_| ProxyError::UpstreamTimeout {
            phase: "response head",
        })?
        .map_err(upstream::classify)?;

    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    record.decision = "allow";
    record.status = Some(parts.status.as_u16());
    let audit = PendingAudit::new(record.clone(), started, up, ctx.audit.clone());
    Ok(Response::from_parts(
        parts,
        AuditedBody::new(body, audit).boxed_unsync(),
    ))
}

/// Destination binding: every authority the request claims (absolute-form URI, `Host` header,
/// h2 `:authority`) must name the bound host, and the port if it gives one. The upstream URI is
/// built from the binding, never from these, so a mismatch could not redirect the request; it is
/// refused anyway, because it means the client is trying to reach another host than the policy
/// checked (and must never be given that host's credential).
fn check_destination(req: &Request<Incoming>, binding: &Binding) -> Result<(), ProxyError> {
    let mismatch = || ProxyError::Denied(DenyCode::HostMismatch);
    let default_port = if binding.tls { 443 } else { 80 };
    let matches = |authority: &str| match Host::parse_authority(authority) {
        Ok((host, port)) => host == binding.host && port.unwrap_or(default_port) == binding.port,
        Err(_) => false,
    };
    let mut claimed = 0;
    if let Some(authority) = req.uri().authority() {
        claimed += 1;
        if !matches(authority.as_str()) {
            return Err(mismatch());
        }
    }
    for value in req.headers().get_all(header::HOST) {
        claimed += 1;
        let text = value.to_str().map_err(|_| mismatch())?;
        if !matches(text) {
            return Err(mismatch());
        }
    }
    if claimed == 0 {
        return Err(mismatch());
    }
    Ok(())
}

fn build_upstream_request(
    req: Request<Incoming>,
    binding: &Binding,
    inject: Option<&Injection>,
    up: Arc<std::sync::atomic::AtomicU64>,
) -> Result<Request<upstream::UpBody>, ProxyError> {
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = Uri::try_from(format!(
        "{}://{}:{}{}",
        binding.scheme(),
        binding.host,
        binding.port,
        path
    ))
    .map_err(|_| ProxyError::BadRequest("cannot build upstream URI"))?;
    // The client sets Host (h1) or :authority (h2) from the URI: the bound destination.
    parts.headers.remove(header::HOST);
    parts.headers.remove(header::PROXY_AUTHORIZATION);
    strip_hop_by_hop(&mut parts.headers);
    if let Some(inject) = inject {
        let name = HeaderName::from_bytes(inject.header.as_bytes())
            .map_err(|_| ProxyError::BadRequest("invalid injected header name"))?;
        let mut value = HeaderValue::from_str(inject.value.expose())
            .map_err(|_| ProxyError::BadRequest("invalid injected header value"))?;
        value.set_sensitive(true);
        // Replace, never append: the sandbox must not be able to add a second credential.
        parts.headers.remove(&name);
        parts.headers.insert(name, value);
    }
    // The pooled client negotiates h1 or h2 itself; HTTP/1.1 is the neutral input for both.
    parts.version = Version::HTTP_11;
    Ok(Request::from_parts(parts, CountingBody::new(body, up)))
}

/// Hop-by-hop headers (RFC 9110 7.6.1) belong to one connection and are not forwarded; the
/// `te: trailers` that gRPC needs is kept.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    let keep_te = headers
        .get(header::TE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    for name in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::TRAILER,
        header::PROXY_AUTHENTICATE,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
    ] {
        headers.remove(name);
    }
    if !keep_te {
        headers.remove(header::TE);
    }
}
