//! One HTTP request that the gateway can see (inside a MITM'd tunnel, or plaintext absolute-form):
//! bind it to its destination, decide, inject, send upstream, stream the answer back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, Uri, Version};
use hyper::body::Incoming;
use shared_policy::{Host, Injection};
use tokio::sync::watch;

use super::{Ctx, refuse, upstream};
use crate::audit::AuditRecord;
use crate::body::{AuditedBody, Body, CountingBody, PendingAudit};
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
    /// The client connection (its slot and activity clock), kept by an upgraded (WebSocket)
    /// exchange that outlives the HTTP connection it came from.
    pub client: Option<Arc<super::ClientConn>>,
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
    let json = super::wants_json(req.headers());
    match forward(req, &binding, &ctx, &mut record).await {
        Ok(resp) => resp,
        Err(err) => {
            let resp = refuse(&err, &mut record, started, json);
            if !matches!(err, ProxyError::Denied(_)) {
                tracing::warn!(host = %binding.host, error = %err, source = ?std::error::Error::source(&err), "request failed");
            }
            ctx.audit.record(&record);
            resp
        }
    }
}

async fn forward(
    mut req: Request<Incoming>,
    binding: &Binding,
    ctx: &Arc<Ctx>,
    record: &mut AuditRecord,
) -> Result<Response<Body>, ProxyError> {
    let started = Instant::now();
    // The operator's plain-HTTP opt-in (development stacks): said on every audit line of such
    // an exchange, whatever its outcome.
    let plain_http = !binding.tls && ctx.plain_http(&binding.host, binding.port);
    record.plain_http_opt_in = plain_http;
    check_destination(&req, binding)?;

    // A WebSocket handshake (HTTP/1.1 Upgrade) is decided like any request; once upgraded it
    // is re-checked on every reload, so it listens for them from before the policy is read.
    let websocket = websocket_protocol(&req);
    let changes = websocket.as_ref().map(|_| ctx.policy.subscribe());
    // Re-read per request: a tightened policy applies to connections that are already open.
    let policy = ctx.policy.current();
    let decision = policy.decide_http(&binding.host, req.method().as_str(), Some(req.uri().path()));
    let (allowed, reason, rule) = (decision.allowed, decision.reason, decision.rule);
    if !super::verdict(ctx, &policy, record, allowed, reason, rule)? {
        // Shadow mode: recorded as the denial it would be, sent on without any credential (a
        // denied decision carries none).
        record.decision = "deny";
    }
    // Credentials only travel inside TLS. Forwarding without the credential would surprise the
    // agent with a 401 from the upstream; refusing says why. The exception is the operator's
    // plain-HTTP opt-in: such a host is dialled on private networks only (`private_plain`), so
    // its credential, in clear, stays on them.
    if decision.inject.is_some() && !binding.tls && !plain_http {
        record.reason = DenyCode::TlsRequired.code();
        return Err(ProxyError::Denied(DenyCode::TlsRequired));
    }
    // An origin answers TRACE (and IIS's TRACK) with the request it received, injected header
    // included: the sandbox would read the credential it must never see.
    if decision.inject.is_some() && is_echo_method(req.method()) {
        record.reason = DenyCode::CredentialEcho.code();
        return Err(ProxyError::Denied(DenyCode::CredentialEcho));
    }
    record.injected = decision.inject.as_ref().map(|i| i.header.clone());

    // A WebSocket handshake: the upgrade headers are carried upstream, and on a 101 both sides
    // are spliced.
    let client_upgrade = websocket.as_ref().map(|_| hyper::upgrade::on(&mut req));
    let handshake = websocket.as_ref().map(|_| Handshake {
        method: req.method().as_str().to_owned(),
        path: req.uri().path().to_owned(),
        injected: decision.inject.clone(),
    });
    let up = upstream::counter();
    let client = ctx.upstreams.for_request(req.version(), plain_http);
    let mut upstream_req =
        build_upstream_request(req, binding, decision.inject.as_ref(), up.clone())?;
    if let Some(protocol) = &websocket {
        let headers = upstream_req.headers_mut();
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, protocol.clone());
    }
    let sent = Instant::now();
    let resp = tokio::time::timeout(RESPONSE_HEAD_TIMEOUT, client.request(upstream_req))
        .await
        .map_err(|_| ProxyError::UpstreamTimeout {
            phase: "response head",
        })?
        .map_err(upstream::classify)?;
    ctx.metrics.upstream_latency(sent.elapsed());
    let mut resp = resp;
    if let (Some(client_upgrade), Some(handshake), Some(changes)) =
        (client_upgrade, handshake, changes)
        && resp.status() == http::StatusCode::SWITCHING_PROTOCOLS
    {
        let upstream_upgrade = hyper::upgrade::on(&mut resp);
        let protocol = resp.headers().get(header::UPGRADE).cloned();
        let (mut parts, _) = resp.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        if let Some(protocol) = protocol {
            parts.headers.insert(header::UPGRADE, protocol);
        }
        if record.enforced {
            record.decision = "allow";
        }
        record.status = Some(parts.status.as_u16());
        let splice = Splice {
            record: record.clone(),
            started,
            client: binding.client.clone(),
            host: binding.host.clone(),
            handshake,
            changes,
        };
        ctx.tasks
            .spawn(splice.run(client_upgrade, upstream_upgrade, ctx.clone()));
        return Ok(Response::from_parts(parts, crate::body::empty()));
    }

    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    if record.enforced {
        record.decision = "allow";
    }
    record.status = Some(parts.status.as_u16());
    let audit = PendingAudit::new(record.clone(), started, up, ctx.audit.clone());
    Ok(Response::from_parts(
        parts,
        AuditedBody::new(body, audit).boxed_unsync(),
    ))
}

