//! CONNECT: the reachability decision, then either a blind tunnel or a MITM session on the
//! upgraded connection.

use std::sync::Arc;
use std::time::Instant;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use shared_policy::Host;
use tracing::{Instrument, debug, info_span};

use super::request::Binding;
use super::{ClientConn, Ctx, error_response, mitm, refuse, tunnel, upstream};
use crate::audit::AuditRecord;
use crate::body::{Body, empty};
use crate::error::ProxyError;

/// Handles a CONNECT request. The response is sent before the tunnel's work starts (hyper
/// upgrades the connection once the 200 is written).
pub async fn connect(
    req: Request<Incoming>,
    ctx: Arc<Ctx>,
    client: Arc<ClientConn>,
) -> Response<Body> {
    let started = Instant::now();
    let target = match target(&req) {
        Ok(t) => t,
        Err(err) => return error_response(&err),
    };
    let mut record = AuditRecord::start(
        &ctx.session,
        "connect",
        "CONNECT",
        target.0.as_str(),
        target.1,
        None,
    );
    let (host, port) = target;
    let json = super::wants_json(req.headers());
    match open(req, host, port, &ctx, client, &mut record, started).await {
        Ok(resp) => resp,
        Err(err) => {
            let resp = refuse(&err, &mut record, started, json);
            ctx.audit.record(&record);
            resp
        }
    }
}

/// `host:port` from the CONNECT authority; the port is required.
fn target(req: &Request<Incoming>) -> Result<(Host, u16), ProxyError> {
    let authority = req
        .uri()
        .authority()
        .ok_or(ProxyError::BadRequest("CONNECT needs host:port"))?;
    match Host::parse_authority(authority.as_str()) {
        Ok((host, Some(port))) => Ok((host, port)),
        Ok((_, None)) => Err(ProxyError::BadRequest("CONNECT needs host:port")),
        Err(_) => Err(ProxyError::BadRequest("invalid CONNECT host")),
    }
}

async fn open(
    req: Request<Incoming>,
    host: Host,
    port: u16,
    ctx: &Arc<Ctx>,
    client: Arc<ClientConn>,
    record: &mut AuditRecord,
    started: Instant,
) -> Result<Response<Body>, ProxyError> {
    // Subscribe before reading the policy, so a reload in between is not missed by the tunnel.
    let changes = ctx.policy.subscribe();
    let policy = ctx.policy.current();
    let mut decision = policy.decide_connect(&host);
    let (allowed, reason, rule) = (decision.allowed, decision.reason, decision.rule);
    if !super::verdict(ctx, &policy, record, allowed, reason, rule)? {
        // Shadow mode: the tunnel opens, intercepted, so each request inside is evaluated and
        // audited on its own.
        decision.intercept = true;
    }
    // Resolve and check now, before answering 200: the agent gets a 403 / 502 it can read instead
    // of a tunnel that fails later. A MITM session re-resolves per upstream connection (the
    // connector checks again), a blind tunnel connects to exactly these addresses.
    let addrs = ctx.guard.resolve(&host, port).await?;
    let span = info_span!("tunnel", host = %host, port, intercept = decision.intercept);
    if decision.intercept {
        record.decision = if record.enforced { "allow" } else { "deny" };
        record.status = Some(StatusCode::OK.as_u16());
        record.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        ctx.audit.record(record);
        let binding = Arc::new(Binding {
            host,
            port,
            tls: true,
            client: Some(client.clone()),
        });
        let ctx = ctx.clone();
        ctx.tasks.clone().spawn(
            async move {
                match hyper::upgrade::on(req).await {
                    Ok(upgraded) => {
                        let io = TokioIo::new(upgraded);
                        if let Err(error) = mitm::serve(io, binding, ctx, client).await {
                            debug!(%error, "mitm session ended with an error");
                        }
                    }
                    Err(error) => debug!(%error, "upgrade failed"),
                }
            }
            .instrument(span),
        );
    } else {
        let upstream = upstream::connect_any(&addrs, ctx.upstreams.proxy.as_deref()).await?;
        record.decision = "allow";
        record.status = Some(StatusCode::OK.as_u16());
        let record = record.clone();
        let ctx = ctx.clone();
        ctx.tasks.clone().spawn(
            async move {
                match hyper::upgrade::on(req).await {
                    Ok(upgraded) => {
                        let tunnel = tunnel::Tunnel {
                            host,
                            record,
                            started,
                            client,
                            changes,
                        };
                        tunnel::run(TokioIo::new(upgraded), upstream, tunnel, ctx).await
                    }
                    Err(error) => debug!(%error, "upgrade failed"),
                }
            }
            .instrument(span),
        );
    }
    Ok(Response::new(empty()))
}
