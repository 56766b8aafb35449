//! The per-request middleware: one log line, the HTTP metrics, a Sentry scope per request, and
//! panics turned into a 500 with the API's error shape.

use std::any::Any;
use std::time::Instant;

use axum::Json;
use axum::extract::{MatchedPath, RawPathParams, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sentry::SentryFutureExt;
use tracing::Instrument;

use crate::error::ErrorBody;
use crate::telemetry::metrics::{HttpLabels, observe_duration};

pub use crate::telemetry::reporting::PANIC_TARGET;

/// What the observer records into, the API prefix its route labels leave out, and the door its
/// requests come in by unless they say otherwise.
#[derive(Clone)]
pub struct Observed {
    pub metrics: std::sync::Arc<crate::telemetry::metrics::Metrics>,
    pub prefix: String,
    pub door: Door,
}

/// The front door a request came in by: a label of the request metric and a field of the log
/// line, so each door's traffic is told apart. A request a door sends to the service's own
/// router carries its door as an extension (E2B's translation does), so it is not counted as
/// the REST API's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Door {
    Rest,
    Mcp,
    E2b,
    OpenSandbox,
    /// A preview host's request (`{port}-{id}.{domain}`).
    Ingress,
}

impl Door {
    pub fn as_str(self) -> &'static str {
        match self {
            Door::Rest => "rest",
            Door::Mcp => "mcp",
            Door::E2b => "e2b",
            Door::OpenSandbox => "opensandbox",
            Door::Ingress => "ingress",
        }
    }
}

/// `router` inside the request observer and the panic catcher, its requests counted as `door`'s.
/// Layers added with `Router::layer` run after routing, so the middleware sees the matched route
/// template. Panics are caught inside it, so a panic is still logged as a 500. Outermost, a
/// response to a request whose body was left unread says `Connection: close` ([`super::unread`]).
pub fn observed<S: Clone + Send + Sync + 'static>(
    router: axum::Router<S>,
    metrics: &std::sync::Arc<crate::telemetry::metrics::Metrics>,
    prefix: &str,
    door: Door,
) -> axum::Router<S> {
    router
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            panic_response,
        ))
        .layer(axum::middleware::from_fn_with_state(
            Observed {
                metrics: metrics.clone(),
                prefix: prefix.to_string(),
                door,
            },
            observe,
        ))
        .layer(axum::middleware::from_fn(super::unread::close_unread))
}

/// The method as a metrics label and log field: the standard ones by name, anything else (an
/// unauthenticated client may send any token, of any length) as `OTHER`, so the series and the
/// log lines stay bounded.
pub fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        Method::TRACE => "TRACE",
        Method::CONNECT => "CONNECT",
        _ => "OTHER",
    }
}

/// Logs one line per request: method, route template (never the raw URI), status, duration
/// and session id. Headers, query strings and bodies are never logged: they carry the API key,
/// egress secrets and file contents.
pub async fn observe(
    State(observed): State<Observed>,
    matched: Option<MatchedPath>,
    params: Result<RawPathParams, axum::extract::rejection::RawPathParamsRejection>,
    req: Request,
    next: Next,
) -> Response {
    let method = method_label(req.method());
    let route = matched
        .as_ref()
        .map(|m| route_label(m.as_str(), &observed.prefix).to_string())
        .unwrap_or_else(|| "unmatched".to_string());
    let door = req
        .extensions()
        .get::<Door>()
        .copied()
        .unwrap_or(observed.door)
        .as_str();
    let session_id = params.ok().and_then(|p| {
        p.iter()
            .find(|(k, _)| *k == "session_id")
            .map(|(_, v)| v.to_string())
    });
    let span = tracing::info_span!(
        "request",
        door = %door,
        method = %method,
        route = %route,
        session_id = session_id.as_deref().unwrap_or("")
    );
    let started = Instant::now();
    let response = if sentry::Hub::current().client().is_some() {
        // A hub per request: tags set here stay on this request's events only.
        let hub = std::sync::Arc::new(sentry::Hub::new_from_top(sentry::Hub::main()));
        hub.configure_scope(|scope| {
            scope.set_tag("door", door);
            scope.set_tag("http.method", method);
            scope.set_tag("route", &route);
            scope.set_transaction(Some(&format!("{method} {route}")));
            if let Some(id) = &session_id {
                scope.set_tag("session_id", id);
            }
        });
        next.run(req).instrument(span).bind_hub(hub).await
    } else {
        next.run(req).instrument(span).await
    };
    let elapsed = started.elapsed();
    let status = response.status().as_u16();
    let labels = HttpLabels {
        door: door.to_string(),
        method: method.to_string(),
        route: route.clone(),
        status,
    };
    observe_duration(
        &observed.metrics.http.requests.get_or_create(&labels),
        elapsed,
    );
    tracing::info!(
        door = %door,
        method = %method,
        route = %route,
        status,
        elapsed_ms = elapsed.as_secs_f64() * 1e3,
        session_id = session_id.as_deref().unwrap_or(""),
        "request"
    );
    response
}

/// The route template without the API prefix: a route reached with and without it is one
/// route in the logs and one series in the metrics.
fn route_label<'a>(template: &'a str, prefix: &str) -> &'a str {
    match template.strip_prefix(prefix) {
        Some(rest) if !prefix.is_empty() && rest.starts_with('/') => rest,
        _ => template,
    }
}

/// Turns a panic in a handler into a 500 `{"detail": ...}` instead of a dropped connection.
pub fn panic_response(_panic: Box<dyn Any + Send + 'static>) -> Response {
    // The payload is not logged: it may quote whatever the handler was holding.
    tracing::error!(target: PANIC_TARGET, "request handler panicked");
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        Json(ErrorBody {
            detail: "Internal server error".to_string(),
            code: None,
        }),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::route_label;

    #[test]
    fn the_prefix_is_not_part_of_the_route_label() {
        let routes = [
            ("/api/v1/session/{session_id}/", "/session/{session_id}/"),
            ("/session/{session_id}/", "/session/{session_id}/"),
            ("/api/v1", "/api/v1"),
            ("/api/v1x/session/", "/api/v1x/session/"),
        ];
        for (template, label) in routes {
            assert_eq!(route_label(template, "/api/v1"), label, "{template}");
        }
        assert_eq!(route_label("/session/", ""), "/session/");
    }
}
