//! Ingress's door: HTTP (any method, bodies streamed both ways), WebSocket upgrades and raw TCP
//! over a WebSocket, to a port inside a session, over the session's channel
//! ([`crate::ops::ports`]). No port is published on the host: the session stays on its own
//! network (or none), and every byte goes through the service and the session's helper.
//!
//! Reached at `/session/{id}/ports/{port}/{path…}` and, with `PREVIEW_DOMAIN` set, at
//! `{port}-{id}.{domain}/{path…}` (see [`preview_host`]). Access: the deployment's key, or a
//! port token ([`crate::auth::port_token`]) in `X-Daiv-Port-Token`, in the
//! `daiv_port_token` query parameter (answered with a redirect that sets it as a cookie for
//! that host and path, so a browser's later requests carry it) or in that cookie. A cookie never
//! opens a cross-origin WebSocket: a page of another origin cannot use a visitor's cookie to
//! open a socket. The service's credentials never reach the sandbox's server.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{FromRequestParts, OriginalUri, Path, Request, State};
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};

use super::render::{HttpError, respond};
use crate::auth::{self, port_token};
use crate::config::Config;
use crate::error::ApiError;
use crate::ids::SessionId;
use crate::ops::Ops;
use crate::ops::ports::{CODE_INTERPRETER_PORT, Connection, PortUsage, check_port};

/// Where a request goes: a session's port and the path there.
pub struct Target {
    pub id: SessionId,
    pub port: u16,
    /// The path and query to send (`/` and on).
    pub path_and_query: String,
    /// The prefix the client saw before `path` (`X-Forwarded-Prefix`, the cookie's path).
    pub prefix: String,
}

/// How the request proved it may reach the port.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Key,
    Header,
    /// The query parameter: answered with the cookie and a redirect.
    Query,
    Cookie,
}

/// `ANY /session/{session_id}/ports/{port}` (its root).
pub async fn proxy_root(
    State(ops): State<Ops>,
    State(config): State<Arc<Config>>,
    Path((session_id, port)): Path<(String, String)>,
    OriginalUri(uri): OriginalUri,
    req: Request,
) -> Response {
    let target = path_target(&config, &session_id, &port, "", &uri);
    serve(ops, config, target, req).await
}

/// `ANY /session/{session_id}/ports/{port}/{*path}`.
pub async fn proxy(
    State(ops): State<Ops>,
    State(config): State<Arc<Config>>,
    Path((session_id, port, path)): Path<(String, String, String)>,
    OriginalUri(uri): OriginalUri,
    req: Request,
) -> Response {
    let target = path_target(&config, &session_id, &port, &path, &uri);
    serve(ops, config, target, req).await
}

fn path_target(
    config: &Config,
    session_id: &str,
    port: &str,
    path: &str,
    uri: &Uri,
) -> Result<Target, ApiError> {
    let id = SessionId::parse(session_id).map_err(|_| ApiError::NotFound)?;
    let port = parse_port(port)?;
    // The prefix as the client sent it (under the API prefix or at the root).
    let full = uri.path();
    let marker = format!("/session/{session_id}/ports/{port}");
    let prefix = match full.find(&marker) {
        Some(at) => full[..at + marker.len()].to_string(),
        None => format!("{}{marker}", config.server.api_v1_str),
    };
    let mut path_and_query = format!("/{path}");
    if let Some(q) = uri.query() {
        path_and_query.push('?');
        path_and_query.push_str(q);
    }
    Ok(Target {
        id,
        port,
        path_and_query,
        prefix,
    })
}

fn parse_port(port: &str) -> Result<u16, ApiError> {
    let port = port
        .parse::<u16>()
        .map_err(|_| ApiError::Unprocessable(format!("{port:?} is not a port")))?;
    check_port(port)?;
    Ok(port)
}

/// The session and port a preview host names (`{port}-{id}.{domain}`), if it is one; `id` a
/// session id, or the first 32 hex digits of one (a DNS label holds 63 characters), resolved
/// with `ops`.
pub async fn preview_host(
    ops: &Ops,
    config: &Config,
    headers: &HeaderMap,
) -> Option<Result<(SessionId, u16), ApiError>> {
    let domain = config.ingress.preview_domain.as_deref()?;
    let host = headers.get(header::HOST)?.to_str().ok()?;
    let label = host_label(host, domain)?;
    Some(resolve_label(ops, label).await)
}