/// The `Upgrade` protocol of an HTTP/1.1 WebSocket handshake (`Connection: upgrade` and
/// `Upgrade: websocket`), if this is one. Other upgrades (h2c, ...) are not carried.
fn websocket_protocol(req: &Request<Incoming>) -> Option<HeaderValue> {
    if req.version() != Version::HTTP_11 {
        return None;
    }
    let connection_upgrade = req
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    let upgrade = req.headers().get(header::UPGRADE)?;
    (connection_upgrade && upgrade.as_bytes().eq_ignore_ascii_case(b"websocket"))
        .then(|| upgrade.clone())
}

/// An upgraded exchange: both sides' connections, spliced until either closes, the client
/// connection idles out, or a policy reload revokes it; its audit line (with the byte counts)
/// is written at the end.
struct Splice {
    record: AuditRecord,
    started: Instant,
    client: Option<Arc<super::ClientConn>>,
    /// The bound host.
    host: Host,
    /// What the handshake was decided on, to decide it again on a reload.
    handshake: Handshake,
    /// Policy reloads since the handshake was decided.
    changes: watch::Receiver<u64>,
}

/// The parts of a WebSocket handshake its decision depends on.
struct Handshake {
    method: String,
    path: String,
    /// The credential it was opened with.
    injected: Option<Injection>,
}

/// Why the splice loop stopped.
enum Ended {
    /// Either side closed (or failed).
    Closed,
    /// No byte moved for the idle timeout.
    Idle,
    /// A reload: the current policy would not allow the exchange as it was opened.
    Revoked(DenyCode),
}

