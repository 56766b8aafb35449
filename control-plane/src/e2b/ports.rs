//! A sandbox's ports other than envd's, as E2B's proxy serves them: `get_host(port)` is
//! `{port}-{sandboxID}.{domain}` (the preview domain, `PREVIEW_DOMAIN`), and a client behind
//! the SDK's own routing names the port in `E2b-Sandbox-Port` beside `E2b-Sandbox-Id`. Both reach
//! the same relay as the native routes ([`crate::routes::ports`]). As on E2B, a port is public
//! unless the sandbox was created with `network.allowPublicTraffic: false`; then it takes the
//! sandbox's `trafficAccessToken` in `E2B-Traffic-Access-Token`.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::refusal::Refusal;
use super::state::E2b;
use crate::config::Config;
use crate::ids::SessionId;
use crate::ops::ports::CODE_INTERPRETER_PORT;

/// envd's port: the SDK's own calls, served by [`super::envd`].
pub const ENVD_PORT: u16 = 49983;
use super::token::PRIVATE_TRAFFIC;
const TRAFFIC_HEADER: &str = "e2b-traffic-access-token";
/// envd's access token, which E2B's SDK also sends to the code interpreter.
const ACCESS_HEADER: &str = "x-access-token";

pub fn domain(config: &Config) -> Option<String> {
    config.ingress.preview_domain.clone()
}

/// The port and sandbox a request names, if it is for a port other than envd's.
fn target(headers: &HeaderMap, domain: Option<&str>) -> Option<(u16, String)> {
    if let Some(port) = headers.get("e2b-sandbox-port") {
        let port = port.to_str().ok()?.parse::<u16>().ok()?;
        let id = headers.get("e2b-sandbox-id")?.to_str().ok()?.to_string();
        return (port != ENVD_PORT).then_some((port, id));
    }
    let host = headers.get(axum::http::header::HOST)?.to_str().ok()?;
    let label = crate::routes::ports::host_label(host, domain?)?;
    let (port, id) = label.split_once('-')?;
    let port = port.parse::<u16>().ok()?;
    (port != ENVD_PORT).then(|| (port, id.to_string()))
}

pub fn is_port_request(headers: &HeaderMap, domain: Option<&str>) -> bool {
    target(headers, domain).is_some()
}

pub async fn serve(State(e): State<E2b>, req: Request) -> Response {
    let domain = domain(&e.config);
    let Some((port, id)) = target(req.headers(), domain.as_deref()) else {
        return refuse(StatusCode::NOT_FOUND, "no such port");
    };
    let Ok(id) = SessionId::parse(&id) else {
        return refuse(StatusCode::NOT_FOUND, "sandbox not found");
    };
    let info = match e.ops.info(&id).await {
        Ok(i) => i,
        Err(err) => return refuse(err.status(), &err.to_string()),
    };
    if info.metadata.contains_key(PRIVATE_TRAFFIC) {
        let given = req.headers().get(TRAFFIC_HEADER).map(|v| v.as_bytes());
        let want = e.tokens.traffic(id.as_str());
        let ok =
            given.is_some_and(|g| bool::from(subtle::ConstantTimeEq::ct_eq(g, want.as_bytes())));
        if !ok {
            return refuse(
                StatusCode::FORBIDDEN,
                "this sandbox's ports need its traffic access token in E2B-Traffic-Access-Token",
            );
        }
    }
    // The code interpreter runs code as envd's commands do, so its executions take what envd's
    // take: the sandbox's access token (E2B's SDK sends it on `/execute`). Its other routes
    // (contexts) run nothing. The token never reaches the sandbox.
    if port == CODE_INTERPRETER_PORT && req.uri().path().trim_end_matches('/') == "/execute" {
        let given = req
            .headers()
            .get(ACCESS_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !e.tokens.check(id.as_str(), given) {
            return refuse(
                StatusCode::UNAUTHORIZED,
                "the code interpreter's executions need the sandbox's envdAccessToken in X-Access-Token",
            );
        }
    }
    let mut req = req;
    for h in [
        "e2b-sandbox-id",
        "e2b-sandbox-port",
        TRAFFIC_HEADER,
        ACCESS_HEADER,
    ] {
        req.headers_mut().remove(h);
    }
    crate::routes::ports::serve_host(e.ops.clone(), e.config.clone(), id, port, req, true).await
}

fn refuse(status: StatusCode, why: &str) -> Response {
    super::control::ApiFailure(Refusal::new(status, why)).into_response()
}