/// `{port}-{id}` of `{port}-{id}.{domain}[:port]`, if `host` is under `domain`.
pub fn host_label<'a>(host: &'a str, domain: &str) -> Option<&'a str> {
    let name = match host.rsplit_once(':') {
        Some((name, p)) if p.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    let head = name.len().checked_sub(domain.len() + 1)?;
    if !name.is_char_boundary(head) || !name[head + 1..].eq_ignore_ascii_case(domain) {
        return None;
    }
    (name.as_bytes()[head] == b'.').then(|| &name[..head])
}

async fn resolve_label(ops: &Ops, label: &str) -> Result<(SessionId, u16), ApiError> {
    let (port, id) = label.split_once('-').ok_or(ApiError::NotFound)?;
    let port = parse_port(port)?;
    let id = id.to_ascii_lowercase();
    if let Ok(id) = SessionId::parse(&id) {
        return Ok((id, port));
    }
    if id.len() == SHORT_ID && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok((ops.resolve_short(&id).await?, port));
    }
    Err(ApiError::NotFound)
}

/// Hex digits of a session id in a preview host.
pub const SHORT_ID: usize = 32;

/// The preview host of `port` of session `id` (`None` without a preview domain).
pub fn preview_url(config: &Config, id: &SessionId, port: u16) -> Option<String> {
    let domain = config.ingress.preview_domain.as_deref()?;
    let raw = id.raw();
    let short = &raw[..SHORT_ID.min(raw.len())];
    Some(format!(
        "{}://{port}-{short}.{domain}/",
        config.ingress.preview_scheme
    ))
}

/// A request the API key already let in (the code interpreter's routes, [`super::code`]), or a
/// door's own sandbox token (OpenSandbox's endpoints), sent to `path_and_query` at `port` of
/// session `id`.
pub async fn forward_with_key(
    ops: Ops,
    id: SessionId,
    port: u16,
    path_and_query: String,
    req: Request,
) -> Response {
    let target = Target {
        id,
        port,
        path_and_query,
        prefix: String::new(),
    };
    forward(ops, target, req).await
}

/// A host-routed request (`{port}-{id}.{domain}`): its whole path goes to the port.
pub async fn serve_host(
    ops: Ops,
    config: Arc<Config>,
    id: SessionId,
    port: u16,
    req: Request,
    public: bool,
) -> Response {
    let path_and_query = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".to_string());
    let target = Target {
        id,
        port,
        path_and_query,
        prefix: String::new(),
    };
    if public {
        return forward(ops, target, req).await;
    }
    serve(ops, config, Ok(target), req).await
}

async fn serve(
    ops: Ops,
    config: Arc<Config>,
    target: Result<Target, ApiError>,
    req: Request,
) -> Response {
    let target = match target {
        Ok(t) => t,
        Err(e) => return respond(e),
    };
    let access = match access(&config, &target, req.headers(), req.uri()) {
        Ok(a) => a,
        Err(e) => return respond(e),
    };
    if access == Access::Query {
        return set_cookie(&config, &target, req.headers());
    }
    if access == Access::Cookie && is_upgrade(req.headers()) && cross_origin(req.headers()) {
        return respond(ApiError::Forbidden(
            "a WebSocket from another origin needs the port token in X-Daiv-Port-Token or \
             the daiv_port_token parameter"
                .into(),
        ));
    }
    forward(ops, target, req).await
}