impl Splice {
    async fn run(
        mut self,
        client: hyper::upgrade::OnUpgrade,
        upstream: hyper::upgrade::OnUpgrade,
        ctx: Arc<Ctx>,
    ) {
        match tokio::try_join!(client, upstream) {
            Ok((c, u)) => {
                // Counted on the client side, so a close without TLS close_notify (an error for
                // the copy) still leaves the byte counts.
                let mut c = super::io::Metered::new(hyper_util::rt::TokioIo::new(c), None);
                let mut u = hyper_util::rt::TokioIo::new(u);
                let ended = {
                    let copy = tokio::io::copy_bidirectional(&mut c, &mut u);
                    tokio::pin!(copy);
                    let idle_out = async {
                        match &self.client {
                            Some(conn) => conn.activity.idle_for(ctx.limits.idle_timeout).await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::pin!(idle_out);
                    let mut watching = true;
                    loop {
                        tokio::select! {
                            res = &mut copy => {
                                if let Err(error) = res {
                                    tracing::debug!(%error, "websocket closed with an error");
                                }
                                break Ended::Closed;
                            }
                            () = &mut idle_out => break Ended::Idle,
                            changed = self.changes.changed(), if watching => match changed {
                                Ok(()) => if let Some(code) = self.revoked(&ctx) {
                                    break Ended::Revoked(code);
                                },
                                Err(_) => watching = false,
                            },
                        }
                    }
                };
                match ended {
                    Ended::Closed => {}
                    Ended::Idle => tracing::debug!("websocket idle; closing"),
                    Ended::Revoked(code) => {
                        // Dropping both upgraded streams closes them: the sandbox's socket, and
                        // the upstream session opened with the old policy's credential.
                        tracing::info!(host = %self.host, reason = code.code(), "policy reload revoked a websocket; closing it");
                        self.record.decision = "deny";
                        self.record.enforced = true;
                        self.record.reason = code.code();
                    }
                }
                self.record.bytes_up = c.read;
                self.record.bytes = c.written;
            }
            Err(error) => {
                tracing::debug!(%error, "websocket upgrade failed");
                self.record.decision = "error";
                self.record.reason = "upgrade-failed";
            }
        }
        self.record.duration_ms =
            u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        ctx.audit.record(&self.record);
    }

    /// Why the current policy would not let this exchange continue, if it would not: its
    /// handshake would be denied now (as tunnels are closed when their host is), or would
    /// carry another credential than the one it was opened with, or none.
    fn revoked(&self, ctx: &Ctx) -> Option<DenyCode> {
        let policy = ctx.policy.current();
        let h = &self.handshake;
        let decision = policy.decide_http(&self.host, &h.method, Some(&h.path));
        // Report-only: the exchange stays, without a credential (a denial carries none).
        if let Some(code) = super::enforced_denial(ctx, &policy, decision.allowed, decision.reason)
        {
            return Some(code);
        }
        (decision.inject != h.injected).then_some(DenyCode::CredentialChanged)
    }
}

/// Methods whose response reflects the request headers. Case-insensitive, as the policy's method
/// match is: some origins treat `trace` as TRACE.
fn is_echo_method(method: &http::Method) -> bool {
    ["TRACE", "TRACK"]
        .iter()
        .any(|m| method.as_str().eq_ignore_ascii_case(m))
}

/// Destination binding: every authority the request claims (absolute-form URI, `Host` header,
/// h2 `:authority`) must name the bound host, and the port if it gives one. The upstream URI is
/// built from the binding, never from these, so a mismatch could not redirect the request; it is
/// refused anyway, because it means the client is trying to reach another host than the policy
/// checked (and must never be given that host's credential).
pub fn check_destination(req: &Request<Incoming>, binding: &Binding) -> Result<(), ProxyError> {
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

pub fn build_upstream_request(
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
    // Only the `trailers` token survives, once, whatever other `te` values came with it (and
    // even when `Connection` lists `te`, as RFC 9110 has senders of `te` do).
    let keep_te = headers
        .get_all(header::TE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"trailers"));
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
    headers.remove(header::TE);
    if keep_te {
        headers.insert(header::TE, header::HeaderValue::from_static("trailers"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A secret value the policy accepts is one the gateway can inject (and the other way
    /// round): the policy check and the header type agree on every character (issue 25 item 9).
    #[test]
    fn the_policy_accepts_exactly_the_header_values_the_gateway_can_send() {
        let chars = (0u32..=0x2ff)
            .chain([0x2028, 0x3000, 0xfeff, 0x1f600])
            .filter_map(char::from_u32);
        for c in chars {
            let value = format!("Bearer a{c}b");
            assert_eq!(
                shared_policy::is_header_value(&value),
                HeaderValue::from_str(&value).is_ok(),
                "U+{:04X}",
                u32::from(c)
            );
        }
    }

    #[test]
    fn only_te_trailers_passes_and_only_once() {
        let mut h = HeaderMap::new();
        h.append(header::TE, HeaderValue::from_static("trailers"));
        h.append(header::TE, HeaderValue::from_static("gzip"));
        h.append(header::CONNECTION, HeaderValue::from_static("te, x-hop"));
        h.append("x-hop", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        let te: Vec<_> = h.get_all(header::TE).iter().collect();
        assert_eq!(te, [HeaderValue::from_static("trailers")]);
        assert!(h.get("x-hop").is_none() && h.get(header::CONNECTION).is_none());

        let mut h = HeaderMap::new();
        h.append(header::TE, HeaderValue::from_static("gzip, trailers"));
        strip_hop_by_hop(&mut h);
        assert_eq!(
            h.get(header::TE),
            Some(&HeaderValue::from_static("trailers"))
        );

        let mut h = HeaderMap::new();
        h.append(header::TE, HeaderValue::from_static("gzip"));
        strip_hop_by_hop(&mut h);
        assert!(h.get(header::TE).is_none());
    }
}