/// Who may reach the port: the key, else a token of this session and port.
fn access(
    config: &Config,
    target: &Target,
    headers: &HeaderMap,
    uri: &Uri,
) -> Result<Access, ApiError> {
    if let Some(key) = headers.get(auth::HEADER) {
        return match auth::check_key(config, Some(key.as_bytes())) {
            Ok(()) => Ok(Access::Key),
            Err(_) => Err(ApiError::InvalidApiKey),
        };
    }
    let now = crate::time::unix_now();
    let ok = |t: &str| port_token::check(config, target.id.as_str(), target.port, t, now);
    let refused = || ApiError::Forbidden("the port token is not valid for this port".into());
    if let Some(t) = headers.get(port_token::HEADER) {
        return t
            .to_str()
            .ok()
            .filter(|t| ok(t))
            .map(|_| Access::Header)
            .ok_or_else(refused);
    }
    if let Some(t) = query_token(uri) {
        return ok(&t).then_some(Access::Query).ok_or_else(refused);
    }
    if let Some(t) = cookie_token(headers) {
        return ok(&t).then_some(Access::Cookie).ok_or_else(refused);
    }
    Err(ApiError::Forbidden(
        "the API key or a port token is required (POST /session/{id}/ports/{port}/token)".into(),
    ))
}

fn query_token(uri: &Uri) -> Option<String> {
    form_urlencoded::parse(uri.query()?.as_bytes())
        .find(|(k, _)| k == port_token::QUERY)
        .map(|(_, v)| v.into_owned())
}

fn cookie_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == port_token::COOKIE)
        .map(|(_, v)| v.to_string())
}

/// The token of the query parameter as a cookie for this host (and the path route's prefix),
/// and a redirect to the same URL without it: the token leaves the address bar and the history.
fn set_cookie(config: &Config, target: &Target, headers: &HeaderMap) -> Response {
    let uri: Uri = target.path_and_query.parse().unwrap_or_default();
    let token = query_token(&uri).unwrap_or_default();
    let rest: Vec<(String, String)> = uri
        .query()
        .map(|q| {
            form_urlencoded::parse(q.as_bytes())
                .filter(|(k, _)| k != port_token::QUERY)
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect()
        })
        .unwrap_or_default();
    let mut location = format!("{}{}", target.prefix, uri.path());
    if !rest.is_empty() {
        location.push('?');
        location.push_str(
            &form_urlencoded::Serializer::new(String::new())
                .extend_pairs(rest)
                .finish(),
        );
    }
    let secure = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|p| p.eq_ignore_ascii_case("https"))
        || (target.prefix.is_empty() && config.ingress.preview_scheme == "https");
    let path = if target.prefix.is_empty() {
        "/".to_string()
    } else {
        format!("{}/", target.prefix)
    };
    let cookie = format!(
        "{}={token}; Path={path}; HttpOnly; SameSite=Lax{}",
        port_token::COOKIE,
        if secure { "; Secure" } else { "" }
    );
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let (Ok(loc), Ok(c)) = (
        HeaderValue::from_str(&location),
        HeaderValue::from_str(&cookie),
    ) {
        r.headers_mut().insert(header::LOCATION, loc);
        r.headers_mut().insert(header::SET_COOKIE, c);
        r.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    r
}

fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
}

fn is_websocket(headers: &HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// Whether a browser sent the request from a page of another origin than the host it asks.
fn cross_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let origin_host = origin.split_once("://").map(|(_, h)| h).unwrap_or(origin);
    !origin_host.eq_ignore_ascii_case(host)
}

/// Headers that belong to one hop and never cross a proxy (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// Removes the hop-by-hop headers, and those `Connection` names; an upgrade keeps its
/// `Connection: upgrade` and `Upgrade`.
fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named.iter().chain(HOP_BY_HOP.iter()) {
        if upgrade && (n == header::UPGRADE || n == header::CONNECTION) {
            continue;
        }
        headers.remove(n);
    }
    if !upgrade {
        headers.remove(header::UPGRADE);
    }
}

/// The service's credentials, taken out of what the sandbox's server sees.
fn strip_credentials(headers: &mut HeaderMap) {
    headers.remove(auth::HEADER);
    headers.remove(port_token::HEADER);
    let cookies: Vec<String> = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|c| !c.is_empty() && c.split_once('=').map(|(k, _)| k) != Some(port_token::COOKIE))
        .map(str::to_string)
        .collect();
    headers.remove(header::COOKIE);
    if !cookies.is_empty()
        && let Ok(v) = HeaderValue::from_str(&cookies.join("; "))
    {
        headers.insert(header::COOKIE, v);
    }
}

/// Sends the request to the port and streams the answer back (or joins the two ends of an
/// upgrade, or serves raw TCP over a WebSocket at `/tcp`).
async fn forward(ops: Ops, target: Target, mut req: Request) -> Response {
    // Raw TCP over a WebSocket (a database, a language server): the path route's `/tcp`.
    if !target.prefix.is_empty()
        && target.path_and_query.split('?').next() == Some("/tcp")
        && is_websocket(req.headers())
    {
        return tcp_over_websocket(ops, target, req).await;
    }
    // The code interpreter starts with its sandbox: a client that calls at once waits for it.
    let opened = if target.port == CODE_INTERPRETER_PORT {
        ops.open_code_interpreter(&target.id).await
    } else {
        ops.open_port(&target.id, target.port).await
    };
    let conn = match opened {
        Ok(c) => c,
        Err(e) => return respond(e),
    };
    let upgrade = is_upgrade(req.headers());
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    let peer = parts
        .extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    let host = parts.headers.get(header::HOST).cloned();
    let scheme = parts
        .headers
        .get("x-forwarded-proto")
        .cloned()
        .unwrap_or(HeaderValue::from_static("http"));
    strip_hop_by_hop(&mut parts.headers, upgrade);
    strip_credentials(&mut parts.headers);
    if let Some(h) = host {
        parts.headers.insert("x-forwarded-host", h);
    }
    // Appended to what the client's own proxies said.
    if let Some(ip) = peer {
        let prior = parts
            .headers
            .get("x-forwarded-for")
            .and_then(|v| v.to_str().ok())
            .map(|v| format!("{v}, {ip}"))
            .unwrap_or_else(|| ip.to_string());
        if let Ok(v) = HeaderValue::from_str(&prior) {
            parts.headers.insert("x-forwarded-for", v);
        }
    }
    parts.headers.insert("x-forwarded-proto", scheme);
    if !target.prefix.is_empty()
        && let Ok(p) = HeaderValue::from_str(&target.prefix)
    {
        parts.headers.insert("x-forwarded-prefix", p);
    }
    parts.uri = match target.path_and_query.parse() {
        Ok(u) => u,
        Err(_) => {
            return respond(ApiError::BadRequest("the path is not a valid URI".into()));
        }
    };
    parts.version = http::Version::HTTP_11;
    let upstream = Request::from_parts(parts, body);
    let (mut sender, connection) =
        match hyper::client::conn::http1::handshake(TokioIo::new(conn)).await {
            Ok(pair) => pair,
            Err(e) => return upstream_failed(&e),
        };
    tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
    });
    let mut response = match sender.send_request(upstream).await {
        Ok(r) => r,
        Err(e) => return upstream_failed(&e),
    };
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        let server_upgrade = hyper::upgrade::on(&mut response);
        if let Some(client_upgrade) = client_upgrade {
            tokio::spawn(async move {
                let (Ok(client), Ok(server)) = (client_upgrade.await, server_upgrade.await) else {
                    return;
                };
                let (mut client, mut server) = (TokioIo::new(client), TokioIo::new(server));
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
        let (parts, _) = response.into_parts();
        return Response::from_parts(parts, Body::empty());
    }
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers, false);
    Response::from_parts(parts, Body::new(body))
}

fn upstream_failed(e: &hyper::Error) -> Response {
    tracing::debug!(error = %e, "the sandbox's server did not answer over its port");
    (
        StatusCode::BAD_GATEWAY,
        Json(crate::error::ErrorBody {
            detail: "the server in the sandbox closed the connection without an answer".into(),
            code: Some("upstream_failed".into()),
        }),
    )
        .into_response()
}

/// Bytes of a WebSocket's binary messages to the port and back, one message per read.
async fn tcp_over_websocket(ops: Ops, target: Target, req: Request) -> Response {
    use axum::extract::ws::{Message, WebSocketUpgrade};
    use futures::{SinkExt, StreamExt};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let (mut parts, _) = req.into_parts();
    let ws = match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
        Ok(ws) => ws,
        Err(e) => return e.into_response(),
    };
    // Opened before the upgrade: a closed port is a 502, not a socket that closes at once.
    let conn: Connection = match ops.open_port(&target.id, target.port).await {
        Ok(c) => c,
        Err(e) => return respond(e),
    };
    ws.on_upgrade(move |socket| async move {
        let (mut ws_tx, mut ws_rx) = socket.split();
        let (mut rd, mut wr) = tokio::io::split(conn);
        let up = async {
            while let Some(Ok(msg)) = ws_rx.next().await {
                let bytes = match msg {
                    Message::Binary(b) => b,
                    Message::Text(t) => bytes::Bytes::copy_from_slice(t.as_str().as_bytes()),
                    Message::Close(_) => break,
                    _ => continue,
                };
                if wr.write_all(&bytes).await.is_err() {
                    break;
                }
            }
            let _ = wr.shutdown().await;
        };
        let down = async {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match rd.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let msg = Message::Binary(bytes::Bytes::copy_from_slice(&buf[..n]));
                        if ws_tx.send(msg).await.is_err() {
                            return;
                        }
                    }
                }
            }
            let _ = ws_tx.send(Message::Close(None)).await;
        };
        tokio::join!(up, down);
    })
}

/// `POST /session/{session_id}/ports/{port}/token`'s body.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PortTokenRequest {
    /// How long the token opens the port (default and most: `PORT_TOKEN_MAX_TTL_SECONDS`).
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
    /// `url` carries the token (a link anyone holding it can open in a browser, which trades it
    /// for a cookie); else the token goes in `X-Daiv-Port-Token`.
    #[serde(default)]
    pub public: bool,
}

/// A port's URL and its token.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PortTokenResponse {
    pub url: String,
    pub token: String,
    /// RFC 3339.
    pub expires_at: String,
}

/// `POST /session/{session_id}/ports/{port}/token`: a token for one port of one session.
pub async fn token(
    State(ops): State<Ops>,
    State(config): State<Arc<Config>>,
    Path((session_id, port)): Path<(String, String)>,
    headers: HeaderMap,
    body: Option<Json<PortTokenRequest>>,
) -> Result<Json<PortTokenResponse>, HttpError> {
    let id = SessionId::parse(&session_id).map_err(|_| ApiError::NotFound)?;
    let port = parse_port(&port)?;
    let req = body.map(|Json(b)| b).unwrap_or_default();
    ops.exists(&id).await?;
    let grant = issue(&config, &id, port, req.ttl_seconds, &headers)?;
    let url = if req.public {
        let sep = if grant.url.contains('?') { '&' } else { '?' };
        format!("{}{sep}{}={}", grant.url, port_token::QUERY, grant.token)
    } else {
        grant.url
    };
    Ok(Json(PortTokenResponse { url, ..grant }))
}

/// A token for `port` of session `id` and the URL that reaches it (the preview host, else the
/// path route on the host the request came to).
pub fn issue(
    config: &Config,
    id: &SessionId,
    port: u16,
    ttl_seconds: Option<u64>,
    headers: &HeaderMap,
) -> Result<PortTokenResponse, ApiError> {
    let max = config.ingress.token_max_ttl.as_secs();
    let ttl = ttl_seconds.unwrap_or(max);
    if ttl == 0 || ttl > max {
        return Err(ApiError::Unprocessable(format!(
            "ttl_seconds must be between 1 and {max}"
        )));
    }
    let expires = crate::time::unix_now().saturating_add_unsigned(ttl);
    let token = port_token::issue(config, id.as_str(), port, expires);
    // The preview host; else the path route on the host the request came to (a path alone
    // where none is known: MCP's).
    let url = preview_url(config, id, port).unwrap_or_else(|| {
        let path = format!(
            "{}/session/{}/ports/{port}/",
            config.server.api_v1_str,
            id.as_str()
        );
        let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) else {
            return path;
        };
        let scheme = headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("http");
        format!("{scheme}://{host}{path}")
    });
    Ok(PortTokenResponse {
        url,
        token,
        expires_at: crate::time::rfc3339(expires),
    })
}

/// `GET /session/{session_id}/ports`: the session's connections to its ports.
pub async fn usage(
    State(ops): State<Ops>,
    Path(session_id): Path<String>,
) -> Result<Json<PortUsage>, HttpError> {
    let id = SessionId::parse(&session_id).map_err(|_| ApiError::NotFound)?;
    ops.exists(&id).await?;
    Ok(Json(ops.ports().usage(id.as_str())))
}
